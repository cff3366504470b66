"""The report's first screen: the two questions a reader comes with, answered from the findings, and the primary
claims in one narrow table.

- "Is Sol-RL faster?": Table 5's primary row (the measured end-to-end speedup over naive BF16 scaling), with its
  interval, verdict, the clock it is on and what it rests on, beside the measured rollout speedup and the
  PROJECTED GPU figures (which are never measurements);
- "Is it as good as full-precision training?": Table 6's primary row (Sol-RL against naive BF16 scaling, which
  samples every candidate in full precision, non-inferior within the margin), on the training reward.

Everything here is read from the findings table (the frame findings.csv holds: one row per claim and reward), never
written by hand; where a claim has no row, or its verdict is "not measured by this spec", the answer says "not
measured here" and why.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from solbench.report.findings_common import fmt_value
from solbench.report.findings_power import CORES
from solbench.report.stats import CONTRADICTED, NOT_MEASURED, PROJECTION, REPRODUCED

#: the most characters of a primary-table cell (the first screen must fit a page's width)
CELL_LIMIT = 119
PRIMARY_COLUMNS = ("claim", "measured [95 %]", "verdict", "Holm-adjusted", "mde", "what would decide it")


def _flag(value) -> bool:
    return str(value).strip().lower() in ("true", "1") if isinstance(value, str) else bool(value)


def _num(row, column: str) -> float:
    try:
        value = float(row.get(column, math.nan))
    except (TypeError, ValueError):
        return math.nan
    return value


def primary_rows(findings: pd.DataFrame) -> pd.DataFrame:
    """The primary claims' rows, in the order findings.PRIMARY names them."""
    from solbench.report.findings import PRIMARY

    if findings is None or findings.empty or "primary" not in findings:
        return pd.DataFrame()
    rows = findings[findings["primary"].map(_flag)].copy()
    order = {claim: i for i, (_, claim) in enumerate(PRIMARY)}
    rows["_order"] = rows["claim"].map(lambda c: order.get(c, len(order)))
    return rows.sort_values("_order", kind="stable").drop(columns="_order")


def _claim_row(findings: pd.DataFrame, starts: str, *, primary: bool | None = None, verdict: str | None = None):
    if findings is None or findings.empty:
        return None
    rows = findings[findings["claim"].astype(str).str.startswith(starts)]
    if primary is not None and "primary" in rows:
        rows = rows[rows["primary"].map(_flag) == primary]
    if verdict is not None:
        rows = rows[rows["verdict"] == verdict]
    return None if rows.empty else rows.iloc[0]


def measured(row) -> str:
    """'+0.0289 [+0.0145, +0.0432]', '1.44x [0.96x, 2.16x]', or what stands in for a missing figure."""
    effect, lo, hi, unit = _num(row, "effect"), _num(row, "lo"), _num(row, "hi"), str(row.get("unit") or "")
    if not math.isfinite(effect):
        return "-"
    if math.isnan(lo) or math.isnan(hi):
        return fmt_value(effect, unit) + (" (projection)" if row.get("verdict") == PROJECTION else " (no interval)")
    low = "-∞" if lo == -math.inf else fmt_value(lo, unit)
    high = "∞" if hi == math.inf else fmt_value(hi, unit)
    return f"{fmt_value(effect, unit)} [{low}, {high}]"


def mde_text(row) -> str:
    mde, unit = _num(row, "mde"), str(row.get("unit") or "")
    if not math.isfinite(mde) or row.get("verdict") == NOT_MEASURED:
        return "-"
    if unit == "ratio":
        return f"{1 + mde:.2f}x"
    return fmt_value(mde, unit).lstrip("+")


