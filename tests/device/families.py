"""(d) One tiny model of every family the server serves (Llama, Qwen2 with
its window, Mistral's window, Qwen3, Gemma 2, Gemma 3, Phi-3 with LongRoPE,
the mixtures of experts, and the recurrent ones: Mamba-2 and the Granite
4.0-H hybrid, whose state slots the CUDA server holds on the device):
the committed safetensors of server/models/testdata/families, which
scripts/reference-models wrote with Hugging Face transformers, on the
server under test, against transformers' own greedy tokens and top-5
log-probabilities recorded beside them (f32 on a CPU). Torch-free."""

import json
import pathlib

import agreement

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "server" / "models" / "testdata" / "families"


def names() -> list:
    """The families with a committed reference."""
    return sorted(p.parent.name for p in FIXTURES.glob("*/reference.json"))


def runs(name: str) -> list:
    """(run name, context to serve, prompts) of the runs the safetensors
    folder is checked by."""
    ref = json.loads((FIXTURES / name / "reference.json").read_text())
    return [(r["name"], r["context"] or 256, r["prompts"]) for r in ref["runs"]
            if r["files"] != "gguf"]


def expected(prompt: dict) -> list:
    """transformers' steps as agreement's runs: (token, {id: logprob})."""
    return [(s["token"], {i: lp for i, lp in s["top"]}) for s in prompt["steps"]]


def server_steps(response: dict) -> list:
    """Steps of a /v1/completions answer asked with
    `return_tokens_as_token_ids` (byte-level tokens have no text of their own)."""
    lp = response["choices"][0]["logprobs"]
    as_id = lambda t: int(t.removeprefix("token_id:"))  # noqa: E731
    return [(as_id(t), {as_id(k): float(v) for k, v in top.items()})
            for t, top in zip(lp["tokens"], lp["top_logprobs"])]


def flags(device: str, context: int) -> list:
    return ["--device", device, "--kv-cache-memory", "16MiB", "--max-seqs", "4",
            "--max-model-len", str(context), "--block-size", "16"]
