"""Writes a tiny random-weight Llama as a Hugging Face directory (config.json,
model.safetensors in f16, a word-level tokenizer.json), with no dependency
beyond the standard library: safetensors is an 8-byte header length, a JSON
header and the raw little-endian tensors."""

import json
import pathlib
import random
import struct

HIDDEN, INTERMEDIATE, LAYERS, HEADS, VOCAB, CONTEXT = 256, 512, 4, 4, 512, 512


def _shapes() -> dict:
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{name}.weight"] = (HIDDEN, HIDDEN)
        shapes[p + "mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[p + "mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[p + "mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
        shapes[p + "input_layernorm.weight"] = (HIDDEN,)
        shapes[p + "post_attention_layernorm.weight"] = (HIDDEN,)
    return shapes


def write(dir: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Writes the model into `dir` and returns it."""
    dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    header, blobs, offset = {}, [], 0
    for name, shape in sorted(_shapes().items()):
        n = 1
        for d in shape:
            n *= d
        norm = len(shape) == 1
        values = [1.0] * n if norm else [rng.uniform(-0.05, 0.05) for _ in range(n)]
        blob = struct.pack(f"<{n}e", *values)
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(dir / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
    config = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "vocab_size": VOCAB,
        "max_position_embeddings": CONTEXT, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "torch_dtype": "float16", "eos_token_id": 1,
    }
    (dir / "config.json").write_text(json.dumps(config))
    vocab = {"<unk>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (dir / "tokenizer.json").write_text(json.dumps(tokenizer))
    return dir


def weight_bytes_f32() -> int:
    """Bytes of the weights widened to f32 (what the CPU server holds)."""
    total = 0
    for shape in _shapes().values():
        n = 1
        for d in shape:
            n *= d
        total += 4 * n
    return total
