"""Phase timing owned by the harness.

Methods never time anything: they name the phase their work belongs to (``engine.phase("select")``)
and the harness measures it. Every measured span becomes one row of the run's timings table:
(step, phase, precision, seconds, n_images, flops). On CUDA the clock synchronises the device before
reading, so asynchronous kernels are charged to the phase that launched them.

Phase names used across solbench: explore, select, regenerate, rollout, reward, train, sync, eval.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

PHASES = ("explore", "select", "regenerate", "rollout", "reward", "train", "sync", "eval")


@dataclass
class PhaseRecord:
    step: int
    phase: str
    precision: str
    seconds: float
    n_images: int = 0
    flops: float | None = None

    def row(self) -> dict:
        return asdict(self)


def _sync_devices() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class PhaseTimer:
    """Collects PhaseRecords for the current step; the trainer drains them into the results store."""

    def __init__(self) -> None:
        self.step = 0
        self.records: list[PhaseRecord] = []
        self._open: list[PhaseRecord] = []

    @contextmanager
    def phase(self, name: str, *, precision: str = "", n_images: int = 0, flops: float | None = None):
        """Time the enclosed block as ``name``. Nested phases are timed separately (inclusive)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
        record = PhaseRecord(self.step, name, precision, 0.0, n_images, flops)
        self._open.append(record)
        _sync_devices()
        start = time.perf_counter()
        try:
            yield record  # the block may fill in n_images/flops once it knows them
        finally:
            _sync_devices()
            record.seconds = time.perf_counter() - start
            self._open.pop()
            self.records.append(record)

    def add_flops(self, flops: float) -> None:
        """Count ``flops`` toward the innermost open phase (with no phase open they count nowhere)."""
        if self._open:
            record = self._open[-1]
            record.flops = (record.flops or 0.0) + flops

    def drain(self) -> list[PhaseRecord]:
        records, self.records = self.records, []
        return records
