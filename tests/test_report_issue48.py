"""Issue 48's report side: the paper's Table 4 as the paper has it, Table 1's primary at equal projected GPU time,
the power of every primary claim (mde, seeds_needed, prompts_needed) and the explore recipe of each row, and the
smaller defects a reviewer tripped on in reports/tiny_paper. Each test names the defect it catches; every expected
number is a closed form of a synthetic results folder (fixtures/arm_results.py) or an independent computation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fixtures.arm_results import METRIC, PROMPTS, Arm, build_arms, fidelity_run
from solbench.report import ReportOptions, get_kind
from solbench.report.stats import CI, INCONCLUSIVE, REPRODUCED, crossed_interval

OPTS = ReportOptions(n_boot=200)


def _named(tables, kind, name):
    found = [o for o in get_kind(kind)(tables) if getattr(o, "name", None) == name]
    assert found, [getattr(o, "name", o) for o in get_kind(kind)(tables)]
    return found[0]


def _linear(rate):
    return lambda step, seed: rate * step


def _fidelity(rid, recipe, *, checkpoint=None, rng, rewards=(METRIC, "shapes_clip"), shift=None, binary=(), noise=0.05):
    """A fidelity run whose explore images score ``shift[reward]`` below full precision (0 by default), and whose
    rewards in ``binary`` are pass/fail at both precisions."""
    row, cand = fidelity_run("f48", rid, recipe, checkpoint=checkpoint, rho_noise=lambda i: noise, rng=rng,
                             rewards=rewards)
    for c in cand:
        if c["precision"] == "explore":
            c["reward"] -= (shift or {}).get(c["reward_name"], 0.0)
        if c["reward_name"] in binary:  # pass/fail; the explore copy flips every fourth candidate's outcome
            c["reward"] = float((c["reward"] > 0.5) != (c["precision"] == "explore" and c["cand_idx"] % 4 == 0))
    return row, cand


def _fidelity_tables(tmp_path, name, runs_spec, *, seeds=(0, 1, 2), rewards=(METRIC, "shapes_clip"), **kw):
    rng = np.random.default_rng(5)
    runs, cand = [], []
    for rid, recipe, checkpoint in runs_spec:
        row, rows = _fidelity(rid, recipe, checkpoint=checkpoint, rng=rng, rewards=rewards, **kw)
        runs.append(row)
        cand += rows
    return build_arms(tmp_path, name, [Arm("sol_rl", gain=_linear(0.01), steps=(0, 6, 12), iterations=12, seeds=seeds,
                                           extra={"p_quant.recipe": "nvfp4_tiny_flux"})],
                      extra_runs=runs, candidates=cand, options=OPTS), pd.DataFrame(cand)


def _finals(seeds, recipe="nvfp4_tiny_flux"):
    return [(f"fid-final-{s}", recipe, dict(method="sol_rl", step=12, run_id=f"sol_rl-it12-s{s}")) for s in seeds]


# ---- Table 4 as the paper has it ---------------------------------------------------------------------------------

def test_table4_is_the_explore_copys_images_against_full_precision_paired_with_the_papers_figures(tmp_path):
    """Catches the committed report's "Table 4 (K, selection mode) ... no figure in paper.md": the paper's Table 4 is
    the CLIP score of NVFP4 against BF16 images, and every fidelity run scores both precisions on the same seeds. The
    row is (explore - full) / full per candidate, CLIP's counterpart (shapes_clip) first, base and final policies."""
    tables, cand = _fidelity_tables(tmp_path, "t4", [("fid-base", "nvfp4_tiny_flux", None)] + _finals((0, 1, 2)),
                                    shift={"shapes_clip": 0.05, METRIC: 0.0}, noise=0.005)
    data = _named(tables, "findings", "findings").data
    final = data[data["claim"].str.startswith("Images of the FP4 explore copy") & data["claim"].str.endswith("final policy")]
    assert list(final["metric"]) == ["shapes_clip", METRIC]  # the CLIP counterpart leads
    clip = final.iloc[0]
    mine = cand[cand["run_id"].str.startswith("fid-final") & (cand["reward_name"] == "shapes_clip")]
    explore = mine[mine.precision == "explore"].reward.mean()
    full = mine[mine.precision == "full"].reward.mean()
    assert clip["effect"] == pytest.approx((explore - full) / full, rel=1e-9)
    # issue 54: the explore steps against the full steps is the step-budget comparison, exploratory (the paper's
    # Table 4 is the precision alone: tests/test_fp4_isolation_findings.py)
    assert clip["paper_table"] == "Table 4 (step budget)"
    assert "27.44 vs 27.10" in clip["paper"] and "29.53 vs 29.43" in clip["paper"]
    assert not clip["primary"] and clip["verdict"] in ("contradicted", INCONCLUSIVE)  # ~ -10 % against a -2 % margin
    assert "checkpoints of 3 run seeds crossed with" in clip["covers"]
    base = data[data["claim"].str.endswith("base model") & (data["paper_table"] == "Table 4 (step budget)")]
    assert set(base["metric"]) == {"shapes_clip", METRIC} and not base["primary"].any()
    geneval = final.iloc[1]
    assert abs(geneval["effect"]) < 0.02 and geneval["verdict"] == REPRODUCED  # no shift: non-inferior
    display = _named(tables, "findings", "findings").display
    assert "Table 4 (step budget): NVFP4 vs BF16 CLIP score" in " ".join(display["paper"])


