"""What isolates FP4 in the Findings (issue 54): Holm over the primaries, the read-out horizon and its reward-hacking
flag, Sol-RL against its full-precision-preview twin, Table 4 at precision alone with a crossed interval, the
"peaks and then declines" rule, and a twin run that trains end to end. Each test names the defect it would catch;
the expected numbers are hand computations or independent closed forms of synthetic results (fixtures/arm_results.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fixtures.arm_results import EVAL_SEEDS, METRIC, PROMPT_EFFECT, PROMPTS, Arm, build_arms, fidelity_run
from solbench.report import ReportOptions, Tables, get_kind
from solbench.report.stats import REPRODUCED, crossed_interval

HELD = "shapes_clip"


def _findings(tables) -> pd.DataFrame:
    found = [o for o in get_kind("findings")(tables) if getattr(o, "name", None) == "findings"]
    return found[0].data


def _with_held_out(tables: Tables, held) -> Tables:
    """The arms' results with a second (held-out) eval reward: score 0.6 + prompt effect + held(arm, step)."""
    folder = tables.results_dir
    metrics = pd.read_parquet(folder / "metrics.parquet")
    runs = pd.read_parquet(folder / "runs.parquet")
    runs["p_eval.rewards"] = json.dumps([METRIC, HELD])
    runs["p_rewards.shapes_geneval"] = 1.0
    arm_of = dict(zip(runs["run_id"], runs["method"] + runs["p_quant.recipe"].astype(str)))
    extra = []
    for (rid, step), _ in metrics[metrics["split"] == "eval"].groupby(["run_id", "step"]):
        values = []
        for p, effect in zip(PROMPTS, PROMPT_EFFECT):
            for e in EVAL_SEEDS:
                v = 0.6 + effect / 3 + held(arm_of[rid], int(step))
                values.append(v)
                extra.append(dict(run_id=rid, step=step, split="eval_sample", metric=HELD, value=v, images_seen=step,
                                  wall_s=float(step), prompt_id=p, eval_seed=e))
        extra.append(dict(run_id=rid, step=step, split="eval", metric=HELD, value=float(np.mean(values)),
                          images_seen=step, wall_s=float(step)))
    pd.concat([metrics, pd.DataFrame(extra)], ignore_index=True).to_parquet(folder / "metrics.parquet", index=False)
    runs.to_parquet(folder / "runs.parquet", index=False)
    return Tables.load(folder, tables.options)


# ---- Holm -------------------------------------------------------------------------------------------------------

def test_holm_adjusts_a_known_family_as_by_hand():
    """Catches a Bonferroni (or unadjusted, or non-monotone) correction: Holm's step-down adjusted p values of
    (0.01, 0.04, 0.03, 0.005), by hand: sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04
    raised to the running maximum 0.06; in the input order (0.03, 0.06, 0.06, 0.02)."""
    from solbench.report.findings_multiplicity import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1: 2 x 0.5, then max(1, 0.9)


def test_a_rows_p_value_is_its_own_intervals_t_test():
    """Catches a p value from another test than the row's interval: with one run seed the interval is a t interval
    over prompts, so the p is scipy's one-sample t test of the prompt means against the threshold; with 3 seeds the
    crossed interval's p is below 0.05 exactly when the interval excludes the threshold."""
    from solbench.report.findings_common import Finding
    from solbench.report.findings_multiplicity import p_value
    from solbench.report.stats import paired_ci

    rng = np.random.default_rng(3)
    x = rng.normal(0.02, 0.05, (1, 30))
    ci = paired_ci(x)
    f = Finding("c", "t", "p", effect=ci.mean, lo=ci.lo, hi=ci.hi, threshold=-0.01, components=ci.components).decide()
    assert p_value(f) == pytest.approx(stats.ttest_1samp(x[0], -0.01).pvalue, rel=1e-9)
    for shift in np.linspace(-0.05, 0.05, 11):
        m = rng.normal(shift, 0.05, (3, 20)) + rng.normal(0, 0.02, (3, 1))
        ci = paired_ci(m)
        f = Finding("c", "t", "p", effect=ci.mean, lo=ci.lo, hi=ci.hi, threshold=0.0, components=ci.components).decide()
        assert (p_value(f) < 0.05) == (ci.lo > 0 or ci.hi < 0)


