"""The committed report of experiments/tiny_paper.yaml (reports/tiny_paper/) is what a user reads
before running anything: it must be a whole report of that spec, open with computed Findings, and
stay in step with the spec it claims to come from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from solbench.spec.fidelity_plan import planned_count
from solbench.report.findings_common import NOT_JUDGED
from solbench.report.stats import CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, PROJECTION, REPRODUCED
from solbench.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "tiny_paper"

#: every verdict the Findings rule can give (a binary reward's Table 8 row is described, not judged: issue 48)
VERDICTS = {REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, PROJECTION, NOT_JUDGED}


def report_spec(tmp_path):
    """(the spec the committed report was built from, whether that is today's experiments/tiny_paper.yaml).

    The report is regenerated only by a rerun (its results are not committed), so between a change to the spec and
    the rerun that follows it the report is of the spec as it was when the report was last written: read from git
    at the commit that last wrote reports/tiny_paper/findings.csv. The README must then say the report predates the
    spec's additions."""
    import subprocess

    spec_path = ROOT / "experiments" / "tiny_paper.yaml"
    commit = subprocess.run(["git", "log", "-1", "--format=%H", "--", "reports/tiny_paper/findings.csv"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    changed = commit and subprocess.run(["git", "diff", "--quiet", commit, "--", "experiments/tiny_paper.yaml"],
                                        cwd=ROOT).returncode != 0
    if not changed:
        return load_spec(spec_path), True
    old = subprocess.run(["git", "show", f"{commit}:experiments/tiny_paper.yaml"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    (tmp_path / "tiny_paper.yaml").write_text(old)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "the committed report predates them" in readme, "the README must say the committed report is stale"
    return load_spec(tmp_path / "tiny_paper.yaml"), False


def pages() -> str:
    """The report's pages: index.md and, since issue 52, the pages it links (findings, details, provenance)."""
    return "\n".join((REPORT / p).read_text() for p in ("index.md", "findings.md", "details.md", "provenance.md")
                     if (REPORT / p).is_file())


def test_the_committed_report_opens_with_computed_findings_with_intervals():
    """Catches: a report committed from another spec or a partial run, Findings edited by hand
    (a verdict the rule cannot give), or a report whose Findings lost their intervals."""
    index = (REPORT / "index.md").read_text()
    assert index.startswith("# solbench report: `tiny_paper`")
    sections = re.findall(r"^## (.+)$", index, flags=re.M)
    # issue 52's layout: the answers first, computed from the findings, the detail on the linked pages
    assert sections[0] == "The answers", sections[:3]
    assert (REPORT / "findings.md").is_file() and (REPORT / "details.md").is_file()
    assert len(index.encode()) <= 40_000  # read in a minute: detail is on the linked pages
    assert all(len(line) <= 600 for line in index.splitlines() if line.startswith("|"))
    text = pages()
    findings = pd.read_csv(REPORT / "findings.csv")
    assert set(findings["verdict"]) <= VERDICTS
    measured = findings[findings["verdict"].isin({"reproduced", "contradicted"})]
    assert len(measured) >= 3  # the spec speaks to the paper's claims, not only "not measured"
    assert measured[["lo", "hi"]].notna().all().all()  # every decided claim has its interval
    assert (findings["claim"].str.contains("PROJECT")).any()
    for verdict in findings["verdict"]:
        assert f"**{verdict}**" in text  # the page shows what the table holds
    assert "2 seeds per prompt; 10 sampling steps" in text  # settings print as the spec gives them


def test_the_committed_report_covers_every_run_of_the_spec_and_its_plots(tmp_path):
    """Catches: a report of other runs or other seeds than its spec's (today's, or the one it was built from while a
    rerun is pending, which the README must then say), or one whose plots were not committed with it."""
    spec, _ = report_spec(tmp_path)
    text = pages()
    # the training runs, then one fidelity run per planned checkpoint and recipe (solbench.spec.fidelity_plan)
    n = len(spec.runs) + planned_count(spec.runs, spec.fidelity)
    assert re.search(rf"\| runs \| {n} \({n} done\) \|", text), "the report is not of every run of the spec"
    assert "uncommitted changes" not in text  # its runs came from committed code
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert images and all((REPORT / image).is_file() for image in images)
    assert any("projected" in image.lower() or "projection" in image.lower() for image in images) or \
        "PROJECTED" in text


def test_the_committed_findings_answer_the_papers_questions_with_their_power(tmp_path):
    """Issue 48's done-when, on the committed findings.csv. Catches a report from before the dose-response (naive FP4
    against Sol-RL on one explore copy only), a Table 4 row about the selection mode instead of the paper's
    low-precision-against-full-precision score, Table 1's primary at equal iterations, and a primary row that says
    neither what it could detect nor what run would decide it."""
    from solbench.report.findings import PRIMARY

    f = pd.read_csv(REPORT / "findings.csv")
    primary = f[f["primary"].astype(bool)]
    if report_spec(tmp_path)[1]:  # a report of today's spec has today's primary family (a stale one, its own)
        from solbench.report.findings_multiplicity import ISOLATION_PRIMARY

        # the spec declares report.readout_iteration (issue 54): Tables 4 and 8 and the naive FP4 claim have their
        # primary at the read-out, and their final-policy / at-the-end rows are exploratory
        readout = {table for table, claim in ISOLATION_PRIMARY if "read-out" in claim}
        expected = {claim for table, claim in PRIMARY if table not in readout or "read-out" in claim}
        assert set(primary["claim"]) == expected
    t1 = primary[primary["paper_table"].str.startswith("Table 1")].iloc[0]
    assert "equal PROJECTED GPU time" in t1["claim"]
    t4 = f[f["paper_table"] == "Table 4"]
    assert not t4["claim"].str.contains("select", case=False).any()
    assert t4[t4["primary"].astype(bool)]["verdict"].isin({REPRODUCED, CONTRADICTED, INCONCLUSIVE}).all()
    decided_or_costed = primary[primary["verdict"] != PROJECTION]
    for _, row in decided_or_costed.iterrows():
        # only a clock the report does not judge (an emulated copy's, named in the row) may go without its power
        unjudged = row["verdict"] == NOT_MEASURED and "emulated" in str(row["detail"])
        assert pd.notna(row["mde"]) or unjudged, row["claim"]
        if row["verdict"] == INCONCLUSIVE:  # what run would decide it: seeds (inf: none reach it) or prompts
            assert pd.notna(row["seeds_needed"]) or pd.notna(row["prompts_needed"]), row["claim"]
    dose = f[f["claim"].str.startswith("Naive FP4 ends below Sol-RL, explore copy")]
    recipes = dose["claim"].str.rsplit(" ", n=1).str[-1]
    assert recipes.nunique() >= 2 and dose["recipe"].notna().all()  # the runs' copy and the coarsest (issue 54)
    seeds = dose["per_seed"].map(lambda s: len(json.loads(s)) if isinstance(s, str) and s else 0)
    assert (seeds >= 3).all()
