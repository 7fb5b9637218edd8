"""Soak: many requests of every kind against one real server, then checks that
nothing was lost. Not a pytest test (minutes long); its figures go in
docs/benchmarks.md.

    python3 tests/server/soak.py [--requests 10000] [--clients 32]

Mix: 10% invalid bodies (each must get a 4xx); of the valid ones half stream,
and 30% of the streams are dropped after their second chunk. The server has a
small KV pool and a short waiting line, so 429s (with Retry-After) are part of
the load. Pass: no 5xx, no request without an answer within 120 s, every gauge
(running, waiting, KV blocks) back to zero at the end, no abort unaccounted for.
RSS of the server is sampled every 0.25 s: start (loaded, idle), peak, end.
"""

import argparse
import collections
import concurrent.futures
import json
import os
import random
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from conftest import MODEL_NAME, Server, sse_lines  # noqa: E402

WORDS = "the river stone lantern quiet market seven blue window forest engine paper".split()

INVALID = [
    b"{not json",
    b'{"model": "smol", "prompt": "x", "n": 2}',
    b'{"model": "smol", "prompt": "x", "max_tokens": 18446744073709551615}',
    b'{"model": "smol", "prompt": "x", "temperature": -1}',
    b'{"model": "nope", "prompt": "x"}',
    b'{"model": "smol", "prompt": [999999999]}',
    b'{"model": "smol", "prompt": "x", "stop": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"]}',
    b'{"model": "smol", "prompt": "x", "frobnicate": true}',
    b'{"model": "smol", "messages": []}',
    b'[1, 2, 3]',
]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_flag = pid, 0, threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.25)


def one(url: str, i: int, rng: random.Random, tally: collections.Counter) -> None:
    kind = rng.random()
    headers = {"content-type": "application/json"}
    if kind < 0.10:
        body, path, label = rng.choice(INVALID), "/v1/completions", "invalid"
        if body.startswith(b'{"model": "smol", "messages"'):
            path = "/v1/chat/completions"
        r = requests.post(url + path, data=body, headers=headers, timeout=120)
        tally[f"{label} {r.status_code // 100}xx"] += 1
        if not 400 <= r.status_code < 500:
            tally["bad: invalid body not a 4xx"] += 1
        return
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
    stream = rng.random() < 0.5
    drop = stream and rng.random() < 0.30
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": rng.randint(4, 16),
            "temperature": rng.choice([0, 0.7]), "stream": stream, "ignore_eos": drop}
    if rng.random() < 0.3:
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": body["max_tokens"], "stream": stream}
        path = "/v1/chat/completions"
    else:
        path = "/v1/completions"
    label = "drop" if drop else ("stream" if stream else "whole")
    # A full line is answered 429 at once; the client comes back, as SDKs do.
    for _ in range(200):
        r = requests.post(url + path, json=body, stream=stream, timeout=120)
        if r.status_code != 429:
            break
        if not r.headers.get("retry-after"):
            tally["bad: 429 without retry-after"] += 1
        r.close()
        tally["429 (retried)"] += 1
        time.sleep(rng.uniform(0.05, 0.3))
    with r:
        status = r.status_code
        if status >= 500:
            tally["bad: 5xx"] += 1
        if status != 200:
            tally[f"{label} {status}"] += 1
            return
        if not stream:
            r.json()
            tally[f"{label} 200"] += 1
            return
        seen, done = 0, False
        for line in sse_lines(r):
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            if "error" in json.loads(data):
                tally["bad: error event"] += 1
            seen += 1
            if drop and seen == 2:
                break
        if drop:
            tally["drop 200 (cut after 2 chunks)"] += 1
        elif done:
            tally["stream 200"] += 1
        else:
            tally["bad: stream without [DONE]"] += 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    flags = ["--kv-blocks", "64", "--block-size", "16", "--max-seqs", "8", "--max-queue", "16",
             "--max-model-len", "256", "--threads", "2", "--decode-log-interval", "0"]
    server = Server(*flags)
    url, pid = server.url, server.proc.pid
    # Warm up (first allocations of every path), then take the idle RSS.
    server.client().completions.create(model=MODEL_NAME, prompt="warm up", max_tokens=4)
    time.sleep(1)
    start_rss = rss_kib(pid)
    sampler = Sampler(pid)
    sampler.start()
    tally: collections.Counter = collections.Counter()
    lock = threading.Lock()
    rngs = [random.Random(args.seed * 1000 + c) for c in range(args.clients)]
    failures = []

    def client(c: int, n: int) -> None:
        local = collections.Counter()
        for k in range(n):
            try:
                one(url, k, rngs[c], local)
            except requests.Timeout:
                local["bad: no answer within 120 s"] += 1
            except requests.RequestException as e:
                local["bad: transport error"] += 1
                failures.append(repr(e))
        with lock:
            tally.update(local)

    per = [args.requests // args.clients + (c < args.requests % args.clients) for c in range(args.clients)]
    began = time.time()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(client, range(args.clients), per))
    secs = time.time() - began
    # Give the worker its last tick (a dropped stream is noticed at the next one).
    deadline = time.time() + 10
    while time.time() < deadline and (server.metric("ferrox_kv_blocks_used") or
                                      server.metric("ferrox_requests_running") or
                                      server.metric("ferrox_requests_waiting")):
        time.sleep(0.1)
    time.sleep(1)
    sampler.stop_flag.set()
    end = {name: server.metric(name) for name in [
        "ferrox_kv_blocks_used", "ferrox_requests_running", "ferrox_requests_waiting"]}
    finished = {r: server.metric(f'ferrox_requests_finished_total{{reason="{r}"}}')
                for r in ["stop", "length", "abort", "error"]}
    end_rss = rss_kib(pid)
    alive = server.proc.poll() is None and requests.get(url + "/health", timeout=5).status_code == 200
    server.stop()
    bad = {k: v for k, v in tally.items() if k.startswith("bad")}
    report = {
        "requests": sum(v for k, v in tally.items() if not k.startswith(("bad", "429"))),
        "seconds": round(secs, 1), "req_per_s": round(args.requests / secs, 1),
        "outcomes": dict(sorted(tally.items())), "gauges_at_end": end, "finished_total": finished,
        "rss_mib": {"start": round(start_rss / 1024, 1), "peak": round(sampler.peak / 1024, 1),
                    "end": round(end_rss / 1024, 1)},
        "health_at_end": alive, "transport_errors": failures[:5],
    }
    print(json.dumps(report, indent=2))
    # "error" counts the refused out-of-vocabulary prompts (400s) too.
    ok = not bad and all(v == 0 for v in end.values()) and alive
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