def _twin_results(tmp_path, name="iso", *, held=lambda arm, step: 0.0, twin_gain=0.008, sol_gain=0.008,
                  backend="cpu_bf16"):
    phases = lambda explore_s: [("explore", "explore", 1e9, explore_s), ("regenerate", "full", 1e9, 0.5),  # noqa: E731
                                ("train", "full", 2e9, 1.0)]
    flux = {"p_quant.recipe": "nvfp4_tiny_flux"}  # every arm records the spec's explore copy, as a real spec's runs
    arms = [Arm("sol_rl", gain=lambda s, seed: sol_gain * s + 0.001 * seed, seeds=(0, 1, 2), steps=(0, 4, 8),
                iterations=8, extra={**flux, "p_quant.backend": backend},
                phases=phases(lambda seed: 0.5 + 0.01 * seed)),
            Arm("sol_rl", gain=lambda s, seed: twin_gain * s, seeds=(0, 1, 2), steps=(0, 4, 8), iterations=8,
                extra={"p_quant.recipe": "none"}, tag="twin", phases=phases(lambda seed: 1.0 + 0.02 * seed)),
            Arm("naive_scaling", gain=lambda s, seed: 0.004 * s, seeds=(0, 1, 2), steps=(0, 4, 8), iterations=8,
                extra=flux, phases=[("rollout", "full", 4e9, 2.0), ("train", "full", 2e9, 1.0)]),
            Arm("diffusion_nft", gain=lambda s, seed: 0.002 * s, seeds=(0, 1, 2), steps=(0, 4, 8), iterations=8,
                extra=flux, phases=[("rollout", "full", 1e9, 0.4), ("train", "full", 2e9, 1.0)])]
    tables = build_arms(tmp_path, name, arms, options=ReportOptions(n_boot=100, readout_iteration=4,
                                                                   readout_note="a pilot on seeds 3-5"))
    return _with_held_out(tables, held)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """(findings, the fp4_isolation kind's outputs) of ``_twin_results`` at its defaults, built once for the tests that only read them (the
    Holm family, the twin's rows, Table 1 at equal measured time); a test that writes rows into the folder (the
    speed block's) or changes the arms builds its own. One build instead of three: each test's reading, and so
    what it catches, is the same."""
    tables = _twin_results(tmp_path_factory.mktemp("twin"))
    return _findings(tables), get_kind("fp4_isolation")(tables)


def test_primaries_carry_holm_adjusted_verdicts_beside_the_raw_ones_and_the_rest_are_hypotheses(twin):
    """Catches a Holm pass that misses rows or changes the raw verdict: every primary with a p value has holm_p equal
    to Holm's adjustment of the family's p values (recomputed here from the rows' own p), its adjusted verdict by
    that p, the raw verdict untouched; every exploratory row is labelled a hypothesis."""
    from solbench.report.findings_multiplicity import holm

    data, _ = twin
    family = data[data["primary"] & data["p_value"].notna()]
    assert len(family) >= 3
    assert family["holm_p"].to_numpy() == pytest.approx(holm(family["p_value"].to_numpy()))
    for _, r in family.iterrows():
        expected = r["verdict"] if r["holm_p"] < 0.05 else "inconclusive"
        assert r["adjusted_verdict"] == expected
    explored = data[~data["primary"] & data["verdict"].isin(["reproduced", "contradicted", "inconclusive"])]
    assert len(explored) and explored["adjusted_verdict"].str.startswith("hypothesis (").all()
    assert (explored["adjusted_verdict"] == "hypothesis (" + explored["verdict"] + ")").any()


# ---- the twin -------------------------------------------------------------------------------------------------------

