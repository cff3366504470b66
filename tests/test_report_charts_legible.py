"""Charts a reader can read (issue 52, item 4), measured with matplotlib's own text extents (tests/_chart_checks.py).

A report of tiny_paper's kinds of arms (tests/fixtures/many_arms.py: 20 arms of the seven methods, Sol-RL ablations
over explore steps, N, K and the selection, long horizons, naive FP4 on three recipes, fidelity runs at three
checkpoints) is written through ``write_report``; every chart it draws is checked at the dpi it is saved at for
text under 7 pt, text cut by the figure's edge, texts overlapping one another and axes or legends of more than 8
labelled series. The checker itself is shown to find each defect on a figure built to have it.
"""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex

from _chart_checks import SAVED_DPI, chart_defects
from fixtures.many_arms import build_many_arms
from solbench.report import ReportOptions, write_report
from solbench.report.plotting import METHOD_COLOURS, clip, new_figure, style_axes
from solbench.report.registry import Figure

#: charts the crowded report must draw
EXPECTED = {"learning_curves_tiny", "learning_curves_tiny_arms", "convergence_tiny_chart",
            "convergence_tiny_projected_chart", "reward_hacking_tiny_chart", "explore_gap_tiny_chart",
            "dose_response_tiny_chart", "timing_phases_chart", "ranking_fidelity_chart", "fidelity_by_iteration_chart",
            "ablations_tiny_sol_rl_chart", "samples_tiny_diffusionnft", "headline"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """(index.md, {figure name: what was measured of it}) of the crowded report: every Figure the report saves
    (its sections' and its pages' own, the headline among them) is measured as it is handed to render_output."""
    import solbench.report.render as render

    root = tmp_path_factory.mktemp("legible")
    folder = build_many_arms(root / "results", experiment="many")
    measured = {}
    original = render.render_output

    def measuring(out, out_dir, used):
        if isinstance(out, Figure):
            fig = out.figure
            measured[out.name] = dict(
                defects=chart_defects(fig), size=fig.get_size_inches() * SAVED_DPI,
                colours={to_hex(line.get_color()) for ax in fig.axes for line in ax.lines},
                labels=fig.axes[0].get_legend_handles_labels()[1] if fig.axes else [], n_axes=len(fig.axes))
        return original(out, out_dir, used)

    patch = pytest.MonkeyPatch()
    patch.setattr(render, "render_output", measuring)
    try:
        index = write_report(folder, results_root=folder.parent, reports_root=root / "reports",
                             options=ReportOptions(n_boot=50), strict=True)
    finally:
        patch.undo()
    return index, measured


def test_a_report_of_twenty_arms_draws_every_chart_legibly(report):
    """Catches every chart defect of issue 52's list on a report as crowded as tiny_paper's: 20 series on each of
    the learning curves' axes, the convergence charts' 20-entry legends over the title and cut at the bottom, the
    reward-hacking legend cut on both sides, overprinted multi-line tick labels of the phase chart, point labels
    under 7 pt, the ranking-fidelity chart's 9-entry legend, the explore-gap chart's unlabelled y axes, and any new
    chart that runs text off its edge."""
    from PIL import Image

    index, measured = report
    assert EXPECTED <= set(measured), sorted(measured)
    assert {name: m["defects"] for name, m in measured.items() if m["defects"]} == {}
    for name, m in measured.items():  # what was measured is what was saved: the PNG is the figure at 110 dpi
        png = next(index.parent.rglob(f"{name}.png"))
        width, height = Image.open(png).size
        assert abs(width - m["size"][0]) <= 1 and abs(height - m["size"][1]) <= 1, name


def test_each_method_is_drawn_in_its_own_colour_in_every_curve_chart(report):
    """Catches a method's further arms drawn in colours of their own (seven Sol-RL arms in seven hues read as seven
    methods): every line of the curve charts is its method's colour, or the grey/black of a reference line."""
    _, measured = report
    allowed = {c.lower() for c in METHOD_COLOURS.values()} | {"#9a9a9a", "#000000", "#7f7f7f"}
    for name in ("learning_curves_tiny", "learning_curves_tiny_arms", "convergence_tiny_chart",
                 "reward_hacking_tiny_chart", "explore_gap_tiny_chart"):
        colours = measured[name]["colours"]
        assert colours and colours <= allowed, (name, colours - allowed)
    assert len(measured["learning_curves_tiny"]["labels"]) == 7  # one headline arm per method
    assert measured["learning_curves_tiny_arms"]["n_axes"] == 13  # the 13 further arms, a panel each


def _crowded():
    fig = new_figure(3.0, 2.0)
    ax = fig.subplots()
    for i in range(12):
        ax.plot([0, 1], [i, i + 1], label=f"arm {i}")
    ax.legend(fontsize=7)
    ax.set_xlabel("iteration", fontsize=8)
    ax.set_ylabel("reward", fontsize=8)
    ax.text(0.5, 5.0, "overlapping", fontsize=9)
    ax.text(0.52, 5.05, "overlapping too", fontsize=9)
    ax.text(0.2, 2.0, "tiny", fontsize=5)
    fig.text(0.95, 0.5, "a note past the right edge of the figure", fontsize=8)
    return fig


def test_the_checker_finds_crowded_clipped_small_and_overlapping_text():
    """The checker can fail: a figure built with each defect is reported for each, a plain one for none."""
    defects = "\n".join(chart_defects(_crowded()))
    assert "has 12 labelled series" in defects and "a legend has 12 entries" in defects
    assert "'tiny' is 5.0 pt" in defects
    assert "'a note past the right edge of the figure' is clipped by the figure edge" in defects
    assert "texts 'overlapping' and 'overlapping too' overlap" in defects
    bare = new_figure(3.0, 2.0)
    bare.subplots().plot([0, 1], [0, 1])  # ticks without axis labels
    assert [d.split(": ")[1] for d in chart_defects(bare)] == ["the x axis has tick labels and no label",
                                                               "the y axis has tick labels and no label"]
    fig = new_figure(4.0, 3.0)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="Sol-RL")
    style_axes(ax, "iteration", "reward (eval)")
    ax.legend(fontsize=8)
    assert chart_defects(fig) == []


def test_a_ten_megabyte_label_reaches_matplotlib_as_sixty_characters():
    """Catches a hostile arm or metric name (issue 56: 10 MB) laid out whole by matplotlib, seconds and memory per
    chart: labels are clipped with an ellipsis before they reach it."""
    huge = "x" * 10_000_000
    assert clip(huge) == "x" * 59 + "\u2026" and clip("Sol-RL N=8") == "Sol-RL N=8"
    fig = new_figure(4.0, 3.0)
    ax = fig.subplots()
    style_axes(ax, huge, huge, title=huge)
    assert max(len(ax.get_xlabel()), len(ax.get_ylabel()), len(ax.get_title())) <= 120
