"""FLOPs of one transformer forward, from the architecture config alone.

Timing rows carry the FLOPs each phase spent, and the cost projections for the real models
(FLUX.1-dev, SD3.5-Large, the linear-FFN SANA 1.0 1.6B) need the same number without their weights. Both come from
one method: build the diffusers transformer class from its config on the ``meta`` device (no memory,
no compute), run one forward on meta tensors of the right shapes, and let PyTorch's own
``FlopCounterMode`` count the matrix products (linear layers, attention, convolutions). Elementwise
work (norms, activations, RoPE) is not counted, as in the usual 2 x MACs convention. Meta tensors
also make attention count: on real CPU tensors the fused attention kernel is invisible to the counter.

Each real model's architecture config is its card's ``transformer`` (a ``RealModelSpec``, in
solbench/models/flux.py, sd3.py, sana.py), transcribed from the ``transformer/config.json`` of its Hugging Face
repository, with the shapes of its native resolution and text encoders; ``REAL_MODELS`` reads them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from solbench.errors import ConfigError


def count_flops(fn: Callable[..., Any], *args, **kwargs) -> int:
    """FLOPs (2 x multiply-adds of matrix products) that ``fn(*args, **kwargs)`` executes."""
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


#: Config key (ignored by diffusers: private) marking a SanaTransformer2DModel whose feed-forwards are Linear
#: layers, the linear-FFN SANA 1.6B Sol-RL trains (solbench.models.sana_linear).
LINEAR_FFN = "_solbench_linear_ffn"


def _meta_model(class_name: str, config: dict):
    import diffusers

    cls = getattr(diffusers, class_name)
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in config.items() if not k.startswith("_")}
    with torch.device("meta"):
        model = cls(**kwargs)
        if config.get(LINEAR_FFN):
            from solbench.models.sana_linear import linearize_ffn

            linearize_ffn(model)
        return model


def _meta_inputs(class_name: str, config: dict, shape_key: tuple) -> dict:
    """Meta tensors of one sample's forward inputs for a diffusers transformer class."""
    batch = 1
    meta = {"device": "meta"}
    t = torch.ones(batch, **meta)
    if class_name == "FluxTransformer2DModel":
        image_tokens, text_tokens = shape_key
        inputs = dict(
            hidden_states=torch.zeros(batch, image_tokens, config.get("in_channels", 64), **meta),
            encoder_hidden_states=torch.zeros(batch, text_tokens, config.get("joint_attention_dim", 4096), **meta),
            pooled_projections=torch.zeros(batch, config.get("pooled_projection_dim", 768), **meta),
            timestep=t,
            img_ids=torch.zeros(image_tokens, 3, **meta),
            txt_ids=torch.zeros(text_tokens, 3, **meta),
        )
        if config.get("guidance_embeds", False):
            inputs["guidance"] = t
    elif class_name == "SD3Transformer2DModel":
        (height, width), text_tokens = shape_key
        inputs = dict(
            hidden_states=torch.zeros(batch, config.get("in_channels", 16), height, width, **meta),
            encoder_hidden_states=torch.zeros(batch, text_tokens, config.get("joint_attention_dim", 4096), **meta),
            pooled_projections=torch.zeros(batch, config.get("pooled_projection_dim", 2048), **meta),
            timestep=t,
        )
    elif class_name == "SanaTransformer2DModel":
        (height, width), text_tokens = shape_key
        inputs = dict(
            hidden_states=torch.zeros(batch, config.get("in_channels", 32), height, width, **meta),
            encoder_hidden_states=torch.zeros(batch, text_tokens, config.get("caption_channels", 2304), **meta),
            encoder_attention_mask=torch.ones(batch, text_tokens, **meta),
            timestep=t,
        )
        if config.get("guidance_embeds", False):
            inputs["guidance"] = t
    else:
        raise ConfigError(f"no FLOP model for transformer class {class_name!r}")
    return inputs


