"""A sweep cell's numbers from its R seed runs: the seeds it trains, the mean curve the pruner sees, the measured
seconds per iteration, and the cell's interval (run seeds crossed with eval prompts).

A trial of a sweep is one cell, one combination of the swept values, trained with ``sweep.seeds_per_cell`` run
seeds (the matrix's ``seed`` and the next R - 1). Its value is the mean of the seeds' values; what the pruner is told
at a training step is the mean of the seeds' intermediate values at that step, reported only once every seed has
evaluated it (never one seed's value). The cell's interval is the findings' crossed interval
(solbench/report/stats.py ``crossed_interval``) of the [seeds, eval prompts] matrix of per-prompt means (over the eval
seeds) at each run's last evaluation; runs without per-prompt rows (``eval_sample``) get a t interval over the seed
values, which says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from solbench.errors import ConfigError
from solbench.report.sweep_curve import CurvePoint

SAMPLE_SPLIT = "eval_sample"
CLOCK = "measured: each run's own training clock (wall_s of its train rows, evaluation excluded)"


def cell_seeds(assignment: Mapping[str, Any], seeds_per_cell: int) -> list[int]:
    """The run seeds of a cell: the assignment's ``seed`` (default 0) and the next ``seeds_per_cell`` - 1."""
    base = int(assignment.get("seed", 0) or 0)
    return [base + i for i in range(seeds_per_cell)]


def check_seed_axis(names: Sequence[str], seeds_per_cell: int, where: str) -> None:
    if "seed" in names and seeds_per_cell > 1:
        raise ConfigError(f"{where}: seed is swept (sweep.params.seed) and every cell also runs seeds_per_cell="
                          f"{seeds_per_cell} seeds; sweep the seed with seeds_per_cell: 1, or fix it in the matrix")


def mean_curve(curves: Sequence[Sequence[CurvePoint]]) -> list[CurvePoint]:
    """The points at the steps every curve has: mean value and mean wall_s over the curves."""
    if not curves:
        return []
    by_seed = [{p.step: p for p in curve} for curve in curves]
    common = sorted(set.intersection(*(set(points) for points in by_seed)))
    return [CurvePoint(step, statistics.fmean(points[step].value for points in by_seed),
                       statistics.fmean(points[step].wall_s for points in by_seed)) for step in common]


def measured_iteration_seconds(rows: Iterable[Mapping[str, Any]]) -> float:
    """Median over training iterations of a run's measured seconds per iteration: the increments of the
    cumulative training ``wall_s`` of its train rows (evaluation and the untimed explore-gap measurement are
    outside it); NaN when the run has fewer than one timed iteration."""
    wall: dict[int, float] = {0: 0.0}
    for row in rows:
        if row.get("split") != "train" or row.get("wall_s") is None:
            continue
        step = int(row["step"])
        wall[step] = max(wall.get(step, 0.0), float(row["wall_s"]))
    steps = sorted(wall)
    increments = [(wall[b] - wall[a]) / (b - a) for a, b in zip(steps, steps[1:]) if b > a]
    return float(statistics.median(increments)) if increments else math.nan


def prompt_means(rows: Iterable[Mapping[str, Any]], metric: str) -> dict[str, float]:
    """Per eval prompt, the mean over its eval seeds of ``metric`` at the run's last evaluated step."""
    samples = [r for r in rows if r.get("split") == SAMPLE_SPLIT and r.get("metric") == metric]
    if not samples:
        return {}
    last = max(int(r["step"]) for r in samples)
    values: dict[str, list[float]] = {}
    for r in samples:
        if int(r["step"]) == last:
            values.setdefault(str(r["prompt_id"]), []).append(float(r["value"]))
    return {pid: statistics.fmean(v) for pid, v in values.items()}


def cell_interval(per_run_rows: Sequence[Sequence[Mapping[str, Any]]], metric: str, seed_values: Sequence[float],
                  level: float = 0.95) -> tuple[float, float, str]:
    """(lo, hi, what it covers) of a cell's mean, from its runs' metrics rows (see the module docstring)."""
    import numpy as np

    from solbench.report.stats import crossed_interval

    means = [prompt_means(rows, metric) for rows in per_run_rows]
    common = sorted(set.intersection(*(set(m) for m in means))) if means and all(means) else []
    if common:
        matrix = np.array([[m[pid] for pid in common] for m in means], dtype=float)
        _, lo, hi, _ = crossed_interval(matrix, level)
        covers = (f"{len(means)} run seeds x {len(common)} eval prompts" if len(means) > 1 else
                  f"eval prompts only ({len(common)} prompts, one run seed)")
        return float(lo), float(hi), covers
    _, lo, hi, _ = crossed_interval(np.asarray(seed_values, dtype=float)[:, None], level)
    return float(lo), float(hi), f"{len(seed_values)} run seed values (no per-prompt eval rows)"
