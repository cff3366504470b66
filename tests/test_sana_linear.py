"""The linear-FFN SANA (solbench.models.sana_linear) from a checkpoint written in the native layout.

Oracles, at tiny size: (1) a forward pass written here from the reference's model code
(NVlabs/Sana diffusion/model/nets/sana_multi_scale_linear.py SanaMSLinear with LiteLA self-attention,
MultiHeadCrossAttention and basic_modules_linear.py GLUMBConvLinear), reading the native checkpoint's
tensors by their native names; (2) diffusers' own SanaTransformer2DModel with the two Linear layers of
each feed-forward put back as 1x1 convolutions. Before issue 23 there was no such model: sana_main
loaded SANA 1.5, whose feed-forward is convolutions that the NVFP4 explore copy never quantizes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from solbench.config import ModelConfig
from solbench.errors import ConfigError
from solbench.models.sana_linear import (linear_ffn_transformer, load_linear_ffn_transformer, native_to_diffusers,
                                         GLUMBConvLinear)

D, HEADS, HEAD_DIM, DEPTH, MLP_RATIO, CAPTION, CHANNELS, TOKENS = 64, 2, 32, 2, 2.5, 8, 4, 6
HIDDEN = int(D * MLP_RATIO)
CONFIG = dict(in_channels=CHANNELS, out_channels=CHANNELS, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
              num_layers=DEPTH, num_cross_attention_heads=HEADS, cross_attention_head_dim=HEAD_DIM,
              cross_attention_dim=D, caption_channels=CAPTION, mlp_ratio=MLP_RATIO, attention_bias=False,
              sample_size=8, patch_size=1)


def native_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """A SanaMSLinear state dict at tiny size, every tensor by its native name and shape."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    sd = {"x_embedder.proj.weight": rand(D, CHANNELS, 1, 1), "x_embedder.proj.bias": rand(D),
          "t_embedder.mlp.0.weight": rand(D, 256, scale=0.05), "t_embedder.mlp.0.bias": rand(D),
          "t_embedder.mlp.2.weight": rand(D, D, scale=0.1), "t_embedder.mlp.2.bias": rand(D),
          "t_block.1.weight": rand(6 * D, D, scale=0.1), "t_block.1.bias": rand(6 * D),
          "y_embedder.y_proj.fc1.weight": rand(D, CAPTION), "y_embedder.y_proj.fc1.bias": rand(D),
          "y_embedder.y_proj.fc2.weight": rand(D, D, scale=0.1), "y_embedder.y_proj.fc2.bias": rand(D),
          "y_embedder.y_embedding": rand(300, CAPTION),  # the learned null caption: unused
          "attention_y_norm.weight": 1 + rand(D),
          "pos_embed": torch.zeros(1, 64, D),  # registered by Sana even with use_pe false: unused
          "final_layer.scale_shift_table": rand(2, D), "final_layer.linear.weight": rand(CHANNELS, D),
          "final_layer.linear.bias": rand(CHANNELS)}
    for i in range(DEPTH):
        p = f"blocks.{i}."
        sd |= {p + "scale_shift_table": rand(6, D),
               p + "attn.qkv.weight": rand(3 * D, D, scale=0.1), p + "attn.proj.weight": rand(D, D, scale=0.1),
               p + "attn.proj.bias": rand(D),
               p + "cross_attn.q_linear.weight": rand(D, D, scale=0.1), p + "cross_attn.q_linear.bias": rand(D),
               p + "cross_attn.kv_linear.weight": rand(2 * D, D, scale=0.1), p + "cross_attn.kv_linear.bias": rand(2 * D),
               p + "cross_attn.proj.weight": rand(D, D, scale=0.1), p + "cross_attn.proj.bias": rand(D),
               p + "mlp.inverted_conv.linear.weight": rand(2 * HIDDEN, D, scale=0.1),
               p + "mlp.inverted_conv.linear.bias": rand(2 * HIDDEN),
               p + "mlp.depth_conv.conv.weight": rand(2 * HIDDEN, 1, 3, 3), p + "mlp.depth_conv.conv.bias": rand(2 * HIDDEN),
               p + "mlp.point_conv.linear.weight": rand(D, HIDDEN, scale=0.1)}
    return sd


