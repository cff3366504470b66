"""The Findings and tables of the tiny_paper design on a synthetic results folder whose answers are known
(tests/fixtures/synthetic_results.py ``build_paper``): projections that are never verdicts, every claim on the
training and the held-out reward, Table 1 at equal iterations and at equal projected time, naive FP4 at its end
and against its long-horizon controls, the reward-hacking table, contended timings and Table 8 against 0.927.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fixtures.synthetic_results import CONTENDED, PAPER_LONG, PAPER_PHASES, build_paper, paper_gain
from solbench.report import ReportOptions, Tables, get_kind
from solbench.report.findings import REWARDS_DISAGREE
from solbench.report.stats import CONTRADICTED, INCONCLUSIVE, PROJECTION, REPRODUCED

OPTS = ReportOptions(n_boot=400)


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    return Tables.load(build_paper(tmp_path_factory.mktemp("paper")), OPTS)


@pytest.fixture(scope="module")
def findings(paper):
    return _out(paper, "findings", "findings")


def _rows(findings, claim):
    rows = findings.data[findings.data["claim"] == claim]
    assert len(rows), sorted(set(findings.data["claim"]))
    return rows.set_index("metric")


_OUTPUTS: dict = {}


def _out(paper, kind, name):
    """The output ``name`` of report kind ``kind`` (each kind runs once per module)."""
    key = (id(paper), kind)
    if key not in _OUTPUTS:
        _OUTPUTS[key] = get_kind(kind)(paper)
    found = [o for o in _OUTPUTS[key] if getattr(o, "name", None) == name]
    assert found, [getattr(o, "name", o) for o in _OUTPUTS[key]]
    return found[0]


def test_config_arithmetic_rows_are_projections_never_reproduced(findings):
    """Bug caught: the projected rollout and E2E speedups (counted FLOPs: the same for every seed, a zero-width
    'bootstrap') were reported as reproduced [2.50x, 2.50x]; they are projections with their inputs, counted
    apart in the summary."""
    data = findings.data
    projected = data[data["claim"].str.contains("PROJECTION from counted FLOPs")]
    assert len(projected) == 2 and set(projected["verdict"]) == {PROJECTION}
    assert set(projected["overall"]) == {PROJECTION}
    assert (data.loc[data["verdict"] == REPRODUCED, "hi"] - data.loc[data["verdict"] == REPRODUCED, "lo"] > 0).all()
    assert "2 projection(s) from the configuration, counted apart" in findings.caption
    e2e = projected[projected["claim"].str.contains("E2E")].iloc[0]
    # hand-counted: naive 16e9 + 6e9 FLOPs at BF16; Sol-RL 9.6e9 explore (47.7 % at NVFP4: nvfp4_tiny on the shipped
    # width-256 model, tests/test_report_findings.py) + 4e9 + 6e9 at BF16
    from solbench.models.shares import precision_split

    q = precision_split("tiny", "nvfp4_tiny").quantized_share
    naive = 22e9 / 2.25e15
    sol = 9.6e9 * (q / 9e15 + (1 - q) / 2.25e15) + 10e9 / 2.25e15
    assert e2e["effect"] == pytest.approx(naive / sol)
    assert "48% of it at low precision" in e2e["detail"]


def test_every_quality_claim_is_judged_on_the_training_and_the_held_out_reward(findings):
    """Bug caught: only the training reward was judged. Sol-RL gains 0.10 over DiffusionNFT on shapes_geneval
    (trained) and loses 0.10 on shapes_clip (held out): reproduced on one, contradicted on the other, so the
    claim's overall verdict is 'rewards disagree', not 'reproduced'."""
    rows = _rows(findings, "Sol-RL beats DiffusionNFT at equal iterations")
    assert rows.loc["shapes_geneval", "role"] == "training" and rows.loc["shapes_clip", "role"] == "held-out"
    assert rows.loc["shapes_geneval", "verdict"] == REPRODUCED
    assert rows.loc["shapes_clip", "verdict"] == CONTRADICTED
    assert set(rows["overall"]) == {REWARDS_DISAGREE}
    g = 0.10 * (1 - np.exp(-12 / 4))
    assert rows.loc["shapes_geneval", "effect"] == pytest.approx(g, abs=2e-3)
    assert rows.loc["shapes_clip", "effect"] == pytest.approx(-g, abs=2e-3)
    seeds = json.loads(rows.loc["shapes_geneval", "per_seed"])
    assert set(seeds) == {"0", "1", "2"} and all(v == pytest.approx(g, abs=3e-3) for v in seeds.values())
    assert rows.loc["shapes_geneval", "covers"] == "run seeds (3) crossed with eval prompts (6), both random"
    display = findings.display.set_index("claim").loc["Sol-RL beats DiffusionNFT at equal iterations"]
    assert "`shapes_clip`" in display["other rewards"] and "contradicted" in display["other rewards"]


