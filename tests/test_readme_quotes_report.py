"""The README quotes the committed reports: every figure its tiny_paper paragraph gives is one reports/tiny_paper
holds (issue 52: the README gave ranking fidelity 0.919 / 0.907 for the two explore copies where the report has
0.908 / 0.925, in the other order), and every figure of its sweep paragraph one reports/sweep_nk holds."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "tiny_paper"
NUMBER = re.compile(r"(?<![\w.])[+-]?\d+\.\d+")


SWEEP_REPORT = ROOT / "reports" / "sweep_nk"


def readme_paragraph(starts: str) -> str:
    """The README's paragraph that begins with ``starts``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(starts)
    end = text.find("\n\n", start)
    return text[start:end if end >= 0 else None]


def tiny_paper_paragraph() -> str:
    """The README's paragraph about experiments/tiny_paper.yaml ('Every comparison the paper makes, ...')."""
    return readme_paragraph("Every comparison the paper makes")


def report_numbers(report: Path = REPORT) -> list[str]:
    """Every decimal number the committed report writes: its pages and the cells of its CSVs (as text)."""
    texts = [page.read_text() for page in report.glob("*.md")] + [csv.read_text() for csv in report.glob("*.csv")]
    return [n for text in texts for n in NUMBER.findall(text)]


def _missing(paragraph: str, report: Path) -> list[str]:
    """The figures of ``paragraph`` that ``report`` does not hold (as written, or rounded, or as a percentage)."""
    quoted = [(m.group(0), paragraph[m.end():m.end() + 2].lstrip().startswith("%"))
              for m in NUMBER.finditer(paragraph)]
    values = report_numbers(report)
    exact = {v.lstrip("+") for v in values}
    return [q for q, percent in quoted
            if q.lstrip("+") not in exact and not any(_matches(q, v, percent) for v in values)]


def _matches(quoted: str, value: str, percent: bool) -> bool:
    decimals = len(quoted.split(".")[1])
    q, v = float(quoted), float(value)
    return any(round(x, decimals) == q for x in (v, v * 100) if percent or x == v)


def test_every_figure_the_readme_quotes_for_tiny_paper_is_in_the_committed_report():
    """Catches a README figure that the committed report does not hold (a stale quote after a rerun, a swapped
    pair, a figure from another measurement presented as tiny_paper's)."""
    paragraph = tiny_paper_paragraph()
    assert len(NUMBER.findall(paragraph)) >= 20  # the paragraph quotes the report's findings, not only prose
    missing = _missing(paragraph, REPORT)
    assert not missing, f"README figures not in reports/tiny_paper: {missing}"


def test_the_readme_gives_table_8_for_both_explore_copies_as_the_report_orders_them():
    """Catches the swapped pair itself: the report's base-model ρ of nvfp4_tiny_flux (FLUX's coverage) is below that
    of nvfp4_tiny (SANA's), and the README must not say the opposite."""
    import pandas as pd

    f = pd.read_csv(REPORT / "findings.csv")
    base = f[f["claim"].str.contains("all-seeds Spearman ρ, base model") & (f["metric"] == "shapes_geneval")]
    flux = base[~base["claim"].str.contains("nvfp4_tiny\\)")]["effect"].iloc[0]
    sana = base[base["claim"].str.contains("nvfp4_tiny\\)")]["effect"].iloc[0]
    paragraph = " ".join(tiny_paper_paragraph().split())
    assert re.search(rf"{flux:.3f} \[[^\]]*\] with `nvfp4_tiny_flux`", paragraph), flux
    assert re.search(rf"{sana:.3f} \[[^\]]*\] with `nvfp4_tiny`", paragraph), sana


def test_every_figure_the_readme_quotes_for_the_sweep_is_in_the_committed_sweep_report():
    """Catches a README sweep answer that the committed reports/sweep_nk does not hold (a quote kept after a rerun
    changed the cells, or a figure typed by hand)."""
    paragraph = readme_paragraph("The N x K sweep")
    assert "reports/sweep_nk" in paragraph and len(NUMBER.findall(paragraph)) >= 10
    assert not _missing(paragraph, SWEEP_REPORT), f"README figures not in reports/sweep_nk: {_missing(paragraph, SWEEP_REPORT)}"
