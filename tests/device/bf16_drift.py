"""How far bf16 arithmetic moves the log-probabilities of a 32-layer model
from the f32 reference: the measurement behind check.py's `--lp-tol` (and
`--tie-tol`). Runs on a CPU with numpy only (no torch, no GPU), minutes:

    python3 tests/device/bf16_drift.py            # Llama-3.1-8B's geometry
    python3 tests/device/bf16_drift.py --layers 4 # quicker, shallower

Both forwards use the same bf16 weights drawn as llama_files draws them
(unit-variance outputs, lm_head scaled to logit_std 3): the reference in f32
throughout, as reference.py; the other rounding where the CUDA server holds
bf16 (linear.rs: a half matrix's matmul takes its input in bf16 and gives
bf16, into the f32 residual stream) — every matmul's input and output, so
the logits too, and K after RoPE (the KV cache is bf16) — with f32
accumulation, norms, RoPE, softmax and SiLU. It prints, over every
prompt position, the largest and the 99th-percentile |d logprob| among the
reference's top-5 tokens, and how often the greedy token differs with the
gap between the two candidates then."""

import argparse

import numpy as np

# Llama-3.1-8B as llama_files.LLAMA_8B (which needs torch to import).
GEOMETRY = dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8,
                vocab=128256, rope_theta=500000.0, rms_eps=1e-5, logit_std=3.0)


def bf16(x: np.ndarray) -> np.ndarray:
    """`x` rounded to bfloat16 (to nearest, ties to even), kept as f32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def weight(rng, shape, std) -> np.ndarray:
    """A bf16 weight, as llama_files.draw: normal, scaled."""
    return bf16(rng.standard_normal(shape, dtype=np.float32) * np.float32(std))


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, n, d, theta):
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float32) / d)
    f = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([f, f], -1)), np.sin(np.concatenate([f, f], -1))
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


class Path:
    """One forward's arithmetic: `r` rounds where that path holds bf16."""

    def __init__(self, half: bool):
        self.r = bf16 if half else (lambda x: x)

    def mm(self, x, w):
        return self.r(self.r(x) @ w.T)

    def attention(self, x, w, g):
        n, d = x.shape[0], g["hidden"] // g["heads"]
        q = self.mm(x, w["q"]).reshape(n, g["heads"], d).transpose(1, 0, 2)
        k = self.mm(x, w["k"]).reshape(n, g["kv_heads"], d).transpose(1, 0, 2)
        v = self.mm(x, w["v"]).reshape(n, g["kv_heads"], d).transpose(1, 0, 2)
        # Q stays f32 after RoPE; K (and V) are stored in the bf16 KV cache.
        q, k = rope(q, n, d, g["rope_theta"]), self.r(rope(k, n, d, g["rope_theta"]))
        group = g["heads"] // g["kv_heads"]
        k, v = np.repeat(k, group, 0), np.repeat(v, group, 0)
        scores = q @ k.transpose(0, 2, 1) / np.float32(d ** 0.5)
        scores = np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, scores)
        p = np.exp(log_softmax(scores))
        out = (p @ v).transpose(1, 0, 2).reshape(n, g["heads"] * d)
        return self.mm(out, w["o"])

    def mlp(self, x, w):
        gate, up = self.mm(x, w["gate"]), self.mm(x, w["up"])
        return self.mm(self.r(gate / (1 + np.exp(-gate)) * up), w["down"])


def layer_weights(rng, g):
    h, kv, m = g["hidden"], g["kv_heads"] * (g["hidden"] // g["heads"]), g["intermediate"]
    norm = lambda: bf16(1.0 + 0.1 * rng.standard_normal(h, dtype=np.float32))  # noqa: E731
    return {"in_norm": norm(), "q": weight(rng, (h, h), h ** -0.5),
            "k": weight(rng, (kv, h), h ** -0.5), "v": weight(rng, (kv, h), h ** -0.5),
            "o": weight(rng, (h, h), h ** -0.5), "post_norm": norm(),
            "gate": weight(rng, (m, h), h ** -0.5), "up": weight(rng, (m, h), h ** -0.5),
            "down": weight(rng, (h, m), m ** -0.5)}


def run(g, prompt_len: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    embed = weight(rng, (g["vocab"], g["hidden"]), 1.0)
    ids = rng.integers(0, g["vocab"], prompt_len)
    paths = {"f32": Path(False), "bf16": Path(True)}
    xs = {name: embed[ids].copy() for name in paths}
    del embed
    for _ in range(g["layers"]):
        w = layer_weights(rng, g)
        for name, p in paths.items():
            x = xs[name]
            x = x + p.attention(rms_norm(x, w["in_norm"], g["rms_eps"]), w, g)
            xs[name] = x + p.mlp(rms_norm(x, w["post_norm"], g["rms_eps"]), w)
    final = bf16(1.0 + 0.1 * rng.standard_normal(g["hidden"], dtype=np.float32))
    head = weight(rng, (g["vocab"], g["hidden"]), g["logit_std"] / g["hidden"] ** 0.5)
    lp = {name: log_softmax(p.mm(rms_norm(xs[name], final, g["rms_eps"]), head).astype(np.float64))
          for name, p in paths.items()}
    top = np.argsort(-lp["f32"], -1)[:, :5]
    diff = np.abs(np.take_along_axis(lp["bf16"], top, -1) - np.take_along_axis(lp["f32"], top, -1))
    greedy_f32, greedy_bf16 = lp["f32"].argmax(-1), lp["bf16"].argmax(-1)
    flips = np.nonzero(greedy_f32 != greedy_bf16)[0]
    gaps = [float(lp["f32"][i, greedy_f32[i]] - lp["f32"][i, greedy_bf16[i]]) for i in flips]
    return {"max": float(diff.max()), "p99": float(np.percentile(diff, 99)),
            "top1_max": float(diff[:, 0].max()), "flips": len(flips), "positions": prompt_len,
            "flip_gaps": gaps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=GEOMETRY["layers"])
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--seeds", default="0,1")
    a = ap.parse_args()
    g = {**GEOMETRY, "layers": a.layers}
    for seed in (int(s) for s in a.seeds.split(",")):
        r = run(g, a.prompt_len, seed)
        print(f"layers {g['layers']} seed {seed}: |d logprob| over the top-5 at {r['positions']} "
              f"positions: max {r['max']:.4f}, p99 {r['p99']:.4f}, top-1 max {r['top1_max']:.4f}; "
              f"greedy token differs at {r['flips']} positions (f32 gaps "
              f"{', '.join(f'{x:.3f}' for x in r['flip_gaps']) or '-'})", flush=True)


if __name__ == "__main__":
    main()
