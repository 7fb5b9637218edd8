"""The device check's order of steps and what a failure skips. Torch-free:
the steps come from `check.Steps` on the device and from fakes in
tests/chart/test_device_check.py. (d), the families' tiny models, runs right
after (a)'s tiny model: small, and independent of it.

Every step is a section of its own: a failing step is a FAIL row and the
next step runs. The tiny model's three roles (cpu, cuda, gather) are run one
by one; only when both CUDA roles fail are the 8B steps skipped (a CUDA build
that serves nothing would only fail them again). When the 8B server with the
paged-attention kernel fails to start (the kernel has never run on a GPU: the
likeliest failure), its comparison, benches and memory check run on the
gather path instead, so some GPU figures always come back."""

from report import FAIL, INFO, Report

TINY_ROLES = ("cpu", "cuda", "gather")
# Seconds of the run a second 8B load (the gather bench) needs.
GATHER_BENCH_NEEDS = 240


def section(r: Report, name: str, step):
    """Runs `step`; a failure is a FAIL row, and the run goes on."""
    try:
        return step()
    except Exception as e:  # noqa: BLE001 - the table says what failed
        r.add(name, "error", f"{type(e).__name__}: {str(e)[-600:]}", FAIL)
        return None


def run(r: Report, steps) -> None:
    """Every step in order, each in its own section."""
    r.add("run", "machine", section(r, "run", steps.machine) or "unknown")
    tiny_cuda = tiny(r, steps)
    families(r, steps)
    if not tiny_cuda:
        r.add(steps.big_section, "skipped", "both tiny CUDA roles failed", FAIL)
        return
    if section(r, steps.big_section, steps.write_big) is None:
        return
    expected = section(r, steps.big_section, steps.big_reference)
    paged = section(r, steps.big_section, lambda: steps.start_big("paged"))
    if paged is None:
        r.add(steps.big_section, "fallback",
              "the paged server failed: comparison, benches and memory on --attention-backend "
              "gather", INFO)
        gather = section(r, steps.big_section, lambda: steps.start_big("gather"))
        if gather is not None:
            serve_big(r, steps, gather, expected, steps.streams, "gather path, ")
        return
    serve_big(r, steps, paged, expected, steps.streams, "")
    if steps.time_left() < GATHER_BENCH_NEEDS:
        r.add("b bench", "gather path", f"skipped: under {GATHER_BENCH_NEEDS} s of the run left")
        return
    gather = section(r, "b bench", lambda: steps.start_big("gather"))
    if gather is not None:
        middle = [steps.streams[len(steps.streams) // 2]]
        serve_big(r, steps, gather, None, middle, "gather path, ", memory=False)


def tiny(r: Report, steps) -> bool:
    """(a) the tiny model's roles and their comparisons; true when a CUDA
    role served."""
    if section(r, "a tiny", steps.write_tiny) is None:
        return False
    runs = {}
    for role in TINY_ROLES:
        got = section(r, "a tiny", lambda: steps.tiny_run(role))
        if got is not None:
            runs[role] = got
    ref = section(r, "a tiny", steps.tiny_reference)
    if ref is not None:
        runs["reference"] = ref
    for expected, got in (("cpu", "cuda"), ("reference", "cpu"), ("reference", "cuda"),
                          ("gather", "cuda")):
        if expected in runs and got in runs:
            section(r, "a tiny", lambda: steps.compare_tiny(expected, got, runs))
        else:
            missing = expected if expected not in runs else got
            r.add("a tiny", f"{got} vs {expected}", f"not compared: {missing} failed")
    return "cuda" in runs or "gather" in runs


def families(r: Report, steps) -> None:
    """(d) each family's tiny model against transformers, one server each;
    one failing is its row, the next still runs."""
    names = section(r, "d families", steps.family_names) or []
    for name in names:
        section(r, "d families", lambda: steps.family_run(name))


def serve_big(r: Report, steps, big, expected, streams: list, label: str,
              memory: bool = True) -> None:
    """One 8B server: against the reference, the benches, the memory check;
    stopped (and killed if it will not stop) whatever fails."""
    try:
        if expected is not None:
            section(r, steps.big_section, lambda: steps.against_reference(big, expected))
        for n in streams:
            section(r, "b bench", lambda: steps.bench(big, n, label))
        if memory:
            section(r, "c memory", lambda: steps.memory(big))
    finally:
        section(r, steps.big_section, lambda: steps.stop(big))
