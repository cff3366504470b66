"""Issue 48's dose-response: the harness's explore-gap measurement (solbench.train.explore_gap) and its report section.

- Both methods with an explore copy log the gap rows at the measured iterations (a measurement wired to one
  method only, or rows missing at iteration 1 / the last one, fails).
- The measurement never changes the training: the same run with and without it gives bit-identical training and
  evaluation rows, candidates, timing rows (phase, images, FLOPs) and weights (a measurement that consumed the
  iteration's generator or the global RNG, left gradients in .grad, or was timed into Table 5's phases fails).
- Oracle: an explore copy that quantizes nothing (an identity copy) gives sample distance exactly 0, gradient
  cosine 1 and norm ratio 1 (a measurement pairing the wrong seeds, twins drawn with other noise or other steps,
  or gradients drawn with different timesteps/noise for the two precisions fails).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import _tiny_config as tiny_config
from test_methods_solrl import identity_explore  # an explore copy that computes what its source computes
from solbench.train import explore_gap
from solbench.results import RunStore
from solbench.train.trainer import Trainer


def run(tmp_path, method: str, name: str, *, every: int, iterations: int = 2, explore=None) -> Trainer:
    cfg = tiny_config.small_config(method, experiment="gap", planned_iterations=iterations, seed=1)
    cfg.eval = dataclasses.replace(cfg.eval, explore_gap_every=every)
    trainer = Trainer(cfg, RunStore(tmp_path / name, cfg.run_id), explore=explore)
    trainer.run()
    return trainer


def gap_rows(trainer: Trainer) -> dict[tuple[int, str], float]:
    return {(r["step"], r["metric"]): r["value"] for r in trainer.store.read("metrics") if r["split"] == explore_gap.SPLIT}


def training_record(trainer: Trainer):
    """Everything a run's training produced, its wall clock aside."""
    metrics = [(r["step"], r["split"], r["metric"], r["value"], r["images_seen"], r.get("prompt_id"), r.get("eval_seed"))
               for r in trainer.store.read("metrics") if r["split"] != explore_gap.SPLIT]
    candidates = [tuple(sorted((k, v) for k, v in r.items() if k != "run_id")) for r in trainer.store.read("candidates")]
    timings = [(r["step"], r["phase"], r["precision"], r["n_images"], r["flops"]) for r in trainer.store.read("timings")]
    return metrics, candidates, timings


@pytest.mark.parametrize("method", ["naive_fp4", "sol_rl"])
def test_gap_is_logged_and_changes_no_training_number(tmp_path, method):
    measured = run(tmp_path, method, "measured", every=1)
    plain = run(tmp_path, method, "plain", every=0)
    rows = gap_rows(measured)
    assert {step for step, _ in rows} == {1, 2}
    for step in (1, 2):
        assert {m for s, m in rows if s == step} == set(explore_gap.METRICS)
        assert rows[(step, "n_samples")] == 2.0  # K = 2 of N = 4 on one prompt (tiny_config)
        assert 0 < rows[(step, "x0_rel_dist")] < 1  # NVFP4 moves a sample, less than another seed does
        assert 0 < rows[(step, "x0_rms")]
        assert 0.5 < rows[(step, "grad_cos")] < 1
        assert 0 < rows[(step, "grad_norm_ratio")] and math.isfinite(rows[(step, "grad_rel_dist")])
    assert gap_rows(plain) == {}
    assert training_record(measured) == training_record(plain)
    for role in ("policy", "old", "ema"):
        for a, b in zip(measured.nets.trainable(role), plain.nets.trainable(role), strict=True):
            assert torch.equal(a, b), role


