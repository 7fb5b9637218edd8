"""scripts/device-check runs only on a GPU machine (issue 9); what CI can check
of it costs seconds: it parses, it refuses at once without a GPU, and its
pure parts (how two greedy runs agree, ferrox-bench's figures) decide right."""

import os
import py_compile
import shutil
import subprocess
import sys
import time

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


def fake_pack_tree(tmp_path, commit: str):
    """A target dir with a CUDA binary recorded as built from `commit`, and
    CPU binaries to strip."""
    target = tmp_path / "target"
    (target / "cuda").mkdir(parents=True)
    (target / "cuda" / "ferrox-server-cuda.xz").write_bytes(b"not really xz")
    (target / "cuda" / "ferrox-server-cuda.commit").write_text(commit + "\n")
    (target / "release").mkdir()
    for b in ("ferrox-server", "ferrox-bench"):
        shutil.copy("/bin/true", target / "release" / b)
    return target


@pytest.mark.parametrize("flags,ok", [([], False), (["--any-commit"], True)])
def test_pack_refuses_a_cuda_binary_from_another_commit(tmp_path, flags, ok):
    target = fake_pack_tree(tmp_path, "0" * 40)
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    done = subprocess.run([str(SCRIPT), "--pack", str(tmp_path / "bin"), *flags],
                          capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode == 0) == ok, done
    if not ok:
        assert "built from commit " + "0" * 40 in done.stderr, done.stderr
        assert not (tmp_path / "bin" / "ferrox-server-cuda.xz").exists()


