"""The Findings' quality claims (Tables 1, 2, 3, 6 and naive FP4), each judged on every eval reward.

Effects are paired differences on the same eval prompts and eval seeds, runs paired by run seed, with the
crossed-design interval (solbench/report/paired.py). Claims and effects (docs/reports.md, "Findings"):

1. Table 1 at equal iterations: Sol-RL - DiffusionNFT at the last evaluation both runs of a pair reached.
2. Table 1 at equal PROJECTED GPU time (the paper compares at equal GPU-hours): the same pairs at the
   projected clock both reached (solbench/report/equal_time.py); beside it, exploratory, at the MEASURED clock
   both reached (these runs' own wall clock).
3. Table 6, non-inferiority to naive BF16 scaling: (Sol-RL - naive BF16) / naive BF16's score > -margin.
4. Naive FP4 ends below Sol-RL, at equal iterations and at naive FP4's end (against a Sol-RL arm run to the
   same horizon when there is one; otherwise against Sol-RL's end, at unequal iterations, said so).
5. Naive FP4 peaks and then declines: final - peak of its mean curve on that reward (the peak is chosen on
   the same data, which favours the claim); no peak, and nothing tested, where the last reading is the curve's
   maximum.
6. Naive FP4's decline is its own: [naive FP4 final - its peak step] - [control final - control at that step]
   for every control arm run to the same horizon (Sol-RL, a BF16 method): a decline the controls share over
   the same iterations is over-optimisation, not FP4.
7. Table 3, N at fixed K; Table 2, explore steps (up to 6); the public code's stage1_select_mode ablation (not a
   paper table: issue 48), best_worst selection against random at the same N and K.
8. Naive FP4 at equal iterations is left out where it is the same comparison as at naive FP4's end (a Sol-RL arm
   run as long: one comparison, counted once).
9. Where the spec declares a read-out iteration (``report.readout_iteration``, solbench/report/readout.py), the
   paired claims at equal iterations (Tables 1, 2, 3, 6, the selection ablation) are read there, and naive FP4
   against Sol-RL gets its primary row there ("at the read-out iteration"); every paired reading carries the
   read-out flag of an arm past reward hacking. Sol-RL against its full-precision-preview twin:
   solbench/report/findings_twin.py.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from solbench.report.findings_common import Finding, arms_recipe, axis_arms, main_arm, reward_roles, seed_cost_s
from solbench.report.paired import (Paired, _eval_steps, paired_at_steps, paired_difference, paired_steps,
                                    prompt_differences, sample_rows, seed_runs)
from solbench.report.readout import readout_step
from solbench.report.stats import INCONCLUSIVE, fmt_num, paired_ci
from solbench.report.tables import Tables, same_method

TABLE1 = "+0.093 ImageReward (+5.6 %), +0.0075 HPSv2 on FLUX.1"
_AT_READOUT = " Read at the read-out iteration {step} (report.readout_iteration, declared before the data)."
NAIVE_FP4 = "naive FP4 peaks near HPSv2 0.36, below Sol-RL's 0.3688"


def paired_finding(f: Finding, p: Paired | None, why_missing: str, *, relative: bool = False, tables: Tables | None = None,
                   arms: tuple = ()) -> Finding:
    """Fill ``f`` from a paired difference (or say why there is none) and decide it; ``arms`` (with ``tables``) name
    the explore recipe of the arms compared (``Finding.recipe``)."""
    if tables is not None and arms:
        f.recipe = arms_recipe(tables, f.model, arms)
        f.seed_cost_s = seed_cost_s(tables, f.model, arms)
    if p is None:
        f.detail = why_missing
        return f
    if tables is not None and arms:
        f.readout_flag = _flag(tables, f.model, arms, p)
    scale = abs(p.base_mean) if relative and p.base_mean else 1.0
    f.effect, f.lo, f.hi = p.ci.mean / scale, p.ci.lo / scale, p.ci.hi / scale
    f.base_mean = p.base_mean
    if p.ci.components is not None and p.ci.n_prompts:
        f.components = p.ci.components.scaled(scale)
    f.covers = p.ci.covers
    f.prompts_only = not p.ci.seed_variance_estimated
    f.per_seed = json.dumps({str(s): round(v / scale, 6) for s, v in zip(p.seeds, p.ci.per_seed)})
    steps = f"Step {p.step}; " if p.step is not None else ""
    means = (f"; means {fmt_num(p.arm_mean)} vs {fmt_num(p.base_mean)}"
             if np.isfinite(p.arm_mean) and np.isfinite(p.base_mean) else "")
    f.detail += f" {steps}{len(p.seeds)} seed pair(s){means}."
    if f.prompts_only and len(p.seeds) > 0 and p.ci.n_prompts:
        f.detail += (f" {len(p.seeds)} run seed(s): the seed-to-seed variance is not estimated, so this interval "
                     "rests on the eval prompts alone.")
    return f.decide()


def _flag(tables: Tables, model: str, arms: tuple, p: Paired) -> str:
    """The read-out flag of a paired reading (solbench.report.readout): each arm at the steps it was read at."""
    from solbench.report.readout import flag_text

    steps = p.steps or ((p.step, p.step),)
    for i, arm in enumerate(arms[:2]):
        read = [s[i] if len(arms) > 1 else s[0] for s in steps]
        read = [s for s in read if s is not None]
        text = flag_text(tables, model, [arm], max(read)) if read else ""
        if text:
            return text
    return ""


def _each_reward(tables: Tables, runs: pd.DataFrame, model: str, make, compute) -> list[Finding]:
    """One Finding per eval reward: ``make()`` a fresh Finding, ``compute(f, metric)`` fills it."""
    out = []
    for metric, role in reward_roles(tables, runs):
        f = make()
        f.model, f.metric, f.role = model, metric, role
        f.key = f.key or f.claim
        out.append(compute(f, metric))
    return out


def _pair_claim(tables: Tables, runs: pd.DataFrame, model: str, make, arm: str | None, base: str | None, missing: str,
                *, relative: bool = False, describe=None) -> list[Finding]:
    """A claim on the paired difference arm - base at equal iterations (the read-out iteration where the spec declares
    one: ``report.readout_iteration``), one Finding per eval reward."""
    step = readout_step(tables)

    def compute(f, metric):
        if arm and base:
            f.detail = describe(metric) if describe else f"Δ = {arm} - {base}, `{metric}`."
            f.detail += _AT_READOUT.format(step=step) if step is not None else ""
        p = paired_difference(tables, model, metric, arm, base, step=step) if arm and base else None
        return paired_finding(f, p, missing, relative=relative, tables=tables, arms=(arm, base))

    return _each_reward(tables, runs, model, make, compute)


def _long_arms(tables: Tables, runs: pd.DataFrame, step: int, metric: str, exclude: str) -> list[str]:
    """Arms (other than ``exclude``'s method) whose runs were evaluated at ``step``: the long-horizon controls."""
    m = tables.run_metrics("eval", metric)
    m = m[m["run_id"].isin(runs["run_id"]) & (m["step"] == step)]
    return [a for a in tables.arm_order(runs) if a in set(m["arm"])
            and not same_method(runs.loc[runs["arm"] == a, "method"].iloc[0], exclude)]


def _fp4_curve(tables: Tables, model: str, arm: str, metric: str) -> pd.Series:
    m = tables.run_metrics("eval", metric)
    m = m[(m["model"] == model) & (m["arm"] == arm)]
    return m.groupby("step")["value"].mean().sort_index()


def _did(tables: Tables, model: str, metric: str, arm: str, control: str, final: int, peak: int) -> Paired | None:
    """Per seed and prompt: [arm(final) - arm(peak)] - [control(final) - control(peak)], crossed interval."""
    a_runs, c_runs = seed_runs(tables, model, arm), seed_runs(tables, model, control)
    samples = sample_rows(tables, metric)
    rows, seeds = [], []
    for seed in sorted(set(a_runs) & set(c_runs), key=str):
        ra, rc = a_runs[seed], c_runs[seed]
        if not ({final, peak} <= _eval_steps(tables, ra, metric) and {final, peak} <= _eval_steps(tables, rc, metric)):
            continue
        da = prompt_differences(samples, ra, final, ra, peak)
        dc = prompt_differences(samples, rc, final, rc, peak)
        both = pd.concat([da.rename("a"), dc.rename("c")], axis=1, join="inner")
        if both.empty:
            continue
        rows.append(both["a"] - both["c"])
        seeds.append(seed)
    if not rows:
        return None
    matrix = pd.concat(rows, axis=1, join="inner").T.to_numpy(float)
    return Paired(paired_ci(matrix, level=tables.options.ci_level), final, float("nan"), float("nan"), seeds)


def _peak(curve: pd.Series) -> int | None:
    """The step of a mean curve's peak before its last reading (after the first), or None where the last reading is
    the maximum of the curve: then nothing peaked and declined (issue 54: the peak is compared with the last
    reading, never chosen among the interior points alone)."""
    interior = curve.iloc[1:-1]
    if interior.empty or not float(curve.iloc[-1]) < float(interior.max()):
        return None
    return int(interior.idxmax())


def no_peak(curve: pd.Series, arm: str | None, metric: str) -> str:
    return (f"No peak: {arm}'s mean `{metric}` is highest at its last reading (step {int(curve.index[-1])}, "
            f"{float(curve.iloc[-1]):.4f}), so it has not declined from a peak; nothing to test.")


def quality_findings(tables: Tables, model: str, runs: pd.DataFrame) -> list[Finding]:
    from solbench.report.equal_time import paired_equal_time

    o = tables.options
    sol, nft = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "diffusion_nft")
    naive, fp4 = main_arm(tables, runs, "naive_bf16"), main_arm(tables, runs, "naive_fp4")
    fp4 = _same_recipe_arm(runs, fp4, sol)
    out: list[Finding] = []

    out += _pair_claim(tables, runs, model, lambda: Finding(
        "Sol-RL beats DiffusionNFT at equal iterations", "Table 1 (compared there at equal GPU-hours)", TABLE1,
        unit="abs", threshold=0.0), sol, nft, "Needs Sol-RL and DiffusionNFT runs with common run seeds.")

    from solbench.report.equal_time import MEASURED

    def equal_time(f, metric, clock=None):  # clock None: the PROJECTED GPU clock; MEASURED: these runs' own
        eq = paired_equal_time(tables, model, metric, sol, nft, clock) if sol and nft else None
        if eq is None:
            f.detail = "Needs Sol-RL and DiffusionNFT runs with common run seeds, per-sample eval rows and FLOP counts."
            return f
        p, budgets = eq
        at = (f"the PROJECTED GPU clock both reached ({fmt_num(float(np.mean(budgets)) * 1e3, 3)} ms on one "
              f"{o.hardware} at {o.mfu:.0%}, mean over seeds)" if clock is None else
              f"the MEASURED wall clock both reached ({fmt_num(float(np.mean(budgets)), 1)} s on this machine, mean "
              "over seeds)")
        f.detail = (f"Δ = {sol} - {nft}, `{metric}`, each pair at {at}; per-sample scores interpolated between "
                    "evaluations. " + ("The time axis is a PROJECTION, the scores are measured." if clock is None else
                                       "The Table 1 at equal time table adds the projection at NVFP4 2x, 3x and 4x "
                                       "BF16's rate."))
        return paired_finding(f, p, "", tables=tables, arms=(sol, nft))

    out += _each_reward(tables, runs, model, lambda: Finding(
        "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time", "Table 1 (equal GPU-hours)", TABLE1, unit="abs",
        threshold=0.0), equal_time)
    out += _each_reward(tables, runs, model, lambda: Finding(  # issue 54: beside the projection, exploratory
        "Sol-RL beats DiffusionNFT at equal MEASURED time", "Table 1 (equal GPU-hours, this machine's clock)", TABLE1,
        unit="abs", threshold=0.0), lambda f, metric: equal_time(f, metric, MEASURED))

    out += _pair_claim(tables, runs, model, lambda: Finding(
        "Sol-RL matches naive BF16 scaling (non-inferior)", "Table 6",
        "gap -0.29 % (FLUX), -1.08 % (SD3.5-L), +0.11 % (SANA)", unit="rel", threshold=-o.noninferiority_margin),
        sol, naive, "Needs Sol-RL and naive BF16 scaling runs with common run seeds.", relative=True,
        describe=lambda metric: (f"Δ = ({sol} - {naive}) / {naive}'s score, `{metric}`; margin "
                                 f"{o.noninferiority_margin:.0%}."))
    out += _naive_fp4(tables, model, runs, sol, fp4)
    out += _ablation_claims(tables, model, runs)
    return out


