"""Reward hacking: objects beyond what the prompt asks, per method and evaluation step.

The shapes rewards score non-counting prompts ("a green circle", "a red square left of a blue circle") as
"at least" the objects asked for, so a policy that draws extra objects loses nothing on them. The trainer
stores, per eval sample, the detector's count of objects beyond the prompt's (split ``eval_check``, metric
``extra_objects``, with ``prompt_id``, ``eval_seed`` and ``skill``). Per run and step the mean over its eval
samples; per arm the mean over seeds with a t interval, and the share of images with any extra object. A
count that rises while the training reward rises is the policy drawing more than it was asked: reward
hacking the training reward cannot see. Reads stored results only.
"""

from __future__ import annotations

import pandas as pd

from solbench.report.plotting import (SEED_POINTS_UP_TO, arm_labels, arm_styles, clip, headline_order, int_ticks,
                                      legend_below, new_figure, seed_points, style_axes)
from solbench.report.readout import hacked_arms_table
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import clip_ci, fmt_bounded_ci, mean_ci
from solbench.report.tables import Tables

SPLIT, METRIC = "eval_check", "extra_objects"


def extra_object_rows(tables: Tables) -> pd.DataFrame:
    """Per-sample extra-object counts of done runs, with model, arm and seed."""
    m = tables.metrics
    rows = m[(m["split"] == SPLIT) & (m["metric"] == METRIC)]
    if rows.empty:
        return pd.DataFrame()
    rows = rows.merge(tables.done_runs[["run_id", "model", "arm", "seed"]], on="run_id")
    if "skill" not in rows:
        rows = rows.assign(skill=None)
    return rows.assign(counting=rows["skill"].astype(str) == "counting")


@report_kind("reward_hacking", title="Reward hacking: objects beyond the prompt", order=35)
def reward_hacking(tables: Tables):
    """Objects the policy draws beyond what each eval prompt asks, per method and step (the rewards never penalise them)."""
    rows = extra_object_rows(tables)
    if rows.empty:
        return [Note("Reward hacking", "No eval_check rows (extra_objects): these runs predate the check, or their "
                     "eval rewards carry no object detector (only the shapes world's do)."), hacked_arms_table(tables)]
    level = tables.options.ci_level
    per_run = rows.groupby(["model", "arm", "seed", "run_id", "step"]).agg(
        extra=("value", "mean"), with_extra=("value", lambda v: float((v > 0).mean())),
        extra_non_counting=("value", lambda v: float(v[~rows.loc[v.index, "counting"]].mean()))).reset_index()
    outputs = []
    for model in sorted(per_run["model"].unique()):
        pm = per_run[per_run["model"] == model]
        runs = tables.done_runs[tables.done_runs["model"] == model]
        tidy, display = [], []
        for arm in tables.arm_order(runs):
            a = pm[pm["arm"] == arm]
            for step, g in a.groupby("step"):
                # counts and a share: intervals clipped at 0 (and the share at 1), never a negative count
                ci, nc = (clip_ci(mean_ci(g[c].values, level)) for c in ("extra", "extra_non_counting"))
                share = clip_ci(mean_ci(g["with_extra"].values, level), 0.0, 1.0)
                tidy.append(dict(model=model, arm=arm, step=int(step), extra_mean=ci.mean, extra_lo=ci.lo,
                                 extra_hi=ci.hi, with_extra=share.mean, with_extra_lo=share.lo, with_extra_hi=share.hi,
                                 extra_non_counting=nc.mean, n_seeds=ci.n))
                display.append({"method": arm, "step": str(int(step)), "extra objects / image": fmt_bounded_ci(ci, 3),
                                "images with extra objects": f"{share.mean:.0%}",
                                "extra / image, non-counting prompts": fmt_bounded_ci(nc, 3), "seeds": str(ci.n)})
        data = pd.DataFrame(tidy)
        outputs.append(Table(f"reward_hacking_{model}", f"Objects beyond the prompt, {model}", data, (
            "Per evaluation step: objects the detector finds beyond the number each eval prompt asks for (max(0, "
            "detected - asked)), mean over the eval prompts x eval seeds of a run, then the mean and the "
            f"{level:.0%} t interval over run seeds, clipped at 0 (a count is never negative); the share of eval images with at least one extra object; and the "
            "count on non-counting prompts (single object, colour, position), which the shapes rewards score as "
            "'at least' and so never penalise. Step 0 is the base model: a count rising above it while the training "
            "reward rises is reward hacking."), display=pd.DataFrame(display)))
        outputs.append(_figure(tables, model, runs, data, pm))
    return outputs + [hacked_arms_table(tables)]  # issue 54: which arms are past reward hacking, and from where


def _figure(tables: Tables, model: str, runs: pd.DataFrame, data: pd.DataFrame, per_run: pd.DataFrame) -> Figure:
    heads = [a for a in headline_order(tables, runs) if a in set(data["arm"])]
    styles = arm_styles(tables.arm_order(runs), dict(zip(runs["arm"], runs["method"])), set(heads))
    labels = arm_labels(tables, heads)
    fig = new_figure(7.5, 4.4)
    ax = fig.subplots()
    for arm in heads:
        a = data[data["arm"] == arm].sort_values("step")
        ax.plot(a["step"], a["extra_mean"], markersize=5 if styles[arm]["zorder"] > 3 else 4, label=labels[arm],
                **styles[arm])
        # each seed's own counts with SEED_POINTS_UP_TO seeds or fewer (a t band over so few covers the chart); a
        # band clipped at 0 over more
        if int(a["n_seeds"].max()) <= SEED_POINTS_UP_TO:
            for _, seed in per_run[per_run["arm"] == arm].groupby("run_id"):
                seed_points(ax, seed["step"], seed["extra"], styles[arm]["color"])
        elif a["extra_lo"].notna().any():
            ax.fill_between(a["step"], a["extra_lo"].clip(lower=0), a["extra_hi"], color=styles[arm]["color"],
                            alpha=0.12, linewidth=0)
    ax.set_ylim(bottom=-0.03 * max(ax.get_ylim()[1], 0.1))  # a line at 0 drawn whole, not cut by the axis
    style_axes(ax, "iteration", "extra objects per eval image (count)",
               title=f"Objects beyond the prompt per eval image, {clip(model)}")
    int_ticks(ax)
    legend_below(fig, *ax.get_legend_handles_labels())
    return Figure(f"reward_hacking_{model}_chart", f"Objects beyond the prompt against iteration, {model}", fig, (
        "Mean over run seeds of the extra objects per eval image of each method's headline arm, in the method's own "
        "colour and marker (Sol-RL drawn on top: methods on the same counts overlap); dots: each run seed's own mean "
        f"where an arm has {SEED_POINTS_UP_TO} seeds or fewer, a t band over more. The table above gives every arm "
        "with its interval; `in_chart` in the CSV marks the arms drawn."),
        data=data.assign(in_chart=data["arm"].isin(heads)))
