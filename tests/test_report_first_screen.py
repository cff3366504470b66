"""The report's first screen (issue 52, items 1-3 and 5): index.md answers "is Sol-RL faster?" and "is it as good
as full-precision training?" within its first 60 lines, from the findings; the primary claims fit one narrow table;
detail moves to linked pages, arms get short labels mapped to their settings, jargon links to the glossary.

The results are synthetic (fixtures/arm_results.py): seven methods, Sol-RL's default and four ablation arms (explore
steps, N), each with its timing phases, so that every number the first page quotes is a closed form of the arms.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from fixtures.arm_results import Arm, build_arms, fidelity_run
from solbench.report import ReportOptions, write_report
from solbench.report.answers import CELL_LIMIT, PRIMARY_COLUMNS, primary_table, quality_answer, speed_answer
from solbench.report.glossary import TERMS, link_terms
from solbench.report.labels import short_labels
from solbench.report.render import anchor
from solbench.report.stats import NOT_MEASURED

KINDS = ("findings", "main_results", "timing", "ranking_fidelity", "ablations", "learning_curves")
OPTS = ReportOptions(n_boot=100, kinds=KINDS)
SOL = {"n": 16, "k": 4, "explore_steps": 6}


def _rate(r):
    return lambda step, seed: r * step + 0.002 * seed


def _arms():
    sol_phases = [("explore", "explore", 2e9, 0.5), ("regenerate", "full", 1e9, 0.5), ("train", "full", 2e9, 1.0)]
    naive_phases = [("rollout", "full", 4e9, lambda s: 2.0 + 0.05 * s), ("train", "full", 2e9, 1.0)]
    three = (0, 1, 2)
    arms = [Arm("flow_grpo", gain=_rate(0.004), seeds=three, phases=[("rollout", "full", 1e9, 0.6)]),
            Arm("dance_grpo", gain=_rate(0.003), seeds=three, phases=[("rollout", "full", 1e9, 0.6)]),
            Arm("awm", gain=_rate(0.005), seeds=three, phases=[("rollout", "full", 1e9, 0.6)]),
            Arm("diffusion_nft", gain=_rate(0.006), seeds=three, phases=[("rollout", "full", 1e9, 0.6)]),
            Arm("sol_rl", SOL, gain=_rate(0.010), seeds=three, phases=sol_phases),
            Arm("naive_scaling", {"n": 16, "k": 4}, gain=_rate(0.010), seeds=three, phases=naive_phases),
            Arm("naive_fp4", {"n": 16, "k": 4}, gain=_rate(0.008), seeds=three,
                phases=[("explore", "explore", 4e9, 1.5), ("train", "full", 2e9, 1.0)])]
    arms += [Arm("sol_rl", dict(SOL, explore_steps=e), gain=_rate(0.008 + 0.0005 * e), seeds=(0, 1), phases=sol_phases)
             for e in (2, 4)]
    arms += [Arm("sol_rl", dict(SOL, n=n), gain=_rate(0.007 + 0.0002 * n), seeds=(0, 1), phases=sol_phases)
             for n in (4, 8)]
    for arm in arms:
        arm.steps, arm.iterations = (0, 4, 8), 8
    return arms


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import numpy as np

    root = tmp_path_factory.mktemp("first")
    rng = np.random.default_rng(3)
    extra, cand = [], []
    for rid, checkpoint in (("fid-base", None), ("fid-final", dict(method="sol_rl", step=8, run_id="sol_rl-s0"))):
        row, rows = fidelity_run("fx_first", rid, "nvfp4_tiny", checkpoint=checkpoint, rho_noise=lambda i: 0.1,
                                 rng=rng)
        extra.append(row)
        cand += rows
    tables = build_arms(root / "results", "fx_first", _arms(), noise=0.01, extra_runs=extra, candidates=cand,
                        options=OPTS)
    index = write_report(root / "results" / "fx_first", reports_root=root / "reports", options=OPTS, strict=True)
    return tables, index


def _tables_in(text: str) -> list[list[str]]:
    """The pipe tables of a Markdown page, each as its lines."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def _named_tables(text: str) -> dict[str, list[str]]:
    """{'### ' title: the first pipe table under it}."""
    out = {}
    for chunk in re.split(r"^### ", text, flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        found = _tables_in(body.split("\n## ")[0])
        if found:
            out[title.strip()] = found[0]
    return out


def _plain(text: str) -> str:
    """Text with its Markdown links replaced by their words (the glossary links every term's first use)."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_the_index_answers_both_questions_within_its_first_60_lines(report):
    """Catches a first screen of header, contents and notes with no answer (the committed report before issue 52),
    and an answer without its figure, interval, verdict, clock or what it rests on."""
    _, index = report
    head = "\n".join(index.read_text().splitlines()[:60])
    assert "## The answers" in head
    faster = _plain(next(line for line in head.splitlines() if "**Is Sol-RL faster?**" in line))
    good = _plain(next(line for line in head.splitlines() if "**Is it as good as full-precision training?**" in line))
    findings = pd.read_csv(index.parent / "findings.csv")
    e2e = findings[findings["claim"] == "Sol-RL E2E speedup over naive BF16 scaling (measured)"].iloc[0]
    # the CPU runs' explore copy is emulated: Table 5's measured rows are not measured by this spec, and say so
    assert e2e["verdict"] == NOT_MEASURED
    assert "Not measured here" in faster and NOT_MEASURED in faster and "emulated" in faster
    proj = findings[findings["claim"] == "Sol-RL E2E speedup over naive BF16 scaling (PROJECTION from counted FLOPs)"]
    assert f"{proj['effect'].iloc[0]:.2f}x end to end" in faster and "PROJECTION" in faster
    t6 = findings[(findings["claim"] == "Sol-RL matches naive BF16 scaling (non-inferior)")
                  & findings["primary"].astype(bool)].iloc[0]
    assert f"{t6['effect']:+.2%} [{t6['lo']:+.2%}, {t6['hi']:+.2%}]" in good
    assert f"**{t6['verdict']}**" in good and "shapes_geneval" in good and "iteration 8" in good
    assert "run seeds (3)" in good  # what it rests on: the crossed design's seeds and prompts
    assert "no projection" in good


def test_the_primary_table_is_narrow_and_every_table_line_bounded(report):
    """Catches the 15-column Findings table with 2,000-character cells on the first page."""
    _, index = report
    text = index.read_text()
    primary = text[text.index("### Primary claims"):]
    table = _tables_in(primary)[0]
    header = _cells(table[0])
    assert len(header) <= 6 and [_plain(h) for h in header] == list(PRIMARY_COLUMNS)
    findings = pd.read_csv(index.parent / "findings.csv")
    primaries = findings[findings["primary"].astype(bool)]
    unrun = primaries[(primaries["verdict"] == NOT_MEASURED) & primaries["effect"].isna()]
    # every primary claim: a row each, or named in the one line of those the spec has no runs for
    assert len(table) - 2 == len(primaries) - len(unrun)
    if len(unrun):
        line = next(li for li in primary.splitlines() if "(it has no runs of the arms they compare)" in li)
        assert line.count(";") == len(unrun) - 1
    for line in table[2:]:
        assert all(len(c) < 120 for c in _cells(line)), line
    for line in text.splitlines():
        if line.startswith("|"):
            assert len(line) <= 600, line[:120]


def test_detail_pages_exist_are_linked_and_keep_the_detail(report):
    """Catches detail dropped instead of moved: the full findings table, every section, the arms' settings and
    the provenance must each be a page the index links to, with an HTML twin whose links point at HTML pages."""
    _, index = report
    folder = index.parent
    text = index.read_text()
    for page in ("findings.md", "details.md", "arms.md", "provenance.md", "glossary.md"):
        assert (folder / page).is_file() and f"]({page}" in text, page
        html = (folder / page).with_suffix(".html").read_text()
        assert ".md#" not in html and 'href="index.html"' in html, page
    assert 'href="details.html#' in (folder / "index.html").read_text()
    findings = (folder / "findings.md").read_text()
    assert "### Findings: the paper's claims against these results" in findings and "seeds needed)" in findings
    details = (folder / "details.md").read_text()
    for title in ("Main results (Table 1)", "Timing (Table 5)", "Ranking fidelity (Table 8)", "Ablations"):
        heading = re.search(rf"^## (\d+\. {re.escape(title)}.*)$", details, re.M)
        assert heading, title
        assert f"(details.md#{anchor(heading.group(1))})" in text, title  # linked from the index
    assert "| data hash |" in (folder / "provenance.md").read_text()
    assert "| data hash |" not in text
    head = text.split("## The answers")[0].strip().splitlines()
    assert len(head) <= 5, head


def test_arms_get_short_labels_mapped_to_their_settings(report):
    """Catches 120-character arm names on the pages ("Sol-RL (explore_steps=2, k=4, n=16, ...)") and a short label
    with no way back to its settings."""
    tables, index = report
    labels = short_labels(tables)
    assert labels["Sol-RL (explore_steps=2, n=16)"] == "Sol-RL 2 explore steps"
    assert labels["Sol-RL (explore_steps=6, n=8)"] == "Sol-RL N=8"
    assert labels["Sol-RL (explore_steps=6, n=16)"] == "Sol-RL"
    assert len(set(labels.values())) == len(labels)
    arms = (index.parent / "arms.md").read_text()
    for full, short in labels.items():
        assert f"| {short} |" in arms and full in arms
    for page in ("index.md", "details.md", "findings.md"):
        assert "Sol-RL (explore_steps=2, n=16)" not in (index.parent / page).read_text(), page
    # the CSVs keep the full labels
    assert "Sol-RL (explore_steps=2, n=16)" in set(pd.read_csv(index.parent / "main_results_tiny.csv")["arm"])


def test_the_papers_tables_have_the_papers_shape(report):
    """Catches Table 1 as one row per arm and reward column triple (13 columns), Tables 2 and 3 missing their
    one-row-per-setting form, and Table 8 without ρ, τ and hit@K."""
    _, index = report
    text = index.read_text()
    blocks = _named_tables(text)
    t1 = next(v for k, v in blocks.items() if k.startswith("Table 1"))
    assert _cells(t1[0]) == ["method", "seeds", "shapes_geneval"]
    methods = [_cells(line)[0] for line in t1[2:]]
    assert methods == ["Base (step 0)", "DanceGRPO", "FlowGRPO", "AWM", "DiffusionNFT", "Sol-RL", "naive BF16 scaling",
                       "naive FP4"]
    assert re.search(r"\| Sol-RL \| 3 \| \d\.\d{3} ±\d\.\d{3} \(Δ \+0\.0[78]\d", "\n".join(t1))
    t2 = next(v for k, v in blocks.items() if k.startswith("Table 2"))
    assert [_cells(line)[0] for line in t2[2:]] == ["2", "4", "6"]
    t3 = next(v for k, v in blocks.items() if k.startswith("Table 3"))
    assert [_cells(line)[0] for line in t3[2:]] == ["4", "8", "16"]
    t5 = next(v for k, v in blocks.items() if k.startswith("Table 5"))
    assert _cells(t5[0])[2:] == ["rollout naive (s)", "rollout Sol-RL (s)", "rollout speedup", "E2E naive (s)",
                                 "E2E Sol-RL (s)", "E2E speedup"]
    assert _cells(t5[2])[0] == "tiny" and "| FLUX.1 (paper) | Sol-RL, 8x B200 | 184 | 79 | 2.33x | 274 | 169 | 1.62x |" in t5
    t8 = next(v for k, v in blocks.items() if k.startswith("Table 8"))
    assert {"Spearman ρ", "Kendall τ", "hit@4"} <= {_plain(c) for c in _cells(t8[0])}


def test_jargon_links_to_the_glossary_at_its_first_use(report):
    """Catches mde, crossed design, projection and the verdict words used on the first page with no definition."""
    _, index = report
    text = index.read_text()
    glossary = (index.parent / "glossary.md").read_text()
    for anchor in ("mde", "crossed-design", "projection", "verdict-rule"):
        assert text.count(f"(glossary.md#{anchor})") == 1, anchor
        assert f"## {anchor.replace('-', ' ')}" in glossary
        assert f'id="{anchor}"' in (index.parent / "glossary.html").read_text(), anchor  # the link's target exists
    assert "[[" not in text  # no link nested in a bracket


def test_link_terms_leaves_code_links_and_headings_alone():
    """Catches a glossary link written into a code span, an existing link or a heading (a broken page)."""
    text = "# mde\n`mde` and [mde](x.md) then mde and mde again"
    assert link_terms(text) == "# mde\n`mde` and [mde](x.md) then [mde](glossary.md#mde) and mde again"
    assert {t.anchor for t in TERMS} >= {"verdict-rule", "interval-kinds", "mde", "crossed-design", "satterthwaite",
                                         "recipe", "backend", "dose", "projection", "x0-rel-dist", "phi", "dagger",
                                         "units"}


def test_answers_say_not_measured_where_findings_lack_the_claim():
    """Catches an answer invented where the findings hold no row (or the row is not measured)."""
    empty = pd.DataFrame(columns=["claim", "verdict", "primary", "effect", "lo", "hi", "unit", "detail"])
    assert "Not measured here" in speed_answer(empty, {}, "a clock")
    assert "Not measured here" in quality_answer(empty, {})
    rows = pd.DataFrame([dict(claim="Sol-RL matches naive BF16 scaling (non-inferior)", paper_table="Table 6",
                              verdict=NOT_MEASURED, primary=True, effect=float("nan"), lo=float("nan"),
                              hi=float("nan"), unit="rel", detail="No done runs of naive BF16 scaling.")])
    assert "No done runs of naive BF16 scaling" in quality_answer(rows, {})
    cells = primary_table(rows)
    assert list(cells.columns) == list(PRIMARY_COLUMNS)
    assert all(len(str(v)) <= CELL_LIMIT for v in cells.iloc[0])


def test_a_measured_speedup_is_answered_with_its_interval_clock_seeds_horizon_and_projection():
    """Catches a speed answer that drops the interval, the verdict, the clock it is on, what it rests on, or that
    passes a projection off as a measurement (on a CPU with bf16 units, where Table 5 is measured)."""
    nan = float("nan")
    detail = ("naive BF16 scaling / Sol-RL (n=16) seconds per iteration (median per run after warm-up). Measured on "
              "AMD EPYC (avx512_bf16), the explore copy on the CPU's bf16 units (cpu_bf16): a real clock.")
    rows = pd.DataFrame([
        dict(claim="Sol-RL E2E speedup over naive BF16 scaling (measured)", verdict="inconclusive", primary=True,
             effect=1.44, lo=0.96, hi=2.16, unit="ratio", mde=0.65, seeds_needed=4.0, prompts_needed=nan,
             decide_h=0.1, covers="run seeds of each arm (3 and 3), t interval of the log ratio", detail=detail),
        dict(claim="Sol-RL rollout speedup over naive BF16 scaling (measured)", verdict="reproduced", primary=False,
             effect=1.76, lo=1.19, hi=2.61, unit="ratio", detail=detail),
        dict(claim="Sol-RL E2E speedup over naive BF16 scaling (PROJECTION from counted FLOPs)", verdict="projection",
             primary=False, effect=1.436, lo=nan, hi=nan, unit="ratio", detail="PROJECTION on B200 at 40%, from x")])
    text = speed_answer(rows, {"Sol-RL (n=16)": "Sol-RL"}, "fallback clock", "medians over 32 iterations")
    assert "1.44x [0.96x, 2.16x]" in text and "**inconclusive**" in text
    assert "AMD EPYC (avx512_bf16)" in text and "fallback clock" not in text
    assert "run seeds of each arm (3 and 3)" in text and "medians over 32 iterations" in text
    assert "mde 1.65x" in text and "4 run seeds per arm" in text
    assert "rollout 1.76x [1.19x, 2.61x] (**reproduced**)" in text
    assert "On B200 at 40% it would be 1.44x end to end: a PROJECTION from counted FLOPs, not a measurement" in text


def test_the_headline_figure_follows_the_chart_rules(report):
    """Catches a headline chart with clipped or overlapping text, text under 7 pt, more than 8 labelled series on
    an axes, a method in a colour not its own, or unlabelled axes."""
    from _chart_checks import chart_defects

    from solbench.report import get_kind
    from solbench.report.headline import headline_figure
    from solbench.report.plotting import _METHOD_COLOURS

    tables, _ = report
    timing = next(o for o in get_kind("timing")(tables) if getattr(o, "name", "") == "timing_table5")
    figure = headline_figure(tables, timing.data, short_labels(tables))
    try:
        assert chart_defects(figure.figure) == []
        left, right = figure.figure.axes[:2]
        colours = {line.get_label(): line.get_color() for line in left.get_lines()}
        assert colours == {"Sol-RL": _METHOD_COLOURS["Sol-RL"], "naive BF16 scaling": _METHOD_COLOURS["naive BF16 scaling"],
                           "naive FP4": _METHOD_COLOURS["naive FP4"], "DiffusionNFT": _METHOD_COLOURS["DiffusionNFT"]}
        for ax in (left, right):
            assert "(" in ax.get_ylabel() and ax.get_ylabel().endswith(")"), ax.get_ylabel()  # with its unit
        assert "(s," in left.get_xlabel()
        assert [t.get_text() for t in right.get_xticklabels()] == ["naive BF16 scaling", "Sol-RL"]
    finally:
        figure.figure.clear()
