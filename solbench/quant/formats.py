"""Block-scaled low-precision number formats: NVFP4, MXFP4 and FP8 (E4M3).

This is the arithmetic core of `solbench.quant`. `quantize` turns a float tensor into a
`QuantizedTensor` (packed element codes + scales) and `QuantizedTensor.dequantize` turns it back;
`fake_quantize` does both in one pass without packing, which is what the emulated low-precision
layers call on every forward.

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

Everything is vectorised torch, with no loop over blocks. Rounding to E2M1 (and E4M3) is exact
and branch-free: adding a power of two whose fp32 spacing equals the grid step makes the FPU
round to nearest even. Large tensors stream through chunks of in-place ops on reused buffers:
on CPU a fresh 64 MB tensor costs more in page faults than the arithmetic on it.

On CPU, tensors of at least `fused.MIN_ELEMENTS` elements run the same arithmetic as a few
torch.compile'd passes instead (`solbench.quant.fused`; bit-identical, checked by
tests/test_quant_fused.py), because hundreds of small parallel ops collapse when another process
holds a core; smaller tensors run the eager ops below on one intra-op thread. SOLBENCH_QUANT_COMPILE=0
turns compilation off.
"""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from typing import Literal, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from . import fused

__all__ = [
    "FORMATS",
    "E2M1_VALUES",
    "QuantizedTensor",
    "quantize",
    "fake_quantize",
    "NonFiniteError",
]

Format = Literal["nvfp4", "mxfp4", "fp8", "fp8_e5m2"]
NonFinitePolicy = Literal["error", "propagate"]
# fp8_e5m2: per-tensor FP8 E5M2 (what TE's DelayedScaling(fp8_format=Format.E2M1) maps to; see
# _fake_quantize_fp8_e5m2); fake_quantize only.
FORMATS: Tuple[str, ...] = ("nvfp4", "mxfp4", "fp8", "fp8_e5m2")

FP4_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FLT_MAX = torch.finfo(torch.float32).max
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# E2M1 codes 0..7 are the magnitudes below, 8..15 the same with the sign bit (bit 3) set.
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32,
)
# A packed byte holds element 2i in its low nibble and element 2i+1 in its high nibble; this
# table decodes one byte into both floats so dequantization is a single gather.
_E2M1_PAIR_TABLE = torch.stack(
    [E2M1_VALUES[torch.arange(256) & 15], E2M1_VALUES[torch.arange(256) >> 4]], dim=1
).contiguous()

_E4M3_TABLE = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()

# Elements processed per chunk: 2**20 fp32 = 4 MiB per scratch buffer, so the three buffers of
# the encoder stay in a 32 MiB L3, and a 16M-element tensor takes 16 chunks. Smaller chunks fit
# L2 but multiply the parallel regions, and each region costs a scheduler time slice when the
# cores are shared with other jobs (measured: 2**16 chunks ran 2x slower than 2**20 under load).
_CHUNK_ELEMENTS = 1 << 20

# fp32 exponent field, used by the exact magic-number rounding in `_magic_for_`.
_EXPONENT_MASK = 0x7F800000
_FP32_ONE_SIXTH = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))  # fp32(1/6), exactly
_FP32_ONE_SIXTH_TENSOR = torch.tensor(_FP32_ONE_SIXTH, dtype=torch.float32)  # the same, for compiled kernels


class NonFiniteError(ValueError):
    """Raised by `quantize`/`fake_quantize` when the input has NaN or inf and nonfinite='error'."""


