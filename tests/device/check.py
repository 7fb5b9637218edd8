"""The device check of issue 9 (scripts/device-check runs it): on one GPU,
(a) the CUDA server's greedy tokens and top log-probabilities against the CPU
server on a tiny model, and against a plain-torch reference forward on
random weights of Llama-3.1-8B's geometry; (b) ferrox-bench at 1, 16 and 64
streams; (c) the server's plan against the memory the device reports in use,
and no KV block left reserved. Each row goes to $OUT/device-check.txt as it
is found, the table after them at the end; the order of the steps and what a
failure skips are sequence.py's.

`--cpu`: a dry run here, torch on the CPU, the tiny model in every role, the
CPU binaries as both servers; the memory in use is the process's RSS."""

import argparse
import importlib.metadata
import lzma
import os
import pathlib
import random
import shutil
import signal
import subprocess
import tempfile
import time

import torch

import agreement
import families
import llama_files
import memory
import reference
import sequence
from bench import run_bench
from report import FAIL, Report
from server import Server

STEPS = 16  # greedy tokens compared
# Issue 9's speed aims on one H200, aggregate tok/s by streams (a figure, not a verdict).
AIMS = {1: 160, 64: 3700}
PROMPT = 32  # prompt tokens (ids) of the comparisons
# Seconds a server may take to be ready (tiny model, 8B) and one bench run.
TINY_START, BIG_START, BENCH_CAP = 60, 180, 90


class Stopped(BaseException):
    """SIGTERM (the run's `timeout`): not caught by a step, so the table is
    still printed with what was found."""


def _stop(signum, frame):
    raise Stopped(f"signal {signum}: the run's time limit")


