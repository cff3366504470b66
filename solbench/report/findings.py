"""Findings: one row per claim of the paper that the collected results can speak to, with a verdict.

Every row gives the measured effect, its interval and what the interval covers, the paper's figure, the
decision threshold and a verdict computed by one rule (``stats.verdict``; docs/reports.md, "Findings"):

- reproduced: the whole interval lies on the claim's side of the threshold;
- contradicted: the whole interval lies on the other side;
- inconclusive: the interval spans (or touches) the threshold, or there is no interval (one unit);
- not measured by this spec: the results hold no arms (or no clock) the claim needs.

Claims and their effects (headline metric = the spec's first eval reward):

1. Table 1, Sol-RL beats DiffusionNFT at equal iterations: paired Δ (Sol-RL - DiffusionNFT) at the last
   evaluation both runs of a seed pair reached; threshold 0, greater.
2. Table 6, Sol-RL matches naive BF16 scaling: paired Δ (Sol-RL - naive BF16) relative to naive BF16's
   score; threshold -``noninferiority_margin`` (default -2 %), greater (non-inferiority).
3. Naive FP4 ends below Sol-RL: paired Δ (naive FP4 - Sol-RL); threshold 0, less.
4. Naive FP4 peaks and then declines: within the naive FP4 runs, paired Δ (final - score at the peak of
   the mean curve before the final evaluation); threshold 0, less. The peak is chosen on the same data,
   which favours the claim (said in the row).
5. Table 3, reward grows with N at fixed K: paired Δ (Sol-RL at the largest N - at the smallest N), other
   settings at their most common value; threshold 0, greater.
6. Table 2, explore steps: paired Δ (Sol-RL at the most explore steps up to 6 - at the fewest); threshold 0,
   greater.
7. Table 8, FP4 ranks seeds almost as BF16 does: mean per-prompt Spearman ρ of the all-seeds fidelity runs
   with an NVFP4 recipe, percentile bootstrap over prompt groups; threshold ``fidelity_threshold`` (0.8), greater.
   Selected-only (training) groups are biased and never used.
8. Table 5, rollout and end-to-end speedup of Sol-RL over naive BF16 scaling: ratio of seed means with the
   bootstrap interval over seeds; threshold 1, greater. Measured seconds from CPU runs or the emulated
   backend cannot speak to FP4 hardware: not measured; the PROJECTED rows (counted FLOPs at the
   hardware profile's rates) are given beside them, labelled PROJECTION.
9. Convergence: speedup of Sol-RL over DiffusionNFT to reach DiffusionNFT's final score (bootstrap over
   seeds), measured clock (not measured on CPU / emulated FP4) and PROJECTED clock; threshold 1, greater.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from solbench.report.paired import Paired, paired_difference, paired_steps
from solbench.report.registry import Note, Table, report_kind
from solbench.report.stats import (CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, REPRODUCED, bootstrap_ci, fmt_num,
                                   hierarchical_bootstrap, verdict)
from solbench.report.tables import Tables, _hashable, same_method


@dataclass
class Finding:
    claim: str
    paper_table: str
    paper: str  # the paper's figure, as text
    effect: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    unit: str = ""  # "abs", "rel", "ratio", "rho"
    threshold: float = math.nan
    direction: str = "greater"
    verdict: str = NOT_MEASURED
    covers: str = ""  # what the interval covers
    detail: str = ""  # arms, metric, step, why not measured
    model: str = ""
    metric: str = ""

    def decide(self) -> "Finding":
        self.verdict = verdict(self.lo, self.hi, self.threshold, self.direction)
        return self


def _fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    if unit == "rel":
        return f"{value:+.2%}"
    if unit == "ratio":
        return f"{value:.2f}x"
    if unit == "rho":
        return f"{value:.3f}"
    return f"{value:+.4f}"


def _interval(f: Finding) -> str:
    if not math.isfinite(f.effect):
        return "-"
    if math.isnan(f.lo) or math.isnan(f.hi):
        return "no interval"
    return f"[{_fmt(f.lo, f.unit)}, {_fmt(f.hi, f.unit)}]"


def _rule(f: Finding) -> str:
    if not math.isfinite(f.threshold):
        return "-"
    side = ">" if f.direction == "greater" else "<"
    return f"effect {side} {_fmt(f.threshold, f.unit).lstrip('+')}"


# ---- arms -----------------------------------------------------------------------------------------

def main_arm(tables: Tables, runs: pd.DataFrame, method: str) -> str | None:
    """The arm of ``method`` to compare: the one with most seeds (ablation arms have fewer), first in order."""
    arms = [a for a in tables.arm_order(runs) if same_method(runs.loc[runs["arm"] == a, "method"].iloc[0], method)]
    if not arms:
        return None
    mine = runs[runs["arm"].isin(arms)]
    counts = mine.groupby("arm")["seed"].nunique()
    varying = [c for c in tables.setting_columns() if c in mine and mine[c].map(_hashable).nunique() > 1]
    modes = {c: mine[c].map(_hashable).value_counts().index[0] for c in varying}

    def at_default(arm: str) -> int:  # settings at their most common value: the default ablations vary around
        run = mine[mine["arm"] == arm].iloc[0]
        return sum(_hashable(run[c]) == v for c, v in modes.items())

    return max(arms, key=lambda a: (counts.get(a, 0), at_default(a), -arms.index(a)))


def axis_arms(tables: Tables, runs: pd.DataFrame, method: str, axis: str) -> dict:
    """{value of method_config.<axis>: arm} with every other varying setting at its most common value."""
    mine = runs[runs["method"].map(lambda m: same_method(m, method))]
    col = f"p_method_config.{axis}"
    if mine.empty or col not in mine or mine[col].map(_hashable).nunique() < 2:
        return {}
    others = [c for c in tables.setting_columns() if c != col and c in mine and mine[c].map(_hashable).nunique() > 1]
    keep = pd.Series(True, index=mine.index)
    for c in others:
        values = mine[c].map(_hashable)
        keep &= values == values.value_counts().index[0]
    out: dict = {}
    for value, arm in zip(mine.loc[keep, col], mine.loc[keep, "arm"]):
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out.setdefault(value, arm)
    return dict(sorted(out.items(), key=lambda kv: float(kv[0])))


def _paired_finding(f: Finding, p: Paired | None, why_missing: str, *, relative: bool = False) -> Finding:
    if p is None:
        f.detail = why_missing
        return f
    scale = abs(p.base_mean) if relative and p.base_mean else 1.0
    f.effect, f.lo, f.hi = p.ci.mean / scale, p.ci.lo / scale, p.ci.hi / scale
    f.covers = p.ci.covers
    f.detail += f" Step {p.step}; {len(p.seeds)} seed pair(s); means {fmt_num(p.arm_mean)} vs {fmt_num(p.base_mean)}."
    return f.decide()


# ---- the claims -----------------------------------------------------------------------------------

def quality_findings(tables: Tables, model: str, runs: pd.DataFrame, metric: str) -> list[Finding]:
    o = tables.options
    sol = main_arm(tables, runs, "sol_rl")
    nft = main_arm(tables, runs, "diffusion_nft")
    naive = main_arm(tables, runs, "naive_bf16")
    fp4 = main_arm(tables, runs, "naive_fp4")
    common = dict(model=model, metric=metric)
    out = []

    f = Finding("Sol-RL beats DiffusionNFT at equal iterations", "Table 1",
                "+0.093 ImageReward (+5.6 %), +0.0075 HPSv2 on FLUX.1", unit="abs", threshold=0.0, **common)
    f.detail = f"Δ = {sol} - {nft}, `{metric}`." if sol and nft else ""
    out.append(_paired_finding(f, paired_difference(tables, model, metric, sol, nft) if sol and nft else None,
                               "Needs Sol-RL and DiffusionNFT runs with common run seeds."))

    f = Finding("Sol-RL matches naive BF16 scaling (non-inferior)", "Table 6",
                "gap -0.29 % (FLUX), -1.08 % (SD3.5-L), +0.11 % (SANA)", unit="rel",
                threshold=-o.noninferiority_margin, **common)
    f.detail = (f"Δ = ({sol} - {naive}) / {naive}'s score, `{metric}`; margin {o.noninferiority_margin:.0%}."
                if sol and naive else "")
    out.append(_paired_finding(f, paired_difference(tables, model, metric, sol, naive) if sol and naive else None,
                               "Needs Sol-RL and naive BF16 scaling runs with common run seeds.", relative=True))

    f = Finding("Naive FP4 ends below Sol-RL", "Sec. naive FP4", "naive FP4 peaks near HPSv2 0.36, below Sol-RL's 0.3688",
                unit="abs", threshold=0.0, direction="less", **common)
    f.detail = f"Δ = {fp4} - {sol}, `{metric}`." if sol and fp4 else ""
    out.append(_paired_finding(f, paired_difference(tables, model, metric, fp4, sol) if sol and fp4 else None,
                               "Needs naive FP4 and Sol-RL runs with common run seeds."))

    out.append(_peak_decline(tables, model, runs, metric, fp4))

    for axis, claim, table, paper, pick in (
            ("n", "Reward grows with the candidate pool N at fixed K", "Table 3",
             "HPSv2 0.3569 (N=24) -> 0.3686 (N=96): +0.0117", lambda vals: (vals[-1], vals[0])),
            ("explore_steps", "More explore steps (up to 6) give a better policy", "Table 2",
             "HPSv2 0.3587 (2 steps) -> 0.3686 (6 steps): +0.0099; 8 steps 0.3659",
             lambda vals: (max([v for v in vals if float(v) <= 6] or [vals[0]], key=float), vals[0]))):
        arms = axis_arms(tables, runs, "sol_rl", axis)
        f = Finding(claim, table, paper, unit="abs", threshold=0.0, **common)
        if len(arms) < 2:
            f.detail = f"Needs Sol-RL runs at two or more values of {axis} (other settings equal)."
            out.append(f)
            continue
        hi_v, lo_v = pick(list(arms))
        if hi_v == lo_v:
            f.detail = f"Needs a Sol-RL arm at {axis} <= 6 above the smallest value."
            out.append(f)
            continue
        f.detail = f"Δ = {arms[hi_v]} - {arms[lo_v]}, `{metric}`."
        out.append(_paired_finding(f, paired_difference(tables, model, metric, arms[hi_v], arms[lo_v]),
                                   f"No common run seeds between {arms[hi_v]} and {arms[lo_v]}."))
    return out


def _peak_decline(tables: Tables, model: str, runs: pd.DataFrame, metric: str, fp4: str | None) -> Finding:
    f = Finding("Naive FP4 peaks and then declines", "Sec. naive FP4", "HPSv2 peaks (about 0.36) near step 180, then declines",
                unit="abs", threshold=0.0, direction="less", model=model, metric=metric)
    if fp4 is None:
        f.detail = "Needs naive FP4 runs."
        return f
    m = tables.run_metrics("eval", metric)
    m = m[(m["model"] == model) & (m["arm"] == fp4)]
    curve = m.groupby("step")["value"].mean().sort_index()
    if len(curve) < 3:
        f.detail = "Needs naive FP4 runs with at least 3 evaluations."
        return f
    final = int(curve.index[-1])
    earlier = curve.iloc[1:-1]  # after step 0, before the final evaluation
    peak = int(earlier.idxmax())
    f.detail = (f"Δ = {fp4} at its final step {final} - at the peak of its mean curve before it (step {peak}), "
                "`{metric}`; the peak is chosen on these data, which favours the claim.").replace("{metric}", metric)
    return _paired_finding(f, paired_steps(tables, model, metric, fp4, final, peak), "No naive FP4 run has both steps.")


def fidelity_finding(tables: Tables, model: str) -> Finding:
    o = tables.options
    f = Finding("FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ)", "Table 8",
                "Spearman ρ 0.927, Kendall τ 0.798; top-K hit 96.9/95.0/93.3 % (K=4/8/12)", unit="rho",
                threshold=o.fidelity_threshold, model=model)
    fid = tables.fidelity_runs
    fid = fid[fid["model"] == model]
    if "p_quant.recipe" in fid:
        fid = fid[fid["p_quant.recipe"].astype(str).str.startswith("nvfp4")]
    if fid.empty:
        f.detail = ("Needs all-seeds fidelity runs with an NVFP4 recipe (`solbench fidelity`, or a spec's `fidelity:` "
                    "block); Sol-RL training candidates are selected-only and biased.")
        return f
    from solbench.report.fidelity import group_fidelity, pair_candidates

    cand = tables.candidates[tables.candidates["run_id"].isin(fid["run_id"])]
    groups = group_fidelity(pair_candidates(cand), tuple(o.top_k)) if not cand.empty else pd.DataFrame()
    if groups.empty or "kind" not in groups:
        f.detail = "The fidelity runs have no prompt group with 3+ candidates at both precisions."
        return f
    groups = groups[groups["kind"] == "all seeds"]
    reward = None
    if "reward_name" in groups and groups["reward_name"].notna().any():
        names = list(dict.fromkeys(groups["reward_name"].dropna()))
        reward = "total" if "total" in names else names[0]
        groups = groups[groups["reward_name"] == reward]
    rho = groups["spearman_rho"].dropna().to_numpy(float)
    point, lo, hi, _ = hierarchical_bootstrap([rho], n_boot=o.n_boot, level=o.ci_level, seed=o.boot_seed)
    f.effect, f.lo, f.hi, f.metric = point, lo, hi, reward or ""
    f.covers = f"prompt groups ({len(rho)}), bootstrap over prompts"
    recipes = ", ".join(sorted(set(fid["p_quant.recipe"].astype(str)))) if "p_quant.recipe" in fid else "?"
    f.detail = f"{len(fid)} fidelity run(s), recipe {recipes}, reward `{reward}`."
    return f.decide()


def _emulated(tables: Tables) -> str | None:
    from solbench.report.timing import emulation_caveat

    if emulation_caveat(tables) is None:
        return None
    return "cpu" if "cpu" in tables.device_kinds() else "emulated"


def speed_findings(tables: Tables, model: str, runs: pd.DataFrame) -> list[Finding]:
    from solbench.report.clock import phase_projection
    from solbench.report.timing import _ratio_of_means, per_run_medians

    o = tables.options
    sol, naive = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "naive_bf16")
    emulated = _emulated(tables)
    papers = {"rollout": "2.33x (FLUX), 2.41x (SD3.5-L), 1.41x (SANA)", "E2E": "1.62x (FLUX), 1.61x (SD3.5-L), 1.25x (SANA)"}
    out = []
    med = per_run_medians(tables)[0] if sol and naive else pd.DataFrame()
    proj = phase_projection(tables)
    for kind, col in (("rollout", "rollout_s"), ("E2E", "e2e_s")):
        f = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (measured)", "Table 5", papers[kind], unit="ratio",
                    threshold=1.0, model=model)
        p = Finding(f"Sol-RL {kind} speedup over naive BF16 scaling (PROJECTION from counted FLOPs)", "Table 5",
                    papers[kind], unit="ratio", threshold=1.0, model=model)
        if not (sol and naive):
            f.detail = p.detail = "Needs Sol-RL and naive BF16 scaling runs."
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
        pb, pt = _projected_per_run(proj, runs, naive, kind), _projected_per_run(proj, runs, sol, kind)
        uncounted = _uncounted(tables, kind)
        if len(pb) and len(pt) and not uncounted:
            p.effect = _ratio_of_means(pb, pt)
            p.lo, p.hi = bootstrap_ci([pb, pt], _ratio_of_means, n_boot=o.n_boot, level=o.ci_level, seed=o.boot_seed)
            p.covers = f"run seeds of each arm ({len(pb)} and {len(pt)}), bootstrap"
            p.detail = f"PROJECTION on {o.hardware}: counted FLOPs per iteration at the precision's peak x {o.mfu:.0%}."
            p.decide()
        else:
            p.detail = ("No FLOP counts for these arms." if not (len(pb) and len(pt)) else
                        f"Phases {', '.join(uncounted)} carry no FLOP count: a projection without them is not this claim.")
        out.append(p)
    return out


def _uncounted(tables: Tables, kind: str) -> list[str]:
    from solbench.report.clock import counted_phases
    from solbench.report.tables import ROLLOUT_PHASES

    counted, uncounted = counted_phases(tables)
    compute = {"explore", "regenerate", "rollout", "train"}  # phases that run the transformer
    wanted = compute & (set(ROLLOUT_PHASES) if kind == "rollout" else compute)
    return sorted(p for p in uncounted if p in wanted)


def _projected_per_run(proj: pd.DataFrame, runs: pd.DataFrame, arm: str, kind: str) -> np.ndarray:
    from solbench.report.tables import ROLLOUT_PHASES

    ids = runs.loc[runs["arm"] == arm, "run_id"]
    p = proj[proj["run_id"].isin(ids)]
    if kind == "rollout":
        p = p[p["phase"].isin(ROLLOUT_PHASES)]
    if p.empty:
        return np.array([])
    return p.groupby(["run_id", "step"])["projected_s"].sum().groupby("run_id").median().to_numpy()


def convergence_findings(tables: Tables, model: str, runs: pd.DataFrame, metric: str) -> list[Finding]:
    from solbench.report.clock import clock_at
    from solbench.report.curves import convergence_speedup

    sol, nft = main_arm(tables, runs, "sol_rl"), main_arm(tables, runs, "diffusion_nft")
    paper = "3.00x (FLUX), 4.64x (SD3.5-L), 2.42x (SANA) on ImageReward; 1.9x-3.9x on other metrics"
    out = []
    m = tables.run_metrics("eval", metric)
    m = m[m["model"] == model].copy()
    m["projected_s"] = clock_at(tables, m) if not m.empty else np.nan
    emulated = _emulated(tables)
    for xcol, label in (("wall_s", "measured clock"), ("projected_s", "PROJECTED GPU clock")):
        f = Finding(f"Sol-RL reaches DiffusionNFT's final score faster ({label})", "Convergence", paper, unit="ratio",
                    threshold=1.0, model=model, metric=metric)
        r = convergence_speedup(tables, m, runs, sol, nft, xcol) if sol and nft else None
        if r is None:
            f.detail = ("Needs Sol-RL and DiffusionNFT runs." if not (sol and nft) else
                        "No FLOP counts: no projected clock." if xcol == "projected_s" else "No evaluations.")
            out.append(f)
            continue
        f.effect, f.lo, f.hi = r["speedup"], r["speedup_lo"], r["speedup_hi"]
        f.covers = (f"run seeds of each arm ({r['n_seeds_reference']} and {r['n_seeds']}), bootstrap"
                    if not math.isnan(f.lo) else "nothing: one run seed in an arm (a single-curve crossing)")
        f.detail = (f"Time for {sol} to reach {nft}'s final `{metric}` ({fmt_num(r['target'])}); "
                    + ("never reached by the mean curve." if not math.isfinite(r["time_to_target_s"]) else
                       f"{fmt_num(r['reference_time_s'], 3)} vs {fmt_num(r['time_to_target_s'], 3)}"
                       + (" projected s." if xcol == "projected_s" else " s.")))
        if r["reference_time_s"] == 0:
            f.detail += (f" {nft}'s final score is already reached at step 0 (it did not improve on its base): "
                         "there is nothing to converge to, whatever the interval says.")
        if xcol == "wall_s" and emulated:
            f.verdict = NOT_MEASURED
            f.detail += " Measured on CPU / emulated FP4: this clock cannot speak to FP4 hardware."
        else:
            f.decide()
        if xcol == "projected_s":
            f.detail = "PROJECTION. " + f.detail
            uncounted = _uncounted(tables, "E2E")
            if uncounted:
                f.detail += f" Phases without a FLOP count ({', '.join(uncounted)}) are left out of this clock."
        out.append(f)
    return out


def collect_findings(tables: Tables) -> list[Finding]:
    """Every claim for every model of the results."""
    findings: list[Finding] = []
    metric = tables.headline_metric()
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        if metric is not None and not runs.empty:
            findings += quality_findings(tables, model, runs, metric)
        elif not runs.empty or metric is None:
            findings.append(Finding("Quality claims (Tables 1, 2, 3, 6)", "Tables 1-3, 6", "-", model=model,
                                    detail="No evaluation rows."))
        findings.append(fidelity_finding(tables, model))
        if not runs.empty:
            findings += speed_findings(tables, model, runs)
            if metric is not None:
                findings += convergence_findings(tables, model, runs, metric)
    return findings


@report_kind("findings", title="Findings", order=1)
def findings(tables: Tables):
    """One row per paper claim: measured effect, interval, paper figure, verdict by the rule of docs/reports.md."""
    rows = collect_findings(tables)
    if not rows:
        return Note("Findings", "No runs to speak to any claim.")
    o = tables.options
    data = pd.DataFrame([asdict(f) for f in rows])
    display = pd.DataFrame([{
        "claim": f.claim, "paper": f"{f.paper_table}: {f.paper}", "model": f.model, "measured": _fmt(f.effect, f.unit),
        f"{o.ci_level:.0%} interval": _interval(f), "interval covers": f.covers or "-", "rule": _rule(f),
        "verdict": f"**{f.verdict}**", "details": f.detail.strip()} for f in rows])
    counts = data["verdict"].value_counts()
    summary = ", ".join(f"{int(counts.get(v, 0))} {v}" for v in (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_MEASURED))
    widths = [(f.hi - f.lo) / 2 for f in rows if f.unit == "abs" and math.isfinite(f.lo)]
    power = (f" With these runs, paired quality differences smaller than about ±{fmt_num(float(np.median(widths)))} "
             f"(the median half-width of their intervals, headline metric `{tables.headline_metric()}`) cannot be told "
             "from zero; claims of a smaller effect stay inconclusive." if widths else "")
    return Table("findings", "Findings: the paper's claims against these results", data, (
        f"{summary}. Verdict rule (docs/reports.md, Findings): reproduced when the whole {o.ci_level:.0%} interval lies "
        "on the claim's side of the threshold, contradicted when it lies wholly on the other side, inconclusive when it "
        "spans or touches the threshold or there is no interval, not measured when these results lack the arms or "
        "the clock the claim needs. Quality effects are paired differences on the same eval prompts and eval seeds "
        f"(runs paired by run seed), with a hierarchical bootstrap ({o.n_boot} resamples) over run seeds and, within "
        "them, eval prompts; ratios use a bootstrap over each arm's run seeds. Rows marked PROJECTION come from counted "
        f"FLOPs on a {o.hardware} profile, not from a measurement.{power}"), display=display)
