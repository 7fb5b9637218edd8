"""The memory the server holds is the memory its plan counts (issue: one
memory model): resident set against weights + KV + reserves, and refusals
that name every number."""

import concurrent.futures
import json
import re
import subprocess

import requests

import tiny_model
from conftest import model_path, server_bin

TOLERANCE = 0.10


def plan_of(server) -> dict:
    """The `KV pool planned` log line's numbers."""
    line = next(l for l in server.log_text().splitlines() if "KV pool planned" in l)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b", line)}


def rss(server) -> int:
    status = open(f"/proc/{server.proc.pid}/status").read()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def fill_every_block(server, plan: dict, vocab: int) -> None:
    """Runs concurrent requests whose reservations cover the whole pool, so
    every block is written (prompts as token ids; 16 generated tokens each
    keep all of them running together)."""
    per_seq_tokens = plan["max_model_len"]
    seqs = plan["kv_blocks"] * plan["block_size"] // per_seq_tokens
    def one(i: int) -> int:
        prompt = [(7 * i + 13 * j) % (vocab - 2) + 2 for j in range(per_seq_tokens - 16)]
        r = requests.post(server.url + "/v1/completions", timeout=600, json={
            "model": "smol", "prompt": prompt, "max_tokens": 16, "ignore_eos": True,
            "temperature": 0})
        return r.status_code
    with concurrent.futures.ThreadPoolExecutor(seqs) as pool:
        assert list(pool.map(one, range(seqs))) == [200] * seqs
    assert server.metric("ferrox_kv_blocks_used") == 0


def check_resident(server, vocab: int, tolerance: float = TOLERANCE) -> None:
    plan = plan_of(server)
    counted = plan["weight_bytes"] + plan["kv_bytes"] + plan["activation_bytes"] + plan["overhead_bytes"]
    assert plan["total_bytes"] == counted
    # The pool is touched at start: weights and KV are resident before any request.
    assert rss(server) >= plan["weight_bytes"] + plan["kv_bytes"]
    fill_every_block(server, plan, vocab)
    held = rss(server)
    assert abs(held - counted) <= tolerance * counted, (
        f"resident {held} bytes, plan counts {counted}: {plan}")


def test_default_model_holds_what_its_plan_counts(start_server):
    s = start_server("--kv-blocks", "320", "--max-model-len", "512", "--max-seqs", "10",
                     "--prefill-chunk", "512", "--threads", "2")
    check_resident(s, vocab=49152)


def test_tiny_safetensors_model_holds_what_its_plan_counts(start_server, tmp_path):
    model = tiny_model.write(tmp_path / "tiny")
    s = start_server("--kv-blocks", "1024", "--max-model-len", "512", "--max-seqs", "32",
                     "--prefill-chunk", "512", "--threads", "2", model=str(model))
    plan = plan_of(s)
    # An f16 checkpoint is widened to f32 on CPU, and the plan says so.
    assert plan["weight_bytes"] == tiny_model.weight_bytes_f32()
    # A float model runs candle's op-by-op CPU path, whose temporaries are
    # freed on several threads: with glibc's per-thread arenas each kept its
    # own (resident 1.12-1.17 x the plan); the server keeps one arena.
    check_resident(s, vocab=tiny_model.VOCAB)


def serve_and_fail(*flags: str) -> str:
    out = subprocess.run(
        [server_bin(), "serve", "--model", model_path(), "--host", "127.0.0.1", "--port", "0", *flags],
        capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stderr
    assert "Stack backtrace" not in out.stderr and "panicked" not in out.stderr
    return out.stderr


def test_a_budget_too_small_stops_the_server_with_every_number():
    out = subprocess.run([server_bin(), "inspect", "--model", model_path(), "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    cpu = json.loads(out.stdout)["devices"]["cpu"]
    kv_per_seq = cpu["kvBytesPerToken"] * 8192
    err = serve_and_fail("--memory-utilization", "0.001")
    for part in ["bytes (", f"weights take {cpu['weightBytes']}",
                 f"one 8192-token sequence needs {kv_per_seq} bytes of KV",
                 "--max-model-len", "--memory-utilization"]:
        assert part in err, err
    err = serve_and_fail("--kv-blocks", "100", "--max-model-len", "4096")
    assert "a pool of 100 blocks of 16 tokens holds 1600 tokens, less than one 4096-token sequence" in err, err
    assert "smaller --pool sizes (or --kv-blocks, --window-blocks)" in err


def test_kv_dtype_doubles_the_pool_in_f32(start_server):
    f16 = start_server("--kv-cache-memory", "64MiB", "--max-model-len", "512")
    f32 = start_server("--kv-cache-memory", "64MiB", "--max-model-len", "512", "--kv-dtype", "f32")
    a, b = plan_of(f16), plan_of(f32)
    assert a["kv_blocks"] == 2 * b["kv_blocks"] + (a["kv_blocks"] % 2)
    assert "kv_dtype=f16" in f16.log_text() and "kv_dtype=f32" in f32.log_text()


def test_no_kv_flag_holds_what_max_seqs_full_sequences_need(start_server):
    # No KV flag and no --max-seqs: on meminfo alone the pool is what the
    # server can use (max_seqs full sequences plus the prefix cache's 25%),
    # and max_seqs is the plan's own figure.
    s = start_server("--threads", "2")
    plan = plan_of(s)
    line = next(l for l in s.log_text().splitlines() if "KV pool planned" in l)
    assert 'rule="max-seqs-fit"' in line and 'memory_source="meminfo"' in line, line
    assert plan["max_seqs"] == plan["plan_max_seqs"], line
    per_seq = -(-plan["max_model_len"] // plan["block_size"])
    seqs_blocks = plan["max_seqs"] * per_seq
    assert plan["kv_blocks"] == seqs_blocks + -(-seqs_blocks * 25 // 100), line
    counted = plan["weight_bytes"] + plan["kv_bytes"] + plan["activation_bytes"] + plan["overhead_bytes"]
    assert plan["total_bytes"] == counted
    held = rss(s)
    assert plan["weight_bytes"] + plan["kv_bytes"] <= held <= (1 + TOLERANCE) * counted, (
        f"resident {held} bytes, plan counts {counted}: {plan}")
