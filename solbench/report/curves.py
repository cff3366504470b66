"""Learning curves and convergence speedup (the paper's reward-vs-time figures and its 4.64x claim).

Learning curves: every eval reward (and the training reward) against iteration, against wall-clock
training seconds (``wall_s``: cumulative, evaluation excluded) and, for GPU runs, against GPU-hours
(wall_s x GPUs per run / 3600). At each step an arm shows the mean over its seeds with a t band; the
wall-clock of a step is the mean of its seeds' wall_s.

Convergence speedup, per eval reward: the target is the reference method's final score (mean over
its seeds at its last evaluation). Each arm's mean curve (mean value and mean wall_s per eval step)
reaches the target at the first crossing, linearly interpolated in wall-clock between the two
evaluations around it. Speedup = reference time / arm time (the paper's "4.64x faster to reach
DiffusionNFT's final ImageReward"). Its interval is a bootstrap over seeds, resampling the reference's
seeds (which moves the target too) and the arm's seeds independently; a resample that never reaches
the target counts as speedup 0. Rewards are taken as higher-is-better.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.clock import clock_at, describe, hardware
from solbench.report.plotting import (NORMAL, SEED_POINTS_UP_TO, TITLE, SMALL, arm_labels, arm_styles, clip,
                                      headline_order, int_ticks, legend_below, new_figure, seed_points, style_axes)
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import bootstrap_ci, fmt_num, mean_ci
from solbench.report.tables import Tables, method_display, same_method


def run_curves(tables: Tables, split: str, metric: str) -> pd.DataFrame:
    """Each run's own curve of one metric: its rows with the GPU-hours and the PROJECTED clock beside wall_s."""
    rows = tables.run_metrics(split, metric)
    if rows.empty:
        return pd.DataFrame()
    gpus = _gpus_per_run(tables)
    return rows.assign(gpu_hours=rows["run_id"].map(gpus) * rows["wall_s"] / 3600.0, projected_s=clock_at(tables, rows))


