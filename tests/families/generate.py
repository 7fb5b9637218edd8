"""Writes the tiny reference models of every family (scripts/reference-models
runs this): random weights through Hugging Face transformers, saved as
safetensors with a tiny tokenizer; transformers' greedy tokens and top-5
log-probabilities (eager attention, f32) for prompts longer than the windows,
as reference.json; the GGUF that llama.cpp's convert_hf_to_gguf.py makes of
the same directory; and, where llama.cpp's server is built, whether it
agrees. `--check` regenerates into a temporary folder and compares with the
committed files instead (the drift test)."""

import argparse
import json
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers

import families
import llama_cpp
import tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "server" / "models" / "testdata" / "families"
# Far under the gaps of these models' logits; where transformers' own top two
# are closer than this the reference stops being a verdict.
NEAR_TIE = 1e-2


def randomize(model: torch.nn.Module, family: str, seed: int) -> None:
    """Weights with spread enough for clear greedy choices: matrices of unit
    gain, norms around 1 (Gemma's stored as the offset from 1), biases small."""
    g = torch.Generator().manual_seed(seed)
    # Norms whose weight is stored as the offset from 1 (Qwen3.5's and
    # Qwen3-Next's but their DeltaNet's gated norm).
    offset = family.startswith(("gemma2", "gemma3", "qwen35", "qwen3next"))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                plain = not offset or name.endswith("linear_attn.norm.weight")
                p.copy_(0.2 * r + (1.0 if plain else 0.0))
            elif name.endswith("dt_bias"):
                # A recurrent layer's time step: softplus(-2) ~ 0.13, so its
                # state decays slowly enough to carry across chunks.
                p.copy_(0.3 * r - 2.0)
            elif name.endswith("bias"):
                p.copy_(0.2 * r)
            elif name.endswith(("router.scale", "per_expert_scale")):
                # Gemma 4's router input and expert scales: around 1.
                p.copy_(1.0 + 0.2 * r)
            elif "embed_tokens" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(r * 1.2 / p.shape[-1] ** 0.5)
        # A router's correction bias (DeepSeek-V3's, GLM-4.5's) is a buffer;
        # drawn after every parameter, so other families' weights stay.
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))
            # Gemma 4's per-layer output scale.
            elif name.endswith("layer_scalar"):
                b.copy_(1.0 + 0.3 * torch.randn(b.shape, generator=g))


# Where a router's k-th and (k+1)-th logits are closer than this, half
# precision may pick the other expert: the GPU-held checks stop there.
ROUTE_TIE = 5e-3

# A prompt whose reference has a near-tie this early is drawn again: it
# would check too little.
CLEAR_STEPS = 4


class Routers:
    """The smallest gap between the k-th and (k+1)-th router logits of any
    token in any layer of a forward pass (the margin by which its experts
    were chosen), for mixtures of experts."""

    def __init__(self, model):
        self.gap = None
        for m in model.modules():
            if type(m).__name__.lower().endswith(("topkrouter", "llama4router")):
                m.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        # Llama 4's router returns (scores, logits).
        raw = output[1] if type(module).__name__ == "Llama4Router" else output[0]
        logits = raw.float().reshape(-1, raw.shape[-1])
        gaps = []
        if hasattr(module, "e_score_correction_bias"):
            # The choice is by sigmoid score plus the correction, within the
            # best groups: both margins count.
            logits = logits.sigmoid() + module.e_score_correction_bias.float()
            groups = logits.view(logits.shape[0], module.num_group, -1)
            group_scores = groups.topk(2, dim=-1).values.sum(-1)
            if module.topk_group < module.num_group:
                top = group_scores.topk(module.topk_group + 1, dim=-1).values
                gaps.append(top[:, -2] - top[:, -1])
            kept = group_scores.topk(module.topk_group, dim=-1).indices
            mask = torch.zeros_like(group_scores).scatter_(1, kept, 1).bool()
            logits = groups.masked_fill(~mask.unsqueeze(-1), float("-inf")).flatten(1)
        top = torch.topk(logits, module.top_k + 1, dim=-1).values
        gaps.append(top[:, -2] - top[:, -1])
        gap = float(min(float(g.min()) for g in gaps))
        self.gap = gap if self.gap is None else min(self.gap, gap)

    def take(self):
        gap, self.gap = self.gap, None
        return gap


def prompts(model, lengths: list, steps: int, seed: int, first: int) -> list:
    """Random prompts of `lengths` (ids from `first`, past the specials) and
    their greedy steps, each prompt clear of near-ties for its first
    CLEAR_STEPS steps."""
    rng = random.Random(seed)
    routers = Routers(model)
    out = []
    for n in lengths:
        for _ in range(50):
            ids = [rng.randrange(first, tokenizer.VOCAB) for _ in range(n)]
            got = greedy(model, ids, steps, routers)
            clear = all(s["top"][0][1] - s["top"][1][1] >= NEAR_TIE for s in got[:CLEAR_STEPS])
            if clear and got[0].get("route_gap", 1.0) >= ROUTE_TIE:
                break
        out.append({"ids": ids, "steps": got})
    return out


@torch.no_grad()
def greedy(model, ids: list, steps: int, routers: Routers) -> list:
    """`steps` greedy tokens after `ids`, each with the top-5 log-probabilities
    of its step (the whole sequence recomputed each step: no cache) and, for
    a mixture of experts, the smallest routing margin of any token so far."""
    out, seq = [], list(ids)
    for _ in range(steps):
        logits = model(torch.tensor([seq])).logits[0, -1].float()
        lp = torch.log_softmax(logits, -1)
        top = torch.topk(lp, 5)
        token = int(top.indices[0])
        step = {"token": token,
                "top": [[int(i), round(float(v), 6)] for v, i in zip(top.values, top.indices)]}
        gap = routers.take()
        if gap is not None:
            step["route_gap"] = round(gap, 6)
        out.append(step)
        seq.append(token)
    return out


