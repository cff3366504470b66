"""The explore copy on the GPU's own low-precision tensor cores without TransformerEngine (backend "torch").

TransformerEngine has no wheel for its PyTorch extension (it compiles against the local torch and
CUDA), so a machine without it used to explore emulated, slower than BF16. This backend needs
nothing beyond torch: ``NativeLinear`` keeps the weight in the format itself (FP8 E4M3 codes and a
per-tensor scale; NVFP4 packed E2M1 codes, E4M3 block scales in cuBLAS's swizzled layout and the
per-tensor scale) and runs torch's scaled matrix multiply on it:

- FP8 (Ada sm_89, Hopper sm_90, Blackwell): ``torch._scaled_mm`` with per-tensor scales, the
  input quantized on every forward with TE's current scaling (scale = 448 / amax) by one compiled
  function of two passes over the input (amax with the scale, then scale and cast:
  solbench.quant.fused.native_kernel); inside a compiled forward (solbench.models.compile) the same
  arithmetic is traced into the block's graph, where inductor fuses the quantizations of a tensor that
  several layers read (q, k, v) into one pass: the input read and its amax and scale computed once,
  each layer's codes written by that pass (tests/test_quant_native.py reads the generated code). Eager
  forwards quantize once per input too where layers share it (quantized_copy's ``share_input_quantization``:
  q/k/v, FLUX single blocks' fused input projections). ``fast_accum`` (quant.fast_accum)
  lets the FP8 GEMM accumulate in its faster, less precise mode (``use_fast_accum``).
- FP8 rowwise (recipes with ``rowwise``, e.g. ``fp8_rowwise_flux``): a scale per input row (token) and per
  output channel of the weight, ``torch._scaled_mm`` with scale_a [M, 1] and scale_b [1, N] (torchao's
  float8 rowwise); the input quantizer is ``quantize_fp8_rowwise``, formats.quantize(x, "fp8", "channel")
  to the bit. Rowwise GEMMs write bf16; a layer of another dtype multiplies with unit scales into fp32 and
  applies the two scale vectors after.
- NVFP4 (Blackwell sm_100+): ``torch._scaled_mm`` on ``float4_e2m1fn_x2`` operands with swizzled
  E4M3 block scales (torchao's NVFP4 route), times the two per-tensor decode scales.

The operands are solbench's own quantizers' (solbench.quant.formats, TE's arithmetic to the bit):
the weight through ``quantize``, the input through the sync-free ``quantize_fp8_rows`` /
``quantize_nvfp4_rows`` below, which give the same codes and scales as ``quantize`` without
reading anything back to the host (a host sync per layer would serialise the GPU). So the native
path consumes exactly the numbers the emulated path computes with; only the GEMM's accumulation
order and its output rounding differ (tests/test_quant_native.py, scripts/gpu_check.py).

Inputs are not checked for NaN/inf on every forward (that is a host sync): a non-finite explore
rollout shows up as a non-finite reward, which the trainer stops on before training. Weights are
checked when they load (``recipe.nonfinite``). Weight-only recipes, MXFP4 and FP8 E5M2 (``fp8_e5m2``: torch's scaled matmul has no E5M2 x E5M2 GEMM)
have no native path here.
On CPU the FP8 path runs too (torch has a CPU ``_scaled_mm``; a reference for tests, not a speed-up);
``backend: auto`` only takes this backend on CUDA GPUs.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from . import fused
from .formats import (
    _FP32_ONE_SIXTH,
    _nvfp4_global_scales,
    E4M3_MAX,
    FLT_MAX,
    FP4_MAX,
    NVFP4_BLOCK,
    _encode_e2m1_,
    swizzle_scales_128x4,
)
from .common import BackendUnavailableError, copy_layer_bias, quantize_layer_weight
from .recipes import QuantRecipe

__all__ = ["NativeLinear", "native_unavailable_reason", "quantize_fp8_rows", "quantize_fp8_rowwise", "quantize_nvfp4_rows",
           "set_fast_accum"]

# Blackwell is the first architecture with FP4 tensor cores; Ada and Hopper have FP8.
_NEEDED_CAPABILITY = {"fp8": (8, 9), "nvfp4": (10, 0)}
ROW_MULTIPLE = 16  # cuBLAS's scaled GEMMs want the row count (and K, N) in multiples of 16


def native_unavailable_reason(recipe: QuantRecipe, device: torch.device | str | None = None,
                              capability: Optional[tuple[int, int]] = None) -> Optional[str]:
    """Why ``recipe`` cannot run on torch's scaled matmul on ``device`` (default: the current GPU,
    else CPU), or None if it can. ``capability`` (major, minor) stands for the CUDA device's own
    (what solbench doctor reports); given, it is used instead of asking torch.cuda."""
    if not recipe.activations:
        return "torch's scaled matmul quantizes both operands; there is no weight-only mode"
    if recipe.format == "mxfp4":
        return "no MXFP4 path is implemented on torch's scaled matmul (NVFP4 and FP8 are)"
    if recipe.format == "fp8_e5m2":
        return ("torch's scaled matmul has no FP8 E5M2 x E5M2 GEMM (\"Multiplication of two Float8_e5m2 matrices "
                "is not supported\"); fp8_e5m2 recipes run on TransformerEngine or emulated")
    if recipe.format not in _NEEDED_CAPABILITY:
        return f"no {recipe.format} path is implemented on torch's scaled matmul (NVFP4 and FP8 E4M3 are)"
    if recipe.format == "fp8" and recipe.rowwise != (recipe.weight_block == "channel"):
        return ("torch's FP8 scaled matmul scales both operands per tensor or both per row: per-tensor activations "
                "need per-tensor weights, rowwise activations per-channel weights (recipe has "
                f"weights {recipe.weight_block or 'per-tensor'}, activations {'per row' if recipe.rowwise else 'per tensor'})")
    if not hasattr(torch, "_scaled_mm") or (recipe.format == "nvfp4" and not hasattr(torch, "float4_e2m1fn_x2")):
        return f"this torch {torch.__version__} has no scaled matmul for {recipe.format}"
    if device is None:
        cuda = capability is not None or torch.cuda.is_available()
        device = torch.device("cuda") if cuda else torch.device("cpu")
    device = torch.device(device)
    needed = _NEEDED_CAPABILITY[recipe.format]
    if device.type == "cuda":
        major, minor = capability or torch.cuda.get_device_capability(device)
        if (major, minor) < needed:
            return f"the GPU is sm_{major}{minor}; {recipe.format} tensor cores need sm_{needed[0]}{needed[1]} or newer"
        return None
    if device.type == "cpu" and recipe.format == "fp8":
        return None  # torch's CPU kernel: numerics, not speed
    return f"{recipe.format} through torch's scaled matmul needs a CUDA GPU (sm_{needed[0]}{needed[1]}+), not {device.type}"


# --------------------------------------------------------------------------------------------
# Activation quantizers without host syncs (same codes and scales as formats.quantize)
# --------------------------------------------------------------------------------------------


def quantize_fp8_rows(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes as float8_e4m3fn, fp32 0-dim decode scale) of ``x2d`` with TE's per-tensor current
    scaling, as formats.quantize(x, "fp8") computes them (finite inputs), with no host sync: the
    compiled two-pass kernel (fused.native_kernel), traced inline when the caller is being compiled,
    and the same arithmetic eagerly where compilation is off (same bits)."""
    if torch.compiler.is_compiling():
        return fused._fp8_tensor_rows(x2d)
    return fused.native_kernel("fp8_tensor_rows")(x2d)


