"""Fused kernels for the emulated quantizers: each hot elementwise chain of `formats` as one pass.

The eager path in `formats` streams a tensor through a few hundred small in-place torch ops.
On CPU each is an OpenMP parallel region, and when another process holds a core every region
waits out a scheduler time slice (issue 17: a 4096x4096 NVFP4 quantize went from 78 ms to
2.5 s beside one busy job). Here the same arithmetic is written once as out-of-place torch
expressions and compiled with `torch.compile` (inductor's C++ backend fuses each chain into one
vectorised parallel loop), so a quantize is a handful of passes, close to a copy's cost.

Bit-exactness: every kernel repeats the eager path's operations in the same order, in fp32
(no reassociation: inductor compiles with -fno-unsafe-math-optimizations, -ffp-contract=off),
and tests/test_quant_fused.py checks compiled == eager bit for bit on the edge cases (signed
zeros, ties, saturation, subnormal scales, bf16/fp16, padding, 16x16 tiles, NaN blocks).

When it is used (`kernel(name, x)` returns None otherwise and `formats` runs its eager path):
- on CPU tensors of at least `MIN_ELEMENTS` elements (below that a compiled call's guard
  overhead is comparable to the work and the eager path runs under one intra-op thread);
- not when autograd would record the call (the eager path's behaviour is kept);
- unless SOLBENCH_QUANT_COMPILE=0, and only while compilation works: the first failure (no C++
  compiler, an inductor error) is reported once as a warning and the eager path is used from
  then on. Shapes are compiled dynamically (no recompile per new activation shape); each input
  dtype compiles once per process (inductor's on-disk cache makes later processes fast).

`native_kernel(name)` is the other entry: the scaled-matmul backend's activation quantizer
(`_fp8_tensor_rows`, two passes over the input) compiled for whatever device the input is on, GPUs
included, with inductor's eager division rounding so that it keeps the eager path's bits there too
(scripts/gpu_check.py compares them on the GPU; tests/test_quant_native.py on CPU).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Callable, Dict, Optional

import torch

__all__ = ["kernel", "native_kernel", "eager_numerics_options", "MIN_ELEMENTS", "enabled", "disable", "single_thread_if_small", "SMALL_ELEMENTS"]

COMPILE_MIN_ENV = "SOLBENCH_QUANT_COMPILE_MIN"


def _compile_min_from_env() -> tuple[int, str | None]:
    """(MIN_ELEMENTS, what is wrong with SOLBENCH_QUANT_COMPILE_MIN or None). Read at import without failing (library
    code imports this module); the command line refuses a bad value at its start (``check_env``)."""
    default, raw = 1 << 16, os.environ.get(COMPILE_MIN_ENV)
    if raw is None or not raw.strip():
        return default, None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        return default, (f"{COMPILE_MIN_ENV}={raw!r} is not a whole number of elements >= 0 (tensors below it take "
                         f"the eager path; default {default}); set a number or unset it")
    return value, None


# Tensors below this many elements take the eager path (a compiled call costs tens of us).
MIN_ELEMENTS, _ENV_PROBLEM = _compile_min_from_env()


def check_env() -> None:
    """ValueError naming SOLBENCH_QUANT_COMPILE_MIN where it is not a count (the CLI calls it at start)."""
    if _ENV_PROBLEM:
        raise ValueError(_ENV_PROBLEM)

# Eager calls on tensors below this many elements run under one intra-op thread.
# Measured on a shared 2-core Xeon (docs/quantization.md): below ~4M elements one thread beats two
# whenever another process holds a core (each parallel region waits out a time slice), and costs
# little when the cores are free; larger tensors keep torch's thread count.
SMALL_ELEMENTS = 1 << 22

_EXPONENT_MASK = 0x7F800000
_FLT_MAX = torch.finfo(torch.float32).max
_LOCK = threading.Lock()
_STATE = {"disabled": os.environ.get("SOLBENCH_QUANT_COMPILE", "1").strip().lower() in ("0", "false", "no", "off"),
          "reason": None}
_COMPILED: Dict[str, Callable] = {}


def enabled() -> bool:
    """Whether compiled kernels may be used in this process."""
    return not _STATE["disabled"]


def disable(reason: str = "disabled") -> None:
    """Use the eager path from now on (tests use this; also called on a compile failure)."""
    _STATE["disabled"] = True
    _STATE["reason"] = reason


def enable() -> None:
    _STATE["disabled"] = False
    _STATE["reason"] = None


@contextlib.contextmanager
def eager_only():
    """Run the eager quantizer (bit-identical) inside the block, without counting it as a failure:
    for code that watches every op itself (solbench.measure.peak's TorchDispatchMode), under which
    torch.compile finds nothing to compile."""
    saved = dict(_STATE)
    _STATE["disabled"] = True
    try:
        yield
    finally:
        _STATE.update(saved)


# --------------------------------------------------------------------------------------------
# The arithmetic (same operations, same order as formats' eager helpers)
# --------------------------------------------------------------------------------------------


def _round_to_grid(y: torch.Tensor, min_exponent: int, mantissa_bits: int, max_value: float, saturate: bool):
    """grid._round_to_grid_, out of place."""
    if saturate:
        y = y.clamp(-max_value, max_value)
    magic = (y.view(torch.int32) & _EXPONENT_MASK).clamp(min=(127 + min_exponent) << 23) + ((23 - mantissa_bits) << 23)
    m = magic.view(torch.float32).copysign(y)
    return (y + m) - m


def _absmax_blocks(blocks: torch.Tensor):
    """[rows, n_blocks, block] -> (fp32 max |x| per block, max over all of them); NaN/inf propagate."""
    amax = blocks.float().abs().amax(dim=-1)
    return amax, amax.max()


def _nvfp4_block_scales(amax: torch.Tensor, multiplier: torch.Tensor, decode_global: torch.Tensor):
    """nvfp4._nvfp4_scales after the global amax: (s_b, s_b * S_dec, e_b, max(amax * e_b),
    s_b as float8_e4m3fn (exact: s_b is on the E4M3 grid))."""
    block_scale = _round_to_grid(amax * multiplier, -6, 3, 448.0, True)
    decode = block_scale * decode_global
    encode = torch.reciprocal(decode).clamp(max=_FLT_MAX)
    return block_scale, decode, encode, (amax * encode).amax(), block_scale.to(torch.float8_e4m3fn)


def _fake_e2m1(blocks: torch.Tensor, encode: torch.Tensor, decode: torch.Tensor, saturate: bool, dtype: torch.dtype):
    """grid._fake_quantize_blocks: round blocks * e_b to E2M1 and scale back, cast to dtype."""
    y = blocks.float() * encode[:, None]
    y = _round_to_grid(y, 0, 1, 6.0, saturate)
    return (y * decode[:, None]).to(dtype)


def _fake_nvfp4_rows(x2d: torch.Tensor, dtype: torch.dtype, one_sixth: torch.Tensor):
    """The whole NVFP4 fake-quantize of a [rows, K] tensor (K % 16 == 0, 1x16 blocks) in one call:
    block amax, global amax, TE's global and block scales, E2M1 rounding and the scale back.

    nvfp4._fake_quantize_nvfp4 does the same in three kernels with host arithmetic between them
    (the global scales in numpy float32); here those scalar steps are 0-dim fp32 tensor ops of the
    same operations in the same order, so the result is bit-identical, and an activation costs one
    compiled call instead of three plus their eager glue (issue 17: a tiny-model forward makes 15).
    Returns (fake-quantized [rows * K / 16, 16] in dtype, global amax); a non-finite global amax means the
    caller must redo the call on the eager path, which handles NaN/inf blocks.
    `one_sixth` is fp32(1/6) as a 0-dim float32 tensor: a Python float argument would be traced as a
    symbolic double and make the product a double one.
    """
    y, _, _, global_amax, decode = nvfp4_rows_e2m1(x2d, one_sixth)
    # [n_blocks, 16]: reshaping back to [rows, K] in here made inductor add a scalar copy pass.
    return (y * decode[:, None]).to(dtype), global_amax


def nvfp4_rows_e2m1(x2d: torch.Tensor, one_sixth: torch.Tensor):
    """TE's NVFP4 steps on a [rows, K] tensor (1x16 blocks) up to the rounded elements: (E2M1 values of
    x * e_b as fp32 [rows * K / 16, 16], s_b, S_dec (0-dim), global amax, s_b * S_dec). The emulated layer
    scales the elements back by s_b * S_dec (``_fake_nvfp4_rows``), the cpu_bf16 layer by s_b alone
    (solbench.quant.cpu_bf16): one function, so their codes and scales cannot drift apart."""
    rows, k = x2d.shape
    blocks = x2d.float().reshape(rows * (k // 16), 16)
    amax = blocks.abs().amax(dim=-1)
    global_amax = amax.max()
    # (`2688.0 / g` would be torch's rtruediv, reciprocal(g) * 2688: two roundings, not one.)
    one = torch.ones_like(global_amax)
    encode_global = torch.where(global_amax == 0, one,
                                torch.clamp(torch.full_like(global_amax, 2688.0) / global_amax, max=_FLT_MAX))  # 6 * 448 / g
    decode_global = one / encode_global
    block_scale = _round_to_grid(amax * (encode_global * one_sixth), -6, 3, 448.0, True)
    decode = block_scale * decode_global
    encode = torch.reciprocal(decode).clamp(max=_FLT_MAX)
    # Always saturating is exact: without the clamp every |y| < 7 rounds to at most 6 anyway.
    y = _round_to_grid(blocks * encode[:, None], 0, 1, 6.0, True)
    return y, block_scale, decode_global, global_amax, decode


def _encode_e2m1(blocks: torch.Tensor, encode: torch.Tensor, saturate: bool) -> torch.Tensor:
    """grid._encode_blocks before packing: uint8 E2M1 codes (0..15) of blocks * e_b, one per element.

    (Packing two codes per byte inside the compiled kernel ran 8x slower: inductor does not
    vectorise the pairwise combine; `pack_nibbles` does it in two eager ops on the small codes.)
    """
    y = blocks.float() * encode[:, None]
    sign = (y.view(torch.int32) >> 28) & 8
    a = y.abs()
    if saturate:
        a = a.clamp(max=6.0)
    magic = (a.view(torch.int32) & _EXPONENT_MASK).clamp(min=127 << 23) + (22 << 23)
    s = a + magic.view(torch.float32)
    codes = ((s.view(torch.int32) - magic) + ((magic >> 22) - 298)) | sign
    return codes.to(torch.uint8)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [n] (n even) -> [n / 2] bytes: element 2i in the low nibble, 2i+1 in the high."""
    pairs = codes.view(-1, 2)
    return pairs[:, 1].bitwise_left_shift(4).bitwise_or_(pairs[:, 0])


