"""The Findings' speed and fidelity claims: Table 5 (rollout / E2E speedup), convergence, Table 8.

- Table 5: measured seconds per iteration (a verdict on GPU runs; "not measured" on CPU / emulated FP4) and
  the PROJECTION from counted FLOPs at the precision each FLOP ran at (solbench/report/clock.py). The
  projected ratio follows from the configuration (every seed counts the same FLOPs), so it is reported as a
  projection with its inputs, never judged.
- Convergence: time for Sol-RL to reach DiffusionNFT's final score, on the measured clock and on the
  PROJECTED clock (a projected time axis under measured reward curves: judged, and labelled).
- Table 8: mean per-prompt Spearman rho of the all-seeds fidelity runs with an NVFP4 recipe, per reward and
  per checkpoint (the final policy, and the base model when it was measured), judged for non-inferiority to
  the paper's 0.927 with ``fidelity_margin``; hit@K beside its chance level K/N.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.findings_common import TRAINING, Finding, main_arm, seed_cost_s
from solbench.report.stats import INCONCLUSIVE, NOT_MEASURED, PROJECTION, fmt_num, ratio_ci
from solbench.report.tables import ROLLOUT_PHASES, Tables, same_method

PAPER_T5 = {"rollout": "2.33x (FLUX), 2.41x (SD3.5-L), 1.41x (SANA)", "E2E": "1.62x (FLUX), 1.61x (SD3.5-L), 1.25x (SANA)"}
PAPER_CONVERGENCE = "3.00x (FLUX), 4.64x (SD3.5-L), 2.42x (SANA) on ImageReward; 1.9x-3.9x on other metrics"
PAPER_T8 = "Spearman ρ 0.927, Kendall τ 0.798; top-K hit 96.9/95.0/93.3 % (K=4/8/12) at N=96 (chance 4/8/12.5 %)"


def _emulated(tables: Tables, runs: pd.DataFrame | None = None) -> str | None:
    """Whether the explore clock of ``runs`` (default every done run) is emulated: "cpu" / "emulated", or None where
    it computed on low-precision units."""
    from solbench.report.timing import emulation_caveat

    if emulation_caveat(tables, runs) is None:
        return None
    return "cpu" if "cpu" in tables.device_kinds() else "emulated"


def _uncounted(tables: Tables, kind: str) -> list[str]:
    from solbench.report.clock import counted_phases

    _, uncounted = counted_phases(tables)
    compute = {"explore", "regenerate", "rollout", "train"}  # phases that run the transformer
    wanted = compute & (set(tables.rollout_phases()) if kind == "rollout" else compute)
    return sorted(p for p in uncounted if p in wanted)


def _projected_iteration(proj: pd.DataFrame, runs: pd.DataFrame, arm: str, kind: str,
                         rollout_phases: tuple[str, ...] = ROLLOUT_PHASES) -> pd.DataFrame:
    """Per run of ``arm``: median per-iteration projected seconds and its FLOPs by precision."""
    p = proj[proj["run_id"].isin(runs.loc[runs["arm"] == arm, "run_id"])]
    if kind == "rollout":
        p = p[p["phase"].isin(rollout_phases)]
    if p.empty:
        return pd.DataFrame(columns=["projected_s", "explore_flops", "full_flops", "share"])
    p = p.assign(explore_flops=np.where(p["precision"] == "explore", p["flops"], 0.0),
                 full_flops=np.where(p["precision"] == "explore", 0.0, p["flops"]))
    per_iter = p.groupby(["run_id", "step"]).agg(projected_s=("projected_s", "sum"), explore_flops=("explore_flops", "sum"),
                                                 full_flops=("full_flops", "sum"), share=("quantized_share", "max"))
    return per_iter.groupby("run_id").median()


def _projection_inputs(name: str, it: pd.DataFrame) -> str:
    share = float(it["share"].mean())
    explore = float(it["explore_flops"].mean())
    text = f"{name}: {fmt_num(float(it['full_flops'].mean()) / 1e9, 3)} GFLOP at BF16"
    if explore:
        text += f" + {fmt_num(explore / 1e9, 3)} GFLOP explore, {share:.0%} of it at low precision"
    return text + " per iteration"


def speed_findings(tables: Tables, model: str, runs: pd.DataFrame) -> list[Finding]:
    from solbench.report.clock import hardware, phase_projection
    from solbench.report.timing import _ratio_of_means, per_run_medians, quiet_runs

    o = tables.options
    sol, naive = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "naive_bf16")
    emulated = _emulated(tables, runs[runs["arm"] == sol] if sol else None)  # the compared arm's clock
    out = []
    med = per_run_medians(tables)[0] if sol and naive else pd.DataFrame()
    quiet, load_text = quiet_runs(tables, med[med["arm"].isin([sol, naive])] if len(med) else med)
    explore = f" Sol-RL's explore copy: {_explore_of_arm(tables, runs, sol)}." if sol else ""
    proj = phase_projection(tables)
    hw = hardware(tables)
    block = _block_findings(tables, model)  # the spec's speed block, where it ran: the measured rows
    for kind, col in (("rollout", "rollout_s"), ("E2E", "e2e_s")):
        f = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (measured)", "Table 5", PAPER_T5[kind], unit="ratio",
                    threshold=1.0, model=model)
        if kind in block:  # the training runs' clock stays, as an exploratory row
            out.append(block[kind])
            f.claim = f"Sol-RL {kind} speedup over naive BF16 scaling (timed during training beside other runs)"
            f.key = f"{f.claim} exploratory"
        p = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (PROJECTION from counted FLOPs)", "Table 5",
                    PAPER_T5[kind], unit="ratio", threshold=1.0, model=model, verdict=PROJECTION)
        if not (sol and naive):
            f.detail = p.detail = "Needs Sol-RL and naive BF16 scaling runs."
            p.verdict = NOT_MEASURED
            out += [f, p]
            continue
        timed = med[med["run_id"].isin(quiet)]
        mb, mt = timed[timed["arm"] == naive][col].to_numpy(), timed[timed["arm"] == sol][col].to_numpy()
        if len(mb) and len(mt):
            f.effect = _ratio_of_means(mb, mt)
            f.lo, f.hi = ratio_ci(mb, mt, level=o.ci_level)  # issue 48: no percentile bootstrap over 2-3 seeds
            _declared_ratio_power(f, mb, mt, kind, model)
            f.seed_cost_s = seed_cost_s(tables, model, (naive, sol))
            f.covers = (f"run seeds of each arm ({len(mb)} and {len(mt)}), t interval of the log ratio" if np.isfinite(f.lo)
                        else f"nothing: fewer than 2 run seeds in an arm ({len(mb)} and {len(mt)})")
            f.detail = (f"{naive} / {sol} seconds per iteration (median per run after warm-up). {load_text}"
                        f"{explore}")
            if emulated:
                f.verdict = NOT_MEASURED
                f.detail += (" Measured on CPU / with emulated FP4, which is slower than full precision: this spec's "
                             "clock cannot speak to FP4 hardware (see the PROJECTION row).")
            else:
                f.decide()
                if "cpu" in tables.device_kinds():
                    from solbench.report.timing import cpu_label

                    f.detail += (f" Measured on {cpu_label(tables)}, the explore copy on the CPU's bf16 units "
                                 "(cpu_bf16): a real clock of low-precision against full-precision units.")
        else:
            f.detail = (f"No timings of these arms left to compare. {load_text}" if len(med) else
                        "No timings of these arms.")
        out.append(f)
        phases = tables.rollout_phases()
        ib, it = (_projected_iteration(proj, runs, naive, kind, phases),
                  _projected_iteration(proj, runs, sol, kind, phases))
        uncounted = _uncounted(tables, kind)
        if len(ib) and len(it) and not uncounted:
            p.effect = float(ib["projected_s"].mean() / it["projected_s"].mean())
            p.covers = "none: the value follows from the configuration (counted FLOPs), the same for every seed"
            p.detail = (f"PROJECTION on {hw.name} at {o.mfu:.0%}, from {_projection_inputs(naive, ib)} and "
                        f"{_projection_inputs(sol, it)}; explore FLOPs at the share of a forward the run's recipe "
                        f"quantizes (solbench.quant.shares) at {hw.name}'s {hw.explore_peak()[1]} rate, everything else "
                        f"at BF16.{explore}")
        else:
            p.verdict = NOT_MEASURED
            p.detail = ("No FLOP counts for these arms." if not (len(ib) and len(it)) else
                        f"Phases {', '.join(uncounted)} carry no FLOP count: a projection without them is not this claim.")
        out.append(p)
    return out


def _declared_ratio_power(f: Finding, base, target, kind: str, model: str) -> Finding:
    """The training clock's power (run seeds of two arms, ``stats.ratio_power``) toward the paper's ratio, not the
    observed one (which would make the power cell circular)."""
    from solbench.report.stats import ratio_power
    from solbench.report.speed_stats import PAPER_RATIOS

    paper = dict(zip(("rollout", "E2E"), PAPER_RATIOS.get(model, PAPER_RATIOS["flux"])))[kind]
    f.mde, f.seeds_needed = ratio_power(base, target, paper - 1.0)
    f.n_arm_seeds = min(len(base), len(target))
    if math.isfinite(f.mde):
        f.power_note = (f"target {paper:.2f}x (the paper's {kind} ratio, Table 5; declared, not the observed ratio), "
                        f"{len(base)} and {len(target)} seeds of the two arms")
    return f


def _block_findings(tables: Tables, model: str) -> dict[str, Finding]:
    """Table 5's measured rows from the spec's speed block (solbench.report.speed_block), by kind: Sol-RL's paired
    ratio over naive BF16 scaling within rounds, the interval over rounds, the existing verdict rule; power from
    the round-to-round spread against a declared target (the block's, else the paper's ratio), never the observed
    one. {} where the block has no eager Sol-RL and baseline arms."""
    from solbench.report.speed_block import block_ratios, speed_rows
    from solbench.report.speed_stats import PAPER_RATIOS, round_power

    if model not in set(tables.done_runs["model"].astype(str)) and not tables.done_runs.empty:
        return {}
    data = block_ratios(tables)
    if data.empty:
        return {}
    sol = data[(data["variant"] == "eager") & (data["arm"] == "sol_rl")]
    if sol.empty:
        sol = data[(data["variant"] == "eager") & data["method"].map(lambda m: same_method(str(m), "sol_rl"))]
    if sol.empty:
        return {}
    r = sol.iloc[0]
    rows = speed_rows(tables)
    declared = {"rollout": rows["target_rollout"].dropna(), "E2E": rows["target"].dropna()}
    paper = dict(zip(("rollout", "E2E"), PAPER_RATIOS.get(model, PAPER_RATIOS["flux"])))
    out = {}
    for kind, col in (("rollout", "rollout"), ("E2E", "e2e")):
        f = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (measured)", "Table 5", PAPER_T5[kind],
                    unit="ratio", threshold=1.0, model=model)
        f.effect, f.lo, f.hi = float(r[f"{col}_ratio"]), float(r[f"{col}_lo"]), float(r[f"{col}_hi"])
        n = int(r["rounds"])
        f.covers = (f"rounds of the speed block ({n}): t interval of the mean paired log ratio (the arms of a round "
                    "ran back to back)" if math.isfinite(f.lo) else f"nothing: {n} round(s), fewer than 2")
        target = float(declared[kind].iloc[0]) if len(declared[kind]) else paper[kind]
        source = "the spec's declared target" if len(declared[kind]) else f"the paper's {kind} ratio (Table 5)"
        f.mde, needed = round_power(float(r[f"{col}_sd"]), n, target)
        if math.isfinite(f.mde):
            rounds = (f"{int(needed)} rounds detect it" if math.isfinite(needed) else "no number of rounds up to 1000 "
                      "detects it") if not math.isnan(needed) else "no rounds estimate"
            f.power_note = (f"target {target:.2f}x ({source}; declared, not the observed ratio): {rounds} at the "
                            f"round-to-round spread of the paired log ratio ({n} rounds here)")
        f.detail = (f"{r['baseline']} / {r['arm']} seconds per iteration timed alone by the spec's speed block on "
                    f"{r['device']}, {r['threads']} thread(s), explore copy {r['recipe']} on backend {r['backend']}: "
                    f"paired within each of {n} rounds, arms interleaved, order rotated (the section 'Table 5 timed "
                    "alone').")
        if r["backend"] == "emulated":
            f.verdict = NOT_MEASURED
            f.detail += (" The explore copy was emulated (fake-quantized in full precision, slower than full "
                         "precision): this clock cannot speak to FP4 hardware (see the PROJECTION row).")
        else:
            f.decide()
        out[kind] = f
    return out


def convergence_findings(tables: Tables, model: str, runs: pd.DataFrame, metric: str) -> list[Finding]:
    from solbench.report.clock import clock_at
    from solbench.report.curves import convergence_speedup

    sol, nft = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "diffusion_nft")
    out = []
    m = tables.run_metrics("eval", metric)
    m = m[m["model"] == model].copy()
    m["projected_s"] = clock_at(tables, m) if not m.empty else np.nan
    emulated = _emulated(tables, runs[runs["arm"] == sol] if sol else None)
    for xcol, label in (("wall_s", "measured clock"), ("projected_s", "PROJECTED GPU clock")):
        f = Finding(f"Sol-RL reaches DiffusionNFT's final score faster ({label})", "Convergence", PAPER_CONVERGENCE,
                    unit="ratio", threshold=1.0, model=model, metric=metric, role=TRAINING)
        r = convergence_speedup(tables, m, runs, sol, nft, xcol) if sol and nft else None
        if r is None:
            f.detail = ("Needs Sol-RL and DiffusionNFT runs." if not (sol and nft) else
                        "No FLOP counts: no projected clock." if xcol == "projected_s" else "No evaluations.")
            out.append(f)
            continue
        f.effect, f.lo, f.hi = r["speedup"], r["speedup_lo"], r["speedup_hi"]
        f.covers = (f"run seeds of each arm ({r['n_seeds_reference']} and {r['n_seeds']}), bootstrap"
                    if not math.isnan(f.lo) else "nothing: one run seed in an arm (a single-curve crossing)")
        f.interval_note = _speedup_bounds_note(f.effect, f.lo, f.hi, sol)
        scale, unit = (1e3, "ms") if xcol == "projected_s" else (1.0, "s")
        f.detail = (f"Time for {sol} to reach {nft}'s final `{metric}` ({fmt_num(r['target'])}); "
                    + ("never reached by the mean curve." if not math.isfinite(r["time_to_target_s"]) else
                       f"{nft} {r['reference_time_s'] * scale:.4g} {unit} vs {sol} {r['time_to_target_s'] * scale:.4g} "
                       f"{unit}" + (" projected." if xcol == "projected_s" else ".")))
        f.detail += f" {sol}'s explore copy: {_explore_of_arm(tables, runs, sol)}."
        if r["reference_time_s"] == 0:
            f.detail += (f" {nft}'s final score is already reached at step 0 (it did not improve on its base): "
                         "there is nothing to converge to, whatever the interval says.")
        if xcol == "wall_s" and emulated:
            f.verdict = NOT_MEASURED
            f.detail += " Measured on CPU / emulated FP4: this clock cannot speak to FP4 hardware."
        else:
            f.decide()
        if xcol == "projected_s":
            f.detail = ("PROJECTED time axis (counted FLOPs at the precision each ran at), measured reward curves. "
                        + f.detail)
            uncounted = _uncounted(tables, "E2E")
            if uncounted:
                f.detail += f" Phases without a FLOP count ({', '.join(uncounted)}) are left out of this clock."
        out.append(f)
    return out


def _explore_of_arm(tables: Tables, runs: pd.DataFrame, arm: str) -> str:
    from solbench.report.explore import explore_text

    return explore_text(runs[runs["arm"] == arm], with_share=tables.fidelity_runs)


def _speedup_bounds_note(point: float, lo: float, hi: float, arm: str) -> str:
    """Why a convergence speedup's interval has no finite bound (or a bound of 0), in words."""
    if math.isnan(lo) or math.isnan(hi):
        return ("no interval: one run seed in an arm, a single curve crosses once" if math.isfinite(point) else
                "no speedup: the mean curve never reaches the target")
    notes = []
    if hi == math.inf:
        notes.append(f"no finite upper bound: in some bootstrap resamples {arm} reaches the target at its first "
                     "evaluation (time 0, an infinite speedup)")
    if lo == 0:
        notes.append(f"lower bound 0: in some resamples {arm} never reaches the target (counted as speedup 0)")
    return "; ".join(notes)