def quantize_fp8_rowwise(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes as float8_e4m3fn [M, K], fp32 decode scales [M, 1]) of ``x2d`` with a scale per row, as
    formats.quantize(x, "fp8", "channel") computes them (finite inputs), with no host sync."""
    if torch.compiler.is_compiling():
        return fused._fp8_channel_rows(x2d)
    return fused.native_kernel("fp8_channel_rows")(x2d)


def quantize_nvfp4_rows(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed E2M1 codes uint8 [M, K/2], E4M3 block scales [M, K/16], fp32 0-dim S_dec) of ``x2d``
    [M, K] (K a multiple of 16) in 1x16 blocks with TE's arithmetic, as formats.quantize(x, "nvfp4")
    computes them (finite inputs), with no host sync."""
    rows, k = x2d.shape
    blocks = x2d.float().view(rows, k // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)  # [M, K/16]
    g = amax.max() if amax.numel() else amax.new_zeros(())
    encode_global = torch.where(g == 0, torch.ones_like(g), (torch.full_like(g, FP4_MAX * E4M3_MAX) / g).clamp(max=FLT_MAX))
    decode_global = torch.reciprocal(encode_global)
    multiplier = encode_global * _FP32_ONE_SIXTH  # fp32(S_enc * fp32(1/6)), as TE folds it
    block_scale = (amax * multiplier).clamp_(max=E4M3_MAX).to(torch.float8_e4m3fn)  # RNE onto the E4M3 grid
    encode = torch.reciprocal(block_scale.float() * decode_global).clamp_(max=FLT_MAX)
    y = (blocks * encode[..., None]).reshape(-1).contiguous()
    codes = _encode_e2m1_(y, torch.empty_like(y, dtype=torch.int32), torch.empty_like(y, dtype=torch.int32))
    pairs = codes.view(-1, 2)
    packed = (pairs[:, 0] | (pairs[:, 1] << 4)).to(torch.uint8)
    return packed.view(rows, k // 2), block_scale, decode_global



# --------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------


class NativeLinear(nn.Module):
    """nn.Linear replacement holding its weight in FP8 or NVFP4 and multiplying on the tensor cores.

    Buffers: ``codes`` (float8_e4m3fn [N, K] or packed uint8 [N, K/2]), ``scales`` (fp32 0-dim for
    FP8; swizzled float8_e4m3fn block scales for NVFP4), ``decode`` (fp32 0-dim per-tensor decode
    scale), ``bias`` (the layer's dtype). No full-precision copy of the weight is kept. Whether the
    device runs it is checked by quantized_copy (through the backend registry: ``native_unavailable_reason``,
    decided once per process); an NVFP4 layer can be built and loaded anywhere (its operands are checked on CPU),
    its forward needs sm_100+.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, recipe: QuantRecipe, *, name: str = "",
                 dtype: torch.dtype = torch.bfloat16, device=None, shared_inputs=None) -> None:
        super().__init__()
        if recipe.format not in _NEEDED_CAPABILITY:
            raise BackendUnavailableError(f"layer {name!r}, recipe {recipe.name!r}: "
                                          f"{native_unavailable_reason(recipe, device)}")
        if in_features % 16 or out_features % 16:
            raise ValueError(f"layer {name!r}: scaled matmuls need in/out features divisible by 16, got "
                             f"{in_features}x{out_features}; add it to the recipe's skip list")
        self.in_features, self.out_features = in_features, out_features
        self.recipe, self.name, self.dtype = recipe, name, dtype
        self.fast_accum = False  # FP8: the GEMM's fast accumulation (quant.fast_accum; set_fast_accum)
        # layers reading one tensor quantize it once (quant.common._SharedInputQuantization, given by quantized_copy)
        self.shared_inputs = shared_inputs
        fp4 = recipe.format == "nvfp4"
        self.register_buffer("codes", torch.zeros(out_features, in_features // 2 if fp4 else in_features,
                                                  dtype=torch.uint8 if fp4 else torch.float8_e4m3fn, device=device))
        scales = (swizzle_scales_128x4(torch.zeros(out_features, in_features // NVFP4_BLOCK, dtype=torch.float8_e4m3fn,
                                                   device=device)) if fp4
                  else torch.ones((out_features, 1) if recipe.rowwise else (), device=device))
        self.register_buffer("scales", scales)
        self.register_buffer("decode", torch.ones((), device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Quantize full-precision ``weight`` (and copy ``bias``) into the layer's buffers."""
        q = quantize_layer_weight(self, weight, self.codes.device)
        if self.recipe.format == "fp8":
            self.codes.copy_(q.codes.view(torch.float8_e4m3fn))
            self.scales.copy_(q.scales)
            self.decode.fill_(1.0)
        else:
            self.codes.copy_(q.codes)
            self.scales.copy_(q.swizzled_scales())
            self.decode.fill_(_nvfp4_global_scales(float(q.global_amax))[1])  # S_dec, exactly as formats
        copy_layer_bias(self, bias)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the GEMM multiplies by, decoded (for checks; the forward never forms it)."""
        if self.recipe.format == "fp8":
            return (self.codes.float() * self.scales).to(dtype)  # scales: 0-dim, or [N, 1] (rowwise)
        from .formats import E2M1_VALUES, _e4m3_to_float

        n, k = self.out_features, self.in_features
        table = E2M1_VALUES.to(self.codes.device)
        values = torch.stack([table[(self.codes & 15).long()], table[(self.codes >> 4).long()]], dim=-1).view(n, k)
        scales = _unswizzle(self.scales, n, k // NVFP4_BLOCK)
        return (values.view(n, -1, NVFP4_BLOCK) * (_e4m3_to_float(scales) * self.decode)[..., None]).view(n, k).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.numel() // self.in_features if self.in_features else 0
        out = self._gemm(*self.input_operands(x))
        return out[:rows].view(*lead, self.out_features)

    def input_operands(self, x: torch.Tensor) -> tuple:
        """The quantized input the GEMM multiplies: its rows zero-padded to a multiple of ROW_MULTIPLE (zero rows
        change no real row: their amax is 0) and quantized (FP8: codes and decode scale(s); NVFP4: packed codes,
        block scales and S_dec). Layers sharing ``shared_inputs`` reuse one result for one tensor (eagerly; a
        compiled forward computes it inline, where inductor fuses the siblings' quantizers into one pass)."""
        shared = self.shared_inputs if self.shared_inputs is not None and not torch.compiler.is_compiling() else None
        key = ("native", self.recipe.format, self.recipe.rowwise, self.in_features)
        if shared is not None:
            cached = shared.get(x, key)
            if cached is not None:
                return cached
        x2d = x.reshape(-1, self.in_features)
        pad = (-x2d.shape[0]) % ROW_MULTIPLE
        if pad:
            x2d = torch.cat([x2d, x2d.new_zeros(pad, self.in_features)])
        if self.recipe.format == "nvfp4":
            operands = quantize_nvfp4_rows(x2d)
        else:
            operands = quantize_fp8_rowwise(x2d) if self.recipe.rowwise else quantize_fp8_rows(x2d)
        if shared is not None:
            shared.put(x, key, operands)
        return operands

    def _gemm(self, *operands) -> torch.Tensor:
        if self.recipe.format == "nvfp4":
            codes, block_scales, decode = operands
            out = torch._scaled_mm(codes.view(torch.float4_e2m1fn_x2), self.codes.view(torch.float4_e2m1fn_x2).t(),
                                   swizzle_scales_128x4(block_scales), self.scales, out_dtype=torch.float32)
            out = out * (decode * self.decode)
        else:
            codes, decode = operands
            # tensorwise scales, or rowwise into bf16 (the only output rowwise GEMMs have): scales and bias applied
            # in the GEMM's epilogue, one rounding
            if self.dtype != torch.float32 and (not self.recipe.rowwise or self.dtype == torch.bfloat16):
                weight_scale = self.scales.view(1, -1) if self.recipe.rowwise else self.scales
                return torch._scaled_mm(codes, self.codes.t(), decode, weight_scale, bias=self.bias,
                                        out_dtype=self.dtype, use_fast_accum=self.fast_accum)
            if self.recipe.rowwise:  # unit scales into fp32, then the row and column scales
                one = torch.ones((), device=codes.device)
                out = torch._scaled_mm(codes, self.codes.t(), one, one, out_dtype=torch.float32,
                                       use_fast_accum=self.fast_accum) * decode * self.scales.view(1, -1)
            else:
                out = torch._scaled_mm(codes, self.codes.t(), decode, self.scales, out_dtype=torch.float32,
                                       use_fast_accum=self.fast_accum)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(self.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"precision={self.recipe.label!r} (torch scaled matmul{', fast accumulation' if self.fast_accum else ''})")


def set_fast_accum(model: nn.Module, enabled: bool) -> int:
    """Let every FP8 NativeLinear of ``model`` accumulate its GEMM in the fast mode (``use_fast_accum``:
    on Hopper, partial sums in the tensor core's reduced-precision accumulator, promoted less often) or
    not; returns how many layers it set. NVFP4 layers have no such mode and are left as they are."""
    layers = [m for m in model.modules() if isinstance(m, NativeLinear) and m.recipe.format == "fp8"]
    for layer in layers:
        layer.fast_accum = bool(enabled)
    return len(layers)


def _unswizzle(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of formats.swizzle_scales_128x4: the [rows, cols] scale matrix back from cuBLAS's layout."""
    row_blocks, col_blocks = -(-rows // 128), -(-cols // 4)
    raw = flat.view(torch.uint8).view(row_blocks, col_blocks, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return raw.reshape(row_blocks * 128, col_blocks * 4)[:rows, :cols].view(flat.dtype)
