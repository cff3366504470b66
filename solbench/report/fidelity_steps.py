"""Ranking fidelity against training iteration: does the explore copy rank seeds as well as the policy trains?

The all-seeds fidelity runs of one experiment (`solbench fidelity`, a spec's ``fidelity:`` block) measure
fixed checkpoints: the base model (iteration 0) and checkpoints of training runs (a run's final one, or one
kept at an earlier step). This module says which is which (``checkpoint_info``: the training run a checkpoint
came from, its seed, its step, and whether it is that run's final one), and builds from the per-prompt rank
correlations (solbench/report/fidelity.py ``group_fidelity``):

- ``rho_matrix``: one recipe's and reward's Spearman rho at one training step, [checkpoint run seeds, prompts];
- ``fidelity_levels``: its mean with the crossed interval over the checkpoints' run seeds and the prompts
  (``stats.crossed_interval``; one seed: a t interval over the prompts), the Table 8 number;
- ``fidelity_change``: rho at a step minus rho of the base model, paired per prompt (the same prompts and
  candidate noise: the noise is a function of the fidelity run's seed and the prompt, not of the checkpoint),
  with the same interval: does fidelity change as the policy trains?

The report kind ``fidelity_by_iteration`` tabulates and plots both per recipe and reward; the Findings judge the
change at the final step for non-inferiority (solbench/report/findings_speed.py).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.plotting import _FALLBACK, TITLE, clip, legend_below, legend_entries, new_figure, style_axes
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import paired_ci, variance_components
from solbench.report.tables import Tables, _fmt_setting, _hashable

BASE = "base"


def checkpoint_info(tables: Tables, fidelity_runs: pd.DataFrame) -> pd.DataFrame:
    """Per fidelity run: run_id, model, recipe, backend, checkpoint ('base' or the method it came from), step
    (0 for the base model), source (the training run id), seed (the training run's seed), final (the step is
    the training run's last; a checkpoint whose run is not in these results counts as final when its step is
    unknown or matches none)."""
    by_id = tables.runs.set_index(tables.runs["run_id"].astype(str))
    rows = []
    for _, run in fidelity_runs.iterrows():
        path = _hashable(run.get("p_checkpoint.path"))
        method = _hashable(run.get("p_checkpoint.method"))
        source = _hashable(run.get("p_checkpoint.run_id"))
        step = _hashable(run.get("p_checkpoint.step"))
        if path is None and method is None:
            info = dict(checkpoint=BASE, step=0, source=None, seed=None, final=False)
        else:
            trained = by_id.loc[str(source)] if source is not None and str(source) in by_id.index else None
            iterations = _hashable(trained.get("p_iterations")) if trained is not None else None
            final = step is None or iterations is None or int(step) == int(iterations)
            info = dict(checkpoint=str(method or "run"), step=int(step) if step is not None else None,
                        source=source, seed=_hashable(trained["seed"]) if trained is not None else None, final=final)
        rows.append(dict(run_id=str(run["run_id"]), model=str(run["model"]),
                         recipe=str(_hashable(run.get("p_quant.recipe"))),
                         backend=_hashable(run.get("p_quant.backend")),
                         **info))
    return pd.DataFrame(rows, columns=["run_id", "model", "recipe", "backend", "checkpoint", "step", "source", "seed",
                                       "final"])


def checkpoint_claims(info: pd.DataFrame, primary: str | None) -> list[tuple[str, str, pd.Series]]:
    """[(checkpoint, recipe, run ids)] of the fidelity runs ``info``: per recipe (two recipes are never pooled), the
    final policies of the training runs (pooled over their run seeds) and the base model; the final policy first,
    then the primary recipe's. Checkpoints kept before a run's end are the fidelity-against-iteration section's."""
    claims = []
    for recipe, runs in info.groupby("recipe", sort=True):
        for checkpoint, ids in (("final policy", runs.loc[runs["final"], "run_id"]),
                                ("base model", runs.loc[runs["checkpoint"] == BASE, "run_id"])):
            if len(ids):
                claims.append(((checkpoint != "final policy", recipe != primary, recipe), checkpoint, recipe, ids))
    return [(checkpoint, recipe, ids) for _, checkpoint, recipe, ids in sorted(claims, key=lambda c: c[0])]


