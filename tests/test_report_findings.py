"""Paired comparisons, the Findings verdicts, the PROJECTED GPU clock and the decomposed fidelity.

Synthetic results folders (what `solbench collect` writes) are built here so that every verdict can be
forced and every expected number is computed by hand from the same closed forms.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from solbench.report import ReportOptions, Tables, get_kind
from solbench.report.stats import (CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, REPRODUCED, hierarchical_bootstrap,
                                   verdict)

from fixtures.arm_results import EVAL_SEEDS, METRIC, PROMPTS, Arm, build_arms  # noqa: F401
from fixtures.arm_results import run_row as _run

OPTS = ReportOptions(n_boot=400)


def build(root, name, arms, *, seeds=(0, 1), steps=(0, 2, 4), noise=0.0, timings=None, per_sample=True):
    """``arms``: {(method, settings tuple): gain(step) -> float}. Each run evaluates PROMPTS x EVAL_SEEDS at
    ``steps``; score = 0.5 + prompt effect + gain(step) + seeded noise; eval rows are the means
    (fixtures/arm_results.py); ``timings``: {method: [(phase, precision, FLOPs)]}, 1 s each per iteration."""
    return build_arms(root, name, [
        Arm(method, dict(settings), (lambda g: lambda step, seed: g(step))(gain), seeds, steps,
            phases=[(phase, precision, flops, 1.0) for phase, precision, flops in (timings or {}).get(method, [])])
        for (method, settings), gain in arms.items()], noise=noise, per_sample=per_sample, options=OPTS)


def _table(tables, kind, name):
    found = [o for o in get_kind(kind)(tables) if getattr(o, "name", None) == name]
    assert found, f"{kind} has no output {name}"
    return found[0]


def _finding(tables, claim_start):
    """The row of the one claim starting with ``claim_start`` (its training-reward row: these results have one
    eval reward, so every claim has one row)."""
    data = _table(tables, "findings", "findings").data
    rows = data[data["claim"].str.startswith(claim_start)]
    assert rows["claim"].nunique() == 1 and len(rows) == 1, list(data["claim"])
    return rows.iloc[0]


# ---- the bootstrap against a hand computation ---------------------------------------------------------

def test_hierarchical_bootstrap_moments_match_the_two_level_formula():
    """Bug caught: resampling prompts only (ignoring run seeds) or seeds only. For a balanced design the
    bootstrap mean is the grand mean and its variance is (1/S) [var(seed means) + mean(within var) / P]
    (population variances), which is what the replicates must show."""
    groups = [np.array([0.10, 0.30, -0.05, 0.20]), np.array([0.50, 0.45, 0.70, 0.35]), np.array([0.0, -0.2, 0.1, 0.05])]
    point, lo, hi, reps = hierarchical_bootstrap(groups, n_boot=40000, seed=3)
    x = np.stack(groups)
    S, P = x.shape
    assert point == pytest.approx(x.mean())
    expected_var = (x.mean(axis=1).var() + x.var(axis=1).mean() / P) / S
    assert reps.mean() == pytest.approx(x.mean(), abs=0.004)
    assert reps.var() == pytest.approx(expected_var, rel=0.05)
    assert lo < point < hi
    assert hierarchical_bootstrap(groups, n_boot=500, seed=1)[1:3] == hierarchical_bootstrap(groups, n_boot=500, seed=1)[1:3]
    # one seed: only prompts resampled, variance = var(prompts) / P
    _, _, _, reps1 = hierarchical_bootstrap(groups[:1], n_boot=40000, seed=4)
    assert reps1.var() == pytest.approx(groups[0].var() / P, rel=0.05)
    # a single value has no interval (never a zero-width one)
    assert all(math.isnan(v) for v in hierarchical_bootstrap([[0.2]])[1:3])


def test_paired_difference_matches_the_hand_computed_per_prompt_mean_and_is_paired(tmp_path):
    """Bug caught: comparing unpaired means (prompt-to-prompt spread would swamp the interval) or pairing rows
    by position instead of by (prompt, eval seed): the arms differ by exactly +0.05 on every sample."""
    tables = build(tmp_path, "paired", {("sol_rl", ()): lambda s: 0.05 * (s > 0), ("diffusion_nft", ()): lambda s: 0.0})
    # shuffle the stored rows: pairing must go by prompt and eval seed, not by row order
    m = tables.metrics.sample(frac=1.0, random_state=3).reset_index(drop=True)
    tables.metrics = m
    from solbench.report.paired import paired_difference

    p = paired_difference(tables, "tiny", METRIC, "Sol-RL", "DiffusionNFT")
    assert p.step == 4 and p.ci.n_seeds == 2 and p.ci.n_prompts == len(PROMPTS)
    assert p.ci.mean == pytest.approx(0.05)
    assert p.ci.hi - p.ci.lo < 1e-9 + 1e-12  # constant paired difference: no spread at all
    # two run seeds: the seed-to-seed variance is not estimated, and the interval says so
    assert p.ci.covers == "eval prompts only (6 prompts x 2 run seeds): seed-to-seed variance not estimated"
    assert p.ci.per_seed == pytest.approx((0.05, 0.05))


def test_table1_gets_a_delta_vs_reference_column_with_an_interval_even_with_one_seed(tmp_path):
    tables = build(tmp_path, "one_seed", {("sol_rl", ()): lambda s: 0.04 * (s > 0), ("diffusion_nft", ()): lambda s: 0.0},
                   seeds=(0,), noise=0.02)
    table = _table(tables, "main_results", "main_results_tiny")
    row = table.data[table.data["arm"] == "Sol-RL"].iloc[0]
    samples = tables.metrics[(tables.metrics.split == "eval_sample") & (tables.metrics.step == 4)]
    runs = dict(zip(tables.runs.method, tables.runs.run_id))
    a = samples[samples.run_id == runs["sol_rl"]].set_index(["prompt_id", "eval_seed"]).value
    b = samples[samples.run_id == runs["diffusion_nft"]].set_index(["prompt_id", "eval_seed"]).value
    assert row["vs_ref_mean"] == pytest.approx((a - b).groupby(level=0).mean().mean())
    assert row["vs_ref_lo"] < row["vs_ref_mean"] < row["vs_ref_hi"]  # an interval from one run seed
    assert "eval prompts only" in row["vs_ref_covers"]
    assert "Δ vs DiffusionNFT shapes_geneval" in table.display.columns
    assert "crossed design" in table.caption and "eval prompts only" in table.caption


# ---- the verdict rule ---------------------------------------------------------------------------------

def test_verdict_rule_on_intervals():
    assert verdict(0.01, 0.2, 0.0) == REPRODUCED
    assert verdict(-0.2, -0.01, 0.0) == CONTRADICTED
    assert verdict(-0.01, 0.2, 0.0) == INCONCLUSIVE
    assert verdict(0.0, 0.2, 0.0) == INCONCLUSIVE  # touching the threshold is not enough
    assert verdict(float("nan"), float("nan"), 0.0) == INCONCLUSIVE  # no interval
    assert verdict(-0.2, -0.01, 0.0, "less") == REPRODUCED
    assert verdict(0.01, 0.2, 0.0, "less") == CONTRADICTED


@pytest.mark.parametrize("gain, noise, expected", [(0.05, 0.01, REPRODUCED), (-0.05, 0.01, CONTRADICTED),
                                                   (0.0, 0.05, INCONCLUSIVE)])
def test_findings_force_each_verdict_for_sol_rl_vs_diffusion_nft(tmp_path, gain, noise, expected):
    """Bug caught: a verdict that ignores the interval (e.g. the sign of the point estimate alone)."""
    tables = build(tmp_path, "claims", {("sol_rl", ()): lambda s: gain * (s > 0), ("diffusion_nft", ()): lambda s: 0.0},
                   noise=noise)
    row = _finding(tables, "Sol-RL beats DiffusionNFT at equal iterations")
    assert row["verdict"] == expected, row.to_dict()
    if expected != INCONCLUSIVE:
        assert row["effect"] == pytest.approx(gain, abs=0.01)
    else:
        assert row["lo"] < 0 < row["hi"]
    # naive BF16 scaling, naive FP4, N and explore-step ablations are not in these results
    for claim in ("Sol-RL matches naive BF16", "Naive FP4 ends below Sol-RL (equal", "Reward grows with the candidate pool",
                  "More explore steps", "FP4 explore ranks seeds"):
        assert _finding(tables, claim)["verdict"] == NOT_MEASURED


def test_findings_peak_decline_ablations_and_noninferiority(tmp_path):
    steps = (0, 2, 4, 6, 8)
    arms = {
        ("sol_rl", (("n", 8), ("explore_steps", 6))): lambda s: 0.02 * s,
        ("sol_rl", (("n", 2), ("explore_steps", 6))): lambda s: 0.01 * s,
        ("sol_rl", (("n", 8), ("explore_steps", 2))): lambda s: 0.005 * s,
        ("naive_scaling", ()): lambda s: 0.021 * s,
        ("naive_fp4", ()): lambda s: 0.03 * min(s, 4) - 0.02 * max(s - 4, 0),  # peaks at step 4, then declines
    }
    tables = build(tmp_path, "ablate", arms, steps=steps, noise=0.002)
    assert _finding(tables, "Naive FP4 peaks and then declines")["verdict"] == REPRODUCED
    assert _finding(tables, "Naive FP4 peaks and then declines")["effect"] == pytest.approx(-0.08, abs=0.01)
    # both run to step 8: at equal iterations and at naive FP4's end are one comparison, counted once (issue 48)
    data = _table(tables, "findings", "findings").data
    assert not (data["claim"] == "Naive FP4 ends below Sol-RL (equal iterations)").any()
    end = _finding(tables, "Naive FP4 ends below Sol-RL (at naive FP4's end)")
    assert end["verdict"] == REPRODUCED and "same comparison" in end["detail"]
    n_row = _finding(tables, "Reward grows with the candidate pool")
    assert n_row["verdict"] == REPRODUCED and n_row["effect"] == pytest.approx(0.08, abs=0.01)  # (0.02 - 0.01) x 8
    steps_row = _finding(tables, "More explore steps")
    assert steps_row["verdict"] == REPRODUCED and steps_row["effect"] == pytest.approx(0.12, abs=0.01)
    # Sol-RL 0.16 vs naive 0.168 at step 8, relative gap ~ -1.2 % of naive's score: inside the 2 % margin
    gap = _finding(tables, "Sol-RL matches naive BF16")
    assert gap["verdict"] == REPRODUCED and -0.02 < gap["effect"] < 0
    # the ablation table pairs every setting with the default arm (n=8, explore_steps=6) the same way
    ablation = _table(tables, "ablations", "ablations_tiny_sol_rl").data.set_index(["candidates N", "explore steps"])
    assert ablation.loc[(2, 6), "vs_default_mean"] == pytest.approx(-0.08, abs=0.01)
    assert ablation.loc[(2, 6), "vs_default_hi"] < 0 and np.isnan(ablation.loc[(8, 6), "vs_default_mean"])
    strict = Tables.load(tables.results_dir, ReportOptions(n_boot=400, noninferiority_margin=0.001))
    assert _finding(strict, "Sol-RL matches naive BF16")["verdict"] == CONTRADICTED


def test_convergence_single_curve_crossing_is_inconclusive_not_a_result(tmp_path):
    """Bug caught: the convergence table printing a single-curve crossing as a speedup without an interval."""
    tables = build(tmp_path, "conv", {("sol_rl", ()): lambda s: 0.02 * s, ("diffusion_nft", ()): lambda s: 0.01 * s},
                   seeds=(0,))
    table = _table(tables, "convergence", "convergence_tiny")
    cell = table.display.set_index("method").loc["Sol-RL", METRIC]
    assert "inconclusive" in cell and "no interval" in cell
    row = _finding(tables, "Sol-RL reaches DiffusionNFT's final score faster (measured")
    assert row["verdict"] == NOT_MEASURED  # CPU runs: the measured clock cannot speak to FP4 hardware


# ---- the PROJECTED clock against hand-counted FLOPs ---------------------------------------------------

def test_projected_clock_matches_hand_counted_flops(tmp_path):
    """Bug caught: explore phases priced at the BF16 rate, or every explore FLOP at the NVFP4 rate (the report's
    old clock: nvfp4_tiny keeps attention, proj_out and the embedders in full precision), eval FLOPs counted,
    or a per-step instead of a cumulative clock. Sol-RL per iteration: explore 9e12 FLOPs of which the share
    Q = 0.4772 (golden: the FLOPs of the shipped tiny model's ff, proj_mlp and modulation Linears over its whole
    forward) runs in NVFP4, regenerate 2e12 and train 5e12 in BF16; reward uncounted. B200 at 40 %."""
    timings = {"sol_rl": [("explore", "explore", 9e12), ("regenerate", "full", 2e12), ("train", "full", 5e12),
                          ("reward", "full", None), ("eval", "full", 1e18)],
               "diffusion_nft": [("rollout", "full", 4e12), ("train", "full", 5e12)]}
    tables = build(tmp_path, "clock", {("sol_rl", ()): lambda s: 0.02 * s, ("diffusion_nft", ()): lambda s: 0.01 * s},
                   timings=timings)
    # nvfp4_tiny quantizes, per sample of the shipped model (64 image tokens, 10 text tokens, width 256): in each
    # of 2 double blocks the two modulation Linears 256->1536 (one row each) and the image and text MLPs
    # 256->1024->256; in each of 2 single blocks the modulation 256->768 and proj_mlp 256->1024 over all 74
    # tokens. Everything else (attention projections <= 256 wide, proj_out, embedders) stays full precision.
    # A forward: 473661440 FLOPs in its Linears and 4 blocks x 2 attention matmuls x 74^2 x 256 x 2 FLOPs
    double = 2 * 256 * 1536 * 2 + 2 * 2 * 64 * 256 * 1024 + 2 * 2 * 10 * 256 * 1024
    single = 2 * 256 * 768 + 2 * 74 * 256 * 1024
    q = 2 * (double + single) / (473661440 + 4 * 2 * 74 * 74 * 256 * 2)
    per_iter = 9e12 * (q / 9e15 + (1 - q) / 2.25e15) / 0.4 + (2e12 + 5e12) / (2.25e15 * 0.4)
    from solbench.models.shares import precision_split
    from solbench.report.curves import curve_table

    split = precision_split("tiny", "nvfp4_tiny")
    assert split.quantized_share == pytest.approx(q, rel=1e-9)

    curve = curve_table(tables, "eval", METRIC).set_index(["arm", "step"])
    assert curve.loc[("Sol-RL", 0), "projected_s"] == 0.0
    assert curve.loc[("Sol-RL", 2), "projected_s"] == pytest.approx(2 * per_iter)
    assert curve.loc[("Sol-RL", 4), "projected_s"] == pytest.approx(4 * per_iter)
    assert curve.loc[("DiffusionNFT", 4), "projected_s"] == pytest.approx(4 * 9e12 / (2.25e15 * 0.4))
    fig = _table(tables, "learning_curves", "learning_curves_tiny")
    labels = [ax.get_xlabel() for ax in fig.figure.axes]
    assert any(label.startswith("PROJECTED B200") for label in labels)
    assert "PROJECTION" in fig.caption and "left out: reward" in fig.caption  # names the uncounted phase
    projected = _table(tables, "convergence", "convergence_tiny_projected")
    assert "PROJECTION" in projected.title and "PROJECTION" in projected.caption
    r = projected.data.set_index("arm").loc["Sol-RL"]
    # Sol-RL reaches NFT's final (0.04 at step 4) at step 2: 2 iterations; NFT needs 4 of its own
    assert r["time_to_target_s"] == pytest.approx(2 * per_iter)
    assert r["speedup"] == pytest.approx(4 * 9e12 / (2.25e15 * 0.4) / (2 * per_iter))
    # the two seeds are noiseless copies: their bootstrap interval has zero width, which decides nothing
    row = _finding(tables, "Sol-RL reaches DiffusionNFT's final score faster (PROJECTED")
    assert row["lo"] == pytest.approx(row["hi"]) and row["verdict"] == INCONCLUSIVE


# ---- decomposed fidelity ------------------------------------------------------------------------------

def test_decomposed_fidelity_pairs_each_recipe_with_the_step_budget_control(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(5)
    runs, cand = [], []
    full = {p: rng.uniform(0, 1, 12) for p in range(5)}
    coverage = {"none": (0.0, 0, None), "nvfp4_tiny": (0.496, 16, 48), "nvfp4_tiny_flux": (0.99, 41, 48)}
    for recipe, noise in (("none", 0.05), ("nvfp4_tiny", 0.3), ("nvfp4_tiny_flux", 0.5)):
        rid = f"fid-{recipe}"
        row = _run("fid", "fidelity", 0, rid)
        share, quantized, linears = coverage[recipe]
        row.update({"p_kind": "fidelity", "p_quant.recipe": recipe, "p_seeds": 12, "p_prompts.set": "shapes/eval",
                    "p_prompts.n_prompts": 5, "p_sampling.explore_steps": 6, "p_sampling.steps": 10,
                    "p_sampling.sampler": "dpm2", "p_checkpoint.path": None, "p_quant.mac_share": share,
                    "p_quant.quantized_linears": quantized, "p_quant.linears": linears})
        runs.append(row)
        for p, f in full.items():
            proxy = f + noise * rng.standard_normal(12)
            for c in range(12):
                common = dict(run_id=rid, step=0, prompt_id=f"q{p}", cand_idx=c, noise_seed=c, selected=False,
                              reward_name=METRIC)
                cand += [dict(common, precision="explore", reward=float(proxy[c])),
                         dict(common, precision="full", reward=float(f[c]))]
    folder = tmp_path / "fid"
    folder.mkdir()
    from fixtures.collected_facts import with_facts

    # as collect writes them: each run's facts (its default explore recipe among them) beside its settings
    with_facts(pd.DataFrame(runs), pd.DataFrame()).to_parquet(folder / "runs.parquet", index=False)
    pd.DataFrame(cand).to_parquet(folder / "candidates.parquet", index=False)
    tables = Tables.load(folder, OPTS)
    table = _table(tables, "ranking_fidelity", "ranking_fidelity_decomposed")
    data = table.data.set_index("recipe")
    c = pd.DataFrame(cand)

    def rho(rid):
        out = {}
        for p, g in c[c.run_id == rid].groupby("prompt_id"):
            e = g[g.precision == "explore"].sort_values("cand_idx").reward.values
            f = g[g.precision == "full"].sort_values("cand_idx").reward.values
            out[p] = stats.spearmanr(e, f)[0]
        return pd.Series(out)

    diff = rho("fid-nvfp4_tiny") - rho("fid-none")
    assert data.loc["nvfp4_tiny", "spearman_rho_vs_steps_only"] == pytest.approx(diff.mean())
    assert data.loc["nvfp4_tiny", "spearman_rho_vs_steps_only_hi"] < 0  # the added noise costs rank fidelity
    assert data.loc["none", "label"] == "step budget only (full precision)"
    assert data.loc["nvfp4_tiny", "label"] == "NVFP4 (nvfp4_tiny)"
    # each recipe's row carries its own copy's coverage (a merge on the wrong key would swap or drop them)
    assert data["mac_share"].to_dict() == {"none": 0.0, "nvfp4_tiny": 0.496, "nvfp4_tiny_flux": 0.99}
    shown = table.display.set_index("explore")["low-precision share of linear MACs"]
    assert shown["NVFP4 (nvfp4_tiny)"] == "49.6 % (16 of 48 Linears)"
    assert shown["NVFP4 (nvfp4_tiny_flux)"] == "99.0 % (41 of 48 Linears)"
    assert shown["step budget only (full precision)"] == "0.0 %"  # no Linear count: the control has no copy
    # the Findings row uses the NVFP4 run only, never the full-precision control; with no training runs here the
    # model's default explore recipe (nvfp4_tiny_flux, FLUX's coverage) keeps the plain name
    row = _finding(tables, "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, base model)")
    assert row["effect"] == pytest.approx(rho("fid-nvfp4_tiny_flux").mean())
    assert row["threshold"] == pytest.approx(0.927 - 0.05)  # non-inferiority to the paper's figure
    assert row["verdict"] in (REPRODUCED, CONTRADICTED, INCONCLUSIVE)
    assert "chance 0.33" in row["detail"]  # hit@4 of 12 seeds: a random ranking's 4/12
    # the explore format, recipe, coverage and backend behind the number (issue 41, item 5)
    assert ("Explore copy: NVFP4 (nvfp4_tiny_flux), 99.0 % of the linear MACs in low precision (41 of 48 Linears), "
            "emulated backend") in row["detail"]
    # a second NVFP4 recipe gets its own claim, never pooled into the default recipe's
    sana = _finding(tables, "FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, base model, nvfp4_tiny)")
    assert sana["effect"] == pytest.approx(rho("fid-nvfp4_tiny").mean())
    assert "Explore copy: NVFP4 (nvfp4_tiny), 49.6 % of the linear MACs" in sana["detail"]


# ---- the main job ends with the all-seeds fidelity; per-sample eval rows from the trainer ---------------

def _spec_with_fidelity(tmp_path, fidelity: str):
    from pathlib import Path

    smoke = (Path(__file__).resolve().parents[1] / "experiments" / "smoke.yaml").read_text()
    path = tmp_path / "smoke_fid.yaml"
    path.write_text(smoke.replace("name: smoke", "name: smoke_fid") + fidelity)
    return path


def test_spec_fidelity_block_is_validated(tmp_path):
    from solbench.errors import ConfigError
    from solbench.spec import load_spec

    spec = load_spec(_spec_with_fidelity(tmp_path, "fidelity: {n_prompts: 2, seeds: 4, recipes: [nvfp4_tiny, none]}\n"))
    assert spec.fidelity.seeds == 4 and spec.fidelity.recipes == ["nvfp4_tiny", "none"]
    assert spec.fidelity.checkpoint == "sol_rl"
    with pytest.raises(ConfigError, match="n_promts"):
        load_spec(_spec_with_fidelity(tmp_path, "fidelity: {n_promts: 2}\n"))
    main = load_spec(Path_main("tiny_main.yaml"))
    seeds = pd.DataFrame([(r.config.method, r.config.seed) for r in main.runs], columns=["method", "seed"])
    assert (seeds.groupby("method")["seed"].nunique() >= 2).all() and main.fidelity is not None
    paper = load_spec(Path_main("tiny_paper.yaml"))
    seeds = pd.DataFrame([(r.config.method, r.config.seed) for r in paper.runs], columns=["method", "seed"])
    assert (seeds.groupby("method")["seed"].nunique() >= 3).all() and paper.fidelity is not None


def Path_main(name):
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "experiments" / name


@pytest.mark.slow
def test_run_ends_with_fidelity_and_the_report_pairs_per_sample_rows(tmp_path):
    """`solbench run` of a 2-iteration spec with a fidelity block: the trainer's eval_sample rows, the fidelity
    runs beside the training runs (kept out of training aggregates), the decomposed table and Findings rows."""
    from pathlib import Path

    weights = Path(__file__).resolve().parents[1] / "solbench" / "assets" / "tiny_t2i.safetensors"
    if not weights.exists():
        pytest.skip("the tiny model's weights are not built yet")
    from solbench.cli import main

    spec = _spec_with_fidelity(tmp_path, "fidelity: {n_prompts: 2, seeds: 4, steps: 3, explore_steps: 2, "
                                         "recipes: [nvfp4_tiny, none]}\n")
    rc = main(["run", str(spec), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
               "--quiet"])
    assert rc == 0
    folder = tmp_path / "results" / "smoke_fid"
    metrics = pd.read_parquet(folder / "metrics.parquet")
    samples = metrics[metrics.split == "eval_sample"]
    evals = metrics[metrics.split == "eval"]
    # smoke: 2 eval prompts x 1 seed per evaluation; the sample rows average to the stored eval means
    assert len(samples) == 2 * len(evals[evals.metric == "shapes_geneval"])
    means = samples.groupby(["run_id", "step", "metric"]).value.mean()
    stored = evals.set_index(["run_id", "step", "metric"]).value
    assert np.allclose(means.values, stored.loc[means.index].values)
    runs = pd.read_parquet(folder / "runs.parquet")
    assert sorted(runs.loc[runs.method == "fidelity", "p_quant.recipe"]) == ["none", "nvfp4_tiny"]
    report = tmp_path / "reports" / "smoke_fid"
    text = (report / "details.md").read_text()  # every section in full (the index links it)
    assert "## 1. Findings" in (report / "findings.md").read_text()  # the findings first, then the other sections
    assert re.search(r"^## \d+\. Main results", text, re.M)
    assert "Decomposed fidelity" in text
    main_results = pd.read_csv(report / "main_results_tiny.csv")
    assert not main_results["arm"].str.startswith("fidelity").any()
    findings = pd.read_csv(report / "findings.csv").set_index("claim")
    fid = findings.loc["FP4 explore ranks seeds almost as BF16 does (all-seeds Spearman ρ, final policy)"]
    assert fid["verdict"] != NOT_MEASURED
    t1 = findings.loc["Sol-RL beats DiffusionNFT at equal iterations"]
    assert "eval prompts only (2 prompts" in t1["covers"]


@pytest.mark.slow
def test_fidelity_cli_recipes_make_one_arm_per_format_beside_the_step_budget_control(tmp_path):
    from pathlib import Path

    weights = Path(__file__).resolve().parents[1] / "solbench" / "assets" / "tiny_t2i.safetensors"
    if not weights.exists():
        pytest.skip("the tiny model's weights are not built yet")
    from solbench.cli import main

    recipes = ["nvfp4_tiny", "none", "mxfp4_w4a4", "fp8_w8a8"]
    assert main(["fidelity", "--model", "tiny", "--device", "cpu", "--n-prompts", "2", "--seeds", "4", "--steps", "3",
                 "--explore-steps", "2", "--sampler", "euler", "--rewards", "shapes_geneval", "--name", "fidr",
                 "--recipes", ",".join(recipes), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports")]) == 0
    runs = pd.read_parquet(tmp_path / "results" / "fidr" / "runs.parquet")
    assert sorted(runs["p_quant.recipe"]) == sorted(recipes)
    table = pd.read_csv(tmp_path / "reports" / "fidr" / "ranking_fidelity_decomposed.csv").set_index("recipe")
    assert set(table.index) == set(recipes)
    assert set(table["label"]) == {"step budget only (full precision)", "NVFP4 (nvfp4_tiny)", "MXFP4 (mxfp4_w4a4)",
                                   "FP8 (fp8_w8a8)"}
    assert table.loc["none", "spearman_rho_vs_steps_only"] != table.loc["none", "spearman_rho_vs_steps_only"]  # NaN
    assert np.isfinite(table.loc[["nvfp4_tiny", "mxfp4_w4a4", "fp8_w8a8"], "spearman_rho_vs_steps_only"]).all()


def test_table8_plain_claim_goes_to_the_recipe_the_training_runs_explored_with():
    """Catches: a report whose Sol-RL runs explored with FLUX's rule quoting the SANA-rule copy's fidelity under
    the plain Table 8 claim (the claim a reader takes for the runs' own explore copy)."""
    from types import SimpleNamespace

    from solbench.report.findings_speed import _primary_recipe
    from solbench.results.stored_facts import FACTS_SCHEMA, SCHEMA_COLUMN

    # each model's default explore recipe as collect records it with every run (fact_default_explore_recipe); the
    # report reads it from there (issue 52: nothing computed from code at report time)
    default = {"tiny": "nvfp4_tiny_flux", "flux": "nvfp4_flux"}

    def row(model, recipe=None):
        return {"model": model, "p_quant.recipe": recipe, "fact_default_explore_recipe": default[model],
                SCHEMA_COLUMN: FACTS_SCHEMA}

    def tables(*training_recipes, model="tiny"):  # done_runs: the training runs; fidelity_runs apart, as Tables has
        return SimpleNamespace(done_runs=pd.DataFrame([row("tiny", r) for r in training_recipes],
                                                      columns=list(row("tiny"))),
                               fidelity_runs=pd.DataFrame([row(model, "nvfp4_tiny")]))

    both = ["nvfp4_tiny", "nvfp4_tiny_flux"]
    assert _primary_recipe(tables("nvfp4_tiny_flux", "nvfp4_tiny_flux", "nvfp4_tiny"), "tiny", both) == "nvfp4_tiny_flux"
    # the runs' recipe wins over the model's default (nvfp4_tiny_flux): a report of runs at SANA's coverage
    assert _primary_recipe(tables("nvfp4_tiny", "nvfp4_tiny", "nvfp4_tiny_flux"), "tiny", both) == "nvfp4_tiny"
    assert _primary_recipe(tables(), "tiny", both) == "nvfp4_tiny_flux"  # no training runs: the model's default
    # neither is FLUX's default: every claim names its recipe
    assert _primary_recipe(tables(model="flux"), "flux", both) is None
    assert _primary_recipe(tables(model="flux"), "flux", ["nvfp4_tiny_flux"]) == "nvfp4_tiny_flux"  # one: plain
