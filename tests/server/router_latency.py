"""The router's added latency: C concurrent clients, chat requests direct to
one ferrox-server and through ferrox-router in front of it, in alternating
rounds, whole and streamed; p50/p99 of the end-to-end latency (and of the
first byte, streamed) per arm.

    FERROX_SERVER_BIN=... FERROX_ROUTER_BIN=... python3 tests/server/router_latency.py [C] [ROUNDS]
"""

import statistics
import sys
import threading
import time

import requests

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conftest import MODEL_NAME, Server  # noqa: E402
from test_router import Router  # noqa: E402


def one(session, url, stream, i):
    if stream is None:  # the proxy alone: no model work upstream
        t0 = time.perf_counter()
        r = session.post(url + "/tokenize", json={"model": MODEL_NAME, "prompt": f"Question {i}"}, timeout=60)
        r.raise_for_status()
        return time.perf_counter() - t0, None
    body = {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": stream,
            "messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]}
    t0 = time.perf_counter()
    r = session.post(url + "/v1/chat/completions", json=body, stream=stream, timeout=300)
    first = None
    for chunk in r.iter_content(chunk_size=None):
        if first is None and chunk:
            first = time.perf_counter() - t0
    r.raise_for_status()
    return time.perf_counter() - t0, first


def run_round(url, stream, clients, per_client, offset):
    out, lock = [], threading.Lock()

    def worker(w):
        s = requests.Session()
        for k in range(per_client):
            got = one(s, url, stream, offset + w * per_client + k)
            with lock:
                out.append(got)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    server = Server("--kv-blocks", "1024", "--max-seqs", "32", "--max-model-len", "1024",
                    "--threads", "2", "--max-queue", "256")
    router = Router(server.url)
    try:
        arms = {"direct": server.url, "router": router.url}
        for url in arms.values():  # warm both paths
            run_round(url, False, 4, 1, 0)
        modes = (None, False, True)
        results = {(a, s): [] for s in modes for a in arms}
        offset = 1000
        for _ in range(rounds):
            for stream in modes:
                for arm, url in arms.items():
                    results[(arm, stream)] += run_round(url, stream, clients, 2, offset)
                    offset += clients * 2
        print(f"{clients} clients, {rounds} alternating rounds of {clients * 2} requests per arm and mode")
        print("| mode | path | requests | e2e p50 | e2e p99 | first byte p50 | first byte p99 |")
        print("|---|---|---|---|---|---|---|")
        name = {None: "/tokenize", False: "chat, whole", True: "chat, streamed"}
        for (arm, stream), xs in results.items():
            e2e = [x[0] * 1000 for x in xs]
            fb = [x[1] * 1000 for x in xs if x[1] is not None] or [float("nan")]
            print(f"| {name[stream]} | {arm} | {len(xs)} | {pct(e2e, 50):.1f} ms | "
                  f"{pct(e2e, 99):.1f} ms | {pct(fb, 50):.1f} ms | {pct(fb, 99):.1f} ms |")
        for stream in modes:
            d = [x[0] for x in results[("direct", stream)]]
            r = [x[0] for x in results[("router", stream)]]
            print(f"{name[stream]}: router - direct: p50 {(statistics.median(r) - statistics.median(d)) * 1000:+.1f} ms,"
                  f" p99 {(pct(r, 99) - pct(d, 99)) * 1000:+.1f} ms")
    finally:
        router.close()
        server.close()


if __name__ == "__main__":
    main()
