"""What a sweep trial scores: ``Objective``, from a spec's ``sweep.objective``.

Objectives (``sweep.objective.kind``), computed from the run's curve of ``metric`` on ``split``
(rows by training step, with their cumulative training ``wall_s``):

- ``final_reward``: the value at the last evaluated step (maximised);
- ``reward_at_budget``: the curve linearly interpolated at ``wall_s = budget_s``; a run whose
  training ended before the budget keeps its final value (maximised);
- ``time_to_target``: ``wall_s`` of the first evaluation reaching ``target``, ``inf`` if none did
  (minimised). Its intermediate value is the gap ``target - reward`` (lower is better).
- ``reward_and_time``: two objectives, the final value (maximised) and the run's seconds per training iteration
  (minimised): with ``clock: projected`` (the default) its PROJECTED GPU seconds on ``hardware`` at ``mfu``
  (solbench/sweep/pareto.py), with ``clock: measured`` its MEASURED seconds on its own training clock
  (solbench/report/sweep_cell.py ``measured_iteration_seconds``): a multi-objective study whose Pareto front the report
  draws. Not pruned.

``reward_at_budget``'s budget is on the measured clock too (each run's cumulative training ``wall_s``). A trial is a
cell of ``sweep.seeds_per_cell`` runs: every value here is one run's, and the trial's is the mean over its seeds
(solbench/report/sweep_cell.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from solbench.config import RunConfig
from solbench.errors import ConfigError
from solbench.report.sweep_curve import (CurvePoint, ObjectiveError, final_reward, metric_curve, reward_at_budget,
                                         time_to_target)
from solbench.sweep.pareto import DIRECTIONS, KIND, reward_and_time

KINDS = ("final_reward", "reward_at_budget", "time_to_target", "reward_and_time")


@dataclass(frozen=True)
class Objective:
    """What a trial scores (see the module docstring), from a spec's ``sweep.objective``."""

    kind: str = "final_reward"
    metric: str = "shapes_geneval"
    split: str = "eval"
    budget_s: float | None = None
    target: float | None = None
    hardware: str = "B200"  # reward_and_time: the projected clock's hardware profile and utilisation
    mfu: float = 0.4
    clock: str = "projected"  # reward_and_time's time axis: projected | measured

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"sweep.objective.kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.clock not in ("projected", "measured"):
            raise ConfigError(f"sweep.objective.clock: {self.clock!r} is not projected or measured")
        if self.kind == "reward_at_budget" and not (self.budget_s and self.budget_s > 0):
            raise ConfigError("sweep.objective: kind reward_at_budget needs budget_s (seconds of training, > 0)")
        if self.kind == "time_to_target" and self.target is None:
            raise ConfigError("sweep.objective: kind time_to_target needs target (the reward to reach)")

    @classmethod
    def from_model(cls, model: Any, where: str = "") -> "Objective":
        try:
            return cls(kind=model.kind, metric=model.metric, split=model.split, budget_s=model.budget_s,
                       target=model.target, hardware=model.hardware, mfu=model.mfu,
                       clock=getattr(model, "clock", "projected"))
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}" if where else str(err)) from None

    @property
    def direction(self) -> str:
        return "minimize" if self.kind == "time_to_target" else "maximize"

    @property
    def multi(self) -> bool:
        """Two objectives (reward_and_time): no single value, no pruning."""
        return self.kind == KIND

    @property
    def directions(self) -> list[str]:
        return list(DIRECTIONS) if self.multi else [self.direction]

    def values(self, rows: Iterable[Mapping[str, Any]], timing_rows: Iterable[Mapping[str, Any]] = (),
               config: RunConfig | None = None) -> list[float]:
        """The objective values of a finished run (one, or [reward, projected s/iteration] when ``multi``)."""
        if not self.multi:
            return [self.value(rows)]
        if self.clock == "measured":
            from solbench.report.sweep_cell import measured_iteration_seconds

            rows = list(rows)
            seconds = measured_iteration_seconds(rows)
            if not seconds == seconds:  # NaN
                raise ObjectiveError("the run has no timed training iterations (train rows with wall_s)")
            curve = self.curve(rows)
            if not curve:
                raise ObjectiveError(f"the run has no {self.split} rows of metric {self.metric!r}")
            return [final_reward(curve), seconds]
        return reward_and_time(self, rows, timing_rows, config)

    def metric_problem(self, config: RunConfig) -> str | None:
        """Why a run of ``config`` has no rows of the objective's metric (an eval metric is an eval reward, or
        ``<reward>/<skill>``), else None."""
        if self.split == "eval" and self.metric.split("/")[0] not in config.eval.rewards:
            return (f"{self.metric!r} is not an eval reward of the runs (eval.rewards: "
                    f"{', '.join(config.eval.rewards)})")
        return None

    def curve(self, rows: Iterable[Mapping[str, Any]]) -> list[CurvePoint]:
        return metric_curve(rows, self.metric, self.split)

    def value(self, rows: Iterable[Mapping[str, Any]]) -> float:
        """The objective of a finished run from its metrics rows; ObjectiveError if it has none."""
        curve = self.curve(rows)
        if not curve:
            raise ObjectiveError(f"the run has no {self.split} rows of metric {self.metric!r}")
        if self.kind == "final_reward":
            return final_reward(curve)
        if self.kind == "reward_at_budget":
            return reward_at_budget(curve, float(self.budget_s))
        return time_to_target(curve, float(self.target))

    def intermediate(self, point: CurvePoint) -> float:
        """The value reported to the pruner for one evaluation (same direction as the objective)."""
        if self.kind == "time_to_target":
            return float(self.target) - point.value
        return point.value

    def describe(self) -> str:
        name = f"{self.split}/{self.metric}"
        if self.kind == "reward_at_budget":
            return f"{name} at {self.budget_s:g} s of MEASURED training time (each run's own clock; maximize)"
        if self.kind == "time_to_target":
            return f"training seconds until {name} >= {self.target:g} (minimize)"
        if self.multi and self.clock == "measured":
            return (f"final {name} (maximize) and MEASURED training seconds per iteration (each cell's own runs' "
                    "clock; minimize): Pareto front")
        if self.multi:
            return (f"final {name} (maximize) and PROJECTED {self.hardware} seconds per iteration at {self.mfu:.0%} "
                    "(minimize): Pareto front")
        return f"final {name} (maximize)"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.multi:  # studies recorded before reward_and_time existed keep matching their objective
            data.pop("hardware")
            data.pop("mfu")
        if self.clock == "projected":  # studies recorded before the measured clock existed keep matching
            data.pop("clock")
        return data
