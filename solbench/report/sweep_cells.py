"""What a sweep can decide: an interval for every cell, the set of cells within noise of the top, and the
Pareto front of a reward-vs-time study.

A cell is one combination of swept parameters; its trials are runs (several when the sweep repeats a cell,
e.g. over ``seed``). From the collected eval samples (split ``eval_sample``) of the objective's metric at each
run's last evaluation: a matrix [runs, eval prompts] of per-prompt means (over eval seeds) and the crossed
interval of its grand mean (``stats.crossed_interval``; one run: a t interval over its eval prompts, which
covers the prompts only). The best set holds the top cell and every cell whose difference from it is not
separable from zero: paired on the same run seed and eval prompts (crossed interval of the differences),
or, where the two cells share no seed, Welch's interval of the difference of their prompt means
(scipy.stats.ttest_ind). A single cell in the set is separable from all others: "best"; otherwise the
sweep cannot tell its cells apart. Reward-vs-time studies (solbench/sweep/pareto.py) add the PROJECTED GPU
seconds per iteration and Optuna's Pareto front (trials.parquet ``pareto``), drawn with the reward intervals.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from solbench.report.plotting import new_figure
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import crossed_interval, fmt_num
from solbench.report.tables import Tables, _fmt_setting

_NOT_PARAMS = {"number", "value", "value_time", "pareto", "state", "study", "direction", "metric", "datetime_start",
               "datetime_complete", "duration", "run_id", "reason", "invalid", "last_step", "user_attrs", "system_attrs"}


def param_columns(trials: pd.DataFrame) -> list[str]:
    return [c for c in trials.columns if c not in _NOT_PARAMS and not c.startswith(("user_attrs_", "system_attrs_"))]


def _prompt_means(tables: Tables, run_id: str, metric: str) -> pd.Series:
    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "eval_sample") & (m["metric"] == metric)]
    if rows.empty:
        return pd.Series(dtype=float)
    last = rows[rows["step"] == rows["step"].max()]
    return last.groupby("prompt_id")["value"].mean()


def sweep_cells(tables: Tables) -> tuple[pd.DataFrame, dict]:
    """(one row per cell: params, runs, mean, lo, hi, covers, [time], in_best_set; notes) of a sweep's trials."""
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
        runs = list(dict.fromkeys(g["run_id"].dropna().astype(str))) if "run_id" in g else []
        per_run = {r: _prompt_means(tables, r, metric) for r in runs}
        per_run = {r: v for r, v in per_run.items() if not v.empty}
        row = {**dict(zip(params, key)), "trials": len(g), "runs": len(runs), "value": float(g["value"].mean())}
        if "value_time" in g:
            row["value_time"] = float(g["value_time"].mean())
            row["pareto"] = bool(g["pareto"].fillna(False).astype(bool).any()) if "pareto" in g else False
        if per_run:
            matrix = pd.concat(list(per_run.values()), axis=1, join="inner").T
            mean, lo, hi, df = crossed_interval(matrix.to_numpy(float), level)
            row.update(mean=mean, lo=lo, hi=hi, n_prompts=matrix.shape[1],
                       covers=("eval prompts only (one run)" if len(per_run) == 1 else
                               f"{len(per_run)} runs x {matrix.shape[1]} eval prompts"))
            samples[key] = {seeds.get(r, r): v for r, v in per_run.items()}
        else:
            row.update(mean=row["value"], lo=math.nan, hi=math.nan, n_prompts=0,
                       covers="no per-sample eval rows: no interval")
        row["label"] = ", ".join(f"{p}={_fmt_setting(v)}" for p, v in zip(params, key))
        row["_key"] = key
        cells.append(row)
    cells = pd.DataFrame(cells)
    if not maximize:  # a minimised single objective (time to target): no reward intervals to compare
        cells["in_best_set"] = cells["value"] == cells["value"].min()
        return cells.drop(columns="_key"), {"metric": metric, "decided": False, "why": "minimised objective"}
    top = cells.loc[cells["mean"].idxmax()]
    in_set, deltas = [], []
    for _, c in cells.iterrows():
        if c["_key"] == top["_key"]:
            in_set.append(True)
            deltas.append((0.0, 0.0, 0.0))
            continue
        d = _difference(samples.get(c["_key"], {}), samples.get(top["_key"], {}), level)
        deltas.append(d)
        in_set.append(not (math.isfinite(d[2]) and d[2] < 0))  # not separable from the top unless wholly below
    cells["vs_top"], cells["vs_top_lo"], cells["vs_top_hi"] = zip(*deltas)
    cells["in_best_set"] = in_set
    decided = int(cells["in_best_set"].sum()) == 1
    return cells.drop(columns="_key"), {"metric": metric, "decided": decided, "top": top["label"],
                                        "intervals": bool(cells["lo"].notna().any())}


def _difference(cell: dict, top: dict, level: float) -> tuple[float, float, float]:
    """(mean, lo, hi) of cell - top: paired on common run seeds and prompts, else Welch over prompt means."""
    common = [s for s in cell if s in top]
    if common:
        rows = [(cell[s] - top[s]).dropna() for s in common]
        matrix = pd.concat(rows, axis=1, join="inner").T.to_numpy(float)
        if matrix.size:
            mean, lo, hi, _ = crossed_interval(matrix, level)
            return mean, lo, hi
    a = np.concatenate([v.to_numpy(float) for v in cell.values()]) if cell else np.array([])
    b = np.concatenate([v.to_numpy(float) for v in top.values()]) if top else np.array([])
    if len(a) < 2 or len(b) < 2:
        return (float(a.mean() - b.mean()) if len(a) and len(b) else math.nan), math.nan, math.nan
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)
    return float(a.mean() - b.mean()), float(ci.low), float(ci.high)


