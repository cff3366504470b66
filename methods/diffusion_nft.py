"""DiffusionNFT: negative-aware fine-tuning on the forward process.

Paper: "DiffusionNFT: Online Diffusion Reinforcement with Forward Process", Zheng et al.,
arXiv 2509.16117. Reference repository: NVlabs/DiffusionNFT (the same loss, verbatim, drives Sol-RL
in NVlabs/Sana train_scripts/sol_rl/train_*.py).

Per iteration: the "old" policy draws G samples per prompt with a deterministic ODE; rewards give
per-prompt advantages A (global std, clipped to [-5, 5]) and an optimality weight
r = clamp(A / (2 adv_clip) + 0.5, 0, 1). At a schedule time t with fresh eps, x_t = (1-t) x0 + t eps,
and with the implicit positive and negative policies

    v+ = beta v_theta + (1 - beta) v_old,   v- = (1 + beta) v_old - beta v_theta,   x0+- = x_t - t v+-

the loss is ``loss_scale * mean[r |x0+ - x0|^2 / w+ + (1 - r) |x0- - x0|^2 / w-] / beta
+ kl_beta mean |v_theta - v_ref|^2``, w+- = stop-grad mean |x0+- - x0| (>= 1e-5). After each
iteration the old policy moves toward the policy: theta_old <- d theta_old + (1 - d) theta,
d = min(old_decay_rate * step, old_decay_max).

Guidance: rollouts and every loss forward (v_old, v_theta, v_ref) use the rollout's resolved
guidance; the references (NVlabs/DiffusionNFT, Sana configs/nft, configs/sol_rl) use 1.0 throughout
(no CFG; on FLUX.1-dev the distilled guidance input is 1.0), which the real specs set.

Deviations from the reference:
- The NFT guidance strength and the KL weight are ``beta`` and ``kl_beta`` (the reference calls both
  beta, config.beta and config.train.beta).
- The old-policy decay uses the iteration count; the reference counts optimizer steps, which is the
  same with its one optimizer step per iteration (Sol-RL configs: grad_steps_per_epoch = 1; the real
  specs set finetune.optimizer_steps 1, so the micro-batch size does not add steps).
- A NaN/inf loss stops the run (harness) instead of being multiplied by zero.
- ``micro_batch_size`` None trains the whole batch as one micro-batch; the reference uses 16 samples
  per forward and accumulates all of them into one optimizer step, which is the same update (with
  finetune.optimizer_steps 1 for any micro-batch size).
- Training timesteps: each sample trains on a random ``int(T * timestep_fraction)`` of the T
  rollout schedule points in random order (as the reference); here one chunk is "the k-th drawn
  timestep of every sample in the micro-batch", as in the reference's loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from solbench.method.advantages import group_advantages, group_reward_std
from solbench.method import (Batch, Candidate, Chunk, Iteration, Method, broadcast_time, ema_into_role,
                             expand_groups, help_field, mean_dims, micro_batches, register, velocity_deviation)
from solbench.engine.sampling import SamplerSpec


def trained_timesteps(n_points: int, timestep_fraction: float) -> int:
    """Schedule points each sample trains on: ``max(1, int(T * timestep_fraction))`` (the cost projection
    counts training forwards with the same rule, solbench/report/cost.py)."""
    return max(1, int(n_points * timestep_fraction))


@dataclass
class NFTLossConfig:
    """Fields shared by every method that trains with the DiffusionNFT objective."""

    beta: float = help_field(1.0, "NFT guidance strength between v_theta and v_old (0.1 for OCR)")
    kl_beta: float = help_field(1e-4, "weight of the KL-like penalty |v_theta - v_ref|^2 to the reference")
    adv_clip: float = help_field(5.0, "advantages are clipped to [-adv_clip, adv_clip]")
    loss_scale: float = help_field(5.0, "constant factor on the policy loss (the reference multiplies by adv_clip)")
    global_std: bool = help_field(True, "normalise advantages by the std over the whole batch, not per prompt")
    timestep_fraction: float = help_field(0.99, "fraction of the T schedule points each sample trains on")
    old_decay_rate: float = help_field(0.001, "old-policy EMA decay grows by this per iteration ...")
    old_decay_max: float = help_field(0.5, "... up to this cap: d = min(rate * step, max)")
    sampler: Literal["dpm2", "euler"] = help_field("dpm2", "deterministic ODE solver of the rollouts")
    micro_batch_size: int | None = help_field(None, "samples per forward pass; None = the whole batch")

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0 (the loss divides by it), got {self.beta}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {self.timestep_fraction}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}")


@dataclass
class DiffusionNFTConfig(NFTLossConfig):
    group_size: int = help_field(24, "samples per prompt (G)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for per-prompt advantages, got {self.group_size}")


def old_policy_decay(step: int, rate: float, cap: float) -> float:
    """d in theta_old <- d theta_old + (1 - d) theta after iteration ``step``."""
    return min(rate * step, cap)


@register
class DiffusionNFT(Method):
    name = "diffusion_nft"
    display_name = "DiffusionNFT"
    Config = DiffusionNFTConfig
    axes = ("group_size",)
    nets = frozenset({"old", "reference"})
    rollout_net = "old"
    tiny_config = {"group_size": 3}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"rollout", "reward"})  # what one iteration times besides "train"

    @classmethod
    def trained_per_prompt(cls, config) -> int:
        return config.group_size  # every sample of a group trains

    # -- rollout ------------------------------------------------------------------------------
    def rollout_spec(self, steps: int | None = None) -> SamplerSpec:
        return SamplerSpec(self.config.sampler, steps or self.run.steps, guidance=self.run.guidance,
                           shift=self.run.shift)

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        ids, texts, cand = expand_groups(prompt_ids, prompts, self.config.group_size)
        rollout = engine.sample(ids, texts, cand, net=self.rollout_net, sampler=self.rollout_spec(),
                                phase="rollout", stream=it.stream)
        rewards = engine.score(rollout)
        candidates = [Candidate(p, c, s, "full", float(r), True)
                      for p, c, s, r in zip(ids, cand, rollout.noise_seeds, rewards.tolist())]
        return self.training_batch(engine, rollout, rewards, candidates, n_images=len(ids),
                                   reward_all=float(rewards.mean()))

    def training_batch(self, engine, rollout, rewards: torch.Tensor, candidates: list[Candidate], *,
                       n_images: int, reward_all: float) -> Batch:
        """The NFT training batch from the trained samples and their (full-precision) rewards."""
        advantages = group_advantages(rewards, rollout.prompt_ids, global_std=self.config.global_std,
                                      clip=self.config.adv_clip)
        data = {
            "x0": rollout.x0.float(),
            "prompts": list(rollout.prompts),
            "advantages": advantages.to(rollout.x0.device),
            "sigmas": engine.adapter.sigmas(rollout.sampler.steps, rollout.sampler.shift).to(rollout.x0.device),
            "guidance": rollout.sampler.guidance,  # resolved: every loss forward uses the rollout's guidance
        }
        logs = {"reward": float(rewards.mean()), "reward_all": reward_all,
                "reward_std": group_reward_std(rewards, rollout.prompt_ids)}
        return Batch(data=data, candidates=candidates, n_images=n_images, logs=logs)

    # -- training -----------------------------------------------------------------------------
    def chunks(self, batch: Batch, it: Iteration) -> Iterator[Chunk]:
        data = batch.data
        x0, sigmas = data["x0"], data["sigmas"]
        n_samples, n_points = x0.shape[0], len(sigmas) - 1  # schedule points 1 .. 1/T (t=0 excluded)
        n_train = trained_timesteps(n_points, self.config.timestep_fraction)
        slices = micro_batches(n_samples, self.config.micro_batch_size)
        # per sample: a random subset of the schedule points, in random order
        order = torch.stack([torch.randperm(n_points, generator=it.generator) for _ in range(n_samples)])
        for mb, sl in enumerate(slices):
            for k in range(n_train):
                t = sigmas[order[sl, k].to(sigmas.device)]
                eps = torch.randn(x0[sl].shape, generator=it.generator).to(x0.device)
                yield Chunk(
                    data={"x0": x0[sl], "t": t, "eps": eps, "advantages": data["advantages"][sl],
                          "prompts": data["prompts"][sl], "guidance": data["guidance"]},
                    micro_batch=mb, n_micro_batches=len(slices), weight=1.0 / n_train)

    def loss(self, engine, chunk: Chunk) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        x0, t, eps, adv, guidance = (chunk.data[k] for k in ("x0", "t", "eps", "advantages", "guidance"))
        cond = engine.encode(chunk.data["prompts"])
        t_b = broadcast_time(t, x0)
        x_t = (1 - t_b) * x0 + t_b * eps

        with torch.no_grad():
            v_old = engine.velocity("old", x_t, t, cond, guidance).float()
        v = engine.velocity("policy", x_t, t, cond, guidance).float()

        r = (adv.clamp(-cfg.adv_clip, cfg.adv_clip) / (2 * cfg.adv_clip) + 0.5).clamp(0, 1)
        v_pos = cfg.beta * v + (1 - cfg.beta) * v_old
        v_neg = (1 + cfg.beta) * v_old - cfg.beta * v
        x0_pos = x_t - t_b * v_pos
        x0_neg = x_t - t_b * v_neg
        with torch.no_grad():  # adaptive weights, in float64 like the reference
            w_pos = mean_dims((x0_pos.double() - x0.double()).abs()).clamp(min=1e-5)
            w_neg = mean_dims((x0_neg.double() - x0.double()).abs()).clamp(min=1e-5)
        pos = mean_dims((x0_pos - x0) ** 2) / w_pos.to(x0.dtype)
        neg = mean_dims((x0_neg - x0) ** 2) / w_neg.to(x0.dtype)
        policy_loss = cfg.loss_scale * ((r * pos + (1 - r) * neg) / cfg.beta).mean()

        loss = policy_loss
        logs = {"policy_loss": float(policy_loss.detach()), "old_deviation": float(((v.detach() - v_old) ** 2).mean())}
        if cfg.kl_beta > 0:
            kl = velocity_deviation(engine, "reference", v, x_t, t, cond, guidance)
            loss = loss + cfg.kl_beta * kl
            logs["kl"] = float(kl.detach())
        return loss, logs

    def after_update(self, nets, step: int) -> None:
        ema_into_role(nets, "old", old_policy_decay(step, self.config.old_decay_rate, self.config.old_decay_max))