def _e2m1_value_bits(c: torch.Tensor) -> torch.Tensor:
    """int32 fp32 bit patterns of E2M1 codes c (int32, 0..15): the table E2M1_VALUES, by arithmetic
    (code 8 is -0.0 as in the table)."""
    m = c & 7
    e = m >> 1
    f = m & 1
    normal = ((e + 126) << 23) | (f << 22)  # 2**(e-1) * (1 + f/2) for e >= 1
    subnormal = f * 0x3F000000  # 0.5 or 0.0
    return torch.where(e > 0, normal, subnormal) | ((c & 8) << 28)


def _e2m1_pair_bits(packed: torch.Tensor) -> torch.Tensor:
    """grid._decode_blocks' table lookup: each byte's two decoded fp32 values as one int64
    (low nibble's value in the low 32 bits), so that `.view(torch.float32)` of the result is the
    decoded elements in order on a little-endian machine. (An interleaving gather or stack ran
    3-10x slower: inductor does not vectorise it.)"""
    p = packed.to(torch.int32)
    low = _e2m1_value_bits(p & 15).to(torch.int64) & 0xFFFFFFFF
    high = _e2m1_value_bits(p >> 4).to(torch.int64) << 32
    return low | high


def _scale_blocks(values: torch.Tensor, decode: torch.Tensor, block_size: int, dtype: torch.dtype):
    """Decoded fp32 elements times their block's decode factor, cast to dtype: [n_blocks, block_size]."""
    return (values.reshape(-1, block_size) * decode[:, None]).to(dtype)


