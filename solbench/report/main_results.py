"""Main results (the paper's Table 1): per model, methods x eval rewards, base score and delta.

For every done run and every eval reward: the value at the run's last evaluation and at step 0
(the base model, evaluated with the same prompts and seeds before any update). An arm's score is the
mean over seeds with a t interval; the delta is paired per run (final - own step 0), then averaged
over seeds, which removes the seed-to-seed variation of the eval noise from the comparison.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.paired import PROMPTS_ONLY_NOTE, fmt_paired, paired_difference
from solbench.report.registry import Note, Table, report_kind
from solbench.report.stats import CI, fmt_ci, mean_ci
from solbench.report.tables import Tables, same_method


def final_and_base(tables: Tables, metric: str, step: int | None = None) -> pd.DataFrame:
    """One row per done run: model, arm, method, seed, final_step, final, base (step-0 value). ``step``: the
    value at the run's last evaluation at or before it (equal iterations) instead of its very last."""
    rows = tables.run_metrics("eval", metric)
    if step is not None:
        rows = rows[rows["step"] <= step]
    if rows.empty:
        return pd.DataFrame(columns=["run_id", "model", "arm", "method", "seed", "final_step", "final", "base"])
    rows = rows.sort_values(["run_id", "step"])
    last = rows.groupby("run_id").tail(1).rename(columns={"step": "final_step", "value": "final"})
    base = rows[rows["step"] == 0].groupby("run_id")["value"].mean().rename("base")
    out = last[["run_id", "model", "arm", "method", "seed", "final_step", "final"]].merge(
        base, left_on="run_id", right_index=True, how="left")
    return out.reset_index(drop=True)


def _eval_setup(tables: Tables, runs: pd.DataFrame) -> str:
    parts = []
    for column, template in (("p_eval.prompts", "prompts `{}`"), ("p_eval.n_prompts", "first {} prompts"),
                             ("p_eval.seeds_per_prompt", "{} seeds per prompt"), ("p_sampling.eval_steps", "{} sampling steps")):
        if column in runs and runs[column].notna().any():
            # whole numbers come back as floats when another run kind leaves the column empty
            values = sorted({str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
                             for v in runs[column].dropna()})
            parts.append(template.format("/".join(values)))
    # the rest of the evaluation protocol (eval.guidance / resolution / sampler / shift; unset, the training setting)
    for column, fallback, template in (("p_eval.guidance", "p_sampling.guidance", "guidance {}"),
                                       ("p_eval.resolution", "p_model.resolution", "{} px"),
                                       ("p_eval.sampler", None, "{} sampler"), ("p_eval.shift", "p_sampling.shift", "shift {}")):
        own = runs[column] if column in runs else pd.Series(index=runs.index, dtype=object)
        values = own.where(own.notna(), runs[fallback]) if fallback in runs else own
        if values.notna().any():
            parts.append(template.format("/".join(sorted({str(int(v)) if isinstance(v, float) and v.is_integer()
                                                          else str(v) for v in values.dropna()}))))
    if "p_eval.use_ema" in runs and runs["p_eval.use_ema"].notna().any():
        ema = set(runs["p_eval.use_ema"].dropna().astype(bool))
        parts.append("EMA weights" if ema == {True} else ("raw (non-EMA) weights" if ema == {False} else "EMA for some runs only"))
    return "; ".join(parts)


