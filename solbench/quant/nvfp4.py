"""NVFP4: TransformerEngine's block scales, and the NVFP4 dequantize and fake_quantize.

One job: the NVFP4 arithmetic of `formats` (E2M1 elements, E4M3 scales per 16 elements, an fp32
tensor scale). `formats._quantize_nvfp4` packs its codes and scales into a `QuantizedTensor`.

NVFP4 follows TransformerEngine's (TE) arithmetic to the bit, because TE is what Blackwell kernels
compute (see docs/quantization.md and /work/shared/reference/nvfp4.md):

    g      = max|x|                                  (fp32, per tensor)
    S_enc  = min(2688 / g, FLT_MAX), or 1 if g == 0 or S_enc == 0;  S_dec = 1 / S_enc
    s_b    = e4m3(min(amax_b * fp32(S_enc * fp32(1/6)), 448))        (per 16-element block)
    e_b    = min(1 / (s_b * S_dec), FLT_MAX)
    code   = E2M1_RNE(clamp(x * e_b, -6, 6))
    x_hat  = e2m1(code) * fp32(s_b * S_dec)

Codes and scale bytes match TE exactly. Decoding multiplies by one per-block factor, like TE's
dequantize kernel (which forms (s_b * g) / 2688); values are within 1 ulp of (e2m1 * s_b) * S_dec.

Everything is vectorised torch, with no loop over blocks; the rounding onto E2M1 and E4M3, the
block encode/decode and the chunked streaming are `solbench.quant.grid`'s. Large tensors on CPU
take the same arithmetic as torch.compile'd passes (`solbench.quant.fused`, bit-identical).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from . import fused
from .grid import (
    E4M3_MAX,
    FLT_MAX,
    FP4_MAX,
    _E4M3,
    _block_absmax,
    _blockwise_scale,
    _decode_blocks,
    _e4m3_to_float,
    _fake_quantize_blocks,
    _max_or_zero,
    _pad_last_dim,
    _round_to_grid_,
    _scratch,
    _zero_nonfinite,
)
from .nonfinite import _raise_nonfinite

NVFP4_BLOCK = 16
_FP32_ONE_SIXTH = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))  # fp32(1/6), exactly
_FP32_ONE_SIXTH_TENSOR = torch.tensor(_FP32_ONE_SIXTH, dtype=torch.float32)  # the same, for compiled kernels


# --------------------------------------------------------------------------------------------
# NVFP4
# --------------------------------------------------------------------------------------------


@dataclass
class _Nvfp4Scales:
    block_scale: torch.Tensor  # float32 [rows, n_blocks], s_b (exact E4M3 values)
    decode: torch.Tensor  # float32 [rows, n_blocks], s_b * S_dec
    encode: torch.Tensor  # float32 [rows, n_blocks], e_b = 1 / (s_b * S_dec)
    global_amax: torch.Tensor  # float32 scalar, g
    nonfinite_blocks: Optional[torch.Tensor]  # bool [rows, n_blocks] or None
    saturate: bool  # some |x * e_b| may reach 7: the element clamp at 6 is needed
    block_scale_e4m3: Optional[torch.Tensor] = None  # s_b as float8_e4m3fn, when the fused kernel made it


def _nvfp4_global_scales(global_amax: float) -> Tuple[float, float]:
    """(S_enc, S_dec) from the global amax g, in fp32 exactly as TE computes them.

    Scalar math runs on the host with numpy float32 (each operation rounds to fp32 like the
    device's), which saves a dozen tiny tensor ops per call; the results are exact fp32 values.
    """
    g = np.float32(global_amax)
    if g == 0:  # all zeros. TE also maps S_enc == 0 (g = inf) to 1; inf never gets here.
        encode_global = np.float32(1.0)
    else:
        with np.errstate(over="ignore"):
            encode_global = min(np.float32(FP4_MAX * E4M3_MAX) / g, np.float32(FLT_MAX))
    return float(encode_global), float(np.float32(1.0) / encode_global)


def _nvfp4_scales(x2d: torch.Tensor, tile_rows: int, nonfinite: str, shape: torch.Size) -> _Nvfp4Scales:
    """Block scales of a [rows, K_padded] tensor, following TE's recipe step by step."""
    rows, k = x2d.shape
    n_blocks = k // NVFP4_BLOCK
    compiled_absmax = fused.kernel("absmax_blocks", x2d)
    if compiled_absmax is not None and x2d.numel():
        amax, global_amax = compiled_absmax(x2d.view(rows, n_blocks, NVFP4_BLOCK))  # one pass for both
    else:
        amax = _block_absmax(x2d.view(rows, n_blocks, NVFP4_BLOCK))  # [rows, n_blocks]
        global_amax = _max_or_zero(amax)
    nonfinite_blocks = None
    if not math.isfinite(float(global_amax)):  # max propagates NaN and inf: one cheap check
        if nonfinite == "error":
            _raise_nonfinite(x2d, "nvfp4", shape)
        nonfinite_blocks = ~torch.isfinite(amax)
        amax = _block_absmax(_zero_nonfinite(x2d).view(rows, n_blocks, NVFP4_BLOCK))
        global_amax = _max_or_zero(amax)
    if tile_rows > 1:
        # 16x16 tiles: amax over 16 rows of each 16-column block; zero rows pad the last tile.
        pad_rows = (-rows) % tile_rows
        tiles = F.pad(amax, (0, 0, 0, pad_rows)).view(-1, tile_rows, n_blocks).amax(dim=1)
        amax = tiles.repeat_interleave(tile_rows, dim=0)[:rows]
        if nonfinite_blocks is not None:
            bad = F.pad(nonfinite_blocks, (0, 0, 0, pad_rows)).view(-1, tile_rows, n_blocks).any(dim=1)
            nonfinite_blocks = bad.repeat_interleave(tile_rows, dim=0)[:rows]

    encode_global, decode_global = _nvfp4_global_scales(float(global_amax))
    # TE folds 1/6 into the global multiplier, fp32(S_enc * fp32(1/6)), then one multiply per
    # block. Python floats holding exact fp32 values multiply a float32 tensor in fp32.
    multiplier = float(np.float32(encode_global) * np.float32(_FP32_ONE_SIXTH))
    compiled = fused.kernel("nvfp4_block_scales", x2d)
    if compiled is not None and amax.numel():
        block_scale, decode, encode, peak, as_e4m3 = compiled(
            amax, torch.tensor(multiplier, dtype=torch.float32), torch.tensor(decode_global, dtype=torch.float32)
        )
        return _Nvfp4Scales(block_scale, decode, encode, global_amax, nonfinite_blocks, bool(peak >= 7.0), as_e4m3)
    # Round to E4M3 (nearest even, saturating at 448) in fp32: the same values as torch's
    # float8 cast, without its slow decode back to fp32 on CPU.
    block_scale = amax * multiplier
    magic = _scratch(block_scale.numel(), torch.int32, block_scale.device, "scale_magic")
    _round_to_grid_(block_scale, magic.view(block_scale.shape), _E4M3)
    decode = block_scale * decode_global
    encode = torch.reciprocal(decode).clamp_(max=FLT_MAX)  # s_b == 0 -> FLT_MAX (codes saturate)
    # A normal E4M3 scale keeps |x * e_b| <= 6 * (1 + 2**-4); only coarse (subnormal or zero)
    # scales push elements past 7, and only then is the per-element clamp needed.
    saturate = bool((amax * encode).max() >= 7.0) if amax.numel() else False
    return _Nvfp4Scales(block_scale, decode, encode, global_amax, nonfinite_blocks, saturate)


def _dequantize_nvfp4(q, dtype: torch.dtype) -> torch.Tensor:  # q: a formats.QuantizedTensor
    _, decode_global = _nvfp4_global_scales(float(q.global_amax))
    with fused.single_thread_if_small(q.scales.numel()):
        decode = _e4m3_to_float(q.scales.reshape(-1)).mul_(decode_global)
    out = _decode_blocks(q.codes, decode.numel(), NVFP4_BLOCK, _blockwise_scale(decode), dtype)
    return out.view(q.codes.numel() * 2 // q.padded_k, q.padded_k)


def _fake_quantize_nvfp4(x: torch.Tensor, tile_rows: int, nonfinite: str) -> torch.Tensor:
    x2d = _pad_last_dim(x, NVFP4_BLOCK)
    rows, k = x2d.shape
    one_pass = fused.kernel("fake_nvfp4_rows", x2d) if tile_rows == 1 else None
    if one_pass is not None and x2d.numel():  # activations: one compiled call (fused._fake_nvfp4_rows)
        out, global_amax = one_pass(x2d, x.dtype, _FP32_ONE_SIXTH_TENSOR)
        if math.isfinite(float(global_amax)):
            return out.view(rows, k)
        # NaN/inf somewhere: the step-by-step path below applies the nonfinite policy.
    sc = _nvfp4_scales(x2d, tile_rows, nonfinite, x.shape)
    apply = _blockwise_scale(sc.decode.reshape(-1))
    # Non-finite inputs only ever sit in blocks that are overwritten with NaN below.
    out = _fake_quantize_blocks(x2d.view(-1, NVFP4_BLOCK), sc.encode.reshape(-1), apply, x.dtype, sc.saturate)
    if sc.nonfinite_blocks is not None:
        out.view(rows, k // NVFP4_BLOCK, NVFP4_BLOCK)[sc.nonfinite_blocks] = float("nan")
    return out.view(rows, k)

