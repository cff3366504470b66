"""The answer of an N x K sweep (solbench/report/sweep_cells.py gives the cells): the reward-against-measured-time
front, the reward at an equal MEASURED compute budget, Table 3's trend and the one sentence that says which (N, K)
is best at the sweep's budget.

- Front: the cells no other cell beats on both final reward (higher) and MEASURED seconds per training iteration
  (lower, each cell's own runs' clock), drawn with each cell's reward interval and its time interval over its runs. A
  reward-and-time study on the PROJECTED clock keeps its projected front (Optuna's ``pareto``), labelled, in a panel
  of its own.
- Equal measured budget: B is the measured training time of the cheapest cell's whole run (its runs' mean final
  ``wall_s``); every run's curve is read at ``wall_s = B`` (linear between its evaluations; a run still short of B at
  its end keeps its final value), and each cell gets the mean over its runs with a t interval over them.
- Table 3's trend (reward grows with N at fixed K, the paper's 0.3569 at N = 24 to 0.3686 at N = 96): at every K
  with two or more N, the paired difference (same run seeds and eval prompts, crossed interval) of the largest N
  against the smallest; where the interval spans zero, the run seeds per cell that would detect a difference of
  the observed size with 80 % power (``stats.units_needed``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.plotting import METHOD_COLOURS, SMALL, label_points, new_figure, style_axes
from solbench.report.registry import Figure, Note, Table
from solbench.report.stats import crossed_interval, fmt_num, mean_ci, units_needed, variance_components, zero_width
from solbench.report.tables import Tables, _fmt_setting

CLOCK_NOTE = "MEASURED on each cell's own runs' training clock (evaluation excluded)"
TABLE3 = "Table 3's trend (reward grows with N at fixed K; the paper: 0.3569 at N=24 to 0.3686 at N=96)"


def front_mask(reward: pd.Series, seconds: pd.Series) -> list[bool]:
    """True for every cell no other cell beats on both reward (>=, one strictly) and seconds (<=)."""
    r, s = reward.to_numpy(float), seconds.to_numpy(float)
    mask = []
    for i in range(len(r)):
        if not (math.isfinite(r[i]) and math.isfinite(s[i])):
            mask.append(False)
            continue
        dominated = any(math.isfinite(r[j]) and math.isfinite(s[j]) and r[j] >= r[i] and s[j] <= s[i]
                        and (r[j] > r[i] or s[j] < s[i]) for j in range(len(r)) if j != i)
        mask.append(not dominated)
    return mask


def budget_rewards(tables: Tables, cells: pd.DataFrame, info: dict) -> tuple[pd.DataFrame, float]:
    """(per cell: reward at the equal measured budget B with a t interval over its runs, B in seconds)."""
    from solbench.report.sweep_curve import metric_curve, reward_at_budget

    m = tables.metrics
    curves: dict[str, list] = {}
    finals = {}
    for label, runs in zip(cells["label"], cells["run_list"]):
        walls = []
        for run in runs:
            rows = m[m["run_id"] == run][["step", "split", "metric", "value", "wall_s"]].to_dict("records")
            curve = metric_curve(rows, info["metric"])
            if curve:
                curves.setdefault(label, []).append(curve)
                walls.append(curve[-1].wall_s)
        if walls:
            finals[label] = float(np.mean(walls))
    if not finals:
        return pd.DataFrame(), math.nan
    budget = min(finals.values())
    rows = []
    for label, runs in curves.items():
        ci = mean_ci([reward_at_budget(c, budget) for c in runs], info["level"])
        rows.append({"label": label, "runs": len(runs), "reward_at_budget": ci.mean, "lo": ci.lo, "hi": ci.hi,
                     "whole_run_s": finals[label]})
    return pd.DataFrame(rows).sort_values("reward_at_budget", ascending=False), budget


def trends(cells: pd.DataFrame, info: dict) -> list[dict]:
    """Table 3's trend at each K: largest N against smallest N, paired (see the module docstring)."""
    from solbench.report.paired import paired_matrix

    if not {"n", "k"} <= set(info["params"]):
        return []
    out = []
    samples, level = info["samples"], info["level"]
    keys = {row["label"]: tuple(row[p] for p in info["params"]) for _, row in cells.iterrows()}
    for k, group in cells.groupby("k"):
        if group["n"].nunique() < 2:
            continue
        lo_row, hi_row = group.loc[group["n"].idxmin()], group.loc[group["n"].idxmax()]
        matrix = paired_matrix(samples.get(keys[hi_row["label"]], {}), samples.get(keys[lo_row["label"]], {}))
        if matrix is None:
            continue
        mean, lo, hi, _ = crossed_interval(matrix, level)
        flat = zero_width(lo, hi)  # no spread at all: the data could not have said otherwise (the Findings rule)
        seeds = math.nan
        if not flat and not (lo > 0 or hi < 0):
            comps = variance_components(matrix)
            seeds = units_needed(comps, abs(mean), vary="seeds") if comps is not None else math.nan
        out.append({"k": k, "n_small": lo_row["n"], "n_large": hi_row["n"], "mean": mean, "lo": lo, "hi": hi,
                    "n_seeds": matrix.shape[0], "seeds_needed": seeds,
                    "verdict": "not judged: no spread" if flat else "holds" if lo > 0 else "reversed" if hi < 0
                    else "undecided"})
    return out