class Deadline:
    """The whole run's time; each step gets its own limit within it."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self, limit: float) -> float:
        left = self.end - time.monotonic()
        if left <= 1:
            raise TimeoutError("the check's time is spent")
        return min(limit, left)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU (no GPU needed)")
    p.add_argument("--cuda-server", required=True, help="the CUDA ferrox-server (may be .xz)")
    p.add_argument("--cpu-server", required=True, help="a CPU ferrox-server (may be .xz)")
    p.add_argument("--bench", required=True, help="ferrox-bench (may be .xz)")
    p.add_argument("--work", help="folder for the models (default: the one of /dev/shm, the temp folder and the checkout with the most free space)")
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--budget", type=float, default=460.0, help="seconds for the whole run")
    # bf16 against f32 over Llama-3.1-8B's 32 layers moved the top-5
    # logprobs by at most 0.111 (p99 0.093) over 96 positions, and flipped
    # the greedy token once, at an f32 gap of 0.036 (bf16_drift.py,
    # docs/benchmarks.md): 0.2 is twice the p99; a gap under 0.3 is a tie.
    p.add_argument("--lp-tol", type=float, default=0.2, help="|d logprob| allowed (bf16)")
    p.add_argument("--tie-tol", type=float, default=0.3, help="a gap under this is a near-tie")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    return p.parse_args()


def unpack(path: str, into: pathlib.Path) -> str:
    """The binary at `path`, decompressed into `into` when it is .xz."""
    src = pathlib.Path(path)
    if not src.is_file():
        raise SystemExit(f"device-check: {path} is not a file")
    if src.suffix != ".xz":
        return str(src)
    dst = into / src.stem
    with lzma.open(src) as f, open(dst, "wb") as out:
        shutil.copyfileobj(f, out, 16 << 20)
    dst.chmod(0o755)
    return str(dst)


BIG_GIB = 17.2  # the 8B model's bf16 files and a margin: the work folder's least free space


def work_dir(arg: str | None, need: int, root: pathlib.Path) -> tuple:
    """(folder for the models, the df row): `--work`, else whichever of
    /dev/shm, the temp folder and the checkout has the most free space; a
    clear stop when even that is under `need`."""
    if arg:
        candidates = [pathlib.Path(arg)]
        candidates[0].mkdir(parents=True, exist_ok=True)
    else:
        candidates = [p for p in (pathlib.Path("/dev/shm"), pathlib.Path(tempfile.gettempdir()),
                                  root) if p.is_dir()]
    free = {p: shutil.disk_usage(p).free for p in candidates}
    base = max(candidates, key=lambda p: free[p])
    df = "; ".join(f"{p} {free[p] / 1e9:.1f} GB free" for p in candidates)
    if free[base] < need:
        raise SystemExit(f"device-check: no folder has {need / 1e9:.1f} GB free for the models ({df})")
    return pathlib.Path(tempfile.mkdtemp(prefix="ferrox-device-check-", dir=base)), \
        f"{df}; models in {base}"


def prompt_ids(g) -> list:
    rng = random.Random(1)
    return [rng.randrange(len(llama_files.SPECIALS), g.vocab) for _ in range(PROMPT)]


class Big:
    """An 8B server and what its memory check measures beside it."""

    def __init__(self, server: Server, before: int, cpu: bool):
        self.server, self.before = server, before
        self.peak = memory.Peak(server.proc.pid, cpu, before)


class Steps:
    """The real steps of `sequence.run`, on this machine's device."""

    def __init__(self, a, r: Report, bins: dict, work: pathlib.Path, logs: pathlib.Path,
                 d: Deadline):
        self.a, self.r, self.bins, self.work, self.logs, self.d = a, r, bins, work, logs, d
        self.device = "cpu" if a.cpu else "cuda"
        self.streams = [int(x) for x in a.streams.split(",")]
        self.big_section = "a 8B (tiny)" if a.cpu else "a 8B"
        self.g = llama_files.TINY if a.cpu else llama_files.LLAMA_8B
        self.tiny_dir = work / "tiny"
        # In the dry run the 8B's steps run on the tiny model.
        self.big_dir = self.tiny_dir if a.cpu else work / "llama-8b"
        self.weights: dict = {}

    def time_left(self) -> float:
        return self.d.end - time.monotonic()

    def machine(self) -> str:
        return memory.machine(self.a.cpu)

    def _write(self, section: str, dir: pathlib.Path, g) -> dict:
        started = time.monotonic()
        weights = llama_files.write(dir, g, self.device)
        if self.device != "cpu":
            torch.cuda.synchronize()
        secs = time.monotonic() - started
        size = (dir / "model.safetensors").stat().st_size
        self.r.add(section, "random weights written",
                   f"{g.params() / 1e9:.3f} B params, {size / 1e9:.2f} GB bf16 in {secs:.1f} s "
                   f"({size / 1e9 / max(secs, 1e-9):.2f} GB/s) to {dir.parent}")
        return weights

    def write_tiny(self) -> bool:
        self.weights["tiny"] = self._write("a tiny", self.tiny_dir, llama_files.TINY)
        return True

    def _ids(self, g) -> dict:
        return {w: i for i, w in enumerate(llama_files.vocab(g))}

    def tiny_run(self, role: str) -> list:
        binary, extra = ("cpu", []) if role == "cpu" else ("cuda", [])
        if role == "gather":
            extra = ["--attention-backend", "gather"]
        device = "cpu" if role == "cpu" or self.a.cpu else "cuda"
        flags = ["--kv-cache-memory", "64MiB", "--max-seqs", "4", "--max-model-len", "512",
                 "--device", device, *extra]
        s = Server(self.bins[binary], self.tiny_dir, self.logs / f"tiny-{role}.log", flags,
                   self.d.left(TINY_START))
        try:
            response = s.complete(prompt_ids(llama_files.TINY), STEPS, 5, self.d.left(60))
            return agreement.server_steps(response, self._ids(llama_files.TINY))
        finally:
            s.stop()

    def tiny_reference(self) -> list:
        g = llama_files.TINY
        return agreement.reference_steps(
            reference.greedy(self.weights["tiny"], g, prompt_ids(g), STEPS))

    def compare_tiny(self, expected: str, got: str, runs: dict) -> None:
        name = {"cuda": "cpu (in the cuda role)" if self.a.cpu else "cuda", "cpu": "cpu",
                "reference": "reference"}
        what = (f"{name['cuda']} paged kernel vs gather path" if expected == "gather"
                else f"{name[got]} server vs {name[expected]}"
                + ("" if expected == "reference" else " server"))
        agree = agreement.compare(runs[expected], runs[got], self.a.tie_tol)
        self.r.check("a tiny", f"{what}, greedy + top-5", agree.figure(),
                     agree.ok(self.a.lp_tol))

    def family_names(self) -> list:
        return families.names()

    def family_run(self, name: str) -> None:
        """(d) `name`'s tiny model on the server under test (the CUDA one; the
        CPU build in the dry run) against transformers' recorded answers."""
        for run, context, prompts in families.runs(name):
            # Logs in the work folder: $OUT keeps the few the 8B steps write.
            s = Server(self.bins["cuda"], families.FIXTURES / name,
                       self.work / f"family-{name}-{run}.log",
                       families.flags(self.device, context), self.d.left(TINY_START))
            try:
                for i, p in enumerate(prompts):
                    response = s.complete(p["ids"], len(p["steps"]), 5, self.d.left(60),
                                          return_tokens_as_token_ids=True)
                    agree = agreement.compare(families.expected(p),
                                              families.server_steps(response), self.a.tie_tol)
                    self.r.check("d families", f"{name} {run} prompt {i} "
                                 f"({len(p['ids'])} tokens) vs transformers, greedy + top-5",
                                 agree.figure(), agree.ok(self.a.lp_tol))
            finally:
                s.stop()

    def write_big(self) -> bool:
        if self.a.cpu:
            self.weights["big"] = self.weights.get("tiny") or self._write(
                self.big_section, self.tiny_dir, llama_files.TINY)
        else:
            self.weights.pop("tiny", None)
            self.weights["big"] = self._write(self.big_section, self.big_dir, self.g)
        return True

    def big_reference(self) -> list:
        # The reference takes the weights and drops them: the server gets the GPU.
        weights = self.weights.pop("big")
        started = time.monotonic()
        greedy = agreement.reference_steps(reference.greedy(weights, self.g, prompt_ids(self.g),
                                                            STEPS))
        del weights
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.r.add(self.big_section, "reference forward (plain torch, f32)",
                   f"{STEPS} greedy tokens in {time.monotonic() - started:.1f} s")
        return greedy

    def start_big(self, backend: str) -> Big:
        self.weights.pop("big", None)
        if self.device == "cuda":
            torch.cuda.empty_cache()
        flags = ["--max-seqs", str(max(self.streams)), "--attention-backend", backend]
        if self.a.cpu:
            # The plan's default would size the pool from the shared host's memory.
            flags += ["--device", "cpu", "--kv-cache-memory", "256MiB", "--max-model-len", "1024"]
        else:
            # The plan's default: 90% of the GPU's free memory.
            flags += ["--device", "cuda", "--max-model-len", "4096"]
        before = memory.device_used(self.a.cpu)
        started = time.monotonic()
        s = Server(self.bins["cuda"], self.big_dir, self.logs / f"big-server-{backend}.log", flags,
                   self.d.left(BIG_START))
        self.r.add(self.big_section, f"server loaded ({backend})",
                   f"{time.monotonic() - started:.1f} s; {s.device_line()}")
        return Big(s, before, self.a.cpu)

    def against_reference(self, big: Big, expected: list) -> None:
        response = big.server.complete(prompt_ids(self.g), STEPS, 5, self.d.left(120))
        got = agreement.server_steps(response, self._ids(self.g))
        agree = agreement.compare(expected, got, self.a.tie_tol)
        self.r.check(self.big_section, "server vs reference, greedy + top-5", agree.figure(),
                     agree.ok(self.a.lp_tol))

    def bench(self, big: Big, n: int, label: str) -> None:
        """(b) aggregate tok/s, TTFT and ITL at `n` streams."""
        a = self.a
        b = run_bench(self.bins["bench"], big.server.url, big.server.name, n, a.prompt_len,
                      a.output_len, self.d.left(BENCH_CAP))
        ok = b["failed"] == 0 and b["ok"] > 0
        aim = "" if a.cpu or n not in AIMS else (
            f"; aim {AIMS[n]}: {'met' if b['tok_s'] >= AIMS[n] else 'not met'}")
        self.r.check("b bench", f"{label}{n} streams x {a.output_len} tokens ({a.prompt_len}-word"
                     " prompt)",
                     f"{b['tok_s']:.1f} tok/s; TTFT p50 {b['ttft_p50']:.0f} ms p99 "
                     f"{b['ttft_p99']:.0f} ms; ITL p50 {b['itl_p50']:.1f} ms p99 "
                     f"{b['itl_p99']:.1f} ms; {b['ok']} ok {b['failed']} failed{aim}", ok)

    def memory(self, big: Big) -> None:
        memory.check(self.r, big.server, big.before, self.a.cpu, big.peak)

    def stop(self, big: Big) -> None:
        big.peak.stop()
        big.server.stop()


