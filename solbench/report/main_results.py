"""Main results (the paper's Table 1): per model, methods x eval rewards, base score and delta.

For every done run and every eval reward: the value at the run's last evaluation and at step 0
(the base model, evaluated with the same prompts and seeds before any update). An arm's score is the
mean over seeds with a t interval; the delta is paired per run (final - own step 0), then averaged
over seeds, which removes the seed-to-seed variation of the eval noise from the comparison.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.paired import paired_difference
from solbench.report.registry import Note, Table, report_kind
from solbench.report.stats import fmt_ci, mean_ci
from solbench.report.tables import Tables, same_method


def final_and_base(tables: Tables, metric: str) -> pd.DataFrame:
    """One row per done run: model, arm, method, seed, final_step, final, base (step-0 value)."""
    rows = tables.run_metrics("eval", metric)
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
    per_run = pd.concat([final_and_base(tables, m).assign(metric=m) for m in rewards], ignore_index=True)
    outputs = []
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        data = per_run[per_run["model"] == model]
        if data.empty:
            outputs.append(Note(f"Main results, {model}", f"No done run of model `{model}` has evaluation rows."))
            continue
        tidy, display_rows = [], []
        ref_arm = reference_arm(tables, runs)
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
                vs = _vs_reference(tables, model, metric, arm, ref_arm)
                tidy.append(dict(model=model, arm=arm, method=str(d["method"].iloc[0]) if len(d) else arm,
                                 metric=metric, mean=ci.mean, ci_lo=ci.lo, ci_hi=ci.hi, n_seeds=ci.n,
                                 delta_mean=dci.mean, delta_lo=dci.lo, delta_hi=dci.hi,
                                 final_step=steps[-1] if steps else np.nan, reference=ref_arm, **vs))
                row[metric] = fmt_ci(ci)
                row[f"Δ {metric}"] = fmt_ci(dci)
                if ref_arm is not None:
                    row[f"Δ vs {ref_arm} {metric}"] = _fmt_vs(vs, arm == ref_arm)
            row["seeds"] = str(int(a["seed"].nunique()))
            display_rows.append(row)
        tidy_df = pd.DataFrame(tidy)
        final_steps = sorted(tidy_df.loc[tidy_df["arm"] != "Base (step 0)", "final_step"].dropna().astype(int).unique())
        setup = _eval_setup(tables, runs)
        caption = (
            f"Mirrors the paper's Table 1 (main results). Model `{model}`. Each cell: the eval reward at each "
            f"run's last evaluation (step {', '.join(map(str, final_steps))}), mean ± half-width of the "
            f"{level:.0%} Student-t interval over seeds (the `seeds` column; one seed gives no interval). "
            "Δ: the run's final score minus its own step-0 score (the base model on the same eval prompts and "
            "seeds), averaged over seeds. Base (step 0): the model before any RL update."
            + (f" Δ vs {ref_arm}: paired difference from the reference method ({ref_arm}) on the same eval prompts "
               "and eval seeds, runs paired by run seed, at the last evaluation both runs of a pair reached (equal "
               f"iterations); [{level:.0%} hierarchical bootstrap interval, {tables.options.n_boot} resamples, "
               f"covering {_covers(tidy)}]." if ref_arm is not None else
               f" No run of the reference method `{tables.options.reference_method}`: no paired Δ column.")
            + (f" Evaluation: {setup}." if setup else "")
            + " Higher is better for every reward listed."
        )
        outputs.append(Table(f"main_results_{model}", f"Main results, {model}", tidy_df, caption,
                             display=pd.DataFrame(display_rows)))
        skills = _skill_breakdown(tables, model, rewards)
        if skills is not None:
            outputs.append(skills)
    return outputs


def reference_arm(tables: Tables, runs: pd.DataFrame) -> str | None:
    """The arm every method is compared with (``reference_method``, default DiffusionNFT); None if absent."""
    for arm in tables.arm_order(runs):
        if same_method(runs.loc[runs["arm"] == arm, "method"].iloc[0], tables.options.reference_method):
            return arm
    return None


def _vs_reference(tables: Tables, model: str, metric: str, arm: str, ref_arm: str | None) -> dict:
    empty = dict(vs_ref_mean=np.nan, vs_ref_lo=np.nan, vs_ref_hi=np.nan, vs_ref_step=np.nan, vs_ref_covers="")
    if ref_arm is None or arm == ref_arm:
        return empty
    p = paired_difference(tables, model, metric, arm, ref_arm)
    if p is None:
        return empty
    return dict(vs_ref_mean=p.ci.mean, vs_ref_lo=p.ci.lo, vs_ref_hi=p.ci.hi, vs_ref_step=p.step,
                vs_ref_covers=p.ci.covers)


def _fmt_vs(vs: dict, is_reference: bool) -> str:
    if is_reference:
        return "0 (reference)"
    mean, lo, hi = vs["vs_ref_mean"], vs["vs_ref_lo"], vs["vs_ref_hi"]
    if not np.isfinite(mean):
        return "- (no same-seed pair)"
    if not np.isfinite(lo):
        return f"{mean:+.4f} (no interval)"
    return f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def _covers(tidy: list[dict]) -> str:
    covers = sorted({r.get("vs_ref_covers") for r in tidy if r.get("vs_ref_covers")})
    return "; ".join(covers) if covers else "nothing (no pairs)"


def _skill_breakdown(tables: Tables, model: str, rewards: list[str]) -> Table | None:
    """Final eval reward per prompt skill (``<reward>/<skill>`` metrics), mean over seeds."""
    metrics = tables.metrics
    skill_rows = metrics[(metrics["split"] == "eval") & metrics["metric"].astype(str).str.contains("/")]
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
    caption = (f"`{rewards[0]}` per prompt skill at the last evaluation, model `{model}`; mean over seeds "
               "(no interval: per-skill groups are small). Where a method gains or loses relative to the others.")
    return Table(f"main_results_skills_{model}", f"Per-skill breakdown, {model}", tidy, caption, display=display)
