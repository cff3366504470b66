"""Block-scaled low-precision number formats: NVFP4, MXFP4 and FP8 (E4M3), the public API.

`quantize` turns a float tensor into a `QuantizedTensor` (packed element codes + scales) and
`QuantizedTensor.dequantize` turns it back; `fake_quantize` does both in one pass without packing,
which is what the emulated low-precision layers call on every forward. This module holds that API:
the argument and input checks, the dispatch by format, `QuantizedTensor` and the three builders
that pack each format's codes and scales into it.

The arithmetic lives beside it, one job a module (none imports this one back):
- `solbench.quant.nvfp4`: NVFP4, TransformerEngine's arithmetic to the bit (its docstring gives the
  formulas; see also docs/quantization.md);
- `solbench.quant.mxfp4`: MXFP4 (OCP MX v1.0);
- `solbench.quant.fp8`: FP8 E4M3 and E5M2 with current scaling;
- `solbench.quant.grid`: the grids, the exact rounding onto them, nibble packing, the block
  encode/decode helpers and the chunked scratch pool they stream through;
- `solbench.quant.nonfinite`: `NonFiniteError` and its message.
Every name this module held before the split is still importable from it (re-exported below).

On CPU, tensors of at least `fused.MIN_ELEMENTS` elements run the same arithmetic as a few
torch.compile'd passes instead (`solbench.quant.fused`; bit-identical, checked by
tests/test_quant_fused.py); smaller tensors run the eager ops on one intra-op thread.
SOLBENCH_QUANT_COMPILE=0 turns compilation off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple, Union

import torch

from . import fused
from .fp8 import (  # noqa: F401  (re-exported)
    _dequantize_fp8,
    _encode_fp8_eager,
    _fake_quantize_fp8,
    _fake_quantize_fp8_e5m2,
    _fp8_amax,
    _fp8_plan,
    _fp8_segments,
    _scale_into,
)
from .grid import (  # noqa: F401  (re-exported)
    _CHUNK_ELEMENTS,
    _E2M1,
    _E2M1_PAIR_TABLE,
    _E4M3,
    _E4M3_TABLE,
    _E5M2,
    _EXPONENT_MASK,
    _SCRATCH,
    E2M1_VALUES,
    E4M3_MAX,
    E4M3_NAN,
    E5M2_MAX,
    FLT_MAX,
    FP4_MAX,
    _block_absmax,
    _blockwise_scale,
    _chunk_ranges,
    _chunk_scratch,
    _decode_blocks,
    _e4m3_to_float,
    _encode_blocks,
    _encode_e2m1_,
    _fake_quantize_blocks,
    _Grid,
    _magic_for_,
    _max_or_zero,
    _pack_nibbles_into,
    _pad_last_dim,
    _round_to_grid_,
    _scratch,
    _ScratchPool,
    _unpad_last_dim,
    _zero_nonfinite,
)
from .mxfp4 import (  # noqa: F401  (re-exported)
    E8M0_NAN,
    MXFP4_BLOCK,
    _dequantize_mxfp4,
    _e8m0_to_float,
    _fake_quantize_mxfp4,
    _mx_shared_exponent,
    _pow2,
)
from .nonfinite import NonFiniteError, _raise_nonfinite  # noqa: F401  (re-exported)
from .nvfp4 import (  # noqa: F401  (re-exported)
    _FP32_ONE_SIXTH,
    _FP32_ONE_SIXTH_TENSOR,
    NVFP4_BLOCK,
    _dequantize_nvfp4,
    _fake_quantize_nvfp4,
    _Nvfp4Scales,
    _nvfp4_global_scales,
    _nvfp4_scales,
)

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
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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


# --------------------------------------------------------------------------------------------
# Packing each format's codes and scales into a QuantizedTensor
# --------------------------------------------------------------------------------------------


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

