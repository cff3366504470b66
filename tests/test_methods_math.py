"""Hand-computed losses: each method's loss and gradient on a 2-sample toy batch.

The "model" is a tiny linear velocity field v(x, t) = x W^T + t c over 3-dimensional latents. The
expected values are written out here from the formulas in docs (methods.md), in float64, without
calling any helper of the methods; the gradients come from autograd on those independent formulas
(or from a closed form where it is short).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from solbench.method import Chunk, RunInfo, get_method

RUN = RunInfo(prompts_per_iter=1, steps=4)
SIGMAS = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])


class LinearVelocity(nn.Module):
    def __init__(self, w, c):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float32))
        self.c = nn.Parameter(torch.tensor(c, dtype=torch.float32))

    def forward(self, x, t):
        return x @ self.w.T + t[:, None] * self.c


class ToyEngine:
    """Just the engine surface a loss uses: encode and velocity by role."""

    def __init__(self, **nets):
        self.nets = nets

    def encode(self, prompts):
        return None

    def velocity(self, net, x_t, t, cond, guidance=None, *, detach_uncond=False):
        return self.nets[net](x_t, t)


W_POLICY = [[0.9, 0.1, -0.2], [0.05, 1.1, 0.3], [-0.1, 0.2, 0.8]]
C_POLICY = [0.3, -0.2, 0.1]
W_OLD = [[1.0, 0.0, -0.1], [0.0, 1.0, 0.2], [0.0, 0.1, 0.9]]
C_OLD = [0.2, -0.1, 0.0]
W_REF = [[1.1, 0.0, 0.0], [0.1, 0.9, 0.0], [0.0, 0.0, 1.0]]
C_REF = [0.0, 0.1, 0.2]


def toy_engine():
    return ToyEngine(policy=LinearVelocity(W_POLICY, C_POLICY), old=LinearVelocity(W_OLD, C_OLD),
                     reference=LinearVelocity(W_REF, C_REF))


def f64_velocity(w, c, x, t):
    return x @ w.T + t[:, None] * c


def f64_params(requires_grad=False):
    def make(v):
        return torch.tensor(v, dtype=torch.float64, requires_grad=requires_grad)
    return make(W_POLICY), make(C_POLICY)


def f64(v):
    return torch.tensor(v, dtype=torch.float64)


def method_instance(name, **overrides):
    cls = get_method(name)
    return cls(cls.Config(**overrides), RUN)


def assert_loss_and_grad(engine, loss, expected_loss, w64, c64):
    expected_loss.backward()
    loss.backward()
    policy = engine.nets["policy"]
    torch.testing.assert_close(loss.double(), expected_loss.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(policy.w.grad.double(), w64.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(policy.c.grad.double(), c64.grad, rtol=1e-4, atol=1e-6)
    assert policy.w.grad.abs().sum() > 0


X0 = [[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]]
EPS = [[0.3, 0.8, -1.2], [-0.7, 0.4, 1.0]]
T = [0.75, 0.3]


@pytest.mark.parametrize("name", ["diffusion_nft", "sol_rl", "naive_fp4", "naive_scaling"])
def test_nft_loss_and_gradient(name):
    """L = 5 mean[(r |x0+ - x0|^2/w+ + (1-r)|x0- - x0|^2/w-)/beta] + kl_beta |v - v_ref|^2."""
    beta, kl_beta = 0.7, 0.1
    adv = [1.2, -7.0]  # the second is clipped to -5
    method = method_instance(name, beta=beta, kl_beta=kl_beta)
    engine = toy_engine()
    chunk = Chunk(data={"x0": torch.tensor(X0), "t": torch.tensor(T), "eps": torch.tensor(EPS),
                        "advantages": torch.tensor(adv), "prompts": ["a", "a"], "guidance": 1.0},
                  micro_batch=0, n_micro_batches=1, weight=1.0)
    loss, logs = method.loss(engine, chunk)

    w, c = f64_params(requires_grad=True)
    x0, eps, t = f64(X0), f64(EPS), f64(T)
    xt = (1 - t[:, None]) * x0 + t[:, None] * eps
    v = f64_velocity(w, c, xt, t)
    v_old = f64_velocity(f64(W_OLD), f64(C_OLD), xt, t)
    v_ref = f64_velocity(f64(W_REF), f64(C_REF), xt, t)
    r = torch.tensor([1.2 / 10 + 0.5, 0.0], dtype=torch.float64)  # -7 -> -5 -> -0.5 + 0.5 = 0
    x0_pos = xt - t[:, None] * (beta * v + (1 - beta) * v_old)
    x0_neg = xt - t[:, None] * ((1 + beta) * v_old - beta * v)
    w_pos = (x0_pos - x0).abs().mean(1).detach()
    w_neg = (x0_neg - x0).abs().mean(1).detach()
    per_sample = (r * ((x0_pos - x0) ** 2).mean(1) / w_pos + (1 - r) * ((x0_neg - x0) ** 2).mean(1) / w_neg) / beta
    expected = 5.0 * per_sample.mean() + kl_beta * ((v - v_ref) ** 2).mean()

    assert_loss_and_grad(engine, loss, expected, w, c)
    assert logs["kl"] == pytest.approx(float(((v.detach() - v_ref) ** 2).mean()), rel=1e-5)


@pytest.mark.parametrize("advantage_max", [1.0, 0.5])
def test_awm_loss_and_gradient_closed_form(advantage_max):
    """L = mean(A' d) + kl_beta |v - v_ref|^2 + slow_beta |v - v_slow|^2, A' = clip(A, 5) / 5 * advantage_max."""
    kl_beta, slow_beta = 0.01, 0.5
    adv = [2.5, -6.0]
    method = method_instance("awm", kl_beta=kl_beta, slow_beta=slow_beta, advantage_max=advantage_max)
    engine = toy_engine()
    t = [0.6, 0.6]
    chunk = Chunk(data={"x0": torch.tensor(X0), "t": torch.tensor(t), "eps": torch.tensor(EPS),
                        "advantages": torch.tensor(adv), "prompts": ["a", "b"], "guidance": 1.0},
                  micro_batch=0, n_micro_batches=1, weight=1.0)
    loss, _ = method.loss(engine, chunk)

    x0, eps, tt = f64(X0), f64(EPS), f64(t)
    xt = (1 - tt[:, None]) * x0 + tt[:, None] * eps
    w, c = f64_params()
    v = f64_velocity(w, c, xt, tt)
    v_ref = f64_velocity(f64(W_REF), f64(C_REF), xt, tt)
    v_slow = f64_velocity(f64(W_OLD), f64(C_OLD), xt, tt)  # the slow copy is the "old" role
    a = torch.tensor([0.5, -1.0], dtype=torch.float64) * advantage_max
    target = eps - x0
    d = ((v - target) ** 2).mean(1)
    expected = (a * d).mean() + kl_beta * ((v - v_ref) ** 2).mean() + slow_beta * ((v - v_slow) ** 2).mean()
    # d/dv of the loss, per sample and dimension (mean over 2 samples x 3 dims = 1/6):
    dl_dv = (2 / 6) * (a[:, None] * (v - target) + kl_beta * (v - v_ref) + slow_beta * (v - v_slow))
    grad_w = dl_dv.T @ xt
    grad_c = (dl_dv * tt[:, None]).sum(0)

    loss.backward()
    policy = engine.nets["policy"]
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    torch.testing.assert_close(policy.w.grad.double(), grad_w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(policy.c.grad.double(), grad_c, rtol=1e-4, atol=1e-6)


def flowgrpo_mean_std(x, v, t, t_next, a):
    sigma = a * math.sqrt(t / (1 - t))
    dt = t_next - t
    mean = x * (1 + sigma**2 / (2 * t) * dt) + v * (1 + sigma**2 * (1 - t) / (2 * t)) * dt
    return mean, sigma * math.sqrt(-dt), sigma


def gaussian_logp(x, mean, std):
    return (-((x - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean(1)


def test_flow_grpo_loss_and_gradient():
    """PPO clip on exp(logp - logp_old) plus kl_beta |mu - mu_ref|^2 / (2 sigma_t^2), step j = 1."""
    a, clip, kl_beta, j = 0.7, 0.2, 0.04, 1
    t, t_next = 0.75, 0.5
    x = [[0.2, -0.4, 1.0], [0.9, 0.1, -0.6]]
    x_next = [[0.1, -0.2, 0.9], [0.8, 0.2, -0.4]]
    adv = [1.5, 2.0]
    method = method_instance("flow_grpo", noise_level=a, clip_range=clip, kl_beta=kl_beta)
    engine = toy_engine()

    xt, xn = f64(x), f64(x_next)
    tt = torch.full((2,), t, dtype=torch.float64)
    w0, c0 = f64_params()
    mean0, std, _ = flowgrpo_mean_std(xt, f64_velocity(w0, c0, xt, tt), t, t_next, a)
    logp_now = gaussian_logp(xn, mean0, std)
    # sample 0: ratio e^0.1 inside [0.8, 1.2]; sample 1: ratio e^0.5 > 1.2 with A > 0 -> clipped, no gradient
    old = (logp_now - torch.tensor([0.1, 0.5], dtype=torch.float64)).float()

    chunk = Chunk(data={"x": torch.tensor(x), "x_next": torch.tensor(x_next), "j": j, "sigmas": SIGMAS,
                        "old_log_prob": old, "advantages": torch.tensor(adv), "prompts": ["a", "a"],
                        "guidance": None},
                  micro_batch=0, n_micro_batches=1, weight=1.0)
    loss, logs = method.loss(engine, chunk)

    w, c = f64_params(requires_grad=True)
    mean, std, sigma_t = flowgrpo_mean_std(xt, f64_velocity(w, c, xt, tt), t, t_next, a)
    ratio = torch.exp(gaussian_logp(xn, mean, std) - old.double())
    adv64 = f64(adv)
    policy = torch.maximum(-adv64 * ratio, -adv64 * ratio.clamp(1 - clip, 1 + clip)).mean()
    mean_ref, _, _ = flowgrpo_mean_std(xt, f64_velocity(f64(W_REF), f64(C_REF), xt, tt), t, t_next, a)
    kl = (((mean - mean_ref) ** 2).mean(1) / (2 * sigma_t**2)).mean()
    expected = policy + kl_beta * kl

    assert_loss_and_grad(engine, loss, expected, w, c)
    assert logs["clip_frac"] == 0.5
    assert logs["approx_kl"] == pytest.approx(0.5 * (0.1**2 + 0.5**2) / 2, rel=1e-4)
    assert logs["kl"] == pytest.approx(float(kl.detach()), rel=1e-4)
    assert logs["policy_loss"] == pytest.approx(float(policy.detach()), rel=1e-5)


def dance_mean_std(x, v, t, t_next, eta):
    dsigma = t_next - t
    x0_hat = x - t * v
    score = -(x - (1 - t) * x0_hat) / t**2
    return x + dsigma * v - 0.5 * eta**2 * dsigma * score, eta * math.sqrt(-dsigma)


@pytest.mark.parametrize("offsets", [(0.05, 0.05), (0.05, -0.5), (-0.3, 0.05)])
def test_dance_grpo_loss_and_gradient_per_sample_steps(offsets):
    """Each sample at its own step (0 and 2); PPO clip, no KL. Offsets of the old log-probs: both ratios
    inside the clip range; sample 1 at e^0.5 > 1.2 with A > 0 (clipped, no gradient); sample 0 at
    e^0.3 with A < 0 (the unclipped term is the larger loss: it keeps its gradient)."""
    eta, clip = 0.3, 0.2
    steps = [0, 2]
    x = [[0.2, -0.4, 1.0], [0.9, 0.1, -0.6]]
    x_next = [[0.1, -0.2, 0.9], [0.8, 0.2, -0.4]]
    adv = [-1.0, 0.5]
    method = method_instance("dance_grpo", eta=eta, clip_range=clip)
    engine = toy_engine()

    xt, xn = f64(x), f64(x_next)
    tt = f64([float(SIGMAS[s]) for s in steps])
    old = []
    w0, c0 = f64_params()
    v0 = f64_velocity(w0, c0, xt, tt)
    for i, s in enumerate(steps):
        m, sd = dance_mean_std(xt[i:i + 1], v0[i:i + 1], float(SIGMAS[s]), float(SIGMAS[s + 1]), eta)
        old.append(gaussian_logp(xn[i:i + 1], m, sd) + offsets[i])
    old = torch.cat(old).float()

    chunk = Chunk(data={"x": torch.tensor(x), "x_next": torch.tensor(x_next), "steps": steps, "sigmas": SIGMAS,
                        "old_log_prob": old, "advantages": torch.tensor(adv), "prompts": ["a", "b"],
                        "guidance": None},
                  micro_batch=0, n_micro_batches=1, weight=1.0)
    loss, logs = method.loss(engine, chunk)

    w, c = f64_params(requires_grad=True)
    v = f64_velocity(w, c, xt, tt)
    logps = []
    for i, s in enumerate(steps):
        m, sd = dance_mean_std(xt[i:i + 1], v[i:i + 1], float(SIGMAS[s]), float(SIGMAS[s + 1]), eta)
        logps.append(gaussian_logp(xn[i:i + 1], m, sd))
    ratio = torch.exp(torch.cat(logps) - old.double())
    adv64 = f64(adv)
    expected = torch.maximum(-adv64 * ratio, -adv64 * ratio.clamp(1 - clip, 1 + clip)).mean()
    assert_loss_and_grad(engine, loss, expected, w, c)
    log_ratio = -torch.tensor(offsets, dtype=torch.float64)
    assert logs["clip_frac"] == pytest.approx(float((log_ratio.exp() - 1).abs().gt(clip).double().mean()))
    assert logs["approx_kl"] == pytest.approx(float(0.5 * (log_ratio**2).mean()), rel=1e-4)
    assert logs["policy_loss"] == pytest.approx(float(expected.detach()), rel=1e-5)


class FakeNets:
    def __init__(self, **params):
        self.params = params

    def trainable(self, role):
        return self.params[role]


@pytest.mark.parametrize("name,step,decay", [("diffusion_nft", 3, 0.003), ("sol_rl", 900, 0.5), ("awm", 250, 0.25),
                                              ("awm", 400, 0.3)])
def test_old_policy_ema_schedule(name, step, decay):
    """theta_old <- d theta_old + (1 - d) theta with d = min(rate * step, cap)."""
    method = method_instance(name)
    old = [torch.tensor([1.0, 2.0]), torch.tensor([[-1.0]])]
    new = [torch.tensor([3.0, 0.0]), torch.tensor([[1.0]])]
    method.after_update(FakeNets(old=old, policy=new), step)
    torch.testing.assert_close(old[0], torch.tensor([decay * 1 + (1 - decay) * 3, decay * 2]))
    torch.testing.assert_close(old[1], torch.tensor([[-decay + (1 - decay)]]))
