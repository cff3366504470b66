"""What every quantized-layer backend shares (emulated, TransformerEngine, torch's scaled matmul, cpu_bf16): the
error for a backend that cannot run here, the zero-row padding of a GEMM input to the row multiple the
low-precision kernels tile by, the cache that lets sibling layers quantize one input once, and the weight
and bias loading of a quantized layer. A leaf of solbench.quant: layers.py and native.py both
import it, and it imports neither.
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional

import torch


class _SharedInputQuantization:
    """Remembers the last activation an emulated layer quantized, so that sibling layers fed the
    very same tensor (q/k/v projections, FLUX's proj_mlp) reuse the result instead of redoing it.

    A hit needs the same tensor object at the same in-place version, grad mode and settings, so
    a reused result is always bit-identical to recomputing it. The entry is one tuple, replaced
    and read atomically, so concurrent forwards of one copy cannot mix entries.
    """

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry = None

    def get(self, x: torch.Tensor, key) -> Optional[torch.Tensor]:
        entry = self._entry
        if entry is None:
            return None
        source, version, grad, entry_key, result = entry
        if source() is x and x._version == version and grad == torch.is_grad_enabled() and entry_key == key:
            return result
        return None

    def put(self, x: torch.Tensor, key, result: torch.Tensor) -> None:
        self._entry = (weakref.ref(x), x._version, torch.is_grad_enabled(), key, result)

    def __reduce__(self):  # copies and pickles start empty (a weakref cannot be pickled)
        return (type(self), ())


class BackendUnavailableError(RuntimeError):
    """The requested quantization backend cannot run in this environment."""


def te_rows_padded(linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``linear(x)`` with x's rows zero-padded to a multiple of ``multiple`` and the padding dropped after.

    TE raises on a GEMM whose leading dimensions do not multiply to a multiple of 8 (16 for FP4):
    FLUX's modulation layers see [B, 3072] inputs, so any rollout chunk, CFG half or rank shard whose
    B is not a multiple failed. Zero rows change no real row's result: quantization scales are per
    16-element block along a row and the per-tensor amax ignores zeros.
    """
    lead, width = x.shape[:-1], x.shape[-1]
    rows = x.numel() // width if width else 0
    pad = (-rows) % multiple
    if pad == 0:
        return linear(x)
    flat = torch.cat([x.reshape(rows, width), x.new_zeros(pad, width)])
    out = linear(flat)
    return out[:rows].reshape(*lead, out.shape[-1])


def quantize_layer_weight(layer, weight: torch.Tensor, device=None):
    """``formats.quantize`` of a full-precision ``weight`` for a quantized layer (its ``recipe``'s format and
    weight block), after checking it fits ``[out_features, in_features]``; errors name the layer."""
    from .formats import NonFiniteError, quantize

    if tuple(weight.shape) != (layer.out_features, layer.in_features):
        raise ValueError(f"layer {layer.name!r}: weight of shape {tuple(weight.shape)} does not fit "
                         f"[out_features={layer.out_features}, in_features={layer.in_features}]")
    try:
        return quantize(weight.detach().to(device) if device is not None else weight.detach(), layer.recipe.format,
                        layer.recipe.weight_block, nonfinite=layer.recipe.nonfinite)
    except NonFiniteError as exc:
        raise NonFiniteError(f"layer {layer.name!r}, weight: {exc}") from None


def copy_layer_bias(layer, bias) -> None:
    """Copy ``bias`` into ``layer.bias``; the source and the copy must agree on having one."""
    if (bias is None) != (layer.bias is None):
        raise ValueError(f"layer {layer.name!r}: bias presence differs between source ({bias is not None}) and copy")
    if bias is not None:
        layer.bias.copy_(bias.detach())
