"""Writes random PEFT LoRA adapters (adapter_config.json and
adapter_model.safetensors, f32) for a Llama-shaped model, with no dependency
beyond the standard library; the default model's shape by default."""

import array
import json
import pathlib
import random
import struct

# SmolLM2-135M: hidden, intermediate, layers, heads, kv heads, head dim.
SMOLLM2 = (576, 1536, 30, 9, 3, 64)

MODULES = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}


def _dims(module: str, shape) -> tuple[int, int]:
    """(out, in) of a projection."""
    hidden, inter, _, heads, kv_heads, head_dim = shape
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
        "o_proj": (hidden, q), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }[module]


def write(dir: pathlib.Path, rank: int, seed: int, shape=SMOLLM2,
          targets=("q_proj", "v_proj", "down_proj"), scale: float = 0.2) -> pathlib.Path:
    """Writes an adapter of `rank` over `targets` into `dir` and returns it."""
    dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    header, blobs, offset = {}, [], 0
    for layer in range(shape[2]):
        for m in targets:
            out_dim, in_dim = _dims(m, shape)
            p = f"base_model.model.model.layers.{layer}.{MODULES[m]}.{m}"
            for half, dims in (("lora_A", (rank, in_dim)), ("lora_B", (out_dim, rank))):
                n = dims[0] * dims[1]
                blob = array.array("f", (rng.uniform(-scale, scale) for _ in range(n))).tobytes()
                header[f"{p}.{half}.weight"] = {
                    "dtype": "F32", "shape": list(dims), "data_offsets": [offset, offset + len(blob)],
                }
                blobs.append(blob)
                offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(dir / "adapter_model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(targets), "bias": "none", "task_type": "CAUSAL_LM"}
    (dir / "adapter_config.json").write_text(json.dumps(config))
    return dir