def _primary_recipe(tables: Tables, model: str, recipes: list[str]) -> str | None:
    """The NVFP4 recipe whose fidelity claims carry the plain names: the one the model's training runs explored
    with (most runs), else the only one, else the model's default explore recipe, else None (every claim then
    names its recipe)."""
    runs = tables.done_runs  # training runs only: Tables keeps the fidelity runs apart
    if "p_quant.recipe" in runs:
        used = runs[runs["model"] == model]["p_quant.recipe"].astype(str).value_counts()
        used = used[used.index.isin(recipes)]
        if not used.empty:
            return str(used.index[0])
    if len(recipes) == 1:
        return recipes[0]
    from solbench.report.stored import default_explore_recipe

    default = default_explore_recipe(tables, model)  # as the runs recorded it (solbench.results.stored_facts)
    return default if default in recipes else None


def fidelity_findings(tables: Tables, model: str) -> list[Finding]:
    """Table 8 per reward and per checkpoint (the final policy first, then the base model) and NVFP4 recipe, and
    the change of fidelity over training (final policy - base model, paired per prompt)."""
    o = tables.options
    threshold = o.fidelity_reference - o.fidelity_margin

    def blank(what: str) -> Finding:
        return Finding(f"FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, {what})", "Table 8",
                       PAPER_T8, unit="rho", threshold=threshold, model=model, key=f"table8 {what}")

    fid = tables.fidelity_runs
    fid = fid[fid["model"] == model]
    if "p_quant.recipe" in fid:
        fid = fid[fid["p_quant.recipe"].astype(str).str.startswith("nvfp4")]
    if fid.empty:
        f = blank("final policy")
        f.detail = ("Needs all-seeds fidelity runs with an NVFP4 recipe (`solbench fidelity`, or a spec's `fidelity:` "
                    "block); Sol-RL training candidates are selected-only and biased.")
        return [f]
    from solbench.report.fidelity import group_fidelity, pair_candidates
    from solbench.report.fidelity_steps import checkpoint_claims, checkpoint_info, fidelity_levels

    cand = tables.candidates[tables.candidates["run_id"].isin(fid["run_id"])]
    groups = group_fidelity(pair_candidates(cand), tuple(o.top_k)) if not cand.empty else pd.DataFrame()
    if groups.empty or "kind" not in groups:
        f = blank("final policy")
        f.detail = "The fidelity runs have no prompt group with 3+ candidates at both precisions."
        return [f]
    groups = groups[groups["kind"] == "all seeds"]
    if "reward_name" not in groups or groups["reward_name"].isna().all():
        groups = groups.assign(reward_name="")
    info = checkpoint_info(tables, fid)
    primary = _primary_recipe(tables, model, sorted(set(info["recipe"])))
    from solbench.report.findings_common import trained_rewards

    trained = trained_rewards(tables, tables.done_runs[tables.done_runs["model"] == model])
    out = []
    # one claim per checkpoint (the final policies of the training runs, pooled over their run seeds; the base
    # model) and NVFP4 recipe (two recipes are never pooled), the primary recipe's plain claim first; checkpoints
    # kept before a run's end are the fidelity-against-iteration section's
    for checkpoint, recipe, ids in checkpoint_claims(info, primary):
        what = checkpoint + (f", {recipe}" if recipe != primary else "")
        g_what = groups[groups["run_id"].isin(ids)]
        for i, reward in enumerate(_rewards_in(g_what, trained)):
            g = g_what[g_what["reward_name"] == reward]
            lv = fidelity_levels(g, info, ids, o.ci_level)
            if lv is None:
                continue
            f = blank(what)
            f.metric, f.role = reward, (TRAINING if (reward in trained or (i == 0 and not trained)) else "held-out")
            f.effect, f.lo, f.hi, f.covers = lv["mean"], lv["lo"], lv["hi"], f"{lv['covers']}; {lv['constant']} constant"
            f.recipe, f.components, f.prompts_only = recipe, lv["components"], lv["n_seeds"] < 3 and checkpoint != "base model"
            n = int(g["n_pairs"].median()) if len(g) else 0
            hits = ", ".join(f"hit@{k} {g[f'hit@{k}'].mean():.2f} (chance {k / n:.2f})"
                             for k in o.top_k if f"hit@{k}" in g and g[f"hit@{k}"].notna().any() and n)
            f.detail = (f"Non-inferiority to the paper's ρ {o.fidelity_reference:g} with margin {o.fidelity_margin:g}. "
                        f"Explore copy: {_explore_of(tables, fid, recipe)}; N = {n} seeds per prompt: {hits} (a random "
                        "ranking's hit@K is K/N).")
            out.append(_judge_width(f.decide(), o))
    out += _fidelity_change_findings(tables, model, groups, info, primary, trained)
    return out