def rho_matrix(groups: pd.DataFrame, info: pd.DataFrame, run_ids) -> pd.DataFrame:
    """Spearman rho [checkpoint seed, prompt] of the given fidelity runs (one reward's groups): rows in seed
    order, the prompts every run measured; constant groups (no correlation) dropped."""
    seed_of = info.set_index("run_id")["seed"]
    sub = groups[groups["run_id"].isin(list(run_ids))].dropna(subset=["spearman_rho"])
    if sub.empty:
        return pd.DataFrame()
    wide = sub.pivot_table(index="run_id", columns="prompt_id", values="spearman_rho", aggfunc="mean")
    wide.index = [seed_of.get(r) if seed_of.get(r) is not None else r for r in wide.index]
    return wide.dropna(axis=1).sort_index(key=lambda idx: idx.map(str))


def _interval(matrix: np.ndarray, level: float) -> tuple[float, float, float, str]:
    ci = paired_ci(matrix, level=level)
    seeds, prompts = matrix.shape
    if seeds >= 3:
        covers = f"checkpoints of {seeds} run seeds crossed with {prompts} prompts, both random"
    elif seeds == 1:
        covers = f"prompts ({prompts}), t interval over prompts; one checkpoint"
    else:
        covers = (f"prompts only ({prompts} prompts x {seeds} checkpoint seeds): the seed-to-seed variance is not "
                  "estimated")
    return ci.mean, max(ci.lo, -1.0) if math.isfinite(ci.lo) else ci.lo, min(ci.hi, 1.0) if math.isfinite(ci.hi) \
        else ci.hi, covers


def fidelity_levels(groups: pd.DataFrame, info: pd.DataFrame, run_ids, level: float) -> dict | None:
    """Mean rho of the runs ``run_ids`` (checkpoints of one step) with its interval and what it covers."""
    m = rho_matrix(groups, info, run_ids)
    if m.empty:
        return None
    mean, lo, hi, covers = _interval(m.to_numpy(float), level)
    return dict(mean=mean, lo=lo, hi=hi, covers=covers, n_seeds=m.shape[0], n_prompts=m.shape[1],
                components=variance_components(m.to_numpy(float)),
                constant=int(groups[groups["run_id"].isin(list(run_ids))]["spearman_rho"].isna().sum()))


def fidelity_change(groups: pd.DataFrame, info: pd.DataFrame, run_ids, base_ids, level: float) -> dict | None:
    """rho of the checkpoints ``run_ids`` minus the base model's (``base_ids``: one run), per prompt: the paired
    change over training, with the interval over checkpoint seeds and prompts."""
    m, b = rho_matrix(groups, info, run_ids), rho_matrix(groups, info, base_ids)
    if m.empty or b.empty:
        return None
    common = [p for p in m.columns if p in b.columns]
    if not common:
        return None
    d = m[common].to_numpy(float) - b[common].to_numpy(float).mean(axis=0)[None, :]
    mean, lo, hi, covers = _interval(d, level)
    return dict(mean=mean, lo=lo, hi=hi, covers=covers, n_seeds=d.shape[0], n_prompts=d.shape[1])