@functools.lru_cache(maxsize=64)
def _cached_forward_flops(class_name: str, config_json: str, shape_key: tuple) -> int:
    config = json.loads(config_json)
    model = _meta_model(class_name, config)
    with torch.device("meta"):  # tensors the forward creates (RoPE, masks) stay on meta too
        return count_flops(model, **_meta_inputs(class_name, config, shape_key), return_dict=False)


@dataclass(frozen=True)
class LinearLayer:
    """One nn.Linear of a transformer and the FLOPs it spends in one forward of one sample."""

    name: str  # qualified module name, as a quantization recipe sees it
    in_features: int
    out_features: int
    flops: float


@functools.lru_cache(maxsize=64)
def _cached_linear_layers(class_name: str, config_json: str, shape_key: tuple) -> tuple[float, tuple[LinearLayer, ...]]:
    config = json.loads(config_json)
    model = _meta_model(class_name, config)
    spent: dict[str, float] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def hook(mod, args, _output, name=name):
                rows = args[0].numel() // mod.in_features  # tokens (or images) through the layer
                spent[name] = spent.get(name, 0.0) + 2.0 * rows * mod.in_features * mod.out_features
            handles.append(module.register_forward_hook(hook))
    try:
        with torch.device("meta"):
            total = count_flops(model, **_meta_inputs(class_name, config, shape_key), return_dict=False)
    finally:
        for handle in handles:
            handle.remove()
    layers = tuple(LinearLayer(name, m.in_features, m.out_features, spent.get(name, 0.0))
                   for name, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    return float(total), layers


def linear_layers(class_name: str, config: dict, shape_key: tuple) -> tuple[float, tuple[LinearLayer, ...]]:
    """(FLOPs of one forward of one sample, every nn.Linear with the FLOPs it spends in it), counted on the
    meta device: the layers' shapes and token counts decide, no weights are needed. ``shape_key`` is
    (image tokens, text tokens) for FLUX and ((latent height, width), text tokens) for SD3 and SANA."""
    return _cached_linear_layers(class_name, _key(config), shape_key)


def _key(config: dict) -> str:
    return json.dumps({k: v for k, v in dict(config).items() if not k.startswith("_") or k == LINEAR_FFN},
                      sort_keys=True, default=list)


def flux_forward_flops(config: dict, *, image_tokens: int, text_tokens: int) -> float:
    """FLOPs of one FluxTransformer2DModel forward for one sample with these token counts."""
    return float(_cached_forward_flops("FluxTransformer2DModel", _key(config), (int(image_tokens), int(text_tokens))))


def sd3_forward_flops(config: dict, *, latent_hw: tuple[int, int], text_tokens: int) -> float:
    """FLOPs of one SD3Transformer2DModel forward for one sample of latent size latent_hw."""
    return float(_cached_forward_flops("SD3Transformer2DModel", _key(config), (tuple(latent_hw), int(text_tokens))))


def sana_forward_flops(config: dict, *, latent_hw: tuple[int, int], text_tokens: int) -> float:
    """FLOPs of one SanaTransformer2DModel forward for one sample of latent size latent_hw."""
    return float(_cached_forward_flops("SanaTransformer2DModel", _key(config), (tuple(latent_hw), int(text_tokens))))


@dataclass(frozen=True)
class RealModelSpec:
    """A real model's transformer architecture and the shapes it runs at."""

    hub_id: str
    class_name: str
    config: dict = field(hash=False)
    resolution: int  # native image side in pixels
    vae_factor: int  # pixels per latent position
    text_tokens: int  # encoder sequence length the pipeline pads to
    pack: int = 1  # FLUX packs 2x2 latent patches into one token

    def latent_hw(self, resolution: int | None = None) -> tuple[int, int]:
        side = (resolution or self.resolution) // self.vae_factor
        return side, side

    def shape_key(self, resolution: int | None = None, text_tokens: int | None = None) -> tuple:
        """The forward's shapes for one image at ``resolution`` with ``text_tokens`` (default: the
        pipeline's maximum, ``self.text_tokens``), as ``linear_layers`` takes them."""
        h, w = self.latent_hw(resolution)
        lt = self.text_tokens if text_tokens is None else int(text_tokens)
        if self.class_name == "FluxTransformer2DModel":
            return ((h // self.pack) * (w // self.pack), lt)
        return ((h, w), lt)

    def forward_flops(self, resolution: int | None = None) -> float:
        """FLOPs of one transformer forward for one image at ``resolution`` (default: native)."""
        return float(_cached_forward_flops(self.class_name, _key(self.config), self.shape_key(resolution)))

    def parameters(self) -> int:
        return sum(p.numel() for p in _meta_model(self.class_name, self.config).parameters())


def _cards(attribute: str):
    from solbench.models import CardView

    return CardView(attribute)


#: {model: RealModelSpec}: each model card's ``transformer`` (solbench/models/flux.py, sd3.py, sana.py), read live
REAL_MODELS = _cards("transformer")


def model_architecture(model: str, *, resolution: int | None = None, path: str | None = None,
                       text_tokens: int | None = None) -> tuple[str, dict, tuple]:
    """(diffusers class, transformer config, shape key) of a model of the registry at the shapes a run
    uses: from its card's ``architecture`` where its weights give it (the tiny model: the shipped weights'
    JSON, or ``path``'s), else from its card's ``transformer`` at ``resolution`` (None: native) and
    ``text_tokens`` (None: the pipeline's maximum)."""
    from solbench.models import cards

    found = cards().get(model)
    if found is not None and found.architecture is not None:
        return found.architecture(resolution=resolution, path=path, text_tokens=text_tokens)
    if found is None or found.transformer is None:
        raise ConfigError(f"no architecture for model {model!r}; known: "
                          f"{', '.join(n for n, c in cards().items() if c.architecture or c.transformer)}")
    spec = found.transformer
    return spec.class_name, spec.config, spec.shape_key(resolution, text_tokens)


# ---- VAE decoders (the image each rollout sample is scored on) ---------------------------------
#: The decoders of the real models' autoencoders, as diffusers configs (a model card's ``vae`` names one):
#: FLUX.1-dev and SD3.5 share the 16-channel AutoencoderKL layout (their vae/config.json); SANA uses the DC-AE
#: f32c32 (mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers, config.json).
VAE_CONFIGS: dict[str, tuple[str, dict, int]] = {
    "kl16": ("AutoencoderKL", dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                                   up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512],
                                   layers_per_block=2, latent_channels=16, use_quant_conv=False,
                                   use_post_quant_conv=False), 8),
    "dcae_f32c32": ("AutoencoderDC", dict(
        in_channels=3, latent_channels=32, attention_head_dim=32,
        encoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
        decoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
        encoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
        decoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
        encoder_layers_per_block=[2, 2, 2, 3, 3, 3], decoder_layers_per_block=[3, 3, 3, 3, 3, 3],
        encoder_qkv_multiscales=[[], [], [], [5], [5], [5]], decoder_qkv_multiscales=[[], [], [], [5], [5], [5]],
        upsample_block_type="interpolate", downsample_block_type="Conv", decoder_norm_types="rms_norm",
        decoder_act_fns="silu", scaling_factor=0.41407), 32),
}
MODEL_VAE = _cards("vae")  # {model: its card's VAE_CONFIGS key}, read live


@functools.lru_cache(maxsize=16)
def vae_decode_flops(model: str, resolution: int) -> float:
    """FLOPs of decoding one latent of a real model's autoencoder into a ``resolution`` x ``resolution`` image,
    counted on the meta device like the transformer forwards."""
    if model not in MODEL_VAE:
        raise ConfigError(f"no VAE config for model {model!r}; known: {', '.join(MODEL_VAE)}")
    class_name, config, factor = VAE_CONFIGS[MODEL_VAE[model]]
    vae = _meta_model(class_name, config)
    side = resolution // factor
    with torch.device("meta"):
        z = torch.zeros(1, config["latent_channels"], side, side)
        return float(count_flops(vae.decode, z))