# --------------------------------------------------------------------------------------------
# QuantizedTensor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantizedTensor:
    """A tensor stored in a block-scaled low-precision format.

    Attributes:
        fmt: "nvfp4", "mxfp4" or "fp8".
        codes: uint8 element codes. FP4 formats pack two per byte (element 2i in the low nibble),
            shape [..., K_padded / 2]; fp8 stores one E4M3 bit pattern per byte, shape [..., K].
        scales: per-block decode scales. nvfp4: torch.float8_e4m3fn [..., K_padded / 16] (for
            16x16 tiles each tile's scale is repeated over its 16 rows); mxfp4: uint8 E8M0 bytes
            [..., K_padded / 32]; fp8: float32 decode scale (1 / encode scale), shape [] for
            per-tensor and [..., 1] for per-channel.
        global_amax: float32 scalar, max |x| over the finite input (the tensor-level scale of
            NVFP4 is derived from it; kept for the other formats for reporting).
        shape: the original (unpadded) shape.
        dtype: the original dtype, the default of `dequantize`.
        block: the block shape: (1, 16) or (16, 16) for nvfp4, (1, 32) for mxfp4, None
            (per-tensor) or "channel" (one scale per row) for fp8.
    """

    fmt: str
    codes: torch.Tensor
    scales: torch.Tensor
    global_amax: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    block: Union[Tuple[int, int], str, None]

    @property
    def padded_k(self) -> int:
        """Length of the last dimension after padding to a whole number of blocks."""
        return self.codes.shape[-1] * (2 if self.fmt in ("nvfp4", "mxfp4") else 1)

    @property
    def nbytes(self) -> int:
        """Storage of codes + scales + global scale, in bytes (what a GPU would hold)."""
        return (
            self.codes.numel() * self.codes.element_size()
            + self.scales.numel() * self.scales.element_size()
            + 4
        )

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Decode back to a float tensor of the original shape (default: the original dtype).

        Values are computed in float32 exactly as the format defines them, then cast to `dtype`.
        """
        dtype = self.dtype if dtype is None else dtype
        if not dtype.is_floating_point:
            raise TypeError(f"dequantize() needs a floating-point dtype, got {dtype}")
        with fused.single_thread_if_small(self.codes.numel()):
            if self.fmt == "nvfp4":
                out = _dequantize_nvfp4(self, dtype)
            elif self.fmt == "mxfp4":
                out = _dequantize_mxfp4(self, dtype)
            else:
                out = _dequantize_fp8(self, dtype)
            return _unpad_last_dim(out, self.shape)

    def swizzled_scales(self) -> torch.Tensor:
        """Block scales in cuBLAS's "128x4" layout, flattened (what a Blackwell GEMM reads).

        The scales are viewed as a matrix [M, S] (M = product of leading dims, S = scales per
        row), zero-padded to [ceil(M/128)*128, ceil(S/4)*4], and scale (r, k) moves to flat
        index ((r//128)*n_col_blocks + k//4)*512 + (r%32)*16 + ((r%128)//32)*4 + k%4.
        """
        if self.fmt == "fp8":
            raise ValueError("swizzled_scales() applies to block-scaled formats (nvfp4, mxfp4), not fp8")
        return swizzle_scales_128x4(self.scales.reshape(-1, self.scales.shape[-1]))

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(fmt={self.fmt!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"block={self.block!r}, codes={tuple(self.codes.shape)}, scales={tuple(self.scales.shape)}"
            f":{self.scales.dtype}, global_amax={float(self.global_amax):.6g})"
        )


def swizzle_scales_128x4(scales_2d: torch.Tensor) -> torch.Tensor:
    """Rearrange a [M, S] scale matrix into cuBLAS's 128x4 block-scaling layout (flat)."""
    rows, cols = scales_2d.shape
    row_blocks, col_blocks = -(-rows // 128), -(-cols // 4)
    raw = scales_2d.view(torch.uint8) if scales_2d.dtype != torch.uint8 else scales_2d
    padded = raw.new_zeros(row_blocks * 128, col_blocks * 4)
    padded[:rows, :cols] = raw
    # [rb, 4 (r%128//32), 32 (r%32), cb, 4 (k%4)] -> [rb, cb, 32, 4, 4]
    tiles = padded.view(row_blocks, 4, 32, col_blocks, 4).permute(0, 3, 2, 1, 4)
    flat = tiles.contiguous().view(-1)
    return flat.view(scales_2d.dtype) if scales_2d.dtype != torch.uint8 else flat


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def quantize(
    x: torch.Tensor,
    fmt: Format,
    block: Union[Tuple[int, int], str, None] = None,
    *,
    nonfinite: NonFinitePolicy = "error",
) -> QuantizedTensor:
    """Quantize `x` to `fmt` and return the packed codes and scales.

    Args:
        x: float32, bfloat16 or float16 tensor of any shape (at least 1-D). Blocks run along the
            last dimension; a last dimension that is not a multiple of the block is zero-padded
            (and unpadded again by `dequantize`).
        fmt: "nvfp4" (E2M1 elements, E4M3 block scales, fp32 tensor scale; TE arithmetic),
            "mxfp4" (E2M1 elements, E8M0 scales per 32 elements; OCP MX v1.0) or "fp8" (E4M3).
        block: nvfp4: (1, 16) (default; TE's activation layout) or (16, 16) (TE's weight tiles;
            leading dims are flattened into rows). mxfp4: (1, 32) only. fp8: None (per-tensor
            scale, default) or "channel" (one scale per row, i.e. per output channel of a weight).
        nonfinite: what to do with NaN/inf in `x`, which no element format here can encode.
            "error" (default) raises `NonFiniteError` naming the count and first index.
            "propagate" quantizes the finite values normally (the tensor scale ignores the
            non-finite ones) and marks every block that holds a non-finite value as NaN: its scale
            is the format's NaN (E4M3 0x7F, E8M0 0xFF; fp8 sets the element code itself to NaN),
            so those blocks, and only those, dequantize to NaN.
    """
    fmt = _check_format(fmt)
    if fmt == "fp8_e5m2":
        raise ValueError("quantize: fp8_e5m2 has no packed form here; use fake_quantize (the explore copy's path)")
    x = _check_input(x, "quantize", fmt)
    _check_nonfinite_policy(nonfinite)
    with fused.single_thread_if_small(x.numel()):
        if fmt == "nvfp4":
            return _quantize_nvfp4(x, _check_nvfp4_block(block), nonfinite)
        if fmt == "mxfp4":
            _check_mxfp4_block(block)
            return _quantize_mxfp4(x, nonfinite)
        return _quantize_fp8(x, _check_fp8_block(block), nonfinite)


def fake_quantize(
    x: torch.Tensor,
    fmt: Format,
    block: Union[Tuple[int, int], str, None] = None,
    *,
    nonfinite: NonFinitePolicy = "error",
) -> torch.Tensor:
    """Round `x` through `fmt` and back: equal to quantize(x, ...).dequantize(), but faster.

    It skips packing codes and decoding them again (the rounded value is computed directly), which
    makes it the right call for activation quantization on every forward pass. Zeros may come
    back as +0.0 where `dequantize` gives -0.0; they are equal as numbers.
    """
    fmt = _check_format(fmt)
    x = _check_input(x, "fake_quantize", fmt)
    _check_nonfinite_policy(nonfinite)
    with fused.single_thread_if_small(x.numel()):
        if fmt == "nvfp4":
            out = _fake_quantize_nvfp4(x, _check_nvfp4_block(block), nonfinite)
        elif fmt == "mxfp4":
            _check_mxfp4_block(block)
            out = _fake_quantize_mxfp4(x, nonfinite)
        elif fmt == "fp8_e5m2":
            _check_e5m2_block(block)
            out = _fake_quantize_fp8_e5m2(x, nonfinite)
        else:
            out = _fake_quantize_fp8(x, _check_fp8_block(block), nonfinite)
        return _unpad_last_dim(out, x.shape)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return fmt


def _check_input(x: torch.Tensor, caller: str, fmt: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{caller}(fmt={fmt!r}) expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(
            f"{caller}(fmt={fmt!r}) supports float32, bfloat16 and float16 inputs, got {x.dtype}"
        )
    if x.dim() == 0:
        raise ValueError(f"{caller}(fmt={fmt!r}) needs at least one dimension (blocks run along the last)")
    if x.shape[-1] == 0:
        raise ValueError(f"{caller}(fmt={fmt!r}) got an empty last dimension: shape {tuple(x.shape)}")
    return x.contiguous()


def _check_nonfinite_policy(nonfinite: str) -> None:
    if nonfinite not in ("error", "propagate"):
        raise ValueError(f"nonfinite must be 'error' or 'propagate', got {nonfinite!r}")


def _check_nvfp4_block(block) -> int:
    """Return the tile height (1 or 16) of a valid nvfp4 block shape."""
    if block is None:
        return 1
    block = tuple(block) if isinstance(block, (tuple, list)) else block
    if block == (1, NVFP4_BLOCK):
        return 1
    if block == (NVFP4_BLOCK, NVFP4_BLOCK):
        return NVFP4_BLOCK
    raise ValueError(f"nvfp4 supports block=(1, 16) or (16, 16), got {block!r}")


def _check_mxfp4_block(block) -> None:
    if block is not None and tuple(block) != (1, MXFP4_BLOCK):
        raise ValueError(f"mxfp4 uses 32-element blocks: block must be None or (1, 32), got {block!r}")


def _check_fp8_block(block) -> Optional[str]:
    if block is None or block == "tensor":
        return None
    if block == "channel":
        return "channel"
    raise ValueError(f"fp8 supports block=None (per-tensor scale) or 'channel' (per-row scale), got {block!r}")


def _check_e5m2_block(block) -> None:
    if block is not None and block != "tensor":
        raise ValueError(f"fp8_e5m2 uses one scale per tensor: block must be None, got {block!r}")


def _raise_nonfinite(view: torch.Tensor, fmt: str, shape: torch.Size) -> None:
    """Raise NonFiniteError for the non-finite values of `view`, the [rows, K (+ zero padding)]
    view of a tensor of `shape`; the first bad index is reported in `shape`'s coordinates."""
    bad = ~torch.isfinite(view)
    count = int(bad.sum())
    n_nan = int(torch.isnan(view).sum())
    row, col = (int(i) for i in bad.nonzero()[0])
    first = tuple(int(i) for i in np.unravel_index(row, tuple(shape[:-1]))) + (col,)
    raise NonFiniteError(
        f"quantize(fmt={fmt!r}): input of shape {tuple(shape)} has {count} non-finite value(s) "
        f"({n_nan} NaN, {count - n_nan} inf), first at index {first}. No {fmt} element encodes "
        "NaN/inf. Find where they come from, or pass nonfinite='propagate' to quantize the rest "
        "and mark the affected blocks as NaN."
    )


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _pad_last_dim(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """View `x` as [rows, K_padded] with zeros appended so K_padded % multiple == 0."""
    k = x.shape[-1]
    x2d = x.reshape(-1, k)
    pad = (-k) % multiple
    return F.pad(x2d, (0, pad)) if pad else x2d


def _unpad_last_dim(x2d: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    k = shape[-1]
    if x2d.shape[-1] != k:
        x2d = x2d[:, :k].contiguous()
    return x2d.reshape(shape)


def _block_absmax(blocks: torch.Tensor) -> torch.Tensor:
    """max |x| over the last dim of a contiguous [..., n_blocks, block] tensor, as float32 [...,
    n_blocks] (exact); NaN if the block holds a NaN, inf if an inf.

    Measured on CPU, max_pool1d over |x| viewed as rows of >= 128 elements is 3-20x faster than
    amax/aminmax/vector_norm reducing a 16-wide last dim; |x| goes through a reused chunk buffer.
    """
    *lead, n_blocks, block = blocks.shape
    compiled = fused.kernel("absmax_blocks", blocks)
    if compiled is not None:
        return compiled(blocks)[0]
    flat = blocks.reshape(-1)
    total = flat.numel()
    if total == 0:
        return torch.zeros(*lead, n_blocks, dtype=torch.float32, device=blocks.device)
    chunk = max(block, _CHUNK_ELEMENTS - _CHUNK_ELEMENTS % block)
    # |x| lands in fp32 (exact for bf16/fp16 too): max_pool1d is several times slower in bf16.
    scratch = _scratch(min(total, chunk), torch.float32, blocks.device, "absmax")
    parts = []
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        magnitude = scratch[: stop - start]
        if flat.dtype == torch.float32:
            torch.abs(flat[start:stop], out=magnitude)
        else:
            magnitude.copy_(flat[start:stop]).abs_()
        per_row = block
        while per_row < 1024 and (stop - start) % (2 * per_row) == 0:
            per_row *= 2
        parts.append(F.max_pool1d(magnitude.view(1, -1, per_row), block, block).reshape(-1))
    amax = parts[0] if len(parts) == 1 else torch.cat(parts)
    return amax.view(*lead, n_blocks)


def _max_or_zero(values: torch.Tensor) -> torch.Tensor:
    """Max of all elements (NaN/inf propagate), or 0 for an empty tensor."""
    return values.max() if values.numel() else values.new_zeros(())


@dataclass(frozen=True)
class _Grid:
    """A low-precision float grid for the magic-number rounding below: the smallest normal
    exponent, the number of mantissa bits, and the largest finite magnitude."""

    min_exponent: int
    mantissa_bits: int
    max_value: float


_E2M1 = _Grid(min_exponent=0, mantissa_bits=1, max_value=FP4_MAX)
_E4M3 = _Grid(min_exponent=-6, mantissa_bits=3, max_value=E4M3_MAX)
_E5M2 = _Grid(min_exponent=-14, mantissa_bits=2, max_value=E5M2_MAX)


def _magic_for_(y: torch.Tensor, magic: torch.Tensor, grid: _Grid) -> torch.Tensor:
    """Fill int32 `magic` with the bit pattern of m = 2**(max(floor(log2|y|), e_min) + 23 - p).

    The fp32 spacing at m equals the grid's spacing at |y| (for E2M1: 0.5 below 2, 1 in [2, 4),
    2 in [4, 6]), so y + m rounds y to the grid, to nearest with ties to even, in the FPU, and
    (y + m) - m is exact. The exponent comes straight from y's bits; subnormal grid values
    share the spacing of the smallest normal binade, hence the max().
    """
    torch.bitwise_and(y.view(torch.int32), _EXPONENT_MASK, out=magic)
    magic.clamp_(min=(127 + grid.min_exponent) << 23).add_((23 - grid.mantissa_bits) << 23)
    return magic


def _round_to_grid_(y: torch.Tensor, magic: torch.Tensor, grid: _Grid, saturate: bool = True) -> torch.Tensor:
    """Round the fp32 values in `y` in place to the nearest grid value (ties to even),
    saturating at the grid's maximum; `magic` is int32 scratch of y's size.

    saturate=False skips the clamp. For E2M1 that is valid when every |y| < 7: the rounding
    already sends [6, 7) to 6; only values >= 7 would round past the grid, to 8.
    """
    if saturate:
        y.clamp_(-grid.max_value, grid.max_value)
    m = _magic_for_(y, magic, grid).view(torch.float32).copysign_(y)
    return y.add_(m).sub_(m)


def _encode_e2m1_(y: torch.Tensor, magic: torch.Tensor, sign: torch.Tensor, saturate: bool = True) -> torch.Tensor:
    """E2M1 codes (int32, 0..15) of the fp32 values in `y`, computed in place (y is clobbered).

    Same rounding as `_round_to_grid_`; the code is then read off the bits: with
    m = 2**(22 + j) (j = 0, 1, 2 for |y| < 2, [2, 4), [4, 6]) the integer difference of the bit
    patterns of |y| + m and m is the number of E2M1 steps, and code = steps + 2j. The sign bit is
    kept (a negative value that rounds to zero, or -0.0, gets code 8, as ml_dtypes/torchao do).
    """
    bits = y.view(torch.int32)
    torch.bitwise_right_shift(bits, 28, out=sign)
    sign.bitwise_and_(8)
    y.abs_()
    if saturate:
        y.clamp_(max=FP4_MAX)
    _magic_for_(y, magic, _E2M1)
    y.add_(magic.view(torch.float32))
    bits.sub_(magic)
    magic.bitwise_right_shift_(22).sub_(298)  # (149 + j) * 2 - 298 = 2j
    return bits.add_(magic).bitwise_or_(sign)


def _pack_nibbles_into(codes: torch.Tensor, out: torch.Tensor) -> None:
    """Pack int32 codes [n] (n even) into uint8 `out` [n/2]: element 2i low, 2i+1 high nibble."""
    low, high = codes[0::2], codes[1::2]
    high.bitwise_left_shift_(4)
    low.bitwise_or_(high)
    out.copy_(low)


def _chunk_ranges(n_blocks: int, block_size: int):
    """(start, stop) block ranges of about _CHUNK_ELEMENTS elements each."""
    per_chunk = max(1, _CHUNK_ELEMENTS // block_size)
    for start in range(0, n_blocks, per_chunk):
        yield start, min(start + per_chunk, n_blocks)


class _ScratchPool(threading.local):
    """Per-thread scratch buffers of at most one chunk each, reused across calls.

    On CPU a fresh multi-MB tensor costs about 0.4 ms per MB in page faults the first time it is
    written, more than the arithmetic on it; reusing a few chunk-sized buffers (at most about
    30 MB per thread in all) removes that cost from every quantize / fake_quantize call. Larger
    requests and other devices (which have caching allocators) get plain torch.empty.
    """

    def __init__(self) -> None:
        self.buffers = {}


_SCRATCH = _ScratchPool()


def _scratch(numel: int, dtype: torch.dtype, device, slot: str) -> torch.Tensor:
    """A 1-D scratch tensor of `numel` elements; `slot` names its role (one buffer per role)."""
    device = torch.device(device)
    if device.type != "cpu" or numel > _CHUNK_ELEMENTS:  # keep the pool bounded
        return torch.empty(numel, dtype=dtype, device=device)
    buffer = _SCRATCH.buffers.get((slot, dtype))
    if buffer is None or buffer.numel() < numel:
        buffer = torch.empty(numel, dtype=dtype)
        _SCRATCH.buffers[(slot, dtype)] = buffer
    return buffer[:numel]


def _chunk_scratch(n_blocks: int, block_size: int, dtype: torch.dtype, device, slot: str) -> torch.Tensor:
    per_chunk = max(1, _CHUNK_ELEMENTS // block_size)
    return _scratch(min(n_blocks, per_chunk) * block_size, dtype, device, slot)


def _encode_blocks(
    blocks: torch.Tensor, encode_scale: torch.Tensor, packed_out: Optional[torch.Tensor], saturate: bool = True
) -> torch.Tensor:
    """Packed E2M1 codes of blocks[i, :] * encode_scale[i] [n_blocks * bs / 2] (into `packed_out`
    if given, else a new uint8 tensor), returned.

    Streams over chunks so the fp32/int32 scratch is allocated once and stays in cache.
    """
    n_blocks, block_size = blocks.shape
    compiled = fused.kernel("encode_e2m1", blocks)
    if compiled is not None:
        packed = fused.pack_nibbles(compiled(blocks, encode_scale, saturate).view(-1))
        return packed if packed_out is None else packed_out.copy_(packed)
    if packed_out is None:
        packed_out = torch.empty(n_blocks * block_size // 2, dtype=torch.uint8, device=blocks.device)
    scaled = _chunk_scratch(n_blocks, block_size, torch.float32, blocks.device, "scaled")
    magic = _chunk_scratch(n_blocks, block_size, torch.int32, blocks.device, "magic")
    sign = _chunk_scratch(n_blocks, block_size, torch.int32, blocks.device, "sign")
    half = block_size // 2
    for start, stop in _chunk_ranges(n_blocks, block_size):
        n = (stop - start) * block_size
        y = scaled[:n]
        torch.mul(blocks[start:stop], encode_scale[start:stop, None], out=y.view(-1, block_size))
        codes = _encode_e2m1_(y, magic[:n], sign[:n], saturate)
        _pack_nibbles_into(codes, packed_out[start * half : stop * half])
    return packed_out


def _decode_blocks(
    packed: torch.Tensor, n_blocks: int, block_size: int, apply_scale, dtype: torch.dtype
) -> torch.Tensor:
    """[n_blocks, block_size] of `dtype` = e2m1(codes) scaled by `apply_scale(chunk, start, stop)`,
    which multiplies a float32 chunk of decoded blocks in place by their scales."""
    table = _E2M1_PAIR_TABLE.to(packed.device)
    pair_bits, scale = fused.kernel("e2m1_pair_bits", packed), fused.kernel("scale_blocks", packed)
    if pair_bits is not None and scale is not None and sys.byteorder == "little":
        values = pair_bits(packed.reshape(-1)).view(torch.float32)
        return scale(values, apply_scale.decode, block_size, dtype)
    out = torch.empty(n_blocks, block_size, dtype=dtype, device=packed.device)
    flat = packed.reshape(-1)
    half = block_size // 2
    index = _chunk_scratch(n_blocks, half, torch.int32, packed.device, "index")
    staging = None
    if dtype != torch.float32:
        staging = _chunk_scratch(n_blocks, block_size, torch.float32, packed.device, "staging")
    for start, stop in _chunk_ranges(n_blocks, block_size):
        idx = index[: (stop - start) * half]
        idx.copy_(flat[start * half : stop * half])
        y = out[start:stop] if staging is None else staging[: (stop - start) * block_size].view(-1, block_size)
        torch.index_select(table, 0, idx, out=y.view(-1, 2))
        apply_scale(y, start, stop)
        if staging is not None:
            out[start:stop].copy_(y)
    return out


def _fake_quantize_blocks(
    blocks: torch.Tensor, encode_scale: torch.Tensor, apply_scale, dtype: torch.dtype, saturate: bool = True
) -> torch.Tensor:
    """Round blocks[i, :] * encode_scale[i] to E2M1 values and decode with `apply_scale`, chunk by
    chunk, straight into the output: same numbers as encode + decode, no packing."""
    n_blocks, block_size = blocks.shape
    compiled = fused.kernel("fake_e2m1", blocks)
    if compiled is not None:
        return compiled(blocks, encode_scale, apply_scale.decode, saturate, dtype)
    out = torch.empty(n_blocks, block_size, dtype=dtype, device=blocks.device)
    magic = _chunk_scratch(n_blocks, block_size, torch.int32, blocks.device, "magic")
    staging = None
    if dtype != torch.float32:
        staging = _chunk_scratch(n_blocks, block_size, torch.float32, blocks.device, "staging")
    for start, stop in _chunk_ranges(n_blocks, block_size):
        n = (stop - start) * block_size
        y = out[start:stop] if staging is None else staging[:n].view(-1, block_size)
        torch.mul(blocks[start:stop], encode_scale[start:stop, None], out=y)
        _round_to_grid_(y.view(-1), magic[:n], _E2M1, saturate)
        apply_scale(y, start, stop)
        if staging is not None:
            out[start:stop].copy_(y)
    return out


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


def _quantize_nvfp4(x: torch.Tensor, tile_rows: int, nonfinite: str) -> QuantizedTensor:
    x2d = _pad_last_dim(x, NVFP4_BLOCK)
    rows, k = x2d.shape
    sc = _nvfp4_scales(x2d, tile_rows, nonfinite, x.shape)
    source = x2d if sc.nonfinite_blocks is None else _zero_nonfinite(x2d)
    codes = _encode_blocks(source.view(-1, NVFP4_BLOCK), sc.encode.reshape(-1), None, sc.saturate).view(rows, k // 2)
    block_scale = sc.block_scale_e4m3 if sc.block_scale_e4m3 is not None else sc.block_scale.to(torch.float8_e4m3fn)  # exact: on the grid
    if sc.nonfinite_blocks is not None:
        raw = block_scale.view(torch.uint8).clone()
        raw[sc.nonfinite_blocks] = E4M3_NAN
        block_scale = raw.view(torch.float8_e4m3fn)
        codes.view(rows, k // NVFP4_BLOCK, NVFP4_BLOCK // 2)[sc.nonfinite_blocks] = 0
    lead = x.shape[:-1]
    return QuantizedTensor(
        fmt="nvfp4",
        codes=codes.view(*lead, k // 2),
        scales=block_scale.view(*lead, k // NVFP4_BLOCK),
        global_amax=sc.global_amax,
        shape=x.shape,
        dtype=x.dtype,
        block=(tile_rows, NVFP4_BLOCK),
    )


def _blockwise_scale(decode: torch.Tensor):
    """apply_scale callback: multiply each decoded block by its own decode factor."""

    def apply(y: torch.Tensor, start: int, stop: int) -> None:
        y.mul_(decode[start:stop, None])

    apply.decode = decode  # the fused kernels take the factors themselves
    return apply


def _dequantize_nvfp4(q: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
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


def _e4m3_to_float(values: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn -> float32 through a 256-entry table (torch's CPU cast is elementwise-slow)."""
    return _E4M3_TABLE.to(values.device)[values.view(torch.uint8).long()]


def _zero_nonfinite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


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


def _quantize_mxfp4(x: torch.Tensor, nonfinite: str) -> QuantizedTensor:
    x2d = _pad_last_dim(x, MXFP4_BLOCK)
    rows, k = x2d.shape
    shared_exp, bad, global_amax = _mx_shared_exponent(x2d, nonfinite, x.shape)
    source = x2d if bad is None else _zero_nonfinite(x2d)
    # x / 2**e as a multiply by 2**-e: exact, and 2**-e is a normal float for e in [-127, 125].
    codes = _encode_blocks(source.view(-1, MXFP4_BLOCK), _pow2(shared_exp.neg()).reshape(-1), None).view(rows, k // 2)
    with fused.single_thread_if_small(shared_exp.numel()):
        scale_bytes = (shared_exp + 127).to(torch.uint8)
    if bad is not None:
        scale_bytes[bad] = E8M0_NAN
        codes.view(rows, k // MXFP4_BLOCK, MXFP4_BLOCK // 2)[bad] = 0
    lead = x.shape[:-1]
    return QuantizedTensor(
        fmt="mxfp4",
        codes=codes.view(*lead, k // 2),
        scales=scale_bytes.view(*lead, k // MXFP4_BLOCK),
        global_amax=global_amax,
        shape=x.shape,
        dtype=x.dtype,
        block=(1, MXFP4_BLOCK),
    )


def _e8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    with fused.single_thread_if_small(scale_bytes.numel()):
        value = _pow2((scale_bytes.to(torch.int32) - 127).clamp(max=127))
        return torch.where(scale_bytes == E8M0_NAN, torch.full_like(value, float("nan")), value)


def _dequantize_mxfp4(q: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
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
    if channel:
        per_chunk = max(1, _CHUNK_ELEMENTS // max(k, 1))
        for start in range(0, rows, per_chunk):
            stop = min(start + per_chunk, rows)
            yield (slice(start, stop), slice(None)), per_row[start:stop]
    else:
        for start in range(0, k, _CHUNK_ELEMENTS):
            yield (slice(None), slice(start, min(start + _CHUNK_ELEMENTS, k))), per_row


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


def _quantize_fp8(x: torch.Tensor, granularity: Optional[str], nonfinite: str) -> QuantizedTensor:
    channel = granularity == "channel"
    x2d, amax, encode, decode, finite_mask = _fp8_plan(x, granularity, nonfinite)
    compiled = fused.kernel("encode_e4m3", x2d)
    if compiled is not None:
        codes = compiled(x2d, encode)
    else:
        codes = _encode_fp8_eager(x2d, encode, channel)
    if finite_mask is not None:
        codes[~finite_mask] = E4M3_NAN
    lead = x.shape[:-1]
    return QuantizedTensor(
        fmt="fp8",
        codes=codes.view(x.shape),
        scales=decode.view(*lead, 1) if channel else decode,
        global_amax=_max_or_zero(amax),
        shape=x.shape,
        dtype=x.dtype,
        block=granularity,
    )


def _encode_fp8_eager(x2d: torch.Tensor, encode: torch.Tensor, channel: bool) -> torch.Tensor:
    codes = torch.empty(x2d.shape, dtype=torch.uint8, device=x2d.device)
    as_e4m3 = codes.view(torch.float8_e4m3fn)
    for index, scale in _fp8_segments(x2d, encode, channel):
        source = x2d[index]
        y = _scratch(source.numel(), torch.float32, x2d.device, "scaled").view(source.shape)
        _scale_into(y, source, scale)
        as_e4m3[index].copy_(y)  # torch's float8 cast: round to nearest even, saturating at 448
    return codes


def _dequantize_fp8(q: QuantizedTensor, dtype: torch.dtype) -> torch.Tensor:
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
