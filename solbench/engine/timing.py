"""Phase timing owned by the harness.

Methods never time anything: they name the phase their work belongs to (``engine.phase("select")``)
and the harness measures it. Every measured span becomes one row of the run's timings table:
(step, phase, precision, seconds, n_images, flops, load). On CUDA the clock synchronises the device before
reading, so asynchronous kernels are charged to the phase that launched them. ``load`` is how many of this
process's cores other programs kept busy during the span, on average (their busy time on those cores from
/proc/stat, minus this process's own CPU time, over the span's wall time; None where /proc/stat is not
readable): the report flags timings measured under contention.

Phase names used across solbench: explore, select, regenerate, rollout, reward, train, sync, eval, and
compile: the time compiled forwards spent compiling (solbench.models.compile.compile_seconds) is taken out of
the phase it happened in and recorded after it as a "compile" row of its own.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from solbench.models.compile import compile_seconds
from solbench.machine.threads import cpu_times

PHASES = ("explore", "select", "regenerate", "rollout", "reward", "train", "sync", "eval", "compile")


@dataclass
class PhaseRecord:
    step: int
    phase: str
    precision: str
    seconds: float
    n_images: int = 0
    flops: float | None = None
    load: float | None = None  # other programs' busy cores on this process's cores during the span

    def row(self) -> dict:
        return asdict(self)


def _sync_devices() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _busy_seconds(cores) -> float | None:
    """Busy seconds of ``cores`` since boot (every process), or None where /proc/stat is not readable."""
    try:
        ticks = cpu_times(cores)
    except (OSError, ValueError, IndexError):
        return None
    if not ticks:
        return None
    return sum(total - idle for total, idle in ticks.values()) / os.sysconf("SC_CLK_TCK")


class PhaseTimer:
    """Collects PhaseRecords for the current step; the trainer drains them into the results store."""

    def __init__(self) -> None:
        self.step = 0
        self.records: list[PhaseRecord] = []
        self._open: list[PhaseRecord] = []
        self._compile_claimed = compile_seconds()  # compilation already recorded (or before this timer)
        try:
            self._cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cores = list(range(os.cpu_count() or 1))

    @contextmanager
    def phase(self, name: str, *, precision: str = "", n_images: int = 0, flops: float | None = None):
        """Time the enclosed block as ``name``. Nested phases are timed separately (inclusive)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
        record = PhaseRecord(self.step, name, precision, 0.0, n_images, flops)
        self._open.append(record)
        _sync_devices()
        busy, own = _busy_seconds(self._cores), time.process_time()
        compiling = compile_seconds()
        start = time.perf_counter()
        try:
            yield record  # the block may fill in n_images/flops once it knows them
        finally:
            _sync_devices()
            record.seconds = time.perf_counter() - start
            busy_end = _busy_seconds(self._cores)
            if busy is not None and busy_end is not None and record.seconds > 0:
                others = (busy_end - busy) - (time.process_time() - own)
                record.load = max(0.0, others / record.seconds)
            record.seconds -= compile_seconds() - compiling  # compilation is timed as phase "compile"
            self._open.pop()
            self.records.append(record)
            self._record_compilation(precision)

    def _record_compilation(self, precision: str) -> None:
        """A "compile" row for compilation no phase has recorded yet (the innermost phase claims it)."""
        spent = compile_seconds() - self._compile_claimed
        if spent > 0:
            self._compile_claimed += spent
            self.records.append(PhaseRecord(self.step, "compile", precision, spent))

    def add_flops(self, flops: float) -> None:
        """Count ``flops`` toward the innermost open phase (with no phase open they count nowhere)."""
        if self._open:
            record = self._open[-1]
            record.flops = (record.flops or 0.0) + flops

    def drain(self) -> list[PhaseRecord]:
        records, self.records = self.records, []
        return records