@report_kind("main_results", title="Main results (Table 1)", order=10)
def main_results(tables: Tables):
    """Per model: every eval reward of the spec for every method, base score and delta, CI over seeds."""
    rewards = tables.eval_rewards()
    if not rewards:
        return Note("Main results", "No evaluation rows (split 'eval') in metrics.parquet: nothing to tabulate.")
    level = tables.options.ci_level
    outputs = []
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        ref_arm = reference_arm(tables, runs)
        step = table_step(tables, runs, ref_arm, rewards[0])
        per_run = pd.concat([final_and_base(tables, m, step).assign(metric=m) for m in rewards], ignore_index=True)
        data = per_run[per_run["model"] == model]
        if data.empty:
            outputs.append(Note(f"Main results, {model}", f"No done run of model `{model}` has evaluation rows."))
            continue
        tidy, display_rows, seed_rows = [], [], []
        has_clock = ref_arm is not None and _has_clock(tables)
        base_row = {"method": "Base (step 0)"}
        for metric in rewards:
            d = data[data["metric"] == metric]
            # one base value per seed (runs sharing a seed share eval noise, hence the same step-0 score)
            base_per_seed = d.dropna(subset=["base"]).groupby("seed")["base"].mean()
            ci = mean_ci(base_per_seed.values, level)
            tidy.append(dict(model=model, arm="Base (step 0)", method="base", metric=metric, mean=ci.mean,
                             ci_lo=ci.lo, ci_hi=ci.hi, n_seeds=ci.n, delta_mean=np.nan, delta_lo=np.nan,
                             delta_hi=np.nan, final_step=0))
            base_row[metric] = fmt_ci(ci)
            base_row[f"Δ {metric}"] = "-"
            if ref_arm is not None:
                base_row[f"Δ vs {ref_arm} {metric}"] = "-"
        base_row["seeds"] = str(int(data.dropna(subset=["base"])["seed"].nunique()))
        display_rows.append(base_row)
        for arm in tables.arm_order(runs):
            a = data[data["arm"] == arm]
            row = {"method": arm}
            for metric in rewards:
                d = a[a["metric"] == metric]
                ci = mean_ci(d["final"].values, level)
                dci = mean_ci((d["final"] - d["base"]).values, level)
                steps = sorted(d["final_step"].dropna().astype(int).unique())
                vs = _vs_reference(tables, model, metric, arm, ref_arm, step, seed_rows)
                tidy.append(dict(model=model, arm=arm, method=str(d["method"].iloc[0]) if len(d) else arm,
                                 metric=metric, mean=ci.mean, ci_lo=ci.lo, ci_hi=ci.hi, n_seeds=ci.n,
                                 delta_mean=dci.mean, delta_lo=dci.lo, delta_hi=dci.hi,
                                 final_step=steps[-1] if steps else np.nan, reference=ref_arm, **vs))
                row[metric] = fmt_ci(ci)
                row[f"Δ {metric}"] = fmt_ci(dci)
                if ref_arm is not None:
                    row[f"Δ vs {ref_arm} {metric}"] = _fmt_vs(vs, arm == ref_arm)
                    if has_clock:
                        row[f"Δ vs {ref_arm} {metric} at equal PROJECTED time"] = _fmt_vs(
                            {"vs_ref_mean": vs["eqt_mean"], "vs_ref_lo": vs["eqt_lo"], "vs_ref_hi": vs["eqt_hi"],
                             "vs_ref_covers": vs["eqt_covers"]}, arm == ref_arm)
            row["seeds"] = str(int(a["seed"].nunique()))
            display_rows.append(row)
        tidy_df = pd.DataFrame(tidy)
        final_steps = sorted(tidy_df.loc[tidy_df["arm"] != "Base (step 0)", "final_step"].dropna().astype(int).unique())
        longer = _longer_arms(tables, runs, step, rewards[0])
        setup = _eval_setup(tables, runs)
        caption = (
            f"Mirrors the paper's Table 1 (main results) at equal iterations. Model `{model}`. Each cell: the eval "
            f"reward at step {', '.join(map(str, final_steps))} (the reference arm's last evaluation; arms that ran "
            f"longer, {', '.join(longer) or 'none'}, are read at the same step here and at their end in the "
            f"long-horizon table), mean ± half-width of the "
            f"{level:.0%} Student-t interval over seeds (the `seeds` column; one seed gives no interval). "
            "Δ: the run's final score minus its own step-0 score (the base model on the same eval prompts and "
            "seeds), averaged over seeds. Base (step 0): the model before any RL update."
            + (f" Δ vs {ref_arm}: paired difference from the reference method ({ref_arm}) on the same eval prompts "
               "and eval seeds, runs paired by run seed, at the last evaluation both runs of a pair reached (equal "
               f"iterations); [{level:.0%} interval of the crossed design, covering {_covers(tidy)}]"
               + (f" ({PROMPTS_ONLY_NOTE})" if any(str(r.get("vs_ref_covers", "")).startswith("eval prompts only")
                                                   for r in tidy) else "")
               + ("; 'at equal PROJECTED time': the same pairs compared at the PROJECTED GPU clock both runs of a "
                  "pair reached (the paper's Table 1 compares at equal GPU-hours), per-sample scores interpolated "
                  "linearly between the evaluations around it; a PROJECTION of the time axis, the scores are "
                  "measured" if has_clock else "") + ". Each seed's own paired difference: the per-seed CSV."
               if ref_arm is not None else
               f" No run of the reference method `{tables.options.reference_method}`: no paired Δ column.")
            + (f" Evaluation: {setup}." if setup else "")
            + " Higher is better for every reward listed."
        )
        outputs.append(Table(f"main_results_{model}", f"Main results, {model}", tidy_df, caption,
                             display=pd.DataFrame(display_rows)))
        if seed_rows:
            outputs.append(_per_seed_table(model, seed_rows, ref_arm, rewards[0]))
        if longer:
            outputs.append(long_horizon_table(tables, model, runs, rewards, step))
        skills = _skill_breakdown(tables, model, rewards, step)
        if skills is not None:
            outputs.append(skills)
    return outputs


