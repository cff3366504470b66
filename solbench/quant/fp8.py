"""FP8 with TransformerEngine's current scaling: E4M3 (per tensor or per channel) and E5M2 (per tensor).

One job: the FP8 arithmetic of `formats`: amax and scales, the chunked E4M3 encode and the table
decode, fake_quantize for E4M3 and for E5M2 (fake only). `formats._quantize_fp8` packs the codes
and scales into a `QuantizedTensor`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import fused, grid
from .grid import (
    _E4M3,
    _E4M3_TABLE,
    _E5M2,
    E4M3_MAX,
    E5M2_MAX,
    FLT_MAX,
    _max_or_zero,
    _round_to_grid_,
    _scratch,
    _zero_nonfinite,
)
from .nonfinite import _raise_nonfinite


# --------------------------------------------------------------------------------------------
# FP8 E4M3 with a per-tensor or per-channel scale (TE's "current scaling")
# --------------------------------------------------------------------------------------------


def _fp8_amax(x2d: torch.Tensor, granularity: Optional[str]) -> torch.Tensor:
    """max |x| per row ([rows, 1]) or per tensor (scalar), float32; NaN/inf propagate.

    aminmax reads long rows (or the whole tensor) in one pass without allocating |x|.
    """
    if granularity == "channel":
        if x2d.shape[0] == 0:
            return torch.zeros(0, 1, device=x2d.device)
        low, high = torch.aminmax(x2d, dim=-1, keepdim=True)
    else:
        low, high = torch.aminmax(x2d)
    return torch.maximum(high.float(), low.float().neg())


def _fp8_segments(x2d: torch.Tensor, per_row: torch.Tensor, channel: bool):
    """(index, scale) pairs covering x2d in chunks: rows for per-channel scaling (with each
    chunk's [rows, 1] slice of `per_row`), column ranges of the single row for per-tensor."""
    rows, k = x2d.shape
    # grid._CHUNK_ELEMENTS is looked up at call time: one chunk size, patchable in one place.
    if channel:
        per_chunk = max(1, grid._CHUNK_ELEMENTS // max(k, 1))
        for start in range(0, rows, per_chunk):
            stop = min(start + per_chunk, rows)
            yield (slice(start, stop), slice(None)), per_row[start:stop]
    else:
        for start in range(0, k, grid._CHUNK_ELEMENTS):
            yield (slice(None), slice(start, min(start + grid._CHUNK_ELEMENTS, k))), per_row


def _fp8_plan(x: torch.Tensor, granularity: Optional[str], nonfinite: str, max_value: float = E4M3_MAX,
              fmt: str = "fp8"):
    """(x2d, amax, encode, decode, finite_mask) for E4M3 (or the element format whose largest value is
    ``max_value``) with TE's current scaling."""
    channel = granularity == "channel"
    # Per-tensor scaling is elementwise, so stream it as one long row; per-channel keeps rows.
    x2d = x.reshape(-1, x.shape[-1]) if channel else x.reshape(1, -1)
    amax = _fp8_amax(x2d, granularity)
    finite_mask = None
    if not math.isfinite(float(_max_or_zero(amax))):
        if nonfinite == "error":
            _raise_nonfinite(x.reshape(-1, x.shape[-1]), fmt, x.shape)
        finite_mask = torch.isfinite(x2d)
        x2d = _zero_nonfinite(x2d)
        amax = _fp8_amax(x2d, granularity)
    # TE: scale = 448 / amax, FLT_MAX if that overflows, 1 for an all-zero tensor.
    encode = torch.full_like(amax, max_value).div_(amax).clamp_(max=FLT_MAX)
    encode = torch.where(amax == 0, torch.ones_like(encode), encode)
    return x2d, amax, encode, torch.reciprocal(encode), finite_mask


def _scale_into(y: torch.Tensor, source: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y = source * scale computed in fp32 (bf16 times a 0-dim fp32 tensor would stay bf16)."""
    if source.dtype == torch.float32:
        return torch.mul(source, scale, out=y)
    return y.copy_(source).mul_(scale)


def _encode_fp8_eager(x2d: torch.Tensor, encode: torch.Tensor, channel: bool) -> torch.Tensor:
    codes = torch.empty(x2d.shape, dtype=torch.uint8, device=x2d.device)
    as_e4m3 = codes.view(torch.float8_e4m3fn)
    for index, scale in _fp8_segments(x2d, encode, channel):
        source = x2d[index]
        y = _scratch(source.numel(), torch.float32, x2d.device, "scaled").view(source.shape)
        _scale_into(y, source, scale)
        as_e4m3[index].copy_(y)  # torch's float8 cast: round to nearest even, saturating at 448
    return codes


def _dequantize_fp8(q, dtype: torch.dtype) -> torch.Tensor:  # q: a formats.QuantizedTensor
    channel = q.block == "channel"
    k = q.shape[-1]
    codes = q.codes.view(torch.float8_e4m3fn)
    codes2d = codes.reshape(-1, k) if channel else codes.reshape(1, -1)
    decode = q.scales.reshape(-1, 1) if channel else q.scales.reshape(())
    # A 256-entry table gather decodes E4M3 much faster than torch's elementwise float8 cast on CPU.
    table = _E4M3_TABLE.to(codes.device)
    compiled = fused.kernel("decode_e4m3", codes2d)
    if compiled is not None:
        return compiled(codes2d.view(torch.uint8), table, decode, dtype).view(-1, k)
    out = torch.empty(codes2d.shape, dtype=dtype, device=codes.device)
    raw = codes2d.view(torch.uint8)
    for index, scale in _fp8_segments(codes2d, decode, channel):
        source = raw[index]
        staged = dtype != torch.float32
        y = _scratch(source.numel(), torch.float32, codes.device, "staging").view(source.shape) if staged else out[index]
        lookup = _scratch(source.numel(), torch.int32, codes.device, "index")
        lookup.copy_(source.reshape(-1))
        torch.index_select(table, 0, lookup, out=y.view(-1))
        y.mul_(scale)
        if staged:
            out[index].copy_(y)
    return out.view(-1, k)


def _fake_quantize_fp8(x: torch.Tensor, granularity: Optional[str], nonfinite: str) -> torch.Tensor:
    """quantize + dequantize for fp8 in one streamed pass per chunk."""
    channel = granularity == "channel"
    x2d, _, encode, decode, finite_mask = _fp8_plan(x, granularity, nonfinite)
    compiled = fused.kernel("fake_e4m3", x2d)
    if compiled is not None:
        out = compiled(x2d, encode, decode, x.dtype)
        if finite_mask is not None:
            out[~finite_mask] = float("nan")
        return out.view(-1, x.shape[-1])
    out = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    for (index, scale), (_, unscale) in zip(_fp8_segments(x2d, encode, channel), _fp8_segments(x2d, decode, channel)):
        source = x2d[index]
        staged = x.dtype != torch.float32
        y = _scratch(source.numel(), torch.float32, x.device, "staging").view(source.shape) if staged else out[index]
        _scale_into(y, source, scale)
        # Same numbers as torch's saturating E4M3 cast and back, without the slow scalar decode.
        magic = _scratch(source.numel(), torch.int32, x.device, "magic").view(source.shape)
        _round_to_grid_(y, magic, _E4M3)
        y.mul_(unscale)
        if staged:
            out[index].copy_(y)
    if finite_mask is not None:
        out[~finite_mask] = float("nan")
    return out.view(-1, x.shape[-1])


# --------------------------------------------------------------------------------------------
# FP8 E5M2, per tensor: TransformerEngine's DelayedScaling(fp8_format=Format.E2M1)
# --------------------------------------------------------------------------------------------


def _fake_quantize_fp8_e5m2(x: torch.Tensor, nonfinite: str) -> torch.Tensor:
    """x rounded through per-tensor FP8 E5M2 and back, with scale = 57344 / amax (1 for a zero tensor).

    This is what a TE DelayedScaling recipe with fp8_format=Format.E2M1 computes, the recipe Sol-RL's
    public train_utils.py passes to te.fp8_autocast: TE's get_fp8_te_dtype gives E5M2 for every format
    but E4M3 and HYBRID, and get_fp8_max the E5M2 maximum 57344, so the scale is 57344 / amax. TE takes
    amax from the history of earlier forwards (delayed scaling: amax_history_len 16, "max", scale 1
    before the first); here it is the tensor's own amax (current scaling). E5M2 has the same relative
    precision at every scale, so the two differ only where a tensor's amax exceeds its history (values
    past 57344 saturate) and in the first forward (unit scale: values below 2**-14 lose precision).
    """
    x2d, _, encode, decode, finite_mask = _fp8_plan(x, None, nonfinite, max_value=E5M2_MAX, fmt="fp8_e5m2")
    y = x2d.float() * encode
    magic = torch.empty(y.shape, dtype=torch.int32, device=y.device)
    _round_to_grid_(y, magic, _E5M2)
    out = y.mul_(decode).to(x.dtype)
    if finite_mask is not None:
        out[~finite_mask] = float("nan")
    return out.view(-1, x.shape[-1])
