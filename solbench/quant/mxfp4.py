"""MXFP4 (OCP MX v1.0): shared exponents, E8M0 scales, and the MXFP4 dequantize and fake_quantize.

One job: the MXFP4 arithmetic of `formats` (E2M1 elements, one E8M0 power-of-two scale per 32
elements, the scale exponent by floor). `formats._quantize_mxfp4` packs its codes and scales into
a `QuantizedTensor`.
"""

from __future__ import annotations

import math

import torch

from . import fused
from .grid import (
    _block_absmax,
    _blockwise_scale,
    _decode_blocks,
    _fake_quantize_blocks,
    _max_or_zero,
    _pad_last_dim,
    _zero_nonfinite,
)
from .nonfinite import _raise_nonfinite

MXFP4_BLOCK = 32
E8M0_NAN = 0xFF


# --------------------------------------------------------------------------------------------
# MXFP4 (OCP MX v1.0: E2M1 elements, E8M0 scale per 32 elements, scale exponent by floor)
# --------------------------------------------------------------------------------------------


def _mx_shared_exponent(x2d: torch.Tensor, nonfinite: str, shape: torch.Size):
    """(shared exponent int32 [rows, n_blocks] in [-127, 127], bool mask of non-finite blocks or
    None, max |x| over the finite values)."""
    rows, k = x2d.shape
    amax = _block_absmax(x2d.view(rows, k // MXFP4_BLOCK, MXFP4_BLOCK))
    bad = None
    if not math.isfinite(float(_max_or_zero(amax))):
        if nonfinite == "error":
            _raise_nonfinite(x2d, "mxfp4", shape)
        bad = ~torch.isfinite(amax)
        amax = _block_absmax(_zero_nonfinite(x2d).view(rows, k // MXFP4_BLOCK, MXFP4_BLOCK))
    # floor(log2(amax)) from the fp32 exponent field; a subnormal or zero amax reads as -127 and
    # clamps to -127 below either way. E2M1's largest power of two is 2**2, hence the extra -2.
    with fused.single_thread_if_small(amax.numel()):  # per-block scalars: 1/32 of the tensor
        exponent_field = torch.bitwise_right_shift(amax.view(torch.int32), 23).bitwise_and_(0xFF)
        shared_exp = exponent_field.sub_(127 + 2).clamp_(-127, 127)
        return shared_exp, bad, _max_or_zero(amax)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**e for integer e in [-127, 127] (2**-127 is subnormal: built by halving)."""
    with fused.single_thread_if_small(exponent.numel()):
        normal = torch.bitwise_left_shift(exponent.clamp(min=-126) + 127, 23).view(torch.float32)
        return torch.where(exponent < -126, normal * 0.5, normal)


def _e8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    with fused.single_thread_if_small(scale_bytes.numel()):
        value = _pow2((scale_bytes.to(torch.int32) - 127).clamp(max=127))
        return torch.where(scale_bytes == E8M0_NAN, torch.full_like(value, float("nan")), value)


def _dequantize_mxfp4(q, dtype: torch.dtype) -> torch.Tensor:  # q: a formats.QuantizedTensor
    decode = _e8m0_to_float(q.scales.reshape(-1))
    out = _decode_blocks(q.codes, decode.numel(), MXFP4_BLOCK, _blockwise_scale(decode), dtype)
    return out.view(q.codes.numel() * 2 // q.padded_k, q.padded_k)


def _fake_quantize_mxfp4(x: torch.Tensor, nonfinite: str) -> torch.Tensor:
    x2d = _pad_last_dim(x, MXFP4_BLOCK)
    rows, k = x2d.shape
    shared_exp, bad, _ = _mx_shared_exponent(x2d, nonfinite, x.shape)
    apply = _blockwise_scale(_pow2(shared_exp).reshape(-1))
    encode = _pow2(shared_exp.neg()).reshape(-1)
    out = _fake_quantize_blocks(x2d.view(-1, MXFP4_BLOCK), encode, apply, x.dtype)
    if bad is not None:
        out.view(rows, k // MXFP4_BLOCK, MXFP4_BLOCK)[bad] = float("nan")
    return out.view(rows, k)