def test_table1s_primary_is_at_equal_projected_gpu_time_and_selection_is_an_ablation_of_the_public_code():
    """Catches the primary Table 1 claim at equal iterations (the paper compares at equal GPU-hours) and the
    stage1_select_mode ablation listed as the paper's Table 4."""
    from solbench.report.findings import PRIMARY

    primary = dict(PRIMARY)
    assert primary["Table 1"] == "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time"
    assert primary["Table 4"].startswith("Images of the FP4 explore copy score as well as full precision")
    assert not any("selection" in claim for claim in primary.values())


# ---- power ---------------------------------------------------------------------------------------------------

def test_the_mde_is_detected_with_80_percent_power_by_simulation():
    """Catches a power formula that is not the interval's own: datasets drawn with known variance components and a
    true effect equal to the design's mde must put the crossed interval wholly above zero about 80 % of the time
    (and the mde at the design's size is the interval's half-width times 1 + t(0.8)/t(0.975))."""
    from solbench.report.stats import Components, variance_components

    rng = np.random.default_rng(0)
    s, p = 4, 30
    true = Components(seed=0.02 ** 2, prompt=0.05 ** 2, resid=0.03 ** 2, n_seeds=s, n_prompts=p)
    mde = true.detectable(s, p)
    hits = 0
    n = 600
    for _ in range(n):
        x = (mde + rng.normal(0, 0.02, (s, 1)) + rng.normal(0, 0.05, (1, p)) + rng.normal(0, 0.03, (s, p)))
        _, lo, _, _ = crossed_interval(x)
        hits += lo > 0
    assert 0.72 <= hits / n <= 0.90
    x = rng.normal(0, 0.02, (s, 1)) + rng.normal(0, 0.05, (1, p)) + rng.normal(0, 0.03, (s, p))
    mean, lo, hi, df = crossed_interval(x)
    c = variance_components(x)
    assert c.detectable(s, p) == pytest.approx((hi - lo) / 2 * (1 + stats.t.ppf(0.8, df) / stats.t.ppf(0.975, df)))


