"""One ferrox-bench run, its figures parsed from what it prints."""

import re
import subprocess


def run_bench(binary: str, url: str, model: str, streams: int, prompt_len: int,
              output_len: int, timeout: float) -> dict:
    """`streams` concurrent streams, as many requests (2 for one stream, so
    that one slow first request does not stand for the figure)."""
    requests = max(streams, 2)
    args = [binary, "--url", url, "--model", model, "--concurrency", str(streams),
            "--requests", str(requests), "--prompt-len", str(prompt_len),
            "--output-len", str(output_len), "--timeout", str(max(int(timeout), 1))]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"ferrox-bench exited {done.returncode}: {done.stderr[-400:]}")
    return parse(done.stdout)


def parse(text: str) -> dict:
    """The figures of ferrox-bench's report."""
    def number(pattern: str) -> float:
        m = re.search(pattern, text)
        if not m:
            raise RuntimeError(f"ferrox-bench printed no {pattern!r}: {text[-400:]}")
        return float(m.group(1))

    return {
        "ok": int(number(r"requests: (\d+) ok")),
        "failed": int(number(r"(\d+) failed")),
        "tok_s": number(r"throughput: ([\d.]+) tokens/s"),
        "ttft_p50": number(r"TTFT: p50 ([\d.]+) ms"),
        "ttft_p99": number(r"TTFT: p50 [\d.]+ ms, p99 ([\d.]+) ms"),
        "itl_p50": number(r"ITL: p50 ([\d.]+) ms"),
        "itl_p99": number(r"ITL: p50 [\d.]+ ms, p99 ([\d.]+) ms"),
    }
