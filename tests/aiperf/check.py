"""tests/aiperf/run's checks (stdlib, plus transformers for the tokenizer):

    check.py tokenizer URL DIR      the written tokenizer tokenizes as the server does
    check.py metrics URL            the server's counters, as JSON, to stdout
    check.py export URL ARTIFACTS BEFORE REQUESTS OSL NAME
                                    aiperf's export against the server's counters
"""

import json
import re
import sys
import urllib.request

COUNTERS = {
    "generated": "ferrox_generation_tokens_total",
    "prompt": "ferrox_prompt_tokens_total",
    "cached": "ferrox_prefix_cache_hits_total",
    "kv_used": "ferrox_kv_blocks_used",
    "running": 'vllm:num_requests_running{model_name="smol"}',
}
TEXTS = ["Hello world, 12345 apples!", "  spaces\n\nnewlines\tand tabs", "Ünïcödé 日本語 😀",
         "def f(x):\n    return x ** 2  # square"]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def metrics(url: str) -> dict:
    text = get(url + "/metrics")
    out = {}
    for key, name in COUNTERS.items():
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        assert m, f"{name} missing from /metrics"
        out[key] = float(m.group(1))
    return out


def tokenizer(url: str, path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    for text in TEXTS:
        ours = tok.encode(text, add_special_tokens=False)
        server = post(url + "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
        assert ours == server, f"{text!r}: {ours} != {server}"


def export(url: str, artifacts: str, before: str, requests: str, osl: str, name: str) -> None:
    d = json.load(open(f"{artifacts}/profile_export_aiperf.json"))
    was = json.load(open(before))
    now = metrics(url)
    n, osl = int(requests), int(osl)
    value = lambda k, stat="avg": d[k][stat]
    assert d["error_summary"] == [] and value("request_error_rate") == 0, d["error_summary"]
    assert value("completed_request_count") == n, value("completed_request_count")
    # ignore_eos: every answer is exactly osl tokens, by the server's count.
    assert value("output_sequence_length", "min") == value("output_sequence_length", "max") == osl
    assert value("osl_mismatch_count") == 0
    for k in ("time_to_first_token", "inter_token_latency", "request_latency"):
        assert d[k]["count"] == n and d[k]["avg"] > 0, k
    # What aiperf read from the answers' usage is what the server counted.
    for ours, theirs in (("generated", "total_usage_completion_tokens"),
                         ("prompt", "total_usage_prompt_tokens"),
                         ("cached", "total_usage_prompt_cache_read_tokens")):
        moved = now[ours] - was[ours]
        assert moved == value(theirs), f"{ours}: the server counted {moved}, aiperf {value(theirs)}"
    assert now["generated"] - was["generated"] == n * osl
    if name == "chat":
        # The chat template's system prompt is shared: its blocks are cached.
        assert value("total_usage_prompt_cache_read_tokens") > 0
    assert now["kv_used"] == 0 and now["running"] == 0, now
    print(f"aiperf {name}: {n} requests, "
          f"output {value('output_token_throughput'):.1f} tok/s, "
          f"TTFT p50 {value('time_to_first_token', 'p50'):.0f} ms, "
          f"ITL avg {value('inter_token_latency'):.1f} ms, "
          f"ISL {value('input_sequence_length'):.0f}, "
          f"prompt cache {value('overall_usage_prompt_cache_read_pct'):.1f}%")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "metrics":
        print(json.dumps(metrics(*args)))
    else:
        {"tokenizer": tokenizer, "export": export}[cmd](*args)
