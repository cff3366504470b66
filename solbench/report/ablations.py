"""Ablations (the paper's Tables 2 and 3, K and the selection mode) and the Optuna sweep heat map.

Ablations: within one (model, method), the method settings that differ between done runs (explore
steps, candidate pool N, kept K, selection mode, or any other ``method_config`` field) are the axes.
The table has one row per arm (``Tables`` arms: runs whose settings, the number of iterations included,
are all equal; two arms are never pooled), each read at the ablation's horizon (its runs' most common
last evaluation; an arm that ran longer is read there too: equal iterations), mean and t interval over
seeds. For the one-at-a-time view of the paper's tables, each axis is plotted with the other method
settings held at their most common value (the default the ablation varies around).

Sweep heat map: completed Optuna trials (``results/<experiment>/sweep/``) on an N x K grid; a cell
shows the mean objective of its trials and the best trial's cell is marked.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.findings_common import axis_arms, main_arm
from solbench.report.main_results import final_and_base, table_step
from solbench.report.paired import PROMPTS_ONLY_NOTE, fmt_paired, paired_difference
from solbench.report.plotting import SEED_POINTS_UP_TO, method_colour, new_figure, seed_points
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import fmt_ci, mean_ci
from solbench.report.tables import HORIZON, Tables, _fmt_setting, _hashable, method_display

# Paper axes first, under readable names (aliases cover other spellings of the same field).
AXIS_NAMES = {
    "explore_steps": "explore steps", "preview_steps": "explore steps", "n": "candidates N",
    "num_candidates": "candidates N", "k": "kept K", "num_selected": "kept K",
    "selection": "selection mode", "selection_mode": "selection mode",
}
_AXIS_RANK = {name: i for i, name in enumerate(["explore_steps", "preview_steps", "n", "num_candidates", "k",
                                                 "num_selected", "selection", "selection_mode"])}


def _axis_label(column: str) -> str:
    short = column.split(".")[-1]
    return AXIS_NAMES.get(short, short)


def _sort_values(values) -> list:
    try:
        return sorted(values, key=lambda v: float(v))
    except (TypeError, ValueError):
        return sorted(values, key=str)


@report_kind("ablations", title="Ablations (Tables 2, 3; K and selection mode of the public code)", order=60)
def ablations(tables: Tables):
    """Final reward against explore steps, N, K and selection mode (and any other varied method setting)."""
    rewards = tables.eval_rewards()
    done = tables.done_runs
    if not rewards or done.empty:
        return Note("Ablations", "No evaluated done runs.")
    outputs = []
    for (model, method), runs in done.groupby(["model", "method"], sort=True):
        axes = [c for c in tables.setting_columns() if c.startswith("p_method_config.") and c in runs
                and runs[c].map(_hashable).nunique(dropna=False) > 1]
        if not axes:
            continue
        axes.sort(key=lambda c: (_AXIS_RANK.get(c.split(".")[-1], 99), c))
        outputs += _ablation_outputs(tables, model, method, runs, axes, rewards)
    if not outputs:
        return Note("Ablations", "No method setting varies between the done runs of any model and method: "
                    "these results hold no ablation.")
    return outputs


def _ablation_outputs(tables: Tables, model: str, method: str, runs: pd.DataFrame, axes: list[str],
                      rewards: list[str]) -> list:
    """The ablation table (one row per arm: never two settings pooled, the horizon included) and its figure."""
    level = tables.options.ci_level
    headline = rewards[0]
    step = table_step(tables, runs, None, headline)  # the ablation's horizon: its runs' most common last evaluation
    finals = pd.concat([final_and_base(tables, m, step).assign(metric=m) for m in rewards], ignore_index=True)
    data = finals[finals["run_id"].isin(runs["run_id"])]
    default_arm = main_arm(tables, runs, method)
    horizons = runs[HORIZON].map(_hashable).nunique() > 1 if HORIZON in runs else False
    tidy, display, covers = [], [], set()
    for arm in tables.arm_order(runs):
        g = data[data["arm"] == arm]
        if g.empty:
            continue
        run = runs[runs["arm"] == arm].iloc[0]
        row = {_axis_label(c): _hashable(run[c]) for c in axes}
        if horizons:
            row["iterations"] = _hashable(run[HORIZON])
        row["read at step"] = int(g["final_step"].max())
        disp = {k: _fmt_setting(v) for k, v in row.items()}
        for metric in rewards:
            ci = mean_ci(g.loc[g["metric"] == metric, "final"].values, level)
            row.update({f"{metric}_mean": ci.mean, f"{metric}_lo": ci.lo, f"{metric}_hi": ci.hi})
            disp[metric] = fmt_ci(ci)
        paired = (paired_difference(tables, model, headline, arm, default_arm)
                  if default_arm is not None and arm != default_arm else None)
        row.update(arm=arm, vs_default_mean=paired.ci.mean if paired else np.nan,
                   vs_default_lo=paired.ci.lo if paired else np.nan, vs_default_hi=paired.ci.hi if paired else np.nan,
                   vs_default_step=paired.step if paired else np.nan)
        if paired is not None:
            covers.add(paired.ci.covers)
        disp[f"Δ vs default {headline}"] = ("0 (default)" if arm == default_arm else "-" if paired is None else
                                            fmt_paired(paired.ci.mean, paired.ci.lo, paired.ci.hi, paired.ci.covers))
        row["n_seeds"] = int(g["seed"].nunique())
        disp["seeds"] = str(row["n_seeds"])
        tidy.append(row)
        display.append(disp)
    name = method_display(method)
    longer = sorted({r["arm"] for r in tidy if r["read at step"] == step and horizons
                     and (r.get("iterations") or 0) > step}, key=str)
    shorter = sorted({r["arm"] for r in tidy if r["read at step"] < step}, key=str)
    table = Table(f"ablations_{model}_{method}", f"Ablations of {name}, {model}", pd.DataFrame(tidy), (
        "Mirrors the paper's Tables 2 (explore steps), 3 (candidate pool N at K = 24) and the K and selection-mode "
        f"ablations: every arm of {name} in these results, one row each (runs of different settings, the number of "
        "iterations included, are never pooled), its eval rewards at its last evaluation at or before step "
        f"{step} (the ablation's horizon: equal iterations"
        + (f"; {', '.join(longer)} ran longer and is read there" if longer else "")
        + (f"; {', '.join(shorter)} stopped earlier and is read at its end (the Δ column pairs it at the step both "
           "reached)" if shorter else "") + "), mean ± half-width of the "
        f"{level:.0%} t interval over seeds. Paper (FLUX.1, HPSv2): explore steps 2/4/6/8 -> "
        "0.3587/0.3650/0.3686/0.3659; N 24/48/72/96 -> 0.3569/0.3622/0.3663/0.3686."
        + (f" Δ vs default: paired difference in `{headline}` from the default arm ({default_arm}: most seeds, every "
           "method setting at its most common value) on the same eval prompts and eval seeds, runs paired by run "
           f"seed, at the last evaluation both reached, [{level:.0%} interval of the crossed design covering "
           f"{'; '.join(sorted(covers)) or 'nothing'}]"
           + (f" ({PROMPTS_ONLY_NOTE})" if any(c.startswith("eval prompts only") for c in covers) else "") + "."
           if default_arm is not None else "")),
        display=pd.DataFrame(display))
    return [table, _ablation_figure(tables, model, method, name, runs, axes, headline, default_arm)]


def _is_num(v) -> bool:
    try:
        float(v)
        return not isinstance(v, bool)
    except (TypeError, ValueError):
        return False


def _ablation_figure(tables: Tables, model: str, method: str, name: str, runs: pd.DataFrame, axes: list[str],
                     metric: str, default_arm: str | None) -> Figure:
    """One panel per axis: the paired Δ from the default arm (the same intervals as the table's Δ column),
    the other method settings held at their most common value (solbench.report.findings_common.axis_arms)."""
    fig = new_figure(3.6 * len(axes), 3.2)
    panels = fig.subplots(1, len(axes), squeeze=False)[0]
    plotted = []
    for ax, axis in zip(panels, axes):
        arms = axis_arms(tables, runs, method, axis.split(".")[-1])
        held = []
        for other in [a for a in axes if a != axis]:
            mode = runs[other].map(_hashable).value_counts().index[0]
            held.append(f"{_axis_label(other)}={_fmt_setting(mode)}")
        rows = []
        for v, arm in arms.items():
            p = (paired_difference(tables, model, metric, arm, default_arm)
                 if default_arm is not None and arm != default_arm else None)
            mean, lo, hi = (0.0, 0.0, 0.0) if arm == default_arm else (
                (p.ci.mean, p.ci.lo, p.ci.hi) if p is not None else (np.nan, np.nan, np.nan))
            rows.append(dict(axis=_axis_label(axis), value=_fmt_setting(v), arm=arm, delta=mean, lo=lo, hi=hi,
                             default=arm == default_arm, covers=p.ci.covers if p is not None else "",
                             step=p.step if p is not None else np.nan,
                             per_seed=list(p.ci.per_seed) if p is not None else []))
        r = pd.DataFrame(rows, columns=["axis", "value", "arm", "delta", "lo", "hi", "default", "covers", "step",
                                        "per_seed"])
        x = np.arange(len(r))
        err = np.vstack([(r["delta"] - r["lo"]).fillna(0).clip(lower=0), (r["hi"] - r["delta"]).fillna(0).clip(lower=0)])
        numeric = all(_is_num(v) for v in arms)
        ax.axhline(0.0, color="black", linewidth=0.8, linestyle=":")
        colour = method_colour(method)
        ax.errorbar(x, r["delta"], yerr=err, marker="none", capsize=3, color=colour, linestyle="-" if numeric else "none")
        prompts_only = r["covers"].astype(str).str.startswith("eval prompts only").to_numpy()
        ax.plot(x[~prompts_only], r["delta"][~prompts_only], "o", color=colour)  # crossed interval: filled
        ax.plot(x[prompts_only], r["delta"][prompts_only], "o", markerfacecolor="white", color=colour)
        for xi, seeds in zip(x, r["per_seed"]):  # each run seed's own paired difference, where the seeds are few
            if 0 < len(seeds) <= SEED_POINTS_UP_TO:
                seed_points(ax, [xi - 0.12] * len(seeds), seeds, colour)
        for xi, (delta, is_default) in enumerate(zip(r["delta"], r["default"])):
            # beside the point, right of its error bar, never on it
            ax.annotate("default" if is_default else f"{delta:+.3f}", (xi, delta), textcoords="offset points",
                        xytext=(6, 0), ha="left", va="center", fontsize=7,
                        bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
        ax.set_xticks(x, list(r["value"]), fontsize=8)
        ax.set_xlim(-0.5, max(len(r), 1) - 0.3)
        ax.set_xlabel(_axis_label(axis) + (f"\n({', '.join(held)})" if held else ""), fontsize=8)
        at = sorted({int(v) for v in r["step"].dropna()})
        ax.set_ylabel(f"Δ {metric} vs default, paired" + (f"\n(step {', '.join(map(str, at))})" if at else ""),
                      fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        plotted.append(r)
    import textwrap

    title = f"{name} ablations, {model}: paired Δ {metric} from the default arm at equal iterations"
    fig.suptitle(textwrap.fill(title, max(30, int(3.6 * len(axes) * 11))), fontsize=10)  # never wider than the figure
    return Figure(f"ablations_{model}_{method}_chart", f"Ablations of {name}, {model}: one setting at a time", fig, (
        f"Paired difference in `{metric}` of each setting from the default arm ({default_arm}) at the last evaluation "
        "both reached (equal iterations), the other method settings held at their most common value (named under each "
        "axis), as in the paper's one-at-a-time Tables 2 and 3; bars: the interval of the table's Δ column, so the "
        f"chart and the verdicts rest on the same comparison; dots left of a point: each run seed's own paired "
        f"difference where there are {SEED_POINTS_UP_TO} seeds or fewer. "
        + _covers_caption(pd.concat(plotted, ignore_index=True))),
        data=pd.concat(plotted, ignore_index=True).drop(columns="per_seed"))


def _covers_caption(data: pd.DataFrame) -> str:
    """What each of the chart's intervals covers, arm by arm where they differ: the caption never says "crossed
    design" for an interval over the eval prompts only (fewer than three run seeds; issue 48)."""
    covers = data.dropna(subset=["lo"]).drop_duplicates("arm")
    covers = covers[covers["covers"].astype(str) != ""]
    kinds = {}
    for arm, text in zip(covers["arm"], covers["covers"].astype(str)):
        kinds.setdefault(text, []).append(arm)
    if not kinds:
        return ""
    if len(kinds) == 1:
        text = next(iter(kinds))
        return f"Every interval covers {text}" + (" (hollow points)." if text.startswith("eval prompts only") else ".")
    return "Intervals: " + "; ".join(
        f"{text}{' (hollow points)' if text.startswith('eval prompts only') else ''}: {', '.join(arms)}"
        for text, arms in kinds.items()) + "."


def _find(columns, names) -> str | None:
    for name in names:
        if name in columns:
            return name
    return None


@report_kind("sweep_heatmap", title="Sweep (N x K heat map)", order=65)
def sweep_heatmap(tables: Tables):
    """The sweep's cells on an N x K heat map: each cell's mean over its run seeds and eval prompts with its
    interval, the best set boxed."""
    trials = tables.trials
    if trials is None or trials.empty:
        return Note("Sweep", "No sweep in these results (results/<experiment>/sweep/ holds no trials).")
    n_col = _find(trials.columns, ["n", "num_candidates", "method_config.n", "p_method_config.n"])
    k_col = _find(trials.columns, ["k", "num_selected", "method_config.k", "p_method_config.k"])
    if n_col is None or k_col is None:
        params = [c for c in trials.columns if c not in ("number", "value", "state", "study", "direction", "datetime_start",
                                                         "datetime_complete", "duration", "run_id")]
        return Table("sweep_trials", "Sweep trials", trials, f"Sweep parameters {params} have no N and K axes to map; "
                     "the trials are listed instead.")
    from solbench.report.plotting import SMALL, style_axes
    from solbench.report.sweep_cells import best_set_line, sweep_cells

    maximize = tables.trials_direction != "minimize"
    set_cells, info = sweep_cells(tables)
    cells = set_cells.rename(columns={n_col: "n", k_col: "k"})
    value = "mean" if maximize else "value"
    ns, ks = _sort_values(cells["n"].unique()), _sort_values(cells["k"].unique())
    grid = np.full((len(ks), len(ns)), np.nan)
    for _, c in cells.iterrows():
        grid[ks.index(c["k"]), ns.index(c["n"])] = c[value]
    fig = new_figure(1.9 + 1.25 * len(ns), 1.5 + 0.8 * len(ks))
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap="viridis" if maximize else "viridis_r", aspect="auto")
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0
    for _, c in cells.iterrows():
        i, j = ks.index(c["k"]), ns.index(c["n"])
        v = c[value]
        band = f"\n[{c['lo']:.3f}, {c['hi']:.3f}]" if math.isfinite(c.get("lo", math.nan)) else ""
        ax.text(j, i, f"{v:.3f}{band}\n{int(c['runs'])} runs", ha="center", va="center", fontsize=SMALL,
                color="white" if (v < mid) == maximize else "black")
        if c["in_best_set"]:  # every cell within noise of the top gets a box; a star only on a separable best
            ax.add_patch(_rect(j, i))
            if info.get("decided"):
                ax.plot([j], [i + 0.38], marker="*", markersize=10, color="red")
    ax.set_xticks(range(len(ns)), [_fmt_setting(v) for v in ns])  # 16, never "16.0"
    ax.set_yticks(range(len(ks)), [_fmt_setting(v) for v in ks])
    style_axes(ax, "candidates N", "kept K")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label=f"final {info.get('metric', 'objective')} (cell mean)" if maximize else
                 "objective (cell mean)")
    chosen = cells[cells["in_best_set"]]
    top_cell = cells.loc[cells[value].idxmax() if maximize else cells[value].idxmin()]
    ax.set_title(f"best: {chosen['label'].iloc[0]}" if info.get("decided") else
                 f"{len(chosen)} of {len(cells)} cells within noise of the top (boxed)" if info.get("intervals") else
                 f"top N={_fmt_setting(top_cell['n'])}, K={_fmt_setting(top_cell['k'])}: {top_cell[value]:.4f}, no "
                 "interval (not judged)", fontsize=9)
    data = cells[["n", "k", value, "lo", "hi", "runs", "trials", "in_best_set"]].rename(columns={value: "mean"}) \
        if "lo" in cells else cells
    top = trials.sort_values("value", ascending=not maximize).head(10)
    keep = [c for c in ["number", n_col, k_col, "value", "seed_values"] if c in top]
    top_display = top[keep].reset_index(drop=True).astype(object)
    for col in keep[1:3]:
        if pd.api.types.is_numeric_dtype(top[col]) and (top[col].dropna() % 1 == 0).all():
            top_display[col] = top[col].map(lambda v: str(int(v)) if pd.notna(v) else "-").values
    return [
        Figure("sweep_heatmap", "Sweep: objective on the N x K grid", fig, (
            f"Optuna sweep ({len(trials)} completed trials, direction {tables.trials_direction}). Cell: the mean over "
            f"its runs (run seeds) and eval prompts with its {tables.options.ci_level:.0%} crossed interval (run "
            "seeds crossed with eval prompts), its run count below; empty cells were not sampled. Boxes: the best "
            "set (cells not below the top by Holm-adjusted paired tests; section 'Sweep: intervals, best set'); a "
            f"star only when one cell is separable from all others. {best_set_line(set_cells, info)}."), data=data),
        Table("sweep_top_trials", "Sweep: best trials", top[keep].reset_index(drop=True),
              f"The {len(top)} best completed trials by objective ({tables.trials_direction}); a trial's value is the "
              "mean of its run seeds' values (seed_values).", display=top_display),
    ]


def _rect(x: int, y: int):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2)
