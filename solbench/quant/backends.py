"""Which backend runs a run's explore copy: ``quant.backend`` resolved on this machine.

``te`` (TransformerEngine), ``torch`` (torch's scaled matmul, solbench.quant.native) and
``emulated`` (fake quantization, any device) are taken as given. ``auto`` takes the first that
runs the recipe natively here: TransformerEngine, then torch's scaled matmul (on CUDA GPUs), and
emulation only with ``allow_emulated_fallback``; otherwise it fails, saying why each was passed
over. The choice and the reasons are recorded with the run (``BackendChoice.record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from . import layers
from .common import BackendUnavailableError
from .native import native_unavailable_reason
from .recipes import QuantRecipe

__all__ = ["BackendChoice", "choose_backend", "AUTO_ORDER"]

AUTO_ORDER = ("te", "torch")  # native backends, best first; emulation only as the allowed fallback


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
    scaled-matmul backend counts as native only on a CUDA GPU (on CPU it is a reference, not a speed-up)."""
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
    raise ValueError(f"unknown quant backend {backend!r} (emulated, te, torch, auto)")


def choose_backend(recipe: QuantRecipe, requested: str, *, allow_emulated_fallback: bool = False,
                   device: torch.device | str | None = None,
                   capability: Optional[tuple[int, int]] = None) -> BackendChoice:
    """Resolve ``requested`` (emulated | te | torch | auto) for ``recipe`` on ``device``.

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
