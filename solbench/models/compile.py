"""Compiled rollout forwards: each repeated transformer block of a sampling network under torch.compile.

``model.compile`` decides (``resolve_compile``): ``auto`` compiles on CUDA and not on CPU, ``on`` and
``off`` say so, and a torch.compile mode name (``max-autotune-no-cudagraphs``, the reference's) compiles
in that mode. ``compile_blocks(model, mode)`` compiles the blocks the model repeats: diffusers'
``compile_repeated_blocks`` where the model declares its ``_repeated_blocks`` (FLUX), else every
block of its block lists (``transformer_blocks``, ``single_transformer_blocks``: SD3, SANA), each with
``nn.Module.compile``. Blocks of one class share their compiled code (regional compilation): one
compile per class and variant, not per block.

Only sampling runs compiled: a compiled block runs its compiled code inside ``sampling()`` (the
engine's rollout and evaluation loops, under no_grad) and its eager forward everywhere else, so the
training forward and backward (gradient checkpointing, LoRA gradients) and the loss's reference and
old-policy forwards stay as they were, as in the reference, whose training transformer is not
compiled (NVlabs/Sana train_scripts/sol_rl/train_flux1.py at 6926be6: line 744 compiles the inference
copies, line 778 wraps the trained transformer in DDP uncompiled). The explore copy, the merged
rollout copy and the shared LoRA transformer (the LoRA rollout path) are compiled alike.

Mode: ``on`` (and ``auto`` on CUDA) is torch.compile's "default" mode: inductor fuses the blocks'
elementwise work (norms, modulation, rotary embedding, activations, the FP8 input quantizer of
solbench.quant.native) into generated kernels and leaves the GEMMs to cuBLAS, compiling FLUX's two
block classes in about a minute. The reference's "max-autotune-no-cudagraphs" (train_flux1.py line
688, configs/sol_rl/flux1.py line 52) adds autotuning of every GEMM shape against Triton templates:
minutes of compilation per model, which does not fit the 8-minute device check that measures it
(scripts/gpu_measure.sh), and on large bf16 GEMMs cuBLAS is the usual winner. Neither uses CUDA
graphs (the copies' weights change in place after every update). ``model.compile:
max-autotune-no-cudagraphs`` runs the reference's mode. Every mode adds inductor's eager division
rounding (``compile_options``): Triton's ``/`` is approximate, and the FP8 input quantizer traced into a
block divides to find its scale, which must equal solbench's quantizer's bit for bit.

Shapes: a rollout repeats its shapes every iteration (the same micro-batches, resolution and text
length); dynamo's automatic dynamic shapes compile a block once per variant at its first shape and
once more, with a dynamic batch size, when a second batch size appears (a last micro-batch that is
smaller), so all compilation happens in the first iteration (and the first evaluation).
tests/test_compile.py checks that with dynamo's counters on the tiny model.

Falling back: compiled sampling has never run on every GPU and torch a user may have, so a block whose
compiled call raises while it compiles (its first call, or dynamo/inductor raising at a recompile) does
not end the run: every block of that network (one ``compile_blocks`` call) goes back to its eager
forward for good, the call is redone eagerly, the cause is logged as a warning and handed to the
network's fallback listeners (``on_fallback``; the trainer records it in rollout.json as
``compile_fallback``). Out-of-memory errors are not compile errors and propagate. An error the eager
forward raises too propagates from the eager retry, so no model bug is hidden.

Time: ``compile_seconds()`` is the wall time of the compiled calls during which dynamo compiled a
graph; solbench.engine.timing.PhaseTimer takes it out of the phase it happened in and records it as phase
"compile", so rollout phases time the compiled code, not its compilation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from solbench.errors import ConfigError

__all__ = ["MODES", "DEFAULT_MODE", "REFERENCE_MODE", "check_setting", "resolve_compile", "compile_blocks", "compile_options",
           "repeated_blocks", "sampling", "compile_seconds", "compiled_graphs", "on_fallback"]

log = logging.getLogger(__name__)

DEFAULT_MODE = "default"  # what model.compile: on (and auto on CUDA) compiles with; the module docstring says why
REFERENCE_MODE = "max-autotune-no-cudagraphs"  # NVlabs/Sana configs/sol_rl/flux1.py line 52
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SETTINGS = ("auto", "on", "off", *MODES)
# Variants of one compiled block code: block classes x sampling roles (LoRA adapters) x static / dynamic batch.
# torch's default limit (8) would send the later ones back to eager.
RECOMPILE_LIMIT = 64

_STATE = threading.local()
_CLOCK = {"seconds": 0.0}
_CLOCK_LOCK = threading.Lock()


def check_setting(value) -> None:
    """Raise ConfigError unless ``value`` is a model.compile setting."""
    if value not in SETTINGS:
        raise ConfigError(f"model.compile must be one of {', '.join(SETTINGS)}, got {value!r}")


def resolve_compile(setting: str, device: torch.device | str) -> str | None:
    """The torch.compile mode ``model.compile`` gives on ``device``, or None (eager)."""
    check_setting(setting)
    if setting == "off" or (setting == "auto" and torch.device(device).type != "cuda"):
        return None
    return DEFAULT_MODE if setting in ("auto", "on") else setting


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks ``model`` repeats: instances of its diffusers ``_repeated_blocks`` classes, else every
    child of an nn.ModuleList attribute of the model (its block lists)."""
    names = set(getattr(model, "_repeated_blocks", None) or ())
    if names:
        return [m for m in model.modules() if type(m).__name__ in names]
    return [block for child in model.children() if isinstance(child, nn.ModuleList) for block in child]


