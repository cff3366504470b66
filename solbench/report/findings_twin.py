"""Sol-RL against its full-precision-preview twin (issue 54): what FP4 itself does.

The twin is Sol-RL with explore recipe ``none`` (solbench.quant.recipes.NO_RECIPE): the same N, K, explore steps and
selection, its preview run through the rollout policy merged in full precision. Sol-RL's gain over naive BF16 scaling
mixes three things: fewer preview steps, regenerating only K of N, and the low-precision copy. The twin separates
them:

- training integrity (the paper's central claim, a primary): (Sol-RL - twin) / twin's score > -margin
  (``noninferiority_margin``) on every eval reward, paired by run seed on the same eval prompts and seeds
  (solbench.report.paired), at the read-out iteration (``report.readout_iteration``; else the last common one);
- FP4's own speed (a primary): twin / Sol-RL seconds per iteration, measured: from the spec's speed block where the
  results hold it (speed.parquet, solbench.speed: the twin arm, Sol-RL on recipe none, and Sol-RL's, eager, paired
  within each round, the t interval over rounds of the mean log ratio, solbench.report.speed_stats), else from the training
  runs' own timings (median per run after warm-up, quiet runs only, a t interval of the log ratio over run seeds);
- the decomposition, naive BF16 scaling -> twin (preview steps and regeneration) -> Sol-RL (the copy's precision):
  each step's quality difference at the read-out iteration and its measured and PROJECTED speed ratio, as rows
  (exploratory) and as one table (``decomposition_table``).
Reads stored results only.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.findings_common import Finding, main_arm, reward_roles, seed_cost_s
from solbench.report.tables import Tables, same_method

TWIN = "none"  # solbench.quant.recipes.NO_RECIPE (the report reads results, not the quant registry)
TWIN_CLAIM = "Sol-RL matches its full-precision-preview twin (non-inferior)"
TWIN_SPEED_CLAIM = "Sol-RL E2E speedup over its full-precision-preview twin (measured)"
INTEGRITY = ("FP4 exploration keeps BF16's training integrity: Sol-RL non-inferior to BF16 exploration at the same "
             "rollout budget (the paper's central claim; its Table 6 gap -0.29 % stands for it)")
STEP_CLAIMS = {  # (from, to): the decomposition's claim
    ("naive", "twin"): "Decomposition: the short preview and regenerating K of N (twin - naive BF16 scaling)",
    ("twin", "sol"): "Decomposition: the explore copy's precision (Sol-RL - twin)",
    ("naive", "sol"): "Decomposition: all of it (Sol-RL - naive BF16 scaling)",
}
DECOMPOSITION = "Decomposition (issue 54)"
_SETTINGS = ("p_method_config.n", "p_method_config.k", "p_method_config.explore_steps", "p_method_config.selection")


def twin_arm(tables: Tables, runs: pd.DataFrame, sol: str | None) -> str | None:
    """The Sol-RL arm on recipe ``none`` with the main Sol-RL arm's N, K, explore steps and selection (most seeds)."""
    if sol is None or "p_quant.recipe" not in runs:
        return None
    mine = runs[runs["method"].map(lambda m: same_method(m, "sol_rl")) & (runs["p_quant.recipe"].astype(str) == TWIN)]
    ref = runs[runs["arm"] == sol].iloc[0]
    for column in _SETTINGS:
        if column in mine:
            mine = mine[mine[column].astype(str) == str(ref.get(column))]
    if mine.empty:
        return None
    return str(mine.groupby("arm")["seed"].nunique().sort_values(ascending=False, kind="stable").index[0])


def arms_of(tables: Tables, runs: pd.DataFrame) -> dict[str, str | None]:
    sol = main_arm(tables, runs, "sol_rl")
    return {"sol": sol, "twin": twin_arm(tables, runs, sol), "naive": main_arm(tables, runs, "naive_bf16")}