def test_the_twin_gives_integrity_speed_and_decomposition_rows(twin):
    """Catches a report without the full-precision-preview twin's rows, or one that reads them at the wrong arms or
    step: the integrity row is (Sol-RL - twin) / twin's score at the read-out iteration 4 (gains 0.008 x 4 + 0.001 x
    seed against 0.008 x 4: +0.001 mean over seeds), primary; the decomposition's steps add up (twin - naive + Sol-RL
    - twin = Sol-RL - naive, 0.016 + 0.001); the twin's speed row is twin / Sol-RL seconds per iteration (2.5 + 0.02
    seed over 2.0 + 0.01 seed, median after warm-up)."""
    data, isolation = twin
    integ = data[(data["claim"] == "Sol-RL matches its full-precision-preview twin (non-inferior)")
                 & (data["metric"] == METRIC)].iloc[0]
    assert integ["primary"] and "read-out iteration 4" in integ["detail"]
    twin_mean = 0.5 + 0.005 + 0.008 * 4
    assert integ["effect"] * twin_mean == pytest.approx(0.001, rel=1e-6)
    step = {c: data[(data["claim"] == c) & (data["metric"] == METRIC)].iloc[0]["effect"] for c in data["claim"]
            if c.startswith("Decomposition:")}
    parts = [v for c, v in step.items() if "all of it" not in c]
    whole = next(v for c, v in step.items() if "all of it" in c)
    assert sum(parts) == pytest.approx(whole) and whole == pytest.approx(0.004 * 4 + 0.001)
    speed = data[data["claim"] == "Sol-RL E2E speedup over its full-precision-preview twin (measured)"].iloc[0]
    assert speed["effect"] == pytest.approx(np.mean([2.5 + 0.02 * s for s in range(3)])
                                            / np.mean([2.0 + 0.01 * s for s in range(3)]))
    assert speed["primary"] and math.isfinite(speed["p_value"])
    table = [o for o in isolation if getattr(o, "name", "") == "decomposition"][0]
    assert len(table.data) == 3 and table.data["projected_ratio"].notna().all()


# ---- the read-out horizon -------------------------------------------------------------------------------------------

def test_readings_after_a_held_out_fall_are_flagged_and_the_arms_listed(tmp_path):
    """Catches a report that reads its claims past reward hacking without saying so: Sol-RL's held-out reward rises
    to step 4 then falls 20 % by step 8 while its training reward keeps rising, so its step-8 readings are flagged and
    its read-out (step 4) ones are not; naive BF16 scaling's held-out reward falls only 2 % (under the default 10 %):
    not flagged; the reward-hacking section names Sol-RL's arm, from step 8."""
    def held(arm, step):
        if arm == "sol_rlnvfp4_tiny_flux":
            return {0: 0.0, 4: 0.05, 8: 0.05 - 0.2 * 0.65}[step]
        return {0: 0.0, 4: 0.05, 8: 0.05 - 0.02 * 0.65}[step]

    tables = _twin_results(tmp_path, held=held)
    data = _findings(tables)
    readout = data[data["detail"].str.contains("read-out iteration 4") & data["claim"].str.startswith("Sol-RL matches")]
    assert len(readout) and not readout["readout_flag"].fillna("").str.len().any()
    from solbench.report.readout import flag_text, hacking_points

    points = hacking_points(tables)
    sol = [a for a in tables.done_runs["arm"].unique() if a.startswith("Sol-RL") and "none" not in a][0]
    assert list(points["arm"]) == [sol] and int(points["step"].iloc[0]) == 8
    assert points["drop"].iloc[0] == pytest.approx(0.2 * 0.65 / (0.6 + 0.05), rel=1e-6)
    assert flag_text(tables, "tiny", [sol], 8) and not flag_text(tables, "tiny", [sol], 4)
    section = [o for o in get_kind("reward_hacking")(tables) if getattr(o, "name", "") == "reward_hacking_readout"]
    assert section and list(section[0].data["arm"]) == [sol]
    from solbench.report.findings_common import Finding
    from solbench.report.findings_quality import paired_finding
    from solbench.report.paired import paired_difference

    naive = [a for a in tables.done_runs["arm"].unique() if a.startswith("naive")][0]
    for step, flagged in ((8, True), (4, False)):
        f = paired_finding(Finding("c", "t", "p", unit="abs", threshold=0.0, model="tiny"),
                           paired_difference(tables, "tiny", METRIC, sol, naive, step=step), "", tables=tables,
                           arms=(sol, naive))
        assert bool(f.readout_flag) == flagged and (not flagged or "past reward hacking" in f.readout_flag)