def curve_table(tables: Tables, split: str, metric: str, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean and CI over seeds per (model, arm, step), with the mean wall_s and GPU-hours."""
    rows = run_curves(tables, split, metric) if rows is None else rows
    if rows.empty:
        return pd.DataFrame()
    out = []
    level = tables.options.ci_level
    for (model, arm, method, step), g in rows.groupby(["model", "arm", "method", "step"], sort=True):
        ci = mean_ci(g["value"].values, level)
        out.append(dict(model=model, arm=arm, method=method, step=int(step), mean=ci.mean, ci_lo=ci.lo, ci_hi=ci.hi,
                        n_seeds=ci.n, wall_s=float(g["wall_s"].mean()), gpu_hours=float(g["gpu_hours"].mean()),
                        projected_s=float(g["projected_s"].mean())))
    return pd.DataFrame(out)


def _gpus_per_run(tables: Tables) -> pd.Series:
    """GPUs per run where the runs ran on GPUs (device column 'cuda'); NaN elsewhere (CPU, unknown)."""
    runs = tables.runs.set_index("run_id")
    gpus = pd.Series(np.nan, index=runs.index)
    if "device" in runs:
        on_gpu = runs["device"].astype(str).str.lower().str.startswith("cuda")
        world = pd.to_numeric(runs.get("p_world_size", pd.Series(1, index=runs.index)), errors="coerce").fillna(1)
        gpus[on_gpu] = world[on_gpu]
    return gpus


def _time_axis(seconds_max: float) -> tuple[float, str]:
    if seconds_max < 600:
        return 1.0, "seconds"
    if seconds_max < 3 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


def _projected_axis(seconds_max: float) -> tuple[float, str]:
    if not np.isfinite(seconds_max) or seconds_max <= 0:
        return 1.0, "s"
    for scale, unit in ((1e-6, "µs"), (1e-3, "ms"), (1.0, "s"), (60.0, "min"), (3600.0, "h")):
        if seconds_max < 1000 * scale:
            return scale, unit
    return 3600.0, "h"


def _metrics(tables: Tables) -> list[tuple[str, str]]:
    out = [("eval", m) for m in tables.eval_rewards()]
    if ((tables.metrics["split"] == "train") & (tables.metrics["metric"] == "reward")).any():
        out.append(("train", "reward"))
    return out


@report_kind("learning_curves", title="Learning curves", order=30)
def learning_curves(tables: Tables):
    """Each metric against iteration, wall-clock and GPU-hours: mean and CI band over seeds."""
    metrics = _metrics(tables)
    if not metrics:
        return Note("Learning curves", "No eval or training reward rows in metrics.parquet.")
    raw = {(s, m): run_curves(tables, s, m) for s, m in metrics}
    curves = {key: curve_table(tables, *key, rows=rows) for key, rows in raw.items()}
    outputs = []
    level = tables.options.ci_level
    for model in tables.models():
        per = {k: c[c["model"] == model] for k, c in curves.items() if not c.empty}
        per = {k: c for k, c in per.items() if not c.empty}
        if not per:
            continue
        has_gpu = any(c["gpu_hours"].notna().any() for c in per.values())
        xs = [("step", "iteration", 1.0)]
        wall_max = max(c["wall_s"].max() for c in per.values())
        scale, unit = _time_axis(wall_max if math.isfinite(wall_max) else 1.0)
        xs.append(("wall_s", f"wall-clock training time ({unit})", scale))
        if has_gpu:
            xs.append(("gpu_hours", "GPU-hours", 1.0))
        has_projection = any(c["projected_s"].notna().any() for c in per.values())
        if has_projection:
            proj_max = max(c["projected_s"].max() for c in per.values())
            pscale, punit = _projected_axis(proj_max)
            xs.append(("projected_s", f"PROJECTED {hardware(tables).name} time ({punit})", pscale))
        runs = tables.done_runs[tables.done_runs["model"] == model]
        heads = headline_order(tables, runs)
        styles = arm_styles(tables.arm_order(runs), dict(zip(runs["arm"], runs["method"])), set(heads))
        labels = arm_labels(tables, tables.arm_order(runs))
        fig = new_figure(4.0 * len(xs) + 0.6, 2.6 * len(per) + 0.9)
        axes = fig.subplots(len(per), len(xs), squeeze=False)
        for r, ((split, metric), c) in enumerate(per.items()):
            for col, (xcol, xlabel, xscale) in enumerate(xs):
                ax = axes[r][col]
                for arm in heads:
                    _draw_arm(ax, c, raw[(split, metric)], model, arm, xcol, xscale, styles[arm], labels[arm])
                style_axes(ax, xlabel, f"{clip(metric)} ({split})",
                           title=f"against {xlabel.split(' (')[0]}" if r == 0 else None)
                if xcol == "step":
                    int_ticks(ax)
        legend_below(fig, *axes[0][0].get_legend_handles_labels())
        fig.suptitle(f"{clip(model)}: learning curves of each method's headline arm (mean over seeds; dots: each "
                     f"seed where an arm has {SEED_POINTS_UP_TO} or fewer)", fontsize=TITLE)
        data = pd.concat([c.assign(split=s, metric=m) for (s, m), c in per.items()], ignore_index=True)
        n_seeds = sorted(data["n_seeds"].unique())
        outputs.append(Figure(f"learning_curves_{model}", f"Learning curves, {model}", fig, (
            f"Model `{model}`. One row per metric (eval rewards on the eval prompts; `reward (train)` is the mean "
            "full-precision reward of the trained samples), one column per x axis. One line per method, its headline "
            "arm (the one the Findings compare: most seeds, settings at their defaults), in the method's own colour; "
            "every further arm is in the small multiples below, against its method's headline arm. Thick lines: mean "
            f"over seeds ({'/'.join(map(str, n_seeds))} seeds per point); an arm with {SEED_POINTS_UP_TO} seeds or "
            f"fewer shows each seed's own values as dots (a {level:.0%} t band over so few seeds would cover most of "
            f"the axis); with more, the band. Wall-clock: "
            "cumulative training seconds (evaluation excluded), averaged over seeds at each step."
            + ("" if has_gpu else " GPU-hours are not shown: these runs did not run on GPUs.")
            + (f" Last column, {describe(tables)} Mean over seeds at each step." if has_projection else
               " No projected GPU clock: the timings carry no FLOP counts.")), data=data))
        further = _arm_panels(tables, model, runs, heads, per, raw, styles, labels)
        if further is not None:
            outputs.append(further)
    return outputs


#: An arm with fewer seeds than this gets no t band in the convergence data (with 2 seeds the 95 % t band has one
#: degree of freedom: 12.7 standard errors wide, issue 42); the charts draw bands only above SEED_POINTS_UP_TO seeds.
MIN_SEEDS_FOR_BAND = 3


def _draw_arm(ax, c: pd.DataFrame, raw: pd.DataFrame, model: str, arm: str, xcol: str, xscale: float, style: dict,
              label: str) -> None:
    """One arm's mean curve; each seed's own values as dots with SEED_POINTS_UP_TO seeds or fewer, else its band."""
    a = c[c["arm"] == arm].sort_values("step")
    if a.empty:
        return
    x = a[xcol].values / xscale
    ax.plot(x, a["mean"].values, markersize=3, label=label, **style)
    if int(a["n_seeds"].max()) <= SEED_POINTS_UP_TO:
        _seed_points(ax, raw, model, arm, xcol, xscale, style)
    elif a["ci_lo"].notna().any():
        ax.fill_between(x, a["ci_lo"].values, a["ci_hi"].values, color=style["color"], alpha=0.15, linewidth=0)


def _seed_points(ax, raw: pd.DataFrame, model: str, arm: str, xcol: str, xscale: float, style: dict) -> None:
    runs = raw[(raw["model"] == model) & (raw["arm"] == arm)]
    for _, run in runs.groupby("run_id", sort=True):
        run = run.groupby("step", as_index=False)[["value", xcol]].mean().sort_values("step")
        seed_points(ax, run[xcol].values / xscale, run["value"].values, style["color"])


def _arm_panels(tables: Tables, model: str, runs: pd.DataFrame, heads: list[str], per: dict, raw: dict,
                styles: dict, labels: dict) -> Figure | None:
    """Small multiples: one panel per further arm (ablations, other horizons and explore copies) on the first eval
    reward against iteration, beside its method's headline arm in grey."""
    key = next(iter(per))
    c = per[key]
    head_of = {runs.loc[runs["arm"] == h, "method"].iloc[0]: h for h in heads}
    further = [a for a in tables.arm_order(runs) if a not in heads and a in set(c["arm"])]
    if not further:
        return None
    ncols = min(4, len(further))
    nrows = -(-len(further) // ncols)
    fig = new_figure(2.9 * ncols + 0.6, 2.25 * nrows + 1.0)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    split, metric = key
    for i, arm in enumerate(further):
        ax = axes[i // ncols][i % ncols]
        head = head_of.get(runs.loc[runs["arm"] == arm, "method"].iloc[0])
        if head is not None:
            h = c[c["arm"] == head].sort_values("step")
            ax.plot(h["step"], h["mean"], color="#9a9a9a", linestyle="--", linewidth=1.4,
                    label="its method's headline arm")
        style = {**styles[arm], "linestyle": "-", "linewidth": 1.8}
        _draw_arm(ax, c, raw[key], model, arm, "step", 1.0, style, "this arm (its method's colour)")
        ax.set_title(labels[arm], fontsize=NORMAL)
        ax.tick_params(labelsize=SMALL)
        ax.grid(alpha=0.3)
        int_ticks(ax)
    for j in range(len(further), nrows * ncols):
        axes[j // ncols][j % ncols].remove()
    for i in range(len(further)):
        if i + ncols >= len(further):  # the lowest panel of its column names the x axis
            axes[i // ncols][i % ncols].set_xlabel("iteration", fontsize=NORMAL)
    fig.supylabel(f"{clip(metric)} ({split}), mean over seeds", fontsize=NORMAL)
    legend_below(fig, *axes[0][0].get_legend_handles_labels(), ncols=2)
    fig.suptitle(f"{clip(model)}: every further arm against its method's headline arm", fontsize=TITLE)
    data = c[c["arm"].isin(further + heads)].assign(split=split, metric=metric)
    return Figure(f"learning_curves_{model}_arms", f"Learning curves of the further arms, {model}", fig, (
        f"One panel per arm that is not its method's headline arm (ablations, other horizons, other explore copies), "
        f"titled by its short label (the arm table maps it to its settings): `{metric}` ({split}) against iteration, "
        f"mean over its run seeds in its method's colour, each seed's own values as dots where it has "
        f"{SEED_POINTS_UP_TO} seeds or fewer; grey dashes: the headline arm of the same method. Shared y axis."),
        data=data)


def _reaches(value: float, target: float) -> bool:
    """``value`` >= ``target`` up to float rounding: a mean of the same scores summed in another order (the
    base model's step-0 score, the target when the reference did not improve on it) differs from it in the last
    bits, and a strict comparison then "reached" it 1e-14 s after the start, a speedup of 1e15x (issue 42)."""
    return value >= target - 1e-9 * max(1.0, abs(target))


def time_to_reach(wall: np.ndarray, value: np.ndarray, target: float) -> float:
    """Wall-clock at which the curve first reaches ``target`` (linear between points); inf if never."""
    for i in range(len(value)):
        if _reaches(value[i], target):
            if i == 0:
                return float(wall[0])
            v0, v1, w0, w1 = value[i - 1], value[i], wall[i - 1], wall[i]
            return float(w0 + (target - v0) / (v1 - v0) * (w1 - w0)) if v1 != v0 else float(w1)
    return math.inf


def _speedup(ref_value: np.ndarray, ref_wall: np.ndarray, value: np.ndarray, wall: np.ndarray) -> float:
    """Reference time to its own final mean score / this curve's time to the same score (0: never)."""
    target = ref_value[-1]
    t_ref = time_to_reach(ref_wall, ref_value, target)
    t_arm = time_to_reach(wall, value, target)
    if t_arm == 0:
        return 1.0 if t_ref == 0 else math.inf
    return t_ref / t_arm


def _curves(m: pd.DataFrame, runs: pd.DataFrame, arm: str, xcol: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, x) matrices, evaluation steps x runs of one arm (steps every run of it reached)."""
    cols = list(runs.loc[runs["arm"] == arm, "run_id"])
    a = m[m["run_id"].isin(cols)]
    if a.empty or a[xcol].isna().all():
        return np.empty((0, 0)), np.empty((0, 0))
    pv = a.pivot_table(index="step", columns="run_id", values="value").reindex(columns=cols).dropna(axis=1, how="all")
    px = a.pivot_table(index="step", columns="run_id", values=xcol).reindex(columns=pv.columns)
    keep = pv.notna().all(axis=1) & px.notna().all(axis=1)
    return pv[keep].to_numpy(float), px[keep].to_numpy(float)


def convergence_speedup(tables: Tables, m: pd.DataFrame, runs: pd.DataFrame, arm: str, ref_arm: str,
                        xcol: str) -> dict | None:
    """Speedup of ``arm`` over ``ref_arm`` to reach the reference's final mean score, on the clock ``xcol``
    (``wall_s`` measured, ``projected_s`` PROJECTION), with the bootstrap over both arms' seeds."""
    opts = tables.options
    ref_v, ref_x = _curves(m, runs, ref_arm, xcol)
    arm_v, arm_x = _curves(m, runs, arm, xcol)
    if ref_v.size == 0 or arm_v.size == 0:
        return None
    rv, rx = ref_v.mean(axis=1), ref_x.mean(axis=1)
    av, ax = arm_v.mean(axis=1), arm_x.mean(axis=1)
    target = float(rv[-1])
    point = _speedup(rv, rx, av, ax)
    lo = hi = math.nan
    if arm != ref_arm:
        def stat(ri, ai):
            return _speedup(ref_v[:, ri].mean(axis=1), ref_x[:, ri].mean(axis=1),
                            arm_v[:, ai].mean(axis=1), arm_x[:, ai].mean(axis=1))

        lo, hi = bootstrap_ci([np.arange(ref_v.shape[1]), np.arange(arm_v.shape[1])], stat,
                              n_boot=opts.n_boot, level=opts.ci_level, seed=opts.boot_seed)
    level = tables.options.ci_level
    band = np.array([[mean_ci(row, level).lo, mean_ci(row, level).hi] for row in arm_v])
    if arm_v.shape[1] < MIN_SEEDS_FOR_BAND:  # a t band over 1 degree of freedom covers the chart (as in the curves)
        band = np.full_like(band, np.nan)
    return dict(target=target, reference_time_s=time_to_reach(rx, rv, target),
                time_to_target_s=time_to_reach(ax, av, target), start=float(av[0]),
                reached_at_start=bool(_reaches(av[0], target)), final=float(av[-1]), speedup=point, speedup_lo=lo,
                speedup_hi=hi, n_seeds=arm_v.shape[1],
                n_seeds_reference=ref_v.shape[1], curve=(ax, av, band))


#: Speedup bounds above this print as "> MAX": a resample whose crossing lands near the start of training gives an
#: arbitrarily large ratio, and its digits carry nothing.
MAX_RATIO = 100.0


def fmt_ratio_bound(x: float) -> str:
    """A speedup bound: '∞' where it is infinite (one spelling in every table: issue 48), '>100' where it is finite
    but carries no digits worth printing."""
    if x == math.inf:
        return "∞"
    return f"{x:.2f}" if x <= MAX_RATIO else f">{MAX_RATIO:g}"


def uninformative(lo: float, hi: float) -> bool:
    """A speedup interval from 0 (resamples that never reach the target) to unbounded (resamples that reach it at
    the start): every speedup is inside it, it carries no information."""
    return lo == 0 and (hi == math.inf or hi > MAX_RATIO)


def fmt_speedup_cell(r: dict | pd.Series, unit: str = "s", scale: float = 1.0) -> str:
    """'2.10x [1.30, 3.05] (12.3 s)'; a crossing without an interval is printed as inconclusive. The time is
    divided by ``scale`` (1e-3 with unit "ms ...")."""
    if r.get("reference_time_s", math.nan) == 0:  # every arm's ratio would be 0 / t: nothing to converge to
        return "no target: the reference's final score is met at its own first evaluation"
    if not math.isfinite(r["time_to_target_s"]):
        return f"not reached (final {fmt_num(r['final'])})"
    if r.get("reached_at_start", False):  # no training time was needed: a ratio to 0 s is no speedup
        return f"met at its first evaluation (its score there {fmt_num(r['start'])}): no speedup to measure"
    time = f"{r['time_to_target_s'] / scale:.4g} {unit}"
    if not (math.isnan(r["speedup_lo"]) or math.isnan(r["speedup_hi"])):
        if uninformative(r["speedup_lo"], r["speedup_hi"]):
            return (f"{r['speedup']:.2f}x, no informative interval (resamples range from never reaching the target to "
                    f"reaching it at once), inconclusive ({time})")
        hi = r["speedup_hi"]
        close = ")" if hi == math.inf else "]"
        return f"{r['speedup']:.2f}x [{fmt_ratio_bound(r['speedup_lo'])}, {fmt_ratio_bound(hi)}{close} ({time})"
    return f"{r['speedup']:.2f}x, single-curve crossing: no interval, inconclusive ({time})"


def _target_text(tidy: pd.DataFrame, metric: str, target: float, ref_arm: str) -> str:
    """'shapes_geneval 0.3824', or, where the reference's final score is met at its own first evaluation (it did not
    improve on the base model), that there is no target on this reward."""
    ref = tidy[(tidy["metric"] == metric) & (tidy["arm"] == ref_arm)]
    if len(ref) and ref["reference_time_s"].iloc[0] == 0:
        return (f"{metric}: no target ({ref_arm}'s final score {fmt_num(target)} is at or below its base score: it "
                "did not improve, so there is nothing to converge to)")
    return f"{metric} {fmt_num(target)}"


@report_kind("convergence", title="Convergence speedup", order=40)
def convergence(tables: Tables):
    """Time to reach the reference method's final reward (measured and PROJECTED clock), speedups with CIs."""
    opts = tables.options
    rewards = tables.eval_rewards()
    done = tables.done_runs
    if not rewards:
        return Note("Convergence", "No evaluation rows: no convergence speedup.")
    outputs = []
    for model in tables.models():
        runs = done[done["model"] == model]
        ref_arms = [a for a in tables.arm_order(runs)
                    if same_method(runs.loc[runs["arm"] == a, "method"].iloc[0], opts.reference_method)]
        if not ref_arms:
            outputs.append(Note(f"Convergence, {model}", f"No done run of the reference method "
                                f"`{opts.reference_method}` ({method_display(opts.reference_method)}) for model `{model}`."))
            continue
        ref_arm = ref_arms[0]
        for xcol, label in (("wall_s", "measured wall-clock"), ("projected_s", "PROJECTED GPU clock")):
            rows, plot_data = [], {}
            for metric in rewards:
                m = tables.run_metrics("eval", metric)
                m = m[m["model"] == model].copy()
                if xcol == "projected_s":
                    m["projected_s"] = clock_at(tables, m)
                for arm in tables.arm_order(runs):
                    r = convergence_speedup(tables, m, runs, arm, ref_arm, xcol)
                    if r is None:
                        continue
                    curve = r.pop("curve")
                    rows.append(dict(model=model, clock=xcol, metric=metric, arm=arm, reference=ref_arm, **r))
                    plot_data.setdefault(metric, (r["target"], {}))[1][arm] = (*curve, r["time_to_target_s"])
            if not rows:
                continue
            tidy = pd.DataFrame(rows)
            unit, scale = ("s", 1.0) if xcol == "wall_s" else (f"ms on {hardware(tables).name}", 1e-3)
            display = []
            for arm in dict.fromkeys(tidy["arm"]):
                row = {"method": arm}
                for metric in rewards:
                    r = tidy[(tidy["arm"] == arm) & (tidy["metric"] == metric)]
                    row[metric] = "-" if r.empty else ("1 (reference)" if arm == ref_arm else fmt_speedup_cell(r.iloc[0], unit, scale))
                row["seeds"] = str(int(tidy.loc[tidy["arm"] == arm, "n_seeds"].iloc[0]))
                display.append(row)
            targets = ", ".join(_target_text(tidy, m_, plot_data[m_][0], ref_arm) for m_ in plot_data)
            projected = xcol == "projected_s"
            clock_text = (describe(tables) if projected else
                          "Clock: measured cumulative training seconds (evaluation excluded) of these runs.")
            outputs.append(Table(f"convergence_{model}" + ("_projected" if projected else ""),
                                 f"Convergence speedup vs {ref_arm}, {model}, {label}" +
                                 (" (PROJECTION, not measured)" if projected else ""), tidy, (
                f"The paper's convergence claim (4.64x on SD3.5-L, 3.00x on FLUX to reach DiffusionNFT's final "
                f"ImageReward). Model `{model}`. Target per metric: {ref_arm}'s final eval score, mean over its seeds "
                f"({targets}). Cell: speedup = reference time to reach the target / this method's time (mean curves "
                f"over seeds, linear interpolation between evaluations), [{opts.ci_level:.0%} bootstrap interval "
                f"resampling each arm's run seeds, {opts.n_boot} resamples; a resample that never reaches the target "
                "counts as 0], and the method's time to the target. With one run seed in an arm there is no interval: "
                "the single-curve crossing is printed but marked inconclusive, not a result. 'not reached': the mean "
                f"curve never reaches the target within the run. {clock_text}"), display=pd.DataFrame(display)))
            outputs.append(_convergence_figure(tables, model, runs, plot_data, ref_arm, xcol))
    return outputs


def _convergence_figure(tables: Tables, model: str, runs: pd.DataFrame, plot_data: dict, ref_arm: str,
                        xcol: str = "wall_s") -> Figure:
    metrics = list(plot_data)
    heads = headline_order(tables, runs)
    styles = arm_styles(tables.arm_order(runs), dict(zip(runs["arm"], runs["method"])), set(heads))
    labels = arm_labels(tables, heads)
    wall_max = max((np.max(aw) for _, arms_d in plot_data.values() for aw, *_ in arms_d.values()), default=1.0)
    projected = xcol == "projected_s"
    scale, unit = _projected_axis(wall_max) if projected else _time_axis(wall_max)
    xlabel = (f"PROJECTED {hardware(tables).name} time ({unit})" if projected
              else f"wall-clock training time ({unit})")
    fig = new_figure(4.3 * len(metrics) + 0.6, 3.9)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        target, arms_d = plot_data[metric]
        ax.axhline(target, color="black", linewidth=0.9, linestyle=":")
        for arm in heads:
            if arm not in arms_d:
                continue
            aw, av, band, t_arm = arms_d[arm]
            ax.plot(aw / scale, av, markersize=2.5, label=labels[arm], **styles[arm])
            if len(runs.loc[runs["arm"] == arm, "seed"].unique()) > SEED_POINTS_UP_TO and np.isfinite(band).any():
                ax.fill_between(aw / scale, band[:, 0], band[:, 1], color=styles[arm]["color"], alpha=0.12, linewidth=0)
            if math.isfinite(t_arm):
                ax.plot([t_arm / scale], [target], marker="x", markersize=8, color=styles[arm]["color"], zorder=5)
        style_axes(ax, xlabel, f"{clip(metric)} (eval, mean over seeds)",
                   title=f"dotted: the target, {clip(ref_arm, 30)}'s final {fmt_num(target)}")
    legend_below(fig, *axes[0].get_legend_handles_labels())
    fig.suptitle(f"{clip(model)}: time to reach {clip(ref_arm, 40)}'s final score (x marks the crossing)"
                 + (" - PROJECTION" if projected else ""), fontsize=TITLE)
    return Figure(f"convergence_{model}" + ("_projected" if projected else "") + "_chart",
                  f"Time to target, {model}" + (" (PROJECTED clock)" if projected else ""), fig, (
        f"Mean eval curves over seeds against {xlabel} of each method's headline arm (the table above has every arm), "
        f"in the method's own colour; bands: {tables.options.ci_level:.0%} t interval over seeds at each evaluation, "
        f"drawn only for arms of more than {SEED_POINTS_UP_TO} seeds (over fewer it would cover the axis); "
        f"dotted line: {ref_arm}'s final score, the target; "
        "x: where each method first reaches it (the times in the table above)."
        + (f" {describe(tables)}" if projected else "")))