def preflight(r: Report, bins: dict, cpu: bool) -> None:
    """What the binaries will run against: the driver's CUDA, the CUDA wheels'
    versions, and `ldd` of each unpacked binary (a stop, exit 2, naming what
    is missing)."""
    if not cpu:
        r.add("run", "driver", memory.driver_cuda())
    r.add("run", "CUDA wheels", wheel_versions())
    for name, path in bins.items():
        done = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30)
        missing = sorted({l.split()[0] for l in done.stdout.splitlines() if "not found" in l})
        if missing:
            raise Unrunnable(f"{path} needs {', '.join(missing)}: not found on the loader's path "
                             "(LD_LIBRARY_PATH)")


class Unrunnable(Exception):
    """A binary cannot run here: the check stops with exit 2."""


def wheel_versions() -> str:
    found = []
    for base in ("nvidia-cuda-nvrtc", "nvidia-cublas", "nvidia-cuda-runtime"):
        for name in (base, f"{base}-cu13", f"{base}-cu12"):
            try:
                found.append(f"{name} {importlib.metadata.version(name)}")
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        else:
            found.append(f"{base} not installed")
    return ", ".join(found)


def main() -> int:
    a = parse()
    signal.signal(signal.SIGTERM, _stop)
    d = Deadline(a.budget)
    if not a.cpu and not torch.cuda.is_available():
        print("device-check: torch sees no CUDA device; this check needs an NVIDIA GPU (or --cpu)")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.cpu:
        # The dry run's host is shared: more threads only spin against each other.
        torch.set_num_threads(1)
    root = pathlib.Path(__file__).resolve().parents[2]
    work, df = work_dir(a.work, 0 if a.cpu else int(BIG_GIB * 1e9), root)
    out = pathlib.Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    # Logs straight to $OUT (at most 5 files), so a cut run still brings them back.
    logs = out or work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    title = (f"ferrox device check ({'--cpu dry run' if a.cpu else torch.cuda.get_device_name()}"
             f", torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    r = Report(title, live=out / "device-check.txt" if out else None)
    r.add("run", "disk", df)
    code = 0
    try:
        # On disk beside the packed binaries, not in the model folder (/dev/shm may be noexec).
        unpacked = root / ".device-bin" / "unpacked"
        unpacked.mkdir(parents=True, exist_ok=True)
        bins = {k: unpack(v, unpacked) for k, v in
                (("cuda", a.cuda_server), ("cpu", a.cpu_server), ("bench", a.bench))}
        preflight(r, bins, a.cpu)
        sequence.run(r, Steps(a, r, bins, work, logs, d))
    except Unrunnable as e:
        r.add("run", "stopped", str(e), FAIL)
        code = 2
    except (Exception, Stopped) as e:  # noqa: BLE001 - the table says what failed
        r.add("run", "stopped", f"{type(e).__name__}: {e}", FAIL)
    finally:
        text = r.render()
        print("\n" + text)
        if out:
            with open(out / "device-check.txt", "a") as f:
                f.write("\n" + text + "\n")
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return code or (1 if r.failed() else 0)


if __name__ == "__main__":
    raise SystemExit(main())
