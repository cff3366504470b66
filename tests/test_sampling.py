"""Samplers against closed forms, hand-computed densities and the diffusers schedule."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from solbench.engine import sampling
from solbench.errors import ConfigError
from solbench.models.base import shifted_sigmas
from solbench.engine.noise import step_noise
from solbench.engine.sampling import SamplerSpec, sample, step_log_prob, transition


def gaussian_data_velocity(mu: float, s: float):
    """Exact probability-flow velocity for data x0 ~ N(mu, s^2) and eps ~ N(0, 1)."""

    def velocity(x, t):
        t = t.reshape(-1, *([1] * (x.ndim - 1))).double()
        var = (1 - t) ** 2 * s**2 + t**2
        return (-mu + (t - (1 - t) * s**2) / var * (x.double() - (1 - t) * mu)).float()

    return velocity


def noise_for(seeds, shape):
    return lambda j: step_noise(seeds, j, shape)


def test_euler_on_a_linear_field_matches_its_closed_form():
    lam, b = 0.7, -0.3
    sigmas = shifted_sigmas(6, shift=3.0)
    x1 = torch.tensor([[1.5], [-0.25]])
    x0, _ = sample(lambda x, t: lam * x + b, x1, sigmas, SamplerSpec("euler", 6))
    for row in range(2):  # x_{j+1} = (1 + lam dt_j) x_j + b dt_j, in float64 by hand
        x = float(x1[row, 0])
        for j in range(6):
            dt = float(sigmas[j + 1]) - float(sigmas[j])
            x = (1 + lam * dt) * x + b * dt
        assert x0[row, 0].item() == pytest.approx(x, rel=1e-6, abs=1e-6)


def test_euler_converges_to_the_exact_flow_at_first_order():
    mu, s = 0.8, 0.3
    eps = torch.linspace(-2, 2, 9)[:, None]
    exact = mu + s * eps  # the probability-flow ODE maps eps to mu + s eps
    errors = []
    for steps in (8, 16, 32):
        x0, _ = sample(gaussian_data_velocity(mu, s), eps, shifted_sigmas(steps), SamplerSpec("euler", steps))
        errors.append((x0 - exact).abs().max().item())
    assert errors[0] > errors[1] > errors[2]
    assert math.log2(errors[1] / errors[2]) == pytest.approx(1.0, abs=0.2)


@pytest.mark.parametrize("steps,shift", [(6, 1.0), (10, 3.0)])
def test_dpm2_matches_diffusers_dpm_solver_pp_2m(steps, shift):
    """Oracle: diffusers' DPMSolverMultistepScheduler (dpmsolver++, order 2, flow prediction, final
    step to sigma 0 at first order), driven on the same sigma schedule."""
    from diffusers import DPMSolverMultistepScheduler

    sigmas = shifted_sigmas(steps, shift)
    scheduler = DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2,
                                            prediction_type="flow_prediction", use_flow_sigmas=True,
                                            flow_shift=shift, final_sigmas_type="zero", lower_order_final=True)
    scheduler.set_timesteps(steps)
    scheduler.sigmas, scheduler.timesteps = sigmas.clone(), sigmas[:-1] * 1000
    velocity = gaussian_data_velocity(0.8, 0.3)
    eps = torch.linspace(-2, 2, 9)[:, None]
    ours, _ = sample(velocity, eps, sigmas, SamplerSpec("dpm2", steps))
    x = eps.clone()
    for j in range(steps):
        x = scheduler.step(velocity(x, sigmas[j].expand(9)), scheduler.timesteps[j], x).prev_sample
    torch.testing.assert_close(ours, x, rtol=1e-6, atol=1e-6)
    euler, _ = sample(velocity, eps, sigmas, SamplerSpec("euler", steps))
    assert not torch.allclose(ours, euler, atol=1e-3)  # second-order steps really ran


def test_flowgrpo_sde_log_prob_is_the_hand_computed_gaussian_density():
    a = 0.7
    sigmas = torch.tensor([1.0, 0.6, 0.0])
    x = torch.tensor([[0.5, -1.0]])
    v = torch.tensor([[0.2, 0.4]])
    x_next = torch.tensor([[0.1, 0.2]])
    xn, xv, xx = x.double().numpy(), v.double().numpy(), x_next.double().numpy()
    for j, t, t_next, t_guard in ((0, 1.0, 0.6, 0.6), (1, 0.6, 0.0, 0.6)):
        sig = a * math.sqrt(t / (1 - t_guard)) if t == 1.0 else a * math.sqrt(t / (1 - t))
        dt = t_next - t
        mean = xn * (1 + sig**2 / (2 * t) * dt) + xv * (1 + sig**2 * (1 - t) / (2 * t)) * dt
        std = sig * math.sqrt(-dt)
        expected = norm.logpdf(xx, mean, std).mean()
        got = step_log_prob("flowgrpo_sde", x, v, sigmas, j, x_next, a)
        assert got.std == pytest.approx(std, rel=1e-6)
        np.testing.assert_allclose(got.mean.numpy(), mean, rtol=1e-6)
        assert got.log_prob.item() == pytest.approx(expected, rel=1e-5)


def test_dance_and_awm_log_probs_are_gaussian_densities():
    sigmas = torch.tensor([1.0, 0.5, 0.0])
    x = torch.tensor([[0.3, -0.7, 1.1]])
    v = torch.tensor([[0.9, -0.2, 0.5]])
    x_next = torch.tensor([[0.2, -0.5, 0.6]])
    xn, vn, xx = (a.double().numpy() for a in (x, v, x_next))
    eta, t, t_next = 0.3, 0.5, 0.0
    x0_hat = xn - t * vn
    score = -(xn - (1 - t) * x0_hat) / t**2
    mean = xn + (t_next - t) * vn - 0.5 * eta**2 * (t_next - t) * score
    got = step_log_prob("dance_sde", x, v, sigmas, 1, x_next, eta)
    assert got.log_prob.item() == pytest.approx(norm.logpdf(xx, mean, eta * math.sqrt(t - t_next)).mean(), rel=1e-5)

    tau, t, t_next = 0.6, 1.0, 0.5  # first AWM step: r = 0, the state is forgotten
    got = step_log_prob("awm_sde", x, v, sigmas, 0, x_next, tau)
    x0_hat = xn - t * vn
    mean = (1 - t_next) * x0_hat
    std = t_next
    np.testing.assert_allclose(got.mean.numpy(), mean, rtol=1e-6)
    assert got.log_prob.item() == pytest.approx(norm.logpdf(xx, mean, std).mean(), rel=1e-5)


def test_awm_with_tau_zero_is_ddim_and_lands_on_x0_hat():
    sigmas = shifted_sigmas(4)
    velocity = gaussian_data_velocity(0.5, 0.4)
    eps = torch.linspace(-1, 1, 5)[:, None]
    awm0, _ = sample(velocity, eps, sigmas, SamplerSpec("awm_sde", 4, 0.0), noise=noise_for([1] * 5, (1,)))
    euler, _ = sample(velocity, eps, sigmas, SamplerSpec("euler", 4))
    torch.testing.assert_close(awm0, euler, rtol=1e-5, atol=1e-6)  # DDIM == Euler for flow matching


@pytest.mark.parametrize("kind,level", [("flowgrpo_sde", 0.7), ("flowgrpo_cps", 0.3), ("dance_sde", 0.3),
                                        ("awm_sde", 0.7)])
def test_sde_samplers_reach_the_data_distribution(kind, level):
    mu, s, n, steps = 0.8, 0.3, 4000, 40
    eps = torch.randn(n, 1, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    draws = [torch.randn(n, 1, generator=gen) for _ in range(steps)]
    x0, traj = sample(gaussian_data_velocity(mu, s), eps, shifted_sigmas(steps), SamplerSpec(kind, steps, level),
                      noise=lambda j: draws[j], keep_trajectory=True)
    assert x0.mean().item() == pytest.approx(mu, abs=0.03)
    assert x0.std().item() == pytest.approx(s, rel=0.12)
    assert traj.xs.shape == (n, steps + 1, 1) and traj.log_probs.shape == (n, steps)
    assert traj.means.shape == (n, steps, 1) and traj.log_probs.dtype == torch.float32
    assert torch.isfinite(traj.log_probs).all()


@pytest.mark.parametrize("kind,level", [("flowgrpo_sde", 0.7), ("flowgrpo_cps", 0.5), ("dance_sde", 0.3),
                                        ("awm_sde", 0.5)])
def test_stored_log_probs_recompute_exactly(kind, level):
    velocity = gaussian_data_velocity(0.2, 0.5)
    sigmas = shifted_sigmas(5, shift=3.0)
    eps = torch.randn(6, 2, 3)
    _, traj = sample(velocity, eps, sigmas, SamplerSpec(kind, 5, level), noise=noise_for(range(6), (2, 3)),
                     keep_trajectory=True)
    for j in range(5):
        x = traj.xs[:, j]
        v = velocity(x, traj.ts[j].expand(6))
        got = step_log_prob(kind, x, v, traj.ts, j, traj.xs[:, j + 1], level)
        assert torch.equal(got.log_prob, traj.log_probs[:, j])
        assert torch.equal(got.mean, traj.means[:, j])


def test_cps_log_prob_is_flow_grpos_constant_free_form():
    sigmas = torch.tensor([1.0, 0.5, 0.0])
    x, v, x_next = torch.tensor([[0.3, 0.1]]), torch.tensor([[0.2, -0.4]]), torch.tensor([[0.0, 0.5]])
    mean, std = transition("flowgrpo_cps", x, v, sigmas, 0, 0.5)
    assert std == pytest.approx(0.5 * math.sin(0.25 * math.pi))
    got = step_log_prob("flowgrpo_cps", x, v, sigmas, 0, x_next, 0.5)
    assert got.log_prob.item() == pytest.approx(-((x_next - mean) ** 2).mean().item())
    assert transition("flowgrpo_cps", x, v, sigmas, 1, 0.5)[1] == 0.0  # last step is deterministic


def test_deterministic_samplers_keep_trajectories_without_log_probs():
    _, traj = sample(lambda x, t: x, torch.ones(2, 3), shifted_sigmas(3), SamplerSpec("euler", 3), keep_trajectory=True)
    assert traj.xs.shape == (2, 4, 3) and traj.log_probs is None and traj.means is None
    assert torch.equal(traj.xs[:, 0], torch.ones(2, 3))
    sub = traj.index([1])
    assert sub.xs.shape == (1, 4, 3)
    both = sampling.Trajectory.cat([sub, sub])
    assert both.xs.shape == (2, 4, 3)


def test_sampler_spec_validation():
    with pytest.raises(ConfigError, match="did you mean flowgrpo_sde"):
        SamplerSpec("flowgrpo_sd", 10, 0.7)
    with pytest.raises(ConfigError, match="noise_level must be > 0"):
        SamplerSpec("dance_sde", 10)
    with pytest.raises(ConfigError, match="steps"):
        SamplerSpec("euler", 0)
    with pytest.raises(ValueError, match="stochastic"):
        sample(lambda x, t: x, torch.ones(1, 2), shifted_sigmas(2), SamplerSpec("dance_sde", 2, 0.3))
    spec = SamplerSpec("euler", 4).resolved(guidance=3.5, shift=3.0)
    assert (spec.guidance, spec.shift) == (3.5, 3.0)
    assert SamplerSpec("euler", 4, guidance=1.0).resolved(guidance=3.5, shift=None).guidance == 1.0


@pytest.mark.parametrize("steps,shift,mu", [(10, 3.0, None), (6, None, 0.9), (28, 1.0, None)])
def test_shifted_sigmas_match_diffusers_flow_match_scheduler(steps, shift, mu):
    from diffusers import FlowMatchEulerDiscreteScheduler

    if mu is None:
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps))
        ours = shifted_sigmas(steps, shift)
    else:  # FLUX.1-dev: resolution-dependent mu, exponential time shift
        scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        ours = shifted_sigmas(steps, math.exp(mu))
    torch.testing.assert_close(ours, scheduler.sigmas.float(), rtol=1e-6, atol=1e-6)
    assert ours[0] == 1 and ours[-1] == 0
