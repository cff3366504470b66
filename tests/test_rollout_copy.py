"""The merged full-precision rollout copy (solbench.engine.policy, model.rollout_copy) and how a run chooses it
(solbench.train.rollout_copy, the doctor's memory model).

The bound: the merged copy computes x (W + s B A)^T where the LoRA path computes x W^T + s (x A^T) B^T,
the same product summed in another order, so in float32 their velocities agree to a few float32 ulps of
the output's scale: within 1e-5 of max |v| here (measured: 3e-7 to 6e-7). In bfloat16 the merged weight is
rounded to bf16 once (the reference's inference copy too), 2^-9 relative per weight, on top of both paths'
bf16 arithmetic, so the bound is 2e-2 of max |v| (measured: 7e-3 to 8e-3). A copy left stale after an
update (the refresh not run) misses the update's LoRA delta and must exceed the bound tenfold (measured
after an update of 0.3 x N(0, 1) on the adapter: 1.4).
"""

from __future__ import annotations

import json

import pytest
import torch

from solbench.config import FinetuneConfig, ModelConfig, RunConfig
from solbench.errors import ConfigError
from solbench.models import build_adapter
from solbench.engine.policy import PolicyNets
from solbench.train.rollout_copy import choose_rollout_copy

BOUND = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # max |v_merged - v_lora| / max |v_lora|


def _nets(dtype):
    torch.manual_seed(0)
    adapter = build_adapter(ModelConfig(path="random"))
    adapter.transformer.to(dtype)
    nets = PolicyNets(adapter.transformer, FinetuneConfig(lora_rank=4, lora_alpha=8), {"old", "reference"},
                      explore_source="old", rollout_copy=True)
    x = torch.randn(4, *adapter.latent_shape)
    t = torch.tensor([0.2, 0.5, 0.7, 0.9])
    cond = adapter.encode(["a red circle", "two blue squares", "a green triangle", ""])
    return adapter, nets, x, t, cond


def _update(nets, scale):
    """An update of the rollout role's adapter (what Sol-RL's old-policy EMA does after a step): B from 0."""
    with torch.no_grad():
        for p in nets.trainable("old"):
            p.add_(torch.randn_like(p) * scale)


