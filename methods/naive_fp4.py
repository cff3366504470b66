"""Naive FP4: N low-precision candidates per prompt, train directly on the K kept FP4 samples.

Paper: the "naive FP4" control of "FP4 Explore, BF16 Train: Diffusion Reinforcement Learning via
Efficient Rollout Scaling", arXiv 2604.06916 (96 in NVFP4, top-12 + bottom-12 trained on the FP4
samples; it peaks and then declines because training on quantized samples corrupts the policy).
Reference repository: NVlabs/Sana train_scripts/sol_rl (configs/sol_rl/*: ``naive_quant``,
fullrollout_model="compile_nvfp4", preview_step=0).

Per iteration: the explore copy (the old policy, merged and quantized by solbench.quant) draws N
candidates per prompt with the full step budget; K are kept per prompt by the selection mode and the
DiffusionNFT objective trains on those low-precision samples with their low-precision rewards. No
regeneration. The harness re-syncs the explore copy after every update.

Deviations from the reference: those of DiffusionNFT (methods/diffusion_nft.py) and of the selection
helpers (solbench/method/selection.py).
"""

from __future__ import annotations

from solbench.method import Batch, Candidate, Iteration, expand_groups, register
from solbench.method.selection import select_per_group
from solbench.methods.diffusion_nft import DiffusionNFT
from solbench.methods.naive_scaling import KOfN, RolloutScalingConfig


@register
class NaiveFP4(KOfN, DiffusionNFT):
    name = "naive_fp4"
    display_name = "naive FP4"
    Config = RolloutScalingConfig
    axes = ("n", "k", "selection")
    nets = frozenset({"old", "reference", "explore"})
    tiny_config = {"n": 4, "k": 2}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"explore", "select", "reward", "sync"})  # what one iteration times besides "train"

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        cfg = self.config
        ids, texts, cand = expand_groups(prompt_ids, prompts, cfg.n)
        rollout = engine.sample(ids, texts, cand, net="explore", sampler=self.rollout_spec(),
                                phase="explore", stream=it.stream)
        rewards = engine.score(rollout)
        with engine.phase("select"):
            chosen = select_per_group(rewards, cfg.n, cfg.k, cfg.selection, it.generator)
        kept = set(chosen)
        candidates = [Candidate(p, c, s, "explore", float(r), i in kept)
                      for i, (p, c, s, r) in enumerate(zip(ids, cand, rollout.noise_seeds, rewards.tolist()))]
        batch = self.training_batch(engine, rollout.index(chosen), rewards[chosen], candidates,
                                    n_images=len(ids), reward_all=float(rewards.mean()))
        batch.logs["reward_explore"] = batch.logs["reward"]
        return batch