def _fake_e4m3(x2d: torch.Tensor, encode: torch.Tensor, decode: torch.Tensor, dtype: torch.dtype):
    """fp8._fake_quantize_fp8 (encode/decode: 0-dim or [rows, 1])."""
    y = x2d.float() * encode
    return (_round_to_grid(y, -6, 3, 448.0, True) * decode).to(dtype)


def _encode_e4m3(x2d: torch.Tensor, encode: torch.Tensor) -> torch.Tensor:
    """formats._quantize_fp8: E4M3 bit patterns (torch's float8 cast) of x * encode."""
    return (x2d.float() * encode).to(torch.float8_e4m3fn).view(torch.uint8)


def _decode_e4m3(raw: torch.Tensor, table: torch.Tensor, decode: torch.Tensor, dtype: torch.dtype):
    """fp8._dequantize_fp8: table[code] * decode (0-dim or [rows, 1]), cast to dtype."""
    return (table[raw.long()] * decode).to(dtype)


def _fp8_tensor_rows(x2d: torch.Tensor):
    """native.quantize_fp8_rows in two passes over the input: the amax reduction (with TE's scale
    computed from it in the same kernel's epilogue) and one elementwise pass that scales and casts.

    The eager chain read the input three times and wrote two fp32 copies of it (aminmax, an fp32 copy,
    the scaled fp32 copy, then the cast: about 21 bytes per bf16 element); here about 5 (read twice,
    write one byte). Same operations in the same order as the eager path, so the same bits: the scale
    is an explicit fp32 division (``448 / amax`` on a tensor would be torch's rtruediv, a reciprocal and
    a product, two roundings), and the decode scale ``1 / encode`` a division too (compiled with
    inductor's eager division rounding on GPUs, ``native_kernel``). max |x| of the input dtype equals
    aminmax's max(high, -low) exactly (abs is exact); -0.0 and 0.0 both give the unit scale.
    """
    return _e4m3_codes(x2d, x2d.abs().amax().float())


