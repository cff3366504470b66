"""The linear-FFN SANA 1.6B that Sol-RL trains, as a diffusers SanaTransformer2DModel, from its native checkpoint.

Sol-RL's SANA runs (NVlabs/Sana configs/sol_rl/sana.py: ``native_config =
configs/sol_rl/Sana1.0_1600M_linear.yaml``, ``native_model_path = .../SANA_LinearFFN.pth``, source
``hf://yitongl/SANA_LinearFFN/SANA_LinearFFN.pth``) build ``SanaMSLinear_1600M_P1_D20``
(diffusion/model/nets/sana_multi_scale_linear.py: 20 blocks of width 2240, linear self-attention,
``ffn_type: glumbconv_linear``). Its feed-forward is GLUMBConvLinear
(diffusion/model/nets/basic_modules_linear.py): SANA's GLUMBConv with the two 1x1 convolutions written
as Linear layers, so they are GEMMs that the NVFP4 explore copy quantizes (2240 -> 11200 and 5600 ->
2240, above the recipe's min_dim 2240); the 3x3 depthwise convolution stays a convolution. Everything
else is the SANA 1.0 1.6B transformer that diffusers' SanaTransformer2DModel implements.

So the model here is a SanaTransformer2DModel (the adapter, LoRA targets, recipes, gradient
checkpointing and the pipeline work unchanged) whose blocks' ``ff`` is ``GLUMBConvLinear``: the same
arithmetic as diffusers' GLUMBConv (a 1x1 convolution is that Linear on every pixel) with
``linear_inverted`` / ``linear_point`` as nn.Linear. ``native_to_diffusers`` maps the native
checkpoint's keys (SanaMSLinear's module names) to it; ``load_native_checkpoint`` reads the file;
``linear_ffn_transformer`` builds the model from the diffusers transformer config of the pipeline
whose text encoder and VAE the reference uses (Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers,
train_sana.py), and ``load_linear_ffn_transformer`` does all three, strictly (every parameter filled,
every checkpoint tensor used or named as unused).

Native key -> diffusers module (the fused projections are split along their output rows, in the order
the native forward unbinds them: qkv -> q, k, v; kv_linear -> k, v):

| native (SanaMSLinear) | diffusers |
|---|---|
| x_embedder.proj | patch_embed.proj |
| t_embedder.mlp.0 / .2 | time_embed.emb.timestep_embedder.linear_1 / linear_2 |
| t_block.1 | time_embed.linear |
| y_embedder.y_proj.fc1 / .fc2 | caption_projection.linear_1 / linear_2 |
| attention_y_norm | caption_norm |
| blocks.i.scale_shift_table | transformer_blocks.i.scale_shift_table |
| blocks.i.attn.qkv | transformer_blocks.i.attn1.to_q / to_k / to_v |
| blocks.i.attn.proj | transformer_blocks.i.attn1.to_out.0 |
| blocks.i.cross_attn.q_linear | transformer_blocks.i.attn2.to_q |
| blocks.i.cross_attn.kv_linear | transformer_blocks.i.attn2.to_k / to_v |
| blocks.i.cross_attn.proj | transformer_blocks.i.attn2.to_out.0 |
| blocks.i.mlp.inverted_conv.linear | transformer_blocks.i.ff.linear_inverted |
| blocks.i.mlp.depth_conv.conv | transformer_blocks.i.ff.conv_depth |
| blocks.i.mlp.point_conv.linear | transformer_blocks.i.ff.linear_point |
| final_layer.scale_shift_table | scale_shift_table |
| final_layer.linear | proj_out |

Unused native tensors: ``pos_embed`` (a buffer the model never adds: ``use_pe: false``) and
``y_embedder.y_embedding`` (the learned null caption for caption dropout in pre-training; the
reference's unconditional branch encodes the empty prompt instead).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from solbench.errors import ConfigError, MissingWeightsError
from solbench.models.hub import download_command, hub_file

DEFAULT_CHECKPOINT = "yitongl/SANA_LinearFFN/SANA_LinearFFN.pth"  # configs/sol_rl/sana.py native_model_source
DEFAULT_PIPELINE = "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers"  # train_sana.py: text encoder, VAE
# Native tensors the diffusers module has no place for (see the module docstring).
UNUSED_NATIVE_KEYS = ("pos_embed", "y_embedder.y_embedding")


class GLUMBConvLinear(nn.Module):
    """SANA's GLUMBConv feed-forward with its 1x1 convolutions as Linear layers (GLUMBConvLinear).

    In: [B, C, H, W], as SanaTransformerBlock hands its ``ff`` the modulated tokens laid out as an
    image. linear_inverted (C -> 2 hidden, bias) and SiLU per pixel, the 3x3 depthwise conv_depth
    (bias), then hidden * SiLU(gate) over the two channel halves, and linear_point (hidden -> C, no
    bias). Out: [B, C, H, W].
    """

    def __init__(self, in_channels: int, out_channels: int, expand_ratio: float) -> None:
        super().__init__()
        hidden = int(expand_ratio * in_channels)
        self.hidden_channels = hidden
        self.nonlinearity = nn.SiLU()
        self.linear_inverted = nn.Linear(in_channels, hidden * 2)
        self.conv_depth = nn.Conv2d(hidden * 2, hidden * 2, 3, 1, 1, groups=hidden * 2)
        self.linear_point = nn.Linear(hidden, out_channels, bias=False)

    def forward(self, hidden_states: Tensor) -> Tensor:
        x = self.nonlinearity(self.linear_inverted(hidden_states.permute(0, 2, 3, 1)))  # [B, H, W, 2 hidden]
        x = self.conv_depth(x.permute(0, 3, 1, 2))
        x, gate = torch.chunk(x, 2, dim=1)
        x = x * self.nonlinearity(gate)
        return self.linear_point(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def linearize_ffn(model: nn.Module) -> nn.Module:
    """Replace every block's GLUMBConv ``ff`` of a SanaTransformer2DModel by GLUMBConvLinear, in place,
    carrying the convolution weights over (a 1x1 kernel [out, in, 1, 1] is the Linear weight [out, in])."""
    for block in model.transformer_blocks:
        conv = block.ff
        hidden = conv.conv_point.in_channels
        linear = GLUMBConvLinear(conv.conv_inverted.in_channels, conv.conv_point.out_channels,
                                 hidden / conv.conv_inverted.in_channels)
        if linear.hidden_channels != hidden or conv.norm_type is not None or conv.residual_connection:
            raise ValueError("linearize_ffn: only SANA's plain GLUMBConv (no norm, no residual) has a linear form")
        linear = linear.to(device=conv.conv_inverted.weight.device, dtype=conv.conv_inverted.weight.dtype)
        with torch.no_grad():
            linear.linear_inverted.weight.copy_(conv.conv_inverted.weight.flatten(1))
            linear.linear_inverted.bias.copy_(conv.conv_inverted.bias)
            linear.conv_depth.load_state_dict(conv.conv_depth.state_dict())
            linear.linear_point.weight.copy_(conv.conv_point.weight.flatten(1))
        block.ff = linear
    return model


def linear_ffn_transformer(config: Mapping) -> nn.Module:
    """A SanaTransformer2DModel of ``config`` (a diffusers transformer config) with Linear feed-forwards.

    The native model has no positional embedding (Sana1.0_1600M_linear.yaml ``use_pe: false``), no
    q/k norm and no guidance embedding; a config that asks for one of them is not this model.
    """
    from diffusers import SanaTransformer2DModel

    config = {k: v for k, v in dict(config).items() if not k.startswith("_")}
    for key, wanted in (("interpolation_scale", None), ("qk_norm", None), ("guidance_embeds", False)):
        if config.get(key, wanted) != wanted:
            raise ConfigError(f"the linear-FFN SANA checkpoint is SanaMSLinear_1600M_P1_D20 (use_pe false, no qk norm, "
                              f"no guidance embedding); its transformer config must have {key}={wanted!r}, "
                              f"got {config[key]!r}")
    return linearize_ffn(SanaTransformer2DModel.from_config(config))


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_BLOCK_MAP = {
    "scale_shift_table": "scale_shift_table",
    "attn.proj": "attn1.to_out.0",
    "cross_attn.q_linear": "attn2.to_q",
    "cross_attn.proj": "attn2.to_out.0",
    "mlp.inverted_conv.linear": "ff.linear_inverted",
    "mlp.depth_conv.conv": "ff.conv_depth",
    "mlp.point_conv.linear": "ff.linear_point",
}
_BLOCK_SPLIT = {"attn.qkv": ("attn1.to_q", "attn1.to_k", "attn1.to_v"),
                "cross_attn.kv_linear": ("attn2.to_k", "attn2.to_v")}
_TOP_MAP = {
    "x_embedder.proj": "patch_embed.proj",
    "t_embedder.mlp.0": "time_embed.emb.timestep_embedder.linear_1",
    "t_embedder.mlp.2": "time_embed.emb.timestep_embedder.linear_2",
    "t_block.1": "time_embed.linear",
    "y_embedder.y_proj.fc1": "caption_projection.linear_1",
    "y_embedder.y_proj.fc2": "caption_projection.linear_2",
    "attention_y_norm": "caption_norm",
    "final_layer.scale_shift_table": "scale_shift_table",
    "final_layer.linear": "proj_out",
}


def _map_module(name: str, table: Mapping[str, str]) -> tuple[str, str] | None:
    """(native module, diffusers module) for the longest native module prefix of parameter ``name``."""
    for native in sorted(table, key=len, reverse=True):
        if name == native or name.startswith(native + "."):
            return native, table[native]
    return None


def native_to_diffusers(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """(diffusers state dict, native keys left unused) of a native SanaMSLinear state dict.

    Fused projections are split along dim 0 into equal parts; keys nothing maps are returned as
    unused (the caller decides whether they may be dropped).
    """
    out: dict[str, Tensor] = {}
    unused: list[str] = []
    for key, value in state.items():
        block = _BLOCK.match(key)
        if block is not None:
            index, rest = block.groups()
            prefix = f"transformer_blocks.{index}."
            split = _map_module(rest, {k: k for k in _BLOCK_SPLIT})
            if split is not None:
                native, _ = split
                suffix = rest[len(native):]
                targets = _BLOCK_SPLIT[native]
                if value.shape[0] % len(targets):
                    raise ConfigError(f"native checkpoint: {key} has {value.shape[0]} rows, not {len(targets)} equal parts")
                for target, part in zip(targets, value.chunk(len(targets), dim=0)):
                    out[prefix + target + suffix] = part.contiguous()
                continue
            mapped = _map_module(rest, _BLOCK_MAP)
            if mapped is not None:
                out[prefix + mapped[1] + rest[len(mapped[0]):]] = value
                continue
        else:
            mapped = _map_module(key, _TOP_MAP)
            if mapped is not None:
                out[mapped[1] + key[len(mapped[0]):]] = value
                continue
        unused.append(key)
    return out, unused


def load_native_checkpoint(path: str | Path) -> dict[str, Tensor]:
    """The state dict of a native Sana checkpoint file: ``{"state_dict": ...}``, ``{"model": ...}`` or a
    flat dict (train_sana.py accepts all three), tensors only (weights_only loading)."""
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # a pickle with non-tensor objects, a truncated file
        raise ConfigError(f"cannot read the native SANA checkpoint {path}: {type(err).__name__}: {err}") from err
    if isinstance(ckpt, dict):
        for key in ("state_dict", "model"):
            if isinstance(ckpt.get(key), dict):
                ckpt = ckpt[key]
                break
    if not isinstance(ckpt, dict) or not all(isinstance(v, Tensor) for v in ckpt.values()):
        raise ConfigError(f"native SANA checkpoint {path}: expected a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in ckpt.items()}


def resolve_checkpoint(checkpoint: str) -> Path:
    """A local file, or ``<repo id>/<file>`` already in the Hugging Face cache (never downloads)."""
    local = Path(checkpoint).expanduser()
    if local.is_file():
        return local
    in_hub = hub_file(checkpoint)
    if in_hub:
        from huggingface_hub import try_to_load_from_cache

        repo, filename = in_hub
        hit = try_to_load_from_cache(repo, filename)
        if isinstance(hit, str) and Path(hit).is_file():
            return Path(hit)
        raise MissingWeightsError(f"model.checkpoint: {filename} of {repo} is not in the Hugging Face cache (nothing is "
                                  f"downloaded at run time). Get it with `{download_command(repo, [filename])}`, "
                                  "or set model.checkpoint to a local file.")
    raise MissingWeightsError(f"model.checkpoint: no file {checkpoint!r} (a local file, or <repo id>/<file> in the "
                              "Hugging Face cache)")


def load_linear_ffn_transformer(config: Mapping, checkpoint: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The linear-FFN SANA of ``config`` with the native checkpoint's weights, strictly: a missing or
    surplus tensor (other than UNUSED_NATIVE_KEYS) or a shape mismatch is a ConfigError naming it."""
    model = linear_ffn_transformer(config)
    state, unused = native_to_diffusers(load_native_checkpoint(checkpoint))
    surplus = [k for k in unused if k not in UNUSED_NATIVE_KEYS]
    if surplus:
        raise ConfigError(f"native SANA checkpoint {checkpoint}: {len(surplus)} tensor(s) this model has no place for, "
                          f"first {surplus[:5]} (is it a SanaMSLinear checkpoint?)")
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    wrong = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
             for k in sorted(set(own) & set(state)) if own[k].shape != state[k].shape]
    if missing or extra or wrong:
        raise ConfigError(f"native SANA checkpoint {checkpoint} does not fit the transformer config: missing "
                          f"{missing[:5]}, unexpected {extra[:5]}, shapes {wrong[:3]}")
    model.load_state_dict(state, strict=True)
    return model.to(dtype)
