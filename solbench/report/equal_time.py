"""Paired comparisons at equal (PROJECTED) GPU time: the paper's Table 1 compares methods at equal GPU-hours.

Two runs of the same seed (same eval prompts and eval noise) are compared at the clock budget both reached:
B = the smaller of their clocks at their last evaluation. Each run's per-sample eval scores (split
``eval_sample``) are read at B, linearly interpolated between the two evaluations whose clock values
bracket B (a run that reaches B exactly at an evaluation uses it as it is). The per-prompt differences of
the seeds then go through the same crossed-design interval as every paired comparison
(``stats.crossed_interval``). The clock is the PROJECTED GPU clock (solbench/report/clock.py): the
measured one of CPU runs, where FP4 is emulated, cannot speak to GPU time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.clock import clock_at
from solbench.report.paired import Paired, sample_rows, seed_runs
from solbench.report.stats import paired_ci
from solbench.report.tables import Tables


def _eval_clock(tables: Tables, run_id: str, metric: str) -> pd.Series:
    """Projected clock (s) at each evaluation step of one run, by step."""
    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "eval") & (m["metric"] == metric)][["run_id", "step"]]
    rows = rows.drop_duplicates("step").sort_values("step")
    if rows.empty:
        return pd.Series(dtype=float)
    return pd.Series(clock_at(tables, rows).to_numpy(float), index=rows["step"].astype(int).to_numpy())


def scores_at(samples: pd.DataFrame, run_id: str, clock: pd.Series, budget: float) -> pd.Series:
    """Per (prompt_id, eval_seed): the run's eval score at clock ``budget``, linear between evaluations."""
    clock = clock.dropna()
    if clock.empty or budget > clock.iloc[-1] + 1e-12 * max(1.0, abs(budget)):
        return pd.Series(dtype=float)
    after = int(np.searchsorted(clock.to_numpy(), budget, side="left"))
    s = samples[samples["run_id"] == run_id]
    hi_step = int(clock.index[after])
    hi = s[s["step"] == hi_step].groupby(["prompt_id", "eval_seed"])["value"].mean()
    if after == 0 or np.isclose(clock.iloc[after], budget, rtol=1e-12, atol=0.0):
        return hi
    lo_step = int(clock.index[after - 1])
    lo = s[s["step"] == lo_step].groupby(["prompt_id", "eval_seed"])["value"].mean()
    w = (budget - clock.iloc[after - 1]) / (clock.iloc[after] - clock.iloc[after - 1])
    both = pd.concat([lo.rename("lo"), hi.rename("hi")], axis=1, join="inner")
    return both["lo"] + w * (both["hi"] - both["lo"])


def paired_equal_time(tables: Tables, model: str, metric: str, arm: str, base_arm: str) -> tuple[Paired, list] | None:
    """arm - base_arm at the projected clock both runs of each seed pair reached; (Paired, per-seed budgets)."""
    a_runs, b_runs = seed_runs(tables, model, arm), seed_runs(tables, model, base_arm)
    samples = sample_rows(tables, metric)
    if samples.empty:
        return None
    rows, seeds, budgets, a_vals, b_vals = [], [], [], [], []
    for seed in sorted(set(a_runs) & set(b_runs), key=lambda s: (str(type(s)), s)):
        ca, cb = _eval_clock(tables, a_runs[seed], metric), _eval_clock(tables, b_runs[seed], metric)
        if ca.dropna().empty or cb.dropna().empty:
            continue
        budget = float(min(ca.dropna().iloc[-1], cb.dropna().iloc[-1]))
        sa, sb = scores_at(samples, a_runs[seed], ca, budget), scores_at(samples, b_runs[seed], cb, budget)
        both = pd.concat([sa.rename("a"), sb.rename("b")], axis=1, join="inner")
        if both.empty:
            continue
        rows.append((both["a"] - both["b"]).groupby(level="prompt_id").mean())
        seeds.append(seed)
        budgets.append(budget)
        a_vals.append(float(both["a"].mean()))
        b_vals.append(float(both["b"].mean()))
    if not rows:
        return None
    matrix = pd.concat(rows, axis=1, join="inner").T.to_numpy(float)
    ci = paired_ci(matrix, level=tables.options.ci_level)
    return Paired(ci, None, float(np.mean(a_vals)), float(np.mean(b_vals)), seeds), budgets