def test_a_read_out_iteration_needs_its_note_and_a_sane_drop():
    """Catches a horizon declared without saying how it was chosen (it could have been picked on the data)."""
    from solbench.errors import ConfigError

    with pytest.raises(ConfigError, match="readout_note"):
        ReportOptions.from_mapping({"readout_iteration": 16})
    with pytest.raises(ConfigError, match="hacking_drop"):
        ReportOptions.from_mapping({"hacking_drop": 5})
    assert ReportOptions.from_mapping({"readout_iteration": 16, "readout_note": "pilot"}).readout_iteration == 16


# ---- Table 4 at precision alone ------------------------------------------------------------------------------------

def test_table4_at_precision_alone_is_crossed_over_the_read_out_checkpoints_seeds(tmp_path):
    """Catches the paper's Table 4 read against full precision at more steps, or on one checkpoint with an interval
    over prompts only: at the read-out checkpoints of 3 run seeds, each candidate's explore-copy score is paired with
    the recipe-none control's (same noise, same steps); the row's interval is crossed_interval of the [seed, prompt]
    matrix of those differences over the control's mean, recomputed here, and it is the Table 4 primary."""
    rng = np.random.default_rng(11)
    runs, cand = [], []
    for seed in (0, 1, 2):
        ck = dict(method="sol_rl", step=4, run_id=f"sol_rl-it8-s{seed}")
        for recipe in ("nvfp4_tiny_flux", "none"):
            row, rows = fidelity_run("iso4", f"fid-{recipe}-{seed}", recipe, checkpoint=ck, rho_noise=lambda i: 0.05,
                                     rng=rng, rewards=(METRIC, HELD))
            for c in rows:  # the copy scores 1 % + 0.5 % x seed below the control on shapes_clip
                if recipe != "none" and c["precision"] == "explore" and c["reward_name"] == HELD:
                    c["reward"] *= 1 - 0.01 - 0.005 * seed
            runs.append(row)
            cand += rows
    arms = [Arm("sol_rl", gain=lambda s, seed: 0.01 * s, seeds=(0, 1, 2), steps=(0, 4, 8), iterations=8,
                extra={"p_quant.recipe": "nvfp4_tiny_flux"})]
    tables = build_arms(tmp_path, "iso4", arms, extra_runs=runs, candidates=cand,
                        options=ReportOptions(n_boot=100, readout_iteration=4, readout_note="pilot"))
    data = _findings(tables)
    row = data[data["claim"] == "Images of the FP4 explore copy score as well as full precision (non-inferior), "
                                "read-out policy"].iloc[0]
    assert row["metric"] == HELD and row["primary"] and row["paper_table"] == "Table 4"
    c = pd.DataFrame(cand)
    c = c[(c["precision"] == "explore") & (c["reward_name"] == HELD)]
    c["seed"] = c["run_id"].str[-1]
    wide = c.pivot_table(index=["seed", "prompt_id", "cand_idx"], columns=c["run_id"].str.contains("none"),
                         values="reward")
    diff = (wide[False] - wide[True]).groupby(level=["seed", "prompt_id"]).mean().unstack()
    mean, lo, hi, _ = crossed_interval(diff.to_numpy())
    scale = wide[True].mean()
    assert (row["effect"], row["lo"], row["hi"]) == pytest.approx((mean / scale, lo / scale, hi / scale), rel=1e-9)
    assert "checkpoints of 3 run seeds crossed with" in row["covers"]


# ---- the peak rule ---------------------------------------------------------------------------------------------------