def best_set_line(cells: pd.DataFrame, info: dict) -> str:
    """One line for the command's output and the caption."""
    if cells.empty:
        return "best: none (no trial completed)"
    chosen = cells[cells["in_best_set"]].sort_values("mean", ascending=False)
    listing = "; ".join(f"{r.label} {fmt_num(r.mean)}" + (f" [{fmt_num(r.lo)}, {fmt_num(r.hi)}]" if math.isfinite(r.lo)
                                                           else "") for r in chosen.itertuples())
    if info.get("decided"):
        return f"best: {listing} (separable from every other cell at the {len(cells)} cells' intervals)"
    if not info.get("intervals", True):
        return (f"no cell has an interval (no per-sample eval rows of `{info.get('metric')}`): the top of {len(cells)} "
                "cells cannot be told from noise")
    return (f"best set (not separable from the top cell, {len(chosen)} of {len(cells)} cells): {listing}; the sweep "
            "cannot tell these apart")


@report_kind("sweep_cells", title="Sweep: intervals, best set and Pareto front", order=66)
def sweep_cells_report(tables: Tables):
    """Every sweep cell with its interval, the set of cells within noise of the top, and the reward-vs-time front."""
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
        "Δ vs top": [f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]" if math.isfinite(lo) else "-"
                     for m, lo, hi in zip(shown.get("vs_top", np.nan), shown.get("vs_top_lo", np.nan),
                                          shown.get("vs_top_hi", np.nan))] if "vs_top" in shown else "-",
        "best set": ["**yes**" if b else "no" for b in shown["in_best_set"]]})
    if "value_time" in shown:
        display.insert(3, "PROJECTED ms / iteration", [fmt_num(v * 1e3, 4) for v in shown["value_time"]])
        display.insert(4, "Pareto front", ["yes" if p else "-" for p in shown["pareto"]])
    outputs = [Table("sweep_cells", "Sweep cells: intervals and the best set", shown, (
        f"{best_set_line(cells, info)}. Each cell's final `{info['metric']}`: mean over its runs' eval prompts (each "
        f"the mean over its eval seeds) with the {level:.0%} crossed interval (one run: a t interval over its eval "
        "prompts, which does not cover run-to-run variation). Δ vs top: paired on the same run seed and eval prompts "
        "(Welch's interval where the cells share no seed). The best set is the top cell and every cell not wholly "
        "below it; only a set of one is a best that noise did not choose."), display=display)]
    if "value_time" in cells and cells["value_time"].notna().any():
        outputs.append(_pareto_figure(cells, info, level))
    return outputs


def _pareto_figure(cells: pd.DataFrame, info: dict, level: float) -> Figure:
    fig = new_figure(6.5, 4.2)
    ax = fig.subplots()
    x = cells["value_time"].to_numpy(float) * 1e3
    y = cells["mean"].to_numpy(float)
    paired = "vs_top_lo" in cells and cells["vs_top_lo"].notna().any()
    if paired:  # the interval that decides: each cell's paired difference from the top, placed at the cell
        top = float(cells["mean"].max())
        lo, hi = top + cells["vs_top_lo"], top + cells["vs_top_hi"]
        lo, hi = lo.where(cells["vs_top_lo"].notna() & (cells["mean"] < top), cells["mean"]), hi.where(
            cells["vs_top_hi"].notna() & (cells["mean"] < top), cells["mean"])
    else:
        lo, hi = cells["lo"], cells["hi"]
    err = np.vstack([(cells["mean"] - lo).fillna(0).clip(lower=0), (hi - cells["mean"]).fillna(0).clip(lower=0)])
    ax.errorbar(x, y, yerr=err, fmt="o", color="#7f7f7f", capsize=3, markersize=4,
                label="cells (paired interval from the top)" if paired else "cells (interval)")
    front = cells[cells["pareto"]].sort_values("value_time")
    ax.plot(front["value_time"] * 1e3, front["mean"], marker="o", color="#d62728", linewidth=2.0, drawstyle="steps-post",
            label="Pareto front (Optuna)")
    for i, (_, r) in enumerate(cells.sort_values("value_time").iterrows()):  # staggered: equal times do not overlap
        ax.annotate(r["label"], (r["value_time"] * 1e3, r["mean"]), textcoords="offset points",
                    xytext=(4, 4 + 9 * (i % 3)), fontsize=6)
    ax.margins(x=0.2)  # room for the labels of the outermost cells
    ax.set_xlabel("PROJECTED GPU time per iteration (ms)", fontsize=8)
    ax.set_ylabel(f"final {info['metric']}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return Figure("sweep_pareto", "Sweep: reward against PROJECTED GPU time per iteration", fig, (
        "Each cell: final reward against its PROJECTED GPU seconds per training iteration (counted FLOPs at the "
        "precision each ran at; a projection, not a measurement). Bars: the paired interval of the cell's difference "
        "from the top cell (the table's Δ vs top, placed at the cell; where the cells share no run seed or eval "
        "prompts, the cell's own interval): a bar reaching the top cell's reward means the sweep cannot put the cell "
        f"below it at {level:.0%}. Red: Optuna's Pareto front of the two objectives, from point estimates."), data=cells)