def _trend_text(t: dict) -> str:
    k, a, b = (_fmt_setting(t[c]) for c in ("k", "n_small", "n_large"))
    text = f"at K={k}, N={b} vs N={a}: {t['mean']:+.4f} [{t['lo']:+.4f}, {t['hi']:+.4f}] ({t['verdict']}"
    if t["verdict"] == "undecided":
        need = t["seeds_needed"]
        text += (f"; about {int(need)} run seeds per cell would detect a difference this size at 80 % power"
                 if math.isfinite(need) else "; more than 1000 run seeds per cell would be needed for one this size"
                 if need == math.inf else "; the seeds' variance is not estimated: run 3 or more seeds per cell")
    return text + ")"


def answer_sentence(cells: pd.DataFrame, info: dict, found: list[dict], iterations: str) -> str:
    """The one sentence: which (N, K) is best at the sweep's budget and whether Table 3's trend holds."""
    level = info["level"]
    chosen = cells[cells["in_best_set"]].sort_values("mean", ascending=False)
    top = chosen.iloc[0]
    shown = f"{top['label']} ({fmt_num(top['mean'])} [{fmt_num(top['lo'])}, {fmt_num(top['hi'])}])"
    if info.get("decided"):
        best = f"At {iterations}, the best cell is {shown}, above every other cell at Holm-adjusted {level:.0%}"
    else:
        best = (f"At {iterations}, no single (N, K) is best: the top cell {shown} cannot be told from "
                f"{len(chosen) - 1} other cell(s) ({'; '.join(chosen['label'].iloc[1:])}) at Holm-adjusted {level:.0%}")
    if not found:
        return best + f"; {TABLE3} cannot be read from this grid (no K with two N)."
    return best + f"; {TABLE3}: " + "; ".join(_trend_text(t) for t in found) + "."


