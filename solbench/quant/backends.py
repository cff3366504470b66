"""Which backend runs a run's explore copy: ``quant.backend`` resolved on this machine.

``te`` (TransformerEngine), ``torch`` (torch's scaled matmul, solbench.quant.native) and
``emulated`` (fake quantization, any device) and ``cpu_bf16`` (the same values on the CPU's bf16
units, solbench.quant.cpu_bf16) are taken as given. ``auto`` takes the first that runs the recipe
natively here: TransformerEngine, then torch's scaled matmul (on CUDA GPUs), then cpu_bf16 (on a CPU
with bf16 units: AVX512_BF16 or AMX), and emulation only with ``allow_emulated_fallback``; otherwise
it fails, saying why each was passed over. The choice and the reasons are recorded with the run (``BackendChoice.record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from . import layers
from .common import BackendUnavailableError
from .cpu_bf16 import cpu_bf16_unavailable_reason
from .native import native_unavailable_reason
from .recipes import QuantRecipe

__all__ = ["BackendChoice", "choose_backend", "AUTO_ORDER"]

AUTO_ORDER = ("te", "torch", "cpu_bf16")  # native backends, best first; emulation only as the allowed fallback


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
    """Why ``backend`` cannot run ``recipe`` here, or None. ``auto`` adds auto's own rule: the
    scaled-matmul backend counts as native only on a CUDA GPU (on CPU it is a reference, not a speed-up), and
    cpu_bf16 only on a CPU with bf16 units (elsewhere torch converts every bf16 product through fp32)."""
    if backend == "emulated":
        return None
    if backend == "te":
        return layers.te_unavailable_reason(recipe)
    if backend == "torch":
        on_gpu = capability is not None or (torch.device(device).type == "cuda" if device is not None
                                            else torch.cuda.is_available())
        if auto and not on_gpu:
            return "auto uses torch's scaled matmul on CUDA GPUs only"
        return native_unavailable_reason(recipe, "cuda" if capability is not None else device, capability)
    if backend == "cpu_bf16":
        if capability is not None or (device is not None and torch.device(device).type != "cpu"):
            return "cpu_bf16 runs on the CPU"
        if auto:
            from solbench.machine.cpu import native_bf16

            if not native_bf16():
                return "this CPU has no bf16 units (no avx512_bf16 or amx_bf16 flag): bf16 GEMMs would be emulated"
        return cpu_bf16_unavailable_reason(recipe, device)
    raise ValueError(f"unknown quant backend {backend!r} (emulated, te, torch, cpu_bf16, auto)")


def choose_backend(recipe: QuantRecipe, requested: str, *, allow_emulated_fallback: bool = False,
                   device: torch.device | str | None = None,
                   capability: Optional[tuple[int, int]] = None) -> BackendChoice:
    """Resolve ``requested`` (emulated | te | torch | cpu_bf16 | auto) for ``recipe`` on ``device``.

    An explicit backend that cannot run here falls back to emulation only with
    ``allow_emulated_fallback``; ``auto`` tries AUTO_ORDER first. Raises BackendUnavailableError
    naming every reason otherwise. ``capability`` stands for the GPU's compute capability (tests,
    and solbench doctor's view of a machine).
    """
    candidates = AUTO_ORDER if requested == "auto" else (requested,)
    passed_over: dict[str, str] = {}
    for backend in candidates:
        reason = unavailable_reason(recipe, backend, device, capability, auto=requested == "auto")
        if reason is None:
            return BackendChoice(requested, backend, recipe.name, passed_over)
        passed_over[backend] = reason
    if allow_emulated_fallback:
        return BackendChoice(requested, "emulated", recipe.name, passed_over)
    if requested == "te":
        layers._require_te(recipe)  # raises with TE's requirements spelled out
    reasons = "; ".join(f"{b}: {why}" for b, why in passed_over.items())
    raise BackendUnavailableError(
        f"quant.backend {requested!r} cannot run recipe {recipe.name!r} here ({reasons}). Run on a GPU whose "
        "tensor cores have the format (Blackwell for NVFP4, Hopper/Ada for FP8), use an FP8 recipe on Hopper, "
        "or set quant.backend: emulated / allow_emulated_fallback: true (exact numbers, no speed-up)")


def resolve_on_cpu(quant: dict, device: str, model: str, *, explores: bool = True) -> None:
    """``quant.backend: auto`` of a run that will run on this CPU, written out at expansion as the backend it
    takes here, so that the run id says what the run computes with (in place, on a resolved config dict).

    Applies where the run's device is this machine's CPU: ``device: cpu``, or ``device: auto`` for the tiny
    model on a machine without CUDA (the embedded world runs where it is expanded). On a CPU with bf16 units
    auto takes cpu_bf16 for a recipe it runs (new numbers, a new run id); elsewhere it takes emulation where
    the spec allows it, written as ``backend: emulated`` with the fallback flag at its default, so the run id
    is the one an ``emulated`` spec always had (the same numbers, the same results). The real models' specs
    (``device: cuda``, or a GPU node) resolve at run time as before (``choose_backend``). ``explores`` False (a
    method without an explore copy): nothing runs in low precision, written as emulation's whatever the CPU.
    """
    if quant.get("allow_emulated_fallback") is None:  # unset: on for auto only (solbench.config.emulated_fallback)
        quant["allow_emulated_fallback"] = quant.get("backend") == "auto"
    if quant.get("backend") != "auto":
        return
    if not (device == "cpu" or (device == "auto" and model == "tiny" and not torch.cuda.is_available())):
        return
    from .recipes import UnknownRecipeError, get_recipe

    try:
        recipe = get_recipe(quant["recipe"])
    except (UnknownRecipeError, KeyError):
        return  # the run's own checks name the recipe
    if explores and unavailable_reason(recipe, "cpu_bf16", "cpu", auto=True) is None:
        quant["backend"] = "cpu_bf16"
        quant["allow_emulated_fallback"] = False
    elif quant.get("allow_emulated_fallback") or not explores:
        quant["backend"] = "emulated"
        quant["allow_emulated_fallback"] = False
