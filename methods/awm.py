"""AWM: Advantage Weighted Matching, RL as advantage-weighted flow matching.

Paper: "Advantage Weighted Matching: Aligning RL with Pretraining in Diffusion Models", Xue et al.,
arXiv 2509.25050. Reference repository: scxue/advantage_weighted_matching
(advantage_weighted_matching/scripts/train_sd3_awm.py, config/dgx_awm.py).

Per iteration: the policy draws G samples per prompt (any sampler; the reference uses its order-2
SA-Solver, solbench.engine.sampling "sa_solver", or "awm_sde", its first-order transition). Advantages
(global std) are clipped to 5 and scaled to [-1, 1]. Each sample's final x0 is re-noised at
``train_timesteps`` schedule points, stratified over the sampler's indices (``time_type``:
"discrete_wo_init", indices 1 .. int(T * timestep_fraction), the reference's GenEval/OCR configs;
"discrete", indices 0 .. int(T * timestep_fraction), its PickScore config, whose first stratum includes
t = 1), with fresh eps: x_t = (1 - t) x0 + t eps. With d = mean |v_theta(x_t) - (eps - x0)|^2 the loss is

    mean(A w(d)) + kl_beta mean |v_theta - v_ref|^2 + slow_beta mean |v_theta - v_slow|^2

(w(d) = d, or the reference's generalised Huber of d with ``weighting="ghuber"``, below),
where the reference is the model without LoRA and the slow copy follows the policy after every
iteration: theta_slow <- d theta_slow + (1 - d) theta, d = min(slow_decay_rate * step, slow_decay_max).
The slow copy lives in the harness's "old" role.

Deviations from the reference:
- The loss is A w(d) directly; the reference wraps -w(d) as a log-prob in a PPO ratio (clip 1) whose
  on-policy value is 1, which gives the same gradient.
- Weighting: ``weighting="uniform"`` (the default, which keeps the tiny model's numbers) trains on d itself,
  the reference's 'Uniform'; ``"ghuber"`` on its generalised Huber ((d + 1e-10)^p - 1e-10^p) t / p with
  d in float64 (train_sd3_awm.py compute_log_prob_awm, whose log-prob is minus it), p = ``ghuber_power``:
  the PickScore config's weighting='ghuber', ghuber_power=0.25 (dgx_awm.py), which the real specs set. The
  reference puts it in an exp_first ratio exp(lp - lp.detach()) per (timestep, sample); on-policy the
  ratio is 1 and its clip (range 1) cannot act, so A times the loss has the same gradient, -A d lp; its
  sum_first variant, the mean over timesteps inside the ratio, has that gradient too.
- Defaults are the reference's GenEval config (config/dgx_awm.py geneval_sd3_no_cfg_*: noise_level
  0.4, kl_beta 1e-3, time_type discrete_wo_init); its OCR config uses kl_beta 3e-3, its PickScore
  config noise_level 0 (a deterministic SA-solver), kl_beta 1e-4 and time_type discrete, which the
  real specs (PickScore prompts) set. All of them: 14 steps, no CFG (guidance 1.0), one optimizer step
  per rollout (on-policy).
- Sampler: ``sampler="sa_solver"`` is the reference's rollout sampler (use_sa_solver: SA-Solver,
  predictor and corrector of order 2 in PEC mode, tau = noise_level on 0.3 <= t <= 0.9; see
  solbench.engine.sampling), which the real specs use. The default ``awm_sde`` is its first-order
  stochastic transition with a constant tau (it keeps the tiny model's numbers).
- Guidance: every loss forward (v_theta, v_ref, v_slow) uses the rollout's resolved guidance, so a run
  with guidance 1.0 never falls back to the model's CFG default.
- The evaluation EMA (harness: finetune.ema_decay, 0.99 in the real specs as the reference's
  ema_decay, every step) is separate from the slow copy, as in the reference (its EMAModuleWrapper vs
  its "ema" adapter).
- NaN/inf losses stop the run.

Cost (issue 17 reported 9.9 s per AWM iteration against 0.9-2.5 s for the other methods at the same
group size). AWM does no extra work per rollout: one velocity per step and sample, no CFG, the same
forwards as every on-policy method (the SDE's noise draws are negligible). Training costs
``train_timesteps`` chunks (default 6) of one policy forward + backward and two no-grad forwards
(reference, slow copy) over the whole group, which is linear in ``train_timesteps`` and below
DiffusionNFT's per-iteration count. Profiled on the tiny model at the main job's sizes (16 samples,
10 steps, LoRA rank 8; 2-core Xeon, shared): AWM 16.7 s vs DiffusionNFT 14.7 s per iteration, and
interleaved rollouts of 16 images cost the same whichever sampler/role (awm_sde on the policy
2.6-3.2 s, euler on the old view 2.2-3.1 s). Single AWM rollouts measured 2.9 s and 11.8 s minutes
apart on that shared machine, so the reported gap is load from other processes (the OpenMP
collapse issue 17 is about), not AWM; the adapter switches of its reference and slow-copy views
are now skipped where redundant (solbench.engine.policy.active_adapter).
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
from solbench.methods.diffusion_nft import old_policy_decay


@dataclass
class AWMConfig:
    group_size: int = help_field(24, "samples per prompt (G)")
    sampler: Literal["awm_sde", "sa_solver", "euler", "dpm2"] = help_field(
        "awm_sde", "rollout sampler (sa_solver: the reference's order-2 SA-Solver)")
    noise_level: float = help_field(0.4, "SA-solver stochasticity tau (awm_sde, sa_solver)")
    train_timesteps: int = help_field(6, "re-noising timesteps per sample, stratified over the schedule")
    timestep_fraction: float = help_field(0.9, "strata cover schedule indices up to int(T * fraction)")
    time_type: Literal["discrete_wo_init", "discrete"] = help_field(
        "discrete_wo_init", "strata start at index 1 (discrete_wo_init) or 0, t = 1 (discrete)")
    adv_clip: float = help_field(5.0, "advantages are clipped to [-adv_clip, adv_clip] ...")
    advantage_max: float = help_field(1.0, "... then scaled to [-advantage_max, advantage_max]")
    global_std: bool = help_field(True, "normalise advantages by the std over the whole batch, not per prompt")
    weighting: Literal["uniform", "ghuber"] = help_field(
        "uniform", "per-sample matching loss: uniform d, or the reference's generalised Huber of d times t")
    ghuber_power: float = help_field(0.25, "power p of the generalised Huber weighting (weighting=ghuber)")
    kl_beta: float = help_field(1e-3, "weight of |v_theta - v_ref|^2 to the reference")
    slow_beta: float = help_field(1.0, "weight of |v_theta - v_slow|^2 to the slow copy")
    slow_decay_rate: float = help_field(0.001, "slow-copy EMA decay grows by this per iteration ...")
    slow_decay_max: float = help_field(0.3, "... up to this cap")
    micro_batch_size: int | None = help_field(None, "samples per forward pass; None = the whole batch")

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for per-prompt advantages, got {self.group_size}")
        if self.train_timesteps < 1:
            raise ValueError(f"train_timesteps must be >= 1, got {self.train_timesteps}")
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {self.timestep_fraction}")
        if self.ghuber_power <= 0:
            raise ValueError(f"ghuber_power must be > 0, got {self.ghuber_power}")


GHUBER_EPS = 1e-10  # train_sd3_awm.py compute_log_prob_awm: pow(d + 1e-10, p) - pow(1e-10, p)


def ghuber(d: torch.Tensor, t: torch.Tensor, power: float) -> torch.Tensor:
    """The reference's generalised-Huber matching loss of the per-sample mean squared error ``d`` at time ``t``,
    ((d + 1e-10)^p - 1e-10^p) t / p, in float64 as the reference computes it (its log-prob is minus this):
    p = 1 is t d, p = 1/2 its 'huber'; p = 0.25 (the PickScore config) weights a sample by t d^(p - 1)."""
    d = d.double()
    return ((d + GHUBER_EPS) ** power - GHUBER_EPS ** power) * t.double() / power


def stratified_indices(n_steps: int, n_strata: int, fraction: float, generator: torch.Generator,
                       first: int = 1) -> torch.Tensor:
    """One schedule index per stratum of [first, int(n_steps * fraction)]: first = 1 is the reference's
    discrete_wo_init, first = 0 its discrete (train_sd3_awm.py, config.time_type)."""
    top = max(1, int(n_steps * fraction))
    bounds = torch.linspace(first, top, n_strata + 1).long()
    lower, upper = bounds[:-1], bounds[1:]
    u = torch.rand(n_strata, generator=generator)
    return (lower + (u * (upper - lower)).long()).clamp(max=n_steps - 1)


@register
class AWM(Method):
    name = "awm"
    display_name = "AWM"
    Config = AWMConfig
    axes = ("group_size",)
    nets = frozenset({"old", "reference"})  # "old" = the slow copy
    rollout_net = "policy"
    tiny_config = {"group_size": 3, "train_timesteps": 2}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"rollout", "reward"})  # what one iteration times besides "train"

    @classmethod
    def trained_per_prompt(cls, config) -> int:
        return config.group_size  # every sample of a group trains

    def sampler_spec(self) -> SamplerSpec:
        noise = self.config.noise_level if self.config.sampler in ("awm_sde", "sa_solver") else 0.0
        return SamplerSpec(self.config.sampler, self.run.steps, noise_level=noise, guidance=self.run.guidance,
                           shift=self.run.shift)

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        cfg = self.config
        ids, texts, cand = expand_groups(prompt_ids, prompts, cfg.group_size)
        rollout = engine.sample(ids, texts, cand, net=self.rollout_net, sampler=self.sampler_spec(),
                                phase="rollout", stream=it.stream)
        rewards = engine.score(rollout)
        advantages = group_advantages(rewards, ids, global_std=cfg.global_std, clip=cfg.adv_clip)
        candidates = [Candidate(p, c, s, "full", float(r), True)
                      for p, c, s, r in zip(ids, cand, rollout.noise_seeds, rewards.tolist())]
        data = {"x0": rollout.x0.float(), "prompts": texts, "advantages": advantages.to(rollout.x0.device),
                "sigmas": engine.adapter.sigmas(rollout.sampler.steps, rollout.sampler.shift).to(rollout.x0.device),
                "guidance": rollout.sampler.guidance}  # resolved: every loss forward uses the rollout's guidance
        logs = {"reward": float(rewards.mean()), "reward_all": float(rewards.mean()),
                "reward_std": group_reward_std(rewards, ids)}
        return Batch(data=data, candidates=candidates, n_images=len(ids), logs=logs)

    def chunks(self, batch: Batch, it: Iteration) -> Iterator[Chunk]:
        cfg = self.config
        x0, sigmas = batch.data["x0"], batch.data["sigmas"]
        slices = micro_batches(x0.shape[0], cfg.micro_batch_size)
        for mb, sl in enumerate(slices):
            indices = stratified_indices(len(sigmas) - 1, cfg.train_timesteps, cfg.timestep_fraction, it.generator,
                                         first=0 if cfg.time_type == "discrete" else 1)
            order = torch.randperm(cfg.train_timesteps, generator=it.generator)
            for k in order.tolist():
                b = x0[sl].shape[0]
                eps = torch.randn(x0[sl].shape, generator=it.generator).to(x0.device)
                yield Chunk(
                    data={"x0": x0[sl], "t": sigmas[indices[k]].expand(b).clone(), "eps": eps,
                          "advantages": batch.data["advantages"][sl], "prompts": batch.data["prompts"][sl],
                          "guidance": batch.data["guidance"]},
                    micro_batch=mb, n_micro_batches=len(slices), weight=1.0 / cfg.train_timesteps)

    def loss(self, engine, chunk: Chunk) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        x0, t, eps, guidance = chunk.data["x0"], chunk.data["t"], chunk.data["eps"], chunk.data["guidance"]
        cond = engine.encode(chunk.data["prompts"])
        t_b = broadcast_time(t, x0)
        x_t = (1 - t_b) * x0 + t_b * eps

        v = engine.velocity("policy", x_t, t, cond, guidance).float()
        adv = chunk.data["advantages"].clamp(-cfg.adv_clip, cfg.adv_clip) / cfg.adv_clip * cfg.advantage_max
        if cfg.weighting == "ghuber":  # the squared error in float64, as the reference's compute_log_prob_awm
            matching = mean_dims((v.double() - (eps.double() - x0.double())) ** 2)
            policy_loss = (adv.double() * ghuber(matching, t, cfg.ghuber_power)).mean().float()
        else:
            matching = mean_dims((v - (eps - x0)) ** 2)
            policy_loss = (adv * matching).mean()

        loss = policy_loss
        logs = {"policy_loss": float(policy_loss.detach()), "matching": float(matching.detach().mean())}
        if cfg.kl_beta > 0:
            kl = velocity_deviation(engine, "reference", v, x_t, t, cond, guidance)
            loss = loss + cfg.kl_beta * kl
            logs["kl"] = float(kl.detach())
        if cfg.slow_beta > 0:
            kl_slow = velocity_deviation(engine, "old", v, x_t, t, cond, guidance)
            loss = loss + cfg.slow_beta * kl_slow
            logs["kl_slow"] = float(kl_slow.detach())
        return loss, logs

    def after_update(self, nets, step: int) -> None:
        ema_into_role(nets, "old", old_policy_decay(step, self.config.slow_decay_rate, self.config.slow_decay_max))
