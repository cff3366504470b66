"""experiments/tiny_paper.yaml's design (issues 42, 48, 54): three run seeds per primary claim, final numbers on
held-out prompts, the dose-response arms, Table 8's size, and a fidelity block that plans the final and halfway
checkpoints of every seed of the main (long) arm and refuses a step the runs do not keep.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_paper_keeps_three_seeds_per_primary_claim_and_final_numbers_held_out():
    """Catches: a spec edit that drops a primary claim's arm below 3 run seeds, moves the final numbers to the
    tuning split, pins another model, or shrinks Table 8 below the size that gives an interval under 0.1."""
    from solbench.spec import load_spec

    spec = load_spec(ROOT / "experiments" / "tiny_paper.yaml")
    cfgs = [r.config for r in spec.runs]
    assert {c.eval.prompts for c in cfgs} == {"shapes/heldout"} and {c.model.path for c in cfgs} == {None}
    # the dose-response (issue 48): naive FP4 and Sol-RL on two explore copies, 3 seeds each (issue 54 dropped the
    # middle dose: the twin is Sol-RL's zero dose); all else on FLUX's
    dose = {"nvfp4_tiny_flux", "mxfp4_w4a4"}
    assert {c.quant.recipe for c in cfgs} == dose | {"none"}  # none: Sol-RL's full-precision-preview twin
    assert {c.method for c in cfgs if c.quant.recipe == "none"} == {"sol_rl"}
    assert {c.quant.recipe for c in cfgs if c.method not in ("sol_rl", "naive_fp4")} == {"nvfp4_tiny_flux"}
    for method in ("sol_rl", "naive_fp4"):
        for recipe in dose:
            assert len({c.seed for c in cfgs if c.method == method and c.quant.recipe == recipe
                        and c.method_config.get("explore_steps", 6) == 6 and c.method_config.get("k") == 4
                        and c.method_config.get("n") == 16}) == 3, (method, recipe)
            assert all(c.eval.explore_gap_every for c in cfgs if c.method == method and c.quant.recipe != "none"), method

    def seeds(method, iterations, **settings):
        return {c.seed for c in cfgs if c.method == method and c.iterations == iterations
                and all(c.method_config.get(k) == v for k, v in settings.items())}

    for method in ("sol_rl", "naive_scaling", "naive_fp4"):
        assert len(seeds(method, 32)) == 3
    for method in ("diffusion_nft", "flow_grpo", "dance_grpo", "awm"):
        assert len(seeds(method, 16)) == 3
    for primary in ({"explore_steps": 2}, {"n": 4}, {"selection": "random"}):
        assert len(seeds("sol_rl", 16, **primary)) == 3, primary
    assert spec.fidelity.prompts == "shapes/heldout" and spec.fidelity.n_prompts == 33 and spec.fidelity.seeds == 16


def test_tiny_papers_fidelity_block_plans_final_and_halfway_checkpoints_of_three_seeds(tmp_path):
    """Catches: a fidelity block that could measure only one seed's final checkpoint per method (no fidelity
    against iteration), a step the run deletes before the block runs (a run keeps its last two), and Sol-RL's final
    policy taken from the dose-response's arms (issue 48: Sol-RL on MXFP4 copies, as many seeds as the main arm and
    the most common horizon) instead of the long arm on the spec's own copy."""
    from solbench.errors import ConfigError
    from solbench.fidelity.experiment import _block_settings
    from solbench.spec.fidelity_plan import planned_count
    from solbench.results import RunStore
    from solbench.spec import load_spec

    spec = load_spec(ROOT / "experiments" / "tiny_paper.yaml")
    for run in spec.runs:
        store = RunStore(spec.run_dir(tmp_path, run.run_id), run.run_id)
        store.run_dir.mkdir(parents=True)
        store.write_status("done")
        for step in (run.config.iterations // 2, run.config.iterations):
            (store.checkpoint_dir).mkdir(exist_ok=True)
            (store.checkpoint_dir / f"step_{step:08d}.pt").write_bytes(b"")
    settings = _block_settings(spec, spec.fidelity, tmp_path, lambda *a: None)
    assert len(settings) == 12 == planned_count(spec.runs, spec.fidelity)
    base = [s for s in settings if s.checkpoint is None]
    assert sorted(s.recipe for s in base) == ["none", "nvfp4_tiny", "nvfp4_tiny_flux"]
    # the read-out policy (step 16, issue 54) of each seed at both the copy and the full-precision control, so that
    # Table 4 compares precision alone there, crossed over seeds
    halfway = [s for s in settings if s.checkpoint and s.checkpoint.endswith("step_00000016.pt")]
    assert len(halfway) == 6 and sorted(s.recipe for s in halfway) == ["none"] * 3 + ["nvfp4_tiny_flux"] * 3
    assert len({s.checkpoint for s in halfway}) == 3
    seeds = {Path(s.checkpoint).name for s in settings if s.checkpoint and not s.checkpoint.endswith(".pt")}
    main = [r for r in spec.runs if r.config.method == "sol_rl" and r.config.iterations == 32]
    assert seeds == {r.run_id for r in main}  # every seed's final policy, of the main (long) arm
    bad = (ROOT / "experiments" / "tiny_paper.yaml").read_text().replace("steps: [16]", "steps: [8]")
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(ConfigError, match=r"keeps the checkpoints of steps \[16, 32\]"):
        load_spec(tmp_path / "bad.yaml")
