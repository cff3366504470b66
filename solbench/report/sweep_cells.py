"""What a sweep can decide: an interval for every cell, the set of cells within noise of the best, and (with
solbench/report/sweep_answer.py) the reward-against-measured-time front and the one-sentence answer.

A cell is one combination of swept parameters; its trial trains R run seeds (``sweep.seeds_per_cell``; the trials
table's ``run_ids``), and a cell asked twice pools its trials' runs. From the collected eval samples (split
``eval_sample``) of the objective's metric at each run's last evaluation: a matrix [runs, eval prompts] of per-prompt
means (over eval seeds) and the crossed interval of its grand mean (``stats.crossed_interval``: run seeds crossed with
eval prompts, both random; one run: a t interval over its eval prompts, which covers the prompts only). Each cell's
MEASURED seconds per training iteration come from its own runs' clock (solbench/report/sweep_cell.py
``measured_iteration_seconds``), with a t interval over its runs.

The best set: every cell is compared with the top cell (highest mean), paired on the same run seeds and eval prompts
(crossed interval of the differences; Welch's interval of the prompt means where two cells share no seed), the p
values Holm-adjusted over the comparisons; a cell is out of the set only when its adjusted p is below 1 - level and
it lies below the top. Each difference's interval is given at its Holm step's level (1 - alpha / (m - rank)). A set
of one is a best that noise did not choose; otherwise the sweep cannot tell the set's cells apart.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from solbench.report.paired import paired_matrix
from solbench.report.registry import Note, Table, report_kind
from solbench.report.stats import crossed_interval, fmt_num, mean_ci
from solbench.report.tables import Tables, _fmt_setting

_NOT_PARAMS = {"number", "value", "value_time", "pareto", "state", "study", "direction", "metric", "datetime_start",
               "datetime_complete", "duration", "run_id", "reason", "invalid", "last_step", "user_attrs", "system_attrs",
               "run_ids", "seeds", "seed_values", "lo", "hi", "covers", "seconds_per_iter", "clock"}


def param_columns(trials: pd.DataFrame) -> list[str]:
    return [c for c in trials.columns if c not in _NOT_PARAMS and not c.startswith(("user_attrs_", "system_attrs_"))]


def _prompt_means(tables: Tables, run_id: str, metric: str) -> pd.Series:
    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "eval_sample") & (m["metric"] == metric)]
    if rows.empty:
        return pd.Series(dtype=float)
    last = rows[rows["step"] == rows["step"].max()]
    return last.groupby("prompt_id")["value"].mean()


def _run_ids(group: pd.DataFrame) -> list[str]:
    """The runs of a cell's trials: their ``run_ids`` (R seeds each), else their ``run_id``."""
    ids: list[str] = []
    for _, row in group.iterrows():
        joined = row.get("run_ids")
        if isinstance(joined, str) and joined:
            ids += [r.strip() for r in joined.split(";") if r.strip()]
        elif isinstance(row.get("run_id"), str):
            ids.append(row["run_id"])
    return list(dict.fromkeys(ids))


def run_seconds(tables: Tables, run_id: str) -> float:
    """A run's MEASURED seconds per training iteration (its own clock)."""
    from solbench.report.sweep_cell import measured_iteration_seconds

    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "train")][["step", "split", "wall_s"]]
    return measured_iteration_seconds(rows.to_dict("records"))


