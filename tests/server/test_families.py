"""Every family's tiny model (server/models/testdata/families, written by
transformers) served by the real binary, from its safetensors folder and
from the GGUF llama.cpp's converter made of it: greedy tokens and top-5
log-probabilities over /v1/completions against transformers' own, up to the
first near-tie. The model crate's tests check the decoder; this checks
what `serve` wires around it (the plan's pools and state slots, the worker,
the HTTP path) for every layer kind, the recurrent ones included. The rules
and the reference reading are the device check's (tests/device)."""

import json
import pathlib
import sys

import pytest
import requests

from conftest import MODEL_NAME, Server

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "device"))
import agreement  # noqa: E402
import families  # noqa: E402

# f32 KV as the reference computes; the tolerances are the model crate's
# (summation order only).
FLAGS = ("--kv-dtype", "f32", "--kv-cache-memory", "16MiB", "--max-seqs", "4",
         "--block-size", "16")
LP_TOL, TIE_TOL = 2e-3, 1e-2


def cases() -> list:
    """(family, file, run) for every committed reference run: the run's
    files (`safetensors`, `gguf` or both)."""
    out = []
    for name in families.names():
        ref = json.loads((families.FIXTURES / name / "reference.json").read_text())
        for run in ref["runs"]:
            files = {"safetensors": [name], "gguf": [f"{name}/{ref.get('gguf')}"],
                     "both": [name, f"{name}/{ref.get('gguf')}"]}[run["files"]]
            out += [(name, f, run["name"]) for f in files if "None" not in f]
    return out


@pytest.mark.parametrize("family,file,run", cases())
def test_served_family_matches_transformers(family, file, run):
    ref = json.loads((families.FIXTURES / family / "reference.json").read_text())
    r = next(r for r in ref["runs"] if r["name"] == run)
    context = r["context"] or 256
    server = Server(*FLAGS, "--max-model-len", str(context),
                    model=str(families.FIXTURES / file))
    try:
        for i, p in enumerate(r["prompts"]):
            body = {"model": MODEL_NAME, "prompt": p["ids"], "max_tokens": len(p["steps"]),
                    "temperature": 0, "logprobs": 5, "ignore_eos": True,
                    "return_tokens_as_token_ids": True}
            answer = requests.post(server.url + "/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            agree = agreement.compare(families.expected(p),
                                      families.server_steps(answer.json()), TIE_TOL)
            assert agree.ok(LP_TOL), f"{file} {run} prompt {i}: {agree.figure()}"
            assert agree.steps == len(p["steps"])
    finally:
        server.close()