def test_table1_at_equal_projected_time_interpolates_at_the_budget_both_reached(paper, findings):
    """Bug caught: Table 1 compared only at equal iterations while the paper compares at equal GPU-hours. Per
    iteration DiffusionNFT costs 10e9 FLOPs at BF16 and Sol-RL 9.6e9 (45 % NVFP4) + 10e9, so at DiffusionNFT's
    final clock Sol-RL has run fewer iterations: its per-sample scores are read there, linearly between its
    evaluations at steps 6 and 12 (the same prompts and seeds)."""
    from solbench.models.shares import precision_split

    q = precision_split("tiny", "nvfp4_tiny").quantized_share
    per_nft = 10e9 / (2.25e15 * 0.4)
    per_sol = (9.6e9 * (q / 9e15 + (1 - q) / 2.25e15) + 10e9 / 2.25e15) / 0.4
    at = 12 * per_nft / per_sol  # Sol-RL's iterations at the budget (between 6 and 12)
    assert 6 < at < 12
    w = (at - 6) / 6
    sol = (1 - w) * paper_gain("sol_rl", "shapes_geneval", 6) + w * paper_gain("sol_rl", "shapes_geneval", 12)
    expected = sol - paper_gain("diffusion_nft", "shapes_geneval", 12)
    rows = _rows(findings, "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time")
    assert rows.loc["shapes_geneval", "effect"] == pytest.approx(expected, abs=2e-3)
    table = _out(paper, "main_results", "main_results_tiny")
    sol_row = table.data[(table.data["arm"].str.startswith("Sol-RL")) & (table.data["metric"] == "shapes_geneval")
                         & (table.data["final_step"] == 12)].iloc[0]
    assert sol_row["eqt_mean"] == pytest.approx(expected, abs=2e-3)
    per_seed = _out(paper, "main_results", "main_results_per_seed_tiny").data
    assert set(per_seed["comparison"]) == {"equal iterations", "equal PROJECTED time"}
    assert per_seed.groupby(["arm", "metric", "comparison"]).size().eq(3).all()  # one row per run seed


def test_naive_fp4_at_its_end_against_its_controls_and_on_the_held_out_reward(paper, findings):
    """Bugs caught: naive FP4's 'ends below Sol-RL' was tested at step 12 only; its peak-then-decline was judged on
    the training reward alone (which rises to the end here, 'contradicted'), missing the collapse on the held-out
    reward; and no control arm ran its horizon. Here it collapses on shapes_clip after step 12 while both controls
    hold theirs, so the difference-in-differences against each control is reproduced on shapes_clip."""
    end = _rows(findings, "Naive FP4 ends below Sol-RL (at naive FP4's end)")
    assert f"step {PAPER_LONG}" in end.loc["shapes_clip", "detail"] and "iterations=36" in end.loc["shapes_clip", "detail"]
    assert end.loc["shapes_clip", "verdict"] == REPRODUCED
    peak = _rows(findings, "Naive FP4 peaks and then declines")
    # the training reward rises to the end: its maximum is the last reading, so there is no peak to decline from and
    # nothing to test (issue 54: the 'peak' once chosen on the same data was below the final value)
    assert peak.loc["shapes_geneval", "verdict"] == INCONCLUSIVE and "No peak" in peak.loc["shapes_geneval", "detail"]
    assert peak.loc["shapes_clip", "verdict"] == REPRODUCED
    assert set(peak["overall"]) == {INCONCLUSIVE}  # one reward decided, the other with nothing to test
    assert peak.loc["shapes_clip", "effect"] == pytest.approx(-0.2, abs=3e-3)  # 0.1 at step 12 -> -0.1 at 36
    controls = findings.data[findings.data["claim"].str.startswith("Naive FP4 declines more than")]
    assert {c.split(" than ")[1].split(" (")[0] for c in controls["claim"]} == {"Sol-RL", "naive BF16 scaling"}
    clip = controls[controls["metric"] == "shapes_clip"]
    assert (clip["verdict"] == REPRODUCED).all()
    sol_control = paper_gain("sol_rl", "shapes_clip", 36) - paper_gain("sol_rl", "shapes_clip", 12)
    row = clip[clip["claim"].str.contains("than Sol-RL")].iloc[0]
    assert row["effect"] == pytest.approx(-0.2 - sol_control, abs=3e-3)
    # Table 1 reads naive FP4 at Table 1's step (12), its whole horizon is in the long-horizon table
    t1 = _out(paper, "main_results", "main_results_tiny").data
    assert set(t1.loc[t1["arm"] == "naive FP4", "final_step"]) == {12}
    long = _out(paper, "main_results", "long_horizon_tiny").data
    assert long["step"].max() == PAPER_LONG and "naive FP4" in set(long["arm"])


