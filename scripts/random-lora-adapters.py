#!/usr/bin/env python3
"""Random rank-16 PEFT adapters of Llama-3.2-1B's shape (every projection),
for scripts/bench-lora: python3 scripts/random-lora-adapters.py DIR [N]
writes DIR/a0 .. DIR/a{N-1}. Needs numpy and safetensors (never CI)."""
import json, os, sys
import numpy as np
from safetensors.numpy import save_file
L, H, Q, KV, I = 16, 2048, 2048, 512, 8192
dims = {"self_attn.q_proj": (Q, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
        "self_attn.o_proj": (H, Q), "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
r = 16
for n in range(int(sys.argv[2]) if len(sys.argv) > 2 else 4):
    rng = np.random.default_rng(n)
    t = {}
    for l in range(L):
        for m, (o, i) in dims.items():
            p = f"base_model.model.model.layers.{l}.{m}"
            t[f"{p}.lora_A.weight"] = (rng.standard_normal((r, i)) * 0.01).astype(np.float32)
            t[f"{p}.lora_B.weight"] = (rng.standard_normal((o, r)) * 0.01).astype(np.float32)
    d = f"{sys.argv[1]}/a{n}"
    os.makedirs(d, exist_ok=True)
    save_file(t, f"{d}/adapter_model.safetensors")
    json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 32, "target_modules": [m.split(".")[1] for m in dims], "bias": "none"}, open(f"{d}/adapter_config.json", "w"))
