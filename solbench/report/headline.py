"""The report's headline figure: the training reward against measured training time for Sol-RL, naive BF16 scaling,
naive FP4 and DiffusionNFT (each method's main arm, the one the findings compare), beside Table 5's bars.

Left: per arm the mean over its run seeds of the training reward at each evaluation against the mean of their
measured wall-clock training seconds (evaluation excluded), a band over the run seeds' range and, with five seeds or
fewer, each seed's own point. Right: Table 5's measured seconds per iteration of naive BF16 scaling and Sol-RL,
rollout and the rest of the iteration stacked, and the measured speedup written above Sol-RL's bar: from the spec's
speed block where it timed both arms (alone, interleaved rounds: the speedup's interval is over rounds), else from the
training runs' own clocks (the end-to-end 95 % interval over run seeds as an error bar), the title saying which. One colour per method (solbench/report/plotting.py); the legend sits below the
axes, outside the data.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.findings_common import main_arm, reward_roles, TRAINING
from solbench.report.plotting import _METHOD_COLOURS, new_figure
from solbench.report.registry import Figure
from solbench.report.tables import Tables, same_method

#: the methods the headline compares, in the legend's order
HEADLINE_METHODS = ("sol_rl", "naive_bf16", "naive_fp4", "diffusion_nft")
SEED_POINTS_UP_TO = 5


def _training_reward(tables: Tables, runs: pd.DataFrame) -> str | None:
    roles = reward_roles(tables, runs)
    trained = [r for r, role in roles if role == TRAINING]
    return (trained or [r for r, _ in roles] or [None])[0]


def _arms(tables: Tables, runs: pd.DataFrame) -> list[tuple[str, str]]:
    """[(method display name, main arm)] of the headline methods present."""
    out = []
    for method in HEADLINE_METHODS:
        if any(same_method(m, method) for m in runs["method"].unique()):
            arm = main_arm(tables, runs, method)
            if arm is not None:
                out.append((runs.loc[runs["arm"] == arm, "method_display"].iloc[0], arm))
    return out


def _time_unit(seconds: float) -> tuple[float, str]:
    return (60.0, "min") if seconds > 600 else (1.0, "s")


def headline_figure(tables: Tables, timing_table: pd.DataFrame | None, labels: dict[str, str],
                    model: str | None = None, speed_table: pd.DataFrame | None = None) -> Figure | None:
    """The figure of the module docstring for ``model`` (default: the first), or None without eval rows."""
    runs = tables.done_runs
    if runs.empty:
        return None
    model = model or tables.models()[0]
    runs = runs[runs["model"] == model]
    metric = _training_reward(tables, runs)
    arms = _arms(tables, runs)
    if metric is None or not arms:
        return None
    rows = tables.run_metrics("eval", metric)
    rows = rows[rows["arm"].isin([a for _, a in arms]) & (rows["model"] == model)]
    if rows.empty:
        return None
    scale, unit = _time_unit(float(rows["wall_s"].max()))
    fig = new_figure(10.0, 4.2)
    left, right = fig.subplots(1, 2, width_ratios=[1.7, 1.0])
    plotted = []
    for display, arm in arms:
        colour = _METHOD_COLOURS.get(display, "#333333")
        mine = rows[rows["arm"] == arm]
        per_step = mine.groupby("step").agg(value=("value", "mean"), lo=("value", "min"), hi=("value", "max"),
                                            wall=("wall_s", "mean"), seeds=("seed", "nunique")).reset_index()
        x = per_step["wall"].to_numpy() / scale
        left.plot(x, per_step["value"], color=colour, linewidth=2.0, marker="o", markersize=3.5,
                  label=labels.get(arm, arm), zorder=3)
        left.fill_between(x, per_step["lo"], per_step["hi"], color=colour, alpha=0.15, linewidth=0, zorder=1)
        if mine["seed"].nunique() <= SEED_POINTS_UP_TO:
            left.scatter(mine["wall_s"] / scale, mine["value"], color=colour, s=7, alpha=0.5, linewidths=0, zorder=2)
        plotted.append(dict(panel="reward", arm=arm, label=labels.get(arm, arm), step=per_step["step"].tolist(),
                            wall_s=per_step["wall"].tolist(), mean=per_step["value"].tolist(),
                            seed_min=per_step["lo"].tolist(), seed_max=per_step["hi"].tolist()))
    left.set_xlabel(f"measured training time ({unit}, evaluation excluded)")
    left.set_ylabel(f"{metric} (training reward)")
    left.set_title("Reward against measured time (band: range of the run seeds; dots: each seed)", fontsize=9)
    left.grid(alpha=0.3)
    block_row = _speed_block_row(tables, speed_table, runs)
    _table5_bars(right, tables, timing_table, labels, runs, plotted, block_row)
    handles, names = left.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 4), fontsize=8, frameon=False)
    data = pd.DataFrame(plotted)
    return Figure("headline", f"Headline: {metric} against measured time, and Table 5", fig, caption=(
        f"Model `{model}`, each method's main arm (the one the findings compare). Left: the training reward `{metric}` "
        "at each evaluation against the measured wall-clock training seconds (mean over run seeds; timed during "
        "training: the per-run timings say whether other programs shared the cores), the band the range of the run "
        "seeds, dots each seed's own value. Right: Table 5, measured seconds per iteration (rollout "
        "and the rest of the iteration stacked) and the measured speedup, "
        + ("from the spec's speed block (the arms timed alone from the same state in interleaved rounds; the "
           "speedup's 95 % interval is over rounds)" + (f"; the explore copy ran on the {block_row['backend']} "
                                                        "backend" if block_row.get("backend") else "")
           if block_row is not None else
           "from the training runs' own clocks (error bar: the end-to-end 95 % t interval over run seeds)")
        + "."), data=data)


def _speed_block_row(tables: Tables, speed: pd.DataFrame | None, runs: pd.DataFrame) -> dict | None:
    """Table 5's pair as the speed block timed it (eager sampling), in the training table's column names; None
    where the block did not time both the baseline and the target."""
    if speed is None or speed.empty or not {"arm", "method", "baseline", "rollout_s", "e2e_s"} <= set(speed):
        return None
    o = tables.options
    rows = speed[speed["variant"].astype(str) == "eager"] if "variant" in speed else speed
    base = rows[rows["method"].map(lambda m: same_method(m, o.baseline_method)) & (rows["arm"] == rows["baseline"])]
    target = rows[rows["method"].map(lambda m: same_method(m, o.target_method)) & rows["baseline"].isin(base["arm"])]
    if base.empty or target.empty:
        return None
    b, t = base.iloc[0], target.iloc[0]
    backend = str(t.get("backend") or "")
    return {"baseline": str(b["arm"]), "target": str(t["arm"]), "rollout_baseline_s": float(b["rollout_s"]),
            "rollout_target_s": float(t["rollout_s"]), "e2e_baseline_s": float(b["e2e_s"]),
            "e2e_target_s": float(t["e2e_s"]), "e2e_speedup": float(t.get("e2e_ratio", math.nan)),
            "e2e_speedup_lo": float(t.get("e2e_lo", math.nan)), "e2e_speedup_hi": float(t.get("e2e_hi", math.nan)),
            "backend": backend if backend not in ("", "-", "nan") else "", "block": True}


def _table5_bars(ax, tables: Tables, timing_table: pd.DataFrame | None, labels: dict[str, str], runs: pd.DataFrame,
                 plotted: list, block_row: dict | None = None) -> None:
    row = block_row
    ax.set_title("Table 5: s / iteration, timed alone" if row is not None else
                 "Table 5: s / iteration, during training", fontsize=9)
    if row is None and timing_table is not None and not timing_table.empty and "target" in timing_table:
        target = main_arm(tables, runs, tables.options.target_method)
        rows = timing_table[timing_table["target"] == target] if target else timing_table.iloc[:0]
        row = rows.iloc[0] if len(rows) else None
    needed = ("rollout_baseline_s", "rollout_target_s", "e2e_baseline_s", "e2e_target_s")
    if row is None or any(k not in row or not math.isfinite(float(row[k])) for k in needed):
        ax.text(0.5, 0.5, "not measured by these runs", ha="center", va="center", fontsize=9, transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    names = [str(row["baseline"]), str(row["target"])]
    if row.get("block"):  # the block names its arms by method key: the training runs' main arms carry the labels
        names = [main_arm(tables, runs, m) or m for m in (tables.options.baseline_method, tables.options.target_method)]
    colours = [_METHOD_COLOURS.get(_display(tables, n), "#333333") for n in names]
    rollout = np.array([row["rollout_baseline_s"], row["rollout_target_s"]], dtype=float)
    e2e = np.array([row["e2e_baseline_s"], row["e2e_target_s"]], dtype=float)
    lo = np.array([row.get("e2e_baseline_lo", np.nan), row.get("e2e_target_lo", np.nan)], dtype=float)
    hi = np.array([row.get("e2e_baseline_hi", np.nan), row.get("e2e_target_hi", np.nan)], dtype=float)
    x = np.arange(2)
    ax.bar(x, rollout, color=colours, width=0.6, label="rollout")
    ax.bar(x, e2e - rollout, bottom=rollout, color=colours, alpha=0.45, width=0.6, hatch="//", label="rest")
    if np.isfinite(lo).any():  # per-arm intervals over run seeds (the block's interval is the speedup's)
        err = np.vstack([np.nan_to_num(e2e - lo), np.nan_to_num(hi - e2e)])
        ax.errorbar(x, e2e, yerr=err, fmt="none", ecolor="#222222", capsize=4, linewidth=1)
    for i in x:
        ax.text(i, rollout[i] / 2, "rollout", ha="center", va="center", fontsize=7, color="white")
        ax.text(i, rollout[i] + (e2e[i] - rollout[i]) / 2, "rest", ha="center", va="center", fontsize=7)
    speed = row.get("e2e_speedup", math.nan)
    if math.isfinite(float(speed)):
        text = f"{float(speed):.2f}x E2E" + (f" ({row['backend']})" if row.get("backend") else "")
        if math.isfinite(float(row.get("e2e_speedup_lo", math.nan))):
            text += f"\n[{float(row['e2e_speedup_lo']):.2f}, {float(row['e2e_speedup_hi']):.2f}]"
        ax.annotate(text, (1, np.nanmax([e2e[1], hi[1]])), xytext=(0, 4), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(x, [labels.get(n, n) for n in names], fontsize=8)
    ax.set_ylabel("seconds per iteration (s)")
    ax.set_xlabel("arm (Table 5's baseline and target)")
    top = np.nanmax(np.concatenate([e2e, hi]))
    ax.set_ylim(0, top * 1.3)
    ax.grid(axis="y", alpha=0.3)
    plotted.append(dict(panel="table 5", arm=names, label=[labels.get(n, n) for n in names], rollout_s=rollout.tolist(),
                        e2e_s=e2e.tolist(), e2e_lo=lo.tolist(), e2e_hi=hi.tolist()))


def _display(tables: Tables, arm: str) -> str:
    mine = tables.runs.loc[tables.runs["arm"] == arm, "method_display"]
    return str(mine.iloc[0]) if len(mine) else arm
