"""Paired comparisons of eval rewards: one arm against a baseline arm on the same eval prompts and seeds.

Runs of the same run seed share their eval noise (the trainer draws it from the run seed and the eval
prompt), so a run of arm A and the run of the baseline B with the same seed generated their eval images
from the same initial noise for the same prompts. The paired difference of one such pair, at one
evaluation step, is (per eval prompt) the mean over eval seeds of score_A - score_B; the trainer stores
those per-sample scores as metrics rows with split ``eval_sample`` (columns prompt_id, eval_seed).

The design is run seeds crossed with the same eval prompts (every run evaluates the same prompts), so
the differences form a matrix [run seeds, eval prompts] and the interval is ``stats.crossed_interval``:
seeds and prompts both random, a t interval with Satterthwaite's degrees of freedom, whose coverage
tests/test_report_intervals.py shows by simulation. With fewer than three run seeds the seed-to-seed
variance is not estimated and the interval covers the eval prompts only (``PairedCI.covers`` says so).
Results collected before the trainer stored per-sample rows fall back to the per-run eval means: one
difference per seed, a t interval over seeds (none with one seed). ``Paired.per_seed_frame`` gives
each run seed's own mean difference for the CSVs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from solbench.report.stats import PairedCI, paired_ci
from solbench.report.tables import Tables

SAMPLE_SPLIT = "eval_sample"


@dataclass
class Paired:
    """A paired difference arm - baseline and what it was computed from."""

    ci: PairedCI
    step: int | None  # the evaluation step compared (the last one common to each pair; the largest if they differ)
    arm_mean: float  # the arm's mean score over the same pairs
    base_mean: float
    seeds: list
    steps: tuple = ()  # per seed: (step of the arm, step of the baseline) compared

    @property
    def relative(self) -> float:
        """The difference as a fraction of the baseline's mean score."""
        return self.ci.mean / abs(self.base_mean) if self.base_mean else float("nan")

    def per_seed_frame(self, **labels) -> pd.DataFrame:
        """One row per run seed: its mean paired difference and the steps compared (for the CSVs)."""
        rows = []
        for i, seed in enumerate(self.seeds):
            if i >= len(self.ci.per_seed):
                break
            steps = self.steps[i] if i < len(self.steps) else (self.step, self.step)
            rows.append(dict(labels, seed=seed, difference=self.ci.per_seed[i], step=steps[0], base_step=steps[1],
                             n_prompts=self.ci.n_prompts))
        return pd.DataFrame(rows)


def sample_rows(tables: Tables, metric: str) -> pd.DataFrame:
    """Per-sample eval scores (split eval_sample) of done runs for ``metric``."""
    m = tables.metrics
    if "prompt_id" not in m:
        return pd.DataFrame(columns=["run_id", "step", "prompt_id", "eval_seed", "value"])
    rows = m[(m["split"] == SAMPLE_SPLIT) & (m["metric"] == metric) & m["run_id"].isin(tables.done_runs["run_id"])]
    cols = ["run_id", "step", "prompt_id", "value"] + (["eval_seed"] if "eval_seed" in rows else [])
    rows = rows[cols].copy()
    if "eval_seed" not in rows:
        rows["eval_seed"] = 0
    return rows


def _eval_steps(tables: Tables, run_id: str, metric: str) -> set[int]:
    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "eval") & (m["metric"] == metric)]
    return set(rows["step"].dropna().astype(int))


def _run_value(tables: Tables, run_id: str, metric: str, step: int) -> float:
    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "eval") & (m["metric"] == metric) & (m["step"] == step)]
    return float(rows["value"].mean()) if len(rows) else float("nan")


def prompt_differences(samples: pd.DataFrame, run_a: str, step_a: int, run_b: str, step_b: int) -> pd.Series:
    """Per eval prompt: mean over eval seeds of (score of run_a at step_a - score of run_b at step_b),
    matched on (prompt_id, eval_seed); empty when either side has no per-sample rows."""
    a = samples[(samples["run_id"] == run_a) & (samples["step"] == step_a)]
    b = samples[(samples["run_id"] == run_b) & (samples["step"] == step_b)]
    if a.empty or b.empty:
        return pd.Series(dtype=float)
    keys = ["prompt_id", "eval_seed"]
    pairs = a.groupby(keys)["value"].mean().rename("a").to_frame().join(
        b.groupby(keys)["value"].mean().rename("b"), how="inner")
    return (pairs["a"] - pairs["b"]).groupby(level="prompt_id").mean().sort_index()


def seed_runs(tables: Tables, model: str, arm: str) -> dict:
    """{run seed: run_id} of the done runs of one arm (the first run where a seed repeats)."""
    runs = tables.done_runs
    runs = runs[(runs["model"] == model) & (runs["arm"] == arm)].sort_values("run_id")
    out: dict = {}
    for seed, rid in zip(runs["seed"], runs["run_id"]):
        out.setdefault(seed, rid)
    return out


