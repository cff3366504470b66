"""Paired comparisons of eval rewards: one arm against a baseline arm on the same eval prompts and seeds.

Runs of the same run seed share their eval noise (the trainer draws it from the run seed and the eval
prompt), so a run of arm A and the run of the baseline B with the same seed generated their eval images
from the same initial noise for the same prompts. The paired difference of one such pair, at one
evaluation step, is (per eval prompt) the mean over eval seeds of score_A - score_B; the trainer stores
those per-sample scores as metrics rows with split ``eval_sample`` (columns prompt_id, eval_seed).

The interval is a two-level bootstrap (``stats.hierarchical_bootstrap``): run seeds resampled with
replacement and, within each drawn seed, eval prompts with replacement. Results collected before
the trainer stored per-sample rows fall back to the per-run eval means: one difference per seed,
only seeds resampled (and no interval with one seed). ``PairedCI.covers`` says which applies.
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

    @property
    def relative(self) -> float:
        """The difference as a fraction of the baseline's mean score."""
        return self.ci.mean / abs(self.base_mean) if self.base_mean else float("nan")


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


def paired_difference(tables: Tables, model: str, metric: str, arm: str, base_arm: str) -> Paired | None:
    """arm - base_arm at the last evaluation step common to each same-seed pair of runs (equal iterations)."""
    a_runs, b_runs = seed_runs(tables, model, arm), seed_runs(tables, model, base_arm)
    seeds = sorted(set(a_runs) & set(b_runs), key=lambda s: (str(type(s)), s))
    if not seeds:
        return None
    samples = sample_rows(tables, metric)
    groups, steps, a_vals, b_vals, per_prompt = [], [], [], [], True
    for seed in seeds:
        ra, rb = a_runs[seed], b_runs[seed]
        common = _eval_steps(tables, ra, metric) & _eval_steps(tables, rb, metric)
        if not common:
            continue
        step = max(common)
        steps.append(step)
        diffs = prompt_differences(samples, ra, step, rb, step)
        a_vals.append(_run_value(tables, ra, metric, step))
        b_vals.append(_run_value(tables, rb, metric, step))
        if diffs.empty:
            per_prompt = False
            diffs = pd.Series([a_vals[-1] - b_vals[-1]])
        groups.append(diffs.to_numpy(float))
    if not groups:
        return None
    if not per_prompt:  # mixing per-prompt and per-run groups would weigh them unequally: per-run for all
        groups = [np.array([a - b]) for a, b in zip(a_vals, b_vals)]
    o = tables.options
    ci = paired_ci(groups, n_boot=o.n_boot, level=o.ci_level, seed=o.boot_seed, per_prompt=per_prompt)
    return Paired(ci, max(steps) if steps else None, float(np.nanmean(a_vals)), float(np.nanmean(b_vals)), seeds)


def paired_steps(tables: Tables, model: str, metric: str, arm: str, step_a: int, step_b: int) -> Paired | None:
    """Within one arm: the score at step_a minus the score at step_b of the same runs (same prompts, seeds)."""
    runs = seed_runs(tables, model, arm)
    samples = sample_rows(tables, metric)
    groups, a_vals, b_vals, per_prompt = [], [], [], True
    for _seed, rid in sorted(runs.items(), key=lambda kv: str(kv[0])):
        steps = _eval_steps(tables, rid, metric)
        if step_a not in steps or step_b not in steps:
            continue
        a_vals.append(_run_value(tables, rid, metric, step_a))
        b_vals.append(_run_value(tables, rid, metric, step_b))
        diffs = prompt_differences(samples, rid, step_a, rid, step_b)
        if diffs.empty:
            per_prompt = False
        groups.append(diffs.to_numpy(float))
    if not a_vals:
        return None
    if not per_prompt:
        groups = [np.array([a - b]) for a, b in zip(a_vals, b_vals)]
    o = tables.options
    ci = paired_ci(groups, n_boot=o.n_boot, level=o.ci_level, seed=o.boot_seed, per_prompt=per_prompt)
    return Paired(ci, step_a, float(np.mean(a_vals)), float(np.mean(b_vals)), sorted(runs, key=str))