def load(dir: pathlib.Path, overrides: dict):
    """The saved model in f32, its config changed by `overrides`."""
    d = json.loads((dir / "config.json").read_text())
    if overrides:
        d.update(overrides)
        # transformers derives the layer kinds from the window settings.
        if any("window" in k or "chunk" in k for k in overrides):
            d.pop("layer_types", None)
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    return transformers.AutoModelForCausalLM.from_pretrained(
        dir, config=config, dtype=torch.float32, attn_implementation="eager").eval()


def write_model(f: families.Family, dir: pathlib.Path, seed: int) -> None:
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(**f.config)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, f.name, seed)
    model.to(getattr(torch, f.dtype)).save_pretrained(dir)
    (dir / "generation_config.json").unlink(missing_ok=True)
    tokenizer.write(dir, f.template, f.eos, f.specials, f.spm)


def convert(dir: pathlib.Path, src: pathlib.Path, outtype: str, extra: list) -> pathlib.Path:
    out = dir / "model.gguf"
    here = pathlib.Path(__file__).resolve().parent
    cmd = [sys.executable, str(here / "convert.py"), str(src), str(dir), "--outfile", str(out),
           "--outtype", outtype,
           # Not the family's name: llama.cpp keys token attributes off
           # names ("phi3" wants Phi's own special tokens).
           "--model-name", "ferrox tiny reference", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed on {dir.name}:\n{done.stderr[-3000:]}")
    return out


def build(f: families.Family, out: pathlib.Path, src: pathlib.Path | None, seed: int) -> dict:
    dir = out / f.name
    dir.mkdir(parents=True, exist_ok=True)
    write_model(f, dir, seed)
    runs = []
    for i, run in enumerate(f.runs):
        model = load(dir, run.overrides)
        runs.append({"name": run.name, "context": run.context, "files": run.files,
                     "overrides": run.overrides,
                     "prompts": prompts(model, run.prompts, f.steps, seed * 100 + i,
                                        len(tokenizer.SPECIALS) + len(f.specials))})
    ref = {"family": f.name, "near_tie": NEAR_TIE, "route_tie": ROUTE_TIE,
           "torch": torch.__version__,
           "transformers": transformers.__version__, "runs": runs}
    if src is not None and f.gguf:
        gguf = convert(dir, src, "bf16" if f.dtype == "bfloat16" else "f16", f.convert_args)
        ref["gguf"] = gguf.name
    (dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    return ref


def compare(got: dict, want: dict, tol: float) -> list:
    """Where a regenerated reference differs from the committed one."""
    diffs = []
    for rg, rw in zip(got["runs"], want["runs"]):
        for pi, (pg, pw) in enumerate(zip(rg["prompts"], rw["prompts"])):
            if pg["ids"] != pw["ids"]:
                diffs.append(f"{rg['name']} prompt {pi}: ids differ")
                continue
            for si, (sg, sw) in enumerate(zip(pg["steps"], pw["steps"])):
                if sg["token"] != sw["token"]:
                    diffs.append(f"{rg['name']} prompt {pi} step {si}: token "
                                 f"{sg['token']} != {sw['token']}")
                    break
                worst = max(abs(a[1] - b[1]) for a, b in zip(sg["top"], sw["top"]))
                if worst > tol:
                    diffs.append(f"{rg['name']} prompt {pi} step {si}: logprobs moved {worst:.2e}")
    if len(got["runs"]) != len(want["runs"]):
        diffs.append("the number of runs differs")
    return diffs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=pathlib.Path, default=OUT)
    p.add_argument("--llama-src", type=pathlib.Path, help="llama.cpp source (peer-llama src)")
    p.add_argument("--llama-bin", type=pathlib.Path, help="folder with llama-server")
    p.add_argument("--only", help="one family")
    p.add_argument("--check", action="store_true",
                   help="regenerate into a temporary folder and compare with --out")
    p.add_argument("--tol", type=float, default=1e-4, help="|d logprob| --check allows")
    a = p.parse_args()
    torch.set_num_threads(1)
    chosen = [f for f in families.FAMILIES if a.only in (None, f.name)]
    if a.check:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="ferrox-ref-"))
        try:
            bad = []
            for i, f in enumerate(families.FAMILIES):
                if f not in chosen:
                    continue
                got = build(f, tmp, None, f.seed_at(i))
                want = json.loads((a.out / f.name / "reference.json").read_text())
                bad += [f"{f.name}: {d}" for d in compare(got, want, a.tol)]
                for name in ("model.safetensors", "tokenizer.json", "config.json"):
                    if (tmp / f.name / name).read_bytes() != (a.out / f.name / name).read_bytes():
                        bad.append(f"{f.name}: {name} differs")
            print("\n".join(bad) or f"no drift in {len(chosen)} families")
            return 1 if bad else 0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = []
    for i, f in enumerate(families.FAMILIES):
        if f not in chosen:
            continue
        ref = build(f, a.out, a.llama_src, f.seed_at(i))
        line = f"{f.name}: {sum(len(r['prompts']) for r in ref['runs'])} prompts"
        if a.llama_bin and "gguf" in ref:
            ref["llama_cpp"] = llama_cpp.check(a.llama_bin, a.out / f.name, ref, NEAR_TIE)
            (a.out / f.name / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
            line += f"; llama.cpp: {ref['llama_cpp']['verdict']}"
        summary.append(line)
    size = sum(p.stat().st_size for p in a.out.rglob("*") if p.is_file())
    print("\n".join(summary) + f"\n{size / 1e6:.2f} MB in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
