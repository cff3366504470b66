"""The explore copy on the CPU's bf16 units (backend "cpu_bf16"): NVFP4 / FP8 values, bf16 GEMMs.

On CPU the emulated backend computes an NVFP4 layer as fake quantization followed by an fp32 GEMM,
so an explore forward costs more than a full-precision one. Yet the values an NVFP4 GEMM consumes
fit the CPU's bf16 units exactly: with the per-tensor scale factored out, an NVFP4 value is an E2M1
element (at most 2 significant bits) times its E4M3 block scale (4 bits), at most 6 significant bits
and an exponent inside bf16's (fp32's) range, so exact in bf16's 8; an FP8 E4M3 code with its
per-tensor scale factored out is exact in bf16 too. The product of two bf16 values is exact in fp32.
So this backend computes

    y = bf16_GEMM(Xv, Wv) * (S_x * S_w) + bias

where ``Wv`` (bf16) holds the weight's element-times-block-scale values, formed once per refresh
(``load_weight``, from ``solbench.quant.formats.quantize``: TE's arithmetic to the bit), ``Xv`` the
input's, formed on every forward by one compiled pass pair over the input (block amax with the
global amax, then scale, round to E2M1 and cast: ``quantize_nvfp4_bf16_rows``), and ``S_x``, ``S_w``
the two per-tensor decode scales (fp32 0-dim). The codes and the block and per-tensor scales are the
emulated path's bit for bit (same operations, same order as solbench.quant.fused's kernel; tests/
test_quant_cpu_bf16.py holds them to ``quantize``).

How its outputs relate to the emulated layer's (``QuantLinear``, same recipe, same weights):
1. the emulated layer multiplies ``e2m1 * fp32(s_b * S_dec)`` per element, this one ``(e2m1 * s_b)`` and
   applies ``S_x * S_w`` after the sum: each element differs by at most one fp32 rounding (2^-24
   relative);
2. the GEMM's products are exact in both; the sums run in fp32 in another order (oneDNN's, not MKL's);
3. torch's CPU bf16 GEMM returns bf16 (``aten::mm`` with an fp32 output is not implemented on CPU),
   so each output is rounded to bf16 (at most 2^-9 relative) before the fp32 scale and bias: what a
   GPU's NVFP4 GEMM with a bf16 output does too.
Bound the tests state: ``|y - y_emulated| <= 2^-8 |y_emulated| + 2^-16 (|Xv| @ |Wv|^T) S_x S_w``
elementwise (the second term covers the summation order and the rounding of item 1).

Where it runs: any CPU (torch computes bf16 GEMMs everywhere). It is fast only where the CPU has bf16
units (AVX512_BF16 dot products, AMX tiles: solbench.machine.cpu.native_bf16), so ``quant.backend: auto``
takes it there and only there. Recipes it runs: NVFP4 with 1x16 activation blocks and FP8 E4M3 per
tensor, weights and activations (W4A4, W8A8), non-finite policy "error"; layers with in/out features
divisible by 16 (as the GPU backends). Weight-only recipes would have to round the input to bf16,
which is not the recipe's arithmetic; MXFP4 and E5M2 are not implemented here (the emulated path runs them).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused
from .common import BackendUnavailableError, copy_layer_bias, quantize_layer_weight
from .formats import E2M1_VALUES, NonFiniteError
from .nvfp4 import _FP32_ONE_SIXTH_TENSOR, _nvfp4_global_scales
from .recipes import QuantRecipe

__all__ = ["CpuBf16Linear", "cpu_bf16_unavailable_reason", "quantize_nvfp4_bf16_rows", "quantize_fp8_bf16_rows"]

def cpu_bf16_unavailable_reason(recipe: QuantRecipe, device=None) -> Optional[str]:
    """Why backend cpu_bf16 cannot run ``recipe`` on ``device``, or None. (Whether the CPU has bf16
    units is auto's question, solbench.quant.backends; an explicit request runs anywhere on CPU.)"""
    if device is not None and torch.device(device).type != "cpu":
        return f"cpu_bf16 runs on the CPU; the model is on {torch.device(device).type}"
    if recipe.format not in ("nvfp4", "fp8"):
        return f"cpu_bf16 runs NVFP4 and FP8 E4M3 recipes; {recipe.format} runs emulated"
    if recipe.format == "fp8" and recipe.weight_block is not None:
        return "cpu_bf16 runs FP8 with per-tensor scales only (weight_block None)"
    if not recipe.activations:
        return ("cpu_bf16 quantizes weights and activations together; a weight-only recipe would round its "
                "input to bf16, which is not the recipe's arithmetic")
    if recipe.nonfinite != "error":
        return "cpu_bf16 raises on non-finite values (nonfinite: error); 'propagate' runs emulated"
    return None


# --------------------------------------------------------------------------------------------
# Activation quantizers: values in bf16 (exact) + the per-tensor decode scale
# --------------------------------------------------------------------------------------------


def quantize_nvfp4_bf16_rows(x2d: torch.Tensor, where: str = "input") -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 (1x16 blocks, TE's current scaling) of a [rows, K] tensor as (bf16 [rows, K] values e2m1 * s_b,
    fp32 0-dim S_dec): ``values * S_dec`` is the emulated path's fake-quantized input up to one fp32 rounding."""
    rows, k = x2d.shape
    compiled = fused.kernel("nvfp4_bf16_rows", x2d)
    fn = compiled if compiled is not None else fused._nvfp4_bf16_rows
    values, decode, global_amax = fn(x2d, _FP32_ONE_SIXTH_TENSOR)
    if not torch.isfinite(global_amax):
        raise NonFiniteError(f"{where}: the tensor holds NaN or inf (cpu_bf16 runs nonfinite: error)")
    return values.view(rows, k), decode


def quantize_fp8_bf16_rows(x2d: torch.Tensor, where: str = "input") -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 per tensor (TE's current scaling) of a [rows, K] tensor as (bf16 codes' values, fp32 decode)."""
    compiled = fused.kernel("fp8_bf16_rows", x2d)
    values, decode = (compiled if compiled is not None else fused._fp8_bf16_rows)(x2d)
    if not torch.isfinite(decode):  # a NaN amax gives a NaN scale, an infinite one 1 / 0
        raise NonFiniteError(f"{where}: the tensor holds NaN or inf (cpu_bf16 runs nonfinite: error)")
    return values, decode


# --------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------


class CpuBf16Linear(nn.Module):
    """nn.Linear replacement computing a W4A4 (NVFP4) or W8A8 (FP8) layer on the CPU's bf16 units.

    Buffers: ``values`` (bf16 [N, K]: the weight's element x block-scale values, exact), ``decode``
    (fp32 0-dim: the weight's per-tensor decode scale), ``bias`` (the layer's dtype). No full-precision
    copy of the weight is kept. The forward is the module docstring's formula.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, recipe: QuantRecipe, *, name: str = "",
                 dtype: torch.dtype = torch.float32, device=None, shared_inputs=None) -> None:
        super().__init__()
        reason = cpu_bf16_unavailable_reason(recipe, device)
        if reason is not None:
            raise BackendUnavailableError(f"layer {name!r}, recipe {recipe.name!r}: {reason}")
        if in_features % 16 or out_features % 16:
            raise ValueError(f"layer {name!r}: cpu_bf16 needs in/out features divisible by 16, got "
                             f"{in_features}x{out_features}; add it to the recipe's skip list")
        self.in_features, self.out_features = in_features, out_features
        self.recipe, self.name, self.dtype = recipe, name, dtype
        self.register_buffer("values", torch.zeros(out_features, in_features, dtype=torch.bfloat16, device=device))
        self.register_buffer("decode", torch.ones((), device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)
        self._shared_inputs = shared_inputs

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Quantize full-precision ``weight`` (and copy ``bias``) into the layer's buffers."""
        q = quantize_layer_weight(self, weight)
        self.values.copy_(weight_values(q))
        if self.recipe.format == "fp8":
            self.decode.copy_(q.scales)
        else:
            self.decode.fill_(_nvfp4_global_scales(float(q.global_amax))[1])  # S_dec, exactly as formats
        copy_layer_bias(self, bias)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the layer multiplies by, values x per-tensor decode (for checks)."""
        return (self.values.float() * self.decode).to(dtype)

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(bf16 [rows, K] values, fp32 decode) of the input; computed once for sibling layers fed the very
        same tensor (q/k/v), which the cache recognises by the tensor object and its version."""
        key = ("cpu_bf16", self.recipe.format)
        if self._shared_inputs is not None:
            cached = self._shared_inputs.get(x, key)
            if cached is not None:
                return cached
        where = f"layer {self.name!r}, input activations"
        x2d = x.reshape(-1, self.in_features)
        result = (quantize_nvfp4_bf16_rows(x2d, where) if self.recipe.format == "nvfp4"
                  else quantize_fp8_bf16_rows(x2d, where))
        if self._shared_inputs is not None:
            self._shared_inputs.put(x, key, result)
        return result

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        values, decode = self.quantize_input(x)
        out = F.linear(values, self.values)  # bf16 out: one rounding per output
        scale = decode * self.decode
        out = torch.addcmul(self.bias.float(), out, scale) if self.bias is not None else out.float() * scale
        return out.to(self.dtype).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"precision={self.recipe.label!r} (bf16 GEMM on the CPU)")


def weight_values(q) -> torch.Tensor:
    """bf16 [N, K] element x block-scale values of a quantized weight (``formats.QuantizedTensor``), exact."""
    n = q.shape[0]
    if q.fmt == "fp8":
        return q.codes.view(torch.float8_e4m3fn).to(torch.bfloat16).view(n, -1)
    table = E2M1_VALUES.to(q.codes.device)
    elements = torch.stack([table[(q.codes & 15).long()], table[(q.codes >> 4).long()]], dim=-1).view(n, -1, 16)
    return (elements * q.scales.float()[..., None]).view(n, -1)[:, :q.shape[-1]].to(torch.bfloat16)