def test_naive_fp4_has_no_peak_when_its_maximum_is_the_last_reading(tmp_path):
    """Catches the committed report's peak chosen among the interior points alone: a curve that rises to its last
    reading has no peak (nothing to test); one that peaks at step 4 and falls is compared there."""
    arms = [Arm("naive_fp4", gain=lambda s, seed: {0: 0, 4: 0.02, 6: 0.03, 8: 0.04}[s], seeds=(0, 1, 2),
                steps=(0, 4, 6, 8), tag="up"),
            Arm("sol_rl", gain=lambda s, seed: 0.0, seeds=(0, 1, 2), steps=(0, 4, 6, 8))]
    data = _findings(build_arms(tmp_path, "rise", arms))
    rise = data[data["claim"] == "Naive FP4 peaks and then declines"].iloc[0]
    assert rise["detail"].startswith("No peak") and rise["verdict"] == "inconclusive"
    arms[0] = Arm("naive_fp4", gain=lambda s, seed: {0: 0, 4: 0.05, 6: 0.03, 8: 0.02 + 0.001 * seed}[s],
                  seeds=(0, 1, 2), steps=(0, 4, 6, 8), tag="fall")
    data = _findings(build_arms(tmp_path, "fall", arms))
    fall = data[data["claim"] == "Naive FP4 peaks and then declines"].iloc[0]
    assert fall["effect"] == pytest.approx(0.02 + 0.001 - 0.05) and "step 4" in fall["detail"]


# ---- the twin trains -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_full_precision_preview_twin_trains_through_the_cli(tmp_path):
    """Catches a recipe `none` that the trainer cannot build an explore copy from (or whose copy quantizes layers):
    a one-iteration Sol-RL run with quant.recipe none finishes, records backend emulated (nothing computed in low
    precision) and scores its preview candidates at precision explore."""
    from solbench.cli import main

    spec = tmp_path / "twin.yaml"
    spec.write_text("""name: twin_cli
launch: local
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  train_prompts: shapes/train
  prompts_per_iter: 1
  iterations: 1
  checkpoint_every: 1
  finetune: {lora_rank: 2, lora_alpha: 4}
  sampling: {steps: 2, eval_steps: 2}
  eval: {every: 1, prompts: shapes/eval, n_prompts: 1, seeds_per_prompt: 1, rewards: [shapes_geneval], grid_prompts: 1}
  quant: {recipe: none, backend: auto, allow_emulated_fallback: true}
matrix:
  method: [sol_rl]
  seed: [0]
  n: [2]
  k: [2]
  explore_steps: [1]
""")
    assert main(["run", str(spec), "--results", str(tmp_path / "results"), "--no-report", "--quiet"]) == 0
    folder = tmp_path / "results" / "twin_cli"
    (run,) = [p for p in folder.iterdir() if (p / "explore.json").exists()]
    assert json.loads((run / "explore.json").read_text())["backend"] == "emulated"
    assert json.loads((run / "status.json").read_text())["state"] == "done"
    cand = pd.concat(pd.read_json(p, lines=True) for p in run.glob("candidates*.jsonl"))
    assert set(cand["precision"]) == {"explore", "full"}


def test_recipe_none_quantizes_nothing_and_tiny_papers_twin_is_sol_rls_default_arm():
    """Catches a twin recipe that quantizes a layer, or a twin arm whose N, K, explore steps or selection differ from
    Sol-RL's default arm (then the comparison is not the precision alone)."""
    from solbench.quant import get_recipe
    from solbench.quant.model import quantizes
    from solbench.spec import load_spec

    none = get_recipe("none")
    assert none.quantizes_nothing and not quantizes(none, "transformer_blocks.0.ff.net.0.proj",
                                                    type("L", (), {"in_features": 256, "out_features": 1024}))
    spec = load_spec(Path(__file__).resolve().parents[1] / "experiments" / "tiny_paper.yaml")
    twins = [r for r in spec.runs if r.config.quant.recipe == "none"]
    assert {r.config.seed for r in twins} == {0, 1, 2} and all(r.config.method == "sol_rl" for r in twins)
    sol = next(r for r in spec.runs if r.config.method == "sol_rl" and r.config.quant.recipe == "nvfp4_tiny_flux")
    for key in ("n", "k", "explore_steps", "selection"):
        assert all(t.config.method_config[key] == sol.config.method_config[key] for t in twins)