def _naive_fp4(tables: Tables, model: str, runs: pd.DataFrame, sol: str | None, fp4: str | None) -> list[Finding]:
    out: list[Finding] = []

    out += _pair_claim(tables, runs, model, lambda: Finding(
        "Naive FP4 ends below Sol-RL (equal iterations)", "Sec. naive FP4", NAIVE_FP4, unit="abs", threshold=0.0,
        direction="less"), fp4, sol, "Needs naive FP4 and Sol-RL runs with common run seeds.")

    def at_end(f, metric):
        curve = _fp4_curve(tables, model, fp4, metric) if fp4 else pd.Series(dtype=float)
        if not sol or curve.empty:
            f.detail = "Needs naive FP4 and Sol-RL runs with common run seeds."
            return f
        final = int(curve.index[-1])
        longs = runs[runs["arm"].isin(_long_arms(tables, runs, final, metric, "naive_fp4"))]
        long_sol = main_arm(tables, longs, "sol_rl") if not longs.empty else None
        if long_sol:
            f.detail = f"Δ = {fp4} - {long_sol} at step {final} (both at naive FP4's end), `{metric}`."
            return paired_finding(f, paired_difference(tables, model, metric, fp4, long_sol, final), "No common seeds.",
                                  tables=tables, arms=(fp4, long_sol))
        sol_final = int(_fp4_curve(tables, model, sol, metric).index[-1])
        f.detail = (f"Δ = {fp4} at its end (step {final}) - {sol} at its end (step {sol_final}): UNEQUAL iterations "
                    "(no Sol-RL arm ran naive FP4's horizon), `{metric}`.").replace("{metric}", metric)
        return paired_finding(f, paired_at_steps(tables, model, metric, fp4, sol, final, sol_final), "No common seeds.",
                              tables=tables, arms=(fp4, sol))

    ends = _each_reward(tables, runs, model, lambda: Finding(
        "Naive FP4 ends below Sol-RL (at naive FP4's end)", "Sec. naive FP4", NAIVE_FP4, unit="abs", threshold=0.0,
        direction="less"), at_end)
    readout = readout_step(tables)
    if readout is not None:  # the primary, read where the spec declared before the data (report.readout_iteration)
        def at_readout(f, metric):
            if not (fp4 and sol):
                f.detail = "Needs naive FP4 and Sol-RL runs with common run seeds."
                return f
            f.detail = f"Δ = {fp4} - {sol}, `{metric}`." + _AT_READOUT.format(step=readout)
            return paired_finding(f, paired_difference(tables, model, metric, fp4, sol, readout),
                                  f"No common seeds evaluated at iteration {readout}.", tables=tables, arms=(fp4, sol))

        # the equal-iterations rows were read there too: the same comparison, counted once, as the read-out claim
        out = []
        ends += _each_reward(tables, runs, model, lambda: Finding(
            "Naive FP4 ends below Sol-RL (at the read-out iteration)", "Sec. naive FP4", NAIVE_FP4, unit="abs",
            threshold=0.0, direction="less"), at_readout)
    same = len(out) == len(ends) and all(a.per_seed and a.per_seed == b.per_seed and a.effect == b.effect
                                         for a, b in zip(out, ends))
    if same:  # one comparison (the arms and step coincide): counted once, as the claim at naive FP4's end
        out = []
        for f in ends:
            f.detail += " At equal iterations this is the same comparison (the same arms at the same step)."
    out += ends

    def peak_decline(f, metric):
        curve = _fp4_curve(tables, model, fp4, metric) if fp4 else pd.Series(dtype=float)
        if len(curve) < 3:
            f.detail = "Needs naive FP4 runs with at least 3 evaluations."
            return f
        final, peak = int(curve.index[-1]), _peak(curve)
        if peak is None:
            f.detail, f.verdict = no_peak(curve, fp4, metric), INCONCLUSIVE
            return f
        f.detail = (f"Δ = {fp4} at its final step {final} - at the peak of its mean curve before it (step {peak}), "
                    f"`{metric}`; the peak is chosen on these data, which favours the claim.")
        return paired_finding(f, paired_steps(tables, model, metric, fp4, final, peak), "No naive FP4 run has both steps.",
                              tables=tables, arms=(fp4,))

    out += _each_reward(tables, runs, model, lambda: Finding(
        "Naive FP4 peaks and then declines", "Sec. naive FP4", "HPSv2 peaks (about 0.36) near step 180, then declines",
        unit="abs", threshold=0.0, direction="less"), peak_decline)

    headline = tables.headline_metric()
    curve = _fp4_curve(tables, model, fp4, headline) if fp4 else pd.Series(dtype=float)
    controls = []  # per method, its main arm among those run to naive FP4's horizon
    if len(curve) >= 3:
        longs = _long_arms(tables, runs, int(curve.index[-1]), headline, "naive_fp4")
        reaching = runs[runs["arm"].isin(longs)]
        controls = [a for m in dict.fromkeys(reaching["method"]) if (a := main_arm(tables, reaching, m))]
    for control in controls or [None]:
        def own(f, metric, control=control):
            c = _fp4_curve(tables, model, fp4, metric) if fp4 else pd.Series(dtype=float)
            if control is None or len(c) < 3:
                f.detail = ("Needs a control arm (Sol-RL or a BF16 method) run to naive FP4's horizon with the same "
                            "seeds, so that a decline can be told from over-optimisation any method shows.")
                return f
            final, peak = int(c.index[-1]), _peak(c)
            if peak is None:
                f.detail, f.verdict = no_peak(c, fp4, metric), INCONCLUSIVE
                return f
            f.detail = (f"Δ = [{fp4} step {final} - step {peak}] - [{control} step {final} - step {peak}], `{metric}` "
                        "(steps: naive FP4's final evaluation and its peak on this reward).")
            return paired_finding(f, _did(tables, model, metric, fp4, control, final, peak), "No common seeds.",
                                  tables=tables, arms=(fp4, control))

        name = f" than {control}" if control else " than a long-horizon control"
        out += _each_reward(tables, runs, model, lambda name=name: Finding(
            f"Naive FP4 declines more{name} over the same iterations", "Sec. naive FP4",
            "training on FP4 samples corrupts the policy (a decline naive FP4 alone shows)", unit="abs", threshold=0.0,
            direction="less"), own)
    return out


