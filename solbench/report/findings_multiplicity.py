"""Multiplicity of the Findings (issue 54): Holm's adjustment over the primary family, the exploratory rows as
hypotheses, and the dose-response judged against its zero-dose control first.

- ``p_value``: the two-sided p of a row's effect against its threshold, from the row's own t interval: for a paired
  design (``Finding.components``) t = (effect - threshold) / SE with the SE and Satterthwaite degrees of freedom of
  ``stats.Components.se_df`` at the design's size (the interval's own: a row is reproduced or contradicted by its
  95 % interval exactly when this p is below 0.05); for a measured speedup (``Finding.df``) the same on the log
  ratio. Rows without a t interval (projections, bootstrap intervals, no interval) have none.
- Holm's step-down adjustment over the primary family (the lead row of each primary claim that has a p): sorted
  p_(1) <= ... <= p_(m), holm_(i) = max over j <= i of min(1, (m - j + 1) p_(j)). ``adjusted_verdict`` of a primary
  is the Findings rule at that p (reproduced / contradicted by the side of the effect when holm_p < 1 - ci_level,
  else inconclusive), beside the raw ``verdict``; a primary without a p keeps its verdict ("not in the family").
- Every other judged row is exploratory: ``adjusted_verdict`` "hypothesis (<verdict>)", counted apart (projections
  and rows not measured keep their verdict).
- The dose-response (naive FP4 - Sol-RL per explore copy, solbench/report/dose.py) is judged against the zero dose
  first: naive FP4 - naive BF16 scaling (naive FP4 with a copy that quantizes nothing) on the same copy, reward and
  iteration, added as its own row. A dose row's gain over Sol-RL says FP4 training hurts only where naive FP4 also
  falls below the zero dose; where that control is not reproduced the dose row's adjusted verdict says so.
Reads stored results only.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from solbench.report.findings_common import Finding
from solbench.report.findings_twin import TWIN_CLAIM, TWIN_SPEED_CLAIM
from solbench.report.stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED, zero_width
from solbench.report.tables import Tables

#: Primary claims issue 54 adds (findings.PRIMARY carries them): the read-out variants of Tables 4 and 8 and of the
#: naive FP4 claim (where a read-out iteration is declared they replace the final-policy / at-the-end primaries of
#: their table, ``_readout_primaries``), and the twin's integrity and speed (solbench/report/findings_twin.py).
ISOLATION_PRIMARY: tuple[tuple[str, str], ...] = (
    ("Table 4", "Images of the FP4 explore copy score as well as full precision (non-inferior), read-out policy"),
    ("Table 8", "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, read-out policy)"),
    ("Sec. naive FP4", "Naive FP4 ends below Sol-RL (at the read-out iteration)"),
    ("Integrity", TWIN_CLAIM),
    ("FP4's speed", TWIN_SPEED_CLAIM),
)
NOT_IN_FAMILY = "not in the family (no p value: {verdict})"
DOSE_TABLE = "Sec. naive FP4 (dose)"
ZERO_DOSE = "Naive FP4 ends below naive BF16 scaling (the zero dose), explore copy {recipe}"


def p_value(f: Finding, level: float = 0.95) -> float:
    """Two-sided p of ``f.effect`` against ``f.threshold`` from the row's t interval; NaN without one."""
    if f.verdict not in (REPRODUCED, CONTRADICTED, INCONCLUSIVE) or zero_width(f.lo, f.hi):
        return math.nan  # not judged (a projection, not measured, binary Table 8) or a refused zero-width interval
    if not (math.isfinite(f.effect) and math.isfinite(f.threshold) and math.isfinite(f.lo) and math.isfinite(f.hi)):
        return math.nan
    if f.components is not None:
        c = f.components
        se, df = c.se_df(c.n_seeds, c.n_prompts)
        distance = f.effect - f.threshold
    elif f.unit == "ratio" and math.isfinite(f.df) and f.lo > 0 and f.effect > 0 and f.threshold > 0:
        df = f.df
        se = (math.log(f.hi) - math.log(f.lo)) / 2 / float(stats.t.ppf(0.5 + level / 2, df))
        distance = math.log(f.effect) - math.log(f.threshold)
    else:
        return math.nan
    if not (se > 0 and math.isfinite(df) and df > 0):
        return math.nan
    return float(2 * stats.t.sf(abs(distance) / se, df))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p values, in the input order."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def _verdict_at(f: Finding, p: float, alpha: float) -> str:
    if not math.isfinite(p) or p >= alpha:
        return INCONCLUSIVE
    on_side = f.effect > f.threshold if f.direction == "greater" else f.effect < f.threshold
    return REPRODUCED if on_side else CONTRADICTED


