"""(c) The server's plan against the memory the device reports in use by
the server (nvidia-smi; the process's RSS in a --cpu dry run), during and
after the bench, and the KV pool back to no reserved block."""

import os
import re
import subprocess
import threading
import time

from report import Report

MIB = 1 << 20
# In use after the bench within [LOW, HIGH] x the plan's total: the KV pool
# is allocated and touched at start, so the plan is in use from then on, and
# the runtime must stay inside it.
LOW, HIGH = 0.8, 1.05


def _smi(query: str) -> list:
    out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def device_used(cpu: bool) -> int:
    """Bytes in use on GPU 0 now (0 in a dry run)."""
    return 0 if cpu else int(_smi("gpu=memory.used")[0][0]) * MIB


def machine(cpu: bool) -> str:
    """The device as nvidia-smi names it (the CPU count in a dry run)."""
    if cpu:
        return f"CPU only (dry run), {os.cpu_count()} cores"
    rows = _smi("gpu=name,driver_version,memory.total,memory.used")
    return "; ".join(f"{n}, driver {d}, {t} MiB ({u} MiB in use)" for n, d, t, u in rows)


def driver_cuda() -> str:
    """The driver's version and the CUDA version it supports (nvidia-smi's
    header): PTX from a newer NVRTC than this is refused."""
    out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"Driver Version: (\S+).*CUDA Version: (\S+)", out)
    return f"driver {m.group(1)}, CUDA {m.group(2)}" if m else "nvidia-smi printed no CUDA version"


def process_used(pid: int, cpu: bool, before: int) -> tuple:
    """(bytes, how measured) the process `pid` holds on the device: its own
    row of nvidia-smi, else (a sandbox may hide its pid) the GPU's use less
    what was in use before it started."""
    if cpu:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024, "VmRSS"
        raise RuntimeError(f"no VmRSS for {pid}")
    for row in _smi("compute-apps=pid,used_memory"):
        if row[0] == str(pid) and row[1].isdigit():
            return int(row[1]) * MIB, "nvidia-smi, its pid"
    return device_used(cpu) - before, "nvidia-smi, GPU use less before start"


class Peak:
    """Samples the process's use on a thread until stopped; keeps the largest."""

    def __init__(self, pid: int, cpu: bool, before: int):
        self.args, self.peak, self.how = (pid, cpu, before), 0, ""
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                used, self.how = process_used(*self.args)
                self.peak = max(self.peak, used)
            except Exception:  # noqa: BLE001 - a missed sample is no figure
                pass
            self.stopped.wait(0.5)

    def stop(self) -> int:
        self.stopped.set()
        self.thread.join(timeout=30)
        return self.peak


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def plan_rows(r: Report, s, plan: dict, metrics: dict) -> int:
    """The plan as logged and as exported; returns its total bytes."""
    if "total_bytes" not in plan:
        raise RuntimeError(f"no `KV pool planned ... total_bytes=` line: {s.log_tail()}")
    total = int(plan["total_bytes"])
    r.add("c memory", "plan (log)",
          f"total {gib(total)} = weights {gib(int(plan['weight_bytes']))} + KV "
          f"{gib(int(plan['kv_bytes']))} ({plan['kv_blocks']} blocks of {plan['block_size']}, "
          f"{plan['kv_dtype']}) + activations {gib(int(plan['activation_bytes']))} + overhead "
          f"{gib(int(plan['overhead_bytes']))}; of {gib(int(plan['memory_bytes']))} "
          f"({plan['memory_source']})")
    profiled = s.log_fields("activation reserve profiled")
    if profiled:
        r.add("c memory", "activation reserve (profile run)",
              f"measured {gib(int(profiled['measured']))}, estimated "
              f"{gib(int(profiled['estimated']))}; the plan uses the measured figure")
    gauges = {k: v for k, v in metrics.items() if k.startswith("ferrox_plan_")}
    r.add("c memory", "ferrox_plan_* gauges",
          ", ".join(f"{k}={v:.0f}" for k, v in sorted(gauges.items())) or "none")
    weights = gauges.get("ferrox_plan_weight_bytes")
    r.check("c memory", "gauges agree with the log",
            f"weight bytes {weights} vs {plan['weight_bytes']}",
            weights is not None and int(weights) == int(plan["weight_bytes"]))
    return total


def check(r: Report, s, before: int, cpu: bool, peak: Peak | None) -> None:
    metrics = s.metrics()
    total = plan_rows(r, s, s.plan_line(), metrics)
    used, how = process_used(s.proc.pid, cpu, before)
    top = max(peak.stop() if peak else 0, used)
    r.check("c memory", f"in use after the bench ({how}) / plan",
            f"{gib(used)} / {gib(total)} = {used / total:.3f}; peak while benching "
            f"{gib(top)} = {top / total:.3f} (allowed {LOW}..{HIGH})",
            LOW * total <= used and top <= HIGH * total)
    r.check("c memory", "server alive after the bench (no OOM at the planned size)",
            "running" if s.alive() else f"exited {s.proc.returncode}", s.alive())
    deadline = time.monotonic() + 10
    while True:
        m = s.metrics()
        left = {k: m.get(k) for k in ("ferrox_kv_blocks_used", "ferrox_kv_blocks_pinned")}
        if all(v == 0 for v in left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    r.check("c memory", "KV blocks reserved after the bench",
            ", ".join(f"{k}={v}" for k, v in left.items()), all(v == 0 for v in left.values()))