def twin_findings(tables: Tables, model: str, runs: pd.DataFrame) -> list[Finding]:
    """The integrity rows (one per eval reward), the twin's speed row and the decomposition rows."""
    from solbench.report.findings_quality import paired_finding
    from solbench.report.paired import paired_difference
    from solbench.report.readout import readout_step

    o = tables.options
    arms = arms_of(tables, runs)
    sol, twin, naive = arms["sol"], arms["twin"], arms["naive"]
    step = readout_step(tables)
    at = f"at the read-out iteration {step}" if step is not None else "at the last evaluation both runs reached"
    out: list[Finding] = []
    for metric, role in reward_roles(tables, runs):
        f = Finding(TWIN_CLAIM, "Integrity", INTEGRITY, unit="rel", threshold=-o.noninferiority_margin, model=model,
                    metric=metric, role=role, key=TWIN_CLAIM)
        if sol and twin:
            f.detail = (f"Δ = ({sol} - {twin}) / {twin}'s score, `{metric}`, {at}; margin {o.noninferiority_margin:.0%}"
                        ": the same N, K, explore steps and selection, only the preview's precision differs.")
        p = paired_difference(tables, model, metric, sol, twin, step=step) if sol and twin else None
        out.append(paired_finding(f, p, "Needs Sol-RL and its full-precision-preview twin (quant.recipe none, the same "
                                        "N, K, explore steps and selection) with common run seeds.", relative=True,
                                  tables=tables, arms=(sol, twin)))
    out.append(twin_speed(tables, model, runs, sol, twin))
    for (a, b), claim in STEP_CLAIMS.items():
        hi, lo = arms[b], arms[a]
        for metric, role in reward_roles(tables, runs):
            f = Finding(claim, DECOMPOSITION, "not in the paper: what each part of Sol-RL's rollout adds",
                        unit="abs", threshold=0.0, model=model, metric=metric, role=role, key=claim)
            if hi and lo:
                f.detail = f"Δ = {hi} - {lo}, `{metric}`, {at}."
            p = paired_difference(tables, model, metric, hi, lo, step=step) if hi and lo else None
            out.append(paired_finding(f, p, "Needs naive BF16 scaling, Sol-RL and its twin with common run seeds.",
                                      tables=tables, arms=(hi, lo)))
    return out


def measured_ratio(tables: Tables, base: str | None, target: str | None, column: str = "e2e_s"):
    """(base / target seconds per iteration, lo, hi, n_base, n_target, df, base seconds, target seconds) of the
    quiet runs' per-run medians (solbench.report.timing); Nones where an arm has no timings."""
    from solbench.report.stats import ratio_ci, ratio_t
    from solbench.report.timing import _ratio_of_means, per_run_medians, quiet_runs

    if not (base and target):
        return None
    med = per_run_medians(tables)[0]
    if med.empty:
        return None
    med = med[med["arm"].isin([base, target])]
    quiet, _ = quiet_runs(tables, med)
    med = med[med["run_id"].isin(quiet)]
    b, t = med.loc[med["arm"] == base, column].to_numpy(float), med.loc[med["arm"] == target, column].to_numpy(float)
    if not (len(b) and len(t)):
        return None
    lo, hi = ratio_ci(b, t, level=tables.options.ci_level)
    return _ratio_of_means(b, t), lo, hi, len(b), len(t), ratio_t(b, t)[2], b, t


def twin_speed(tables: Tables, model: str, runs: pd.DataFrame, sol: str | None, twin: str | None) -> Finding:
    """Twin / Sol-RL seconds per iteration: the speed block's where present, else the training runs' timings."""
    from solbench.report.findings_power import add_ratio_power

    f = Finding(TWIN_SPEED_CLAIM, "FP4's speed", "the paper's Table 5 speedups (1.62x E2E on FLUX) credit FP4; the "
                "twin tells FP4's own share from the short preview's", unit="ratio", threshold=1.0, model=model)
    if not (sol and twin):
        f.detail = "Needs Sol-RL and its full-precision-preview twin (quant.recipe none)."
        return f
    from solbench.report.findings_speed import _emulated

    emulated = _emulated(tables, runs[runs["arm"] == sol])
    block = speed_block_ratio(tables)
    if block is not None:
        f.effect, f.lo, f.hi, f.df, f.covers, f.detail = block
        return _not_judged(f) if emulated else f.decide()
    r = measured_ratio(tables, twin, sol)
    if r is None:
        f.detail = "No timings of Sol-RL and its twin (quiet runs)."
        return f
    f.effect, f.lo, f.hi, nb, nt, _, b, t = r
    add_ratio_power(f, b, t)
    f.seed_cost_s = seed_cost_s(tables, model, (twin, sol))
    f.covers = (f"run seeds of each arm ({nb} and {nt}), t interval of the log ratio" if np.isfinite(f.lo) else
                f"nothing: fewer than 2 run seeds in an arm ({nb} and {nt})")
    f.detail = (f"{twin} / {sol} seconds per iteration of the training runs (median per run after warm-up, quiet runs): "
                "the same rollout budget, only the preview's precision differs. The speed block's timings of these arms "
                "(solbench speed) replace these where the results hold them.")
    return _not_judged(f) if emulated else f.decide()


def _not_judged(f: Finding) -> Finding:
    """An emulated copy's clock (fake quantization, slower than full precision) cannot speak to FP4's speed: the
    ratio is shown, the verdict is "not measured by this spec" (as Table 5's measured rows on such a clock)."""
    from solbench.report.stats import NOT_MEASURED

    f.detail += " Sol-RL's copy is emulated here (fake quantization, slower than full precision): not judged."
    f.verdict = NOT_MEASURED
    return f


