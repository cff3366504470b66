"""The built-in quantization backends, registered in one place, and how ``quant.backend`` is resolved on a machine.

Each backend is one ``Backend`` record (solbench.quant.registry) registered below:

- ``emulated``: fake quantization in plain torch (solbench.quant.layers.QuantLinear), any device; the fallback.
- ``te``: TransformerEngine's te.Linear on Blackwell (NVFP4) / Hopper+ (FP8) GPUs (solbench.quant.layers.TELinear).
- ``torch``: torch's scaled matmul on the same tensor cores, no TE (solbench.quant.native).
- ``cpu_bf16``: the format's values on the CPU's bf16 units (solbench.quant.cpu_bf16).

An explicit backend is taken as given. ``auto`` takes the first that runs the recipe natively here, in the
registry's ``auto_order``: TransformerEngine, then torch's scaled matmul (on CUDA GPUs), then cpu_bf16 (on a CPU
with bf16 units: AVX512_BF16 or AMX), and emulation only with ``allow_emulated_fallback``; otherwise it fails,
saying why each was passed over. The choice and the reasons are recorded with the run (``BackendChoice.record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from . import layers, registry
from .common import BackendUnavailableError
from .cpu_bf16 import CpuBf16Linear, cpu_bf16_unavailable_reason
from .native import NativeLinear, native_unavailable_reason
from .recipes import QuantRecipe
from .registry import AUTO, Backend, register

__all__ = ["BackendChoice", "choose_backend", "auto_order", "resolve_on_cpu", "unavailable_reason"]


def auto_order() -> tuple[str, ...]:
    """The native backends auto tries, best first (solbench.quant.registry.auto_order)."""
    return registry.auto_order()


# --------------------------------------------------------------------------------------------
# The built-in backends: the one place their names, availability rules and layers are written
# --------------------------------------------------------------------------------------------


def _on_gpu(device, capability) -> bool:
    return capability is not None or (torch.device(device).type == "cuda" if device is not None
                                      else torch.cuda.is_available())


def _emulated_unavailable(recipe, device, capability, auto) -> Optional[str]:
    return None  # fake quantization runs anywhere


def _te_unavailable(recipe, device, capability, auto) -> Optional[str]:
    return layers.te_unavailable_reason(recipe)  # looked up here, so a test can stand in for TE's absence


def _torch_unavailable(recipe, device, capability, auto) -> Optional[str]:
    if auto and not _on_gpu(device, capability):
        return "auto uses torch's scaled matmul on CUDA GPUs only"
    return native_unavailable_reason(recipe, "cuda" if capability is not None else device, capability)


def _cpu_bf16_unavailable(recipe, device, capability, auto) -> Optional[str]:
    if capability is not None or (device is not None and torch.device(device).type != "cpu"):
        return "cpu_bf16 runs on the CPU"
    if auto:
        from solbench.machine.cpu import native_bf16

        if not native_bf16():
            return "this CPU has no bf16 units (no avx512_bf16 or amx_bf16 flag): bf16 GEMMs would be emulated"
    return cpu_bf16_unavailable_reason(recipe, device)


def _emulated_layer(linear, recipe, *, name, shared_inputs, weight, bias):
    return layers.QuantLinear.from_linear(linear, recipe, name=name, shared_inputs=shared_inputs, weight=weight,
                                          bias=bias)


def _te_layer(linear, recipe, *, name, shared_inputs, weight, bias):
    return layers.TELinear(linear, recipe, name=name, weight=weight, bias=bias)


def _loaded(cls):
    """A factory building ``cls`` (in_features, out_features, bias, recipe, ...) and loading the weights in."""
    def make(linear, recipe, *, name, shared_inputs, weight, bias):
        layer = cls(linear.in_features, linear.out_features, bias is not None, recipe, name=name,
                    dtype=weight.dtype, device=weight.device, shared_inputs=shared_inputs)
        layer.load_weight(weight, bias)
        return layer
    return make


register(Backend("emulated", "emulated backend (fake-quantized in full precision)", low_precision=False,
                 unavailable=_emulated_unavailable, make_layer=_emulated_layer, layer_types=(layers.QuantLinear,),
                 shares_inputs=True, is_fallback=True))
register(Backend("te", "TransformerEngine backend", low_precision=True, unavailable=_te_unavailable,
                 make_layer=_te_layer, layer_types=(layers.TELinear,), feature_multiple=16, auto_rank=0,
                 device_types=("cuda",), requirements=layers.TE_REQUIREMENTS))
register(Backend("torch", "torch scaled-matmul backend", low_precision=True, unavailable=_torch_unavailable,
                 make_layer=_loaded(NativeLinear), layer_types=(NativeLinear,), feature_multiple=16,
                 shares_inputs=True, auto_rank=1))
register(Backend("cpu_bf16", "cpu_bf16 backend (the format's values on the CPU's bf16 units)", low_precision=True,
                 unavailable=_cpu_bf16_unavailable, make_layer=_loaded(CpuBf16Linear), layer_types=(CpuBf16Linear,),
                 feature_multiple=16, shares_inputs=True, auto_rank=2, device_types=("cpu",)))


# --------------------------------------------------------------------------------------------
# Resolving quant.backend
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run's explore copy uses, and why the ones before it in ``auto`` were passed over."""

    requested: str
    backend: str
    recipe: str
    passed_over: dict = field(default_factory=dict)  # backend -> reason

    def record(self) -> dict:
        """What a run stores about it (explore.json)."""
        return {"recipe": self.recipe, "backend_requested": self.requested, "backend": self.backend,
                "passed_over": dict(self.passed_over)}

    def describe(self) -> str:
        skipped = "; ".join(f"{b}: {why}" for b, why in self.passed_over.items())
        return f"explore copy {self.recipe}: backend {self.backend}" + (f" (passed over {skipped})" if skipped else "")


