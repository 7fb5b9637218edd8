"""Clients for tests/e2e/real-node.sh (stdlib only).

load:   two threads send chat completions one after another until the stop
        file appears; writes counts to --out. A 503 or 429 the server sent
        (draining, queue full: retryable, with Retry-After) counts apart
        from a failure (a refused or reset connection, a timeout, another
        status).
stream: one long streamed completion; writes its finish_reason to --out and
        touches --started-file when the first token has arrived.
"""

import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse

RETRYABLE = {429, 503}


def post(url, body, timeout):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def load(args):
    counts = {"total": 0, "ok": 0, "retryable": 0, "failed": 0, "errors": []}
    lock = threading.Lock()
    body = {"model": args.model, "messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 12}

    def worker():
        while not os.path.exists(args.stop_file):
            try:
                conn, resp = post(args.url, body, 60)
                data = resp.read()
                conn.close()
                kind = "ok" if resp.status == 200 and json.loads(data)["choices"] else (
                    "retryable" if resp.status in RETRYABLE else "failed")
                err = None if kind == "ok" else f"{resp.status} {data[:120]!r}"
            except Exception as e:  # a connection refused or reset, a timeout
                kind, err = "failed", repr(e)[:160]
            with lock:
                counts["total"] += 1
                counts[kind] += 1
                if err:
                    counts["errors"].append(f"{time.time():.1f} {kind}: {err}")
            if kind != "ok":
                time.sleep(0.2)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "w") as f:
        json.dump(counts, f)


STORY = [{"role": "user", "content": "Write a long story about a lighthouse."}]


def tokens_for(args):
    """Enough tokens to stream for --seconds on this machine, from a timed probe.

    A fixed count ends sooner on a fast machine than the check needs.
    """
    probe = 64
    body = {"model": args.model, "messages": STORY, "max_tokens": probe, "ignore_eos": True}
    start = time.time()
    conn, resp = post(args.url, body, 120)
    resp.read()
    rate = probe / max(time.time() - start, 1e-3)
    return max(args.max_tokens, min(int(rate * args.seconds), 6000))


def stream(args):
    max_tokens = tokens_for(args) if args.seconds else args.max_tokens
    body = {"model": args.model, "messages": STORY, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    result = {"finish_reason": None, "chunks": 0, "max_tokens": max_tokens}
    try:
        conn, resp = post(args.url, body, 120)
        result["status"] = resp.status
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            result["chunks"] += 1
            if result["chunks"] == 3:
                open(args.started_file, "w").close()
            for c in chunk.get("choices", []):
                result["finish_reason"] = c.get("finish_reason") or result["finish_reason"]
    except Exception as e:
        result["error"] = repr(e)[:200]
    result["ended"] = time.time()
    with open(args.out, "w") as f:
        json.dump(result, f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["load", "stream"])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stop-file")
    p.add_argument("--started-file")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--seconds", type=float, help="stream: at least --max-tokens, and enough to last this long")
    args = p.parse_args()
    (load if args.mode == "load" else stream)(args)


if __name__ == "__main__":
    main()