def test_the_twins_speed_row_reads_the_speed_block_where_it_ran(tmp_path):
    """Catches a twin speed row that ignores the spec's speed block (timed alone, arms alternating within a round) or
    pairs it across rounds: with a block whose twin takes 2.0 + 0.1 r s and Sol-RL 1.6 + 0.02 r s in round r, the row
    is the geometric mean over rounds of the per-round ratios, with the rounds' t interval of the log ratio."""
    tables = _twin_results(tmp_path, "blk")
    _write_block(tables)
    data = _findings(Tables.load(tables.results_dir, tables.options))
    row = data[data["claim"] == "Sol-RL E2E speedup over its full-precision-preview twin (measured)"].iloc[0]
    logs = np.log([(2.0 + 0.1 * r) / (1.6 + 0.02 * r) for r in range(4)])
    half = stats.t.ppf(0.975, 3) * logs.std(ddof=1) / 2
    assert (row["effect"], row["lo"], row["hi"]) == pytest.approx(
        (math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)), rel=1e-9)
    assert "speed block" in row["detail"] and "rounds of the speed block (4)" in row["covers"]
    assert row["verdict"] == "reproduced"  # judged (the interval clears 1x): the copy ran on the bf16 units (cpu_bf16)


def test_the_twins_speed_row_is_not_judged_when_the_copy_is_emulated(tmp_path):
    """Catches the rerun's row (2026-12-02, a Zen 3 without bf16 units): the speed block's twin / Sol-RL ratio on an
    emulated copy (fake quantization, slower than full precision) was judged "inconclusive" with "more run seeds"
    to decide it, as if FP4 could be timed there; it is shown, and not judged, as Table 5's measured rows are."""
    tables = _twin_results(tmp_path, "emu", backend="emulated")
    _write_block(tables)
    data = _findings(Tables.load(tables.results_dir, tables.options))
    row = data[data["claim"] == "Sol-RL E2E speedup over its full-precision-preview twin (measured)"].iloc[0]
    assert row["verdict"] == "not measured by this spec" and row["effect"] > 1 and "emulated" in row["detail"]


def _write_block(tables):
    """A speed block whose twin takes 2.0 + 0.1 r s and Sol-RL 1.6 + 0.02 r s in round r, arms alternating."""
    rows = []
    for r in range(4):
        for pos, (arm, recipe, seconds) in enumerate((("sol_rl", "nvfp4_tiny_flux", 1.6 + 0.02 * r),
                                                      ("sol_rl_fp_preview", "none", 2.0 + 0.1 * r))):
            for phase, share in (("explore", 0.5), ("train", 0.5)):
                rows.append(dict(key=arm, arm=arm, variant="eager", round=r, attempt=r, iteration=0, phase=phase,
                                 seconds=seconds * share, load=0.0, position=(pos + r) % 2, accepted=True,
                                 block_id="b", started_at="t", method="sol_rl", recipe=recipe, backend="emulated",
                                 device="cpu", threads=1, precision="full"))
    pd.DataFrame(rows).to_parquet(tables.results_dir / "speed.parquet", index=False)