def unavailable_reason(recipe: QuantRecipe, backend: str, device: torch.device | str | None = None,
                       capability: Optional[tuple[int, int]] = None, *, auto: bool = False) -> Optional[str]:
    """Why ``backend`` cannot run ``recipe`` here, or None (the registry's answer, decided once per process).
    ``auto`` adds auto's own rule: the scaled-matmul backend counts as native only on a CUDA GPU (on CPU it is a
    reference, not a speed-up), and cpu_bf16 only on a CPU with bf16 units (elsewhere torch converts every bf16
    product through fp32)."""
    return registry.unavailable_reason(backend, recipe, device, capability, auto=auto)


def choose_backend(recipe: QuantRecipe, requested: str, *, allow_emulated_fallback: bool = False,
                   device: torch.device | str | None = None,
                   capability: Optional[tuple[int, int]] = None) -> BackendChoice:
    """Resolve ``requested`` (a registered backend, or auto) for ``recipe`` on ``device``.

    An explicit backend that cannot run here falls back to emulation only with
    ``allow_emulated_fallback``; ``auto`` tries the registry's auto order first. Raises BackendUnavailableError
    naming every reason otherwise. ``capability`` stands for the GPU's compute capability (tests,
    and solbench doctor's view of a machine).
    """
    candidates = auto_order() if requested == AUTO else (requested,)
    passed_over: dict[str, str] = {}
    for backend in candidates:
        reason = unavailable_reason(recipe, backend, device, capability, auto=requested == AUTO)
        if reason is None:
            return BackendChoice(requested, backend, recipe.name, passed_over)
        passed_over[backend] = reason
    emulated = registry.fallback().name
    if allow_emulated_fallback:
        return BackendChoice(requested, emulated, recipe.name, passed_over)
    if requested != AUTO and registry.get_backend(requested).requirements:  # raises with its requirements spelled out
        raise BackendUnavailableError(registry.get_backend(requested).unavailable_message(recipe, passed_over[requested]))
    reasons = "; ".join(f"{b}: {why}" for b, why in passed_over.items())
    raise BackendUnavailableError(
        f"quant.backend {requested!r} cannot run recipe {recipe.name!r} here ({reasons}). Run on a GPU whose "
        "tensor cores have the format (Blackwell for NVFP4, Hopper/Ada for FP8), use an FP8 recipe on Hopper, "
        f"or set quant.backend: {emulated} / allow_emulated_fallback: true (exact numbers, no speed-up)")


def resolve_on_cpu(quant: dict, device: str, model: str, *, explores: bool = True) -> None:
    """``quant.backend: auto`` of a run that will run on this CPU, written out at expansion as the backend it
    takes here, so that the run id says what the run computes with (in place, on a resolved config dict).

    Applies where the run's device is this machine's CPU: ``device: cpu``, or ``device: auto`` for the tiny
    model on a machine without CUDA (the embedded world runs where it is expanded). On a CPU with bf16 units
    auto takes cpu_bf16 for a recipe it runs (the first backend of auto's order that computes on the CPU and
    runs the recipe here: new numbers, a new run id); elsewhere it takes emulation where
    the spec allows it, written as ``backend: emulated`` with the fallback flag at its default, so the run id
    is the one an ``emulated`` spec always had (the same numbers, the same results). The real models' specs
    (``device: cuda``, or a GPU node) resolve at run time as before (``choose_backend``). ``explores`` False (a
    method without an explore copy): nothing runs in low precision, written as emulation's whatever the CPU.
    """
    if quant.get("allow_emulated_fallback") is None:  # unset: on for auto only (solbench.config.emulated_fallback)
        quant["allow_emulated_fallback"] = quant.get("backend") == AUTO
    if quant.get("backend") != AUTO:
        return
    if not (device == "cpu" or (device == "auto" and model == "tiny" and not torch.cuda.is_available())):
        return
    from .recipes import UnknownRecipeError, get_recipe

    try:
        recipe = get_recipe(quant["recipe"])
    except (UnknownRecipeError, KeyError):
        return  # the run's own checks name the recipe
    on_cpu = [name for name in auto_order() if "cpu" in registry.get_backend(name).device_types]
    native = next((name for name in on_cpu if unavailable_reason(recipe, name, "cpu", auto=True) is None), None)
    if explores and native is not None:
        quant["backend"] = native
        quant["allow_emulated_fallback"] = False
    elif quant.get("allow_emulated_fallback") or not explores:
        quant["backend"] = registry.fallback().name
        quant["allow_emulated_fallback"] = False