def test_seeds_and_prompts_needed_follow_the_components():
    """Catches a seeds_needed that ignores the prompt term: where prompts dominate, more seeds cannot reach a small
    target (inf: more than 1000, told apart from NaN, not computable), while prompts can; where seeds dominate, the
    count matches a brute-force search of the SE formula sqrt(s2_seed/S + s2_prompt/P + s2_e/(S P))."""
    from solbench.report.stats import Components, units_needed

    prompts = Components(seed=0.0, prompt=0.1 ** 2, resid=0.01 ** 2, n_seeds=3, n_prompts=10)
    assert prompts.prompts_dominate
    assert math.isinf(units_needed(prompts, 0.05, vary="seeds"))
    assert math.isnan(units_needed(Components(math.nan, 0.01, 0.01, 2, 10), 0.05, vary="seeds"))  # 2 seeds
    need = units_needed(prompts, 0.05, vary="prompts")
    assert prompts.detectable(3, int(need)) <= 0.05 < prompts.detectable(3, int(need) - 1)
    seeds = Components(seed=0.04 ** 2, prompt=0.01 ** 2, resid=0.01 ** 2, n_seeds=3, n_prompts=33)
    need = units_needed(seeds, 0.03, vary="seeds")
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    normal = next(n for n in range(3, 500) if z * math.sqrt(0.04 ** 2 / n + 0.01 ** 2 / 33 + 0.01 ** 2 / (n * 33)) <= 0.03)
    assert normal <= need <= normal + 3  # t quantiles at few seeds ask a little more than the normal approximation


def test_findings_csv_gains_mde_seeds_needed_prompts_needed_and_recipe(tmp_path):
    """Catches the Findings' single "effects under about +-0.026 cannot be told from zero" for every claim: each
    primary row has its own mde and seeds_needed (and prompts_needed where prompts dominate), shown beside it, and
    every paired row names the explore recipe of the arms it compares."""
    tables = build_arms(tmp_path, "pow", [
        Arm("sol_rl", gain=lambda step, seed: 0.004 * step + 0.003 * seed, seeds=(0, 1, 2),
            phases=[("explore", "explore", 1e9, 1.0), ("train", "full", 1e9, 1.0)],
            extra={"p_quant.recipe": "nvfp4_tiny_flux"}),
        Arm("diffusion_nft", gain=_linear(0.002), seeds=(0, 1, 2), phases=[("rollout", "full", 1e9, 1.0)])],
        noise=0.01, options=OPTS)
    findings = _named(tables, "findings", "findings")
    data = findings.data
    assert {"mde", "seeds_needed", "prompts_needed", "recipe"} <= set(data.columns)
    assert "components" not in data.columns
    t1 = data[(data["claim"] == "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time") & (data["metric"] == METRIC)].iloc[0]
    assert t1["primary"] and np.isfinite(t1["mde"]) and t1["seeds_needed"] >= 3
    assert t1["recipe"] == "nvfp4_tiny_flux (Sol-RL)"  # DiffusionNFT samples in full precision: not named
    eq = data[(data["claim"] == "Sol-RL beats DiffusionNFT at equal iterations") & (data["metric"] == METRIC)].iloc[0]
    assert eq["mde"] > 0 and not eq["primary"]  # exploratory rows keep their power numbers in the CSV
    cell = findings.display.set_index("claim").loc["Sol-RL beats DiffusionNFT at equal PROJECTED GPU time",
                                                   "power (mde, seeds needed)"]
    assert cell.startswith("mde ") and "seeds (at 6 prompts)" in cell and "Table 1 HPSv2" in cell
    # what deciding it would cost: the missing seeds x the two arms' measured wall seconds per run, on 2 cores
    # (catches a row that says how many seeds but not what they cost, or a cost of the wrong arms or unit)
    walls = tables.metrics.groupby("run_id")["wall_s"].max()
    runs = tables.done_runs.set_index("run_id")
    per_seed = sum(walls[runs.index[runs["method"] == m]].mean() for m in ("sol_rl", "diffusion_nft"))
    assert t1["seed_cost_s"] == pytest.approx(per_seed)
    assert t1["decide_h"] == pytest.approx(max(0, t1["seeds_needed"] - 3) * per_seed / 2 / 3600)
    assert "more on 2 cores" in cell or t1["seeds_needed"] <= 3


# ---- two kinds of interval in one column -------------------------------------------------------------------------

