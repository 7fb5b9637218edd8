"""Shared-prefix load for tests/e2e/node/router_checks.sh (stdlib only).

Four system prompts of about 900 tokens (fresh for each --seed, so every
round starts with nothing cached), --clients threads each sending
--requests streamed chats, each with one of the four prompts and a short
question. With --warm it only sends each prompt once, in turn (a
system prompt in use has been seen before: the measured load is the
steady state, not the first sight). Writes to --out: counts, the errors, requests that hit the
timeout (`hung`), and time to first token p50/p99 of the answered ones.
"""

import argparse
import concurrent.futures
import http.client
import json
import random
import time
import urllib.parse

WORDS = ("river stone market lantern copper orchard signal harbor meadow ledger "
         "compass thunder velvet canyon ember glacier saddle beacon quartz willow").split()


def system_prompts(seed, n=4, words=300):
    rng = random.Random(seed)
    return [f"Reference document {seed}-{k}. " +
            " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(words))
            for k in range(n)]


def one(url, model, system, question, timeout):
    u = urllib.parse.urlparse(url)
    body = {"model": model, "stream": True, "max_tokens": 4,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    start = time.time()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": f"{resp.status} {resp.read()[:120]!r}"}
        ttft, reason = None, None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": f"in stream: {chunk['error']}"}
            if ttft is None:
                ttft = time.time() - start
            for c in chunk.get("choices", []):
                reason = c.get("finish_reason") or reason
        if reason is None:
            return {"error": "stream ended without a finish_reason"}
        return {"ttft": ttft, "endpoint": resp.getheader("x-ferrox-endpoint")}
    except TimeoutError:
        return {"error": "timeout", "hung": True}
    except Exception as e:  # refused, reset: an error, not a hang
        return {"error": repr(e)[:160]}
    finally:
        conn.close()


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=3, help="per client")
    p.add_argument("--timeout", type=float, default=90)
    p.add_argument("--out")
    p.add_argument("--warm", action="store_true",
                   help="send each prompt once, one after another, and exit (not measured)")
    args = p.parse_args()
    prompts = system_prompts(args.seed)
    if args.warm:
        for k, system in enumerate(prompts):
            r = one(args.url, args.model, system, f"Warm-up {k}: one word?", args.timeout)
            if "error" in r:
                raise SystemExit(f"warm-up {k}: {r['error']}")
        return

    def client(c):
        rng = random.Random(args.seed * 1000 + c)
        return [one(args.url, args.model, rng.choice(prompts), f"Question {c}.{i}: one word?", args.timeout)
                for i in range(args.requests)]

    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        per_client = list(pool.map(client, range(args.clients)))
    results = [r for rs in per_client for r in rs]
    ttfts = [r["ttft"] for r in results if "ttft" in r]
    out = {"total": len(results), "ok": len(ttfts),
           "failed": sum("error" in r for r in results),
           # The most requests one client lost: a replica going away ends
           # what was in flight on it (one request a client), no more.
           "worst_client": max((sum("error" in r for r in rs) for rs in per_client), default=0),
           "hung": sum(bool(r.get("hung")) for r in results),
           "errors": [r["error"] for r in results if "error" in r][:5],
           "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
           "endpoints": sorted({r.get("endpoint") or "" for r in results if "ttft" in r})}
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
