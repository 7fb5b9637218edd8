"""Writes a random-weight model of DeepSeek-V2-Lite's layer shape for the
latent-attention benchmark (never for CI): DeepseekV2ForCausalLM with its
config.json as published (2048 wide, 16 heads, latent attention with
kv_lora_rank 512, qk_nope 128 + qk_rope 64, v 128; YaRN
over 4,096 positions; a dense first layer of 10,944, then 64 routed experts
of 1,408, 6 active, and 2 shared), on 4 of its 27 layers, its queries
compressed to 1,536 as DeepSeek-V2's are (llama.cpp reads a model without
q_lora_rank only at V2-Lite's 26 or 27 layers), with SmolLM2's
tokenizer (read from the default model's GGUF). transformers writes the
safetensors; llama.cpp's own converter writes the f16 GGUF
(models/bench/deepseek2lite-f16.gguf) and llama-quantize each type.

  $FERROX_REF_PYTHON tests/families/bench_mla.py --llama-src "$(../shared/tools/peer-llama src)" \
      [--types "Q4_K_M"]

The venv needs PyPI's `gguf` beside torch and transformers: transformers
reads SmolLM2's tokenizer out of its GGUF file.
"""

import argparse
import pathlib
import subprocess
import sys

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "models" / "bench"

CONFIG = dict(
    architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
    hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
    n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6, routed_scaling_factor=1.0,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
    qk_nope_head_dim=128, topk_method="greedy", n_group=1, topk_group=1,
    first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=False, scoring_func="softmax",
    rope_theta=10000.0, max_position_embeddings=163840, rms_norm_eps=1e-6,
    rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096,
                      beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707),
    tie_word_embeddings=False, hidden_act="silu",
)


def tokenizer(dest: pathlib.Path) -> int:
    """SmolLM2's tokenizer, as transformers reads it from the GGUF."""
    gguf = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(dest)
    return len(tok)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--llama-src", type=pathlib.Path, required=True)
    ap.add_argument("--peer", default=str(ROOT.parent / "shared" / "tools" / "peer-llama"))
    ap.add_argument("--types", default="Q4_K_M")
    a = ap.parse_args()
    hf = OUT / "deepseek2lite-hf"
    f16 = OUT / "deepseek2lite-f16.gguf"
    if not f16.exists():
        hf.mkdir(parents=True, exist_ok=True)
        vocab = tokenizer(hf)
        config = transformers.DeepseekV2Config(**dict(CONFIG, vocab_size=vocab,
                                                      bos_token_id=1, eos_token_id=2))
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
        model.save_pretrained(hf)
        subprocess.run([sys.executable, str(a.llama_src / "convert_hf_to_gguf.py"), str(hf),
                        "--outtype", "f16", "--outfile", str(f16)], check=True)
    print(f16)
    for t in a.types.split():
        q = OUT / f"deepseek2lite-{t}.gguf"
        if not q.exists():
            subprocess.run([a.peer, "quantize", str(f16), str(q), t], check=True,
                           stdout=subprocess.DEVNULL)
        print(q)
    return 0


if __name__ == "__main__":
    sys.exit(main())