def sweep_cells(tables: Tables) -> tuple[pd.DataFrame, dict]:
    """(one row per cell: params, runs, mean, lo, hi, covers, time_s [lo, hi], [value_time], vs top, in_best_set;
    info with the per-cell samples) of a sweep's trials."""
    trials = tables.trials
    if trials is None or trials.empty:
        return pd.DataFrame(), {}
    params = param_columns(trials)
    metric = (trials["metric"].dropna().iloc[0] if "metric" in trials and trials["metric"].notna().any()
              else tables.headline_metric())
    maximize = tables.trials_direction != "minimize"
    seeds = tables.runs.set_index("run_id")["seed"] if "seed" in tables.runs else pd.Series(dtype=object)
    level = tables.options.ci_level
    cells, samples = [], {}
    for key, g in trials.groupby(params, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        runs = _run_ids(g)
        per_run = {r: _prompt_means(tables, r, metric) for r in runs}
        per_run = {r: v for r, v in per_run.items() if not v.empty}
        row = {**dict(zip(params, key)), "trials": len(g), "runs": len(runs), "value": float(g["value"].mean()),
               "run_list": runs}
        if "value_time" in g:
            row["value_time"] = float(g["value_time"].mean())
            row["pareto"] = bool(g["pareto"].fillna(False).astype(bool).any()) if "pareto" in g else False
        clock = mean_ci([run_seconds(tables, r) for r in runs], level)
        row.update(time_s=clock.mean, time_lo=clock.lo, time_hi=clock.hi)
        if per_run:
            matrix = pd.concat(list(per_run.values()), axis=1, join="inner").T
            mean, lo, hi, df = crossed_interval(matrix.to_numpy(float), level)
            row.update(mean=mean, lo=lo, hi=hi, n_prompts=matrix.shape[1],
                       covers=("eval prompts only (one run)" if len(per_run) == 1 else
                               f"{len(per_run)} run seeds x {matrix.shape[1]} eval prompts"))
            samples[key] = {seeds.get(r, r): v for r, v in per_run.items()}
        else:
            row.update(mean=row["value"], lo=math.nan, hi=math.nan, n_prompts=0,
                       covers="no per-sample eval rows: no interval")
        row["label"] = ", ".join(f"{p}={_fmt_setting(v)}" for p, v in zip(params, key))
        row["_key"] = key
        cells.append(row)
    cells = pd.DataFrame(cells)
    info = {"metric": metric, "params": params, "samples": samples, "level": level}
    if not maximize:  # a minimised single objective (time to target): no reward intervals to compare
        cells["in_best_set"] = cells["value"] == cells["value"].min()
        return cells.drop(columns="_key"), {**info, "decided": False, "why": "minimised objective"}
    top = cells.loc[cells["mean"].idxmax()]
    others = [i for i in cells.index if cells.at[i, "_key"] != top["_key"]]
    tests = {i: _difference(samples.get(cells.at[i, "_key"], {}), samples.get(top["_key"], {}), level) for i in others}
    p = np.array([tests[i]["p"] for i in others], dtype=float)
    finite = np.isfinite(p)
    adjusted = np.full(len(p), math.nan)
    if finite.any():
        from solbench.report.findings_multiplicity import holm

        adjusted[finite] = holm(p[finite])
    order = {i: rank for rank, i in enumerate(sorted((i for i, ok in zip(others, finite) if ok),
                                                     key=lambda i: tests[i]["p"]))}
    m = int(finite.sum())
    columns = {c: [math.nan] * len(cells) for c in ("vs_top", "vs_top_lo", "vs_top_hi", "p", "p_holm")}
    in_set = [True] * len(cells)
    for j, i in enumerate(others):
        t = tests[i]
        pos = cells.index.get_loc(i)
        columns["vs_top"][pos], columns["p"][pos], columns["p_holm"][pos] = t["mean"], t["p"], adjusted[j]
        step_level = 1 - (1 - level) / (m - order[i]) if i in order else level
        columns["vs_top_lo"][pos], columns["vs_top_hi"][pos] = t["interval"](step_level)
        in_set[pos] = not (math.isfinite(adjusted[j]) and adjusted[j] < 1 - level and t["mean"] < 0)
    top_pos = cells.index.get_loc(top.name)
    columns["vs_top"][top_pos] = columns["vs_top_lo"][top_pos] = columns["vs_top_hi"][top_pos] = 0.0
    for name, values in columns.items():
        cells[name] = values
    cells["in_best_set"] = in_set
    decided = int(cells["in_best_set"].sum()) == 1
    return cells.drop(columns="_key"), {**info, "decided": decided, "top": top["label"], "top_key": top["_key"],
                                        "intervals": bool(cells["lo"].notna().any())}


def _difference(cell: dict, top: dict, level: float) -> dict:
    """cell - top: mean, two-sided p and its interval at any level; paired on common run seeds and prompts, else
    Welch over the prompt means."""
    matrix = paired_matrix(cell, top)
    if matrix is not None:
        mean, lo, hi, df = crossed_interval(matrix, level)
        p = math.nan
        if math.isfinite(lo) and math.isfinite(df) and hi > lo:
            se = (hi - lo) / 2 / float(stats.t.ppf(0.5 + level / 2, df))
            p = float(2 * stats.t.sf(abs(mean) / se, df))
        return {"mean": mean, "p": p, "interval": lambda at: crossed_interval(matrix, at)[1:3]}
    a = np.concatenate([v.to_numpy(float) for v in cell.values()]) if cell else np.array([])
    b = np.concatenate([v.to_numpy(float) for v in top.values()]) if top else np.array([])
    if len(a) < 2 or len(b) < 2:
        mean = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
        return {"mean": mean, "p": math.nan, "interval": lambda at: (math.nan, math.nan)}
    result = stats.ttest_ind(a, b, equal_var=False)

    def interval(at: float) -> tuple[float, float]:
        ci = result.confidence_interval(at)
        return float(ci.low), float(ci.high)

    return {"mean": float(a.mean() - b.mean()), "p": float(result.pvalue), "interval": interval}


def best_set_line(cells: pd.DataFrame, info: dict) -> str:
    """One line for the command's output and the caption."""
    if cells.empty:
        return "best: none (no trial completed)"
    chosen = cells[cells["in_best_set"]].sort_values("mean", ascending=False)
    listing = "; ".join(f"{r.label} {fmt_num(r.mean)}" + (f" [{fmt_num(r.lo)}, {fmt_num(r.hi)}]" if math.isfinite(r.lo)
                                                           else "") for r in chosen.itertuples())
    if info.get("decided"):
        return (f"best: {listing} (below it, Holm-adjusted, every other of the {len(cells)} cells in paired "
                "tests)")
    if not info.get("intervals", True):
        return (f"no cell has an interval (no per-sample eval rows of `{info.get('metric')}`): the top of {len(cells)} "
                "cells cannot be told from noise")
    return (f"best set (not separable from the top cell by Holm-adjusted paired tests, {len(chosen)} of {len(cells)} "
            f"cells): {listing}; the sweep cannot tell these apart")


@report_kind("sweep_cells", title="Sweep: intervals, best set, measured-time front and the answer", order=66)
def sweep_cells_report(tables: Tables):
    """Every sweep cell with its interval, the best set, the reward-against-measured-time front and the answer."""
    from solbench.report.sweep_answer import answer_outputs

    cells, info = sweep_cells(tables)
    if cells.empty:
        return Note("Sweep cells", "No sweep in these results (results/<experiment>/sweep/ holds no trials).")
    level = tables.options.ci_level
    shown = cells.sort_values("mean", ascending=False)
    display = pd.DataFrame({
        "cell": shown["label"], "trials / runs": [f"{t} / {r}" for t, r in zip(shown["trials"], shown["runs"])],
        f"`{info['metric']}` ({level:.0%} interval)": [
            f"{fmt_num(m)} [{fmt_num(lo)}, {fmt_num(hi)}]" if math.isfinite(lo) else fmt_num(m)
            for m, lo, hi in zip(shown["mean"], shown["lo"], shown["hi"])],
        "covers": shown["covers"],
        "MEASURED s / iteration": [f"{t:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else
                                   (f"{t:.2f}" if math.isfinite(t) else "-")
                                   for t, lo, hi in zip(shown["time_s"], shown["time_lo"], shown["time_hi"])],
        "Δ vs top (Holm step level)": [f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]" if math.isfinite(lo) else "-"
                                       for m, lo, hi in zip(shown.get("vs_top", np.nan), shown.get("vs_top_lo", np.nan),
                                                            shown.get("vs_top_hi", np.nan))] if "vs_top" in shown else "-",
        "p (Holm)": [f"{p:.3g}" if math.isfinite(p) else "-" for p in shown["p_holm"]] if "p_holm" in shown else "-",
        "best set": ["**yes**" if b else "no" for b in shown["in_best_set"]]})
    if "value_time" in shown:
        display.insert(4, "PROJECTED ms / iteration", [fmt_num(v * 1e3, 4) for v in shown["value_time"]])
    outputs = [Table("sweep_cells", "Sweep cells: intervals and the best set", shown.drop(columns=["_key", "run_list"], errors="ignore"), (
        f"{best_set_line(cells, info)}. Each cell's final `{info['metric']}`: mean over its runs (R run seeds) and eval "
        f"prompts (each the mean over its eval seeds) with the {level:.0%} crossed interval (run seeds crossed with "
        "eval prompts; one run: a t interval over its eval prompts, which does not cover run-to-run variation). "
        "MEASURED s / iteration: each cell's own runs' training clock (evaluation excluded), mean and t interval over "
        "its runs. Δ vs top: paired on the same run seeds and eval prompts (Welch's interval where the cells share no "
        "seed), its interval at its Holm step's level, p Holm-adjusted over the comparisons with the top. The best "
        "set is the top cell and every cell not below it at the adjusted level."), display=display)]
    outputs += answer_outputs(tables, cells, info)
    return outputs
