"""FlowGRPO: GRPO on an SDE reformulation of the flow-matching ODE.

Paper: "Flow-GRPO: Training Flow Matching Models via Online RL", Liu et al., arXiv 2505.05470.
Reference repository: yifan123/flow_grpo (scripts/train_sd3.py, flow_grpo/diffusers_patch/
sd3_sde_with_logprob.py, flow_grpo/stat_tracking.py).

Per iteration: the policy draws G samples per prompt with the FlowGRPO SDE (noise scale
sigma_t = a sqrt(t / (1 - t)), a = noise_level) keeping every state and per-step Gaussian log-prob
(solbench.engine.sampling). Per-prompt advantages (global std by default) clipped to [-5, 5]; samples with
an advantage of exactly 0 are dropped. For each of the first int(T * timestep_fraction) steps j the
loss is the PPO clipped surrogate

    -mean(min(A rho, A clip(rho, 1 - eps, 1 + eps))),  rho = exp(logp_theta(x_{j+1} | x_j) - logp_old)

plus kl_beta |mu_theta - mu_ref|^2 / (2 sigma_t^2), the reference being the model without LoRA.

Rollout steps are the run's ``steps``; the reference rolls out with 10 (SD3) / 6 (FLUX) SDE steps and
evaluates with the ODE (noise_level 0). Give it about that many: the discretised SDE leaves noise in
the final sample that shrinks with the step count (a = 0.7, linear schedule, exact velocity: std 0.24
at 4 steps, 0.15 at 6, 0.08 at 10), and on a pixel-space model (the tiny one) 4-step rollouts are
scored mostly on that noise (shapes_geneval 0.15 against 0.40 for Euler; 0.39 at 10 steps).

Guidance: the rollouts and every loss forward (v_theta and v_ref) use the rollout's resolved guidance
(``rollout.sampler.guidance``): CFG 4.5 on SD3.5 as the reference, distilled 3.5 on FLUX.1-dev. Under
CFG, with ``detach_uncond`` (the default), the policy's unconditional branch is detached, as the
reference's compute_log_prob did at ac4c86e (``noise_pred_uncond.detach()``, flow_grpo
scripts/train_sd3.py): the velocity is the same, its gradient g grad v_cond instead of g grad v_cond -
(g - 1) grad v_uncond. Its later train_sd3.py (74db691, the commit the real specs' tables read) takes the
gradient through both branches, which the real specs follow (detach_uncond false).

Sample order: the reference shuffles the kept samples (``torch.randperm(total_batch_size)``) before
splitting them into its training batches, so each optimizer step trains on a random half of the
rollout. Here the samples are permuted with ``it.generator`` before the micro-batch split whenever
there is more than one micro-batch (within a single micro-batch an order changes only the summation
order of its mean).

Optimizer steps: the reference steps twice per rollout batch (gradient_accumulation_steps =
num_batches_per_epoch // 2), so the second half of the batch trains on samples of a policy one update
old: its ratio differs from 1 and the clip acts. Here ``finetune.optimizer_steps`` of the run sets
this (the real specs: 2); with one step per rollout every ratio is 1 and the clip never acts.

Deviations from the reference:
- The log-prob recompute is solbench.engine.sampling.step_log_prob, the rollout's own arithmetic, with the
  same padding of every network call, so the on-policy ratio is exactly 1 on CPU, where the engine
  pads batches and linear-layer rows to row-invariant counts (solbench.models.batch_invariance). On GPU a
  recompute in another micro-batch is equal up to floating-point reordering, as in the reference.
- The reference pads the kept samples (A != 0) back up to a multiple of its per-GPU batch count
  with random zero-advantage samples; here the kept samples are simply trained (a zero-advantage
  sample adds only a KL gradient).
- The reference accumulates gradients over timesteps and micro-batches through accelerate; here a
  micro-batch's loss is its mean over trained timesteps, and the micro-batches of one optimizer step
  are averaged (finetune.optimizer_steps or grad_accum decide the steps).
- The KL weight is ``kl_beta`` (the reference's train.beta); NaN/inf losses stop the run.
- Evaluation EMA (harness: finetune.ema_decay 0.9, finetune.ema_every 8 in the real specs, the
  reference's EMAModuleWrapper(decay=0.9, update_step_interval=8)): the reference calls ema.step after
  every training micro-batch with the optimizer-step count, so a triggering count updates the EMA once
  per micro-batch of that step (gradient_accumulation_steps times); here once per trigger.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from solbench.method.advantages import group_advantages, group_reward_std
from solbench.method import (Batch, Candidate, Chunk, Iteration, Method, expand_groups, help_field,
                             mean_dims, micro_batches, register)
from solbench.engine.sampling import SamplerSpec, step_log_prob


@dataclass
class FlowGRPOConfig:
    group_size: int = help_field(24, "samples per prompt (G)")
    sampler: Literal["flowgrpo_sde", "flowgrpo_cps"] = help_field("flowgrpo_sde", "rollout SDE: FlowGRPO's SDE or its CPS variant")
    noise_level: float = help_field(0.7, "SDE noise scale a (0.7 SD3, 0.9 FLUX)")
    clip_range: float = help_field(1e-4, "PPO ratio clip eps")
    kl_beta: float = help_field(0.04, "weight of the KL to the reference (0.04 GenEval/OCR, 0.01 PickScore, 0 FLUX)")
    adv_clip: float = help_field(5.0, "advantages are clipped to [-adv_clip, adv_clip]")
    global_std: bool = help_field(True, "normalise advantages by the std over the whole batch, not per prompt")
    timestep_fraction: float = help_field(0.99, "train the first int(T * fraction) of the T rollout steps")
    same_latent: bool = help_field(False, "share one initial noise across each prompt's group")
    detach_uncond: bool = help_field(True, "under CFG, no gradient through the policy's unconditional branch")
    micro_batch_size: int | None = help_field(None, "samples per forward pass; None = the whole batch")

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for per-prompt advantages, got {self.group_size}")
        if self.noise_level <= 0:
            raise ValueError(f"noise_level must be > 0, got {self.noise_level}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {self.timestep_fraction}")


def kl_variance(kind: str, std: float, dt: float) -> float:
    """sigma_t^2 of FlowGRPO's KL |mu - mu_ref|^2 / (2 sigma_t^2): the SDE's std is sigma_t sqrt(-dt)."""
    return std**2 / (-dt) if kind == "flowgrpo_sde" else std**2


@register
class FlowGRPO(Method):
    name = "flow_grpo"
    display_name = "FlowGRPO"
    Config = FlowGRPOConfig
    axes = ("group_size",)
    nets = frozenset({"reference"})
    rollout_net = "policy"
    tiny_config = {"group_size": 3, "clip_range": 0.2}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"rollout", "reward"})  # what one iteration times besides "train"

    @classmethod
    def trained_per_prompt(cls, config) -> int:
        return config.group_size  # every sample of a group trains

    def sampler_spec(self) -> SamplerSpec:
        return SamplerSpec(self.config.sampler, self.run.steps, noise_level=self.config.noise_level,
                           guidance=self.run.guidance, shift=self.run.shift)

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        cfg = self.config
        ids, texts, cand = expand_groups(prompt_ids, prompts, cfg.group_size)
        noise_idx = [0] * len(cand) if cfg.same_latent else None
        rollout = engine.sample(ids, texts, cand, net=self.rollout_net, sampler=self.sampler_spec(),
                                phase="rollout", stream=it.stream, noise_idx=noise_idx, keep_trajectory=True)
        rewards = engine.score(rollout)
        advantages = group_advantages(rewards, ids, global_std=cfg.global_std, clip=cfg.adv_clip)
        keep = torch.nonzero(advantages != 0).squeeze(1)  # a zero advantage carries no policy gradient
        kept = set(keep.tolist())
        candidates = [Candidate(p, c, s, "full", float(r), i in kept)
                      for i, (p, c, s, r) in enumerate(zip(ids, cand, rollout.noise_seeds, rewards.tolist()))]
        traj = rollout.trajectory
        device = traj.xs.device
        data = {
            "xs": traj.xs[keep.to(device)],
            "log_probs": traj.log_probs[keep.to(device)],
            "sigmas": traj.ts,
            "advantages": advantages[keep].to(device),
            "prompts": [texts[i] for i in keep.tolist()],
            "guidance": rollout.sampler.guidance,  # the recompute must see the rollout's velocity
        }
        logs = {"reward": float(rewards.mean()), "reward_all": float(rewards.mean()),
                "reward_std": group_reward_std(rewards, ids), "kept_fraction": len(kept) / len(ids)}
        return Batch(data=data, candidates=candidates, n_images=len(ids), logs=logs)

    def chunks(self, batch: Batch, it: Iteration) -> Iterator[Chunk]:
        data = batch.data
        n_samples, n_steps = data["log_probs"].shape
        n_train = max(1, int(n_steps * self.config.timestep_fraction))
        slices = micro_batches(n_samples, self.config.micro_batch_size) if n_samples else []
        # the reference's shuffle before splitting into training batches (module docstring)
        order = torch.randperm(n_samples, generator=it.generator) if len(slices) > 1 else torch.arange(n_samples)
        for mb, sl in enumerate(slices):
            rows = order[sl]
            on = rows.to(data["xs"].device)
            for j in range(n_train):
                yield Chunk(
                    data={"x": data["xs"][on, j], "x_next": data["xs"][on, j + 1], "j": j, "sigmas": data["sigmas"],
                          "old_log_prob": data["log_probs"][on, j], "advantages": data["advantages"][on],
                          "prompts": [data["prompts"][i] for i in rows.tolist()], "guidance": data["guidance"]},
                    micro_batch=mb, n_micro_batches=len(slices), weight=1.0 / n_train)

    def loss(self, engine, chunk: Chunk) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        x, x_next, j, sigmas = (chunk.data[k] for k in ("x", "x_next", "j", "sigmas"))
        cond = engine.encode(chunk.data["prompts"])
        t = sigmas[j].expand(x.shape[0]).to(x.device)

        v = engine.velocity("policy", x, t, cond, chunk.data["guidance"], detach_uncond=self.config.detach_uncond)
        step = step_log_prob(cfg.sampler, x, v, sigmas, j, x_next, cfg.noise_level)
        log_ratio = step.log_prob - chunk.data["old_log_prob"]
        ratio = torch.exp(log_ratio)
        adv = chunk.data["advantages"].clamp(-cfg.adv_clip, cfg.adv_clip)
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - cfg.clip_range, 1 + cfg.clip_range)
        policy_loss = torch.maximum(unclipped, clipped).mean()

        loss = policy_loss
        logs = {"policy_loss": float(policy_loss.detach()),
                "clip_frac": float(((ratio - 1).abs() > cfg.clip_range).float().mean()),
                "approx_kl": float(0.5 * (log_ratio.detach() ** 2).mean())}
        if cfg.kl_beta > 0:
            with torch.no_grad():
                v_ref = engine.velocity("reference", x, t, cond, chunk.data["guidance"])
                mean_ref = step_log_prob(cfg.sampler, x, v_ref, sigmas, j, x_next, cfg.noise_level).mean
            variance = kl_variance(cfg.sampler, step.std, float(sigmas[j + 1]) - float(sigmas[j]))
            if variance <= 0 or not math.isfinite(variance):
                raise ValueError(f"flow_grpo: step {j} has SDE variance {variance}; lower timestep_fraction")
            kl = (mean_dims((step.mean - mean_ref) ** 2) / (2 * variance)).mean()
            loss = loss + cfg.kl_beta * kl
            logs["kl"] = float(kl.detach())
        return loss, logs