def _gap(adapter, nets, x, t, cond):
    with torch.no_grad():
        lora = adapter.velocity(nets["old"], x, t, cond).float()
        merged = adapter.velocity(nets.rollout_module("old"), x, t, cond).float()
    return float((merged - lora).abs().max() / lora.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_copy_velocity_equals_the_lora_role_within_the_bound_and_a_stale_one_does_not(dtype):
    """Catches a rollout copy that merges the wrong adapter (the policy's instead of the old policy's),
    forgets the LoRA scale, or is not refreshed after an update (then rollouts sample last iteration's
    old policy)."""
    adapter, nets, x, t, cond = _nets(dtype)
    assert nets.rollout_path == "merged" and nets.rollout_module("old") is nets.rollout_copy
    _update(nets, 0.3)
    nets.sync_explore_copy()  # the trainer's refresh after every update (phase "sync")
    fresh = _gap(adapter, nets, x, t, cond)
    assert fresh <= BOUND[dtype], fresh
    _update(nets, 0.3)  # a second update, this time without the refresh
    stale = _gap(adapter, nets, x, t, cond)
    assert stale > 10 * BOUND[dtype], stale
    nets.sync_explore_copy()
    assert _gap(adapter, nets, x, t, cond) <= BOUND[dtype]


def test_the_copy_holds_only_the_adapted_layers_and_other_roles_keep_their_path():
    """The copy's unadapted parameters are the policy's own tensors (memory: only the LoRA-targeted
    projections are new, 3.6 GB on FLUX instead of a third 24 GB transformer), its adapted weights are its
    own; other roles (the policy, the reference) never sample through it. Catches a full deep copy, or a
    copy that shares (and so overwrites) the policy's base weights when refreshed."""
    _, nets, *_ = _nets(torch.float32)
    policy = dict(nets.policy.named_parameters())
    own = [name for name, p in nets.rollout_copy.named_parameters()
           if not any(p is q for q in policy.values())]
    assert own and all(name.endswith(("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight"))
                       or name.endswith(("to_q.bias", "to_k.bias", "to_v.bias", "to_out.0.bias")) for name in own), own
    base = {n.replace(".base_layer", ""): p for n, p in policy.items() if ".base_layer." in n}
    for name, p in nets.rollout_copy.named_parameters():
        if name in base:
            assert p is not base[name] and p.data_ptr() != base[name].data_ptr()
    assert nets.rollout_module("policy") is nets["policy"] and nets.rollout_module("reference") is nets["reference"]


def test_engine_samples_deterministic_rollouts_through_the_copy_and_stochastic_ones_through_the_role():
    """Deterministic rollouts of the source role use the merged copy; a stochastic sampler's rollouts keep
    the LoRA role, whose per-step log-probs the loss recomputes through that role. Catches the engine
    ignoring the copy, or using it where the log-prob ratio would then no longer start at exactly 1."""
    from solbench.engine.engine import Engine, SamplerSpec
    from solbench.engine.timing import PhaseTimer

    adapter, nets, *_ = _nets(torch.float32)
    used = []
    for name, module in (("copy", nets.rollout_copy), ("role", nets.policy)):
        module.register_forward_pre_hook(lambda *a, name=name: used.append(name))
    engine = Engine(adapter, nets, lambda images, prompts: torch.zeros(len(prompts)), PhaseTimer(), run_seed=0)
    engine.sample(["p"], ["a red circle"], [0], net="old", sampler=SamplerSpec("euler", 1), phase="rollout",
                  stream="s")
    assert set(used) == {"copy"}
    used.clear()
    engine.sample(["p"], ["a red circle"], [0], net="old", sampler=SamplerSpec("flowgrpo_sde", 1, noise_level=0.7),
                  phase="rollout", stream="s", keep_trajectory=True)
    assert set(used) == {"role"}


def _flux_run(**model) -> RunConfig:
    cfg = RunConfig(method="sol_rl", method_config={"n": 96, "k": 24, "explore_steps": 6}, prompts_per_iter=48,
                    world_size=8, device="cuda")
    cfg.model = ModelConfig(name="flux", resolution=512, gradient_checkpointing=True, text_max_length=128, **model)
    cfg.micro_batch.rollout, cfg.micro_batch.reward, cfg.micro_batch.train = 16, 32, 16
    cfg.quant.recipe, cfg.quant.backend = "nvfp4_flux", "auto"
    cfg.rewards = {"pickscore": 1.0}
    return cfg


def test_auto_takes_the_merged_copy_where_the_doctor_says_it_fits():
    """model.rollout_copy auto: merged on a GPU where the doctor's estimate with the copy fits, LoRA where
    it does not, LoRA on CPU (the embedded world's numbers); explicit settings as given; full fine-tuning
    has no adapters. Catches auto ignoring memory (a run that no longer fits an H100) or the CPU default
    changing the shipped results."""
    from solbench.doctor import merged_copy_fits, merged_copy_gb, run_profile

    cfg = _flux_run()
    assert merged_copy_gb("flux") == pytest.approx(190 * 3072 * 3072 * 2 / 1e9)
    fits, need = merged_copy_fits(run_profile(cfg.to_dict()), 1000.0)
    big = choose_rollout_copy(cfg, "cuda", capacity_gb=need / 0.95 + 1)
    small = choose_rollout_copy(cfg, "cuda", capacity_gb=need / 0.95 - 1)
    assert (big.path, small.path) == ("merged", "lora")
    assert f"{need:.1f} GB" in big.reason and "does not fit" in small.reason
    assert choose_rollout_copy(cfg, "cpu").path == "lora"
    for setting in ("merged", "lora"):
        assert choose_rollout_copy(_flux_run(rollout_copy=setting), "cuda", capacity_gb=1.0).path == setting
    full = _flux_run()
    full.finetune.mode = "full"
    assert choose_rollout_copy(full, "cuda", capacity_gb=1e4).path == "full"
    with pytest.raises(ConfigError, match="model.rollout_copy must be one of auto, merged, lora"):
        choose_rollout_copy(_flux_run(rollout_copy="fused"), "cuda")


def test_the_doctor_counts_the_copy():
    """memory_items lists the merged copy for rollout_copy: merged (and the total grows by it); for auto the
    doctor says per GPU which path a run takes. Catches a copy the memory model does not see."""
    import dataclasses

    from solbench.doctor import check_memory, estimate_total_gb, memory_items, merged_copy_gb, run_profile

    profile = run_profile(_flux_run().to_dict())
    assert profile.rollout_copy == "auto"
    merged = dataclasses.replace(profile, rollout_copy="merged")
    items = dict(memory_items(merged))
    assert items["weights/rollout_copy: merged rollout copy (bf16 LoRA-adapted linears; the rest shared with the policy)"] \
        == round(merged_copy_gb("flux"), 1)
    assert estimate_total_gb(memory_items(merged)) == pytest.approx(
        estimate_total_gb(memory_items(profile)) + round(merged_copy_gb("flux"), 1), abs=0.05)

    class NoCuda:
        @staticmethod
        def is_available():
            return False

    from solbench.doctor import SpecNeeds, _add_run

    needs = SpecNeeds()
    _add_run(needs, _flux_run().to_dict())
    rows = {r.item: r for r in check_memory(needs, cuda=NoCuda(), host=(100.0, 100.0))}
    detail = rows["flux/total"].detail
    assert "model.rollout_copy auto, a 3.6 GB merged rollout copy: B200 merged (" in detail and ", H100 " in detail


def test_the_run_records_its_rollout_path(tmp_path):
    """rollout.json in the run folder names the path and why, the role it mirrors and the compile mode;
    a run with a merged copy refreshes it after each update (a "sync" row even without an explore copy).
    Catches results that hide which path sampled them."""
    from _tiny_config import small_config

    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    cfg = small_config("naive_scaling", experiment="rollout_copy", planned_iterations=1, seed=0)
    cfg.model.rollout_copy = "merged"
    store = RunStore(tmp_path / cfg.run_id, cfg.run_id)
    trainer = Trainer(cfg, store)
    record = json.loads((tmp_path / cfg.run_id / "rollout.json").read_text())
    assert record == {"rollout_copy_requested": "merged", "rollout_copy": "merged", "reason": "as set",
                      "rollout_role": "old", "compile_requested": "auto", "compile_mode": None, "compiled_blocks": 0}
    trainer.step = 1
    trainer.train_iteration()
    phases = [row["phase"] for row in store.read("timings")]
    assert "sync" in phases and "rollout" in phases
    default = small_config("naive_scaling", experiment="rollout_copy", planned_iterations=1, seed=0)
    assert default.run_id != cfg.run_id and '"rollout_copy":' not in default.canonical_json()  # ids as before
