"""Optimizer steps per rollout (finetune.optimizer_steps): the trainer's step groups, FlowGRPO's
off-policy steps on the tiny model, and the check at spec expansion."""

from __future__ import annotations

import pytest

from solbench.config import EvalConfig, FinetuneConfig, ModelConfig, RunConfig, SamplingConfig
from solbench.errors import ConfigError
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.train.trainer import Trainer, step_group


@pytest.mark.parametrize("n,steps,groups", [
    (4, 2, [range(0, 2), range(2, 4)]),
    (5, 2, [range(0, 3), range(3, 5)]),
    (6, 3, [range(0, 2), range(2, 4), range(4, 6)]),
    (3, 5, [range(0, 1), range(1, 2), range(2, 3)]),  # more steps than micro-batches: one each
    (7, 1, [range(0, 7)]),
])
def test_step_groups_split_the_micro_batches_evenly(n, steps, groups):
    """Catches a split that loses or repeats a micro-batch, or steps more often than asked."""
    assert [step_group(m, n, steps) for m in range(n)] == [g for g in groups for _ in g]


def flow_grpo_config(optimizer_steps):
    return RunConfig(
        experiment="schedule", method="flow_grpo",
        method_config={"group_size": 4, "micro_batch_size": 4, "clip_range": 1e-4, "kl_beta": 0.0},
        model=ModelConfig(name="tiny", path="random"), rewards={"colorfulness": 1.0},
        prompts_per_iter=2, iterations=1, seed=3,
        # full fine-tuning at 1e-3: one step moves the mean log-prob by ~6e-4, beyond the 1e-4 clip (a
        # fresh LoRA moves it by ~1e-6, below it)
        finetune=FinetuneConfig(mode="full", lr=1e-3, optimizer_steps=optimizer_steps),
        sampling=SamplingConfig(steps=3, eval_steps=1),
        eval=EvalConfig(every=1, n_prompts=1, seeds_per_prompt=1, rewards=["colorfulness"], grid_prompts=1),
        checkpoint_every=1, device="cpu")


def run_recording_losses(cfg, tmp_path):
    trainer = Trainer(cfg, RunStore(tmp_path, cfg.run_id))
    original, seen = trainer.method.loss, []

    def recording(engine, chunk):
        loss, logs = original(engine, chunk)
        seen.append((chunk.micro_batch, chunk.n_micro_batches, logs))
        return loss, logs

    trainer.method.loss = recording
    trainer.run()
    steps = [r["value"] for r in trainer.store.read("metrics") if r["metric"] == "optimizer_steps"]
    return seen, steps


def test_flow_grpo_second_optimizer_step_is_off_policy_and_the_clip_acts(tmp_path):
    """Two optimizer steps per rollout (the FlowGRPO SD3 reference): the first micro-batch is
    on-policy (ratio exactly 1 on CPU, thanks to the engine's row padding), the second runs after an
    update, so its ratio differs from 1 and the 1e-4 clip acts. Catches optimizer_steps being ignored
    (one step: ratio 1 everywhere, clip_frac 0)."""
    seen, steps = run_recording_losses(flow_grpo_config(2), tmp_path)
    assert steps == [2.0]
    assert {n for _, n, _ in seen} == {2}, "the 8 kept samples should form 2 micro-batches of 4"
    first = [logs for mb, _, logs in seen if mb == 0]
    second = [logs for mb, _, logs in seen if mb == 1]
    assert first and second
    assert all(logs["approx_kl"] == 0.0 and logs["clip_frac"] == 0.0 for logs in first)
    assert all(logs["approx_kl"] > 0.0 for logs in second)
    assert all(logs["clip_frac"] > 0.0 for logs in second)


def test_flow_grpo_single_step_stays_on_policy(tmp_path):
    """The control: one optimizer step per rollout (optimizer_steps 1; without it, grad_accum 1 would
    step after each micro-batch) leaves every ratio at exactly 1."""
    seen, steps = run_recording_losses(flow_grpo_config(1), tmp_path)
    assert steps == [1.0]
    assert all(logs["approx_kl"] == 0.0 and logs["clip_frac"] == 0.0 for _, _, logs in seen)


SPEC = """
name: sched
description: optimizer steps check
base:
  model: {{name: tiny, path: random}}
  prompts_per_iter: 2
  iterations: 1
  device: cpu
  finetune: {{optimizer_steps: {steps}, grad_accum: {accum}}}
methods:
  flow_grpo: {{method_config: {{group_size: 4, micro_batch_size: {micro}}}}}
matrix:
  method: [flow_grpo]
"""


@pytest.mark.parametrize("steps,accum,micro,message", [
    (3, 1, 4, "does not divide the 2 micro-batches"),
    (2, 2, 4, "set either optimizer_steps or grad_accum"),
    (2, 1, "null", "need method_config.micro_batch_size"),
    (0, 1, 4, "must be >= 1"),
])
def test_spec_expansion_checks_optimizer_steps(tmp_path, steps, accum, micro, message):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(steps=steps, accum=accum, micro=micro))
    with pytest.raises(ConfigError, match=message):
        load_spec(path)


def test_spec_expansion_accepts_a_valid_split(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(steps=2, accum=1, micro=4))
    (run,) = load_spec(path).runs
    assert run.config.finetune.optimizer_steps == 2


def test_trainer_rejects_optimizer_steps_with_grad_accum(tmp_path):
    cfg = flow_grpo_config(2)
    cfg.finetune.grad_accum = 2
    with pytest.raises(ConfigError, match="optimizer_steps"):
        Trainer(cfg, RunStore(tmp_path, cfg.run_id))
