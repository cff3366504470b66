"""Flow-matching samplers: deterministic ODE solvers and the RL methods' SDE samplers with log-probs.

Every sampler integrates from t=1 (noise) to t=0 (data) over a sigma schedule (``ModelAdapter.sigmas``)
given a velocity function v(x, t). Kinds:

- ``euler``: x' = x + (t' - t) v. Deterministic.
- ``dpm2``: multistep DPM-Solver++(2M) in data prediction, as DiffusionNFT's sampler runs it (first
  and last steps DDIM, second order in between, half-logSNR lambda = log((1 - t) / t)). Deterministic.
- ``flowgrpo_sde``: FlowGRPO's SDE, sigma_t = a sqrt(t / (1 - t)) (at t = 1 the schedule's first point
  below 1 replaces t in the denominator, as flow_grpo does), mean
  x (1 + sigma_t^2 dt / (2t)) + v (1 + sigma_t^2 (1 - t) / (2t)) dt, std sigma_t sqrt(-dt).
- ``flowgrpo_cps``: FlowGRPO's coefficients-preserving variant: std = t' sin(a pi / 2),
  mean = (1 - t') x0_hat + sqrt(t'^2 - std^2) x1_hat. Its log-prob is flow_grpo's constant-free
  -mean((x' - mean)^2) (the last step has std 0, where a normalised density does not exist).
- ``dance_sde``: DanceGRPO's SDE: mean = x + dsigma v - 0.5 eta^2 dsigma score,
  score = -(x - (1 - sigma) x0_hat) / sigma^2, std = eta sqrt(-dsigma).
- ``awm_sde``: the stochastic SA-Solver that AWM's reference samples with (data prediction,
  constant tau = noise_level), at first order: with r = exp(-(lambda' - lambda)),
  mean = r^{tau^2} (t'/t) x + (1 - t') (1 - r^{1 + tau^2}) x0_hat, std = t' sqrt(1 - r^{2 tau^2}).
  tau = 0 is DDIM; the last step lands on x0_hat (the reference's "denoise to zero").
- ``sa_solver``: the SA-Solver AWM's reference rolls out with (advantage_weighted_matching
  flow_grpo/diffusers_patch/sa_solver.py as sd3_pipeline_with_logprob.py calls it: data prediction,
  predictor (stochastic Adams-Bashforth) and corrector (Adams-Moulton) of order 2 in PEC mode with the
  few-step correction terms, first corrector skipped, lower orders at the end, last step "denoise to
  zero"; tau(t) = noise_level for 0.3 <= t <= 0.9, else 0; the schedule's first point moved to 1 - 1e-3
  and its second-to-last to half the third-to-last). One velocity per step, like Euler. Deterministic
  when noise_level is 0 (AWM's PickScore config); it has no per-step log-prob.

Stochastic kinds return per-step Gaussian log-probs (float32, averaged over latent dimensions).
``step_log_prob`` recomputes a stored transition's log-prob and mean under any network with exactly
the arithmetic of the rollout, so the on-policy PPO ratio is exactly 1 (the classic FlowGRPO bug is
a recompute that differs from the rollout: other dtype, other guidance, other schedule point).

All state (x, means, log-probs) is float32 whatever the network's dtype; step coefficients are
computed in float64 from the float32 schedule, identically in the rollout and in the recompute.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from solbench.engine.distributed import Gathered, cat_rows, take_rows
from solbench.errors import ConfigError

SAMPLER_KINDS = ("euler", "dpm2", "flowgrpo_sde", "flowgrpo_cps", "dance_sde", "awm_sde", "sa_solver")
STOCHASTIC_KINDS = ("flowgrpo_sde", "flowgrpo_cps", "dance_sde", "awm_sde")

VelocityFn = Callable[[Tensor, Tensor], Tensor]  # (x [B, ...] fp32, t [B] fp32) -> v fp32
NoiseFn = Callable[[int], Tensor]  # step index -> standard normal [B, ...]


@dataclass(frozen=True)
class SamplerSpec:
    """Which sampler, how many steps, and its knobs.

    noise_level: a (FlowGRPO SDE/CPS), eta (DanceGRPO) or tau (AWM's SA-Solver); unused by ODEs.
    guidance: CFG or distilled-guidance scale; None = the model's default, 1.0 = no CFG.
    shift: sigma-schedule shift; None = the model's default.
    """

    kind: str
    steps: int
    noise_level: float = 0.0
    guidance: float | None = None
    shift: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SAMPLER_KINDS:
            close = difflib.get_close_matches(self.kind, SAMPLER_KINDS, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"unknown sampler kind {self.kind!r}{hint} (kinds: {', '.join(SAMPLER_KINDS)})")
        if int(self.steps) != self.steps or self.steps < 1:
            raise ConfigError(f"sampler {self.kind}: steps must be a positive integer, got {self.steps}")
        if self.noise_level < 0:
            raise ConfigError(f"sampler {self.kind}: noise_level must be >= 0, got {self.noise_level}")
        if self.kind in ("flowgrpo_sde", "flowgrpo_cps", "dance_sde") and self.noise_level == 0:
            raise ConfigError(f"sampler {self.kind}: noise_level must be > 0 (its log-probs need a positive std)")
        if self.kind == "flowgrpo_cps" and self.noise_level > 1:
            raise ConfigError(f"sampler flowgrpo_cps: noise_level must be in (0, 1], got {self.noise_level}")
        if self.kind == "sa_solver" and self.steps < 2:
            raise ConfigError(f"sampler sa_solver: needs at least 2 steps (order 2), got {self.steps}")

    @property
    def stochastic(self) -> bool:
        """Whether sampling draws noise (sa_solver only with tau > 0; it has no per-step log-prob)."""
        return self.kind in STOCHASTIC_KINDS or (self.kind == "sa_solver" and self.noise_level > 0)

    def resolved(self, *, guidance: float | None, shift: float | None) -> "SamplerSpec":
        """A copy with guidance/shift filled from the model's defaults where they were None."""
        return replace(self, guidance=self.guidance if self.guidance is not None else guidance,
                       shift=self.shift if self.shift is not None else shift)


class Trajectory:
    """The states a rollout passed through: xs [B, T+1, ...] (xs[:, 0] the noise, xs[:, -1] = x0),
    ts [T+1] the schedule, and for stochastic samplers log_probs [B, T] and means [B, T, ...].

    With several ranks xs, log_probs and means may be spread over the ranks (solbench.engine.distributed
    ShardedRows) and are gathered when read; ``index`` and ``cat`` keep them spread."""

    xs = Gathered()
    log_probs = Gathered()
    means = Gathered()

    def __init__(self, xs, ts: Tensor, log_probs=None, means=None) -> None:
        self.xs, self.ts, self.log_probs, self.means = xs, ts, log_probs, means

    def _stored(self, name: str):
        return self.__dict__[name]  # as stored: not gathered

    def index(self, idx) -> "Trajectory":
        if isinstance(idx, slice):
            idx = torch.arange(len(self._stored("xs")))[idx]
        pos = torch.as_tensor(idx)
        pos = (pos.nonzero().flatten() if pos.dtype == torch.bool else pos.long()).cpu()
        return Trajectory(*(take_rows(self._stored(name), pos) if name != "ts" else self.ts
                            for name in ("xs", "ts", "log_probs", "means")))

    @classmethod
    def cat(cls, trajectories: Sequence["Trajectory"]) -> "Trajectory":
        first = trajectories[0]
        for tr in trajectories[1:]:
            if not torch.equal(tr.ts, first.ts):
                raise ValueError("Trajectory.cat: trajectories have different schedules")
        return cls(*(cat_rows([tr._stored(name) for tr in trajectories]) if name != "ts" else first.ts
                     for name in ("xs", "ts", "log_probs", "means")))

    def __repr__(self) -> str:
        return f"Trajectory(rows={len(self._stored('xs'))}, steps={self.ts.shape[0] - 1})"


@dataclass
class StepLogProb:
    """A transition x_j -> x_{j+1} under a network: log-prob [B] (fp32), mean [B, ...], std (scalar)."""

    log_prob: Tensor
    mean: Tensor
    std: float


# --- one transition ----------------------------------------------------------------------------
def _schedule_point(sigmas: Tensor, j: int) -> tuple[float, float]:
    return float(sigmas[j]), float(sigmas[j + 1])


def transition(kind: str, x: Tensor, v: Tensor, sigmas: Tensor, j: int, noise_level: float) -> tuple[Tensor, float]:
    """Mean (fp32, shape of x) and std (float) of the stochastic step j of ``kind`` from (x, v)."""
    t, t_next = _schedule_point(sigmas, j)
    x = x.float()
    v = v.float()
    a = float(noise_level)
    if kind == "flowgrpo_sde":
        dt = t_next - t
        t_guard = float(sigmas[1]) if t == 1.0 else t  # sigma_t is infinite at t = 1: flow_grpo's guard
        sigma_t = math.sqrt(t / (1 - t_guard)) * a
        mean = x * (1 + sigma_t**2 / (2 * t) * dt) + v * ((1 + sigma_t**2 * (1 - t) / (2 * t)) * dt)
        return mean, sigma_t * math.sqrt(-dt)
    if kind == "flowgrpo_cps":
        std = t_next * math.sin(a * math.pi / 2)
        x0_hat = x - t * v
        x1_hat = x + (1 - t) * v
        return (1 - t_next) * x0_hat + math.sqrt(max(t_next**2 - std**2, 0.0)) * x1_hat, std
    if kind == "dance_sde":
        dsigma = t_next - t
        x0_hat = x - t * v
        score = -(x - (1 - t) * x0_hat) / t**2
        mean = x + dsigma * v + (-0.5 * a**2 * dsigma) * score
        return mean, a * math.sqrt(-dsigma)
    if kind == "awm_sde":
        # r = exp(-h), h the half-logSNR step; written without logs so t = 1 and t' = 0 are exact.
        r = (t_next * (1 - t)) / (t * (1 - t_next)) if t_next < 1 else 1.0
        x0_hat = x - t * v
        tau2 = a * a
        mean = (r**tau2 * t_next / t) * x + ((1 - t_next) * (1 - r ** (1 + tau2))) * x0_hat
        return mean, t_next * math.sqrt(max(1 - r ** (2 * tau2), 0.0))
    raise ConfigError(f"sampler kind {kind!r} has no stochastic transition (stochastic kinds: {', '.join(STOCHASTIC_KINDS)})")


def gaussian_log_prob(x_next: Tensor, mean: Tensor, std: float) -> Tensor:
    """log N(x_next; mean, std^2 I) averaged over all but the batch dimension, float32.

    A zero std (a deterministic step, e.g. AWM's last step) has log-prob 0 by convention.
    """
    diff = x_next.float() - mean.float()
    if std == 0:
        return torch.zeros(diff.shape[0], dtype=torch.float32, device=diff.device)
    lp = -(diff**2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return lp.mean(dim=tuple(range(1, lp.ndim)))


def transition_log_prob(kind: str, x_next: Tensor, mean: Tensor, std: float) -> Tensor:
    if kind == "flowgrpo_cps":  # flow_grpo's constant-free CPS log-prob
        diff = x_next.float() - mean.float()
        return -(diff**2).mean(dim=tuple(range(1, diff.ndim)))
    return gaussian_log_prob(x_next, mean, std)


def step_log_prob(kind: str, x: Tensor, v: Tensor, sigmas: Tensor, j: int, x_next: Tensor,
                  noise_level: float) -> StepLogProb:
    """Log-prob of a stored transition x -> x_next at step j given a velocity v (any network's).

    Same arithmetic as the rollout, so recomputing with the rollout's own network returns the
    rollout's log-prob bit for bit.
    """
    mean, std = transition(kind, x, v, sigmas, j, noise_level)
    return StepLogProb(transition_log_prob(kind, x_next, mean, std), mean, std)


# --- deterministic steps ----------------------------------------------------------------------
def _half_log_snr(t: float) -> float:
    if t <= 0:
        return math.inf
    if t >= 1:
        return -math.inf
    return math.log((1 - t) / t)


def _ddim(x: Tensor, x0_hat: Tensor, t: float, t_next: float) -> Tensor:
    eps_hat = (x - (1 - t) * x0_hat) / t
    return (1 - t_next) * x0_hat + t_next * eps_hat


def _dpm2_step(x: Tensor, x0_hat: Tensor, prev_x0_hat: Tensor | None, sigmas: Tensor, j: int) -> Tensor:
    """DPM-Solver++(2M) step j as DiffusionNFT's solver (order 2): DDIM on the first and last steps."""
    t, t_next = _schedule_point(sigmas, j)
    last = j == len(sigmas) - 2
    if j == 0 or last or prev_x0_hat is None:
        return _ddim(x, x0_hat, t, t_next)
    lam_t, lam_next, lam_prev = _half_log_snr(t), _half_log_snr(t_next), _half_log_snr(float(sigmas[j - 1]))
    h = lam_next - lam_t
    h_prev = lam_t - lam_prev
    c1 = h / h_prev  # 1 / r0; zero when the previous point is t = 1 (lambda = -inf)
    phi = (1 - t_next) * math.expm1(-h)  # alpha_t' (exp(-h) - 1)
    return (t_next / t) * x - phi * x0_hat - 0.5 * phi * c1 * (x0_hat - prev_x0_hat)


# --- AWM's SA-Solver -------------------------------------------------------------------------------
SA_SOLVER_TAU_WINDOW = (0.3, 0.9)  # tau(t) = noise_level inside, 0 outside (sd3_pipeline_with_logprob.py)


def sa_solver_times(sigmas: Tensor) -> list[float]:
    """The times the reference's SA-Solver steps through: the schedule (float32) with its second-to-last
    point set to half the third-to-last, then its first point to 1 - 1e-3 (so the half-logSNR is finite)."""
    t = sigmas.to(torch.float32).clone()
    t[-2] = t[-3] / 2
    t[0] = 1 - 1e-3
    return [float(v) for v in t]


def _exp_moments(c: float, lam_start: float, lam_end: float) -> tuple[float, float]:
    """(int e^{c l} dl, int l e^{c l} dl) over [lam_start, lam_end]."""
    def antiderivatives(lam: float) -> tuple[float, float]:
        e = math.exp(c * lam)
        return e / c, e * (c * lam - 1) / (c * c)

    (a0, a1), (b0, b1) = antiderivatives(lam_start), antiderivatives(lam_end)
    return b0 - a0, b1 - a1


def _sa_coefficients(nodes: Sequence[float], lam_prev: float, lam_t: float, tau: float) -> list[float]:
    """c_k = int_{lam_prev}^{lam_t} e^{(1 + tau^2) l} L_k(l) dl for the Lagrange basis L_k of the
    (at most two) nodes: the weights of the data predictions in an SA-Solver step."""
    c = 1 + tau * tau
    m0, m1 = _exp_moments(c, lam_prev, lam_t)
    if len(nodes) == 1:
        return [m0]
    a, b = nodes
    return [(m1 - b * m0) / (a - b), (m1 - a * m0) / (b - a)]


def _sa_step(x: Tensor, d_values: Sequence[Tensor], nodes: Sequence[float], t_prev: float, t: float, tau: float,
             noise: Tensor | None, few_step_term: float) -> Tensor:
    """One SA-Solver update from x at t_prev to t with data predictions ``d_values`` at half-logSNRs
    ``nodes`` (newest first); ``few_step_term`` is added to the first weight and taken from the second
    (the order-2 correction the reference applies for few-step sampling)."""
    lam_prev, lam_t = _half_log_snr(t_prev), _half_log_snr(t)
    h = lam_t - lam_prev
    weights = _sa_coefficients(nodes, lam_prev, lam_t, tau)
    if len(weights) == 2:
        weights = [weights[0] + few_step_term, weights[1] - few_step_term]
    tau2 = tau * tau
    scale = (1 + tau2) * t * math.exp(-tau2 * lam_t)
    out = (math.exp(-tau2 * h) * t / t_prev) * x
    for w, d in zip(weights, d_values):
        out = out + (scale * w) * d
    if tau > 0 and noise is not None:
        out = out + (t * math.sqrt(-math.expm1(-2 * tau2 * h))) * noise
    return out


def _sa_few_step_terms(lam_prev: float, lam_t: float, lam_prev2: float, tau: float) -> tuple[float, float]:
    """The order-2 few-step corrections (predictor, corrector) of a step from lam_prev to lam_t."""
    c = 1 + tau * tau
    h = lam_t - lam_prev
    inner = h * c - 1 + math.exp(-c * h)
    grow = math.exp(c * lam_t)
    return grow * (h * h / 2 - inner / (c * c)) / (lam_prev - lam_prev2), grow * (h / 2 - inner / (c * c * h))


def _sa_solver_sample(velocity: VelocityFn, x: Tensor, sigmas: Tensor, spec: SamplerSpec,
                      noise: NoiseFn | None, xs: list[Tensor] | None) -> Tensor:
    """AWM's SA-Solver (predictor order 2, corrector order 2, PEC) from t ~ 1 to t = 0 (module docstring)."""
    times = sa_solver_times(sigmas)
    steps = len(times) - 1
    batch = x.shape[0]

    def data_prediction(z: Tensor, t: float) -> Tensor:
        t_row = torch.full((batch,), t, dtype=torch.float32, device=z.device)
        return z - t * velocity(z, t_row).float()

    def tau_at(t: float) -> float:
        low, high = SA_SOLVER_TAU_WINDOW
        return spec.noise_level if low <= t <= high else 0.0

    d_prev = [data_prediction(x, times[0])]  # oldest first
    t_prev = [times[0]]
    for step in range(1, steps + 1):
        t = times[step]
        draw = noise(step - 1).to(device=x.device, dtype=torch.float32) if spec.stochastic else None
        if step == steps:  # denoise to zero: the last data prediction is the sample
            x = d_prev[-1]
        else:
            tau = tau_at(t)
            lam_prev, lam_t = _half_log_snr(t_prev[-1]), _half_log_snr(t)
            order = 1 if step == 1 else 2
            nodes = [_half_log_snr(v) for v in reversed(t_prev[-order:])]
            predictor_term, corrector_term = (
                _sa_few_step_terms(lam_prev, lam_t, _half_log_snr(t_prev[-2]), tau) if order == 2 else (0.0, 0.0))
            x_p = _sa_step(x, list(reversed(d_prev[-order:])), nodes, t_prev[-1], t, tau, draw, predictor_term)
            d_new = data_prediction(x_p, t)
            if step == 1:  # the first corrector is skipped
                x = x_p
            else:
                x = _sa_step(x, [d_new, d_prev[-1]], [lam_t, lam_prev], t_prev[-1], t, tau, draw, corrector_term)
            d_prev = (d_prev + [d_new])[-2:]
        t_prev.append(t)
        if xs is not None:
            xs.append(x)
    return x


# --- the sampling loop ---------------------------------------------------------------------------
def sample(velocity: VelocityFn, x_init: Tensor, sigmas: Tensor, spec: SamplerSpec, *,
           noise: NoiseFn | None = None, keep_trajectory: bool = False) -> tuple[Tensor, Trajectory | None]:
    """Integrate from x_init (t = sigmas[0] = 1) to t = 0. Returns (x0 fp32, trajectory or None).

    ``noise(j)`` supplies the standard-normal draw of stochastic step j (solbench.engine.noise.step_noise
    keyed by candidate, so that stochastic rollouts are reproducible too).
    """
    steps = len(sigmas) - 1
    if steps != spec.steps:
        raise ValueError(f"schedule has {steps} steps but the sampler spec asks for {spec.steps}")
    if spec.stochastic and noise is None:
        raise ValueError(f"sampler {spec.kind} is stochastic: pass noise=")
    sigmas = sigmas.to(torch.float32)
    x = x_init.to(torch.float32)
    if spec.kind == "sa_solver":
        xs = [x] if keep_trajectory else None
        x = _sa_solver_sample(velocity, x, sigmas, spec, noise, xs)
        if not keep_trajectory:
            return x, None
        return x, Trajectory(xs=torch.stack(xs, dim=1), ts=torch.tensor(sa_solver_times(sigmas)))
    batch = x.shape[0]
    t_batch = sigmas.to(x.device)[:, None].expand(-1, batch)  # one [B] row per step, made once
    xs = [x] if keep_trajectory else None
    log_probs: list[Tensor] = []
    means: list[Tensor] = []
    prev_x0_hat = None
    for j in range(steps):
        v = velocity(x, t_batch[j]).float()
        t, t_next = _schedule_point(sigmas, j)
        if spec.kind == "euler":
            x = x + (t_next - t) * v
        elif spec.kind == "dpm2":
            x0_hat = x - t * v
            x = _dpm2_step(x, x0_hat, prev_x0_hat, sigmas, j)
            prev_x0_hat = x0_hat
        else:
            mean, std = transition(spec.kind, x, v, sigmas, j, spec.noise_level)
            x = mean + std * noise(j).to(device=mean.device, dtype=torch.float32) if std > 0 else mean
            log_probs.append(transition_log_prob(spec.kind, x, mean, std))
            if keep_trajectory:
                means.append(mean)
        if keep_trajectory:
            xs.append(x)
    if not keep_trajectory:
        return x, None
    return x, Trajectory(
        xs=torch.stack(xs, dim=1),
        ts=sigmas.clone(),
        log_probs=torch.stack(log_probs, dim=1) if log_probs else None,
        means=torch.stack(means, dim=1) if means else None,
    )