def test_prompts_only_intervals_of_two_seed_arms_are_marked_in_tables_and_the_ablation_caption(tmp_path):
    """Catches N 8 shown as [-0.044, -0.010] beside crossed intervals, unmarked, while its two seeds gave -0.047 and
    -0.007, and the ablation chart's caption saying "crossed design" for every arm."""
    tables = build_arms(tmp_path, "mark", [
        Arm("sol_rl", {"n": 16}, _linear(0.02), seeds=(0, 1, 2)),
        Arm("sol_rl", {"n": 8}, _linear(0.01), seeds=(0, 1)),
        Arm("diffusion_nft", gain=_linear(0.005), seeds=(0, 1, 2))], noise=0.01, options=OPTS)
    main = _named(tables, "main_results", "main_results_tiny")
    cells = main.display.set_index("method")[f"Δ vs DiffusionNFT {METRIC}"]
    assert cells["Sol-RL (n=8)"].endswith("†") and not cells["Sol-RL (n=16)"].endswith("†")
    assert "†: the interval covers the eval prompts only" in main.caption
    table = _named(tables, "ablations", "ablations_tiny_sol_rl")
    assert table.display[f"Δ vs default {METRIC}"].str.endswith("†").any()
    chart = _named(tables, "ablations", "ablations_tiny_sol_rl_chart")
    assert "eval prompts only" in chart.caption and "(hollow points)" in chart.caption
    assert "crossed design: run seeds and eval prompts), so" not in chart.caption


# ---- speed intervals over 2-3 seeds ------------------------------------------------------------------------------

def test_speed_intervals_are_t_intervals_over_seeds_not_a_percentile_bootstrap():
    """Catches the percentile bootstrap of speedups over 2-3 seeds that docs/reports.md itself says undercovers:
    by simulation at 3 seeds per arm the log-ratio t interval covers the true ratio at least 90 % of the time, the
    bootstrap's clearly less; with one seed in an arm there is no interval."""
    from solbench.report.stats import bootstrap_ci, ratio_ci

    rng = np.random.default_rng(1)
    ratio = lambda a, b: float(np.mean(a) / np.mean(b))  # noqa: E731
    t_cover = boot_cover = 0
    n = 300
    for i in range(n):
        base, target = rng.normal(4.0, 0.4, 3), rng.normal(2.0, 0.2, 3)
        lo, hi = ratio_ci(base, target)
        t_cover += lo <= 2.0 <= hi
        blo, bhi = bootstrap_ci([base, target], ratio, n_boot=300, seed=i)
        boot_cover += blo <= 2.0 <= bhi
    assert t_cover / n >= 0.9 and boot_cover / n < 0.85
    assert all(math.isnan(v) for v in ratio_ci([1.0], [1.0, 2.0]))


def test_the_speed_finding_and_table5_say_t_interval(tmp_path):
    """Catches the Findings' speed row covering "run seeds of each arm (3 and 3), bootstrap"."""
    tables = build_arms(tmp_path, "speed", [
        Arm("naive_scaling", seeds=(0, 1, 2), steps=(0, 4), phases=[("rollout", "full", 1e9, lambda s: 2.0 + 0.1 * s)]),
        Arm("sol_rl", seeds=(0, 1, 2), steps=(0, 4), phases=[("explore", "explore", 1e9, lambda s: 0.5 + 0.05 * s)])],
        options=OPTS)
    data = _named(tables, "findings", "findings").data
    row = data[data["claim"] == "Sol-RL rollout speedup over naive BF16 scaling (measured)"].iloc[0]
    assert "t interval of the log ratio" in row["covers"] and "bootstrap" not in row["covers"]
    assert "t interval of the log ratio" in _named(tables, "timing", "timing_table5").caption


# ---- Table 8: binary rewards, single checkpoints ------------------------------------------------------------------

def test_a_binary_rewards_table8_row_is_one_statistic_and_does_not_flip_the_overall_verdict(tmp_path):
    """Catches shapes_geneval_strict (pass/fail) reporting Spearman = Kendall in every row and its "contradicted"
    against the graded 0.877 threshold turning Table 8's overall verdict into "rewards disagree"."""
    tables, _ = _fidelity_tables(tmp_path, "bin", _finals((0, 1, 2)), rewards=(METRIC, "shapes_geneval_strict"),
                                 binary=("shapes_geneval_strict",), noise=0.02)
    findings = _named(tables, "findings", "findings")
    data = findings.data
    t8 = data[data["claim"] == "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, final policy)"]
    graded = t8[t8["metric"] == METRIC].iloc[0]
    strict = t8[t8["metric"] == "shapes_geneval_strict"].iloc[0]
    assert graded["verdict"] == REPRODUCED
    assert strict["effect"] < 0.877  # a pass/fail ρ sits below the graded threshold whatever the ranking
    assert strict["verdict"] == "not judged (binary reward)" and "φ coefficient" in strict["detail"]
    assert graded["overall"] == REPRODUCED
    cell = findings.display.set_index("claim").loc[graded["claim"], "other rewards"]
    assert "`shapes_geneval_strict` φ" in cell


