"""Model registry, the tiny adapter, and FLOP counting."""

import pytest
import torch

from solbench.models import flops
from solbench.config import ModelConfig
from solbench.errors import ConfigError
from solbench.models import build_adapter, model_names, resolve_full_dtype
from solbench.models.base import Cond


@pytest.fixture(scope="module")
def tiny():
    return build_adapter(ModelConfig(name="tiny", path="random"))


def test_registry_names_and_close_matches():
    assert model_names() == ["flux", "sana", "sd3", "tiny"]
    with pytest.raises(ConfigError, match="did you mean sd3"):
        build_adapter(ModelConfig(name="sd35"))
    with pytest.raises(ConfigError, match="full_dtype"):
        resolve_full_dtype("fp8", "cpu")
    assert resolve_full_dtype("auto", "cpu") == torch.float32
    assert resolve_full_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_full_dtype("bf16", "cpu") == torch.bfloat16


def test_tiny_adapter_shapes_cache_and_decode(tiny):
    assert tiny.latent_shape == (3, 32, 32) and tiny.full_dtype == torch.float32
    cond = tiny.encode(["two red squares", "a blue circle", "two red squares"])
    assert cond["tokens"].shape[0] == 3 and torch.equal(cond["tokens"][0], cond["tokens"][2])
    assert set(tiny._cond_cache) >= {"two red squares", "a blue circle"}
    x = torch.linspace(-1.5, 1.5, 2 * 3 * 32 * 32).reshape(2, 3, 32, 32)
    images = tiny.decode(x)
    torch.testing.assert_close(images, ((x + 1) / 2).clamp(0, 1))
    sigmas = tiny.sigmas(4)
    torch.testing.assert_close(sigmas, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def test_tiny_velocity_is_the_models_and_cfg_combines_it(tiny):
    prompts = ["three green circles", "a yellow square"]
    x = torch.randn(2, 3, 32, 32)
    t = torch.tensor([0.9, 0.3])
    tokens, pooled = tiny.model.encode(prompts)
    with torch.no_grad():
        direct = tiny.model.velocity(tiny.transformer, x, t, tokens, pooled)
        ours = tiny.velocity(tiny.transformer, x, t, tiny.encode(prompts))
        torch.testing.assert_close(ours, direct)
        u_tokens, u_pooled = tiny.model.encode(["", ""])
        v_u = tiny.model.velocity(tiny.transformer, x, t, u_tokens, u_pooled)
        guided = tiny.velocity(tiny.transformer, x, t, tiny.encode(prompts), guidance=3.0)
    torch.testing.assert_close(guided, v_u + 3.0 * (direct - v_u), rtol=1e-5, atol=1e-5)
    assert tiny.forwards_per_velocity(3.0) == 2 and tiny.forwards_per_velocity(None) == 1


def test_cond_index_cat_and_cast():
    cond = Cond({"e": torch.arange(6.0).reshape(3, 2), "mask": torch.ones(3, 2, dtype=torch.long)})
    assert len(cond) == 3
    assert torch.equal(cond.index([2, 0])["e"], torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    assert torch.equal(cond.index(torch.tensor([False, True, False]))["e"], torch.tensor([[2.0, 3.0]]))
    both = Cond.cat([cond, cond.index([1])])
    assert len(both) == 4 and torch.equal(both.repeat(2)["e"][:2], torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    half = cond.to(dtype=torch.bfloat16)
    assert half["e"].dtype == torch.bfloat16 and half["mask"].dtype == torch.long
    with pytest.raises(ValueError, match="batch size"):
        Cond({"a": torch.zeros(2), "b": torch.zeros(3)})


def flux_matmul_flops(cfg, n, l):
    """FLOPs of FluxTransformer2DModel by hand (2 x multiply-adds of every matrix product)."""
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    s = n + l
    macs = n * cfg["in_channels"] * d + l * cfg["joint_attention_dim"] * d  # x / context embedders
    macs += 256 * d + d * d + cfg["pooled_projection_dim"] * d + d * d  # timestep + pooled text MLPs
    per_double = 12 * d * d + (3 + 1 + 8) * (n + l) * d * d + 2 * s * s * d  # adaLN x2, qkv+out+ff, attention
    per_single = 3 * d * d + (4 + 3 + 5) * s * d * d + 2 * s * s * d  # adaLN, mlp-in + qkv + proj_out, attention
    macs += cfg["num_layers"] * per_double + cfg["num_single_layers"] * per_single
    macs += 2 * d * d + n * d * cfg["out_channels"]  # norm_out adaLN, proj_out
    return 2 * macs


def test_flux_flops_match_a_hand_count_and_a_real_forward(tiny):
    cfg = dict(tiny.transformer.config)
    n, l = 64, tiny.model.config.max_length
    assert tiny.flops_per_forward() == flux_matmul_flops(cfg, n, l)
    tokens, pooled = tiny.model.encode(["two red squares"])
    with torch.no_grad():
        counted = flops.count_flops(tiny.model.velocity, tiny.transformer, torch.randn(1, 3, 32, 32),
                                    torch.tensor([0.5]), tokens, pooled)
    # torch's FlopCounter does not count CPU's fused attention kernel (it does on meta tensors):
    # the real CPU forward counts every linear layer, the meta count adds 4 s^2 D per block.
    d, s = 128, n + l
    blocks = cfg["num_layers"] + cfg["num_single_layers"]
    assert counted + blocks * 4 * s * s * d == tiny.flops_per_forward()


@pytest.mark.parametrize("name,params_b,tflops", [("flux", 11.90, 74.38), ("sd3", 8.06, 31.12), ("sana", 1.60, 2.967)])
def test_real_model_configs_have_the_published_sizes(name, params_b, tflops):
    spec = flops.REAL_MODELS[name]
    assert spec.parameters() / 1e9 == pytest.approx(params_b, abs=0.01)  # FLUX.1-dev 12B, SD3.5-L 8.1B, SANA 1.6B
    assert spec.forward_flops() / 1e12 == pytest.approx(tflops, rel=1e-3)  # one 1024 px forward
    assert spec.forward_flops(512) < spec.forward_flops() / 3  # 4x fewer tokens
