"""Naive BF16 scaling: N full-precision candidates per prompt, train on the K most contrastive.

Paper: the quality-ceiling control of "FP4 Explore, BF16 Train: Diffusion Reinforcement Learning via
Efficient Rollout Scaling", arXiv 2604.06916 ("naive BF16 scaling", 24-in-96). Reference repository:
NVlabs/Sana train_scripts/sol_rl (configs/sol_rl/*: ``naive_scaling``, fullrollout_model="compile",
preview_step=0).

Per iteration: the old policy draws N candidates per prompt at full precision with the full step
budget, they are scored, K are kept per prompt by the selection mode (best_worst by default), and
the DiffusionNFT objective trains on those K with advantages from their rewards. What Sol-RL must
match at a fraction of the rollout cost.

Deviations from the reference: those of DiffusionNFT (methods/diffusion_nft.py) and of the
selection helpers (solbench/method/selection.py: stable tie-breaking, no duplicates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from solbench.method import Batch, Candidate, Iteration, expand_groups, help_field, register
from solbench.method.selection import select_per_group
from solbench.methods.diffusion_nft import DiffusionNFT, NFTLossConfig


@dataclass
class RolloutScalingConfig(NFTLossConfig):
    """N candidates per prompt, K of them trained: shared by naive_scaling, naive_fp4 and sol_rl."""

    n: int = help_field(96, "candidates generated per prompt (N)")
    k: int = help_field(24, "candidates trained per prompt (K <= N)")
    selection: Literal["best_worst", "random", "mean_deviation", "extremes_random"] = help_field(
        "best_worst", "how K are chosen from N: top K/2 + bottom K/2 by reward, random, |r - mean|, extremes + random")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= self.k <= self.n:
            raise ValueError(f"need 2 <= k <= n, got k={self.k}, n={self.n}")


class KOfN:
    """What a method that trains K of N candidates per prompt declares (naive_scaling, naive_fp4, sol_rl):
    K <= N is its Config's own check (RolloutScalingConfig), K the samples it trains per prompt."""

    @classmethod
    def trained_per_prompt(cls, config: RolloutScalingConfig) -> int:
        return config.k


@register
class NaiveScaling(KOfN, DiffusionNFT):
    name = "naive_scaling"
    display_name = "naive BF16 scaling"
    Config = RolloutScalingConfig
    axes = ("n", "k", "selection")
    tiny_config = {"n": 4, "k": 2}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"rollout", "select", "reward"})  # what one iteration times besides "train"

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        cfg = self.config
        ids, texts, cand = expand_groups(prompt_ids, prompts, cfg.n)
        rollout = engine.sample(ids, texts, cand, net=self.rollout_net, sampler=self.rollout_spec(),
                                phase="rollout", stream=it.stream)
        rewards = engine.score(rollout)
        with engine.phase("select"):
            chosen = select_per_group(rewards, cfg.n, cfg.k, cfg.selection, it.generator)
        kept = set(chosen)
        candidates = [Candidate(p, c, s, "full", float(r), i in kept)
                      for i, (p, c, s, r) in enumerate(zip(ids, cand, rollout.noise_seeds, rewards.tolist()))]
        return self.training_batch(engine, rollout.index(chosen), rewards[chosen], candidates,
                                   n_images=len(ids), reward_all=float(rewards.mean()))