def _rewards_in(groups: pd.DataFrame, trained: set[str]) -> list[str]:
    """The rewards the groups rank by, the training reward first ("total" only where it is the only one)."""
    names = [n for n in dict.fromkeys(groups["reward_name"]) if n != "total"] or ["total"]
    return sorted(names, key=lambda n: n not in trained)


def _explore_of(tables: Tables, fid: pd.DataFrame, recipe: str) -> str:
    from solbench.report.explore import explore_text

    return explore_text(fid[fid["p_quant.recipe"].astype(str) == recipe], with_share=fid)


def _judge_width(f: Finding, o) -> Finding:
    """A Table 8 interval wider than ``fidelity_max_width`` that decides nothing is too small to judge: say so."""
    width = f.hi - f.lo
    if math.isfinite(width) and width > o.fidelity_max_width and f.verdict == INCONCLUSIVE:
        f.detail = (f"Too small to judge: the interval is {width:.3f} wide, more than {o.fidelity_max_width:g}; measure "
                    "more prompts or seeds. " + f.detail)
    return f


def _fidelity_change_findings(tables: Tables, model: str, groups: pd.DataFrame, info: pd.DataFrame,
                              primary: str | None, trained: set[str]) -> list[Finding]:
    """Does the explore copy keep ranking seeds as the policy trains? ρ(final policy) - ρ(base model), paired per
    prompt, judged for non-inferiority with ``fidelity_margin`` (exploratory: issue 42's question, no paper table)."""
    from solbench.report.fidelity_steps import BASE, fidelity_change

    o = tables.options
    mine = info[info["recipe"] == primary] if primary else info.iloc[0:0]
    base, final = mine.loc[mine["checkpoint"] == BASE, "run_id"], mine.loc[mine["final"], "run_id"]
    if base.empty or final.empty:
        return []
    out = []
    g_all = groups[groups["run_id"].isin(set(base) | set(final))]
    for i, reward in enumerate(_rewards_in(g_all, trained)):
        g = g_all[g_all["reward_name"] == reward]
        ch = fidelity_change(g, info, final, base, o.ci_level)
        if ch is None:
            continue
        f = Finding("FP4 ranking fidelity holds as the policy trains (Δρ final policy - base model)", "Table 8 (over "
                    "training)", "not in the paper: Table 8 measures one policy", unit="abs",
                    threshold=-o.fidelity_margin, model=model, metric=reward,
                    role=TRAINING if (reward in trained or (i == 0 and not trained)) else "held-out",
                    key="table8 change over training")
        f.effect, f.lo, f.hi, f.covers = ch["mean"], ch["lo"], ch["hi"], ch["covers"]
        steps = sorted({int(s) for s in mine.loc[mine["final"], "step"].dropna()})
        f.detail = (f"Δ = Spearman ρ of the final policy (step {', '.join(map(str, steps)) or '?'}) - of the base model, "
                    f"recipe {primary}, paired per prompt (same prompts and candidate noise); non-inferiority with "
                    f"margin {o.fidelity_margin:g}. Every step: the section 'Ranking fidelity against training iteration'.")
        out.append(f.decide())
    return out