@pytest.mark.parametrize("method", ["naive_fp4", "sol_rl"])
def test_full_precision_explore_copy_has_no_gap(tmp_path, method):
    trainer = run(tmp_path, method, "identity", every=1, iterations=1, explore=identity_explore())
    rows = gap_rows(trainer)
    assert rows[(1, "x0_rel_dist")] == 0.0 and rows[(1, "x0_rms")] == 0.0
    assert rows[(1, "grad_cos")] == pytest.approx(1.0, abs=1e-12)
    assert rows[(1, "grad_norm_ratio")] == 1.0 and rows[(1, "grad_rel_dist")] == 0.0


def test_schedule_and_distances_by_hand():
    """due(): iteration 1, every E and the last; the distances on numbers worked by hand (a spread taken over the
    wrong axis or a cosine of unnormalised vectors fails)."""
    assert [s for s in range(1, 11) if explore_gap.due(s, 4, 10)] == [1, 4, 8, 10]
    assert not any(explore_gap.due(s, 0, 10) for s in range(1, 11))
    full = torch.tensor([[0.0, 0.0], [2.0, 2.0]])  # variance 1 on each coordinate: spread 1
    low = full + torch.tensor([[0.5, 0.5], [0.0, 0.0]])  # RMS 0.5 and 0
    assert explore_gap.sample_distance(low, full) == {"x0_rel_dist": 0.25, "x0_rms": 0.25}
    d = explore_gap.gradient_distance(torch.tensor([3.0, 4.0]), torch.tensor([4.0, 3.0]))
    assert d["grad_cos"] == pytest.approx(24 / 25) and d["grad_norm_ratio"] == 1.0
    assert d["grad_rel_dist"] == pytest.approx(math.sqrt(2) / 5)


def test_dose_spec_crosses_four_recipes_with_both_methods_and_three_seeds():
    """experiments/tiny_dose.yaml: every recipe of the ladder has naive FP4 and Sol-RL on 3 seeds with the gap
    measured, and the zero dose (naive BF16 scaling) its 3 seeds (a dropped recipe, a seed short or the measurement
    left off fails)."""
    from pathlib import Path

    from solbench.quant import get_recipe
    from solbench.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "experiments" / "tiny_dose.yaml")
    arms: dict[tuple[str, str], set[int]] = {}
    for run in spec.runs:
        cfg = run.config
        arms.setdefault((cfg.method, cfg.quant.recipe), set()).add(cfg.seed)
        assert cfg.iterations == 16 and cfg.finetune.lr == 1e-3
        if cfg.method != "naive_scaling":
            assert cfg.eval.explore_gap_every == 4
    ladder = ("nvfp4_tiny", "nvfp4_tiny_flux", "mxfp4_tiny_flux", "mxfp4_w4a4")
    assert arms == {**{(m, r): {0, 1, 2} for m in ("naive_fp4", "sol_rl") for r in ladder},
                    ("naive_scaling", "nvfp4_tiny_flux"): {0, 1, 2}}
    mx = get_recipe("mxfp4_tiny_flux")
    assert (mx.format, mx.weight_block, mx.skip) == ("mxfp4", (1, 32), get_recipe("nvfp4_tiny_flux").skip)