def test_single_checkpoint_fidelity_rows_are_marked_as_such(tmp_path):
    """Catches final-policy fidelity rows measured on one checkpoint reading like the pooled ones: their interval
    covers the prompts of one run seed, so the verdict is marked (eval prompts only)."""
    tables, _ = _fidelity_tables(tmp_path, "one", _finals((0,)), seeds=(0,))
    findings = _named(tables, "findings", "findings")
    data = findings.data
    t8 = data[(data["claim"] == "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, final policy)")
              & (data["metric"] == METRIC)].iloc[0]
    assert t8["prompts_only"] and t8["verdict"] == REPRODUCED
    verdict = findings.display.set_index("claim").loc[t8["claim"], "verdict"]
    assert verdict == "**reproduced** (eval prompts only)"
    t4 = data[data["claim"].str.startswith("Images of the FP4") & data["claim"].str.endswith("final policy")]
    assert t4["prompts_only"].all() and t4["covers"].str.contains("single checkpoint").all()


# ---- numbers printed once, one way ---------------------------------------------------------------------------------

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


def test_a_convergence_target_equal_to_the_base_score_is_no_target(tmp_path):
    """Catches the shapes_clip convergence target listed as a target (0.6752) where DiffusionNFT ended at its own
    base score: there is nothing to converge to."""
    tables = build_arms(tmp_path, "flat", [Arm("sol_rl", gain=_linear(0.02), seeds=(0, 1, 2)),
                                           Arm("diffusion_nft", gain=lambda step, seed: 0.0, seeds=(0, 1, 2))],
                        options=OPTS)
    table = _named(tables, "convergence", "convergence_tiny")
    assert f"{METRIC}: no target (DiffusionNFT's final score" in table.caption
    assert "did not improve" in table.caption


def test_a_zero_half_width_is_not_printed_as_plus_minus_zero():
    """Catches "0.688 ± 0.000" (two seeds that agree to three digits read as an exact measurement)."""
    from solbench.report.stats import fmt_ci

    assert "± 0.000" not in fmt_ci(CI(0.688, 0.688, 0.688, 2), 3)
    assert fmt_ci(CI(0.688, 0.688, 0.688, 2), 3) == "0.688 (no spread over 2 units)"
    assert fmt_ci(CI(0.5, 0.4, 0.6, 3), 3) == "0.500 ± 0.100"


