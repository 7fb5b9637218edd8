"""scripts/device-check runs only on a GPU machine (issue 9); what CI can check
of it costs seconds: it parses, it refuses at once without a GPU, and its
pure parts (how two greedy runs agree, ferrox-bench's figures) decide right."""

import os
import py_compile
import subprocess
import sys

import pytest

from helpers import ROOT

DEVICE = ROOT / "tests" / "device"
sys.path.insert(0, str(DEVICE))

import agreement  # noqa: E402
import bench  # noqa: E402

SCRIPT = ROOT / "scripts" / "device-check"


def test_script_and_modules_parse(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    modules = sorted(DEVICE.glob("*.py"))
    assert {p.name for p in modules} >= {"check.py", "llama_files.py", "reference.py"}
    for p in modules:
        py_compile.compile(str(p), cfile=str(tmp_path / (p.name + "c")), doraise=True)


def test_exits_at_once_saying_so_without_a_gpu(tmp_path):
    # An nvidia-smi that fails, as on a machine without a driver.
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 2, done
    assert "no NVIDIA GPU: nvidia-smi failed" in done.stderr
    assert not (tmp_path / "out").exists(), "nothing is written without a GPU"


def lp(top1, *rest):
    """A step's top log-probabilities: token 10 first, then 11, 12, ..."""
    return {10 + i: v for i, v in enumerate((top1, *rest))}


@pytest.mark.parametrize("expected,got,ok,equal,tie", [
    # Same tokens, log-probabilities within tolerance.
    ([(10, lp(-0.1, -2.0))] * 3, [(10, lp(-0.12, -2.05))] * 3, True, 3, False),
    # Same tokens, a log-probability off by more than the tolerance.
    ([(10, lp(-0.1, -2.0))] * 3, [(10, lp(-0.1, -2.5))] * 3, False, 3, False),
    # A different token the expected run rated within the tie tolerance: stop there, ok.
    ([(10, lp(-0.6, -0.7))] * 2, [(10, lp(-0.6, -0.7)), (11, lp(-0.7, -0.6))], True, 1, True),
    # A different token the expected run rated far below its own: diverged.
    ([(10, lp(-0.1, -3.0))] * 2, [(10, lp(-0.1, -3.0)), (11, lp(-3.0, -0.1))], False, 1, False),
    # A token outside the expected top: diverged.
    ([(10, lp(-0.1, -3.0))] * 2, [(10, lp(-0.1, -3.0)), (99, {99: -0.1})], False, 1, False),
    # Fewer steps than expected: diverged.
    ([(10, lp(-0.1))] * 3, [(10, lp(-0.1))] * 2, False, 2, False),
])
def test_agreement(expected, got, ok, equal, tie):
    a = agreement.compare(expected, got, tie_tol=0.3)
    assert (a.ok(lp_tol=0.15), a.equal, a.tie) == (ok, equal, tie), a.figure()


def test_agreement_against_every_logprob_of_the_reference():
    every = agreement.Every([-5.0] * 10 + [-0.1, -0.2])
    a = agreement.compare([(10, every)], [(10, {10: -0.1, 11: -0.3})], tie_tol=0.3)
    assert a.ok(0.15) and abs(a.first_step_lp_diff - 0.1) < 1e-9, a.figure()


def test_bench_figures_parse_from_what_ferrox_bench_prints():
    text = ("concurrency: 16\nrequests: 15 ok, 1 failed\noutput tokens: 1920\nwall: 2.00 s\n"
            "throughput: 960.5 tokens/s\nTTFT: p50 12.5 ms, p99 40.0 ms\n"
            "ITL: p50 3.1 ms, p99 9.9 ms\nerror: HTTP 503")
    assert bench.parse(text) == {"ok": 15, "failed": 1, "tok_s": 960.5, "ttft_p50": 12.5,
                                 "ttft_p99": 40.0, "itl_p50": 3.1, "itl_p99": 9.9}
    with pytest.raises(RuntimeError, match="throughput"):
        bench.parse("requests: 1 ok, 0 failed")
