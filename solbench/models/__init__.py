"""Model adapters: the ModelAdapter interface, the registry of model cards and the tiny, FLUX, SD3 and SANA adapters.

Each adapter module holds its model's card (solbench.models.card.ModelCard: defaults, weights and files, FLOP
formula, activation probe); ``cards()`` finds them and generic code reads them. ``build_adapter(model_cfg,
device)`` turns a ModelConfig into a ready adapter with its card's builder. The adapter modules import diffusers
lazily, so the tiny model never pays for importing the real pipelines.

Stage ``models`` (solbench/stages.py): it imports its own modules and the stages below it, quant, world, report,
results, machine, text, base.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping

import torch

from solbench.config import ModelConfig
from solbench.errors import ConfigError
from solbench.models.base import Cond, ModelAdapter, shifted_sigmas
from solbench.models.card import OPTIONAL_SETTINGS, ModelCard

__all__ = ["Cond", "ModelAdapter", "ModelCard", "CardView", "cards", "card", "model_names", "build_adapter",
           "MICRO_BATCH_DEFAULTS", "TEXT_MAX_LENGTH", "DEFAULT_EXPLORE_RECIPES", "OPTIONAL_SETTINGS", "LORA_INITS",
           "resolve_full_dtype", "native_resolution", "resolve_micro_batches", "shifted_sigmas", "default_lora_init",
           "check_model_settings", "reference_defaults", "setting_models"]


# ---- the registry: one card per adapter module (solbench.models.card) ----------------------------

_CARDS: dict[str, ModelCard] = {}
_FINDING = False


def cards() -> dict[str, ModelCard]:
    """Every model's card by name, in listing order: the ``CARD`` of each module of this package, found on first
    use (a module imports its adapter's dependencies lazily, so this loads no pipeline). Tests register a fake
    model by adding its card to this dict."""
    global _FINDING
    if not _CARDS:
        if _FINDING:
            raise RuntimeError("solbench.models.cards() was called while the cards are being found (a models "
                               "module reads the registry at import time; read it inside a function)")
        import importlib
        import pkgutil

        _FINDING = True
        try:
            found = []
            for info in pkgutil.iter_modules(__path__):
                module = importlib.import_module(f"{__name__}.{info.name}")
                if isinstance(getattr(module, "CARD", None), ModelCard):
                    found.append(module.CARD)
        finally:
            _FINDING = False
        _CARDS.update((c.name, c) for c in sorted(found, key=lambda c: (c.order, c.name)))
    return _CARDS


def card(name: str) -> ModelCard:
    """The card of model ``name``; an unknown name fails with close matches."""
    found = cards().get(name)
    if found is None:
        close = difflib.get_close_matches(str(name), cards(), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"model.name: unknown model {name!r}{hint} (models: {', '.join(model_names())})")
    return found


class CardView(Mapping):
    """{model: one field of its card (or what ``value`` makes of the card)} over the models whose card has it
    (not None), read live from the registry: the per-model tables the generic modules used to keep, derived
    from the cards."""

    def __init__(self, attribute: str, value: Callable[[ModelCard], object] | None = None) -> None:
        self.attribute = attribute
        self.value = value or (lambda c: getattr(c, attribute))

    def __getitem__(self, name: str):
        value = self.value(cards()[name]) if name in cards() else None
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self):
        return iter([n for n, c in cards().items() if self.value(c) is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return f"CardView({self.attribute!r}: {dict(self)!r})"


# Per-rank micro-batches (RunConfig.micro_batch) a spec gets when it sets none (ModelCard.micro_batch): what fits
# an 80 GB H100 (and so a B200) at the native 1024 px with an FP8 explore copy, the four reward models and gradient
# checkpointing (docs/real-models.md, "Memory per rank"; ``solbench doctor SPEC`` itemises it). None = the whole
# batch at once (the tiny model fits any batch). The real specs in experiments/ set their own values.
MICRO_BATCH_DEFAULTS = CardView("micro_batch")


#: {model: T5 / Gemma tokens of an unset model.text_max_length} (ModelCard.text_max_length; the real models')
TEXT_MAX_LENGTH = CardView("text_max_length")
#: {model: the explore recipe where neither a run nor a command names one} (ModelCard.explore_recipe: the recipe
#: its paper-setting spec explores with, experiments/*_main.yaml; ``solbench fidelity``, the reports' primary
#: fidelity claim)
DEFAULT_EXPLORE_RECIPES = CardView("explore_recipe")


def native_resolution(name: str) -> int | None:
    """The image side a real model generates at by default (None for the tiny model and unknown ones)."""
    found = cards().get(name)
    return None if found is None else found.native_resolution


def resolve_micro_batches(model_name: str, micro_batch: dict,
                          method_micro_batch: int | None = None) -> dict[str, int | None]:
    """The run's micro-batches: unset ones from the model's card, ``train`` reconciled with the
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


# LoRA initialisations (ModelCard.lora_init is the model's when finetune.lora_init is None): every reference trains
# its LoRA from init_lora_weights="gaussian" (Sana train_scripts/sol_rl: config.train.lora_init_mode; flow_grpo
# scripts/train_sd3.py and train_flux.py; advantage_weighted_matching scripts/train_sd3_awm.py). The tiny
# model keeps PEFT's default Kaiming-uniform init, with which its shipped results were made.
LORA_INITS = ("gaussian", "kaiming")


def setting_models(key: str) -> tuple[str, ...]:
    """The models that read the optional ModelConfig setting ``key`` (ModelCard.settings)."""
    return tuple(name for name, c in cards().items() if key in c.settings)


def reference_defaults(model_name: str) -> dict[str, dict]:
    """The settings a spec leaves unset that expansion writes out for ``model_name``, by section: the
    real models' reference defaults (so a run's id reflects them); nothing for the tiny model, whose
    runs keep their ids."""
    found = cards().get(model_name)
    if found is None or found.text_max_length is None:
        return {}
    model = {"text_max_length": found.text_max_length, **found.setting_defaults}
    return {"model": model, "finetune": {"lora_init": found.lora_init}}


def default_lora_init(model_name: str) -> str:
    """The LoRA init a run of ``model_name`` gets when finetune.lora_init is None."""
    found = cards().get(model_name)
    return "gaussian" if found is None else found.lora_init


def check_model_settings(cfg: ModelConfig) -> None:
    """ConfigError for a setting the model does not have (e.g. a text length on the tiny model)."""
    for key in OPTIONAL_SETTINGS:
        models = setting_models(key)
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


def model_names() -> list[str]:
    return sorted(cards())


def build_adapter(model_cfg: ModelConfig, device: torch.device | str = "cpu") -> ModelAdapter:
    """The adapter for ``model_cfg`` on ``device`` (its card's builder); unknown names fail with close matches."""
    builder = card(model_cfg.name).build
    check_model_settings(model_cfg)
    device = torch.device(device)
    adapter = builder(model_cfg, device, resolve_full_dtype(model_cfg.full_dtype, device))
    if model_cfg.gradient_checkpointing and hasattr(adapter.transformer, "enable_gradient_checkpointing"):
        adapter.transformer.enable_gradient_checkpointing()
    return adapter