#: The K / selection-mode ablation of the public code (its ``stage1_select_mode``, best_worst by default): no paper
#: table (the paper's Table 4 is the CLIP score of NVFP4 against BF16 images, solbench/report/findings_table4.py), so
#: an exploratory row: best_worst (top K/2 + bottom K/2 by proxy reward) against random selection at the same N and K.
SELECTION = "best_worst (top K/2 + bottom K/2 by the FP4 proxy) is the public code's default; no paper table or figure"
SELECTION_TABLE = "Ablation (public code's stage1_select_mode; not a paper table)"


def _pick_selection(values: list) -> tuple:
    return ("best_worst", "random") if {"best_worst", "random"} <= set(values) else (None, None)


def _ablation_claims(tables: Tables, model: str, runs: pd.DataFrame) -> list[Finding]:
    out: list[Finding] = []
    for axis, claim, table, paper, pick in (
            ("n", "Reward grows with the candidate pool N at fixed K", "Table 3",
             "HPSv2 0.3569 (N=24) -> 0.3686 (N=96): +0.0117", lambda vals: (vals[-1], vals[0])),
            ("explore_steps", "More explore steps (up to 6) give a better policy", "Table 2",
             "HPSv2 0.3587 (2 steps) -> 0.3686 (6 steps): +0.0099; 8 steps 0.3659",
             lambda vals: (max([v for v in vals if float(v) <= 6] or [vals[0]], key=float), vals[0])),
            ("selection", "Contrastive selection (best_worst) beats random selection", SELECTION_TABLE,
             SELECTION, _pick_selection)):
        arms = axis_arms(tables, runs, "sol_rl", axis)

        def compute(f, metric, arms=arms, axis=axis, pick=pick):
            if len(arms) < 2:
                f.detail = f"Needs Sol-RL runs at two or more values of {axis} (other settings equal)."
                return f
            hi_v, lo_v = pick(list(arms))
            if hi_v is None:
                f.detail = f"Needs Sol-RL arms with {axis} best_worst and random (other settings equal)."
                return f
            if hi_v == lo_v:
                f.detail = f"Needs a Sol-RL arm at {axis} <= 6 above the smallest value."
                return f
            step = readout_step(tables)
            f.detail = f"Δ = {arms[hi_v]} - {arms[lo_v]}, `{metric}`." + (_AT_READOUT.format(step=step) if step else "")
            return paired_finding(f, paired_difference(tables, model, metric, arms[hi_v], arms[lo_v], step),
                                  f"No common run seeds between {arms[hi_v]} and {arms[lo_v]}.", tables=tables,
                                  arms=(arms[hi_v], arms[lo_v]))

        out += _each_reward(tables, runs, model, lambda claim=claim, table=table, paper=paper: Finding(
            claim, table, paper, unit="abs", threshold=0.0), compute)
    return out


def _same_recipe_arm(runs: pd.DataFrame, arm: str | None, like: str | None) -> str | None:
    """``arm``, or where its explore recipe differs from ``like``'s an arm of the same method with ``like``'s recipe
    (most seeds first): in a spec that varies quant.recipe (tiny_dose) naive FP4 is compared with Sol-RL on one
    explore copy, never across copies. Unchanged where no such arm exists or no recipe is recorded."""
    col = "p_quant.recipe"
    if arm is None or like is None or col not in runs:
        return arm
    recipe_of = runs.groupby("arm")[col].first()
    if recipe_of.get(arm) == recipe_of.get(like):
        return arm
    method = runs.loc[runs["arm"] == arm, "method"].iloc[0]
    same = runs[(runs["method"] == method) & (runs[col] == recipe_of.get(like))]
    if same.empty:
        return arm
    return str(same.groupby("arm")["seed"].nunique().sort_values(ascending=False, kind="stable").index[0])