def _fp8_channel_rows(x2d: torch.Tensor):
    """native.quantize_fp8_rowwise: _fp8_tensor_rows with one amax and scale per row ([M, 1]), as
    formats.quantize(x, "fp8", "channel") computes them (fp8._fp8_plan's arithmetic, per row)."""
    return _e4m3_codes(x2d, x2d.abs().amax(dim=-1, keepdim=True).float())


def _e4m3_codes(x2d: torch.Tensor, amax: torch.Tensor):
    """TE's current scaling from ``amax`` (0-dim, or [M, 1] per row): (E4M3 codes of x * 448 / amax, decode scale)."""
    one = torch.ones_like(amax)
    encode = torch.where(amax == 0, one, torch.clamp(torch.full_like(amax, 448.0) / amax, max=_FLT_MAX))
    codes = (x2d.float() * encode).to(torch.float8_e4m3fn)  # RNE; |x * encode| <= 448 by construction
    return codes, one / encode


def _nvfp4_bf16_rows(x2d: torch.Tensor, one_sixth: torch.Tensor):
    """solbench.quant.cpu_bf16's input quantizer: [rows, K] (K % 16 == 0) -> (bf16 [rows * K / 16, 16] of
    e2m1 * s_b, S_dec (fp32 0-dim), global amax). nvfp4_rows_e2m1's codes and scales, scaled back by s_b alone
    (exact in fp32 and in bf16) instead of by fp32(s_b * S_dec); reshaped by the caller (see _fake_nvfp4_rows)."""
    y, block_scale, decode_global, global_amax, _ = nvfp4_rows_e2m1(x2d, one_sixth)
    return (y * block_scale[:, None]).to(torch.bfloat16), decode_global, global_amax


def _fp8_bf16_rows(x2d: torch.Tensor):
    """solbench.quant.cpu_bf16's FP8 input quantizer: _fp8_tensor_rows' codes widened to bf16 (exact), the decode scale."""
    codes, decode = _fp8_tensor_rows(x2d)
    return codes.to(torch.bfloat16), decode


_KERNELS: Dict[str, Callable] = {
    "absmax_blocks": _absmax_blocks,
    "nvfp4_block_scales": _nvfp4_block_scales,
    "fake_e2m1": _fake_e2m1,
    "fake_nvfp4_rows": _fake_nvfp4_rows,
    "encode_e2m1": _encode_e2m1,
    "e2m1_pair_bits": _e2m1_pair_bits,
    "scale_blocks": _scale_blocks,
    "fake_e4m3": _fake_e4m3,
    "encode_e4m3": _encode_e4m3,
    "decode_e4m3": _decode_e4m3,
    "fp8_tensor_rows": _fp8_tensor_rows,
    "fp8_channel_rows": _fp8_channel_rows,
    "nvfp4_bf16_rows": _nvfp4_bf16_rows,
    "fp8_bf16_rows": _fp8_bf16_rows,
}