def test_reward_hacking_table_counts_objects_beyond_the_prompt(paper):
    """The check stored at evaluation time: naive FP4 draws step // 12 extra objects on the 4 non-counting prompts
    of 6, so 2 per image on those and 2 x 4/6 on all at step 36; the others draw none."""
    data = _out(paper, "reward_hacking", "reward_hacking_tiny").data.set_index(["arm", "step"])
    assert data.loc[("naive FP4", 36), "extra_mean"] == pytest.approx(3 * 4 / 6)
    assert data.loc[("naive FP4", 36), "extra_non_counting"] == pytest.approx(3.0)
    assert data.loc[("naive FP4", 36), "with_extra"] == pytest.approx(4 / 6)
    assert data.loc[("naive FP4", 0), "extra_mean"] == 0.0
    assert (data.drop(index="naive FP4", level="arm")["extra_mean"] == 0).all()


def test_timings_under_contention_are_flagged(paper):
    """Bug caught: the same work took longer in runs that shared their cores (the spec's first 11 minutes ran
    beside the test suite) and the Timing section did not say so. One naive BF16 run recorded load 0.9."""
    from fixtures.synthetic_results import run_id

    _out(paper, "timing", "timing_phases")
    outputs = _OUTPUTS[(id(paper), "timing")]
    note = [o for o in outputs if getattr(o, "title", "") == "Measured under contention"][0]
    rid = run_id("fx_paper", CONTENDED[0], CONTENDED[1], str(CONTENDED[2]))
    assert f"`{rid}`" in note.text and "0.90" in note.text and "1 of 18 runs" in note.text
    phases = [o for o in outputs if getattr(o, "name", "") == "timing_phases"][0]
    row = phases.data.set_index("arm").loc["naive BF16 scaling (iterations=12)"]
    assert row["contended_runs"] == 1 and row["load_max"] == pytest.approx(0.9)
    assert "contended" in phases.display.set_index("method").loc["naive BF16 scaling (iterations=12)", "load"]
    seconds = sum(sec for *_, sec in PAPER_PHASES["naive_scaling"])
    assert phases.data.set_index("arm").loc["naive BF16 scaling (iterations=12)", "e2e_s"] == pytest.approx(seconds)


def test_table8_is_judged_against_0927_per_reward_and_checkpoint_with_chance_levels(findings):
    """Bugs caught: Table 8's row tested 0.8, not the paper's 0.927; pooled the final policy with other fidelity
    runs; gave hit@K without its chance level (K/N = 0.25 / 0.5 / 0.75 at N = 16)."""
    final = _rows(findings, "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, final policy)")
    base = _rows(findings, "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, base model)")
    assert set(final.index) == set(base.index) == {"shapes_geneval", "shapes_clip"}
    assert final["threshold"].tolist() == pytest.approx([0.877, 0.877])
    assert (final["verdict"] == REPRODUCED).all()  # proxy noise 0.05: rho near 0.99
    assert (base["verdict"] == CONTRADICTED).all()  # proxy noise 0.3: rho near 0.7, wholly below 0.877
    assert "hit@12" in final.iloc[0]["detail"] and "(chance 0.75)" in final.iloc[0]["detail"]


def test_the_report_draws_every_new_output_and_the_headline_arm_in_a_strong_colour(paper, tmp_path):
    """The whole report renders from these results (every section, no failure), and the Sol-RL headline arm is
    drawn in Sol-RL's own colour with a thick line (bug caught: the 4-seed headline arm was a near-white shade)."""
    from solbench.report import write_report
    from solbench.report.plotting import arm_styles, headline_arms

    runs = paper.done_runs
    arms = paper.arm_order(runs)
    styles = arm_styles(arms, dict(zip(runs["arm"], runs["method"])), headline_arms(paper, runs))
    head = [a for a in headline_arms(paper, runs) if a.startswith("Sol-RL")][0]
    assert styles[head]["color"] == "#d62728" and styles[head]["linewidth"] > 2
    from matplotlib.colors import to_rgb

    assert all(min(to_rgb(s["color"])) < 0.85 for s in styles.values())  # nothing near white
    index = write_report(paper.results_dir, results_root=paper.results_dir.parent, reports_root=tmp_path,
                         options=OPTS, strict=True)
    text = "\n".join((index.parent / page).read_text() for page in ("index.md", "findings.md", "details.md"))
    for section in ("Findings", "Reward hacking", "Long horizon", "Paired differences per run seed",
                    "Measured under contention"):
        assert section in text, section
    assert "[0.00, 1241574607630597.00]" not in text
    findings = pd.read_csv(index.parent / "findings.csv")
    assert {"role", "overall", "per_seed", "prompts_only"} <= set(findings.columns)
    assert INCONCLUSIVE in set(findings["verdict"]) or REPRODUCED in set(findings["verdict"])
