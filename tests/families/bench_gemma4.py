"""Writes a random-weight Gemma 4 of E2B's kind for the memory and speed
benchmark (never for CI): Gemma4ForCausalLM 1,536 wide, 8 heads over one
KV head of 256 on the sliding layers (a 512-token window) and of 512 on the
full ones, four sliding layers to a full one, per-layer inputs 256 wide,
the last 4 of its 10 layers reading earlier layers' KV with MLPs twice as
wide (6,144 and 12,288), soft-capped logits; SmolLM2's tokenizer (read from
the default model's GGUF: 49,152 entries, not Gemma's 262,144, so the
embeddings do not dwarf the layers). transformers writes the bf16
safetensors folder models/bench/gemma4e2b-hf that ferrox-server serves.

  $FERROX_REF_PYTHON tests/families/bench_gemma4.py
"""

import pathlib
import sys

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "models" / "bench" / "gemma4e2b-hf"
LAYERS = 10
TYPES = ["sliding_attention"] * 4 + ["full_attention"]

CONFIG = dict(
    hidden_size=1536, intermediate_size=6144, num_hidden_layers=LAYERS,
    num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
    sliding_window=512, layer_types=TYPES * (LAYERS // len(TYPES)),
    num_kv_shared_layers=4, use_double_wide_mlp=True, hidden_size_per_layer_input=256,
    final_logit_softcapping=30.0, max_position_embeddings=32768, rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
)


def main() -> int:
    if (OUT / "model.safetensors").exists():
        print(OUT)
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    gguf = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(OUT)
    vocab = len(tok)
    config = transformers.Gemma4TextConfig(**dict(
        CONFIG, vocab_size=vocab, vocab_size_per_layer_input=vocab,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=0))
    config.architectures = ["Gemma4ForCausalLM"]
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("scale"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(OUT)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
