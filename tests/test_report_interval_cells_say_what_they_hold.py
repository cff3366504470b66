"""Interval and speedup cells print one way and say what they hold (issues 42, 48): a convergence interval without
finite bounds says why, a target met at the first evaluation is no speedup, a target equal to the base score is no
target, an infinite bound prints as ∞ and a no-information cell says so, a zero half-width is not ± 0, an exact
zero prints as zero, and prompts-only intervals of two-seed arms are marked (†).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from _report_outputs import linear, named
from fixtures.arm_results import METRIC, Arm, build_arms
from solbench.report import ReportOptions
from solbench.report.stats import CI

OPTS = ReportOptions(n_boot=400)


def test_a_convergence_interval_without_finite_bounds_says_why(tmp_path):
    """Catches the '[0.00x, -]' of the convergence rows: some bootstrap resamples of Sol-RL's seeds reach
    DiffusionNFT's final score at the first evaluation (an infinite speedup), others never (0)."""
    offsets = {0: lambda s: 0.05, 1: lambda s: 0.0, 2: lambda s: 0.02 * s}
    tables = build_arms(tmp_path, "conv", [
        Arm("sol_rl", gain=lambda step, seed: offsets[seed](step), seeds=(0, 1, 2)),
        Arm("diffusion_nft", gain=linear(0.01), seeds=(0, 1, 2))], options=OPTS)
    display = named(tables, "findings", "findings").display
    cell = display.loc[display["claim"].str.contains("faster \\(measured clock\\)"), "95% interval"].iloc[0]
    assert "-]" not in cell and "∞" in cell
    assert "first evaluation" in cell and "never reaches the target" in cell


def test_a_target_the_curve_meets_at_its_first_evaluation_is_no_speedup():
    # Bug caught (tiny_paper's rerun): where DiffusionNFT ended at its base score (shapes_geneval_strict 0.2273), the
    # other arms' step-0 mean equalled the target up to float rounding, the strict comparison missed it, and the
    # interpolation "reached" it 4.4e-14 s in: "1733464125039459.50x [0.00, >100] (4.408e-14 s)"; an exact tie
    # printed "infx [0.00, >100] (0 s)".
    from solbench.report.curves import fmt_speedup_cell, time_to_reach

    wall = np.array([0.0, 10.0, 20.0])
    assert time_to_reach(wall, np.array([0.3, 0.5, 0.6]), 0.1 + 0.2) == 0.0  # 0.3 < 0.30000000000000004
    assert time_to_reach(wall, np.array([0.3, 0.5, 0.6]), 0.4) == pytest.approx(5.0)  # a real crossing stays
    cell = fmt_speedup_cell({"time_to_target_s": 0.0, "reached_at_start": True, "start": 0.2273, "final": 0.3,
                             "speedup": math.inf, "speedup_lo": 0.0, "speedup_hi": math.inf})
    assert cell == "met at its first evaluation (its score there 0.2273): no speedup to measure"
    crossing = fmt_speedup_cell({"time_to_target_s": 12.3, "reached_at_start": False, "start": 0.2, "final": 0.3,
                                 "speedup": 2.1, "speedup_lo": 1.3, "speedup_hi": 3.05})
    assert crossing == "2.10x [1.30, 3.05] (12.3 s)"
    # and where the reference itself met its final score at its first evaluation, every other arm's "0.00x" was 0 / t
    no_target = fmt_speedup_cell({"reference_time_s": 0.0, "time_to_target_s": 35.1, "reached_at_start": False,
                                  "start": 0.2197, "final": 0.3, "speedup": 0.0, "speedup_lo": 0.0, "speedup_hi": 9.0})
    assert no_target == "no target: the reference's final score is met at its own first evaluation"


def test_a_convergence_target_equal_to_the_base_score_is_no_target(tmp_path):
    """Catches the shapes_clip convergence target listed as a target (0.6752) where DiffusionNFT ended at its own
    base score: there is nothing to converge to."""
    tables = build_arms(tmp_path, "flat", [Arm("sol_rl", gain=linear(0.02), seeds=(0, 1, 2)),
                                           Arm("diffusion_nft", gain=lambda step, seed: 0.0, seeds=(0, 1, 2))],
                        options=OPTS)
    table = named(tables, "convergence", "convergence_tiny")
    assert f"{METRIC}: no target (DiffusionNFT's final score" in table.caption
    assert "did not improve" in table.caption


def test_infinite_bounds_print_one_way_and_no_information_cells_say_so():
    """Catches one infinite bound printed as ∞, ">100" and "inf", and "[0.00, >100]" cells that carry nothing."""
    from solbench.report.curves import fmt_speedup_cell
    from solbench.report.stats import fmt_num

    assert fmt_num(math.inf) == "∞" and fmt_num(-math.inf) == "-∞"
    row = dict(reference_time_s=10.0, time_to_target_s=5.0, final=0.5, start=0.1, reached_at_start=False,
               speedup=2.0, speedup_lo=1.2, speedup_hi=math.inf)
    assert fmt_speedup_cell(row) == "2.00x [1.20, ∞) (5 s)"
    none = fmt_speedup_cell(dict(row, speedup_lo=0.0))
    assert ">100" not in none and "no informative interval" in none and "inconclusive" in none


def test_a_zero_half_width_is_not_printed_as_plus_minus_zero():
    """Catches "0.688 ± 0.000" (two seeds that agree to three digits read as an exact measurement)."""
    from solbench.report.stats import fmt_ci

    assert "± 0.000" not in fmt_ci(CI(0.688, 0.688, 0.688, 2), 3)
    assert fmt_ci(CI(0.688, 0.688, 0.688, 2), 3) == "0.688 (no spread over 2 units)"
    assert fmt_ci(CI(0.5, 0.4, 0.6, 3), 3) == "0.500 ± 0.100"


def test_an_exact_zero_prints_as_zero():
    # Bug caught (tiny_paper's rerun): a paired delta of exactly zero printed as its float residue 9.252e-18.
    from solbench.report.stats import fmt_num

    assert fmt_num(9.252e-18) == "0.0000" and fmt_num(2.46e-05) == "2.460e-05" and fmt_num(-0.0303) == "-0.0303"


def test_prompts_only_intervals_of_two_seed_arms_are_marked_in_tables_and_the_ablation_caption(tmp_path):
    """Catches N 8 shown as [-0.044, -0.010] beside crossed intervals, unmarked, while its two seeds gave -0.047 and
    -0.007, and the ablation chart's caption saying "crossed design" for every arm."""
    tables = build_arms(tmp_path, "mark", [
        Arm("sol_rl", {"n": 16}, linear(0.02), seeds=(0, 1, 2)),
        Arm("sol_rl", {"n": 8}, linear(0.01), seeds=(0, 1)),
        Arm("diffusion_nft", gain=linear(0.005), seeds=(0, 1, 2))], noise=0.01, options=OPTS)
    main = named(tables, "main_results", "main_results_tiny")
    cells = main.display.set_index("method")[f"Δ vs DiffusionNFT {METRIC}"]
    assert cells["Sol-RL (n=8)"].endswith("†") and not cells["Sol-RL (n=16)"].endswith("†")
    assert "†: the interval covers the eval prompts only" in main.caption
    table = named(tables, "ablations", "ablations_tiny_sol_rl")
    assert table.display[f"Δ vs default {METRIC}"].str.endswith("†").any()
    chart = named(tables, "ablations", "ablations_tiny_sol_rl_chart")
    assert "eval prompts only" in chart.caption and "(hollow points)" in chart.caption
    assert "crossed design: run seeds and eval prompts), so" not in chart.caption
