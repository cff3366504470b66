"""Findings: one row per claim of the paper that the collected results can speak to, with a verdict.

Every row gives the measured effect, its interval and what the interval covers, the paper's figure, the
decision threshold and a verdict computed by one rule (``stats.verdict``; docs/reports.md, "Findings"):

- reproduced: the whole interval lies on the claim's side of the threshold;
- contradicted: the whole interval lies on the other side;
- inconclusive: the interval spans (or touches) the threshold, there is no interval, or it has zero width
  (data that could not have said otherwise decide nothing);
- projection: the value follows from the configuration (counted FLOPs at a hardware profile's rates); it
  is reported with its inputs and never judged;
- not measured by this spec: the results hold no arms (or no clock) the claim needs.

Quality claims are judged on every eval reward: the training reward (the runs' ``rewards``) and each
held-out one. A claim's overall verdict (``overall``): reproduced when the training reward reproduces it
and no held-out reward contradicts it; contradicted when the training reward contradicts it and no held-out
reward reproduces it; "rewards disagree" when one reproduces and another contradicts it; otherwise the
training reward's verdict. With fewer than three run seeds an interval covers the eval prompts only (the
seed-to-seed variance is not estimated): such verdicts are marked and counted apart.

The claims: solbench/report/findings_quality.py (Tables 1, 2, 3, 6, naive FP4 and its controls) and
solbench/report/findings_speed.py (Tables 5 and 8, convergence).
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pandas as pd

from solbench.report.findings_common import (HELD_OUT, NOT_JUDGED, PAPER_REWARD, REWARDS_DISAGREE,  # noqa: F401
                                             TRAINING, Finding, axis_arms, fmt_value, main_arm, reward_roles,
                                             training_rewards)
from solbench.report.findings_multiplicity import ISOLATION_PRIMARY, adjust
from solbench.report.findings_power import add_cost, add_power, power_cell
from solbench.report.registry import Note, Table, report_kind
from solbench.report.stats import CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, PROJECTION, REPRODUCED, fmt_num
from solbench.report.tables import Tables


def _interval(f: Finding) -> str:
    """'[lo, hi]'; where a bound cannot be computed or is infinite, the interval says why (never '[0.00x, -]')."""
    why = f" ({f.interval_note})" if f.interval_note else ""
    if not math.isfinite(f.effect):
        return "-" + why
    if math.isnan(f.lo) or math.isnan(f.hi):
        return "no interval" + (why or f" ({f.covers})" if f.covers else why)
    lo = "-∞" if f.lo == -math.inf else fmt_value(f.lo, f.unit)
    hi = "∞" if f.hi == math.inf else fmt_value(f.hi, f.unit)
    return f"{'(' if f.lo == -math.inf else '['}{lo}, {hi}{')' if f.hi == math.inf else ']'}{why}"


def _rule(f: Finding) -> str:
    if not math.isfinite(f.threshold):
        return "-"
    side = ">" if f.direction == "greater" else "<"
    return f"effect {side} {fmt_value(f.threshold, f.unit).lstrip('+')}"


def _verdict_text(f: Finding) -> str:
    return f"**{f.verdict}**" + (" (eval prompts only)" if f.prompts_only and f.verdict in (REPRODUCED, CONTRADICTED)
                                 else "")


# ---- the overall verdict of a claim judged on several rewards -------------------------------------

def lead(rows: list[Finding]) -> Finding:
    """The row a claim is judged and shown on: the counterpart of the paper's own reward where the claim has one
    (Table 4: shapes_clip for the CLIP score), else the training reward, else the first row."""
    return ([f for f in rows if f.role == PAPER_REWARD] or [f for f in rows if f.role == TRAINING] or rows)[0]


def overall(rows: list[Finding]) -> str:
    """The rule of the module docstring for one claim's rows (one per reward). A binary reward's Table 8 row
    (``NOT_JUDGED``) takes no part: a rank statistic of a pass/fail reward against a threshold set for graded ones."""
    first_row = lead(rows)
    train = [first_row]
    held = [f for f in rows if f is not first_row and f.verdict != NOT_JUDGED]
    first = train[0].verdict
    if first not in (REPRODUCED, CONTRADICTED, INCONCLUSIVE):
        return first
    verdicts = {f.verdict for f in train + held}
    if REPRODUCED in verdicts and CONTRADICTED in verdicts:
        return REWARDS_DISAGREE
    return first


#: The primary claims, one per paper table, named here before any data is read (issue 42): each is judged on
#: the training reward at the 95 % level. Every other row (the held-out rewards, the other comparisons, other
#: recipes and checkpoints) is exploratory: no correction for multiple comparisons is applied to them.
#: Issue 48: Table 1's primary is at equal PROJECTED GPU time (the paper compares at equal GPU-hours; equal iterations
#: is exploratory), Table 4's is the paper's own (explore-copy images against full precision, final policy), and the
#: K / selection-mode ablation of the public code is exploratory.
PRIMARY: tuple[tuple[str, str], ...] = (
    ("Table 1", "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time"),
    ("Table 2", "More explore steps (up to 6) give a better policy"),
    ("Table 3", "Reward grows with the candidate pool N at fixed K"),
    ("Table 4", "Images of the FP4 explore copy score as well as full precision (non-inferior), final policy"),
    ("Table 5", "Sol-RL E2E speedup over naive BF16 scaling (measured)"),
    ("Table 6", "Sol-RL matches naive BF16 scaling (non-inferior)"),
    ("Table 8", "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, final policy)"),
    ("Sec. naive FP4", "Naive FP4 ends below Sol-RL (at naive FP4's end)"),
) + ISOLATION_PRIMARY  # issue 54: the twin, Table 4 at precision alone, the read-out iteration (findings_multiplicity)
_PRIMARY_CLAIMS = {claim for _, claim in PRIMARY}


def mark_primary(rows: list[Finding]) -> list[Finding]:
    """Flag each primary claim's lead row (``lead``: the paper's reward's counterpart, else the training reward;
    its only row where the claim has no reward)."""
    groups: dict[str, list[Finding]] = {}
    for f in rows:
        groups.setdefault(f.group(), []).append(f)
    for g in groups.values():
        first = lead(g)
        for f in g:
            f.primary = f is first and f.claim in _PRIMARY_CLAIMS
    return rows


def primary_note(level: float) -> Note:
    listing = "; ".join(f"{table}: {claim}" for table, claim in PRIMARY)
    return Note("Primary claims, named before the data", (
        f"One per paper table, fixed in the code before any result is read (solbench.report.findings.PRIMARY): "
        f"{listing}. Each is judged on the training reward (Table 4 on shapes_clip, the CLIP score's counterpart, where "
        f"the results have it), at the {level:.0%} level, by the rule below; the column "
        "`primary` marks its row. Every other row (the held-out rewards, other arms, recipes and checkpoints, "
        "convergence, the decline tests) is exploratory: no correction for multiple comparisons is applied, so among "
        "many exploratory rows some verdicts come out by chance (about 1 in 20 of the claims that are in truth "
        "null, at 95 %); read them as hypotheses for a next run, not as results."))


def collect_findings(tables: Tables) -> list[Finding]:
    """Every claim for every model of the results."""
    from solbench.report.findings_quality import quality_findings
    from solbench.report.findings_speed import convergence_findings, fidelity_findings, speed_findings
    from solbench.report.dose import dose_findings
    from solbench.report.findings_table4 import table4_findings
    from solbench.report.findings_twin import twin_findings

    findings: list[Finding] = []
    metric = tables.headline_metric()
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        if metric is not None and not runs.empty:
            findings += quality_findings(tables, model, runs)
            findings += twin_findings(tables, model, runs)  # Sol-RL against its full-precision-preview twin
        elif not runs.empty or metric is None:
            findings.append(Finding("Quality claims (Tables 1, 2, 3, 6)", "Tables 1-3, 6", "-", model=model,
                                    detail="No evaluation rows."))
        findings += table4_findings(tables, model)
        findings += fidelity_findings(tables, model)
        if not runs.empty:
            findings += speed_findings(tables, model, runs)
            if metric is not None:
                findings += convergence_findings(tables, model, runs, metric)
            findings += dose_findings(tables, model)  # naive FP4 - Sol-RL per explore recipe (tiny_dose)
    findings = mark_binary(tables, findings)
    for f in findings:
        add_cost(add_power(f))
    return adjust(tables, mark_primary(findings))  # Holm, hypotheses, the zero dose (findings_multiplicity)


def _binary_rewards(tables: Tables) -> set[str]:
    """Rewards whose every fidelity candidate score, at both precisions, is 0 or 1 (pass/fail rewards such as
    shapes_geneval_strict)."""
    cand = tables.candidates
    if cand.empty or "reward_name" not in cand:
        return set()
    cand = cand[cand["run_id"].isin(tables.fidelity_runs["run_id"])]
    values = pd.to_numeric(cand["reward"], errors="coerce")
    binary = values.isin([0.0, 1.0]).groupby(cand["reward_name"]).all()
    return {str(r) for r, b in binary.items() if b}


def mark_binary(tables: Tables, rows: list[Finding]) -> list[Finding]:
    """Table 8 rows of a binary reward: with two outcomes at each precision, Spearman ρ, Kendall τ-b and the φ
    coefficient of the pass/fail table are one number, reported once as φ, and it is not judged against the ρ
    threshold set for graded rewards (``NOT_JUDGED``: it cannot turn the claim's overall verdict)."""
    binary = _binary_rewards(tables)
    for f in rows:
        if f.paper_table == "Table 8" and f.metric in binary and f.unit == "rho":
            f.verdict = NOT_JUDGED
            f.detail = (f"`{f.metric}` is binary (pass/fail at both precisions): Spearman ρ = Kendall τ-b = the φ "
                        "coefficient of the 2 x 2 pass/fail table, reported once (as φ); it is not judged against a "
                        "threshold set for graded rewards and takes no part in the overall verdict. " + f.detail)
    return rows


def _held_out_cell(rows: list[Finding]) -> str:
    first = lead(rows)
    held = [f for f in rows if f is not first]

    def one(f: Finding) -> str:
        stat = "φ " if f.verdict == NOT_JUDGED else ""
        return f"`{f.metric}` {stat}{fmt_value(f.effect, f.unit)} {_interval(f)} {_verdict_text(f)}"
    return "; ".join(one(f) for f in held) or "-"


@report_kind("findings", title="Findings", order=1)
def findings(tables: Tables):
    """One row per paper claim: measured effect, interval, paper figure, verdict by the rule of docs/reports.md."""
    rows = collect_findings(tables)
    if not rows:
        return Note("Findings", "No runs to speak to any claim.")
    o = tables.options
    groups: dict[str, list[Finding]] = {}
    for f in rows:
        groups.setdefault(f.group(), []).append(f)
    overall_of = {key: overall(g) for key, g in groups.items()}
    data = pd.DataFrame([{k: v for k, v in dict(asdict(f), overall=overall_of[f.group()]).items()
                          if k not in ("components", "base_mean", "n_arm_seeds")} for f in rows])
    display = []
    for key, g in groups.items():
        f = lead(g)
        display.append({
            "primary": "**primary**" if f.primary else "exploratory", "claim": f.claim, "paper": f"{f.paper_table}: {f.paper}", "model": f.model,
            "reward": f"`{f.metric}` ({f.role})" if f.role else (f"`{f.metric}`" if f.metric else "-"),
            "measured": fmt_value(f.effect, f.unit), f"{o.ci_level:.0%} interval": _interval(f),
            "interval covers": f.covers or "-", "rule": _rule(f), "verdict": _verdict_text(f),
            "power (mde, seeds needed)": power_cell(f) if f.primary else "-",
            "other rewards": _held_out_cell(g), "overall": f"**{overall_of[key]}**", "recipe": f.recipe or "-",
            "details": f.detail.strip()})
    lead_of = {key: lead(g) for key, g in groups.items()}
    counts = pd.Series(list(overall_of.values())).value_counts()
    prompts_only = sum(1 for key, v in overall_of.items() if v in (REPRODUCED, CONTRADICTED) and lead_of[key].prompts_only)
    summary = ", ".join(f"{int(counts.get(v, 0))} {v}" for v in (REPRODUCED, CONTRADICTED, REWARDS_DISAGREE, INCONCLUSIVE,
                                                                NOT_MEASURED) if counts.get(v, 0) or v != REWARDS_DISAGREE)
    order = {claim: i for i, (_, claim) in enumerate(PRIMARY)}
    primary = sorted((lead_of[key] for key in groups if lead_of[key].primary), key=lambda f: order[f.claim])
    table_of = {claim: table for table, claim in PRIMARY}
    primary_text = ("; primary claims: " + ", ".join(f"{table_of[f.claim]} **{overall_of[f.group()]}**" for f in primary)
                    if primary else "; none of the primary claims is in these results")
    summary = (f"Measured claims: {summary}"
               + (f" ({prompts_only} of the reproduced/contradicted on eval prompts only: fewer than 3 run seeds, "
                  "the seed-to-seed variance not estimated)" if prompts_only else "")
               + f"; {int(counts.get(PROJECTION, 0))} projection(s) from the configuration, counted apart"
               + primary_text)
    widths = [(f.hi - f.lo) / 2 for f in rows if f.unit == "abs" and f.role == TRAINING and math.isfinite(f.lo)]
    power = (f" With these runs, paired quality differences smaller than about ±{fmt_num(float(np.median(widths)))} "
             f"(the median half-width of their intervals on the training reward) cannot be told from zero; claims "
             "of a smaller effect stay inconclusive." if widths else "")
    power += (" Each primary row's power cell gives its own mde (the smallest distance from the threshold these runs "
              "detect with 80 % power at the 5 % level, from their variance components over run seeds and eval "
              "prompts) and the run seeds (or eval prompts, where the prompts dominate the variance) that would detect "
              "the paper's effect (or the observed one where the paper has no figure), with what those seeds would add in "
              "hours on 2 cores at the compared arms' measured cost per seed; findings.csv: mde, seeds_needed, "
              "prompts_needed, decide_h (docs/reports.md, Power).")
    outputs = [primary_note(o.ci_level), Table("findings", "Findings: the paper's claims against these results", data, (
        f"{summary}. Verdict rule (docs/reports.md, Findings): reproduced when the whole {o.ci_level:.0%} interval lies "
        "on the claim's side of the threshold, contradicted when it lies wholly on the other side, inconclusive when it "
        "spans or touches the threshold, has zero width or there is none, not measured when these results lack the "
        "arms or the clock the claim needs; a projection follows from the configuration (counted FLOPs) and is never "
        "judged. Each quality claim is judged on the training reward (this row) and on every held-out reward (its "
        "column); overall: reproduced only when no held-out reward contradicts it, 'rewards disagree' when one "
        "reproduces and another contradicts it. Quality effects are paired differences on the same eval prompts and "
        "eval seeds (runs paired by run seed), with the crossed-design interval (run seeds and eval prompts both "
        "random; docs/reports.md, Paired comparisons); ratios use a bootstrap over each arm's run seeds. Every row on "
        f"every reward, and each seed's own difference: findings.csv.{power}"), display=pd.DataFrame(display))]
    return outputs