def _hacking_tables(tmp_path, name, seeds):
    """Extra-object checks: seed 0 draws none, seed 1 one per image from step 2 on."""
    tables = build_arms(tmp_path, name, [Arm("sol_rl", gain=_linear(0.01), seeds=seeds, steps=(0, 2, 4))],
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
    table = _named(tables, "reward_hacking", "reward_hacking_tiny")
    assert (table.data["extra_lo"].dropna() >= 0).all() and (table.data["with_extra_lo"].dropna() >= 0).all()
    assert not table.display["extra objects / image"].str.contains(r"\[-|± ", regex=True).any()
    chart = _named(tables, "reward_hacking", "reward_hacking_tiny_chart")
    ax = chart.figure.axes[0]
    assert not ax.collections  # no band over 2 seeds
    bottom, top = ax.get_ylim()  # a count's axis starts at 0, less a margin that draws a line at 0 whole (issue 52)
    assert -0.05 * top <= bottom <= 0 and ax.get_title()
    legend = chart.figure.legends[0]
    assert legend._loc in (8,) or "lower" in str(legend.get_window_extent())  # below the axes, not beside them
    chart.figure.canvas.draw()
    assert legend.get_window_extent().width < 0.67 * chart.figure.bbox.width or legend._ncols >= 2


def test_a_full_precision_control_is_never_labelled_emulated_backend(tmp_path):
    """Catches the fidelity setup table naming recipe "none" (full precision) an emulated low-precision backend."""
    tables, _ = _fidelity_tables(tmp_path, "ctrl", [("fid-none", "none", None), ("fid-base", "nvfp4_tiny_flux", None)])
    setup = _named(tables, "ranking_fidelity", "ranking_fidelity_setup").display.set_index("explore recipe")
    assert setup.loc["none", "backend"] == "- (full precision)" and setup.loc["nvfp4_tiny_flux", "backend"] == "emulated"


# ---- plots ---------------------------------------------------------------------------------------------------------

def test_the_phase_chart_of_many_arms_stays_readable_and_select_is_not_explores_colour(tmp_path):
    """Catches timing_phases at 2774 x 462 px with 5 px text for 16 arms, and select drawn in a shade of explore's
    orange."""
    from matplotlib.colors import to_rgb

    from solbench.report.plotting import phase_colour

    arms = [Arm("sol_rl", {"n": n, "explore_steps": 6, "selection": "best_worst"}, seeds=(0,), steps=(0, 2),
                phases=[("explore", "explore", 1e9, 1.0), ("select", "full", None, 0.1)]) for n in range(4, 20)]
    tables = build_arms(tmp_path, "many", arms, options=OPTS)
    chart = _named(tables, "timing", "timing_phases_chart")
    width, height = chart.figure.get_size_inches() * chart.figure.dpi
    assert width <= 1400 and width / height < 3
    assert min(t.get_fontsize() for t in chart.figure.axes[0].get_yticklabels()) >= 8
    distance = np.linalg.norm(np.subtract(to_rgb(phase_colour("select", 0)), to_rgb(phase_colour("explore", 0))))
    assert distance > 0.5


def test_fidelity_by_iteration_has_plain_labels_and_recipes_side_by_side(tmp_path):
    """Catches Markdown backticks printed in fidelity_by_iteration's axis labels and two recipes' error bars drawn on
    top of each other at the same step."""
    spec = ([("fid-base-a", "nvfp4_tiny_flux", None), ("fid-base-b", "nvfp4_tiny", None)] + _finals((0, 1, 2))
            + _finals((0, 1, 2), "nvfp4_tiny"))
    spec = [(rid + ("-b" if recipe == "nvfp4_tiny" and "final" in rid else ""), recipe, ck) for rid, recipe, ck in spec]
    tables, _ = _fidelity_tables(tmp_path, "traj", spec)
    chart = _named(tables, "fidelity_by_iteration", "fidelity_by_iteration_chart")
    for ax in chart.figure.axes:
        assert "`" not in ax.get_ylabel() and "`" not in ax.get_xlabel()
    ax = chart.figure.axes[0]
    xs = [tuple(np.round(np.asarray(c.lines[0].get_xdata(), float), 6)) for c in ax.containers]  # each recipe's line
    assert len(xs) == 2 and not set(xs[0]) & set(xs[1])  # the two recipes never share an x position


def test_ranking_fidelity_draws_one_box_per_arm_on_a_fitted_axis_with_a_readable_legend(tmp_path):
    """Catches ranking_fidelity's eleven histogram outlines on a -1..1 axis with a 7 px legend."""
    tables, _ = _fidelity_tables(tmp_path, "box", [("fid-base", "nvfp4_tiny_flux", None)] + _finals((0, 1, 2)))
    chart = _named(tables, "ranking_fidelity", "ranking_fidelity_chart")
    ax = chart.figure.axes[1]
    assert len(ax.patches) == 4  # one box per arm
    assert ax.get_xlim()[0] > -1.0
    assert all(t.get_fontsize() >= 8 for leg in chart.figure.legends for t in leg.get_texts())


def test_ablation_value_labels_sit_beside_the_bars_and_the_y_label_names_the_step(tmp_path):
    """Catches value labels printed on the error bars and the y label "Δ final ..." for an ablation read at step 4."""
    tables = build_arms(tmp_path, "abl", [Arm("sol_rl", {"n": n}, _linear(0.01 * n / 8), seeds=(0, 1, 2))
                                          for n in (4, 8, 16)], noise=0.01, options=OPTS)
    chart = _named(tables, "ablations", "ablations_tiny_sol_rl_chart")
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


def test_table4_gives_the_precisions_part_alone_where_a_step_budget_control_measured_the_checkpoint(tmp_path):
    """Catches a Table 4 row that mixes the explore copy's fewer steps with its precision and never says how much is
    the precision: with a recipe-none run of the same checkpoint (the base model, whose run seed is missing on both
    sides), the row adds explore copy - full-precision network at the same explore steps, paired per candidate."""
    tables, cand = _fidelity_tables(tmp_path, "ctl", [("fid-none", "none", None), ("fid-base", "nvfp4_tiny_flux", None)])
    data = _named(tables, "findings", "findings").data
    row = data[data["claim"].str.endswith("base model") & (data["paper_table"] == "Table 4")
               & (data["metric"] == "shapes_clip")].iloc[0]
    e = cand[(cand.precision == "explore") & (cand.reward_name == "shapes_clip")]
    a = e[e.run_id == "fid-base"].set_index(["prompt_id", "cand_idx"]).reward
    b = e[e.run_id == "fid-none"].set_index(["prompt_id", "cand_idx"]).reward
    expected = float((a - b).mean() / b.mean())
    # issue 54: the precision alone is Table 4's own row (the step-budget comparison is "Table 4 (step budget)")
    assert row["effect"] == pytest.approx(expected, rel=1e-9) and "same noise" in row["detail"]


def test_a_measured_speedup_has_its_power_from_the_seeds_of_both_arms():
    """Table 5's primary (a ratio of two arms' seconds per iteration, independent seeds) had no mde and no
    seeds_needed: its row could not say what run would decide it. Catches an mde off the t interval's own scale (at
    the mde the interval's half width is t(0.975)/(t(0.975)+t(0.8)) of the distance), a seed count that does not
    reach the target or is not the smallest that does, and a power cell that fails without variance components."""
    from solbench.report.findings_common import Finding
    from solbench.report.findings_power import add_ratio_power, power_cell
    from solbench.report.stats import ratio_ci, ratio_power

    base, target = np.array([10.0, 11.0, 10.5]), np.array([8.0, 9.0, 8.2])
    mde, need = ratio_power(base, target, 0.05)
    vb, vt = base.var(ddof=1) / (3 * base.mean() ** 2), target.var(ddof=1) / (3 * target.mean() ** 2)
    df = (vb + vt) ** 2 / (vb ** 2 / 2 + vt ** 2 / 2)
    lo, hi = ratio_ci(base, target)
    half = (math.log(hi) - math.log(lo)) / 2
    assert math.log1p(mde) == pytest.approx(half * (1 + stats.t.ppf(0.8, df) / stats.t.ppf(0.975, df)))
    assert ratio_power(base, target, mde * 1.0001)[1] <= 3  # its own design detects its mde

    def log_mde(n):  # the design with n seeds per arm, the arms' coefficients of variation held
        vb, vt = base.var(ddof=1) / (n * base.mean() ** 2), target.var(ddof=1) / (n * target.mean() ** 2)
        df = (vb + vt) ** 2 / (vb ** 2 / (n - 1) + vt ** 2 / (n - 1))
        return (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * math.sqrt(vb + vt)

    assert log_mde(int(need)) <= math.log1p(0.05) < log_mde(int(need) - 1)  # the smallest count that reaches it
    assert math.isnan(ratio_power(base[:1], target, 0.05)[0])
    f = Finding("Sol-RL E2E speedup over naive BF16 scaling (measured)", "Table 5", "", unit="ratio", threshold=1.0)
    f.effect = float(base.mean() / target.mean())
    add_ratio_power(f, base, target)
    assert f.mde == pytest.approx(ratio_power(base, target, f.effect - 1)[0]) and f.seeds_needed >= 2
    assert power_cell(f).startswith(f"mde {1 + f.mde:.2f}x")
