"""The smallest trainer RunConfig of a method on the tiny model (random weights, colourfulness
reward, one prompt per iteration, 2 sampling steps), shared by the trainer tests."""

from __future__ import annotations

from solbench.config import EvalConfig, FinetuneConfig, ModelConfig, RunConfig, SamplingConfig
from solbench.method import get_method


def small_config(method: str, *, experiment: str, planned_iterations: int, seed: int, **overrides) -> RunConfig:
    """``method`` with its tiny_config for ``planned_iterations`` steps, one evaluation at the end and
    a checkpoint every step; ``overrides`` are set on the config afterwards (an ``iterations``
    override changes the budget only: eval.every stays at ``planned_iterations``)."""
    cfg = RunConfig(
        experiment=experiment, method=method, method_config=dict(get_method(method).tiny_config),
        model=ModelConfig(name="tiny", path="random"), rewards={"colorfulness": 1.0},
        prompts_per_iter=1, iterations=planned_iterations, seed=seed,
        finetune=FinetuneConfig(lora_rank=4, lora_alpha=8, lr=1e-3),
        sampling=SamplingConfig(steps=2, eval_steps=1),
        eval=EvalConfig(every=planned_iterations, n_prompts=1, seeds_per_prompt=1, rewards=["colorfulness"], grid_prompts=1),
        checkpoint_every=1, device="cpu")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg
