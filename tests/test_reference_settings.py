"""Settings and numerics issue 23 brought to the references' values, each with the bug it catches.

- AWM's SA-Solver sampler (solbench.engine.sampling "sa_solver") against the exact flow of Gaussian data;
- the public code's explore format (TE DelayedScaling(Format.E2M1) = per-tensor FP8 E5M2) against
  torch's float8_e5m2 cast, and the recipes that pair it with each model's layer selection;
- nvfp4_sd3, the reference's SD3 layer selection;
- LoRA's gaussian init and the model defaults the trainer resolves;
- the evaluation EMA's schedule (flow_grpo updates every 8 optimizer steps);
- CFG's detached unconditional branch (flow_grpo's loss gradient);
- AWM's generalised-Huber weighting (issue 41) against the reference's exp_first formula;
- the evaluation protocol (issue 41): what the trainer evaluates with, at the protocol's resolution;
- settings added here keep every earlier run id at their defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from solbench import quant
from solbench.config import FinetuneConfig, ModelConfig, RunConfig
from solbench.models.base import shifted_sigmas
from solbench.engine.sampling import SamplerSpec, sample

import _tiny_config as tiny_config

# -- AWM's SA-Solver --------------------------------------------------------------------------------
M, S = 0.7, 0.5  # data x0 ~ N(M, S^2): the flow ODE maps x1 = eps to x0 = M + S eps exactly


def gaussian_velocity(x, t):
    """The exact velocity E[eps - x0 | x_t] for Gaussian data (x_t = (1 - t) x0 + t eps)."""
    t = t[:, None].double()
    a, xd = 1 - t, x.double()
    var = a * a * S * S + t * t
    return (t * (xd - a * M) / var - (M + a * S * S * (xd - a * M) / var)).float()


def test_sa_solver_is_accurate_where_euler_is_not_on_the_awm_schedule():
    """Catches (issue 23): AWM rolling out with a first-order sampler where the reference runs an
    order-2 predictor-corrector SA-Solver (14 steps at SD3's shift 3, its PickScore config)."""
    x1 = torch.randn(4000, 1, generator=torch.Generator().manual_seed(0))
    sigmas = shifted_sigmas(14, 3.0)
    errors = {kind: float((sample(gaussian_velocity, x1, sigmas, SamplerSpec(kind, 14))[0] - (M + S * x1)).abs().max())
              for kind in ("euler", "dpm2", "sa_solver")}
    assert errors["sa_solver"] < 5e-3 and errors["euler"] > 0.3 and errors["dpm2"] > 0.1, errors


def test_sa_solver_first_step_is_ddim_from_its_moved_start_and_the_last_lands_on_x0_hat():
    """The reference moves the first point to 1 - 1e-3 and the second-to-last to half the third-to-last;
    with tau = 0 its first (order-1 predictor, no corrector) step is DDIM, its last returns the last data
    prediction."""
    from solbench.engine.sampling import sa_solver_times

    sigmas = shifted_sigmas(6, 3.0)
    times = sa_solver_times(sigmas)
    assert times[0] == pytest.approx(0.999) and times[-2] == pytest.approx(float(sigmas[-3]) / 2) and times[-1] == 0
    x1 = torch.randn(5, 1, generator=torch.Generator().manual_seed(1))
    x0, traj = sample(gaussian_velocity, x1, sigmas, SamplerSpec("sa_solver", 6), keep_trajectory=True)
    t0, t1 = times[0], times[1]
    d0 = x1 - t0 * gaussian_velocity(x1, torch.full((5,), t0))
    torch.testing.assert_close(traj.xs[:, 1], (t1 / t0) * x1 + (1 - t1 - t1 * (1 - t0) / t0) * d0, rtol=1e-5, atol=1e-6)
    assert traj.xs.shape[1] == 7 and torch.equal(traj.xs[:, -1], x0)


def test_sa_solver_noise_acts_only_inside_its_tau_window_and_keeps_the_marginals():
    """tau(t) = noise_level for 0.3 <= t <= 0.9 and 0 elsewhere (sd3_pipeline_with_logprob.py): noise
    drawn for a step outside the window changes nothing; the stochastic solver keeps x0 ~ N(M, S^2)."""
    from solbench.engine.sampling import sa_solver_times

    steps = 10
    sigmas = shifted_sigmas(steps, 3.0)
    times = sa_solver_times(sigmas)
    x1 = torch.randn(20000, 1, generator=torch.Generator().manual_seed(2))
    zeros = [torch.zeros_like(x1) for _ in range(steps)]
    spec = SamplerSpec("sa_solver", steps, noise_level=0.5)
    base, _ = sample(gaussian_velocity, x1, sigmas, spec, noise=lambda j: zeros[j])
    for j in range(steps - 1):
        bumped = [z if i != j else torch.ones_like(x1) for i, z in enumerate(zeros)]
        moved, _ = sample(gaussian_velocity, x1, sigmas, spec, noise=lambda i: bumped[i])
        assert torch.equal(moved, base) == (not 0.3 <= times[j + 1] <= 0.9), j
    gen = torch.Generator().manual_seed(3)
    draws = [torch.randn(20000, 1, generator=gen) for _ in range(steps)]
    x0, _ = sample(gaussian_velocity, x1, sigmas, spec, noise=lambda j: draws[j])
    assert abs(float(x0.mean()) - M) < 0.02 and abs(float(x0.std()) / S - 1) < 0.1


# -- the public code's explore format ---------------------------------------------------------------
def test_fp8_e5m2_rounds_as_torchs_float8_e5m2_cast_with_the_57344_over_amax_scale():
    """The format TE's DelayedScaling(fp8_format=Format.E2M1) runs: E5M2 elements (get_fp8_te_dtype)
    with fp8_max 57344 (get_fp8_max); oracle: torch's round-to-nearest-even float8_e5m2 cast."""
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(4)) * torch.logspace(-3, 1, 48)
    scale = 57344.0 / x.abs().max()
    expected = (x * scale).to(torch.float8_e5m2).float() * torch.reciprocal(scale)
    got = quant.fake_quantize(x, "fp8_e5m2")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert got.dtype == torch.float32 and (got != x).any()
    assert torch.equal(quant.fake_quantize(torch.zeros(3, 16), "fp8_e5m2"), torch.zeros(3, 16))
    with pytest.raises(quant.NonFiniteError):
        quant.fake_quantize(torch.tensor([[1.0, float("nan")]]), "fp8_e5m2")


@pytest.mark.parametrize("model", ["flux", "sd3", "sana"])
def test_public_code_recipes_run_e5m2_on_the_layers_of_the_papers_recipe(model):
    """Beside the paper's NVFP4 (nvfp4_<model>), te_delayed_e2m1_<model> is what the public code
    computes: the same layer selection, per-tensor FP8 E5M2 weights and activations."""
    paper, public = quant.get_recipe(f"nvfp4_{model}"), quant.get_recipe(f"te_delayed_e2m1_{model}")
    assert (public.format, public.activations, public.weight_block) == ("fp8_e5m2", True, None)
    assert (public.skip, public.min_dim, public.min_dim_exempt) == (paper.skip, paper.min_dim, paper.min_dim_exempt)
    layer = torch.nn.Linear(32, 32)
    copy = quant.quantized_copy(torch.nn.Sequential(layer), public.replace(min_dim=0))
    torch.testing.assert_close(copy[0].weight, quant.fake_quantize(layer.weight.detach(), "fp8_e5m2"))


# -- nvfp4_sd3 -----------------------------------------------------------------------------------------
def test_nvfp4_sd3_quantizes_only_the_image_streams_feed_forward():
    """Catches (issue 23): SD3.5 exploring with FLUX's rule (every layer of the 2432-wide MMDiT above 1000
    features) where configs/sol_rl/sd3.py skips pos_embed, context_embedder, time_text_embed, norm_out,
    norm1 (a substring: norm1_context too) and ff_context, at min_dim 2432. Tiny SD3 at width 32: the
    recipe at min_dim 32, its skips unchanged."""
    from diffusers import SD3Transformer2DModel

    net = SD3Transformer2DModel(sample_size=16, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
                                num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                pooled_projection_dim=32, out_channels=4)
    rows = quant.quantization_summary(quant.quantized_copy(net, quant.get_recipe("nvfp4_sd3").replace(min_dim=32)))
    assert {r.name for r in rows if r.quantized} == {f"transformer_blocks.{i}.ff.net.{n}"
                                                    for i in range(2) for n in ("0.proj", "2")}
    reasons = {r.name: r.reason for r in rows}
    assert "skip pattern '*norm1*'" in reasons["transformer_blocks.0.norm1_context.linear"]
    assert "skip pattern '*ff_context*'" in reasons["transformer_blocks.0.ff_context.net.2"]
    assert "min_dim" in reasons["transformer_blocks.0.attn.to_q"]


# -- LoRA init ------------------------------------------------------------------------------------------
def lora_a(nets):
    return torch.cat([p.detach().flatten() for name, p in nets.policy.named_parameters() if "lora_A.default" in name])


def test_lora_init_gaussian_draws_a_with_std_one_over_rank_and_real_models_default_to_it():
    """Catches (issue 23): LoRA started from PEFT's Kaiming-uniform A (about 3x smaller at rank 32),
    where every reference passes init_lora_weights="gaussian" (A ~ N(0, 1/r)); the tiny model keeps
    PEFT's default (its shipped results were made with it)."""
    from solbench.models import build_adapter, default_lora_init
    from solbench.train.trainer import build_policy_nets

    assert [default_lora_init(m) for m in ("flux", "sd3", "sana", "tiny")] == ["gaussian"] * 3 + ["kaiming"]
    rank = 8

    def nets_for(model_name, lora_init=None):
        adapter = build_adapter(ModelConfig(path="random"))
        cfg = RunConfig(model=ModelConfig(name=model_name),
                        finetune=FinetuneConfig(lora_rank=rank, lora_alpha=2 * rank, lora_init=lora_init))
        return build_policy_nets(cfg, adapter, set())

    gaussian = lora_a(nets_for("flux"))  # None: the model's default
    assert abs(float(gaussian.std()) * rank - 1) < 0.05 and abs(float(gaussian.mean())) < 0.01
    for kaiming in (lora_a(nets_for("tiny")), lora_a(nets_for("flux", "kaiming"))):  # Kaiming-uniform:
        assert float(kaiming.abs().max()) < 1 / math.sqrt(128) + 1e-6  # bound 1 / sqrt(fan_in), fan_in 128


# -- the evaluation EMA's schedule -------------------------------------------------------------------------
@pytest.fixture
def trainer(tmp_path):
    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    def make(ema_every):
        cfg = tiny_config.small_config("diffusion_nft", experiment="ema", planned_iterations=1, seed=0)
        cfg.finetune = dataclasses.replace(cfg.finetune, ema_every=ema_every)
        return Trainer(cfg, RunStore(tmp_path / str(ema_every), cfg.run_id))

    return make


def test_ema_updates_every_n_optimizer_steps_with_the_warmup_of_the_step_count(trainer):
    """Catches (issue 23): the evaluation EMA updated after every step for every method, where
    flow_grpo's EMAModuleWrapper(decay=0.9, update_step_interval=8) updates when (step + 1) % 8 == 0,
    with the decay min(0.9, (1 + step) / (10 + step)) of that step count."""
    tr = trainer(8)
    nets = tr.nets
    for step in range(1, 24):
        with torch.no_grad():
            for p in nets.trainable("policy"):
                p.normal_()
        before = [e.clone() for e in nets.trainable("ema")]
        tr.optimizer_steps = step
        tr.maybe_ema_step()
        after = nets.trainable("ema")
        if (step + 1) % 8:
            assert all(torch.equal(a, b) for a, b in zip(after, before)), step
        else:
            d = min(0.9, (1 + step) / (10 + step))
            for a, b, p in zip(after, before, nets.trainable("policy")):
                torch.testing.assert_close(a, d * b + (1 - d) * p.detach())


def test_ema_every_one_is_the_previous_schedule(trainer):
    tr = trainer(1)
    policy = tr.nets.trainable("policy")
    with torch.no_grad():
        for p in policy:
            p.normal_()
    for step in (1, 2):
        before = [e.clone() for e in tr.nets.trainable("ema")]
        tr.optimizer_steps = step
        tr.maybe_ema_step()
        d = (1 + step) / (10 + step)
        for a, b, p in zip(tr.nets.trainable("ema"), before, policy):
            torch.testing.assert_close(a, d * b + (1 - d) * p.detach())
    assert tr.nets.ema_updates == 2


# -- CFG's detached unconditional branch ---------------------------------------------------------------------
def test_detach_uncond_leaves_the_velocity_and_takes_g_times_the_conditional_gradient():
    """flow_grpo's loss under CFG: v = v_u.detach() + g (v_c - v_u.detach()), so d v = g d v_c (was
    g d v_c - (g - 1) d v_u)."""
    from test_models_diffusers import sd3_components

    from solbench.models.sd3 import SD3Adapter

    adapter = SD3Adapter.from_components(**sd3_components(), resolution=32, max_sequence_length=16)
    net = adapter.transformer
    cond = adapter.encode(["a red cube"])
    x = torch.randn(1, *adapter.latent_shape, generator=torch.Generator().manual_seed(5))
    t = torch.tensor([0.6])
    weight = net.transformer_blocks[0].attn.to_q.weight

    def grad(**kw):
        net.zero_grad()
        v = adapter.velocity(net, x, t, cond, **kw)
        v.square().sum().backward()
        return v.detach(), weight.grad.clone()

    v_full, g_full = grad(guidance=4.5)
    v_detached, g_detached = grad(guidance=4.5, detach_uncond=True)
    torch.testing.assert_close(v_detached, v_full, rtol=0, atol=0)
    assert not torch.allclose(g_detached, g_full)
    net.zero_grad()  # the oracle: 2 v . (g d v_c), v_c alone is guidance 1.0 (one conditional forward)
    v_cond = adapter.velocity(net, x, t, cond, guidance=1.0)
    (2 * v_full * 4.5 * v_cond).sum().backward()
    torch.testing.assert_close(g_detached, weight.grad, rtol=1e-4, atol=1e-6)


# -- AWM's generalised-Huber weighting -------------------------------------------------------------------------
def test_awm_ghuber_weighting_has_the_gradient_of_the_references_exp_first_ratio():
    """Catches (issue 41) AWM training on the plain mean squared error d where the reference's PickScore config
    (dgx_awm.py lines 339-342: loss_type 'exp_first', weighting 'ghuber', ghuber_power 0.25) trains on
    log_prob = -((d + 1e-10)^p - 1e-10^p) t / p (train_sd3_awm.py line 249, d in float64, lines 237-239) inside
    ratio = exp(log_prob - old_log_prob.detach()) with the on-policy old_log_prob = log_prob.detach() (line 1284),
    policy_loss = mean(max(-A ratio, -A clamp(ratio, 1 - 1, 1 + 1))) (lines 1293-1327), plus beta |v - v_ref|^2
    and ema_beta |v - v_ema|^2 (lines 1337, 1346-1350). The oracle is that formula, written out here in float64
    with autograd; solbench's loss must have its gradient (its value differs by the constant mean(A) - the
    ratio's value 1 times A - which carries no gradient), and differ from the uniform weighting's."""
    from test_methods_math import (C_OLD, C_REF, EPS, W_OLD, W_REF, X0, f64, f64_params, f64_velocity,
                                   method_instance, toy_engine)

    from solbench.method import Chunk

    p, kl_beta, slow_beta, adv, t = 0.25, 0.01, 0.5, [2.5, -6.0], [0.6, 0.3]

    def solbench_loss(**weighting):
        method = method_instance("awm", kl_beta=kl_beta, slow_beta=slow_beta, **weighting)
        engine = toy_engine()
        chunk = Chunk(data={"x0": torch.tensor(X0), "t": torch.tensor(t), "eps": torch.tensor(EPS),
                            "advantages": torch.tensor(adv), "prompts": ["a", "b"], "guidance": 1.0},
                      micro_batch=0, n_micro_batches=1, weight=1.0)
        loss, _ = method.loss(engine, chunk)
        loss.backward()
        policy = engine.nets["policy"]
        return loss, policy.w.grad.double(), policy.c.grad.double()

    loss, grad_w, grad_c = solbench_loss(weighting="ghuber", ghuber_power=p)
    x0, eps, tt = f64(X0), f64(EPS), f64(t)
    xt = (1 - tt[:, None]) * x0 + tt[:, None] * eps
    w, c = f64_params(requires_grad=True)
    v = f64_velocity(w, c, xt, tt)
    d = ((v - (eps - x0)) ** 2).mean(1)
    log_prob = -((d + 1e-10) ** p - torch.tensor(1e-10, dtype=torch.float64) ** p) * tt / p
    ratio = torch.exp(log_prob - log_prob.detach())
    a = torch.clamp(f64(adv), -5, 5) / 5 * 1.0
    policy_loss = torch.mean(torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1.0 - 1, 1.0 + 1)))
    v_ref = f64_velocity(f64(W_REF), f64(C_REF), xt, tt)
    v_ema = f64_velocity(f64(W_OLD), f64(C_OLD), xt, tt)  # the slow copy is the "old" role
    reference = policy_loss + kl_beta * ((v - v_ref) ** 2).mean() + slow_beta * ((v - v_ema) ** 2).mean()
    reference.backward()
    torch.testing.assert_close(grad_w, w.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(grad_c, c.grad, rtol=1e-4, atol=1e-7)
    assert float(loss.detach()) == pytest.approx(float(reference.detach() + (a * (1 - log_prob.detach())).mean()), rel=1e-5)
    _, uniform_w, _ = solbench_loss()
    assert not torch.allclose(uniform_w, grad_w, rtol=0.05)


# -- the evaluation protocol ---------------------------------------------------------------------------------
def test_an_adapter_at_the_protocols_resolution_samples_as_one_built_at_it():
    """Catches (issue 41) an evaluation at the training resolution: inside ``at_resolution(64)`` an adapter built
    at 32 px draws the images, latent shape, image ids and resolution-dependent FLUX shift of one built at 64 px
    (test_models_diffusers holds that one to the FLUX pipeline), and is its 32 px self again afterwards."""
    from test_models_diffusers import engine_rollout, flux_components

    from solbench.models.flux import FluxAdapter

    parts = flux_components()
    small = FluxAdapter.from_components(**parts, resolution=32, max_sequence_length=16)
    big = FluxAdapter.from_components(**parts, resolution=64, max_sequence_length=16)
    before = (small.resolution, small.latent_shape, small.default_shift, small.img_ids.clone())
    assert small.default_shift != big.default_shift  # FLUX's dynamic shift depends on the resolution
    with small.at_resolution(64):
        assert (small.resolution, small.latent_shape, small.default_shift) == (64, big.latent_shape, big.default_shift)
        inside, _ = engine_rollout(small, steps=2, guidance=3.5)
    expected, _ = engine_rollout(big, steps=2, guidance=3.5)
    assert inside.images.shape[-2:] == (64, 64)
    torch.testing.assert_close(inside.images, expected.images, rtol=1e-5, atol=1e-6)
    after = (small.resolution, small.latent_shape, small.default_shift, small.img_ids)
    assert after[:3] == before[:3] and torch.equal(after[3], before[3])
    with small.at_resolution(None), small.at_resolution(32):
        assert small.latent_shape == before[1]


def test_the_tiny_model_refuses_another_eval_resolution(tmp_path):
    """A tiny spec asking for another evaluation resolution fails at expansion, naming the spec and the key; an
    adapter asked at run time says the same."""
    from solbench.errors import ConfigError
    from solbench.models import build_adapter
    from solbench.spec import load_spec

    spec = tmp_path / "tiny_eval.yaml"
    spec.write_text("name: tiny_eval\nbase: {eval: {resolution: 64}}\nmatrix: {method: [sol_rl]}\n")
    with pytest.raises(ConfigError, match=rf"{spec}.*eval\.resolution: got 64: .*the tiny model samples only at its own"):
        load_spec(spec)
    adapter = build_adapter(ModelConfig(path="random"))
    with adapter.at_resolution(adapter.resolution):
        pass
    with pytest.raises(ConfigError, match=r"eval\.resolution: the tiny model samples only at its own 32 px, not 64 px"):
        with adapter.at_resolution(64):
            pass


def test_the_trainer_evaluates_with_the_protocol_not_the_training_settings(trainer):
    """Catches (issue 41) an evaluation that samples Euler at the run's training guidance and shift: with
    eval.guidance, eval.shift and eval.sampler set, Trainer.evaluate samples exactly those (at eval_steps), at
    eval.resolution; unset, it keeps the training settings (the runs made before the protocol existed)."""
    from solbench.engine.sampling import SamplerSpec

    seen = []
    for attempt, protocol in enumerate(({}, {"guidance": 2.0, "shift": 3.0, "sampler": "dpm2"})):
        tr = trainer(1 + attempt)
        tr.cfg.sampling = dataclasses.replace(tr.cfg.sampling, guidance=1.5, shift=2.0)
        tr.cfg.eval = dataclasses.replace(tr.cfg.eval, resolution=tr.engine.adapter.resolution, **protocol)
        sample = tr.engine.sample

        def record(*args, sampler, **kwargs):
            seen.append((sampler, tr.engine.adapter.resolution))
            return sample(*args, sampler=sampler, **kwargs)

        tr.engine.sample = record
        tr.evaluate()
    steps = tr.cfg.sampling.eval_steps
    assert seen == [(SamplerSpec("euler", steps, guidance=1.5, shift=2.0), 32),
                    (SamplerSpec("dpm2", steps, guidance=2.0, shift=3.0), 32)]


# -- run ids -----------------------------------------------------------------------------------------------
def test_settings_added_here_keep_earlier_run_ids_at_their_defaults():
    """A run that does not set them hashes as before they existed (the committed tiny_paper results keep
    their ids); setting one is a new run, and expansion writes the real models' reference defaults out
    (their runs do something else now, so they must not keep their ids)."""
    cfg = RunConfig()
    data = json.loads(cfg.canonical_json())
    assert not {"text_max_length", "prompt_instruction", "checkpoint"} & set(data["model"])
    assert not {"ema_every", "lora_init"} & set(data["finetune"])
    for section, field, value in (("model", "text_max_length", 128), ("finetune", "ema_every", 8),
                                  ("finetune", "lora_init", "gaussian"), ("model", "checkpoint", "x.pth")):
        other = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{field: value})})
        assert other.run_id != cfg.run_id, field
    from solbench.spec import load_spec

    flux = load_spec(Path(__file__).resolve().parents[1] / "experiments" / "ablation_n.yaml").runs[0].config
    assert (flux.model.text_max_length, flux.finetune.lora_init) == (128, "gaussian")  # written out: new ids
    awm = RunConfig(method="awm", method_config={"time_type": "discrete_wo_init"})
    assert awm.run_id == RunConfig(method="awm", method_config={}).run_id
    assert RunConfig(method="awm", method_config={"time_type": "discrete"}).run_id != awm.run_id
    # issue 41: AWM's weighting, FlowGRPO's CFG detach and the evaluation protocol
    for method, field, unset, other in (("awm", "weighting", "uniform", "ghuber"), ("awm", "ghuber_power", 0.25, 0.5),
                                        ("flow_grpo", "detach_uncond", True, False)):
        base = RunConfig(method=method, method_config={})
        assert RunConfig(method=method, method_config={field: unset}).run_id == base.run_id, field
        assert RunConfig(method=method, method_config={field: other}).run_id != base.run_id, field
    for field, other in (("guidance", 1.0), ("resolution", 512), ("shift", 1.0), ("sampler", "dpm2")):
        assert field not in data["eval"]
        assert dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, **{field: other})).run_id != cfg.run_id, field
