"""llama.cpp's own server on a reference model's GGUF: its greedy tokens and
top-5 log-probabilities for the recorded prompts, against transformers'
(recorded in reference.json under `llama_cpp`)."""

import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request


# llama.cpp's CPU matmul rounds the activations to the weights' half type
# (bf16 for Gemma's files): its log-probabilities sit ~1e-2 from
# transformers' f32 ones on these models, with KV in f32 as here.
LP_TOL = 5e-2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def _serve(bin: pathlib.Path, gguf: pathlib.Path, ctx: int, log: pathlib.Path):
    port = _port()
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin))
    proc = subprocess.Popen([str(bin / "llama-server"), "-m", str(gguf), "-c", str(ctx), "-t", "2",
                             "--cache-type-k", "f32", "--cache-type-v", "f32",
                             "-np", "1", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not become ready")


def _step(url: str, ids: list) -> tuple:
    """llama.cpp's greedy token after `ids` and its top-5 log-probabilities.
    One token a request, the reference's own tokens fed back (teacher
    forcing): the server reports probabilities per piece of text it
    releases, so over a longer answer they cannot be told apart by step."""
    resp = _post(url + "/completion", {
        "prompt": ids, "n_predict": 1, "n_probs": 5, "temperature": 0, "top_k": 1,
        "cache_prompt": True, "return_tokens": True})
    probs = resp.get("completion_probabilities", [])
    top = [(t["id"], t["logprob"]) for t in probs[0]["top_logprobs"]] if probs else []
    return resp["tokens"][0], top


def _agree(want: list, got: list, near_tie: float) -> tuple:
    """(steps agreeing, worst |d logprob| of the top-5 over them, whether
    the comparison ended well: every step, or a near-tie in transformers'
    own top two, after which the greedy paths may part)."""
    same, worst = 0, 0.0
    for w, (token, top) in zip(want, got):
        if token != w["token"]:
            return same, worst, False
        got_lp = dict(top)
        worst = max([worst] + [abs(got_lp[i] - lp) for i, lp in w["top"] if i in got_lp])
        same += 1
        if w["top"][0][1] - w["top"][1][1] < near_tie:
            return same, worst, True
    return same, worst, same == len(want)


def check(bin: pathlib.Path, dir: pathlib.Path, ref: dict, near_tie: float) -> dict:
    """llama.cpp's answers to every run the GGUF is checked against."""
    runs, ok = [], True
    for run in ref["runs"]:
        if run["files"] == "safetensors":
            continue
        try:
            proc, url = _serve(bin, dir / ref["gguf"], run["context"] or 256,
                               dir / "llama-server.log")
        except RuntimeError as e:
            # A layout llama.cpp does not load (Qwen2-MoE with a dense layer).
            (dir / "llama-server.log").unlink(missing_ok=True)
            reason = [l for l in str(e).splitlines() if "error" in l.lower()][-1:]
            return {"verdict": "cannot load", "reason": " ".join(reason)[-300:]}
        try:
            for p in run["prompts"]:
                fed = [s["token"] for s in p["steps"]]
                got = [_step(url, p["ids"] + fed[:i]) for i in range(len(fed))]
                same, worst, good = _agree(p["steps"], got, near_tie)
                ok &= good and worst < LP_TOL
                runs.append({"run": run["name"], "prompt": len(p["ids"]), "agree": same,
                             "of": len(p["steps"]), "worst_logprob": round(worst, 6)})
        finally:
            proc.kill()
            proc.wait()
            (dir / "llama-server.log").unlink(missing_ok=True)
    return {"verdict": "agrees" if ok else "differs", "runs": runs}
