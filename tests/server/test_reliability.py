"""Faults and limits of the real server, with the real model, on loopback:
liveness under a flood of long prompts, SIGTERM during many streams, SIGKILL
and restart, API keys."""

import concurrent.futures
import json
import pathlib
import random
import signal
import subprocess
import sys
import time

import openai
import pytest
import requests

from conftest import MODEL_NAME, sse_lines

# Polls /health every 50 ms from its own process (no GIL shared with the
# burst) and prints one "status seconds" line per poll until stdin closes.
POLLER = r"""
import sys, threading, time, urllib.request
url = sys.argv[1]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    t = time.perf_counter()
    try:
        status = urllib.request.urlopen(url, timeout=5).status
    except Exception as e:
        status = repr(e)
    print(status, time.perf_counter() - t, flush=True)
    time.sleep(0.05)
"""


def words(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["river", "stone", "lantern", "quiet", "market", "seven", "blue", "over",
             "the", "a", "window", "forest", "engine", "paper", "λ", "日本", "café"]
    out, size = [], 0
    while size < n_bytes:
        w = rng.choice(vocab)
        out.append(w)
        size += len(w.encode()) + 1
    return " ".join(out)[:n_bytes]


def test_health_answers_fast_during_a_burst_of_long_prompts(start_server):
    s = start_server("--kv-blocks", "256", "--max-model-len", "1024", "--max-queue", "128",
                     "--max-body", "1MiB")
    prompts = [words(64 << 10, i) for i in range(64)]
    poller = subprocess.Popen([sys.executable, "-c", POLLER, s.url + "/health"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)

    def one(i):
        if i % 2:
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompts[i]}],
                    "max_tokens": 4}
            path = "/v1/chat/completions"
        else:
            body = {"model": MODEL_NAME, "prompt": prompts[i], "max_tokens": 4}
            path = "/v1/completions"
        return requests.post(s.url + path, json=body, timeout=300)

    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(one, range(64)))
    burst_secs = time.time() - started
    time.sleep(0.3)
    out, _ = poller.communicate("", timeout=30)
    polls = [line.split() for line in out.splitlines()]
    # ~16k tokens each: over the 1024-token limit, refused once tokenized.
    for a in answers:
        assert a.status_code == 400, a.text
        assert a.json()["error"]["code"] == "context_length_exceeded"
    during = [float(p[1]) for p in polls]
    assert len(during) >= max(5, int(burst_secs / 0.1)), (burst_secs, polls)
    assert all(p[0] == "200" for p in polls), polls
    slowest = max(during)
    print(f"burst {burst_secs:.2f} s, {len(during)} polls, slowest {slowest * 1000:.1f} ms")
    assert slowest < 0.1, f"/health took {slowest * 1000:.0f} ms during the burst"


def stream_until_end(url: str, i: int, started: list) -> dict:
    """One stream; returns how it ended: finish_reason, or the error it was told."""
    body = {"model": MODEL_NAME, "prompt": f"Story number {i}:", "max_tokens": 48,
            "ignore_eos": True, "stream": True}
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        started.append(i)
        finish, error, done, tokens = None, None, False, 0
        for line in sse_lines(r):
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                error = event["error"]
                continue
            tokens += 1
            finish = event["choices"][0]["finish_reason"] or finish
    return {"finish": finish, "error": error, "done": done, "tokens": tokens}


def children_of(pid: int) -> list:
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(stat.parent.name)
        except (OSError, IndexError):
            pass
    return found


def test_sigterm_during_32_streams_ends_every_stream_and_exits_zero(start_server):
    s = start_server("--kv-blocks", "512", "--max-seqs", "8", "--max-model-len", "512",
                     "--max-queue", "64", "--drain-timeout", "120")
    started: list = []
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(stream_until_end, s.url, i, started) for i in range(32)]
        deadline = time.time() + 60
        while len(started) < 32:
            assert time.time() < deadline, f"only {len(started)} streams started"
            time.sleep(0.02)
        # Mid-generation: rows decoding and others still queued.
        while s.metric("ferrox_requests_running") == 0:
            assert time.time() < deadline, "nothing running"
            time.sleep(0.02)
        assert s.metric("ferrox_requests_waiting") > 0
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        assert requests.get(s.url + "/ready").status_code == 503
        late = requests.post(s.url + "/v1/completions",
                             json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 1})
        assert late.status_code == 503
        assert late.json()["error"]["type"] == "service_unavailable"
        ends = [f.result(timeout=300) for f in futures]
    assert s.proc.wait(timeout=60) == 0
    for e in ends:
        # Every stream either completed or was told why, then [DONE].
        assert e["done"], e
        assert e["finish"] == "length" or e["error"], e
    assert sum(e["finish"] == "length" for e in ends) == 32, ends
    # Nothing left running: no process of its own, nothing on its port.
    assert not children_of(s.proc.pid)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(s.url + "/health", timeout=2)


def test_sigkill_then_restart_on_the_same_port_serves_again(start_server):
    flags = ("--kv-blocks", "256", "--max-model-len", "1024")
    first = start_server(*flags)
    with requests.post(first.url + "/v1/completions", json={
        "model": MODEL_NAME, "prompt": "Go on:", "max_tokens": 300, "ignore_eos": True,
        "stream": True}, stream=True, timeout=60) as r:
        lines = sse_lines(r)
        next(lines)
        first.proc.kill()
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
        # The stream is cut, not hung.
        with pytest.raises(requests.exceptions.RequestException):
            for _ in lines:
                pass
    second = start_server(*flags, port=first.port)
    r = second.client().chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
        temperature=0)
    assert r.choices[0].message.content
    assert second.metric("ferrox_kv_blocks_used") == 0
    assert requests.get(second.url + "/health").status_code == 200


def test_api_keys_from_flags_and_env(start_server):
    s = start_server("--kv-blocks", "256", "--max-model-len", "1024", "--api-key", "sk-flag",
                     env={"FERROX_API_KEY": ""})
    with pytest.raises(openai.AuthenticationError) as e:
        s.client().completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    assert e.value.status_code == 401
    assert e.value.body["code"] == "invalid_api_key"
    r = s.client(api_key="sk-flag").completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    assert r.usage.completion_tokens >= 1
    raw = requests.get(s.url + "/v1/models")
    assert raw.status_code == 401 and raw.headers["www-authenticate"] == "Bearer"
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}
    for open_path in ["/health", "/ready", "/metrics"]:
        assert requests.get(s.url + open_path).status_code == 200, open_path
    assert "sk-flag" not in s.log_text()

    env = start_server("--kv-blocks", "256", "--max-model-len", "1024",
                       env={"FERROX_API_KEY": "sk-one,sk-two"})
    for key, ok in [("sk-one", True), ("sk-two", True), ("sk-one,sk-two", False), ("none", False)]:
        c = env.client(api_key=key)
        if ok:
            assert c.models.list().data[0].id == MODEL_NAME
        else:
            with pytest.raises(openai.AuthenticationError):
                c.models.list()
