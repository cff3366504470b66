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

from solbench.report.findings_common import TRAINING, Finding, main_arm
from solbench.report.stats import NOT_MEASURED, PROJECTION, bootstrap_ci, fmt_num, mean_ci
from solbench.report.tables import ROLLOUT_PHASES, Tables

PAPER_T5 = {"rollout": "2.33x (FLUX), 2.41x (SD3.5-L), 1.41x (SANA)", "E2E": "1.62x (FLUX), 1.61x (SD3.5-L), 1.25x (SANA)"}
PAPER_CONVERGENCE = "3.00x (FLUX), 4.64x (SD3.5-L), 2.42x (SANA) on ImageReward; 1.9x-3.9x on other metrics"
PAPER_T8 = "Spearman ρ 0.927, Kendall τ 0.798; top-K hit 96.9/95.0/93.3 % (K=4/8/12) at N=96 (chance 4/8/12.5 %)"


def _emulated(tables: Tables) -> str | None:
    from solbench.report.timing import emulation_caveat

    if emulation_caveat(tables) is None:
        return None
    return "cpu" if "cpu" in tables.device_kinds() else "emulated"


def _uncounted(tables: Tables, kind: str) -> list[str]:
    from solbench.report.clock import counted_phases

    _, uncounted = counted_phases(tables)
    compute = {"explore", "regenerate", "rollout", "train"}  # phases that run the transformer
    wanted = compute & (set(ROLLOUT_PHASES) if kind == "rollout" else compute)
    return sorted(p for p in uncounted if p in wanted)


def _projected_iteration(proj: pd.DataFrame, runs: pd.DataFrame, arm: str, kind: str) -> pd.DataFrame:
    """Per run of ``arm``: median per-iteration projected seconds and its FLOPs by precision."""
    p = proj[proj["run_id"].isin(runs.loc[runs["arm"] == arm, "run_id"])]
    if kind == "rollout":
        p = p[p["phase"].isin(ROLLOUT_PHASES)]
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
    from solbench.report.timing import _ratio_of_means, per_run_medians

    o = tables.options
    sol, naive = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "naive_bf16")
    emulated = _emulated(tables)
    out = []
    med = per_run_medians(tables)[0] if sol and naive else pd.DataFrame()
    proj = phase_projection(tables)
    hw = hardware(tables)
    for kind, col in (("rollout", "rollout_s"), ("E2E", "e2e_s")):
        f = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (measured)", "Table 5", PAPER_T5[kind], unit="ratio",
                    threshold=1.0, model=model)
        p = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (PROJECTION from counted FLOPs)", "Table 5",
                    PAPER_T5[kind], unit="ratio", threshold=1.0, model=model, verdict=PROJECTION)
        if not (sol and naive):
            f.detail = p.detail = "Needs Sol-RL and naive BF16 scaling runs."
            p.verdict = NOT_MEASURED
            out += [f, p]
            continue
        mb, mt = med[med["arm"] == naive][col].to_numpy(), med[med["arm"] == sol][col].to_numpy()
        if len(mb) and len(mt):
            f.effect = _ratio_of_means(mb, mt)
            f.lo, f.hi = bootstrap_ci([mb, mt], _ratio_of_means, n_boot=o.n_boot, level=o.ci_level, seed=o.boot_seed)
            f.covers = f"run seeds of each arm ({len(mb)} and {len(mt)}), bootstrap"
            f.detail = f"{naive} / {sol} seconds per iteration (median per run after warm-up)."
            if emulated:
                f.verdict = NOT_MEASURED
                f.detail += (" Measured on CPU / with emulated FP4, which is slower than full precision: this spec's "
                             "clock cannot speak to FP4 hardware (see the PROJECTION row).")
            else:
                f.decide()
        else:
            f.detail = "No timings of these arms."
        out.append(f)
        ib, it = _projected_iteration(proj, runs, naive, kind), _projected_iteration(proj, runs, sol, kind)
        uncounted = _uncounted(tables, kind)
        if len(ib) and len(it) and not uncounted:
            p.effect = float(ib["projected_s"].mean() / it["projected_s"].mean())
            p.covers = "none: the value follows from the configuration (counted FLOPs), the same for every seed"
            p.detail = (f"PROJECTION on {hw.name} at {o.mfu:.0%}, from {_projection_inputs(naive, ib)} and "
                        f"{_projection_inputs(sol, it)}; explore FLOPs at the share of a forward the run's recipe "
                        "quantizes (solbench.quant.shares), everything else at BF16.")
        else:
            p.verdict = NOT_MEASURED
            p.detail = ("No FLOP counts for these arms." if not (len(ib) and len(it)) else
                        f"Phases {', '.join(uncounted)} carry no FLOP count: a projection without them is not this claim.")
        out.append(p)
    return out


