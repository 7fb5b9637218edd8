"""The device check of issue 9 (scripts/device-check runs it): on one GPU,
(a) the CUDA server's greedy tokens and top log-probabilities against the CPU
server on a tiny model, and against a plain-torch reference forward on
random weights of Llama-3.1-8B's geometry; (b) ferrox-bench at 1, 16 and 64
streams; (c) the server's plan against the memory the device reports in use,
and no KV block left reserved. One table at the end ($OUT/device-check.txt).

`--cpu`: a dry run here, torch on the CPU, the tiny model in every role, the
CPU binaries as both servers; the memory in use is the process's RSS."""

import argparse
import lzma
import os
import pathlib
import random
import shutil
import signal
import tempfile
import time

import torch

import agreement
import llama_files
import memory
import reference
from bench import run_bench
from report import FAIL, Report
from server import Server

STEPS = 16  # greedy tokens compared
# Issue 9's speed aims on one H200, aggregate tok/s by streams (a figure, not a verdict).
AIMS = {1: 160, 64: 3700}
PROMPT = 32  # prompt tokens (ids) of the comparisons


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
    p.add_argument("--work", help="folder for the models (default: /dev/shm if it has room)")
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--budget", type=float, default=460.0, help="seconds for the whole run")
    p.add_argument("--lp-tol", type=float, default=0.15, help="|d logprob| allowed (bf16)")
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


def work_dir(arg: str | None, need: int) -> pathlib.Path:
    if arg:
        base = pathlib.Path(arg)
    else:
        shm = pathlib.Path("/dev/shm")
        roomy = shm.is_dir() and shutil.disk_usage(shm).free > need * 1.2
        base = shm if roomy else pathlib.Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(prefix="ferrox-device-check-", dir=base))


def write_model(r: Report, section: str, dir: pathlib.Path, g, device) -> dict:
    started = time.monotonic()
    weights = llama_files.write(dir, g, device)
    if device != "cpu":
        torch.cuda.synchronize()
    secs = time.monotonic() - started
    size = (dir / "model.safetensors").stat().st_size
    r.add(section, "random weights written",
          f"{g.params() / 1e9:.3f} B params, {size / 1e9:.2f} GB bf16 in {secs:.1f} s "
          f"({size / 1e9 / max(secs, 1e-9):.2f} GB/s) to {dir.parent}")
    return weights


def prompt_ids(g) -> list:
    rng = random.Random(1)
    return [rng.randrange(len(llama_files.SPECIALS), g.vocab) for _ in range(PROMPT)]


def greedy_of(s: Server, prompt: list, ids: dict, d: Deadline) -> list:
    response = s.complete(prompt, STEPS, 5, d.left(120))
    return agreement.server_steps(response, ids)


def tiny_servers(a, r: Report, bins: dict, model: pathlib.Path, weights: dict,
                 logs: pathlib.Path, d: Deadline) -> None:
    """(a) the CUDA server against the CPU server on the tiny model, and each
    against the reference (which of the two is off, when they differ)."""
    g, cuda = llama_files.TINY, "cpu (in the cuda role)" if a.cpu else "cuda"
    ids = {w: i for i, w in enumerate(llama_files.vocab(g))}
    flags = ["--kv-cache-memory", "64MiB", "--max-seqs", "4", "--max-model-len", "512"]
    prompt = prompt_ids(g)
    runs = {}
    gpu = "cpu" if a.cpu else "cuda"
    # The CUDA build twice: its paged-attention kernel, and the gather path.
    roles = (("cpu", "cpu", "cpu", []), ("cuda", "cuda", gpu, []),
             ("gather", "cuda", gpu, ["--attention-backend", "gather"]))
    for role, binary, device, extra in roles:
        s = Server(bins[binary], model, logs / f"tiny-{role}.log",
                   flags + ["--device", device] + extra, d.left(120))
        try:
            runs[role] = greedy_of(s, prompt, ids, d)
        finally:
            s.stop()
    ref = agreement.reference_steps(reference.greedy(weights, g, prompt, STEPS))
    for what, expected, got in ((f"{cuda} server vs cpu server", runs["cpu"], runs["cuda"]),
                                ("cpu server vs reference", ref, runs["cpu"]),
                                (f"{cuda} server vs reference", ref, runs["cuda"]),
                                (f"{cuda} paged kernel vs gather path", runs["gather"],
                                 runs["cuda"])):
        agree = agreement.compare(expected, got, a.tie_tol)
        r.check("a tiny", f"{what}, greedy + top-5", agree.figure(), agree.ok(a.lp_tol))


def reference_run(a, r: Report, weights: dict, g, section: str) -> list:
    started = time.monotonic()
    greedy = agreement.reference_steps(reference.greedy(weights, g, prompt_ids(g), STEPS))
    r.add(section, "reference forward (plain torch, f32)",
          f"{STEPS} greedy tokens in {time.monotonic() - started:.1f} s")
    return greedy


def big_server(a, bins: dict, model: pathlib.Path, logs: pathlib.Path, d: Deadline,
               backend: str = "paged") -> Server:
    streams = max(int(s) for s in a.streams.split(","))
    flags = ["--max-seqs", str(streams), "--attention-backend", backend]
    if a.cpu:
        # The plan's default takes 90% of the host: too much for a shared machine.
        flags += ["--device", "cpu", "--kv-cache-memory", "256MiB", "--max-model-len", "1024"]
    else:
        # The plan's default: 90% of the GPU's free memory.
        flags += ["--device", "cuda", "--max-model-len", "4096"]
    return Server(bins["cuda"], model, logs / f"big-server-{backend}.log", flags, d.left(300))