def reference_arm(tables: Tables, runs: pd.DataFrame) -> str | None:
    """The arm every method is compared with (``reference_method``, default DiffusionNFT); None if absent."""
    for arm in tables.arm_order(runs):
        if same_method(runs.loc[runs["arm"] == arm, "method"].iloc[0], tables.options.reference_method):
            return arm
    return None


def table_step(tables: Tables, runs: pd.DataFrame, ref_arm: str | None, metric: str) -> int | None:
    """The step Table 1 compares at (equal iterations): the reference arm's last evaluation (most common over
    its runs), else the most common last evaluation of all runs."""
    rows = tables.run_metrics("eval", metric)
    rows = rows[rows["run_id"].isin(runs["run_id"])]
    if ref_arm is not None and (rows["arm"] == ref_arm).any():
        rows = rows[rows["arm"] == ref_arm]
    if rows.empty:
        return None
    last = rows.groupby("run_id")["step"].max()
    return int(last.value_counts().index[0])


def _longer_arms(tables: Tables, runs: pd.DataFrame, step: int | None, metric: str) -> list[str]:
    """Arms whose runs were evaluated beyond ``step`` (a longer horizon than Table 1's)."""
    if step is None:
        return []
    rows = tables.run_metrics("eval", metric)
    rows = rows[rows["run_id"].isin(runs["run_id"]) & (rows["step"] > step)]
    return [a for a in tables.arm_order(runs) if a in set(rows["arm"])]


def _has_clock(tables: Tables) -> bool:
    from solbench.report.clock import counted_phases

    return bool(counted_phases(tables)[0])


def _vs_reference(tables: Tables, model: str, metric: str, arm: str, ref_arm: str | None, step: int | None = None,
                  seed_rows: list | None = None) -> dict:
    empty = dict(vs_ref_mean=np.nan, vs_ref_lo=np.nan, vs_ref_hi=np.nan, vs_ref_step=np.nan, vs_ref_covers="",
                 eqt_mean=np.nan, eqt_lo=np.nan, eqt_hi=np.nan, eqt_covers="")
    if ref_arm is None or arm == ref_arm:
        return empty
    from solbench.report.equal_time import paired_equal_time

    out = dict(empty)
    p = paired_difference(tables, model, metric, arm, ref_arm, step)
    if p is None:
        p = paired_difference(tables, model, metric, arm, ref_arm)
    if p is not None:
        out.update(vs_ref_mean=p.ci.mean, vs_ref_lo=p.ci.lo, vs_ref_hi=p.ci.hi, vs_ref_step=p.step,
                   vs_ref_covers=p.ci.covers)
        if seed_rows is not None:
            seed_rows.append(p.per_seed_frame(model=model, arm=arm, reference=ref_arm, metric=metric,
                                              comparison="equal iterations"))
    eq = paired_equal_time(tables, model, metric, arm, ref_arm) if _has_clock(tables) else None
    if eq is not None:
        q, budgets = eq
        out.update(eqt_mean=q.ci.mean, eqt_lo=q.ci.lo, eqt_hi=q.ci.hi, eqt_covers=q.ci.covers)
        if seed_rows is not None:
            frame = q.per_seed_frame(model=model, arm=arm, reference=ref_arm, metric=metric,
                                     comparison="equal PROJECTED time")
            seed_rows.append(frame.assign(budget_projected_s=budgets[: len(frame)]).drop(columns=["step", "base_step"]))
    return out


def _per_seed_table(model: str, seed_rows: list, ref_arm: str, headline: str) -> Table:
    data = pd.concat(seed_rows, ignore_index=True)
    shown = data[data["metric"] == headline]
    display = shown.groupby(["arm", "comparison"], sort=False)["difference"].agg(
        lambda v: ", ".join(f"{x:+.4f}" for x in v)).reset_index().rename(columns={"difference": "per seed"})
    return Table(f"main_results_per_seed_{model}", f"Paired differences per run seed, {model}", data, (
        f"Each run seed's own paired difference from {ref_arm} in `{headline}` (mean over the eval prompts common to "
        "every seed of the comparison, each the mean over its eval seeds), at equal iterations and at equal PROJECTED "
        "time, in seed order: the units whose spread is the seed-to-seed variance of the Δ intervals above. Every "
        "reward: the CSV."), display=display)


