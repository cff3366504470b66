"""The report's charts, each defect a reviewer found in reports/tiny_paper (issues 42, 48): contended arms marked and
tick labels whole, one colour per method with per-seed points where seeds are few, no band for an arm of fewer than
three seeds (convergence, reward hacking), counts never below zero, many arms still readable, plain axis labels,
recipes side by side, one box per fidelity arm in colours no method has, value labels beside the bars, and titles
inside the figure. The general legibility checks (overlap, size, series) are tests/test_report_charts_legible.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from _report_outputs import contended_speed_tables, fidelity_arm_tables, finals, linear, named
from fixtures.arm_results import METRIC, PROMPTS, Arm, build_arms
from solbench.report import ReportOptions

OPTS = ReportOptions(n_boot=200)


def test_the_phase_chart_marks_contended_arms_and_keeps_tick_labels_whole(tmp_path):
    """Catches: timing_phases_chart.png drawing the contended arm like any other, and breaking a label
    mid-word ("explor e_steps"); since issue 52 each arm is one line, its short label (wrapped full labels
    overprinted one another)."""
    chart = named(contended_speed_tables(OPTS, tmp_path, "chart", [2]), "timing", "timing_phases_chart")
    ticks = [t.get_text() for t in chart.figure.axes[0].get_yticklabels()]  # horizontal bars (issue 48)
    assert any(t.endswith(" *") and t.startswith("naive") for t in ticks) and "contended" in chart.caption
    assert all("\n" not in t and "\u2026" not in t for t in ticks)


def test_the_phase_chart_of_many_arms_stays_readable_and_select_is_not_explores_colour(tmp_path):
    """Catches timing_phases at 2774 x 462 px with 5 px text for 16 arms, and select drawn in a shade of explore's
    orange."""
    from matplotlib.colors import to_rgb

    from solbench.report.plotting import phase_colour

    arms = [Arm("sol_rl", {"n": n, "explore_steps": 6, "selection": "best_worst"}, seeds=(0,), steps=(0, 2),
                phases=[("explore", "explore", 1e9, 1.0), ("select", "full", None, 0.1)]) for n in range(4, 20)]
    tables = build_arms(tmp_path, "many", arms, options=OPTS)
    chart = named(tables, "timing", "timing_phases_chart")
    width, height = chart.figure.get_size_inches() * chart.figure.dpi
    assert width <= 1400 and width / height < 3
    assert min(t.get_fontsize() for t in chart.figure.axes[0].get_yticklabels()) >= 8
    distance = np.linalg.norm(np.subtract(to_rgb(phase_colour("select", 0)), to_rgb(phase_colour("explore", 0))))
    assert distance > 0.5


def test_every_arm_is_its_methods_colour_and_few_seeds_draw_per_seed_points(tmp_path):
    """Catches: seven Sol-RL arms in seven colours on one axes (issue 52: one colour per method, the further arms in
    small multiples of their own), and a 95 % t band over 2 seeds (one degree of freedom) covering most of the axis,
    so that no learning was visible: each seed's own values are drawn as points instead."""
    from matplotlib.collections import PolyCollection

    from solbench.report.plotting import METHOD_COLOURS, arm_styles

    arms = [f"Sol-RL (n={n})" for n in (4, 8, 16, 32, 64, 96, 128, 160)] + ["DiffusionNFT"]
    styles = arm_styles(arms, {a: ("diffusion_nft" if a == "DiffusionNFT" else "sol_rl") for a in arms},
                        {"Sol-RL (n=16)", "DiffusionNFT"})
    assert {styles[a]["color"] for a in arms[:8]} == {METHOD_COLOURS["Sol-RL"]}
    assert styles["DiffusionNFT"]["color"] == METHOD_COLOURS["DiffusionNFT"]
    assert styles["Sol-RL (n=16)"]["linewidth"] > styles["Sol-RL (n=4)"]["linewidth"]  # the headline arm stands out

    tables = build_arms(tmp_path, "curves", [Arm("sol_rl", gain=linear(0.02)),
                                             Arm("diffusion_nft", gain=linear(0.01))], noise=0.01, options=OPTS)
    fig = named(tables, "learning_curves", "learning_curves_tiny")
    ax = fig.figure.axes[0]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]  # no band over 2 seeds
    assert len(ax.lines) == 2 * (1 + 2)  # each arm: its mean and each seed's own points
    assert {line.get_linestyle() for line in ax.lines if line.get_label() == "_seed"} == {"None"}
    assert "each seed's own values as dots" in fig.caption