def speed_block_ratio(tables: Tables):
    """(ratio, lo, hi, df, covers, detail) of the speed block's twin arm (method sol_rl, recipe none, eager) over its
    Sol-RL arm (method sol_rl, another recipe, eager), paired within rounds; None where the block has no such pair."""
    from solbench.report.speed_block import speed_rows
    from solbench.report.speed_stats import paired_ratios, ratio_interval, round_seconds

    rows = speed_rows(tables)
    if rows.empty or not {"arm", "method", "recipe", "variant"} <= set(rows):
        return None
    arms = rows.drop_duplicates("arm")
    sol_rl = arms[(arms["method"].map(lambda m: same_method(str(m), "sol_rl"))) & (arms["variant"] == "eager")]
    twins, sols = sol_rl[sol_rl["recipe"].astype(str) == TWIN], sol_rl[sol_rl["recipe"].astype(str) != TWIN]
    if twins.empty or sols.empty:
        return None
    twin, sol = str(twins["arm"].iloc[0]), str(sols["arm"].iloc[0])
    pairs = paired_ratios(round_seconds(rows), twin)
    e2e = pairs.loc[(pairs["arm"] == sol) & (pairs["variant"] == "eager"), "e2e_ratio"]
    if len(e2e) < 2:
        return None
    point, lo, hi, _ = ratio_interval(e2e, tables.options.ci_level)
    return (point, lo, hi, float(len(e2e) - 1),
            f"rounds of the speed block ({len(e2e)}): t interval of the mean paired log ratio (the arms of a round "
            "back to back, order rotated)",
            f"{twin} / {sol} E2E seconds per iteration timed alone by the spec's speed block (speed.parquet), paired "
            "within each round: the same rollout budget, only the preview's precision differs.")


def decomposition_table(tables: Tables):
    """The decomposition in one table per model: each step's quality difference on every eval reward (the Findings
    rows) and its measured and PROJECTED speed ratio (seconds per iteration of the slower arm over the faster)."""
    from solbench.report.findings_speed import _projected_iteration
    from solbench.report.clock import phase_projection
    from solbench.report.registry import Note, Table
    from solbench.report.paired import fmt_paired

    rows, display = [], []
    proj = phase_projection(tables)
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        arms = arms_of(tables, runs)
        if not (arms["sol"] and arms["twin"]):
            continue
        found = [f for f in twin_findings(tables, model, runs) if f.paper_table == DECOMPOSITION]
        for (a, b), claim in STEP_CLAIMS.items():
            lo_arm, hi_arm = arms[a], arms[b]
            measured = measured_ratio(tables, lo_arm, hi_arm)
            pa, pb = (_projected_iteration(proj, runs, x, "E2E") if x else pd.DataFrame() for x in (lo_arm, hi_arm))
            projected = (float(pa["projected_s"].mean() / pb["projected_s"].mean()) if len(pa) and len(pb)
                         else math.nan)
            row = dict(model=model, step=claim, arm=hi_arm, against=lo_arm, projected_ratio=projected,
                       measured_ratio=measured[0] if measured else math.nan,
                       measured_lo=measured[1] if measured else math.nan,
                       measured_hi=measured[2] if measured else math.nan)
            cells = {}
            for f in (f for f in found if f.claim == claim):
                row[f"{f.metric}_effect"], row[f"{f.metric}_lo"], row[f"{f.metric}_hi"] = f.effect, f.lo, f.hi
                cells[f"`{f.metric}` ({f.role})"] = fmt_paired(f.effect, f.lo, f.hi, f.covers)
            rows.append(row)
            ratio = (f"{measured[0]:.2f}x [{measured[1]:.2f}, {measured[2]:.2f}]" if measured and
                     math.isfinite(measured[1]) else f"{measured[0]:.2f}x" if measured else "-")
            display.append({"step": claim.split(": ", 1)[1], **cells, "speed, measured (s/iteration ratio)": ratio,
                            "speed, PROJECTED": f"{projected:.2f}x" if math.isfinite(projected) else "-"})
    if not rows:
        return Note("Decomposition", "No Sol-RL full-precision-preview twin (quant.recipe none) in these results: "
                    "Sol-RL's gain over naive BF16 scaling cannot be split into the short preview and FP4.")
    return Table("decomposition", "Decomposition: naive BF16 scaling -> twin -> Sol-RL", pd.DataFrame(rows), (
        "Each step adds one thing: the twin (Sol-RL's rollout with its preview in full precision) against naive BF16 "
        "scaling is the short preview and regenerating K of N; Sol-RL against the twin is the explore copy's precision "
        "alone; the last row is the sum. Quality: paired differences on the same eval prompts and seeds at the "
        "read-out iteration (else the last common one), seeds crossed with prompts (the Findings rows of these claims). "
        "Speed: seconds per iteration of `against` over `arm` (above 1: the step makes it faster), measured on these "
        "runs' clock (quiet runs, t interval of the log ratio) and PROJECTED from counted FLOPs (the Findings' Table 5 "
        "projection)."), display=pd.DataFrame(display))