def test_pack_takes_a_cuda_binary_from_this_commit(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    target = fake_pack_tree(tmp_path, head)
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    done = subprocess.run([str(SCRIPT), "--pack", str(tmp_path / "bin")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done
    assert (tmp_path / "bin" / "ferrox-server-cuda.xz").exists()


import report  # noqa: E402
import sequence  # noqa: E402
from server import Server  # noqa: E402


class FakeSteps:
    """sequence.run's steps, each a row; the ones named in `fail` raise
    (`tiny_run:cuda`, `start_big:paged`, `bench:16`, ...)."""

    def __init__(self, r, fail=(), left=1000.0):
        self.r, self.fail, self.left = r, set(fail), left
        self.streams, self.big_section = [1, 16, 64], "a 8B"
        self.calls = []

    def _step(self, name, row=None):
        self.calls.append(name)
        if name in self.fail or name.split(":")[0] in self.fail:
            raise RuntimeError(f"{name} failed")
        if row:
            self.r.add(*row)
        return name

    def time_left(self):
        return self.left

    def machine(self):
        return self._step("machine")

    def write_tiny(self):
        return self._step("write_tiny")

    def tiny_run(self, role):
        return self._step(f"tiny_run:{role}")

    def tiny_reference(self):
        return self._step("tiny_reference")

    def compare_tiny(self, expected, got, runs):
        self._step(f"compare:{got}-{expected}", ("a tiny", f"{got} vs {expected}", "ok"))

    def family_names(self):
        self._step("family_names")
        return ["gemma3", "qwen3"]

    def family_run(self, name):
        self._step(f"family_run:{name}", ("d families", f"{name} vs transformers", "ok"))

    def write_big(self):
        return self._step("write_big")

    def big_reference(self):
        return self._step("big_reference")

    def start_big(self, backend):
        return self._step(f"start_big:{backend}", ("a 8B", f"loaded {backend}", "ok"))

    def against_reference(self, big, expected):
        self._step(f"against_reference:{big}", ("a 8B", f"vs reference on {big}", "ok"))

    def bench(self, big, n, label):
        self._step(f"bench:{n}", ("b bench", f"{label}{n} streams", "ok"))

    def memory(self, big):
        self._step(f"memory:{big}", ("c memory", f"memory on {big}", "ok"))

    def stop(self, big):
        self._step(f"stop:{big}")


def run_fake(tmp_path, **kw):
    live = tmp_path / "out" / "device-check.txt"
    r = report.Report("fake", live=live)
    steps = FakeSteps(r, **kw)
    sequence.run(r, steps)
    lines = live.read_text().splitlines()
    # Every row is in the file as it was made, in order.
    assert lines[0] == "fake"
    assert lines[1:] == [f"[{x.section}] {x.what}: {x.figure} [{x.verdict}]" for x in r.rows]
    return steps, [x.what for x in r.rows]


ALL_BENCHES = ["1 streams", "16 streams", "64 streams"]


@pytest.mark.parametrize("fail,ran,not_ran", [
    # Nothing fails: every step, the gather bench at the middle count last.
    ((), ALL_BENCHES + ["memory on start_big:paged", "gather path, 16 streams"], []),
    # Each later step still runs when one before it fails.
    (("machine",), ALL_BENCHES + ["memory on start_big:paged"], []),
    (("tiny_run:cuda",), ALL_BENCHES, ["call:compare:cuda-cpu", "call:compare:cuda-gather"]),
    (("tiny_run:cpu",), ["cuda vs reference"] + ALL_BENCHES, ["call:compare:cpu-reference"]),
    (("tiny_reference",), ["cuda vs cpu"] + ALL_BENCHES, []),
    (("big_reference",), ALL_BENCHES + ["memory on start_big:paged"],
     ["vs reference on start_big:paged"]),
    (("against_reference",), ALL_BENCHES + ["memory on start_big:paged"], []),
    (("bench:1",), ["16 streams", "64 streams", "memory on start_big:paged",
                    "gather path, 16 streams"], []),
    (("memory",), ALL_BENCHES + ["gather path, 16 streams"], []),
    # The paged server failing: comparison, benches and memory on the gather path.
    (("start_big:paged",), ["fallback", "vs reference on start_big:gather",
                            "gather path, 1 streams", "gather path, 16 streams",
                            "gather path, 64 streams", "memory on start_big:gather"],
     ["1 streams"]),
    # One family failing: the next still runs.
    (("family_run:gemma3",), ["qwen3 vs transformers"] + ALL_BENCHES, []),
    # Both tiny CUDA roles failing skips only the 8B steps.
    (("tiny_run:cuda", "tiny_run:gather"), ["cpu vs reference", "skipped"], ALL_BENCHES),
    (("write_tiny",), ["skipped"], ALL_BENCHES),
])
def test_a_failing_step_does_not_skip_the_later_ones(tmp_path, fail, ran, not_ran):
    steps, rows = run_fake(tmp_path, fail=fail)
    for what in ran:
        assert what in rows, (fail, rows)
    for what in not_ran:
        if what.startswith("call:"):
            assert what[5:] not in steps.calls, (fail, steps.calls)
        else:
            assert what not in rows, (fail, rows)
    # Every 8B server started is stopped.
    started = [c.split(":", 1)[1] for c in steps.calls if c.startswith("start_big:")
               and c not in fail]
    assert [c for c in steps.calls if c.startswith("stop:")] == \
        [f"stop:start_big:{b}" for b in started]
    if "tiny_run:gather" in fail or "write_tiny" in fail:
        assert "write_big" not in steps.calls


def test_the_gather_bench_is_skipped_without_the_time_for_a_second_load(tmp_path):
    steps, rows = run_fake(tmp_path, left=sequence.GATHER_BENCH_NEEDS - 1)
    assert "gather path" in rows and "gather path, 16 streams" not in rows
    assert "start_big:gather" not in steps.calls


def test_a_server_that_never_gets_ready_is_cut_at_its_wait(tmp_path):
    # A "server" that ignores SIGTERM and never answers: the wait ends at its
    # limit and the process is gone after (killed when SIGTERM is ignored).
    fake = tmp_path / "hangs"
    fake.write_text("#!/usr/bin/env python3\nimport signal, time\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n")
    fake.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="not ready after 2 s"):
        Server(str(fake), tmp_path, tmp_path / "hangs.log", [], ready_timeout=2)
    took = time.monotonic() - started
    assert took < 2 + 5 + 3, took  # the wait, then SIGTERM's 5 s grace, then the kill
    gone = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True)
    assert gone.returncode == 1, gone.stdout