def native_forward(sd, x, sigma, y, mask):
    """SanaMSLinear.forward (eval, use_pe false, y_norm, timestep_norm_scale_factor 0.001), written from
    the reference's code with its module names: x [B, C, H, W], sigma [B] in [0, 1], y [B, 1, L, Cc],
    mask [B, L]."""
    b, _, h, w = x.shape
    n = h * w

    def lin(v, name, bias=True):
        return F.linear(v, sd[name + ".weight"], sd.get(name + ".bias") if bias else None)

    def layer_norm(v):
        return F.layer_norm(v, (D,), eps=1e-6)

    timestep = sigma.float() / 0.001
    tokens = F.conv2d(x, sd["x_embedder.proj.weight"], sd["x_embedder.proj.bias"]).flatten(2).transpose(1, 2)
    freqs = torch.exp(-math.log(10000) * torch.arange(128, dtype=torch.float32) / 128)
    args = timestep[:, None] * freqs[None]
    t = lin(F.silu(lin(torch.cat([torch.cos(args), torch.sin(args)], dim=-1), "t_embedder.mlp.0")), "t_embedder.mlp.2")
    t0 = lin(F.silu(t), "t_block.1")
    cap = lin(F.gelu(lin(y, "y_embedder.y_proj.fc1"), approximate="tanh"), "y_embedder.y_proj.fc2").squeeze(1)
    cap = cap * torch.rsqrt(cap.pow(2).mean(-1, keepdim=True) + 1e-5) * sd["attention_y_norm.weight"]
    bias = ((1 - mask.float()) * -10000.0)[:, None, None]
    for i in range(DEPTH):
        p = f"blocks.{i}."
        mods = (sd[p + "scale_shift_table"][None] + t0.reshape(b, 6, -1)).chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
        z = layer_norm(tokens) * (1 + scale_msa) + shift_msa
        q, k, v = lin(z, p + "attn.qkv", bias=False).reshape(b, n, 3, D).unbind(2)  # LiteLA
        q, k, v = (u.transpose(-1, -2).reshape(b, D // 32, 32, n) for u in (q, k, v))
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 0, 0, 1), value=1.0)
        out = (v @ k.transpose(-1, -2)) @ q
        out = out[:, :, :-1] / (out[:, :, -1:] + 1e-15)
        tokens = tokens + gate_msa * lin(out.reshape(b, D, n).permute(0, 2, 1), p + "attn.proj")
        cq = lin(tokens, p + "cross_attn.q_linear").view(b, n, HEADS, HEAD_DIM).transpose(1, 2)
        ck, cv = lin(cap, p + "cross_attn.kv_linear").view(b, -1, 2, D).unbind(2)
        ck, cv = (u.view(b, -1, HEADS, HEAD_DIM).transpose(1, 2) for u in (ck, cv))
        attn = F.scaled_dot_product_attention(cq, ck, cv, attn_mask=bias.expand(b, HEADS, 1, -1))
        tokens = tokens + lin(attn.transpose(1, 2).reshape(b, n, D), p + "cross_attn.proj")
        z = layer_norm(tokens) * (1 + scale_mlp) + shift_mlp  # GLUMBConvLinear
        z = F.silu(lin(z, p + "mlp.inverted_conv.linear")).reshape(b, h, w, -1).permute(0, 3, 1, 2)
        z = F.conv2d(z, sd[p + "mlp.depth_conv.conv.weight"], sd[p + "mlp.depth_conv.conv.bias"], padding=1,
                     groups=2 * HIDDEN)
        z, gate = z.chunk(2, dim=1)
        z = (z * F.silu(gate)).reshape(b, HIDDEN, n).permute(0, 2, 1)
        tokens = tokens + gate_mlp * lin(z, p + "mlp.point_conv.linear", bias=False)
    shift, scale = (sd["final_layer.scale_shift_table"][None] + t[:, None]).chunk(2, dim=1)
    out = lin(layer_norm(tokens) * (1 + scale) + shift, "final_layer.linear")
    return torch.einsum("nhwc->nchw", out.reshape(b, h, w, CHANNELS))


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "SANA_LinearFFN.pth"
    torch.save({"state_dict": native_state_dict()}, path)
    return path


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, CHANNELS, 8, 8, generator=g)
    y = torch.randn(2, 1, TOKENS, CAPTION, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    return x, torch.tensor([0.83, 0.31]), y, mask


def diffusers_forward(model, x, sigma, y, mask):
    with torch.no_grad():  # SanaAdapter's call: timestep in the 0..1000 scale, caption [B, L, Cc], mask [B, L]
        return model(x, encoder_hidden_states=y.squeeze(1), encoder_attention_mask=mask,
                     timestep=sigma.float() * 1000, return_dict=False)[0]


def test_the_native_checkpoint_loads_into_the_linear_ffn_model_and_runs_the_reference_forward(checkpoint):
    """Catches: a wrong key mapping, a fused projection split in the wrong order (q/k/v, k/v), the
    feed-forward's layout (pixels vs channels) or activation order, the 0.001 timestep scale."""
    model = load_linear_ffn_transformer(CONFIG, checkpoint).eval()
    assert all(isinstance(block.ff, GLUMBConvLinear) for block in model.transformer_blocks)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".ff." in n}
    assert linears == {f"transformer_blocks.{i}.ff.{name}" for i in range(DEPTH) for name in ("linear_inverted", "linear_point")}
    x, sigma, y, mask = inputs()
    expected = native_forward(native_state_dict(), x, sigma, y, mask)
    torch.testing.assert_close(diffusers_forward(model, x, sigma, y, mask), expected, rtol=2e-4, atol=2e-5)


