"""The element grids and the chunked, in-place machinery every format of `formats` runs on.

One job: put fp32 values on a low-precision float grid and move them in and out of blocks. It holds
the grids' constants (E2M1 values, E4M3/E5M2 limits, the decode tables), the exact branch-free
rounding (adding a power of two whose fp32 spacing equals the grid step makes the FPU round to
nearest even), E2M1 encoding and nibble packing, the block helpers shared by NVFP4 and MXFP4
(block amax, padding, encode / decode / fake-quantize of scaled blocks) and the per-thread scratch
pool with the chunk size they stream through: on CPU a fresh 64 MB tensor costs more in page faults
than the arithmetic on it, so large tensors go through chunks of in-place ops on reused buffers.

Each helper hands its hot chain to a compiled kernel of `solbench.quant.fused` when `fused.kernel`
offers one (bit-identical); otherwise it runs the eager ops here. `_CHUNK_ELEMENTS` is read from
this module at call time (also by `fp8`), so patching it here changes the chunking everywhere.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from . import fused

FP4_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FLT_MAX = torch.finfo(torch.float32).max
E4M3_NAN = 0x7F

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


def _blockwise_scale(decode: torch.Tensor):
    """apply_scale callback: multiply each decoded block by its own decode factor."""

    def apply(y: torch.Tensor, start: int, stop: int) -> None:
        y.mul_(decode[start:stop, None])

    apply.decode = decode  # the fused kernels take the factors themselves
    return apply


def _e4m3_to_float(values: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn -> float32 through a 256-entry table (torch's CPU cast is elementwise-slow)."""
    return _E4M3_TABLE.to(values.device)[values.view(torch.uint8).long()]


def _zero_nonfinite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))
