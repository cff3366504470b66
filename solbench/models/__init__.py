"""Model adapters: the ModelAdapter interface and the tiny, FLUX, SD3 and SANA adapters.

``build_adapter(model_cfg, device)`` turns a ModelConfig into a ready adapter. Each builder imports
its module lazily, so the tiny model never pays for importing the real pipelines.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import torch

from solbench.config import ModelConfig
from solbench.errors import ConfigError
from solbench.models.base import Cond, ModelAdapter, shifted_sigmas

__all__ = ["Cond", "ModelAdapter", "build_adapter", "model_names", "resolve_full_dtype", "shifted_sigmas"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_full_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The dtype of precision "full": "auto" is bfloat16 on CUDA and float32 on CPU.

    (On CPU bf16 matmuls run about 5x slower than fp32, so full precision there is fp32.)
    """
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"model.full_dtype: unknown dtype {name!r} (auto, {', '.join(_DTYPES)})") from None


def _build_tiny(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter

    if cfg.path not in (None, "pretrained", "random"):
        raise ConfigError(f"model.path for tiny must be unset, 'pretrained' or 'random', got {cfg.path!r}")
    return TinyAdapter(load_tiny(pretrained=cfg.path != "random", device=device), device=device, full_dtype=dtype)


def _build_flux(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.flux import FluxAdapter

    return FluxAdapter.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                       cpu_offload=cfg.cpu_offload)


def _build_sd3(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.sd3 import SD3Adapter

    return SD3Adapter.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                      cpu_offload=cfg.cpu_offload)


def _build_sana(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.sana import SanaAdapter

    return SanaAdapter.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                       cpu_offload=cfg.cpu_offload)


_BUILDERS: dict[str, Callable[[ModelConfig, torch.device, torch.dtype], ModelAdapter]] = {
    "tiny": _build_tiny,
    "flux": _build_flux,
    "sd3": _build_sd3,
    "sana": _build_sana,
}


def model_names() -> list[str]:
    return sorted(_BUILDERS)


def build_adapter(model_cfg: ModelConfig, device: torch.device | str = "cpu") -> ModelAdapter:
    """The adapter for ``model_cfg`` on ``device``; unknown names fail with close matches."""
    builder = _BUILDERS.get(model_cfg.name)
    if builder is None:
        close = difflib.get_close_matches(model_cfg.name, _BUILDERS, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"model.name: unknown model {model_cfg.name!r}{hint} (models: {', '.join(model_names())})")
    device = torch.device(device)
    adapter = builder(model_cfg, device, resolve_full_dtype(model_cfg.full_dtype, device))
    if model_cfg.gradient_checkpointing and hasattr(adapter.transformer, "enable_gradient_checkpointing"):
        adapter.transformer.enable_gradient_checkpointing()
    return adapter