def test_the_convergence_chart_draws_no_band_for_an_arm_of_fewer_than_three_seeds(tmp_path):
    # Bug caught (tiny_paper's rerun): the learning curves left out 1-dof t bands for 2-seed arms, the convergence
    # chart still drew them, covering its panels from -0.4 to 1.0.
    from solbench.report.curves import MIN_SEEDS_FOR_BAND, convergence_speedup

    tables = build_arms(tmp_path, "band", [Arm("sol_rl", gain=linear(0.02), seeds=(0, 1)),
                                           Arm("diffusion_nft", gain=linear(0.01), seeds=(0, 1, 2))],
                        noise=0.01, options=OPTS)
    m = tables.run_metrics("eval", METRIC)
    runs = tables.done_runs
    arm_of = dict(zip(runs["method"], runs["arm"]))
    few = convergence_speedup(tables, m, runs, arm_of["sol_rl"], arm_of["diffusion_nft"], "wall_s")
    three = convergence_speedup(tables, m, runs, arm_of["diffusion_nft"], arm_of["diffusion_nft"], "wall_s")
    assert MIN_SEEDS_FOR_BAND == 3 and few["n_seeds"] == 2 and three["n_seeds"] == 3
    assert np.isnan(few["curve"][2]).all() and np.isfinite(three["curve"][2]).all()


def _hacking_tables(tmp_path, name, seeds):
    """Extra-object checks: seed 0 draws none, seed 1 one per image from step 2 on."""
    tables = build_arms(tmp_path, name, [Arm("sol_rl", gain=linear(0.01), seeds=seeds, steps=(0, 2, 4))],
                        options=OPTS)
    folder = tables.results_dir
    metrics = pd.read_parquet(folder / "metrics.parquet")
    rows = []
    for rid, seed in zip(tables.done_runs["run_id"], tables.done_runs["seed"]):
        for step in (0, 2, 4):
            for p in PROMPTS:
                rows.append(dict(run_id=rid, step=step, split="eval_check", metric="extra_objects",
                                 value=float(seed == 1 and step > 0), images_seen=step, wall_s=float(step),
                                 prompt_id=p, eval_seed=0, skill="single_object"))
    pd.concat([metrics, pd.DataFrame(rows)]).to_parquet(folder / "metrics.parquet", index=False)
    from solbench.report import Tables

    return Tables.load(folder, OPTS)


def test_counts_and_shares_never_get_negative_lower_bounds_and_two_seed_arms_no_band(tmp_path):
    """Catches negative lower bounds on counts and proportions (a t interval over 2 seeds of 0 and 1 reaches -5.9)
    and the reward-hacking chart's bands below zero for 2-seed arms, its missing title and its legend taking two
    thirds of the width."""
    tables = _hacking_tables(tmp_path, "hack", (0, 1))
    table = named(tables, "reward_hacking", "reward_hacking_tiny")
    assert (table.data["extra_lo"].dropna() >= 0).all() and (table.data["with_extra_lo"].dropna() >= 0).all()
    assert not table.display["extra objects / image"].str.contains(r"\[-|± ", regex=True).any()
    chart = named(tables, "reward_hacking", "reward_hacking_tiny_chart")
    ax = chart.figure.axes[0]
    assert not ax.collections  # no band over 2 seeds
    bottom, top = ax.get_ylim()  # a count's axis starts at 0, less a margin that draws a line at 0 whole (issue 52)
    assert -0.05 * top <= bottom <= 0 and ax.get_title()
    legend = chart.figure.legends[0]
    assert legend._loc in (8,) or "lower" in str(legend.get_window_extent())  # below the axes, not beside them
    chart.figure.canvas.draw()
    assert legend.get_window_extent().width < 0.67 * chart.figure.bbox.width or legend._ncols >= 2


