"""A sweep's report opens with the sweep's answer (issue 55): the one sentence on the best (N, K) and Table 3's trend
first among the answers, its heat map and measured front on the first page, and no table of empty primary rows for
the claims a one-method sweep has no runs for; the front's cell labels never cover one another.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd

from _chart_checks import chart_defects
from solbench.report.answers import SWEEP_QUESTION, answer_lines
from solbench.report.pages import _sweep_figures
from solbench.report.plotting import label_points, new_figure, style_axes
from solbench.report.registry import Figure
from solbench.report.stats import NOT_MEASURED

NAN = math.nan


def _row(claim: str, table: str, verdict: str, effect: float = NAN, lo: float = NAN, hi: float = NAN,
         unit: str = "abs") -> dict:
    return dict(claim=claim, paper_table=table, verdict=verdict, primary=True, effect=effect, lo=lo, hi=hi, unit=unit,
                metric="shapes_geneval", detail="Needs Sol-RL and naive BF16 scaling runs.")


def _findings() -> pd.DataFrame:
    return pd.DataFrame([
        _row("Reward grows with the candidate pool N at fixed K", "Table 3", "inconclusive", 0.0166, -0.0337, 0.0669),
        _row("Sol-RL matches naive BF16 scaling (non-inferior)", "Table 6", NOT_MEASURED),
        _row("Sol-RL E2E speedup over naive BF16 scaling (measured)", "Table 5", NOT_MEASURED, 1.08, 0.99, 1.17,
             unit="ratio"),
    ])


def test_a_sweep_answers_its_own_question_first():
    """Catches a sweep report whose first answers are the two Sol-RL questions its one method cannot answer, with
    the sweep's answer buried in the details page (the first sweep_nk report did this)."""
    lines = answer_lines(_findings(), {}, "a clock", sweep="At 10 iterations, no single (N, K) is best.")
    bullets = [line for line in lines if line.startswith("- ")]
    assert bullets[0] == f"- {SWEEP_QUESTION} At 10 iterations, no single (N, K) is best."
    assert bullets[1].startswith("- **Is Sol-RL faster?**") and bullets[2].startswith("- **Is it as good")
    assert not any(line.startswith(f"- {SWEEP_QUESTION}") for line in answer_lines(_findings(), {}, "a clock"))


def test_primary_claims_without_runs_are_named_in_one_line_and_a_timed_figure_keeps_its_row():
    """Catches a first page that opens on a table of rows saying only 'not measured by this spec' (nine of ten in a
    sweep), and the opposite slip: a timed but unjudged figure (Table 5 on an emulated explore copy) hidden with
    them."""
    text = "\n".join(answer_lines(_findings(), {}, "a clock"))
    table = [line for line in text.splitlines() if line.startswith("| Table")]
    assert [line.split(":")[0] for line in table] == ["| Table 3", "| Table 5"]
    assert "1.08x [0.99x, 1.17x]" in table[1]
    assert f"**{NOT_MEASURED}** (it has no runs of the arms they compare): Table 6.*" in text


def test_the_first_page_shows_the_sweep_figures_under_the_names_they_were_saved_as():
    """Catches an index image link to the figure's plugin name when the report saved it under another (a table of
    the same name took 'sweep_front', so the PNG is sweep_front_2.png): a broken image on the first page."""
    fig = new_figure(2, 2)
    front = Figure("sweep_front", "Sweep: reward against measured time per iteration", fig, written="sweep_front_2")
    unsaved = Figure("sweep_heatmap", "Sweep: objective on the N x K grid", new_figure(2, 2))
    kind = SimpleNamespace(title="Sweep: the cells")
    lines = _sweep_figures([(kind, [front, unsaved])], [("1. Sweep: the cells", "1-sweep-the-cells")])
    assert "![Sweep: reward against measured time per iteration](sweep_front_2.png)" in lines
    assert any("(details.md#1-sweep-the-cells)" in line for line in lines)
    assert not any("sweep_heatmap" in line for line in lines)  # never saved: no link to a missing file


def _crowded(place) -> list[str]:
    """Defects of sweep_nk's front (its nine cells' measured seconds and rewards), labelled by ``place``."""
    x = np.array([7.0, 12.6, 13.0, 14.4, 15.2, 16.9, 24.9, 26.3, 30.7])
    y = np.array([0.386, 0.394, 0.399, 0.384, 0.412, 0.402, 0.418, 0.427, 0.432])
    labels = ["N=4, K=2", "N=8, K=4", "N=16, K=2", "N=8, K=2", "N=16, K=4", "N=32, K=2", "N=32, K=4", "N=16, K=8",
              "N=32, K=8"]
    fig = new_figure(6.2, 4.4)
    ax = fig.subplots()
    ax.errorbar(x, y, yerr=0.05, fmt="o", label="cell (mean, interval)")
    ax.margins(x=0.25, y=0.12)
    style_axes(ax, "MEASURED s / training iteration", "final shapes_geneval")
    ax.legend(loc="lower right")
    place(ax, x, y, labels)
    return [d for d in chart_defects(fig) if "overlap" in d]


def test_point_labels_never_cover_one_another():
    """Catches direct labels drawn over each other on a crowded front (the staggered offsets the first sweep_nk
    report used put 'N=16, K=4' on 'N=32, K=2'); the staggered placement is shown to be caught on the same points."""

    def staggered(ax, x, y, labels):
        for i, (xi, yi, text) in enumerate(sorted(zip(x, y, labels))):
            ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(5, 3 + 9 * (i % 3)), fontsize=7.5)

    assert _crowded(staggered), "the checker no longer sees the overlap this test was written for"
    assert _crowded(label_points) == []