def _guarded(name: str, compiled: Callable) -> Callable:
    def run(*args, **kwargs):
        if _STATE["disabled"]:
            return _KERNELS[name](*args, **kwargs)
        # Views (x2d.view(-1, 16), ...) would make dynamo guard on their base tensor's layout and
        # recompile for every new base; detached tensors share the storage without a base.
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:  # no compiler, inductor bug, ...: fall back for good
            disable(f"{type(exc).__name__}: {exc}")
            warnings.warn(
                f"solbench.quant: torch.compile of the fused quantizer failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); using the eager path (slower on shared cores). "
                "Set SOLBENCH_QUANT_COMPILE=0 to skip the attempt.",
                RuntimeWarning,
                stacklevel=3,
            )
            return _KERNELS[name](*args, **kwargs)

    return run


def kernel(name: str, x: torch.Tensor) -> Optional[Callable]:
    """The compiled kernel `name` for work on `x`, or None when the eager path should run."""
    if _STATE["disabled"] or x.device.type != "cpu" or x.numel() < MIN_ELEMENTS:
        return None
    if x.requires_grad and torch.is_grad_enabled():
        return None
    return _compiled_once(name, name)


def _compiled_once(key: str, name: str, options: Optional[dict] = None) -> Optional[Callable]:
    """Kernel `name` compiled once per process under `key` (dynamic shapes, inductor `options`), guarded
    by `_guarded`; None (and compilation off from then on) where torch.compile itself fails."""
    fn = _COMPILED.get(key)
    if fn is None:
        with _LOCK:
            fn = _COMPILED.get(key)
            if fn is None:
                try:
                    compiled = torch.compile(_KERNELS[name], dynamic=True, fullgraph=True, options=options or None)
                except Exception as exc:  # torch.compile itself unavailable, or an option this torch lacks
                    disable(f"{type(exc).__name__}: {exc}")
                    return None
                fn = _COMPILED[key] = _guarded(name, compiled)
    return fn


def eager_numerics_options() -> dict:
    """inductor options that make a GPU kernel round like eager torch: IEEE division (Triton's ``/`` is an
    approximate ``div.full``) and no flushing of fp32 subnormals. Named per torch release; {} where this
    torch has neither (the C++ CPU backend divides exactly anyway)."""
    try:
        from torch._inductor import config
    except Exception:  # pragma: no cover - torch without inductor
        return {}
    if hasattr(config, "eager_numerics"):
        return {"eager_numerics.division_rounding": True, "eager_numerics.disable_ftz": True}
    if hasattr(config, "emulate_divison_rounding"):  # torch <= 2.11 spells it so
        return {"emulate_divison_rounding": True}
    return {}


def native_kernel(name: str) -> Callable:
    """Compiled kernel ``name`` for the scaled-matmul backend (solbench.quant.native), on any device:
    compiled once per process with dynamic shapes and eager division rounding; the eager arithmetic
    while compilation is off or has failed (``disable``, SOLBENCH_QUANT_COMPILE=0), bit-identical."""
    if _STATE["disabled"]:
        return _KERNELS[name]
    return _compiled_once(f"native:{name}", name, eager_numerics_options()) or _KERNELS[name]


_GUARD = {"depth": 0, "saved": None}
_GUARD_LOCK = threading.Lock()


@contextlib.contextmanager
def single_thread_if_small(numel: int):
    """Run the enclosed quantizer ops on one intra-op thread when the tensor is small.

    Small quantizer calls are many tiny ops: on one thread each costs microseconds, on several
    each is a parallel region that waits out a time slice whenever another process holds a core.
    torch's thread count is process-global, so other Python threads' ops issued meanwhile also run
    single-threaded. Nested and concurrent guards share one count: the first to enter saves the
    thread count, the last to leave restores it (two Python threads quantizing at once cannot
    leave the process at one thread).
    """
    if numel >= SMALL_ELEMENTS:
        yield
        return
    with _GUARD_LOCK:
        if _GUARD["depth"] == 0:
            threads = torch.get_num_threads()
            _GUARD["saved"] = threads
            if threads != 1:
                torch.set_num_threads(1)
        _GUARD["depth"] += 1
    try:
        yield
    finally:
        with _GUARD_LOCK:
            _GUARD["depth"] -= 1
            if _GUARD["depth"] == 0 and _GUARD["saved"] not in (None, 1):
                torch.set_num_threads(_GUARD["saved"])
