"""The registry of quantization backends: what runs a copy's quantized layers, one ``Backend`` record each.

A backend is named by ``quant.backend`` (or ``auto``, which picks one: solbench.quant.backends.choose_backend).
Its record says everything generic code asks about it: its name and what it is in words (the report's label,
recorded with each run's facts), whether it computes on low-precision units (a clock of its copy speaks to the
method's speed), whether it can run a recipe here and if not why (``unavailable``), the layer it puts in place of
an nn.Linear (``make_layer``, with the layer classes it makes), the feature multiple its kernels need, whether
layers reading one tensor may share its quantization, and where ``auto`` tries it.

The built-in backends are registered in one place, solbench.quant.backends (imported by the package, so before any
module of solbench.quant is used; this module imports none of them). A new
backend is one ``register(Backend(...))`` call there (or in a test, or a plug-in); expansion (solbench.spec),
trainer setup (solbench.train.setup), ``quantized_copy`` and the run facts (the report's labels) read it from here.

Whether a backend can run a recipe is decided once per process: ``unavailable_reason`` caches its answer per
(backend, recipe, device, capability, auto); ``clear_cache`` forgets them (tests that fake a machine call it).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from .common import BackendUnavailableError

__all__ = ["Backend", "AUTO", "register", "unregister", "get_backend", "backend_names", "requestable_names",
           "auto_order", "fallback", "unavailable_reason", "require", "clear_cache", "layer_types",
           "UnknownBackendError", "check_name"]

#: The request that is not a backend: take the first of ``auto_order()`` that runs the recipe here.
AUTO = "auto"
#: auto in words, as reports name a spec's unresolved request (recorded with the run facts beside the backends').
AUTO_LABEL = "backend auto (each run's choice in its explore.json)"


class UnknownBackendError(ValueError):
    """A backend name that no ``Backend`` is registered under (the message has a did-you-mean)."""


@dataclass(frozen=True)
class Backend:
    """One quantization backend, as every generic part of solbench asks about it.

    name: its ``quant.backend`` value.
    label: what it is in words ("torch scaled-matmul backend"), as reports name it (recorded with run facts).
    low_precision: whether its copy computes on low-precision units (GPU tensor cores, the CPU's bf16 units);
        False for emulation, whose clock says nothing about the method's speed.
    unavailable: ``(recipe, device, capability, auto) -> reason | None``: why it cannot run ``recipe`` on
        ``device`` (None: the current GPU, else CPU; ``capability`` stands for a CUDA device's compute
        capability), ``auto`` adding auto's own rule (a backend that runs here but is no speed-up).
    make_layer: ``(linear, recipe, *, name, shared_inputs, weight, bias) -> nn.Module``: the layer replacing
        ``linear``, its weights quantized from ``weight``/``bias``.
    layer_types: the classes ``make_layer`` builds (sync_weights and the statistics find quantized layers by them).
    feature_multiple: in/out features its kernels need a multiple of (a Linear that is not stays in full precision).
    shares_inputs: layers reading one tensor may quantize it once (quantized_copy's ``share_input_quantization``).
    auto_rank: its place in ``auto``'s order (lower first); None: auto never takes it.
    device_types: the device types it computes on (expansion writes auto out for a CPU run only among "cpu" ones).
    requirements: what it needs, in words, appended to the error of an explicit request it cannot serve ('': none).
    is_fallback: the backend that runs anywhere (emulation), taken where ``allow_emulated_fallback`` allows.
    """

    name: str
    label: str
    low_precision: bool
    unavailable: Callable[..., Optional[str]]
    make_layer: Callable[..., "torch.nn.Module"]
    layer_types: Tuple[type, ...] = ()
    feature_multiple: int = 1
    shares_inputs: bool = False
    auto_rank: Optional[int] = None
    device_types: Tuple[str, ...] = ("cpu", "cuda")
    requirements: str = ""
    is_fallback: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == AUTO:
            raise ValueError(f"a backend's name must be a non-empty string other than {AUTO!r}, got {self.name!r}")
        if not callable(self.unavailable) or not callable(self.make_layer):
            raise ValueError(f"backend {self.name!r}: unavailable and make_layer must be callables")

    def unavailable_message(self, recipe, reason: str) -> str:
        """The error for an explicit use of this backend that cannot run ``recipe`` (``reason``)."""
        if self.requirements:
            return f"recipe {recipe.name!r}: {reason}. {self.requirements}"
        return f"recipe {recipe.name!r}, backend {self.name!r}: {reason}"

    def record(self) -> dict:
        """What the run facts store about it (the report reads these, never this registry)."""
        return {"label": self.label, "low_precision": bool(self.low_precision)}


_BACKENDS: Dict[str, Backend] = {}
_CACHE: Dict[tuple, Optional[str]] = {}


def register(backend: Backend, *, replace: bool = False) -> Backend:
    """Add ``backend`` to the registry (``replace``: over one of the same name)."""
    if backend.name in _BACKENDS and not replace:
        raise ValueError(f"a quantization backend {backend.name!r} is registered already")
    if backend.is_fallback and any(b.is_fallback for n, b in _BACKENDS.items() if n != backend.name):
        raise ValueError(f"backend {backend.name!r}: the registry has a fallback backend already ({fallback().name})")
    _BACKENDS[backend.name] = backend
    clear_cache()
    return backend


def unregister(name: str) -> None:
    """Remove the backend ``name`` (tests that registered one)."""
    _BACKENDS.pop(name, None)
    clear_cache()


def backend_names() -> Tuple[str, ...]:
    """Every registered backend's name, in registration order."""
    return tuple(_BACKENDS)


def requestable_names() -> Tuple[str, ...]:
    """What ``quant.backend`` may say: every backend, and ``auto``."""
    return backend_names() + (AUTO,)


def _unknown(name) -> str:
    known = requestable_names()
    close = difflib.get_close_matches(str(name), known, n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"must be {', '.join(known[:-1])} or {known[-1]}, got {name!r}{hint}"


def check_name(name) -> Optional[str]:
    """None where ``quant.backend`` may say ``name``; else what it must be (with a did-you-mean)."""
    return None if isinstance(name, str) and name in requestable_names() else _unknown(name)


def get_backend(name: str) -> Backend:
    """The registered backend ``name``; UnknownBackendError (naming the known ones, with a did-you-mean) else."""
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise UnknownBackendError(f"unknown quant backend {name!r}: quant.backend {_unknown(name)}") from None


def auto_order() -> Tuple[str, ...]:
    """The backends ``auto`` tries, best first (emulation only as the allowed fallback, after them)."""
    ranked = [b for b in _BACKENDS.values() if b.auto_rank is not None]
    return tuple(b.name for b in sorted(ranked, key=lambda b: b.auto_rank))


def fallback() -> Backend:
    """The backend that runs anywhere (emulation)."""
    return next(b for b in _BACKENDS.values() if b.is_fallback)


def layer_types() -> Tuple[type, ...]:
    """Every class a registered backend builds for a quantized Linear."""
    out: list = []
    for backend in _BACKENDS.values():
        out += [t for t in backend.layer_types if t not in out]
    return tuple(out)


def _device_key(device):
    return None if device is None else str(torch.device(device))


def unavailable_reason(name: str, recipe, device=None, capability: Optional[Tuple[int, int]] = None, *,
                       auto: bool = False) -> Optional[str]:
    """Why backend ``name`` cannot run ``recipe`` here, or None; decided once per process per (backend, recipe,
    device, capability, auto) and remembered."""
    backend = get_backend(name)
    key = (name, recipe, _device_key(device), None if capability is None else tuple(capability), bool(auto))
    try:
        hash(key)
    except TypeError:  # a recipe that cannot be hashed (a field holding a list): asked each time
        return backend.unavailable(recipe, device, capability, auto)
    if key not in _CACHE:
        _CACHE[key] = backend.unavailable(recipe, device, capability, auto)
    return _CACHE[key]


def require(name: str, recipe, device=None) -> None:
    """Raise BackendUnavailableError (saying what the backend needs) when ``name`` cannot run ``recipe`` here."""
    reason = unavailable_reason(name, recipe, device)
    if reason is not None:
        raise BackendUnavailableError(get_backend(name).unavailable_message(recipe, reason))


def clear_cache() -> None:
    """Forget every availability decided so far (a test that fakes the machine; a registry change)."""
    _CACHE.clear()