def trajectory(tables: Tables, groups: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """Per model, recipe, reward and step (0 = the base model): mean rho and the change from the base model."""
    level = tables.options.ci_level
    rows = []
    reward_col = "reward_name" if "reward_name" in groups else None
    rewards = list(dict.fromkeys(groups[reward_col].dropna())) if reward_col else [None]
    for (model, recipe), runs in info.groupby(["model", "recipe"], sort=False):
        base = runs.loc[runs["checkpoint"] == BASE, "run_id"]
        for reward in rewards:
            g = groups if reward is None else groups[groups[reward_col] == reward]
            if reward == "total" and len(rewards) > 1:
                continue
            for step, at in runs.dropna(subset=["step"]).groupby("step", sort=True):
                ids = at["run_id"]
                lv = fidelity_levels(g, info, ids, level)
                if lv is None:
                    continue
                ch = fidelity_change(g, info, ids, base, level) if step != 0 and len(base) else None
                rows.append(dict(model=model, recipe=recipe, reward=reward or "", step=int(step),
                                 final=bool(at["final"].all()) and step != 0,
                                 seeds=", ".join(_fmt_setting(s) for s in sorted(at["seed"].dropna().unique())) or "-",
                                 rho_mean=lv["mean"], rho_lo=lv["lo"], rho_hi=lv["hi"], covers=lv["covers"],
                                 n_seeds=lv["n_seeds"], n_prompts=lv["n_prompts"],
                                 change_mean=ch["mean"] if ch else np.nan, change_lo=ch["lo"] if ch else np.nan,
                                 change_hi=ch["hi"] if ch else np.nan, change_covers=ch["covers"] if ch else ""))
    return pd.DataFrame(rows)


def _cell(mean: float, lo: float, hi: float, signed: bool = False) -> str:
    if not math.isfinite(mean):
        return "-"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return fmt.format(mean) + " (no interval: one prompt)"
    return f"{fmt.format(mean)} [{fmt.format(lo)}, {fmt.format(hi)}]"


@report_kind("fidelity_by_iteration", title="Ranking fidelity against training iteration", order=52)
def fidelity_by_iteration(tables: Tables):
    """Spearman ρ of the explore copy at the base model and at checkpoints kept during training, per recipe."""
    from solbench.report.explore import backend_label, recipe_label, stored_backends
    from solbench.report.fidelity import group_fidelity, pair_candidates

    fid = tables.fidelity_runs
    if fid.empty:
        return Note("Fidelity against iteration", "No all-seeds fidelity runs in these results.")
    info = checkpoint_info(tables, fid)
    if info["step"].nunique() < 2:
        return Note("Fidelity against iteration", "The fidelity runs measured one training step only (e.g. only the "
                    "final policy): nothing to put against iteration. A spec's fidelity block measures more with "
                    "checkpoint entries that name `steps` (docs/reports.md, Ranking fidelity).")
    cand = tables.candidates[tables.candidates["run_id"].isin(fid["run_id"])]
    groups = group_fidelity(pair_candidates(cand), tuple(tables.options.top_k)) if not cand.empty else pd.DataFrame()
    if groups.empty:
        return Note("Fidelity against iteration", "The fidelity runs have no prompt group with 3+ candidates.")
    data = trajectory(tables, groups[groups["kind"] == "all seeds"], info)
    data = data[data.groupby(["model", "recipe", "reward"])["step"].transform("nunique") > 1]
    if data.empty:
        return Note("Fidelity against iteration", "No recipe was measured at two or more training steps.")
    words = stored_backends(fid)  # each backend in words, as the runs recorded them
    backends = info.groupby("recipe")["backend"].agg(lambda b: " / ".join(sorted({backend_label(v, words) for v in b})))
    display = pd.DataFrame([{
        "model": r.model, "explore": recipe_label(r.recipe), "backend": backends.get(r.recipe, "-"), "reward": r.reward,
        "iteration": str(r.step) + (" (final)" if r.final else " (base model)" if r.step == 0 else ""),
        "checkpoint seeds": r.seeds, "Spearman ρ": _cell(r.rho_mean, r.rho_lo, r.rho_hi),
        "Δρ vs base model": "-" if r.step == 0 else _cell(r.change_mean, r.change_lo, r.change_hi, signed=True),
        "interval covers": r.covers} for r in data.itertuples()])
    level = tables.options.ci_level
    return [Table("fidelity_by_iteration", "Ranking fidelity against training iteration", data, (
        "All-seeds fidelity of the explore copy of the base model (iteration 0) and of checkpoints of training runs "
        "(their final one, and those kept at earlier steps), the same prompts and candidate noise at every step. "
        f"Spearman ρ: mean over prompts (and over the checkpoints of several run seeds) with its {level:.0%} interval "
        "(crossed design: checkpoint run seeds and prompts, both random; one seed: a t interval over prompts). Δρ vs "
        "base model: paired per prompt, the same interval: what training did to the copy's ranking. The explore "
        "column names the format and recipe, the backend column how the low precision ran."), display=display),
        _trajectory_figure(data, tables.options)]


def _trajectory_figure(data: pd.DataFrame, options) -> Figure:
    """Top row ρ of each recipe at each measured step beside the paper's 0.927 and the Table 8 threshold; bottom row
    Δρ from the base model beside the change's non-inferiority threshold. Lines join measured steps only: a recipe
    not measured at a step has a gap there, not a line through it."""
    from solbench.report.explore import recipe_label

    rewards = list(dict.fromkeys(data["reward"]))
    fig = new_figure(4.3 * len(rewards) + 0.6, 6.2)
    axes = fig.subplots(2, len(rewards), squeeze=False, sharex=True)
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    steps = sorted(data["step"].dropna().unique())
    gap = float(np.min(np.diff(steps))) if len(steps) > 1 else 1.0
    threshold = options.fidelity_reference - options.fidelity_margin
    recipes = list(dict.fromkeys(data["recipe"]))
    colours = {r: _FALLBACK[i % len(_FALLBACK)] for i, r in enumerate(recipes)}
    rows = (("rho", "Spearman ρ (rank correlation)"), ("change", "Δρ from the base model"))
    for c, reward in enumerate(rewards):
        d = data[data["reward"] == reward]
        for r, (col, what) in enumerate(rows):
            ax = axes[r][c]
            for i, recipe in enumerate(recipes):
                g = d[d["recipe"] == recipe].set_index("step").reindex(steps)  # unmeasured steps: NaN, a gap
                if r == 1:
                    g.loc[g.index == 0, [f"{col}_mean", f"{col}_lo", f"{col}_hi"]] = np.nan
                if g[f"{col}_mean"].notna().sum() == 0:
                    continue
                mean = g[f"{col}_mean"].to_numpy(float)
                err = np.vstack([np.clip(mean - g[f"{col}_lo"].to_numpy(float), 0, None),
                                 np.clip(g[f"{col}_hi"].to_numpy(float) - mean, 0, None)])
                # recipes side by side at each step (a dodge of a fraction of the step gap): bars never overlap
                x = np.asarray(steps, float) + (i - (len(recipes) - 1) / 2) * 0.12 * gap
                ax.plot(x, mean, color=colours[recipe], linewidth=1.4, marker=markers[i % len(markers)], markersize=5,
                        label=clip(recipe_label(recipe)))
                ax.errorbar(x, mean, yerr=np.nan_to_num(err), color=colours[recipe], linestyle="none", capsize=3,
                            label="_interval")
            if r == 0:
                ax.axhline(options.fidelity_reference, color="black", linestyle=":", linewidth=0.9,
                           label=f"paper Table 8 ({options.fidelity_reference:g})")
                ax.axhline(threshold, color="black", linestyle="-.", linewidth=0.9,
                           label=f"Table 8 verdict threshold ({threshold:g}: paper - margin)")
            else:
                ax.axhline(0.0, color="#9a9a9a", linewidth=0.8)
                ax.axhline(-options.fidelity_margin, color="black", linestyle="--", linewidth=0.9,
                           label=f"change verdict threshold (-{options.fidelity_margin:g})")
            ax.set_xticks(steps, [str(int(v)) for v in steps])
            style_axes(ax, "training iteration of the checkpoint (0: base model)" if r == 1 else "",
                       what,  # the reward in the column's title, plain text: no Markdown backticks in a PNG
                       title=f"reward {clip(reward, 40)}" if r == 0 else None)
    legend_below(fig, *legend_entries(axes), ncols=3)
    fig.suptitle("Ranking fidelity of the explore copy against training iteration", fontsize=TITLE)
    return Figure("fidelity_by_iteration_chart", "Ranking fidelity against training iteration", fig, (
        "Top: mean per-prompt Spearman ρ (explore copy vs full precision, same seeds) of each checkpoint, one line per "
        "explore recipe (recipes set side by side at each step), one column per reward, beside the paper's Table 8 ρ "
        f"and the threshold Table 8's verdict uses ({threshold:g}: the interval must lie above it). Bottom: Δρ from "
        "the base model, paired per prompt, beside the threshold of the change's verdict "
        f"(-{options.fidelity_margin:g}). "
        "Bars: the intervals of the table above. Lines join measured steps only: a recipe not measured at a step "
        "has a gap there."),
        data=data)