def _span(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{max(hours * 60, 1):.0f} min"


def decide_text(row) -> str:
    """What would decide the claim: nothing (decided), the run seeds or eval prompts whose mde reaches the target,
    what they would add on 2 cores; a projection or an unmeasured claim says what it lacks."""
    verdict = str(row.get("verdict") or "")
    if verdict in (REPRODUCED, CONTRADICTED):
        return "decided: the interval clears the threshold"
    if verdict == PROJECTION:
        return "a measured clock (this figure is a projection)"
    if verdict == NOT_MEASURED:
        return "runs with the arms (or the clock) it needs"
    seeds, prompts, hours = _num(row, "seeds_needed"), _num(row, "prompts_needed"), _num(row, "decide_h")
    per_arm = " per arm" if str(row.get("unit")) == "ratio" else ""
    parts = []
    if math.isfinite(seeds):
        cost = f" (+{_span(hours)} on {CORES} cores)" if math.isfinite(hours) and hours > 0 else ""
        parts.append(f"{int(seeds)} run seeds{per_arm}{cost}")
    elif seeds == math.inf:
        parts.append("no seed count at these prompts")
    if math.isfinite(prompts):
        parts.append(f"{int(prompts)} eval prompts")
    if not parts:
        return "more run seeds (3 or more estimate the seed variance)"
    return "; or ".join(parts) if len(parts) > 1 and math.isfinite(seeds) else "; ".join(parts)


def _clip(text: str, limit: int = CELL_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def primary_table(findings: pd.DataFrame) -> pd.DataFrame:
    """The primary claims in six columns (claim, measured [95 %], verdict, its Holm-adjusted verdict, mde, what would
    decide it), each cell under 120 characters; the reward a claim is judged on is named with its figure."""
    from solbench.report.findings import PRIMARY

    table_of = {claim: table for table, claim in PRIMARY}
    rows = []
    for _, row in primary_rows(findings).iterrows():
        claim = f"{table_of.get(row['claim'], row.get('paper_table', ''))}: {row['claim']}"
        figure = measured(row) + (" (not judged)" if row["verdict"] == NOT_MEASURED and measured(row) != "-" else "")
        if isinstance(row.get("metric"), str) and row["metric"]:
            figure += f" on {row['metric']}"
        verdict = f"**{row['verdict']}**"
        overall = row.get("overall")
        if isinstance(overall, str) and overall and overall != row["verdict"]:
            verdict += f" (all rewards: {overall})"
        adjusted = row.get("adjusted_verdict")  # Holm over the primary family (findings_multiplicity)
        adjusted = adjusted if isinstance(adjusted, str) and adjusted and row["verdict"] != NOT_MEASURED else "-"
        rows.append({"claim": _clip(claim), "measured [95 %]": _clip(figure), "verdict": _clip(verdict),
                     "Holm-adjusted": _clip(adjusted if adjusted != row["verdict"] else "same"),
                     "mde": _clip(mde_text(row)), "what would decide it": _clip(decide_text(row))})
    return pd.DataFrame(rows, columns=list(PRIMARY_COLUMNS))


def _arm_named(text: str, labels: dict[str, str], method: str) -> str:
    """The short label of the first arm of ``method`` that ``text`` names in full (longest labels first)."""
    for arm in sorted(labels, key=len, reverse=True):
        if arm.startswith(method) and arm in str(text):
            return labels[arm]
    return method


def _sentence(text: str, starts: str) -> str:
    """The sentence of ``text`` that begins with ``starts`` (up to its '. '), or ''."""
    text = str(text or "")
    start = text.find(starts)
    if start < 0:
        return ""
    end = text.find(". ", start)
    return text[start:end if end >= 0 else None].rstrip(".")


def _why(row) -> str:
    """Why a claim is not measured: the sentence of its detail naming the clock ('Measured on ...'), else its last."""
    if row is None:
        return "these results hold no rows for it"
    detail = str(row.get("detail") or "")
    clock = _sentence(detail, "Measured on ")
    if clock:
        return clock
    sentences = [s for s in detail.split(". ") if s.strip()]
    return sentences[-1].rstrip(".") if sentences else "these results lack the arms it compares"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _step(row) -> str:
    match = re.search(r"\b[Ss]tep (\d+)", str(row.get("detail") or ""))
    return f"iteration {match.group(1)}" if match else "the compared step"


def speed_answer(findings: pd.DataFrame, labels: dict[str, str], clock: str, horizon: str = "") -> str:
    """The answer to 'Is Sol-RL faster?' (module docstring); ``clock`` stands in where the row does not name its
    clock, ``horizon`` says over which iterations the timings are medians."""
    e2e = _claim_row(findings, "Sol-RL E2E speedup over naive BF16 scaling (measured)")
    rollout = _claim_row(findings, "Sol-RL rollout speedup over naive BF16 scaling (measured)")
    proj_e2e = _claim_row(findings, "Sol-RL E2E speedup over naive BF16 scaling (PROJECTION")
    proj_roll = _claim_row(findings, "Sol-RL rollout speedup over naive BF16 scaling (PROJECTION")
    projected = ""
    if proj_e2e is not None and math.isfinite(_num(proj_e2e, "effect")):
        where = _sentence(proj_e2e.get("detail", ""), "PROJECTION on ").removeprefix("PROJECTION on ").split(",")[0]
        roll = f" and {fmt_value(_num(proj_roll, 'effect'), 'ratio')} in rollout" if proj_roll is not None else ""
        projected = (f" On {where or 'the GPU profile'} it would be {fmt_value(_num(proj_e2e, 'effect'), 'ratio')} end "
                     f"to end{roll}: a PROJECTION from counted FLOPs, not a measurement.")
    question = "**Is Sol-RL faster?**"
    if e2e is None or e2e["verdict"] == NOT_MEASURED or not math.isfinite(_num(e2e, "effect")):
        timed = ""
        if e2e is not None and math.isfinite(_num(e2e, "effect")):  # a clock that cannot speak to FP4 units
            timed = (f" Timed on this clock all the same, Sol-RL's iteration ran {measured(e2e)} as fast as naive BF16 "
                     "scaling's: fewer preview steps and regenerating K of N, with no FP4 arithmetic in it.")
        return (f"{question} Not measured here, and Table 5's measured rows say **{NOT_MEASURED}**: "
                f"{_lower_first(_why(e2e).rstrip('.'))}." + timed + projected)
    arm = _arm_named(e2e.get("detail", ""), labels, "Sol-RL")
    clock = _sentence(e2e.get("detail", ""), "Measured on ").removeprefix("Measured on ") or clock
    roll_text = ""
    if rollout is not None and math.isfinite(_num(rollout, "effect")):
        roll_text = f"; its rollout {measured(rollout)} (**{rollout['verdict']}**)"
    mde = mde_text(e2e)
    decide = decide_text(e2e)
    rests = (f"{e2e.get('covers') or 'run seeds'}" + (f", {horizon}" if horizon else "") + "; "
             + (f"mde {mde}; " if mde != "-" else "") + decide)
    return (f"{question} On the measured clock ({clock}), {arm} runs an iteration end to end {measured(e2e)} as fast "
            f"as naive BF16 scaling: **{e2e['verdict']}** for a speedup above 1x ({rests}){roll_text}.{projected}")


def quality_answer(findings: pd.DataFrame, labels: dict[str, str]) -> str:
    """The answer to 'Is it as good as full-precision training?' (module docstring)."""
    row = _claim_row(findings, "Sol-RL matches naive BF16 scaling (non-inferior)", primary=True)
    question = "**Is it as good as full-precision training?**"
    if row is None or row["verdict"] == NOT_MEASURED or not math.isfinite(_num(row, "effect")):
        return f"{question} Not measured here: Table 6 is **{NOT_MEASURED}** ({_why(row)})."
    arm = _arm_named(row.get("detail", ""), labels, "Sol-RL")
    margin = fmt_value(_num(row, "threshold"), str(row.get("unit") or "rel")).lstrip("+")
    role = f", the {row['role']} reward" if isinstance(row.get("role"), str) and row["role"] else ""
    mde = mde_text(row)
    rests = f"{row.get('covers') or 'run seeds'}; " + (f"mde {mde}; " if mde != "-" else "") + decide_text(row)
    overall = row.get("overall")
    others = (f"; on every reward: **{overall}**" if isinstance(overall, str) and overall and overall != row["verdict"]
              else "")
    return (f"{question} Against naive BF16 scaling, which samples every candidate in full precision, {arm}'s "
            f"`{row['metric']}`{role}, at {_step(row)} is {measured(row)} of naive's score: **{row['verdict']}** for "
            f"no worse than {margin} ({rests}){others}. Measured; no projection enters it.")


#: the question a sweep's report answers first (its answer: solbench/report/sweep_answer.py's one sentence)
SWEEP_QUESTION = "**Which N and K are best here, and does Table 3's trend hold?**"


def answer_lines(findings: pd.DataFrame | None, labels: dict[str, str], clock: str, horizon: str = "",
                 sweep: str | None = None) -> list[str]:
    """'## The answers' (a sweep's own answer first where ``sweep`` gives it), both answers, then the primary claims'
    table (Markdown lines). Primary claims the spec has no runs for (no figure) are named in one line under the table,
    not given a row each: a sweep of one method would otherwise open on a table of empty rows."""
    from solbench.report.render import markdown_table, neutral

    lines = ["## The answers", ""]
    if sweep:
        lines += [f"- {SWEEP_QUESTION} {neutral(sweep)}"]
    if findings is None or findings.empty:
        lines += ["Not measured here: these results give no findings (the findings kind was not run, or no run is "
                  "done).", ""]
        return lines
    lines += [f"- {speed_answer(findings, labels, clock, horizon)}", f"- {quality_answer(findings, labels)}", ""]
    table = primary_table(findings)
    absent = ((table["verdict"] == f"**{NOT_MEASURED}**") & table["measured [95 %]"].str.startswith("-")
              if not table.empty else pd.Series(dtype=bool))  # a timed but unjudged figure keeps its row
    if not table.empty and not absent.all():
        lines += ["### Primary claims", "", markdown_table(table[~absent]), ""]
    if absent.any():
        names = "; ".join(claim.split(":", 1)[0] for claim in table.loc[absent, "claim"])
        lines += [f"*{'Primary claims' if absent.all() else 'The other primary claims'} **{NOT_MEASURED}** (it has no "
                  f"runs of the arms they compare): {names}.*", ""]
    if not table.empty:
        lines += ["*Named in the code before any result was read, each judged on the training reward by the verdict "
                  "rule; every other row of [the findings](findings.md) is exploratory.*", ""]
    return lines
