"""Learning: a short run of each method raises the training reward on held-out prompts.

Setting (every method): the pretrained tiny model, reward shapes_geneval (graded, [0, 1]), 2 prompt
groups per iteration, 4 sampling steps, LoRA r=32 (lr 3e-4 for the DiffusionNFT family, 1e-3 for
FlowGRPO, DanceGRPO and AWM, see LR) with the harness's EMA (0.9) for evaluation, ITERATIONS iterations; G = 6 for the single-stage methods, N = 12 / K = 6 for sol_rl and
the naive controls (Sol-RL explores with 3 steps). Evaluation: the first 8 held-out prompts x 2
fixed seeds, Euler 4 steps, before training (the base model, step 0) and at the end.

The assertion: final mean reward >= base mean reward + MARGIN.
"""

from __future__ import annotations

import pytest

from solbench.config import EvalConfig, FinetuneConfig, ModelConfig, RunConfig, SamplingConfig
from solbench.results import RunStore
from solbench.trainer import train_run

ITERATIONS = 8
MARGIN = 0.03

LEARNING = {
    "diffusion_nft": {"group_size": 6},
    "sol_rl": {"n": 12, "k": 6, "explore_steps": 3},
    "naive_fp4": {"n": 12, "k": 6},
    "naive_scaling": {"n": 12, "k": 6},
    "flow_grpo": {"group_size": 6, "kl_beta": 0.0, "clip_range": 0.2},
    "dance_grpo": {"group_size": 6, "clip_range": 0.2},
    "awm": {"group_size": 6, "train_timesteps": 3},
}


LR = {"flow_grpo": 1e-3, "dance_grpo": 1e-3, "awm": 1e-3}


def learning_config(method: str) -> RunConfig:
    return RunConfig(
        experiment="learning", method=method, method_config=LEARNING[method],
        model=ModelConfig(name="tiny"), rewards={"shapes_geneval": 1.0},
        prompts_per_iter=2, iterations=ITERATIONS, seed=1,
        finetune=FinetuneConfig(lr=LR.get(method, 3e-4)),
        sampling=SamplingConfig(steps=4, eval_steps=4),
        eval=EvalConfig(every=ITERATIONS, prompts="shapes/heldout", n_prompts=8, seeds_per_prompt=2,
                        rewards=["shapes_geneval"], grid_prompts=4),
        checkpoint_every=ITERATIONS, device="cpu")


def eval_curve(store: RunStore) -> dict[int, float]:
    return {r["step"]: r["value"] for r in store.read("metrics")
            if r["split"] == "eval" and r["metric"] == "shapes_geneval"}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(LEARNING))
def test_short_run_beats_the_base_model_on_heldout_prompts(method, tmp_path):
    cfg = learning_config(method)
    store = RunStore(tmp_path, cfg.run_id)
    train_run(cfg, store)
    curve = eval_curve(store)
    base, final = curve[0], curve[ITERATIONS]
    assert final >= base + MARGIN, f"{method}: held-out shapes_geneval {base:.3f} -> {final:.3f} (needs +{MARGIN})"