def _paired(tables: Tables, pairs: list, metric: str) -> Paired | None:
    """The Paired of ``pairs`` [(seed, run_a, step_a, run_b, step_b)]: differences per seed and prompt."""
    samples = sample_rows(tables, metric)
    per_seed, seeds, steps, a_vals, b_vals = [], [], [], [], []
    for seed, ra, sa, rb, sb in pairs:
        seeds.append(seed)
        steps.append((sa, sb))
        a_vals.append(_run_value(tables, ra, metric, sa))
        b_vals.append(_run_value(tables, rb, metric, sb))
        per_seed.append(prompt_differences(samples, ra, sa, rb, sb))
    if not seeds:
        return None
    per_prompt = all(not d.empty for d in per_seed)
    if per_prompt:  # crossed design: the prompts every seed has
        matrix = pd.concat(per_seed, axis=1, join="inner").T.to_numpy(float)
        per_prompt = matrix.shape[1] > 0
    if not per_prompt:  # mixing per-prompt and per-run values would weigh them unequally: per-run for all
        matrix = np.array([[a - b] for a, b in zip(a_vals, b_vals)])
    o = tables.options
    ci = paired_ci(matrix, level=o.ci_level, per_prompt=per_prompt)
    return Paired(ci, max(s for s, _ in steps), float(np.nanmean(a_vals)), float(np.nanmean(b_vals)), seeds,
                  tuple(steps))


def paired_difference(tables: Tables, model: str, metric: str, arm: str, base_arm: str,
                      step: int | None = None) -> Paired | None:
    """arm - base_arm at the last evaluation step common to each same-seed pair of runs (equal iterations),
    or at ``step`` when given (pairs without an evaluation there are left out)."""
    a_runs, b_runs = seed_runs(tables, model, arm), seed_runs(tables, model, base_arm)
    pairs = []
    for seed in sorted(set(a_runs) & set(b_runs), key=lambda s: (str(type(s)), s)):
        ra, rb = a_runs[seed], b_runs[seed]
        common = _eval_steps(tables, ra, metric) & _eval_steps(tables, rb, metric)
        if step is not None:
            common &= {step}
        if common:
            pairs.append((seed, ra, max(common), rb, max(common)))
    return _paired(tables, pairs, metric)


def paired_at_steps(tables: Tables, model: str, metric: str, arm: str, base_arm: str,
                    step_a: int, step_b: int) -> Paired | None:
    """arm at its step ``step_a`` - base_arm at its step ``step_b``, runs paired by seed (unequal iterations:
    say so where it is shown)."""
    a_runs, b_runs = seed_runs(tables, model, arm), seed_runs(tables, model, base_arm)
    pairs = [(seed, a_runs[seed], step_a, b_runs[seed], step_b)
             for seed in sorted(set(a_runs) & set(b_runs), key=lambda s: (str(type(s)), s))
             if step_a in _eval_steps(tables, a_runs[seed], metric) and step_b in _eval_steps(tables, b_runs[seed], metric)]
    return _paired(tables, pairs, metric)


def paired_steps(tables: Tables, model: str, metric: str, arm: str, step_a: int, step_b: int) -> Paired | None:
    """Within one arm: the score at step_a minus the score at step_b of the same runs (same prompts, seeds)."""
    runs = seed_runs(tables, model, arm)
    pairs = [(seed, rid, step_a, rid, step_b) for seed, rid in sorted(runs.items(), key=lambda kv: str(kv[0]))
             if {step_a, step_b} <= _eval_steps(tables, rid, metric)]
    p = _paired(tables, pairs, metric)
    if p is not None:
        p.step = step_a
    return p


#: Marks an interval that covers the eval prompts only (fewer than three run seeds: the seed-to-seed variance not
#: estimated) where it shares a column with crossed-design intervals (issue 48).
PROMPTS_ONLY_MARK = "†"
PROMPTS_ONLY_NOTE = (f"{PROMPTS_ONLY_MARK}: the interval covers the eval prompts only (fewer than 3 run seeds: the "
                     "seed-to-seed variance is not estimated); unmarked intervals cover run seeds crossed with eval "
                     "prompts")


def fmt_paired(mean: float, lo: float, hi: float, covers: str = "") -> str:
    """'+0.0123 [+0.0050, +0.0196]', marked ``PROMPTS_ONLY_MARK`` where ``covers`` says eval prompts only."""
    if not np.isfinite(mean):
        return "- (no same-seed pair)"
    if not np.isfinite(lo):
        return f"{mean:+.4f} (no interval)"
    mark = f" {PROMPTS_ONLY_MARK}" if str(covers).startswith("eval prompts only") else ""
    return f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]{mark}"


def paired_matrix(cell: dict, other: dict) -> np.ndarray | None:
    """[common run seeds, common eval prompts] of cell - other ({run seed: per-prompt means} each, as a sweep cell
    holds them), or None when they share no seed."""
    common = [s for s in cell if s in other]
    if not common:
        return None
    rows = [(cell[s] - other[s]).dropna() for s in common]
    matrix = pd.concat(rows, axis=1, join="inner").T.to_numpy(float)
    return matrix if matrix.size else None
