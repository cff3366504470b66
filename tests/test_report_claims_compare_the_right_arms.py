"""Which arms a finding compares, and which findings are primary: arms are never pooled across settings (iterations
included), the default arm stays the main arm when it ran longer than its ablations, the selection mode is judged
as the public code's option and not as a paper table, Table 1's primary is at equal projected GPU time, and the
Findings name their primary claims before the data (issues 42 and 48). Each test names the defect it catches; every
expected number is a closed form of a synthetic results folder (fixtures/arm_results.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from _report_outputs import finding, linear, named, outputs
from fixtures.arm_results import METRIC, PROMPT_EFFECT, Arm, build_arms
from solbench.report import ReportOptions
from solbench.report.stats import REPRODUCED

OPTS = ReportOptions(n_boot=400)

BASE = 0.5 + float(np.mean(PROMPT_EFFECT)) + 0.005  # a run's step-0 score: prompt effects and eval seeds averaged


def test_the_ablation_table_never_pools_runs_of_other_iterations(tmp_path):
    """Catches the committed report's default row: four 30-iteration runs pooled with three 90-iteration runs
    (0.4711 = (4 x 0.4057 + 3 x 0.5583) / 7, +0.06 above every other setting). Here the default N=16 ran 6
    iterations (4 seeds) and 18 (3 seeds): one row each, the 18-iteration arm read at step 6 (equal iterations)."""
    tables = build_arms(tmp_path, "pool", [
        Arm("sol_rl", {"n": 16}, linear(0.01), seeds=(0, 1, 2, 3), steps=(0, 3, 6), iterations=6),
        Arm("sol_rl", {"n": 16}, linear(0.01), seeds=(0, 1, 2), steps=(0, 3, 6, 9, 12, 15, 18), iterations=18),
        Arm("sol_rl", {"n": 4}, linear(0.005), seeds=(0, 1, 2), steps=(0, 3, 6), iterations=6)], options=OPTS)
    table = named(tables, "ablations", "ablations_tiny_sol_rl").data
    assert sorted(table["n_seeds"]) == [3, 3, 4]  # never 7
    rows = table.set_index(["candidates N", "iterations"])
    assert rows.loc[(16, 6), f"{METRIC}_mean"] == pytest.approx(BASE + 0.06)
    assert rows.loc[(16, 18), f"{METRIC}_mean"] == pytest.approx(BASE + 0.06)  # at step 6, not at 18 (+0.18)
    assert rows.loc[(16, 18), "read at step"] == 6
    assert rows.loc[(4, 6), "vs_default_mean"] == pytest.approx(-0.03)  # from the 4-seed default, paired


def test_the_default_arm_run_longer_than_its_ablations_stays_the_main_arm(tmp_path):
    """Catches: with the default Sol-RL arm on the long horizon and its ablation arms on the short one, the main
    arm was an ablation arm (explore_steps=2: as many settings 'at their mode' once iterations counted) and
    Table 3 found no N axis (its default held out for its iterations). Table 1, 2 and 3 are read at step 6."""
    tables = build_arms(tmp_path, "long", [
        Arm("sol_rl", {"n": 16, "explore_steps": 6}, linear(0.01), seeds=(0, 1, 2), steps=(0, 6, 12), iterations=12),
        Arm("sol_rl", {"n": 4, "explore_steps": 6}, linear(0.005), seeds=(0, 1, 2), steps=(0, 6), iterations=6),
        Arm("sol_rl", {"n": 16, "explore_steps": 2}, linear(0.004), seeds=(0, 1, 2), steps=(0, 6), iterations=6),
        Arm("diffusion_nft", {}, linear(0.002), seeds=(0, 1, 2), steps=(0, 6), iterations=6)],
        noise=0.001, options=OPTS)
    t1 = finding(tables, "Sol-RL beats DiffusionNFT at equal iterations")
    assert "Sol-RL (explore_steps=6, n=16, iterations=12) - DiffusionNFT" in t1["detail"]
    assert t1["effect"] == pytest.approx(0.048, abs=2e-3)
    t3 = finding(tables, "Reward grows with the candidate pool N at fixed K")
    assert t3["effect"] == pytest.approx(0.03, abs=2e-3) and t3["verdict"] == REPRODUCED
    t2 = finding(tables, "More explore steps (up to 6) give a better policy")
    assert t2["effect"] == pytest.approx(0.036, abs=2e-3) and t2["verdict"] == REPRODUCED


def test_the_selection_ablation_is_judged_as_the_public_codes_option_not_a_paper_table(tmp_path):
    """Catches: K and the selection mode named in the ablation section's title but never judged (issue 42), and
    (issue 48) that ablation of the public code's stage1_select_mode called the paper's Table 4 and made primary."""
    tables = build_arms(tmp_path, "sel", [
        Arm("sol_rl", {"selection": "best_worst"}, linear(0.02), seeds=(0, 1, 2)),
        Arm("sol_rl", {"selection": "random"}, linear(0.01), seeds=(0, 1, 2))], noise=0.002, options=OPTS)
    row = finding(tables, "Contrastive selection (best_worst) beats random selection")
    assert row["paper_table"].startswith("Ablation") and "stage1_select_mode" in row["paper_table"]
    assert row["verdict"] == REPRODUCED
    assert row["effect"] == pytest.approx(0.04, abs=3e-3)
    assert not row["primary"]


def test_table1s_primary_is_at_equal_projected_gpu_time_and_selection_is_an_ablation_of_the_public_code():
    """Catches the primary Table 1 claim at equal iterations (the paper compares at equal GPU-hours) and the
    stage1_select_mode ablation listed as the paper's Table 4."""
    from solbench.report.findings import PRIMARY

    primary = dict(PRIMARY)
    assert primary["Table 1"] == "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time"
    assert primary["Table 4"].startswith("Images of the FP4 explore copy score as well as full precision")
    assert not any("selection" in claim for claim in primary.values())


def test_findings_name_the_primary_claims_before_the_data_and_the_rest_as_exploratory(tmp_path):
    """Catches: about 45 verdicts with no word on multiple comparisons: the section opens with one primary claim
    per paper table, fixed before the data, and says how the others are read."""
    from solbench.report.findings import PRIMARY

    tables = build_arms(tmp_path, "prim", [Arm("sol_rl", gain=linear(0.02)), Arm("diffusion_nft", gain=linear(0.01))],
                        noise=0.002, options=OPTS)
    out = outputs(tables, "findings")
    note = out[0]
    assert note.title == "Primary claims, named before the data"
    assert {t.split(" (")[0] for t, _ in PRIMARY} >= {"Table 1", "Table 2", "Table 3", "Table 4", "Table 5", "Table 6",
                                                     "Table 8"}
    assert all(claim in note.text for _, claim in PRIMARY)
    assert "exploratory" in note.text and "multiple comparisons" in note.text
    data = out[1].data
    assert data.loc[data["claim"] == "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time", "primary"].tolist() == [True]
    assert data.loc[data["claim"] == "Sol-RL beats DiffusionNFT at equal iterations", "primary"].tolist() == [False]
    assert not data.loc[data["claim"].str.startswith("Sol-RL reaches"), "primary"].any()
    assert "primary claims: Table 1 **" in out[1].caption