def answer_outputs(tables: Tables, cells: pd.DataFrame, info: dict) -> list:
    """The answer, the front and the equal-budget table (empty for a minimised objective)."""
    if info.get("why") == "minimised objective" or "in_best_set" not in cells or not cells["lo"].notna().any():
        return []
    iterations = "the sweep's budget"
    for column in ("iterations", "p_iterations"):
        if column in tables.runs and tables.runs[column].nunique() == 1:
            iterations = f"{int(tables.runs[column].iloc[0])} iterations"
            break
    found = trends(cells, info)
    outputs: list = [Note("Sweep: the answer", answer_sentence(cells, info, found, iterations))]
    front = cells.assign(front=front_mask(cells["mean"], cells["time_s"]))
    if front["time_s"].notna().any():
        table = front.sort_values("time_s")[["label", "mean", "lo", "hi", "time_s", "time_lo", "time_hi", "front"]]
        outputs.append(Table("sweep_front", "Sweep: reward against MEASURED seconds per iteration", table, (
            f"Each cell's final `{info['metric']}` (its interval as in the cells table) against its seconds per training "
            f"iteration, {CLOCK_NOTE}, mean and t interval over its runs. front: no other cell has both a higher "
            "reward and fewer seconds (point estimates; overlapping intervals are not an order)."), display=pd.DataFrame({
                "cell": table["label"], "reward": [f"{fmt_num(m)} [{fmt_num(lo)}, {fmt_num(hi)}]" for m, lo, hi in
                                                   zip(table["mean"], table["lo"], table["hi"])],
                "MEASURED s / iteration": [f"{t:.2f} [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else f"{t:.2f}"
                                           for t, lo, hi in zip(table["time_s"], table["time_lo"], table["time_hi"])],
                "front": ["**yes**" if f else "-" for f in table["front"]]})))
    if front["time_s"].notna().any() or ("value_time" in front and front["value_time"].notna().any()):
        outputs.append(_front_figure(front, info))
    budget, seconds = budget_rewards(tables, cells, info)
    if not budget.empty:
        outputs.append(Table("sweep_equal_budget", f"Sweep: reward at an equal MEASURED budget ({seconds:.0f} s)", budget, (
            f"Each run's `{info['metric']}` curve read at {seconds:.1f} s of training, {CLOCK_NOTE}: the cheapest "
            "cell's whole run, so every cell is compared after the same measured compute (linear between evaluations; "
            "a cell that finished sooner keeps its final value). Mean and t interval over each cell's runs (seeds "
            "only: the eval prompts are not crossed in here)."), display=pd.DataFrame({
                "cell": budget["label"], "runs": budget["runs"],
                "reward at budget": [f"{fmt_num(m)} [{fmt_num(lo)}, {fmt_num(hi)}]" if math.isfinite(lo) else fmt_num(m)
                                     for m, lo, hi in zip(budget["reward_at_budget"], budget["lo"], budget["hi"])],
                "whole run (s)": [f"{s:.0f}" for s in budget["whole_run_s"]]})))
    return outputs


def _front_figure(cells: pd.DataFrame, info: dict) -> Figure:
    projected = "value_time" in cells and cells["value_time"].notna().any()
    colour = METHOD_COLOURS["Sol-RL"]  # every cell is a Sol-RL setting: the method's one colour
    panels = []
    if cells["time_s"].notna().any():
        panels.append(("time_s", 1.0, "MEASURED s / training iteration (own runs' clock)", cells["front"]))
    if projected:
        panels.append(("value_time", 1e3, "PROJECTED GPU ms / iteration (a projection)",
                       cells["pareto"].fillna(False).astype(bool)))
    fig = new_figure(4.8 + 3.6 * (len(panels) - 1) + 1.4, 4.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (column, scale, xlabel, on_front) in zip(axes, panels):
        x = cells[column].to_numpy(float) * scale
        y = cells["mean"].to_numpy(float)
        yerr = np.vstack([(cells["mean"] - cells["lo"]).fillna(0).clip(lower=0),
                          (cells["hi"] - cells["mean"]).fillna(0).clip(lower=0)])
        xerr = None
        if column == "time_s":
            xerr = np.vstack([(cells["time_s"] - cells["time_lo"]).fillna(0).clip(lower=0),
                              (cells["time_hi"] - cells["time_s"]).fillna(0).clip(lower=0)])
        ax.errorbar(x, y, yerr=yerr, xerr=xerr, fmt="o", color=colour, ecolor=colour, alpha=0.75, capsize=3,
                    markersize=4, label="cell (mean, interval)")
        front = cells[on_front.to_numpy(bool)].sort_values(column)
        ax.plot(front[column] * scale, front["mean"], color="#333333", linestyle="--", linewidth=1.2,
                drawstyle="steps-post", label="front (point estimates)")
        ax.margins(x=0.25, y=0.12)
        style_axes(ax, xlabel, f"final {info['metric']}")
        ax.legend(fontsize=SMALL, loc="lower right")
        shown = cells[np.isfinite(x)]
        label_points(ax, shown[column].to_numpy(float) * scale, shown["mean"].to_numpy(float),
                     [label.replace("n=", "N=").replace("k=", "K=") for label in shown["label"]])
    return Figure("sweep_front", "Sweep: reward against measured time per iteration", fig, (
        f"Each cell: final reward (bar: its interval over run seeds x eval prompts) against its seconds per training "
        f"iteration, {CLOCK_NOTE} (bar: t interval over its runs). Dashed: the front, the cells no other beats on both "
        "(from point estimates). " + ("The PROJECTED panel: the same cells on the PROJECTED GPU clock (counted FLOPs at the "
                                      "precision each ran at; a projection, not a measurement), its front Optuna's. "
                                      if projected else "")), data=cells.drop(columns=["_key", "run_list"], errors="ignore"))