def adjust(tables: Tables, rows: list[Finding]) -> list[Finding]:
    """The module docstring's pass over the Findings rows (after ``findings.mark_primary``): the zero-dose control
    rows added, p values, Holm over the primaries, hypotheses, and the read-out flag of fidelity rows."""
    _readout_primaries(rows)
    pairs = zero_dose_rows(tables, rows)
    rows = rows + [z for _, z in pairs]
    alpha = 1.0 - tables.options.ci_level
    for f in rows:
        f.p_value = p_value(f, tables.options.ci_level)
    family = [f for f in rows if f.primary and math.isfinite(f.p_value)]
    for f, adjusted in zip(family, holm([f.p_value for f in family])):
        f.holm_p = float(adjusted)
        f.adjusted_verdict = _verdict_at(f, f.holm_p, alpha)
    for f in rows:
        if f.primary and not f.adjusted_verdict:
            f.adjusted_verdict = NOT_IN_FAMILY.format(verdict=f.verdict)
        elif not f.primary:  # judged rows are hypotheses; a projection or what was not measured stays as it is
            judged = f.verdict in (REPRODUCED, CONTRADICTED, INCONCLUSIVE)
            f.adjusted_verdict = f"hypothesis ({f.verdict})" if judged else f.verdict
    _gate_dose(pairs)
    _flag_fidelity(tables, rows)
    return rows


def _readout_primaries(rows: list[Finding]) -> None:
    """One primary per paper table: where a table has a read-out primary, its other primary rows become exploratory
    (the final policy, naive FP4's end: read where the report may flag reward hacking)."""
    readout = {f.paper_table for f in rows if f.primary and "read-out" in f.claim}
    for f in rows:
        if f.primary and f.paper_table in readout and "read-out" not in f.claim:
            f.primary = False


def family_note(tables: Tables, rows: list[Finding]):
    """A Note: the primary family's size, each primary's raw and Holm verdict, and the exploratory count."""
    from solbench.report.registry import Note

    family = [f for f in rows if f.primary and math.isfinite(f.holm_p)]
    if not rows:
        return Note("Multiplicity", "No Findings rows.")
    alpha = 1.0 - tables.options.ci_level
    changed = [f for f in family if f.adjusted_verdict != f.verdict]
    listing = "; ".join(f"{f.paper_table} {f.claim}: {f.verdict} -> **{f.adjusted_verdict}** (p {f.p_value:.3g}, Holm "
                        f"{f.holm_p:.3g})" for f in sorted(family, key=lambda f: f.holm_p))
    explored = [f for f in rows if not f.primary]
    decided = sum(f.verdict in (REPRODUCED, CONTRADICTED) for f in explored)
    return Note("Multiplicity: Holm over the primaries, the rest hypotheses", (
        f"The primary family: {len(family)} claims with a p value (two-sided, from each row's own interval), "
        f"adjusted by Holm's step-down procedure at {alpha:.0%} familywise (findings.csv `p_value`, `holm_p`, "
        f"`adjusted_verdict` beside `verdict`); {len(changed)} verdict(s) change. {listing}. Every other row "
        f"({len(explored)}, of which {decided} reproduced or contradicted uncorrected) is exploratory, a hypothesis "
        "for a next run (`adjusted_verdict` 'hypothesis (...)'): about 1 in 20 of those that are in truth null come "
        "out decided at 95 % by chance. The dose-response rows are judged against the zero-dose control first "
        "(naive FP4 - naive BF16 scaling on the same copy)."))