def test_fidelity_boxes_take_no_methods_colour(tmp_path):
    # Bug caught (tiny_paper's rerun): the fidelity chart cycled seven colours over its eleven arms, so two arms
    # shared a colour (issue 52: the rows are now named on the axis, coloured by explore copy in colours no method
    # has).
    from matplotlib.colors import to_rgb

    from solbench.report.fidelity import _fidelity_figure
    from solbench.report.plotting import METHOD_COLOURS

    groups = pd.DataFrame([dict(kind="all seeds", arm=f"arm {i}", spearman_rho=0.9 - 0.01 * j, kendall_tau=0.8,
                                reward_name=METRIC, n_pairs=12) for i in range(11) for j in range(3)])
    recipes = {f"arm {i}": f"NVFP4 (r{i % 2}), emulated backend" for i in range(11)}
    chart = _fidelity_figure(groups, (), recipes)
    colours = {p.get_facecolor()[:3] for p in chart.figure.axes[1].patches}
    assert len(colours) == 2 and not colours & {to_rgb(c) for c in METHOD_COLOURS.values()}
    assert len(chart.figure.axes[0].get_yticklabels()) == 11 and not chart.figure.legends


def test_ranking_fidelity_draws_one_box_per_arm_on_a_fitted_axis_with_a_readable_legend(tmp_path):
    """Catches ranking_fidelity's eleven histogram outlines on a -1..1 axis with a 7 px legend."""
    tables, _ = fidelity_arm_tables(OPTS, tmp_path, "box", [("fid-base", "nvfp4_tiny_flux", None)] + finals((0, 1, 2)))
    chart = named(tables, "ranking_fidelity", "ranking_fidelity_chart")
    ax = chart.figure.axes[1]
    assert len(ax.patches) == 4  # one box per arm
    assert ax.get_xlim()[0] > -1.0
    assert all(t.get_fontsize() >= 8 for leg in chart.figure.legends for t in leg.get_texts())


def test_fidelity_by_iteration_has_plain_labels_and_recipes_side_by_side(tmp_path):
    """Catches Markdown backticks printed in fidelity_by_iteration's axis labels and two recipes' error bars drawn on
    top of each other at the same step."""
    spec = ([("fid-base-a", "nvfp4_tiny_flux", None), ("fid-base-b", "nvfp4_tiny", None)] + finals((0, 1, 2))
            + finals((0, 1, 2), "nvfp4_tiny"))
    spec = [(rid + ("-b" if recipe == "nvfp4_tiny" and "final" in rid else ""), recipe, ck) for rid, recipe, ck in spec]
    tables, _ = fidelity_arm_tables(OPTS, tmp_path, "traj", spec)
    chart = named(tables, "fidelity_by_iteration", "fidelity_by_iteration_chart")
    for ax in chart.figure.axes:
        assert "`" not in ax.get_ylabel() and "`" not in ax.get_xlabel()
    ax = chart.figure.axes[0]
    xs = [tuple(np.round(np.asarray(c.lines[0].get_xdata(), float), 6)) for c in ax.containers]  # each recipe's line
    assert len(xs) == 2 and not set(xs[0]) & set(xs[1])  # the two recipes never share an x position


def test_ablation_value_labels_sit_beside_the_bars_and_the_y_label_names_the_step(tmp_path):
    """Catches value labels printed on the error bars and the y label "Δ final ..." for an ablation read at step 4."""
    tables = build_arms(tmp_path, "abl", [Arm("sol_rl", {"n": n}, linear(0.01 * n / 8), seeds=(0, 1, 2))
                                          for n in (4, 8, 16)], noise=0.01, options=OPTS)
    chart = named(tables, "ablations", "ablations_tiny_sol_rl_chart")
    ax = chart.figure.axes[0]
    assert "final" not in ax.get_ylabel() and "step 4" in ax.get_ylabel()
    labels = [t for t in ax.texts if t.get_text() != ""]
    assert labels and all(t.xyann[0] > 0 and t.xyann[1] == 0 for t in labels)
    chart.figure.canvas.draw()  # one axis: the title wraps inside the figure's 3.6 inches
    box = chart.figure._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= chart.figure.bbox.width


def test_a_long_arm_label_does_not_clip_the_sample_grid_title(tmp_path):
    """Catches every Sol-RL sample grid's title clipped at both edges."""
    from solbench.report.samples import _arm_figure

    path = tmp_path / "grid_step_0.png"
    from PIL import Image

    Image.fromarray(np.zeros((64, 128, 3), dtype=np.uint8)).save(path)
    arm = "Sol-RL (explore_steps=6, k=4, n=16, selection=best_worst, iterations=32)"
    run = pd.Series({"seed": 0, "run_id": "abc"})
    fig = _arm_figure("tiny", arm, run, {0: path, 16: path}).figure
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width