def test_naive_fp4s_primary_is_read_at_the_declared_iteration_and_the_end_is_exploratory(tmp_path):
    """Catches a primary read where the report flags reward hacking (the committed report's naive FP4 at 32): with a
    read-out iteration of 4, the naive FP4 primary is naive FP4 - Sol-RL at 4 (gains 0.004 x 4 - 0.006 x 4 = -0.008),
    the at-the-end row (step 8) stays as an exploratory row, and the equal-iterations row, the same comparison as the
    read-out one, is counted once."""
    arms = [Arm("naive_fp4", gain=lambda s, seed: 0.004 * s + 0.001 * seed, seeds=(0, 1, 2), steps=(0, 4, 8),
                iterations=8),
            Arm("sol_rl", gain=lambda s, seed: 0.006 * s, seeds=(0, 1, 2), steps=(0, 4, 8), iterations=8)]
    data = _findings(build_arms(tmp_path, "ro", arms, options=ReportOptions(n_boot=100, readout_iteration=4,
                                                                           readout_note="a pilot on seeds 3-5")))
    readout = data[data["claim"] == "Naive FP4 ends below Sol-RL (at the read-out iteration)"].iloc[0]
    assert readout["primary"] and readout["effect"] == pytest.approx(-0.008 + 0.001)
    end = data[data["claim"] == "Naive FP4 ends below Sol-RL (at naive FP4's end)"].iloc[0]
    assert not end["primary"] and end["effect"] == pytest.approx(-0.016 + 0.001)
    assert "Naive FP4 ends below Sol-RL (equal iterations)" not in set(data["claim"])


def test_table1_at_equal_measured_time_beside_the_projection_and_its_fp4_rate(twin):
    """Catches a Table 1 that shows only the projection: the same pairs at the MEASURED clock (the fixture's wall
    clock is the step for every arm, so at the read-out iteration 4: Sol-RL 0.008 x 4 + 0.001 seed against
    DiffusionNFT 0.002 x 4, +0.025), and the projection with NVFP4 at 2x, 3x and 4x BF16, whose budget (the clock
    both reached) shrinks for Sol-RL's explore FLOPs as the rate grows, so its difference moves; the 4x column is the
    B200 profile's own projection."""
    data, isolation = twin
    measured = data[(data["claim"] == "Sol-RL beats DiffusionNFT at equal MEASURED time") & (data["metric"] == METRIC)]
    assert measured.iloc[0]["effect"] == pytest.approx(0.025)
    table = [o for o in isolation if getattr(o, "name", "") == "table1_equal_time"][0].data
    nft = table[table["primary_comparison"]].iloc[0]
    assert nft["measured_effect"] == pytest.approx(0.025)
    assert nft["4x_effect"] == pytest.approx(nft["projected_effect"])  # B200: NVFP4 9 PFLOP/s = 4 x BF16 2.25
    assert len({round(nft[f"{r}x_effect"], 9) for r in (2, 3, 4)}) == 3


def test_the_dose_response_is_judged_against_its_zero_dose_first(tmp_path):
    """Catches a dose row read as "FP4 training hurts" where naive FP4 is no worse than naive BF16 scaling on that
    copy (the committed report's mxfp4_w4a4 row: -0.022 against Sol-RL, -0.0003 against the zero dose): each dose row
    gets its zero-dose control, naive FP4 - naive BF16 scaling at the same iteration (closed form of build_dose:
    -0.4 x dose on shapes_geneval), and its adjusted verdict says whether that control holds."""
    from fixtures.synthetic_results import DOSE_RECIPES, build_dose

    data = _findings(Tables.load(build_dose(tmp_path), ReportOptions(n_boot=100)))
    for recipe, dose in DOSE_RECIPES.items():
        zero = data[(data["claim"] == f"Naive FP4 ends below naive BF16 scaling (the zero dose), explore copy {recipe}")
                    & (data["metric"] == METRIC)].iloc[0]
        assert zero["effect"] == pytest.approx(-0.4 * dose, abs=0.003) and not zero["primary"]
        row = data[(data["claim"] == f"Naive FP4 ends below Sol-RL, explore copy {recipe}")
                   & (data["metric"] == METRIC)].iloc[0]
        if zero["verdict"] == REPRODUCED:
            assert row["adjusted_verdict"] == f"hypothesis ({row['verdict']}; the zero-dose control is reproduced)"
        else:
            assert row["adjusted_verdict"].startswith("hypothesis (not judged: against the zero-dose control")
    assert (data.loc[data["claim"].str.contains("the zero dose"), "verdict"] == REPRODUCED).any()
