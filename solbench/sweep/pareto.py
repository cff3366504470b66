"""The paper's trade-off as a sweep objective: reward against PROJECTED GPU time per iteration.

``sweep.objective.kind: reward_and_time`` makes the study multi-objective (Optuna ``directions``
[maximize, minimize]): a trial's values are

1. the run's final value of ``metric`` (as ``final_reward``), and
2. its PROJECTED GPU seconds per training iteration: the median over its training iterations of the
   counted FLOPs of every phase at the rate of the precision each FLOP ran at, on one GPU of the objective's
   ``hardware`` at utilisation ``mfu`` (solbench/report/clock.py ``projected_seconds``, with the share of an
   explore forward the run's recipe quantizes from ``solbench.models.shares``). A projection, not a
   measurement: on CPU the measured clock says nothing about FP4 hardware.

Optuna keeps the Pareto front (``study.best_trials``); ``solbench sweep`` exports it as the ``pareto``
column of sweep/trials.parquet and the report draws it (solbench/report/sweep_cells.py). Multi-objective
studies are not pruned (Optuna's pruners take one value).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from solbench.errors import SolbenchError
from solbench.report.sweep_curve import ObjectiveError, final_reward

KIND = "reward_and_time"
DIRECTIONS = ("maximize", "minimize")


def projected_iteration_seconds(timing_rows: Iterable[Mapping[str, Any]], config, *, hardware: str = "B200",
                                mfu: float = 0.4) -> float:
    """Median over training iterations of a run's PROJECTED GPU seconds (see the module docstring)."""
    from solbench.models.shares import precision_split, run_text_tokens
    from solbench.report.clock import projected_seconds
    from solbench.report.hardware import get_hardware
    from solbench.report.tables import EVAL_PHASES

    hw = get_hardware(hardware)
    rows = [r for r in timing_rows if r.get("phase") not in EVAL_PHASES and r.get("flops") is not None]
    if not rows:
        raise SolbenchError("the run's timings carry no FLOP counts: no projected GPU time")
    share = 0.0
    if any(r.get("precision") == "explore" for r in rows):
        share = precision_split(config.model.name, config.quant.recipe, resolution=config.model.resolution,
                                path=config.model.path, backend="te",
                                text_tokens=run_text_tokens(config.model.name, config.model.text_max_length)
                                ).quantized_share
    per_step: dict[int, float] = {}
    for r in rows:
        seconds = float(projected_seconds(float(r["flops"]), r.get("precision") == "explore", share, hw, mfu))
        per_step[int(r["step"])] = per_step.get(int(r["step"]), 0.0) + seconds
    return float(statistics.median(per_step.values()))


def reward_and_time(objective, metric_rows: Iterable[Mapping[str, Any]], timing_rows: Iterable[Mapping[str, Any]],
                    config) -> list[float]:
    """[final value of the objective's metric, projected GPU seconds per iteration] of a finished run."""
    curve = objective.curve(metric_rows)
    if not curve:
        raise ObjectiveError(f"the run has no {objective.split} rows of metric {objective.metric!r}")
    try:
        seconds = projected_iteration_seconds(timing_rows, config, hardware=objective.hardware, mfu=objective.mfu)
    except SolbenchError as err:
        raise ObjectiveError(str(err)) from None
    return [final_reward(curve), seconds]
