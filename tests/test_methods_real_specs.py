"""The real-model specs (experiments/{flux,sd35,sana}_main.yaml) against each method's reference config,
and their evaluation protocol: one per model, the same for every method.

These settings are reached only by the GPU runs, so nothing else would notice a drift: the effective
guidance of rollouts and losses (None resolves to the model's default: CFG 4.5 on SD3.5 and SANA,
distilled 3.5 on FLUX.1-dev), the optimizer steps each rollout batch gets, the rollout steps,
resolution, trained timesteps, LoRA targets and AWM's PickScore settings. Each expected value below is
the reference's (the spec headers name the config each comes from).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from solbench.models.sana import SanaAdapter
from solbench.models.sd3 import SD3Adapter
from solbench.provenance import optimizer_steps_per_iteration
from solbench.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = {"flux": "flux_main.yaml", "sd3": "sd35_main.yaml", "sana": "sana_main.yaml"}
# what guidance None would resolve to (FluxAdapter sets 3.5 for guidance-distilled FLUX.1-dev)
MODEL_DEFAULT_GUIDANCE = {"flux": 3.5, "sd3": SD3Adapter.default_guidance, "sana": SanaAdapter.default_guidance}
NFT_FAMILY = ("sol_rl", "naive_scaling", "naive_fp4", "diffusion_nft")

# (guidance, rollout steps, optimizer steps per iteration, resolution) per model and method
EXPECTED = {
    "flux": {**{m: (1.0, 10, 1, 512) for m in NFT_FAMILY},
             "flow_grpo": (3.5, 6, 2, 512), "dance_grpo": (3.5, 16, 3, 720), "awm": (1.0, 14, 1, 512)},
    "sd3": {**{m: (1.0, 10, 1, 1024) for m in NFT_FAMILY},
            "flow_grpo": (4.5, 10, 2, 512), "dance_grpo": (4.5, 16, 3, 1024), "awm": (1.0, 14, 1, 512)},
    "sana": {**{m: (1.0, 10, 1, 1024) for m in NFT_FAMILY},
             "flow_grpo": (4.5, 10, 2, 1024), "dance_grpo": (4.5, 16, 3, 1024), "awm": (1.0, 14, 1, 1024)},
}
# trained timesteps per sample: NFT int(T * fraction) of T points (Sana configs/sol_rl: flux1.py 0.4,
# base.py 0.6 for SD3 and SANA)
TRAINED = {"flux": {m: 4 for m in NFT_FAMILY}, "sd3": {m: 6 for m in NFT_FAMILY}, "sana": {m: 6 for m in NFT_FAMILY}}


def runs_by_method(model):
    spec = load_spec(ROOT / "experiments" / SPECS[model])
    by_method = {}
    for run in spec.runs:
        by_method.setdefault(run.config.method, []).append(run.config)
    return by_method


@pytest.mark.parametrize("model", sorted(SPECS))
def test_real_specs_follow_the_references(model):
    """Catches guidance None (CFG on SD3.5/SANA, distilled 3.5 on FLUX) where a reference trains
    without CFG, a micro-batch size that silently multiplies the optimizer steps, and drifted steps,
    resolution or trained timesteps."""
    by_method = runs_by_method(model)
    assert set(by_method) == set(EXPECTED[model])
    for method, configs in by_method.items():
        guidance, steps, opt_steps, resolution = EXPECTED[model][method]
        for cfg in configs:
            effective = MODEL_DEFAULT_GUIDANCE[model] if cfg.sampling.guidance is None else cfg.sampling.guidance
            assert effective == guidance, (method, cfg.sampling.guidance)
            assert cfg.sampling.steps == steps, method
            assert optimizer_steps_per_iteration(cfg) == opt_steps, method
            assert cfg.model.resolution == resolution, method
            if method in TRAINED[model]:
                mc = cfg.method_config
                assert int(cfg.sampling.steps * mc["timestep_fraction"]) == TRAINED[model][method], method


@pytest.mark.parametrize("model", sorted(SPECS))
def test_dance_grpo_takes_the_references_three_steps_per_rollout(model):
    """Catches (issue 23): DanceGRPO stepping once per 4 of the spec's 72 samples per rank (18 steps, up to
    17 updates stale) where the reference rolls out one prompt x 12 per rank and steps every 4: 3 steps,
    at most 2 stale (finetune_flux_grpo.sh --train_batch_size 1 --gradient_accumulation_steps 4)."""
    (cfg, *_) = runs_by_method(model)["dance_grpo"]
    assert optimizer_steps_per_iteration(cfg) == cfg.method_config["group_size"] // 4 == 3


def test_awm_uses_the_reference_pickscore_settings():
    """All Table 1 runs train on PickScore prompts: AWM's PickScore config has a deterministic
    SA-solver (noise_level 0) and kl_beta 1e-4 (its GenEval config: 0.4 and 1e-3)."""
    for model in SPECS:
        for cfg in runs_by_method(model)["awm"]:
            mc = cfg.method_config
            assert (mc["noise_level"], mc["kl_beta"], mc["train_timesteps"], mc["timestep_fraction"]) == (0.0, 1e-4, 6, 0.9)
            assert (mc["time_type"], mc["sampler"], cfg.prompts_per_iter, cfg.finetune.ema_decay) == (
                "discrete", "sa_solver", 24, 0.99)


# One evaluation protocol per model (issue 41), Sol-RL's eval_fn and configs (configs/sol_rl/{flux1,sd3,sana}.py):
# (guidance, resolution, steps, sampler, shift; None = the scheduler's own at that resolution), the same for every method
PROTOCOL = {"flux": (1.0, 512, 28, "dpm2", None), "sd3": (1.0, 1024, 40, "dpm2", None),
            "sana": (1.0, 1024, 40, "euler", 1.0)}


@pytest.mark.parametrize("model", sorted(SPECS))
def test_every_method_of_a_real_spec_is_evaluated_by_its_models_protocol(model):
    """Catches (issue 41) evaluation settings that follow each method's training: SD3.5 and SANA baselines
    evaluated at CFG 4.5 against Sol-RL's none, FLUX's FlowGRPO at distilled 3.5 against 1.0, SD3.5's FlowGRPO
    and AWM at their 512 px against 1024, DanceGRPO on FLUX at 720. What the trainer evaluates with is asked
    of the functions Trainer.evaluate calls, for every run of the spec, whatever it trains with."""
    from solbench.train.trainer import eval_resolution, eval_sampler

    by_method = runs_by_method(model)
    trained_at = {cfg.model.resolution for configs in by_method.values() for cfg in configs}
    trained_with = {cfg.sampling.guidance for configs in by_method.values() for cfg in configs}
    assert len(trained_at) > 1 or len(trained_with) > 1  # the methods do train differently ...
    for method, configs in by_method.items():
        for cfg in configs:  # ... and are evaluated alike
            sampler = eval_sampler(cfg)
            assert (sampler.guidance, eval_resolution(cfg), sampler.steps, sampler.kind, sampler.shift) == PROTOCOL[model], method
            assert (cfg.eval.prompts, cfg.eval.n_prompts, cfg.eval.seeds_per_prompt, cfg.seed, cfg.eval.every) == (
                "data/pickscore/test.txt", 256, 1, 0, 20), method
            assert cfg.eval.rewards == ["imagereward", "clipscore", "pickscore", "hpsv2"], method


@pytest.mark.parametrize("model,stated", [("sd3", "guidance 1; 1024 px; dpm2 sampler"),
                                           ("sana", "guidance 1; 1024 px; euler sampler; shift 1")])
def test_the_main_results_caption_states_the_protocol(model, stated):
    """The report's Table 1 says how every column was evaluated (issue 41), read from the runs' parameters as
    collect flattens them (p_<path> columns): one value per setting when the protocol holds."""
    import pandas as pd

    from solbench.report.main_results import _eval_setup
    from solbench.collect.collection import flatten

    runs = pd.DataFrame([{f"p_{k}": v for k, v in flatten(cfg.to_dict()).items()}
                         for configs in runs_by_method(model).values() for cfg in configs])
    setup = _eval_setup(None, runs)
    assert f"first 256 prompts; 1 seeds per prompt; 40 sampling steps; {stated}" in setup, setup


def test_real_specs_train_awm_with_the_reference_weighting_and_flow_grpo_through_both_cfg_branches():
    """AWM's PickScore config trains on the generalised Huber of d (weighting='ghuber', ghuber_power=0.25);
    flow_grpo's train_sd3.py at the tables' commit (74db691) takes the CFG gradient through both branches."""
    for model in SPECS:
        for cfg in runs_by_method(model)["awm"]:
            assert (cfg.method_config["weighting"], cfg.method_config["ghuber_power"]) == ("ghuber", 0.25)
        for cfg in runs_by_method(model)["flow_grpo"]:
            assert cfg.method_config["detach_uncond"] is False


def test_sd3_trains_the_text_stream_like_its_references():
    """FlowGRPO's, DiffusionNFT's (Sana nft_sd3.py) and AWM's SD3 LoRA includes the text stream."""
    for configs in runs_by_method("sd3").values():
        for cfg in configs:
            assert {"add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"} <= set(cfg.finetune.lora_targets)
