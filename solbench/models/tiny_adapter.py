"""Adapter for the embedded tiny model (solbench.models.tiny.TinyT2I).

The tiny model works in pixel space: its "latents" are the 32x32 RGB images in [-1, 1] themselves,
so decoding is a rescale to [0, 1]. Its text encoder is cheap, but conditioning is still cached
per prompt like the real models'. Classifier-free guidance uses the empty prompt, on which the
model was trained with caption dropout.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from solbench.models import flops
from solbench.models.base import Cond, ModelAdapter
from solbench.models.card import ModelCard


class TinyAdapter(ModelAdapter):
    name = "tiny"
    guidance_mode = "cfg"
    default_shift = None  # per instance: the weights' config.shift (None = 1, a uniform grid)
    default_guidance = None  # no CFG unless asked for

    def __init__(self, model, device: torch.device | str = "cpu", full_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.device = torch.device(device)
        self.full_dtype = full_dtype
        self.model = model.to(self.device)
        self.model.text_encoder.to(torch.float32)  # frozen; its outputs are cast per network
        self.transformer = self.model.transformer
        if self.transformer.dtype != full_dtype:  # a no-op .to() still makes diffusers warn
            self.transformer.to(full_dtype)
        self.latent_shape = tuple(model.config.latent_shape)
        self.resolution = int(model.config.resolution)  # pixel space: the only resolution it samples at
        # The sigma shift the weights were chosen with (tiny_t2i.json; v1: 1.0, a uniform grid).
        self.default_shift = None if model.config.shift == 1.0 else float(model.config.shift)
        self._flops: float | None = None

    def _encode_batch(self, prompts: list[str]) -> Cond:
        tokens, pooled = self.model.encode(prompts)
        return Cond({"tokens": tokens.float(), "pooled": pooled.float()})

    def _forward(self, net: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None) -> Tensor:
        return self.model.velocity(net, x_t, t, cond["tokens"], cond["pooled"])

    def decode(self, latents: Tensor) -> Tensor:
        return ((latents.float() + 1) / 2).clamp(0, 1)

    def flops_per_forward(self) -> float | None:
        """FLOPs of one transformer forward for one sample, counted once by torch's FlopCounter."""
        if self._flops is None:
            cfg = self.model.config
            self._flops = flops.flux_forward_flops(
                dict(self.transformer.config), image_tokens=cfg.tokens_per_side**2, text_tokens=cfg.max_length)
        return self._flops


def _build(cfg, device, dtype) -> TinyAdapter:
    from solbench.models.tiny import load_tiny

    folder = None if cfg.path in (None, "pretrained", "random") else cfg.path  # load_tiny checks the folder
    return TinyAdapter(load_tiny(pretrained=cfg.path != "random", device=device, folder=folder), device=device,
                       full_dtype=dtype)


def _architecture(*, resolution: int | None = None, path: str | None = None,
                  text_tokens: int | None = None) -> tuple[str, dict, tuple]:
    """The tiny transformer's (class, config, shape key) from its weights' JSON (the shipped one, or ``path``'s);
    it samples at one resolution and text length, so the other arguments do not change it."""
    import json
    from pathlib import Path

    from solbench.errors import ConfigError
    from solbench.models.tiny import ASSET_NAME, TinyT2IConfig, asset_path, build_transformer

    source = (Path(path).expanduser() / f"{ASSET_NAME}.json") if path else asset_path(f"{ASSET_NAME}.json")
    if not source.is_file():
        raise ConfigError(f"tiny model: no {source} to read the architecture from")
    cfg = TinyT2IConfig.from_dict(json.loads(source.read_text()))
    with torch.device("meta"):
        config = dict(build_transformer(cfg).config)
    return "FluxTransformer2DModel", config, (cfg.tokens_per_side ** 2, cfg.max_length)


# Embedded (nothing to download or check), whole batches (it fits any), PEFT's default Kaiming-uniform LoRA init
# (its shipped results were made with it), FLUX.1's explore rule scaled to its width; no settings of the real
# models (text length, instruction, checkpoint) and no reference defaults written out, so its runs keep their ids.
CARD = ModelCard(name="tiny", order=0, build=_build, adapter=TinyAdapter, explore_recipe="nvfp4_tiny_flux",
                 lora_init="kaiming", architecture=_architecture)
