"""Where naive FP4 breaks (issue 48): the explore copy's error against training iteration, and the dose-response.

Reads the runs' ``explore_gap`` rows (solbench.train.explore_gap: at measured iterations, the seeds a run trained on
sampled at the other precision too; ``x0_rel_dist`` the samples' distance over the full-precision samples' spread,
``grad_cos`` / ``grad_norm_ratio`` the NFT loss gradient on the low-precision samples against on their
full-precision twins) and the per-sample eval rows (split ``eval_sample``). Three outputs per model:

- the gap against iteration for every Sol-RL and naive FP4 arm, per explore recipe (mean over run seeds, t interval);
- the dose of each recipe: the sample error naive FP4 trained on, the mean over its measured iterations of
  ``x0_rel_dist`` per run, then the mean over run seeds with its t interval (Sol-RL's runs stand in where naive FP4's
  measured none);
- the dose-response: per recipe, naive FP4 minus Sol-RL (each the recipe's main arm: most seeds, settings at
  their defaults) in final reward on every eval reward, paired by run seed on the same eval prompts and seeds
  (solbench.report.paired: seeds crossed with prompts), judged by the Findings rule on the paper's claim "naive FP4
  ends below Sol-RL" (effect < 0); beside it naive FP4 minus naive BF16 scaling (the zero dose: naive FP4 with a
  copy that quantizes nothing is naive BF16 scaling), where the results hold that arm.

``dose_findings`` gives the comparison's Findings rows, one per recipe and eval reward, the recipe in the claim and
in ``Finding.recipe``. Reads stored results only.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.findings_common import Finding, main_arm, reward_roles, seed_cost_s
from solbench.report.paired import _eval_steps as eval_steps, paired_difference, seed_runs
from solbench.report.plotting import (NORMAL, SEED_POINTS_UP_TO, SMALL, TITLE, clip, int_ticks, legend_below,
                                      legend_entries, method_colour, new_figure, seed_points, style_axes)
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import CI, fmt_bounded_ci, fmt_ci, mean_ci
from solbench.report.tables import Tables, method_display, same_method

SPLIT = "explore_gap"  # solbench.train.explore_gap.SPLIT (the report reads results, never the trainer's modules)
DOSE = "x0_rel_dist"
#: the gap metrics plotted against iteration: (metric, axis label)
PANELS = ((DOSE, "sample distance / spread (ratio)"), ("grad_cos", "gradient cosine (-1 to 1)"),
          ("grad_norm_ratio", "gradient norm ratio (low / full)"))
EXPLORING = ("naive_fp4", "sol_rl")
CLAIM = "Naive FP4 ends below Sol-RL, explore copy {recipe}"
PAPER = "naive FP4 peaks near HPSv2 0.36, below Sol-RL's 0.3688 (NVFP4)"


def gap_rows(tables: Tables) -> pd.DataFrame:
    """The explore_gap rows of done runs with model, method, arm, seed and the explore recipe."""
    m = tables.metrics
    if m.empty or "split" not in m:
        return pd.DataFrame()
    rows = m[m["split"] == SPLIT]
    runs = tables.done_runs
    if rows.empty or runs.empty:
        return pd.DataFrame()
    recipe = runs["p_quant.recipe"] if "p_quant.recipe" in runs else pd.Series("", index=runs.index)
    info = runs[["run_id", "model", "method", "arm", "seed"]].assign(recipe=recipe.astype(str))
    return rows[["run_id", "step", "metric", "value"]].merge(info, on="run_id")


def recipe_arms(tables: Tables, runs: pd.DataFrame, method: str) -> dict[str, str]:
    """{explore recipe: the main arm of ``method`` among its runs with that recipe}."""
    mine = runs[runs["method"].map(lambda m: same_method(m, method))]
    if mine.empty or "p_quant.recipe" not in mine:
        return {}
    out = {}
    for recipe, group in mine.groupby(mine["p_quant.recipe"].astype(str)):
        arm = main_arm(tables, group, method)
        if arm is not None:
            out[recipe] = arm
    return out


def doses(rows: pd.DataFrame, arms: dict[str, dict[str, str]], level: float,
          horizon: int | None = None) -> dict[str, CI]:
    """{recipe: the sample error its naive FP4 arm trained on (its Sol-RL arm's where naive FP4 has no rows)}: per run
    the mean x0_rel_dist over its measured iterations (up to ``horizon`` when given), then the t interval over run
    seeds."""
    out = {}
    d = rows[rows["metric"] == DOSE] if not rows.empty else rows
    if horizon is not None and not d.empty:
        d = d[d["step"] <= horizon]
    for recipe in sorted(set(arms.get("naive_fp4", {})) | set(arms.get("sol_rl", {}))):
        for method in EXPLORING:
            arm = arms.get(method, {}).get(recipe)
            mine = d[d["arm"] == arm] if arm is not None and not d.empty else d.iloc[0:0]
            if not mine.empty:
                out[recipe] = mean_ci(mine.groupby("run_id")["value"].mean().values, level)
                break
    return out


def _ordered(recipes, dose: dict[str, CI]) -> list[str]:
    """Recipes by growing dose (those without one last, by name)."""
    return sorted(recipes, key=lambda r: (r not in dose or math.isnan(dose[r].mean), dose[r].mean if r in dose else 0, r))


def dose_findings(tables: Tables, model: str) -> list[Finding]:
    """Naive FP4 minus Sol-RL at equal iterations per explore recipe and eval reward (claim: below zero), for
    results with two or more recipes that both methods ran."""
    return [f for _, f, _ in _dose_pairs(tables, model)]


def dose_horizon(tables: Tables, model: str, metric: str, arms) -> int | None:
    """The last evaluation of ``metric`` that every run of ``arms`` reached. The dose-response reads every recipe
    there, so an arm run longer than the others (tiny_paper's long naive FP4 and Sol-RL arms, 32 iterations beside the
    dose arms' 16) is compared at the same iteration as the rest of the curve, not at its own end."""
    lasts = []
    for arm in arms:
        for run_id in seed_runs(tables, model, arm).values():
            steps = eval_steps(tables, run_id, metric)
            if steps:
                lasts.append(max(steps))
    return min(lasts) if lasts else None


def _dose_pairs(tables: Tables, model: str) -> list[tuple[str, Finding, int | None]]:
    """[(recipe, Finding, the iteration compared)] of ``dose_findings``, recipes by growing dose."""
    from solbench.report.findings_quality import paired_finding

    runs = tables.done_runs[tables.done_runs["model"] == model]
    arms = {m: recipe_arms(tables, runs, m) for m in EXPLORING}
    common = set(arms["naive_fp4"]) & set(arms["sol_rl"])
    if len(common) < 2:  # one recipe is the ordinary naive-FP4 claim (findings_quality), not a dose-response
        return []
    rows = gap_rows(tables)
    rows = rows[rows["model"] == model] if not rows.empty else rows
    roles = reward_roles(tables, runs)
    dose_arms = [arms[m][r] for r in sorted(common) for m in EXPLORING]
    horizons = {metric: dose_horizon(tables, model, metric, dose_arms) for metric, _ in roles}
    dose = doses(rows, arms, tables.options.ci_level, horizons[roles[0][0]] if roles else None)
    out = []
    for recipe in _ordered(common, dose):
        fp4, sol = arms["naive_fp4"][recipe], arms["sol_rl"][recipe]
        error = f"sample error {fmt_ci(dose[recipe], 3)}" if recipe in dose else "sample error not measured"
        for metric, role in roles:
            claim = CLAIM.format(recipe=recipe)
            f = Finding(claim, "Sec. naive FP4 (dose)", PAPER, unit="abs", threshold=0.0, direction="less", model=model,
                        metric=metric, role=role, key=claim)
            at = horizons[metric]
            f.detail = (f"Δ = {fp4} - {sol}, `{metric}`, explore copy `{recipe}` ({error}), at iteration {at}, the "
                        "last evaluation every arm of the dose-response reached.")
            f.recipe = f"{recipe} ({method_display('naive_fp4')}, {method_display('sol_rl')})"
            f.seed_cost_s = seed_cost_s(tables, model, (fp4, sol))
            p = paired_difference(tables, model, metric, fp4, sol, step=at)
            out.append((recipe, paired_finding(f, p, "Needs naive FP4 and Sol-RL runs of this recipe with common run "
                                                     "seeds."), at))
    return out


@report_kind("dose_response", title="Where naive FP4 breaks: the explore copy's error and the dose-response", order=37)
def dose_response(tables: Tables):
    """The explore copy's sample and gradient error against iteration, and naive FP4 minus Sol-RL against it."""
    rows = gap_rows(tables)
    outputs: list = []
    if rows.empty:
        outputs.append(Note("Explore gap", "No explore_gap rows: these runs did not measure the explore copy's error "
                            "(eval.explore_gap_every unset, or no method with an explore copy)."))
    level = tables.options.ci_level
    for model in tables.models():
        mine = rows[rows["model"] == model] if not rows.empty else rows
        if not mine.empty:
            data = _gap_table(mine, level)
            outputs.append(Table(f"explore_gap_{model}", f"Explore gap against iteration, {model}", data, (
                "Per measured iteration (solbench.train.explore_gap): the seeds each run trained on, sampled at the other "
                "precision with the same noise and sampler; `x0_rel_dist` = RMS(x0 low - x0 full) / spread of the "
                "full-precision samples (0: no error; about 1.4: as far apart as two seeds), `grad_cos` and "
                "`grad_norm_ratio` = the NFT loss gradient on the low-precision samples against on their twins (same "
                f"advantages, timesteps and noise). Mean over run seeds with the {level:.0%} t interval."),
                display=_gap_display(data)))
            runs = tables.done_runs[tables.done_runs["model"] == model]
            main = {arm for m in EXPLORING for arm in recipe_arms(tables, runs, m).values()}
            outputs.append(_gap_figure(model, data[data["arm"].isin(main)], mine[mine["arm"].isin(main)]))
        found = _dose_pairs(tables, model)
        if found:
            runs = tables.done_runs[tables.done_runs["model"] == model]
            data = _dose_table(tables, model, runs, mine, found)
            outputs.append(Table(f"dose_response_{model}", f"Dose-response: naive FP4 minus Sol-RL by explore copy, {model}",
                                 data, _DOSE_CAPTION.format(level=level), display=_dose_display(data)))
            outputs.append(_dose_figure(model, data))
        elif not mine.empty:
            outputs.append(Note(f"Dose-response, {model}", "Fewer than two explore recipes with both naive FP4 and "
                                "Sol-RL arms: no dose-response (experiments/tiny_dose.yaml runs four)."))
    return outputs


_DOSE_CAPTION = (
    "Per explore recipe, in order of growing dose: the sample error naive FP4 trained on (per run the mean of "
    "x0_rel_dist over its measured iterations up to the compared one; mean over run seeds, {level:.0%} t interval), "
    "and naive FP4 minus Sol-RL at the dose horizon (`iteration`: the last evaluation every arm of the dose-response "
    "reached; an arm run longer is read there, not at its end) on each eval reward, paired by run seed on the same "
    "eval prompts and "
    "seeds ({level:.0%} interval, seeds crossed with prompts; prompts only with fewer than 3 seeds), judged on the "
    "paper's claim that naive FP4 ends below Sol-RL (reproduced: the whole interval below 0). `vs naive BF16` is "
    "naive FP4 minus naive BF16 scaling, the zero dose (naive FP4 with a copy that quantizes nothing).")


def _gap_table(rows: pd.DataFrame, level: float) -> pd.DataFrame:
    tidy = []
    for (method, recipe, arm, metric, step), g in rows.groupby(["method", "recipe", "arm", "metric", "step"]):
        ci = mean_ci(g["value"].values, level)
        tidy.append(dict(method=method, recipe=recipe, arm=arm, metric=metric, step=int(step), mean=ci.mean, lo=ci.lo,
                         hi=ci.hi, n_seeds=ci.n))
    return pd.DataFrame(tidy)


def _gap_display(data: pd.DataFrame) -> pd.DataFrame:
    shown = data[data["metric"].isin([m for m, _ in PANELS])]
    wide = shown.assign(cell=[fmt_ci(CI(r.mean, r.lo, r.hi, r.n_seeds), 3) for r in shown.itertuples()]).pivot_table(
        index=["arm", "step"], columns="metric", values="cell", aggfunc="first").reset_index()
    return wide.rename(columns={"arm": "arm", "step": "iteration"})


def _gap_figure(model: str, data: pd.DataFrame, rows: pd.DataFrame) -> Figure:
    """One row per gap metric, one column per explore recipe (by growing dose); in each panel naive FP4 and Sol-RL in
    their own colours, each seed's own values as dots where an arm has SEED_POINTS_UP_TO seeds or fewer."""
    dose_order = data[data["metric"] == DOSE].groupby("recipe")["mean"].mean().sort_values()
    recipes = list(dose_order.index) + sorted(set(data["recipe"]) - set(dose_order.index))
    fig = new_figure(2.9 * len(recipes) + 1.0, 2.2 * len(PANELS) + 1.0)
    axes = fig.subplots(len(PANELS), len(recipes), squeeze=False, sharex=True, sharey="row")
    for r, (metric, label) in enumerate(PANELS):
        for c, recipe in enumerate(recipes):
            ax = axes[r][c]
            shown = data[(data["metric"] == metric) & (data["recipe"] == recipe)]
            for method in EXPLORING:
                g = shown[shown["method"].map(lambda m: same_method(m, method))].sort_values("step")
                if g.empty:
                    continue
                colour = method_colour(method)
                fp4 = method == "naive_fp4"
                ax.plot(g["step"], g["mean"], color=colour, linestyle="-" if fp4 else "--", marker="o" if fp4 else "s",
                        markersize=3.5, linewidth=1.6, label=method_display(method))
                seeds = rows[(rows["arm"].isin(set(g["arm"]))) & (rows["metric"] == metric)]
                if seeds["seed"].nunique() <= SEED_POINTS_UP_TO:
                    for _, run in seeds.groupby("run_id"):
                        seed_points(ax, run["step"], run["value"], colour)
                elif g["lo"].notna().any():  # a cosine's band stops at 1, a distance's and a norm ratio's at 0
                    lo, hi = g["lo"].clip(lower=-1.0 if metric == "grad_cos" else 0.0), g["hi"]
                    hi = hi.clip(upper=1.0) if metric == "grad_cos" else hi
                    ax.fill_between(g["step"], lo, hi, color=colour, alpha=0.10, linewidth=0)
            ax.set_xlabel("iteration" if r == len(PANELS) - 1 else "", fontsize=NORMAL)
            ax.set_ylabel(label if c == 0 else "", fontsize=NORMAL)
            if r == 0:
                ax.set_title(f"explore copy {clip(recipe, 30)}", fontsize=NORMAL)
            int_ticks(ax)
            ax.tick_params(labelsize=SMALL)
            ax.grid(alpha=0.3)
    legend_below(fig, *legend_entries(axes), ncols=2)
    fig.suptitle(f"Explore copy's error on the trained seeds against iteration, {clip(model)}", fontsize=TITLE)
    return Figure(f"explore_gap_{model}_chart", f"Explore gap against iteration, {model}", fig, (
        "One column per explore recipe, by growing sample error; one row per measure: the sample distance over the "
        "seeds' spread (0: none; about 1.4: as far apart as two seeds), the cosine and the norm ratio of the NFT loss "
        "gradient on the low-precision samples against on their full-precision twins. Solid with circles: naive FP4 "
        "(its trained samples are the explore copy's), dashed with squares: Sol-RL (its trained samples are full "
        "precision; the twins are the explore copy's at the full step budget), each in its method's colour. One arm "
        "per method and recipe, its main one (most seeds, settings at their defaults; the table lists every arm). "
        f"Mean over run seeds; dots: each seed where an arm has {SEED_POINTS_UP_TO} seeds or fewer, a t band over "
        "more."), data=data)


def _dose_table(tables: Tables, model: str, runs: pd.DataFrame, rows: pd.DataFrame,
                found: list[tuple[str, Finding]]) -> pd.DataFrame:
    level = tables.options.ci_level
    arms = {m: recipe_arms(tables, runs, m) for m in EXPLORING}
    horizon = found[0][2] if found else None  # the headline reward's (the dose is averaged up to it)
    dose = doses(rows, arms, level, horizon)
    bf16 = main_arm(tables, runs, "naive_scaling")
    tidy = []
    for recipe, f, at in found:
        d = dose.get(recipe, CI(math.nan, math.nan, math.nan, 0))
        row = dict(model=model, recipe=recipe, dose=d.mean, dose_lo=d.lo, dose_hi=d.hi, metric=f.metric, role=f.role,
                   effect=f.effect, lo=f.lo, hi=f.hi, verdict=f.verdict, covers=f.covers, prompts_only=f.prompts_only,
                   fp4_arm=arms["naive_fp4"].get(recipe), sol_arm=arms["sol_rl"].get(recipe), n_seeds=_n_seeds(f),
                   iteration=at, vs_bf16=math.nan, vs_bf16_lo=math.nan, vs_bf16_hi=math.nan, per_seed=f.per_seed)
        if bf16 is not None:
            p = paired_difference(tables, model, f.metric, arms["naive_fp4"][recipe], bf16, step=at)
            if p is not None:
                row.update(vs_bf16=p.ci.mean, vs_bf16_lo=p.ci.lo, vs_bf16_hi=p.ci.hi)
        tidy.append(row)
    return pd.DataFrame(tidy)


def _n_seeds(f: Finding) -> int:
    import json

    try:
        return len(json.loads(f.per_seed)) if f.per_seed else 0
    except ValueError:
        return 0


def _signed(mean: float, lo: float, hi: float) -> str:
    """'+0.0123 [-0.0040, +0.0286]' (the mean alone without an interval, '-' without a value)."""
    if not math.isfinite(mean):
        return "-"
    if math.isnan(lo) or math.isnan(hi):
        return f"{mean:+.4f} (no interval)"
    return f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def _dose_display(data: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "explore copy": data["recipe"],
        "sample error": [fmt_bounded_ci(CI(r.dose, r.dose_lo, r.dose_hi, 2), 3) for r in data.itertuples()],
        "reward": [f"`{m}` ({r})" for m, r in zip(data["metric"], data["role"])],
        "iteration": [str(int(i)) if pd.notna(i) else "-" for i in data["iteration"]],
        "naive FP4 - Sol-RL": [_signed(r.effect, r.lo, r.hi) for r in data.itertuples()],
        "verdict (claim: < 0)": [v + (" (eval prompts only)" if p else "") for v, p in zip(data["verdict"],
                                                                                          data["prompts_only"])],
        "naive FP4 - naive BF16": [_signed(r.vs_bf16, r.vs_bf16_lo, r.vs_bf16_hi) for r in data.itertuples()],
        "seeds": data["n_seeds"].astype(str)})


def _dose_figure(model: str, data: pd.DataFrame) -> Figure:
    import json

    metrics = list(dict.fromkeys(data["metric"]))
    fig = new_figure(max(4.6, 4.2 * len(metrics)), 4.6)
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    steps = sorted({int(i) for i in data["iteration"].dropna()}) if "iteration" in data else []
    at = f"iteration {', '.join(map(str, steps))}" if steps else "the last common evaluation"
    for ax, metric in zip(axes, metrics):
        d = data[data["metric"] == metric].sort_values("dose")
        xerr = _err(d["dose"], d["dose_lo"], d["dose_hi"])
        ax.axhline(0.0, color="black", linewidth=0.9, linestyle=":",
                   label="0: the claim's threshold (below: naive FP4 worse)")
        ax.errorbar(d["dose"], d["effect"], yerr=_err(d["effect"], d["lo"], d["hi"]), xerr=xerr,
                    color=method_colour("naive_fp4"), marker="o", linestyle="-", capsize=3, linewidth=1.5,
                    label="naive FP4 - Sol-RL")
        for r in d.itertuples():  # each run seed's own paired difference, where the seeds are few
            seeds = json.loads(r.per_seed) if isinstance(getattr(r, "per_seed", ""), str) and r.per_seed else {}
            if 0 < len(seeds) <= SEED_POINTS_UP_TO and math.isfinite(r.dose):
                seed_points(ax, [r.dose] * len(seeds), list(seeds.values()), method_colour("naive_fp4"))
        if d["vs_bf16"].notna().any():
            ax.errorbar(d["dose"], d["vs_bf16"], yerr=_err(d["vs_bf16"], d["vs_bf16_lo"], d["vs_bf16_hi"]),
                        color="#7f7f7f", marker="s", markerfacecolor="none", linestyle="--", capsize=3, linewidth=1.1,
                        label="naive FP4 - naive BF16 scaling")
        right = np.nanmax(np.r_[d["dose_hi"].to_numpy(float), d["dose"].to_numpy(float), 0.01])
        ax.set_xlim(0, 1.15 * right)
        # the recipes named on a top axis at their doses, vertical: labels beside the points ran over the markers
        known = d[np.isfinite(d["dose"].to_numpy(float))]
        top = ax.secondary_xaxis("top")
        top.set_xticks(known["dose"].to_numpy(float), [clip(r, 24) for r in known["recipe"]], rotation=90,
                       fontsize=SMALL)
        top.set_xlabel("explore copy", fontsize=NORMAL)
        role = d["role"].iloc[0] if len(d) else ""
        style_axes(ax, "explore copy's sample error (x0 distance / spread)",
                   f"reward difference at {at}", title=f"{clip(metric)} ({role})")
    legend_below(fig, *axes[0].get_legend_handles_labels(), ncols=3)
    fig.suptitle(f"Where naive FP4 breaks: naive FP4 minus Sol-RL at {at} against the explore copy's sample error, "
                 f"{clip(model)}", fontsize=TITLE)
    return Figure(f"dose_response_{model}_chart", f"Dose-response, {model}", fig, (
        "One point per explore recipe (named on the top axis): x its sample error (mean over naive FP4's runs and "
        "measured iterations, t interval over seeds), y naive FP4 minus Sol-RL at the dose horizon (the table's "
        "`iteration`; paired interval, seeds crossed with prompts), dots: each run seed's own paired difference where "
        f"there are {SEED_POINTS_UP_TO} seeds or fewer; below the dotted 0 line naive FP4 ends worse (the claim). "
        "Grey: naive FP4 minus naive BF16 scaling (the zero dose). The table above gives every number and the "
        "verdicts."), data=data)


def _err(mean: pd.Series, lo: pd.Series, hi: pd.Series) -> np.ndarray | None:
    """Asymmetric error bars from an interval (0 where it is missing)."""
    low, high = (mean - lo).to_numpy(float), (hi - mean).to_numpy(float)
    if not (np.isfinite(low).any() or np.isfinite(high).any()):
        return None
    return np.vstack([np.nan_to_num(low, nan=0.0), np.nan_to_num(high, nan=0.0)])
