"""Shared pieces of the benchmark scripts: background load and paired, interleaved timing.

``busy_load()`` starts one busy-loop process per core (what a Slurm neighbour, a build or a
browser does to a shared node) and stops them on exit, so a script can print a "loaded" column
beside its "quiet" one. ``paired()`` times candidates round-robin (each round runs every candidate
once, so drifting load hits them alike) and reports min and median per candidate.

"Quiet" is only as quiet as the machine: on a shared host other jobs run too (the load average is
printed with every table).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional


@contextlib.contextmanager
def busy_load(processes: Optional[int] = None) -> Iterator[List[subprocess.Popen]]:
    """Keep ``processes`` (default: one per usable core) busy-loop processes running inside the block.

    Plain `python -c "while True: pass"` children: nothing to import or pickle, stopped (killed and
    reaped) on exit even when the block raises.
    """
    n = processes if processes is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    workers = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(0.5)  # let them reach the scheduler
    try:
        yield workers
    finally:
        for w in workers:
            w.kill()
        for w in workers:
            w.wait(timeout=10)


@contextlib.contextmanager
def maybe_loaded(loaded: bool) -> Iterator[None]:
    if loaded:
        with busy_load():
            yield
    else:
        yield


@dataclass
class Timing:
    times: List[float]

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def paired(candidates: Dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> Dict[str, Timing]:
    """Seconds per candidate over ``repeats`` rounds; every round runs each candidate once, in turn."""
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: Timing(ts) for name, ts in times.items()}


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def cpu_line() -> str:
    import platform

    import torch

    try:
        from solbench.machine.cpu import cpu_model, native_bf16_flags

        model, bf16 = cpu_model(), ",".join(native_bf16_flags()) or "none"
    except Exception:
        model, bf16 = platform.processor() or platform.machine(), "?"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"CPU: {model}, {cores} cores usable, native bf16: {bf16}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; load average {load_average():.1f}")


def gemm_gflops(n: int = 1024, repeats: int = 3) -> float:
    """Best fp32 GEMM rate of an n x n x n matmul right now (GFLOP/s)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9