def against_reference(a, r: Report, s: Server, expected: list, g, section: str,
                      d: Deadline) -> None:
    ids = {w: i for i, w in enumerate(llama_files.vocab(g))}
    got = greedy_of(s, prompt_ids(g), ids, d)
    agree = agreement.compare(expected, got, a.tie_tol)
    r.check(section, "server vs reference, greedy + top-5", agree.figure(), agree.ok(a.lp_tol))


def benches(a, r: Report, bins: dict, s: Server, d: Deadline, streams: list | None = None,
            label: str = "") -> None:
    """(b) aggregate tok/s, TTFT and ITL at each stream count."""
    for n in streams or [int(x) for x in a.streams.split(",")]:
        try:
            b = run_bench(bins["bench"], s.url, s.name, n, a.prompt_len, a.output_len,
                          d.left(150))
        except Exception as e:  # noqa: BLE001 - the table says what failed
            r.add("b bench", f"{n} streams", f"{type(e).__name__}: {e}", FAIL)
            continue
        ok = b["failed"] == 0 and b["ok"] > 0
        aim = "" if a.cpu or n not in AIMS else (
            f"; aim {AIMS[n]}: {'met' if b['tok_s'] >= AIMS[n] else 'not met'}")
        r.check("b bench", f"{label}{n} streams x {a.output_len} tokens ({a.prompt_len}-word prompt)",
                f"{b['tok_s']:.1f} tok/s; TTFT p50 {b['ttft_p50']:.0f} ms p99 "
                f"{b['ttft_p99']:.0f} ms; ITL p50 {b['itl_p50']:.1f} ms p99 {b['itl_p99']:.1f} ms;"
                f" {b['ok']} ok {b['failed']} failed{aim}", ok)


def run(a, r: Report, bins: dict, work: pathlib.Path, logs: pathlib.Path, d: Deadline) -> None:
    device = "cpu" if a.cpu else "cuda"
    r.add("run", "machine", memory.machine(a.cpu))
    tiny = work / "tiny"
    tiny_weights = write_model(r, "a tiny", tiny, llama_files.TINY, device)
    section(r, "a tiny", lambda: tiny_servers(a, r, bins, tiny, tiny_weights, logs, d))
    if a.cpu:
        # The 8B's steps, on the tiny model.
        g, big, weights, sec = llama_files.TINY, tiny, tiny_weights, "a 8B (tiny)"
    else:
        del tiny_weights
        g, big, sec = llama_files.LLAMA_8B, work / "llama-8b", "a 8B"
        weights = write_model(r, sec, big, g, device)
    # The reference takes the weights and drops them: the server gets the GPU.
    held = {"weights": weights}
    del weights
    expected = section(r, sec, lambda: reference_run(a, r, held.pop("weights"), g, sec))
    if device == "cuda":
        torch.cuda.empty_cache()
    before = memory.device_used(a.cpu)
    started = time.monotonic()
    s = section(r, sec, lambda: big_server(a, bins, big, logs, d))
    if s is None:
        return
    try:
        r.add(sec, "server loaded", f"{time.monotonic() - started:.1f} s; {s.device_line()}")
        if expected is not None:
            section(r, sec, lambda: against_reference(a, r, s, expected, g, sec, d))
        peak = memory.Peak(s.proc.pid, a.cpu, before)
        benches(a, r, bins, s, d)
        section(r, "c memory", lambda: memory.check(r, s, before, a.cpu, peak))
    finally:
        s.stop()
    section(r, "b bench", lambda: gather_bench(a, r, bins, big, logs, d))


def gather_bench(a, r: Report, bins: dict, model: pathlib.Path, logs: pathlib.Path,
                 d: Deadline) -> None:
    """The paged kernel's gain: the gather path at the middle stream count,
    when the run has time left for a second load."""
    counts = [int(x) for x in a.streams.split(",")]
    if d.left(600) < 240:
        r.add("b bench", "gather path", "skipped: under 240 s of the run left")
        return
    s = big_server(a, bins, model, logs, d, backend="gather")
    try:
        benches(a, r, bins, s, d, [counts[len(counts) // 2]], "gather path, ")
    finally:
        s.stop()


def section(r: Report, name: str, step):
    """Runs `step`; a failure is a FAIL row, and the run goes on."""
    try:
        return step()
    except Exception as e:  # noqa: BLE001 - the table says what failed
        r.add(name, "error", f"{type(e).__name__}: {str(e)[-600:]}", FAIL)
        return None


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
    need = 0 if a.cpu else 2 * llama_files.LLAMA_8B.params() + (1 << 30)
    work = work_dir(a.work, need)
    out = pathlib.Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    logs = work / "logs"
    logs.mkdir()
    title = (f"ferrox device check ({'--cpu dry run' if a.cpu else torch.cuda.get_device_name()}"
             f", torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    r = Report(title)
    try:
        bins = {k: unpack(v, work) for k, v in
                (("cuda", a.cuda_server), ("cpu", a.cpu_server), ("bench", a.bench))}
        run(a, r, bins, work, logs, d)
    except (Exception, Stopped) as e:  # noqa: BLE001 - the table says what failed
        r.add("run", "stopped", f"{type(e).__name__}: {e}", FAIL)
    finally:
        text = r.render()
        print("\n" + text)
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / "device-check.txt").write_text(text + "\n")
            for log in sorted(logs.glob("*.log")):
                # The last 4 MB: what comes back from the device is limited.
                (out / log.name).write_bytes(log.read_bytes()[-(4 << 20):])
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if r.failed() else 0


if __name__ == "__main__":
    raise SystemExit(main())
