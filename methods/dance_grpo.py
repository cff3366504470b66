"""DanceGRPO: GRPO with a shared initial noise per group and a random subset of timesteps.

Paper: "DanceGRPO: Unleashing GRPO on Visual Generation", Xue et al., arXiv 2505.07818.
Reference repository: XueZeyue/DanceGRPO (fastvideo/train_grpo_flux.py: flux_step, sample_reference_model,
train_one_step).

Per iteration: for each prompt, G samples start from ONE shared initial noise (training often fails
without it) and follow DanceGRPO's SDE (mean x + dsigma v - 0.5 eta^2 dsigma score, std
eta sqrt(|dsigma|), linear sigmas shifted by 3), so they differ only through the SDE noise. Group
advantages (r - mean) / (std + 1e-8) with the n-1 std, clipped to [-5, 5]. Each sample trains on a
random int(timestep_fraction * (T - 1)) of its first T - 1 steps (the last step is dropped) with the
PPO clipped surrogate, eps = 1e-4, and no KL.

Deviations from the reference:
- The log-prob recompute is solbench.engine.sampling.step_log_prob (the rollout's arithmetic, with the
  rollout's guidance), so the on-policy ratio is exactly 1 on CPU thanks to the engine's row padding
  (solbench.models.batch_invariance; on GPU equal up to floating-point reordering). The reference's log-prob
  keeps the Gaussian's constant terms (a dangling line that dropped them was fixed upstream in
  2025-08); constants cancel in the ratio either way.
- The reference trains sample by sample (train_batch_size 1) and steps the optimizer every
  gradient_accumulation_steps = 4 samples per GPU, so all but the first samples of a rollout train
  off-policy and the clip acts. Each rank rolls out one prompt x 12, so a rollout gets 3 optimizer
  steps and a sample is at most 2 updates stale. Here ``finetune.optimizer_steps`` sets the steps per
  iteration (the real specs: 3, over the paper's 48 prompts, so each step takes 16 prompts' samples)
  and ``micro_batch_size`` is only a memory setting. The reference fine-tunes all weights at lr 1e-5;
  the real specs use the paper's shared LoRA setting. The reference keeps no evaluation EMA (the real
  specs evaluate the policy: eval.use_ema false).
- The SDE noise of step j is keyed by each candidate's own index, while the initial noise is the
  group's (engine noise_idx); NaN/inf losses stop the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from solbench.method.advantages import group_advantages, group_reward_std
from solbench.method import (Batch, Candidate, Chunk, Iteration, Method, expand_groups, help_field,
                             micro_batches, register)
from solbench.engine.sampling import SamplerSpec, step_log_prob


@dataclass
class DanceGRPOConfig:
    group_size: int = help_field(12, "samples per prompt (G)")
    eta: float = help_field(0.3, "SDE noise scale eta")
    shift: float | None = help_field(3.0, "sigma-schedule shift of the rollouts; None = the model's default")
    clip_range: float = help_field(1e-4, "PPO ratio clip eps")
    adv_clip: float = help_field(5.0, "advantages are clipped to [-adv_clip, adv_clip]")
    timestep_fraction: float = help_field(0.6, "fraction of the first T - 1 steps each sample trains on")
    shared_noise: bool = help_field(True, "one initial noise per group")
    micro_batch_size: int | None = help_field(None, "samples per forward pass; None = the whole batch")

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group advantages, got {self.group_size}")
        if self.eta <= 0:
            raise ValueError(f"eta must be > 0, got {self.eta}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {self.timestep_fraction}")


@register
class DanceGRPO(Method):
    name = "dance_grpo"
    display_name = "DanceGRPO"
    Config = DanceGRPOConfig
    axes = ("group_size",)
    nets = frozenset()
    rollout_net = "policy"
    tiny_config = {"group_size": 3, "clip_range": 0.2}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"rollout", "reward"})  # what one iteration times besides "train"

    @classmethod
    def trained_per_prompt(cls, config) -> int:
        return config.group_size  # every sample of a group trains

    def sampler_spec(self) -> SamplerSpec:
        return SamplerSpec("dance_sde", self.run.steps, noise_level=self.config.eta, guidance=self.run.guidance,
                           shift=self.config.shift if self.config.shift is not None else self.run.shift)

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        cfg = self.config
        if self.run.steps < 2:
            raise ValueError("dance_grpo needs at least 2 sampling steps (it never trains the last one)")
        ids, texts, cand = expand_groups(prompt_ids, prompts, cfg.group_size)
        noise_idx = [0] * len(cand) if cfg.shared_noise else None
        rollout = engine.sample(ids, texts, cand, net=self.rollout_net, sampler=self.sampler_spec(),
                                phase="rollout", stream=it.stream, noise_idx=noise_idx, keep_trajectory=True)
        rewards = engine.score(rollout)
        advantages = group_advantages(rewards, ids, global_std=False, eps=1e-8, clip=cfg.adv_clip, unbiased=True)
        traj = rollout.trajectory
        candidates = [Candidate(p, c, s, "full", float(r), True)
                      for p, c, s, r in zip(ids, cand, rollout.noise_seeds, rewards.tolist())]
        data = {"xs": traj.xs, "log_probs": traj.log_probs, "sigmas": traj.ts,
                "advantages": advantages.to(traj.xs.device), "prompts": texts,
                "guidance": rollout.sampler.guidance}
        logs = {"reward": float(rewards.mean()), "reward_all": float(rewards.mean()),
                "reward_std": group_reward_std(rewards, ids)}
        return Batch(data=data, candidates=candidates, n_images=len(ids), logs=logs)

    def chunks(self, batch: Batch, it: Iteration) -> Iterator[Chunk]:
        data = batch.data
        xs, log_probs = data["xs"], data["log_probs"]
        n_samples, n_steps = log_probs.shape
        n_candidates = n_steps - 1  # the last step is never trained
        n_train = max(1, int(n_candidates * self.config.timestep_fraction))
        order = torch.stack([torch.randperm(n_candidates, generator=it.generator) for _ in range(n_samples)])
        slices = micro_batches(n_samples, self.config.micro_batch_size)
        for mb, sl in enumerate(slices):
            rows = torch.arange(n_samples)[sl]
            for k in range(n_train):
                steps = order[sl, k]
                dev_rows, dev_steps = rows.to(xs.device), steps.to(xs.device)
                yield Chunk(
                    data={"x": xs[dev_rows, dev_steps], "x_next": xs[dev_rows, dev_steps + 1],
                          "steps": steps.tolist(), "sigmas": data["sigmas"],
                          "old_log_prob": log_probs[dev_rows, dev_steps], "advantages": data["advantages"][sl],
                          "prompts": data["prompts"][sl], "guidance": data["guidance"]},
                    micro_batch=mb, n_micro_batches=len(slices), weight=1.0 / n_train)

    def loss(self, engine, chunk: Chunk) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        x, x_next, steps, sigmas = (chunk.data[k] for k in ("x", "x_next", "steps", "sigmas"))
        cond = engine.encode(chunk.data["prompts"])
        t = sigmas[torch.tensor(steps)].to(x.device)
        v = engine.velocity("policy", x, t, cond, chunk.data["guidance"])
        # the transition coefficients depend on each sample's own step
        log_prob = torch.cat([
            step_log_prob("dance_sde", x[i:i + 1], v[i:i + 1], sigmas, j, x_next[i:i + 1], cfg.eta).log_prob
            for i, j in enumerate(steps)])
        log_ratio = log_prob - chunk.data["old_log_prob"]
        ratio = torch.exp(log_ratio)
        adv = chunk.data["advantages"].clamp(-cfg.adv_clip, cfg.adv_clip)
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_range, 1 + cfg.clip_range)).mean()
        logs = {"policy_loss": float(loss.detach()),
                "clip_frac": float(((ratio - 1).abs() > cfg.clip_range).float().mean()),
                "approx_kl": float(0.5 * (log_ratio.detach() ** 2).mean())}
        return loss, logs