# ---- the dose-response against the zero dose ---------------------------------------------------------------------

def zero_dose_rows(tables: Tables, rows: list[Finding]) -> list[tuple[Finding, Finding]]:
    """[(dose row, its control)]: per dose row (explore copy, reward, iteration) naive FP4 on that copy - naive BF16
    scaling, paired by seed, the control a new (exploratory) row."""
    from solbench.report.dose import EXPLORING, recipe_arms
    from solbench.report.findings_common import main_arm
    from solbench.report.findings_quality import paired_finding
    from solbench.report.paired import paired_difference

    out = []
    for model in tables.models():
        dose = [f for f in rows if f.paper_table == DOSE_TABLE and f.model == model]
        if not dose:
            continue
        runs = tables.done_runs[tables.done_runs["model"] == model]
        fp4_arms = recipe_arms(tables, runs, EXPLORING[0])
        bf16 = main_arm(tables, runs, "naive_scaling")
        for f in dose:
            recipe = f.claim.rsplit(" ", 1)[-1]
            fp4, step = fp4_arms.get(recipe), _step_of(f)
            claim = ZERO_DOSE.format(recipe=recipe)
            z = Finding(claim, DOSE_TABLE + ", zero-dose control", "no paper figure: naive FP4 is worse than training "
                        "on full-precision samples only if it falls below the zero dose", unit="abs", threshold=0.0,
                        direction="less", model=model, metric=f.metric, role=f.role, key=claim)
            z.detail = f"Δ = {fp4} - {bf16}, `{f.metric}`, at iteration {step} (the dose row's)."
            p = paired_difference(tables, model, f.metric, fp4, bf16, step=step) if fp4 and bf16 else None
            out.append((f, paired_finding(z, p, "Needs naive FP4 on this copy and naive BF16 scaling with common "
                                             "seeds.", tables=tables, arms=(fp4, bf16))))
    return out


def _step_of(f: Finding) -> int | None:
    import re

    found = re.search(r"Step (\d+);", f.detail)
    return int(found.group(1)) if found else None


def _gate_dose(pairs: list[tuple[Finding, Finding]]) -> None:
    for f, z in pairs:
        if z.verdict == REPRODUCED:
            f.adjusted_verdict = f"hypothesis ({f.verdict}; the zero-dose control is reproduced)"
        else:
            f.adjusted_verdict = (f"hypothesis (not judged: against the zero-dose control naive FP4 - naive BF16 "
                                  f"scaling is {z.verdict}, {z.effect:+.4f} [{z.lo:+.4f}, {z.hi:+.4f}])")


def _flag_fidelity(tables: Tables, rows: list[Finding]) -> None:
    """Table 8 rows of the final policies: flagged where their checkpoints are past reward hacking."""
    from solbench.report.fidelity_steps import checkpoint_info
    from solbench.report.readout import flag_text

    todo = [f for f in rows if f.paper_table.startswith("Table 8") and not f.readout_flag and "final" in f.key + f.claim]
    if not todo or tables.fidelity_runs.empty:
        return
    info = checkpoint_info(tables, tables.fidelity_runs)
    runs = tables.runs.set_index("run_id")
    for f in todo:
        finals = info[info["final"] & (info["model"] == f.model) & info["source"].notna()]
        for source, step in zip(finals["source"], finals["step"]):
            arm = runs["arm"].get(str(source))
            text = flag_text(tables, f.model, [arm], step) if arm is not None else ""
            if text:
                f.readout_flag = text
                break