def convergence_findings(tables: Tables, model: str, runs: pd.DataFrame, metric: str) -> list[Finding]:
    from solbench.report.clock import clock_at
    from solbench.report.curves import convergence_speedup

    sol, nft = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "diffusion_nft")
    out = []
    m = tables.run_metrics("eval", metric)
    m = m[m["model"] == model].copy()
    m["projected_s"] = clock_at(tables, m) if not m.empty else np.nan
    emulated = _emulated(tables)
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
        scale, unit = (1e3, "ms") if xcol == "projected_s" else (1.0, "s")
        f.detail = (f"Time for {sol} to reach {nft}'s final `{metric}` ({fmt_num(r['target'])}); "
                    + ("never reached by the mean curve." if not math.isfinite(r["time_to_target_s"]) else
                       f"{nft} {r['reference_time_s'] * scale:.4g} {unit} vs {sol} {r['time_to_target_s'] * scale:.4g} "
                       f"{unit}" + (" projected." if xcol == "projected_s" else ".")))
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
    from solbench.config import DEFAULT_EXPLORE_RECIPES

    default = DEFAULT_EXPLORE_RECIPES.get(model)
    return default if default in recipes else None


def fidelity_findings(tables: Tables, model: str) -> list[Finding]:
    """Table 8 per reward and per checkpoint (final policy first, then the base model)."""
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

    cand = tables.candidates[tables.candidates["run_id"].isin(fid["run_id"])]
    groups = group_fidelity(pair_candidates(cand), tuple(o.top_k)) if not cand.empty else pd.DataFrame()
    if groups.empty or "kind" not in groups:
        f = blank("final policy")
        f.detail = "The fidelity runs have no prompt group with 3+ candidates at both precisions."
        return [f]
    groups = groups[groups["kind"] == "all seeds"]
    ckpt = fid.set_index("run_id")["p_checkpoint.path"] if "p_checkpoint.path" in fid else pd.Series(dtype=object)
    recipe_of = fid.set_index("run_id")["p_quant.recipe"].astype(str) if "p_quant.recipe" in fid else pd.Series(dtype=str)
    primary = _primary_recipe(tables, model, sorted(set(recipe_of)))

    # one claim per checkpoint and NVFP4 recipe (two recipes are never pooled), ordered final policy first, then
    # the base model, each with the primary recipe's plain claim before the other recipes': run id -> (order, what)
    claims = {}
    for run_id in fid["run_id"]:
        checkpoint = 0 if pd.notna(ckpt.get(run_id)) else 1
        recipe = recipe_of.get(run_id)
        other = recipe is not None and recipe != primary
        claims[run_id] = ((checkpoint, other, recipe or ""),
                          ("final policy", "base model")[checkpoint] + (f", {recipe}" if other else ""))
    groups = groups.assign(what=groups["run_id"].map(lambda run_id: claims[run_id][1]))
    if "reward_name" not in groups or groups["reward_name"].isna().all():
        groups = groups.assign(reward_name="")
    from solbench.report.findings_common import training_rewards

    trained = training_rewards(tables, tables.done_runs[tables.done_runs["model"] == model])
    out = []
    for _, what in sorted(set(claims.values())):
        g_what = groups[groups["what"] == what]
        if g_what.empty:
            continue
        names = [n for n in dict.fromkeys(g_what["reward_name"]) if n != "total"] or ["total"]
        names = sorted(names, key=lambda n: n not in trained)  # the training reward first (stable: else data order)
        for i, reward in enumerate(names):
            g = g_what[g_what["reward_name"] == reward]
            rho = g["spearman_rho"].dropna().to_numpy(float)
            f = blank(what)
            f.metric, f.role = reward, (TRAINING if (reward in trained or (i == 0 and not trained)) else "held-out")
            ci = mean_ci(rho, o.ci_level)
            # a correlation's t interval can pass ±1 on few prompts: bounds in range
            f.effect, f.lo, f.hi = ci.mean, max(ci.lo, -1.0), min(ci.hi, 1.0)
            f.covers = f"prompt groups ({len(rho)}), t interval over prompts; {int(g['spearman_rho'].isna().sum())} constant"
            n = int(g["n_pairs"].median()) if len(g) else 0
            hits = ", ".join(f"hit@{k} {g[f'hit@{k}'].mean():.2f} (chance {k / n:.2f})"
                             for k in o.top_k if f"hit@{k}" in g and g[f"hit@{k}"].notna().any() and n)
            recipes = ", ".join(sorted(set(recipe_of.reindex(g["run_id"].unique()).dropna()))) or "?"
            f.detail = (f"Non-inferiority to the paper's ρ {o.fidelity_reference:g} with margin {o.fidelity_margin:g}. "
                        f"Recipe {recipes}; N = {n} seeds per prompt: {hits} (a random ranking's hit@K is K/N).")
            out.append(f.decide())
    return out