def test_report_section_renders_the_gap_and_the_dose_response(tmp_path):
    """solbench/report/dose.py on synthetic results (tests/fixtures/synthetic_results.py build_dose, closed forms):
    the gap against iteration per arm, each recipe's dose, naive FP4 minus Sol-RL per recipe with the verdict the
    closed form implies, the zero dose beside it, and Findings rows naming the recipe (a dose read from the wrong
    method or metric, a difference taken the wrong way round, recipes pooled into one arm, or a verdict that ignores
    the interval fails)."""
    from fixtures.synthetic_results import DOSE_GAP_STEPS, DOSE_RECIPES, SEEDS, build_dose, dose_final_gain
    from solbench.report import ReportOptions, Tables, get_kind
    from solbench.report.dose import dose_findings

    tables = Tables.load(build_dose(tmp_path), ReportOptions(n_boot=200))
    outputs = {getattr(o, "name", o.title): o for o in get_kind("dose_response")(tables)}
    assert set(outputs) == {"explore_gap_tiny", "explore_gap_tiny_chart", "dose_response_tiny", "dose_response_tiny_chart"}
    gap = outputs["explore_gap_tiny"].data
    assert len(gap) == 2 * len(DOSE_RECIPES) * len(DOSE_GAP_STEPS) * 6  # methods x recipes x steps x metrics
    first = gap[(gap["method"] == "naive_fp4") & (gap["recipe"] == "mxfp4_w4a4") & (gap["metric"] == "x0_rel_dist")
               & (gap["step"] == 1)].iloc[0]
    assert first["mean"] == pytest.approx(0.5 * (1 + 0.05 * sum(SEEDS) / len(SEEDS))) and first["n_seeds"] == 3
    dose = outputs["dose_response_tiny"].data
    train = dose[dose["metric"] == "shapes_geneval"].set_index("recipe")
    assert list(train.index) == sorted(DOSE_RECIPES, key=DOSE_RECIPES.get)  # by growing dose
    for recipe, d in DOSE_RECIPES.items():
        row = train.loc[recipe]
        assert row["dose"] == pytest.approx(d * 1.05)
        expected = dose_final_gain("naive_fp4", d) - dose_final_gain("sol_rl", d)
        assert row["effect"] == pytest.approx(expected, abs=0.003) and row["lo"] < row["effect"] < row["hi"]
        assert row["vs_bf16"] == pytest.approx(dose_final_gain("naive_fp4", d) - dose_final_gain("naive_scaling", d),
                                               abs=0.003)
    assert list(train["verdict"]) == ["contradicted", "inconclusive", "reproduced", "reproduced"]
    found = dose_findings(tables, "tiny")
    assert len(found) == 2 * len(DOSE_RECIPES)  # every recipe on both eval rewards
    for f in found:
        recipe = next(r for r in DOSE_RECIPES if f.claim.endswith(f" {r}"))
        assert getattr(f, "recipe", recipe).startswith(recipe)
    # and they are Findings rows (findings.csv), with the recipe in its column: catches dose_findings left uncalled
    from solbench.report.findings import collect_findings

    listed = [f for f in collect_findings(tables) if f.claim in {g.claim for g in found}]
    assert len(listed) == len(found) and {f.recipe.split(" ")[0] for f in listed} == set(DOSE_RECIPES)
    chart = outputs["dose_response_tiny_chart"]
    chart.figure.savefig(tmp_path / "dose.png")
    outputs["explore_gap_tiny_chart"].figure.savefig(tmp_path / "gap.png")
    assert (tmp_path / "dose.png").stat().st_size > 10_000


