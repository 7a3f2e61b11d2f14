"""How many CPU threads llama.cpp gets on this machine when the profile does not say.

Measured on the 2-core development machine (bench/engine_threads.py, SmolLM2-135M, 2026-12-01):
with another process holding one core, `-t 2` decoded at 0.35x of `-t 1`'s speed with
llama.cpp's OpenMP build and 0.22x with ggml's own thread pool (GGML_OPENMP=OFF); on the Intel
VMs of the field notes it fell 30-100x. Every thread waits for the slowest at each barrier, so
a thread that shares its core with another process stalls them all. `-t 1` kept its speed
(1.0-1.1x). Quiet, `-t 2` gained only 4-18 % over `-t 1`. So the default leaves one core for
everything else (the Prefect worker, the flow itself, the graph) and never counts a core that
is busy now: a core taken later still costs at most that core's share, not a collapse.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset
    narrows), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """(idle, total) jiffies per CPU in `cpus`, from /proc/stat (proc(5): idle + iowait are
    idle; the guest fields are already counted in user and nice)."""
    out: dict[int, tuple[int, int]] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        cpu = int(name[3:])
        if cpu in cpus:
            v = [int(x) for x in fields[:8]]
            out[cpu] = (v[3] + v[4], sum(v))
    return out


def idle_cores(sample_seconds: float = 0.25) -> float:
    """How many of the usable cores were idle over the last `sample_seconds` (1.0 = one whole
    core). The machine's count when /proc/stat cannot be read (not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
        before = _cpu_times(cpus)
        time.sleep(sample_seconds)
        after = _cpu_times(cpus)
    except (AttributeError, OSError, ValueError):
        return float(usable_cores())
    idle = 0.0
    for cpu, (i1, t1) in after.items():
        i0, t0 = before.get(cpu, (i1, t1))
        idle += (i1 - i0) / (t1 - t0) if t1 > t0 else 1.0
    return idle


def auto_threads(cores: int | None = None, idle: float | None = None) -> int:
    """The default: one core left for the rest of the pipeline, and no core that is busy now —
    at least 1. On 2 cores that is 1; on the g2-standard-4 (4 vCPUs), 3 when quiet."""
    cores = usable_cores() if cores is None else cores
    idle = idle_cores() if idle is None else idle
    return max(1, min(cores - 1, int(idle + 0.25)))