def test_the_linear_ffn_equals_diffusers_glumbconv_with_the_same_weights(checkpoint):
    """The feed-forward as Linear computes what diffusers' GLUMBConv computes with those weights as 1x1
    convolutions (the only place the two models differ)."""
    from diffusers import SanaTransformer2DModel

    linear = load_linear_ffn_transformer(CONFIG, checkpoint).eval()
    conv = SanaTransformer2DModel(**CONFIG).eval()
    state = {k: v for k, v in linear.state_dict().items() if ".ff." not in k}
    for i, block in enumerate(linear.transformer_blocks):
        p = f"transformer_blocks.{i}.ff."
        state |= {p + "conv_inverted.weight": block.ff.linear_inverted.weight[:, :, None, None],
                  p + "conv_inverted.bias": block.ff.linear_inverted.bias,
                  p + "conv_depth.weight": block.ff.conv_depth.weight, p + "conv_depth.bias": block.ff.conv_depth.bias,
                  p + "conv_point.weight": block.ff.linear_point.weight[:, :, None, None]}
    conv.load_state_dict(state, strict=True)
    x, sigma, y, mask = inputs(2)
    torch.testing.assert_close(diffusers_forward(linear, x, sigma, y, mask), diffusers_forward(conv, x, sigma, y, mask),
                               rtol=1e-5, atol=1e-6)


def test_a_checkpoint_that_does_not_fit_is_an_error_naming_the_tensor(tmp_path):
    sd = native_state_dict()
    del sd["blocks.1.mlp.point_conv.linear.weight"]
    sd["blocks.0.mlp.extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pth"
    torch.save(sd, path)  # a flat state dict is accepted as well
    with pytest.raises(ConfigError, match="blocks.0.mlp.extra.weight"):
        load_linear_ffn_transformer(CONFIG, path)
    del sd["blocks.0.mlp.extra.weight"]
    torch.save(sd, path)
    with pytest.raises(ConfigError, match=r"transformer_blocks\.1\.ff\.linear_point\.weight"):
        load_linear_ffn_transformer(CONFIG, path)
    with pytest.raises(ConfigError, match="use_pe false"):
        linear_ffn_transformer({**CONFIG, "interpolation_scale": 1})


def test_native_keys_map_to_every_parameter_with_only_the_two_unused_buffers_left():
    state, unused = native_to_diffusers(native_state_dict())
    assert sorted(unused) == ["pos_embed", "y_embedder.y_embedding"]
    assert set(state) == set(linear_ffn_transformer(CONFIG).state_dict())


def test_the_sana_recipe_quantizes_the_linear_feed_forward_and_not_the_conv_one(checkpoint):
    """Catches (issue 23): with diffusers' SANA (convolution feed-forward) nvfp4_sana quantized only the
    cross-attention k/v: Sol-RL and naive FP4 explored in effect in BF16. On the linear-FFN model the
    feed-forward's two GEMMs run NVFP4, as in the reference (min_dim scaled to this model's width)."""
    from diffusers import SanaTransformer2DModel

    from solbench.quant import get_recipe, quantization_summary, quantized_copy

    recipe = get_recipe("nvfp4_sana").replace(min_dim=D)

    def quantized(model):
        return {row.name.split(".", 2)[-1] for row in quantization_summary(quantized_copy(model, recipe))
                if row.name.startswith("transformer_blocks.0.") and row.quantized}

    assert quantized(load_linear_ffn_transformer(CONFIG, checkpoint)) == {
        "ff.linear_inverted", "ff.linear_point", "attn2.to_k", "attn2.to_v"}
    assert quantized(SanaTransformer2DModel(**CONFIG)) == {"attn2.to_k", "attn2.to_v"}


def test_model_checkpoint_loads_the_linear_ffn_sana_into_the_pipeline(checkpoint, tmp_path):
    """model.checkpoint with model.name sana: the pipeline folder gives text encoder, VAE and the
    transformer config (Sana_1600M_1024px_BF16_diffusers in the reference), the native file the weights."""
    from diffusers import SanaPipeline, SanaTransformer2DModel
    from test_models_diffusers import sana_components

    from solbench.models import build_adapter

    parts = sana_components()
    parts["transformer"] = SanaTransformer2DModel(**CONFIG)  # its weights are never read: only its config
    SanaPipeline(**parts).save_pretrained(tmp_path / "pipe")
    adapter = build_adapter(ModelConfig(name="sana", path=str(tmp_path / "pipe"), checkpoint=str(checkpoint),
                                        resolution=256), "cpu")
    assert all(isinstance(block.ff, GLUMBConvLinear) for block in adapter.transformer.transformer_blocks)
    native = native_state_dict()
    torch.testing.assert_close(adapter.transformer.transformer_blocks[1].ff.linear_point.weight,
                               native["blocks.1.mlp.point_conv.linear.weight"], rtol=0, atol=0)
    assert adapter.complex_human_instruction is None and adapter.max_sequence_length == 300
    cond = adapter.encode(["a red cube"])
    v = adapter.velocity(adapter.transformer, torch.randn(1, *adapter.latent_shape), torch.tensor([0.5]), cond, 1.0)
    assert v.shape == (1, *adapter.latent_shape) and torch.isfinite(v).all()
    with pytest.raises(ConfigError, match="model.checkpoint"):
        build_adapter(ModelConfig(name="flux", checkpoint=str(checkpoint)), "cpu")