def test_tiny_papers_layout_reads_the_long_arms_at_the_dose_horizon_and_keeps_them_main(tmp_path):
    """tiny_paper's layout (build_dose(long_recipe=...)): the runs' own recipe has long naive FP4, Sol-RL and naive
    BF16 arms (checkpoint every 16, run on past the dose arms' last evaluation to where the reward collapses) beside
    Sol-RL ablation arms. Catches: the long recipe's dose row read at the long arms' own end (its verdict turns:
    there naive FP4 ends far above Sol-RL), the dose averaged over gap rows past the compared iteration, and the main
    arm of Sol-RL or naive FP4 (Table 1's, the learning curves') taken from another explore copy: naive FP4's three
    copies tie in seeds and runs, the long arm's horizon is not the most common one, and its backend (cpu_bf16) is
    not the most common among all runs (the methods without an explore copy record emulated)."""
    from fixtures.synthetic_results import DOSE_RECIPES, DOSE_STEPS, build_dose, dose_final_gain
    from solbench.report import ReportOptions, Tables, get_kind
    from solbench.report.findings_common import main_arm

    tables = Tables.load(build_dose(tmp_path, long_recipe="nvfp4_tiny_flux"), ReportOptions(n_boot=200))
    runs = tables.done_runs
    sol = main_arm(tables, runs, "sol_rl")
    chosen = runs[runs["arm"] == sol].iloc[0]
    assert (chosen["p_quant.recipe"], chosen["p_iterations"], chosen["p_method_config.explore_steps"]) == (
        "nvfp4_tiny_flux", 16, 6)
    fp4 = runs[runs["arm"] == main_arm(tables, runs, "naive_fp4")].iloc[0]
    assert (fp4["p_quant.recipe"], fp4["p_iterations"]) == ("nvfp4_tiny_flux", 16)
    outputs = {getattr(o, "name", o.title): o for o in get_kind("dose_response")(tables)}
    dose = outputs["dose_response_tiny"].data
    train = dose[dose["metric"] == "shapes_geneval"].set_index("recipe")
    assert set(train["iteration"]) == {DOSE_STEPS[-1]}
    row = train.loc["nvfp4_tiny_flux"]
    assert row["dose"] == pytest.approx(DOSE_RECIPES["nvfp4_tiny_flux"] * 1.05)
    expected = dose_final_gain("naive_fp4", 0.10) - dose_final_gain("sol_rl", 0.10)
    assert row["effect"] == pytest.approx(expected, abs=0.003) and row["verdict"] == "inconclusive"
    assert row["vs_bf16"] == pytest.approx(dose_final_gain("naive_fp4", 0.10) - dose_final_gain("naive_scaling", 0.10),
                                           abs=0.003)
    assert "Sol-RL (explore_steps=2" not in row["sol_arm"]


def test_report_section_explains_results_without_gap_rows(tmp_path):
    """Results of runs that never measured the gap get a note, not an empty or failing section."""
    from fixtures.synthetic_results import build_main
    from solbench.report import Note, ReportOptions, Tables, get_kind

    outputs = get_kind("dose_response")(Tables.load(build_main(tmp_path, images=False), ReportOptions(n_boot=200)))
    assert len(outputs) == 1 and isinstance(outputs[0], Note) and "explore_gap" in outputs[0].text


def test_the_gap_setting_keeps_run_ids_unless_set():
    """eval.explore_gap_every 0 (the default) hashes as before the setting existed, so earlier results keep their ids;
    any other value is a new run (a default that changed every id, or a setting left out of the hash, fails)."""
    from solbench.config import RunConfig

    cfg = RunConfig()
    assert "explore_gap_every" not in cfg.canonical_json()
    measured = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, explore_gap_every=4))
    assert measured.run_id != cfg.run_id


def test_naive_fp4_is_compared_with_sol_rl_on_the_same_explore_copy():
    """In a spec that varies quant.recipe (tiny_dose) the "Naive FP4 ends below Sol-RL" claims take the naive FP4
    arm of Sol-RL's recipe. Catches the toy run's comparison of naive FP4 on mxfp4_w4a4 with Sol-RL on nvfp4_tiny."""
    import pandas as pd

    from solbench.report.findings_quality import _same_recipe_arm

    runs = pd.DataFrame([
        {"arm": f"{m} {r}", "method": m, "p_quant.recipe": r, "seed": s}
        for m in ("naive_fp4", "sol_rl") for r in ("mxfp4_w4a4", "nvfp4_tiny") for s in (0, 1, 2)])
    assert _same_recipe_arm(runs, "naive_fp4 mxfp4_w4a4", "sol_rl nvfp4_tiny") == "naive_fp4 nvfp4_tiny"
    assert _same_recipe_arm(runs, "naive_fp4 nvfp4_tiny", "sol_rl nvfp4_tiny") == "naive_fp4 nvfp4_tiny"
    lone = runs[runs["p_quant.recipe"] == "mxfp4_w4a4"]  # no naive FP4 arm on Sol-RL's recipe: left as it was
    assert _same_recipe_arm(lone, "naive_fp4 mxfp4_w4a4", "sol_rl nvfp4_tiny") == "naive_fp4 mxfp4_w4a4"