def long_horizon_table(tables: Tables, model: str, runs: pd.DataFrame, rewards: list[str], step: int) -> Table:
    """Arms that ran beyond Table 1's step: every reward at each evaluation, mean over seeds and Δ vs base."""
    level = tables.options.ci_level
    tidy, display = [], []
    arms = tables.arm_order(runs)
    horizon = {}
    for metric in rewards:
        rows = tables.run_metrics("eval", metric)
        rows = rows[rows["run_id"].isin(runs["run_id"])]
        for arm in arms:
            a = rows[rows["arm"] == arm]
            if a.empty:
                continue
            horizon[arm] = max(horizon.get(arm, 0), int(a["step"].max()))
    long_steps = max(horizon.values()) if horizon else step
    for arm in [a for a in arms if horizon.get(a, 0) >= long_steps]:
        for metric in rewards:
            rows = tables.run_metrics("eval", metric)
            a = rows[rows["run_id"].isin(runs["run_id"]) & (rows["arm"] == arm)]
            base = a[a["step"] == 0].set_index("run_id")["value"]
            for st, g in a.groupby("step"):
                ci = mean_ci(g["value"].values, level)
                delta = mean_ci((g.set_index("run_id")["value"] - base).dropna().values, level)
                tidy.append(dict(model=model, arm=arm, metric=metric, step=int(st), mean=ci.mean, ci_lo=ci.lo,
                                 ci_hi=ci.hi, n_seeds=ci.n, delta_mean=delta.mean, delta_lo=delta.lo, delta_hi=delta.hi))
    data = pd.DataFrame(tidy)
    for (arm, st), g in data.groupby(["arm", "step"], sort=False):
        row = {"method": arm, "step": str(int(st))}
        for _, r in g.iterrows():
            row[r["metric"]] = fmt_ci(CI(r["mean"], r["ci_lo"], r["ci_hi"], int(r["n_seeds"])))
        display.append(row)
    return Table(f"long_horizon_{model}", f"Long horizon ({long_steps} iterations), {model}", data, (
        f"The arms that ran {long_steps} iterations (naive FP4's horizon and its controls), every eval reward at every "
        f"evaluation: mean ± half-width of the {level:.0%} t interval over seeds; delta columns in the CSV (each run's "
        "score minus its own step 0). A decline that the controls share over the same horizon is over-optimisation "
        "any method shows; one that only naive FP4 shows is its own (Findings: naive FP4's decline beyond the "
        "controls)."), display=pd.DataFrame(display))


def _fmt_vs(vs: dict, is_reference: bool) -> str:
    if is_reference:
        return "0 (reference)"
    return fmt_paired(vs["vs_ref_mean"], vs["vs_ref_lo"], vs["vs_ref_hi"], vs.get("vs_ref_covers", ""))


def _covers(tidy: list[dict]) -> str:
    covers = sorted({r.get("vs_ref_covers") for r in tidy if r.get("vs_ref_covers")})
    return "; ".join(covers) if covers else "nothing (no pairs)"


def _skill_breakdown(tables: Tables, model: str, rewards: list[str], step: int | None = None) -> Table | None:
    """Eval reward per prompt skill (``<reward>/<skill>`` metrics) at Table 1's step, mean over seeds."""
    metrics = tables.metrics
    skill_rows = metrics[(metrics["split"] == "eval") & metrics["metric"].astype(str).str.contains("/")]
    if step is not None:
        skill_rows = skill_rows[skill_rows["step"] <= step]
    if skill_rows.empty:
        return None
    runs = tables.done_runs[tables.done_runs["model"] == model]
    rows = skill_rows.merge(runs[["run_id", "arm", "seed"]], on="run_id")
    if rows.empty:
        return None
    rows = rows.sort_values("step")
    last = rows.groupby(["run_id", "metric"]).tail(1)
    last = last.assign(reward=last["metric"].str.split("/").str[0], skill=last["metric"].str.split("/", n=1).str[1])
    last = last[last["reward"] == rewards[0]]
    if last.empty:
        return None
    tidy = (last.groupby(["arm", "skill"])["value"].agg(["mean", "count"]).reset_index()
            .rename(columns={"count": "n_seeds"}))
    order = tables.arm_order(runs)
    wide = tidy.pivot(index="arm", columns="skill", values="mean").reindex([a for a in order if a in set(tidy["arm"])])
    display = wide.map(lambda v: f"{v:.4f}" if pd.notna(v) else "-").reset_index().rename(columns={"arm": "method"})
    caption = (f"`{rewards[0]}` per prompt skill at Table 1's step (each run's last evaluation at or before "
               f"{step}), model `{model}`; mean over seeds "
               "(no interval: per-skill groups are small). Where a method gains or loses relative to the others.")
    return Table(f"main_results_skills_{model}", f"Per-skill breakdown, {model}", tidy, caption, display=display)
