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

__all__ = ["Cond", "ModelAdapter", "MICRO_BATCH_DEFAULTS", "build_adapter", "model_names", "resolve_full_dtype",
           "native_resolution", "resolve_micro_batches", "shifted_sigmas", "default_lora_init", "check_model_settings",
           "LORA_INITS", "reference_defaults"]

# Per-rank micro-batches (RunConfig.micro_batch) a spec gets when it sets none: what fits an 80 GB H100
# (and so a B200) at the native 1024 px with an FP8 explore copy, the four reward models and gradient
# checkpointing (docs/real-models.md, "Memory per rank"; ``solbench doctor SPEC`` itemises it). None = the whole batch at once (the
# tiny model fits any batch). The real specs in experiments/ set their own values.
MICRO_BATCH_DEFAULTS: dict[str, dict[str, int | None]] = {
    "tiny": {"rollout": None, "reward": None, "train": None},
    "flux": {"rollout": 8, "reward": 32, "train": 4},
    "sd3": {"rollout": 8, "reward": 32, "train": 4},
    "sana": {"rollout": 32, "reward": 32, "train": 16},
}


NATIVE_RESOLUTION = {"flux": 1024, "sd3": 1024, "sana": 1024}  # pixels, when model.resolution is unset


def native_resolution(name: str) -> int | None:
    """The image side a real model generates at by default (None for the tiny model and unknown ones)."""
    return NATIVE_RESOLUTION.get(name)


def resolve_micro_batches(model_name: str, micro_batch: dict,
                          method_micro_batch: int | None = None) -> dict[str, int | None]:
    """The run's micro-batches: unset ones from MICRO_BATCH_DEFAULTS, ``train`` reconciled with the
    method's ``micro_batch_size`` (the same setting; one may be given, or both if equal).

    Raises ConfigError for a value below 1 or a conflict.
    """
    out = dict(micro_batch)
    for key in ("rollout", "reward", "train"):
        value = out.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"micro_batch.{key} must be an integer >= 1 or null (the model's default), got {value!r}")
    if method_micro_batch is not None and out.get("train") is not None and out["train"] != method_micro_batch:
        raise ConfigError(f"micro_batch.train={out['train']} and method_config.micro_batch_size={method_micro_batch} "
                          "disagree: they are the same setting; give one")
    if out.get("train") is None and method_micro_batch is not None:
        out["train"] = method_micro_batch
    defaults = MICRO_BATCH_DEFAULTS.get(model_name, {})
    for key in ("rollout", "reward", "train"):
        if out.get(key) is None:
            out[key] = defaults.get(key)
    return out

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_full_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The dtype of precision "full": "auto" is bfloat16 on CUDA and float32 on CPU.

    "native" is bfloat16 on CUDA and on CPUs with native bf16 arithmetic (AMX / AVX512_BF16, see
    solbench.machine.cpu), float32 elsewhere. It is opt-in: whether bf16 beats fp32 on a CPU depends on the
    GEMM kernels for that chip (docs/quantization.md has measurements), and fp32 keeps the numbers.
    """
    if name == "native":
        from solbench.machine.cpu import native_bf16

        return torch.bfloat16 if torch.device(device).type == "cuda" or native_bf16() else torch.float32
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"model.full_dtype: unknown dtype {name!r} (auto, native, {', '.join(_DTYPES)})") from None


# LoRA initialisation when finetune.lora_init is None: every reference trains its LoRA from
# init_lora_weights="gaussian" (Sana train_scripts/sol_rl: config.train.lora_init_mode; flow_grpo
# scripts/train_sd3.py and train_flux.py; advantage_weighted_matching scripts/train_sd3_awm.py). The tiny
# model keeps PEFT's default Kaiming-uniform init, with which its shipped results were made.
DEFAULT_LORA_INIT = {"tiny": "kaiming", "flux": "gaussian", "sd3": "gaussian", "sana": "gaussian"}
LORA_INITS = ("gaussian", "kaiming")
# What a real model's unset text length and prompt instruction mean (the Sol-RL references' values).
TEXT_MAX_LENGTH = {"flux": 128, "sd3": 128, "sana": 300}
# Settings only some models have (ModelConfig field -> models that read it).
MODEL_ONLY_SETTINGS = {"text_max_length": tuple(TEXT_MAX_LENGTH), "prompt_instruction": ("sana",),
                       "checkpoint": ("sana",)}


def reference_defaults(model_name: str) -> dict[str, dict]:
    """The settings a spec leaves unset that expansion writes out for ``model_name``, by section: the
    real models' reference defaults (so a run's id reflects them); nothing for the tiny model, whose
    runs keep their ids."""
    if model_name not in TEXT_MAX_LENGTH:
        return {}
    model = {"text_max_length": TEXT_MAX_LENGTH[model_name]}
    if model_name == "sana":
        model["prompt_instruction"] = False
    return {"model": model, "finetune": {"lora_init": default_lora_init(model_name)}}


def default_lora_init(model_name: str) -> str:
    """The LoRA init a run of ``model_name`` gets when finetune.lora_init is None."""
    return DEFAULT_LORA_INIT.get(model_name, "gaussian")


def check_model_settings(cfg: ModelConfig) -> None:
    """ConfigError for a setting the model does not have (e.g. a text length on the tiny model)."""
    for key, models in MODEL_ONLY_SETTINGS.items():
        value = getattr(cfg, key)
        if value not in (None, False) and cfg.name not in models:
            raise ConfigError(f"model.{key}: {cfg.name!r} has no such setting (only {', '.join(models)}); remove it")
    if cfg.text_max_length is not None and (not isinstance(cfg.text_max_length, int) or cfg.text_max_length < 1):
        raise ConfigError(f"model.text_max_length must be an integer >= 1 or null (the model's default), "
                          f"got {cfg.text_max_length!r}")
    from solbench.models.compile import check_setting
    from solbench.config import ROLLOUT_COPY_SETTINGS

    check_setting(cfg.compile)
    if cfg.rollout_copy not in ROLLOUT_COPY_SETTINGS:
        raise ConfigError(f"model.rollout_copy must be one of {', '.join(ROLLOUT_COPY_SETTINGS)}, got {cfg.rollout_copy!r}")


def _build_tiny(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter

    folder = None if cfg.path in (None, "pretrained", "random") else cfg.path  # load_tiny checks the folder
    return TinyAdapter(load_tiny(pretrained=cfg.path != "random", device=device, folder=folder), device=device,
                       full_dtype=dtype)


def _build_flux(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.flux import FluxAdapter

    return FluxAdapter.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                       cpu_offload=cfg.cpu_offload, max_sequence_length=cfg.text_max_length)


def _build_sd3(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.sd3 import SD3Adapter

    return SD3Adapter.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                      cpu_offload=cfg.cpu_offload, max_sequence_length=cfg.text_max_length)


def _build_sana(cfg: ModelConfig, device, dtype) -> ModelAdapter:
    from solbench.models.sana import SanaAdapter

    return SanaAdapter.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                       cpu_offload=cfg.cpu_offload, max_sequence_length=cfg.text_max_length,
                                       prompt_instruction=bool(cfg.prompt_instruction), checkpoint=cfg.checkpoint)


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
    check_model_settings(model_cfg)
    device = torch.device(device)
    adapter = builder(model_cfg, device, resolve_full_dtype(model_cfg.full_dtype, device))
    if model_cfg.gradient_checkpointing and hasattr(adapter.transformer, "enable_gradient_checkpointing"):
        adapter.transformer.enable_gradient_checkpointing()
    return adapter
