"""What the sweep runner has in flight: a cell (``_Cell``: one trial's R seed runs) and each of its runs
(``_Flight``), and the signal that stops a pruned run trained in this process (``_StopRun``).
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
    """One run of a cell (one run seed)."""

    config: RunConfig
    run_dir: Path
    cell: Any = None  # the _Cell it belongs to
    metrics_size: int = -1
    curve: list = field(default_factory=list)  # the objective's curve as last read
    launched: bool = False
    ended: str | None = None  # "done" | "failed" once it ended
    error: str | None = None
    relaunches: int = 0
    job_id: str | None = None

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @property
    def seed(self) -> int:
        return int(self.config.seed)

    @property
    def store(self) -> RunStore:
        return RunStore(self.run_dir, self.run_id)


@dataclass
class _Cell:
    """One combination of the swept values: its R seed runs and the trial(s) they answer (trials that ask
    the same values share the cell; the first decides pruning)."""

    flights: list[_Flight]
    trials: list[Any]  # optuna.Trial
    label: str
    reported: dict[int, set[int]] = field(default_factory=dict)  # trial number -> steps reported
    stopping: bool = False  # pruned
    pruned_at: int | None = None

    def __post_init__(self) -> None:
        for flight in self.flights:
            flight.cell = self
        for trial in self.trials:
            self.reported.setdefault(trial.number, set())

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(f.run_id for f in self.flights)

    @property
    def numbers(self) -> str:
        return ", ".join(str(t.number) for t in self.trials)

    def add_trial(self, trial, reported: set[int] | None = None) -> None:
        self.trials.append(trial)
        self.reported[trial.number] = set(reported or ())

    @property
    def ended(self) -> bool:
        return all(f.ended for f in self.flights)