class _Network:
    """The blocks of one ``compile_blocks`` call: whether they fell back to eager, why, and who to tell."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fallback: dict | None = None  # {"network", "block", "error"} once compiled sampling failed
        self.listeners: list = []

    def fall_back(self, block: nn.Module, err: BaseException) -> None:
        if self.fallback is not None:
            return
        cause = (str(err).strip().splitlines() or [""])[0][:500]
        self.fallback = {"network": self.name, "block": type(block).__name__, "error": f"{type(err).__name__}: {cause}"}
        log.warning("model.compile: compiled sampling of %s failed in %s (%s); it samples eagerly from now on",
                    self.name, type(block).__name__, self.fallback["error"])
        for listener in list(self.listeners):
            listener(dict(self.fallback))


def _is_compile_error(err: BaseException, first_call: bool) -> bool:
    """Whether ``err``, raised by a compiled block call, is compilation failing (fall back to eager) rather than
    the run's own error: anything on a block's first compiled call, or dynamo's own exceptions later (a
    recompile for a new shape), but never running out of memory."""
    if isinstance(err, torch.OutOfMemoryError) or not isinstance(err, Exception):
        return False
    from torch._dynamo.exc import TorchDynamoException

    return first_call or isinstance(err, TorchDynamoException)


class _SamplingOnly:
    """A block's call: its compiled code inside ``sampling()`` without gradients, its eager code otherwise
    (and always, once its network fell back to eager)."""

    def __init__(self, block: nn.Module, compiled, network: _Network) -> None:
        self.block, self.compiled, self.network = block, compiled, network
        self.succeeded = False  # one compiled call has returned

    def __call__(self, *args, **kwargs):
        if not getattr(_STATE, "sampling", 0) or torch.is_grad_enabled() or self.network.fallback is not None:
            return self.block._call_impl(*args, **kwargs)
        graphs = compiled_graphs()
        start = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as err:
            if not _is_compile_error(err, not self.succeeded):
                raise
            with _CLOCK_LOCK:  # the failed attempt was compilation too
                _CLOCK["seconds"] += time.perf_counter() - start
            self.network.fall_back(self.block, err)
            return self.block._call_impl(*args, **kwargs)
        self.succeeded = True
        if compiled_graphs() != graphs:  # this call compiled: its time is compilation, not sampling
            with _CLOCK_LOCK:
                _CLOCK["seconds"] += time.perf_counter() - start
        return out


def compile_blocks(model: nn.Module, mode: str | None) -> int:
    """Compile ``model``'s repeated blocks for sampling in ``mode`` (None: nothing); returns how many
    blocks run compiled. A block compiled already is left as it is."""
    if mode is None:
        return 0
    blocks = repeated_blocks(model)
    if not blocks:
        raise ConfigError(f"model.compile: {type(model).__name__} has no repeated blocks to compile "
                          "(no diffusers _repeated_blocks and no nn.ModuleList of blocks)")
    _raise_recompile_limit()
    options = compile_options(mode)
    todo = [b for b in blocks if not isinstance(b._compiled_call_impl, _SamplingOnly)]
    if len(todo) == len(blocks) and getattr(model, "_repeated_blocks", None) and hasattr(model, "compile_repeated_blocks"):
        model.compile_repeated_blocks(options=options)  # diffusers: block.compile(...) on each repeated block
    network = next((b._compiled_call_impl.network for b in blocks if isinstance(b._compiled_call_impl, _SamplingOnly)),
                   None) or _Network(type(model).__name__)
    for block in todo:
        if block._compiled_call_impl is None:
            block.compile(options=options)
        block._compiled_call_impl = _SamplingOnly(block, block._compiled_call_impl, network)
    return len(blocks)


def on_fallback(model: nn.Module, listener) -> dict | None:
    """Call ``listener(record)`` when ``model``'s compiled sampling falls back to eager (record: the network,
    the block class and the error); returns the record at once if it already has, else None. A model
    without compiled blocks never calls it."""
    networks = {id(b._compiled_call_impl.network): b._compiled_call_impl.network for b in repeated_blocks(model)
                if isinstance(b._compiled_call_impl, _SamplingOnly)}
    for network in networks.values():
        if network.fallback is not None:
            return dict(network.fallback)
        network.listeners.append(listener)
    return None


def compile_options(mode: str) -> dict:
    """inductor options of ``mode`` (torch.compile takes a mode or options, not both) plus eager division
    rounding, so that the FP8 input quantizer traced into a compiled block (solbench.quant.native) keeps
    solbench's quantizer's bits on the GPU as its stand-alone kernel does (fused.native_kernel)."""
    from torch._inductor import list_mode_options

    from solbench.quant.fused import eager_numerics_options

    return {**list_mode_options(mode), **eager_numerics_options()}


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # renamed across torch releases
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
            return


@contextmanager
def sampling() -> Iterator[None]:
    """Compiled blocks run their compiled code inside this block (on this thread, without gradients)."""
    _STATE.sampling = getattr(_STATE, "sampling", 0) + 1
    try:
        yield
    finally:
        _STATE.sampling -= 1


def compile_seconds() -> float:
    """Seconds this process has spent in compiled block calls that compiled a graph."""
    return _CLOCK["seconds"]


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (a new shape or variant adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
