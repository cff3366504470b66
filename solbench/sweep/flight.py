"""A run in flight for a sweep's trials: the runner's record of it (``_Flight``), and the signal that stops
a pruned one trained in this process (``_StopRun``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.config import RunConfig
from solbench.results import RunStore


class _StopRun(BaseException):
    """Raised from the progress listener to stop a pruned in-process run.

    A BaseException so that execute_run does not record it as a crash; the sweep records the prune.
    """


@dataclass
class _Flight:
    """A run being trained for one or more trials (trials with the same params share their run)."""

    config: RunConfig
    run_dir: Path
    trials: list[Any]  # optuna.Trial, the first decides pruning
    reported: dict[int, set[int]] = field(default_factory=dict)  # trial number -> steps reported
    metrics_size: int = -1
    launched: bool = False
    relaunches: int = 0
    job_id: str | None = None
    stopping: bool = False  # pruned; waiting for the job to be gone to record it
    pruned_at: int | None = None

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @property
    def store(self) -> RunStore:
        return RunStore(self.run_dir, self.run_id)
