"""Curve metrics of a sweep's objectives: pure functions of a run's metrics rows.

A run's curve is its ``metric`` on ``split`` by training step, with the cumulative training ``wall_s``
of each evaluation (``metric_curve``); ``final_reward``, ``reward_at_budget`` and ``time_to_target``
read one number from it (solbench/sweep/objective.py says which objective uses which), and
``ObjectiveError`` says a run's rows do not give one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from solbench.errors import SolbenchError


class ObjectiveError(SolbenchError):
    """A run's metrics do not give the objective (the metric is missing, nothing evaluated yet)."""



@dataclass(frozen=True)
class CurvePoint:
    """One evaluation of the objective's metric: training step, value and cumulative training time."""

    step: int
    value: float
    wall_s: float


def metric_curve(rows: Iterable[Mapping[str, Any]], metric: str, split: str = "eval") -> list[CurvePoint]:
    """The curve of ``metric`` on ``split`` from metrics-table rows, one point per step, by step.

    A step written twice keeps its last row; rows without a finite numeric value are skipped.
    """
    by_step: dict[int, CurvePoint] = {}
    for row in rows:
        if row.get("split") != split or row.get("metric") != metric:
            continue
        try:
            value = float(row["value"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        wall = row.get("wall_s")
        by_step[int(row["step"])] = CurvePoint(int(row["step"]), value, float(wall) if wall is not None else 0.0)
    return [by_step[step] for step in sorted(by_step)]


def final_reward(curve: Sequence[CurvePoint]) -> float:
    """The value at the last evaluated step."""
    if not curve:
        raise ObjectiveError("no evaluation rows")
    return curve[-1].value


def reward_at_budget(curve: Sequence[CurvePoint], budget_s: float) -> float:
    """The curve linearly interpolated at ``wall_s = budget_s``.

    Before the first evaluation the first value holds; after the last one (training ended before
    the budget) the last value holds.
    """
    if not curve:
        raise ObjectiveError("no evaluation rows")
    if budget_s <= curve[0].wall_s:
        return curve[0].value
    for before, after in zip(curve, curve[1:]):
        if before.wall_s <= budget_s <= after.wall_s:
            span = after.wall_s - before.wall_s
            if span <= 0:
                return after.value
            return before.value + (budget_s - before.wall_s) / span * (after.value - before.value)
    return curve[-1].value


def time_to_target(curve: Sequence[CurvePoint], target: float) -> float:
    """``wall_s`` of the first evaluation whose value reaches ``target``; ``inf`` when none does."""
    if not curve:
        raise ObjectiveError("no evaluation rows")
    for point in curve:
        if point.value >= target:
            return point.wall_s
    return math.inf
