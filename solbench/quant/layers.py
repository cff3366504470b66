"""Linear layers that run in a recipe's low precision: emulated (any device) or TransformerEngine.

Which backend builds which layer is the registry's (solbench.quant.registry; the built-in backends are
registered in solbench.quant.backends); ``make_quantized_layer`` asks it.

`QuantLinear` emulates a low-precision GEMM with fake quantization: its weight holds the
quantized-then-dequantized values, computed once per `load_weight` (i.e. once per policy sync),
and, when the recipe quantizes activations, its input is rounded through the format in 1x16
(NVFP4) / 1x32 (MXFP4) / per-tensor (FP8) blocks on every forward before a plain F.linear.
The numbers match what a Blackwell FP4 GEMM consumes; the speed does not (see docs).

`TELinear` wraps TransformerEngine's te.Linear under its NVFP4 / FP8 recipe, the path Sol-RL
runs on B200s. TransformerEngine cannot even be imported without CUDA, so everything about it is
checked up front and reported by `BackendUnavailableError`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import BackendUnavailableError, _SharedInputQuantization, te_rows_padded  # noqa: F401 (importable from here too)
from .formats import NonFiniteError, fake_quantize
from . import registry
from .cpu_bf16 import CpuBf16Linear
from .native import NativeLinear
from .recipes import QuantRecipe

__all__ = ["QuantLinear", "TELinear", "BackendUnavailableError", "te_unavailable_reason", "TE_REQUIREMENTS"]


class QuantLinear(nn.Module):
    """Drop-in nn.Linear replacement that emulates the recipe's precision with fake quantization.

    `weight` holds dequantized low-precision values (in the dtype of the layer it replaces) and is
    not trainable; call `load_weight` to re-quantize from new full-precision weights.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        recipe: QuantRecipe,
        *,
        name: str = "",
        dtype: Optional[torch.dtype] = None,
        device=None,
        shared_inputs: Optional[_SharedInputQuantization] = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.recipe = recipe
        self.name = name
        self.weight = nn.Parameter(
            torch.zeros(out_features, in_features, dtype=dtype, device=device), requires_grad=False
        )
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._shared_inputs = shared_inputs

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        recipe: QuantRecipe,
        *,
        name: str = "",
        shared_inputs: Optional[_SharedInputQuantization] = None,
        weight: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None,
    ) -> "QuantLinear":
        """A QuantLinear holding the quantized weights of `linear` (or of `weight`/`bias`, the
        tensors to quantize when `linear` holds only a stand-in)."""
        weight = linear.weight if weight is None else weight
        bias = linear.bias if bias is None else bias
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias is not None,
            recipe,
            name=name,
            dtype=weight.dtype,
            device=weight.device,
            shared_inputs=shared_inputs,
        )
        layer.load_weight(weight, bias)
        return layer

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Quantize full-precision `weight` (and copy `bias`) into this layer."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"layer {self.name!r}: weight of shape {tuple(weight.shape)} does not fit "
                f"[out_features={self.out_features}, in_features={self.in_features}]"
            )
        try:
            quantized = fake_quantize(
                weight.detach(), self.recipe.format, self.recipe.weight_block, nonfinite=self.recipe.nonfinite
            )
        except NonFiniteError as exc:
            raise NonFiniteError(f"layer {self.name!r}, weight: {exc}") from None
        self.weight.copy_(quantized)
        if (bias is None) != (self.bias is None):
            raise ValueError(f"layer {self.name!r}: bias presence differs between source ({bias is not None}) and copy")
        if bias is not None:
            self.bias.copy_(bias.detach())

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the low-precision GEMM sees it (fake-quantized along the last dim)."""
        key = (self.recipe.format, self.recipe.activation_block, self.recipe.nonfinite)
        if self._shared_inputs is not None:
            cached = self._shared_inputs.get(x, key)
            if cached is not None:
                return cached
        try:
            result = fake_quantize(x, self.recipe.format, self.recipe.activation_block, nonfinite=self.recipe.nonfinite)
        except NonFiniteError as exc:
            raise NonFiniteError(f"layer {self.name!r}, input activations: {exc}") from None
        if self._shared_inputs is not None:
            self._shared_inputs.put(x, key, result)
        return result

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.activations:
            x = self.quantize_input(x)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, precision={self.recipe.label!r}"
        )


# --------------------------------------------------------------------------------------------
# TransformerEngine backend
# --------------------------------------------------------------------------------------------

TE_REQUIREMENTS = (
    "backend='te' runs quantized layers as TransformerEngine te.Linear under its "
    "NVFP4BlockScaling (nvfp4) or Float8CurrentScaling (fp8) recipe. It needs an NVIDIA "
    "Blackwell GPU (sm_100 or newer) for NVFP4, a Hopper GPU (sm_90) or newer for FP8, and "
    "`pip install transformer-engine[pytorch]`. Use backend='emulated' to emulate the same "
    "precision on any device."
)


def te_unavailable_reason(recipe: QuantRecipe) -> Optional[str]:
    """Why `recipe` cannot run on the TE backend here, or None if it can."""
    if recipe.format == "mxfp4":
        return "TransformerEngine has no MXFP4 recipe (it offers NVFP4 and FP8/MXFP8)"
    if not recipe.activations:
        return "te.Linear quantizes inputs and weights together; it has no weight-only mode"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    major, minor = torch.cuda.get_device_capability()
    needed = (10, 0) if recipe.format == "nvfp4" else (9, 0)
    if (major, minor) < needed:
        return f"the GPU is sm_{major}{minor}; {recipe.format} needs sm_{needed[0]}{needed[1]} or newer"
    try:
        import transformer_engine.pytorch  # noqa: F401
        import transformer_engine.common.recipe  # noqa: F401
    except Exception as exc:  # the PyPI meta wheel raises on import without CUDA/cuDNN
        return f"transformer_engine.pytorch cannot be imported ({type(exc).__name__}: {exc})"
    return None


def _require_te(recipe: QuantRecipe):
    """(transformer_engine.pytorch, TE's recipe object for ``recipe``); BackendUnavailableError, saying what TE
    needs, where backend te cannot run ``recipe`` here (the registry's answer, decided once per process)."""
    registry.require("te", recipe)
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipes

    if recipe.format == "nvfp4":
        quant_recipe = te_recipes.NVFP4BlockScaling()
    elif recipe.format == "fp8_e5m2":
        # exactly the recipe object of Sol-RL's public train_utils.py (NVFP4_RECIPE there), which TE runs as
        # per-tensor FP8 E5M2 with delayed scaling (solbench.quant.fp8._fake_quantize_fp8_e5m2)
        quant_recipe = te_recipes.DelayedScaling(fp8_format=te_recipes.Format.E2M1, amax_history_len=16,
                                                 amax_compute_algo="max")
    else:
        quant_recipe = te_recipes.Float8CurrentScaling(fp8_format=te_recipes.Format.E4M3)
    return te, quant_recipe


class TELinear(nn.Module):
    """te.Linear under TE's low-precision autocast: the real FP4/FP8 GEMM on Blackwell/Hopper."""

    def __init__(self, linear: nn.Linear, recipe: QuantRecipe, *, name: str = "",
                 weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None) -> None:
        super().__init__()
        te, self._te_recipe = _require_te(recipe)
        weight = linear.weight if weight is None else weight  # the tensor to quantize (linear may hold a stand-in)
        bias = linear.bias if bias is None else bias
        if linear.in_features % 16 or linear.out_features % 16:
            raise ValueError(
                f"layer {name!r}: TransformerEngine needs in/out features divisible by 16, got "
                f"{linear.in_features}x{linear.out_features}; add it to the recipe's skip list"
            )
        if not weight.is_cuda:
            raise ValueError(
                f"layer {name!r}: backend='te' builds TransformerEngine layers on the GPU; move the "
                "model to a CUDA device before quantized_copy"
            )
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.recipe = recipe
        self.name = name
        device = weight.device
        # The copy holds only its low-precision weight where TE allows: built under TE's
        # quantized-parameter init (quantized_model_init, TE >= 2.8; fp8_model_init before), te.Linear
        # stores the weight as a QuantizedTensor (FP8 or NVFP4 data + scales) and no BF16 copy.
        # Where this TE cannot (an older release, a recipe without quantized parameters), the
        # weight stays in BF16 and TE quantizes it on each forward; ``low_precision_weights`` says which.
        init = getattr(te, "quantized_model_init", None) or getattr(te, "fp8_model_init", None)
        self.low_precision_weights = False
        self.inner = None
        if init is not None:
            try:
                with init(enabled=True, recipe=self._te_recipe):
                    self.inner = te.Linear(linear.in_features, linear.out_features, bias=bias is not None,
                                           params_dtype=weight.dtype, device=device)
                self.low_precision_weights = type(self.inner.weight).__name__ != "Parameter" or hasattr(
                    self.inner.weight, "quantize_")
            except (NotImplementedError, ValueError, RuntimeError, TypeError, AssertionError):
                self.inner = None
        if self.inner is None:
            self.inner = te.Linear(
                linear.in_features,
                linear.out_features,
                bias=bias is not None,
                params_dtype=weight.dtype,
                device=device,
            )
        # TE >= 2.8 calls it autocast(recipe=...); older releases fp8_autocast(fp8_recipe=...).
        if hasattr(te, "autocast"):
            self._autocast = lambda: te.autocast(enabled=True, recipe=self._te_recipe)
        else:
            self._autocast = lambda: te.fp8_autocast(enabled=True, fp8_recipe=self._te_recipe)
        self.load_weight(weight, bias)

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    @property
    def bias(self) -> Optional[torch.Tensor]:
        return self.inner.bias if self.inner.use_bias else None

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
        """Copy full-precision weights in; TE quantizes them on the forward pass."""
        if not bool(torch.isfinite(weight).all()) and self.recipe.nonfinite == "error":
            raise NonFiniteError(f"layer {self.name!r}: weight has non-finite values")
        target = self.inner.weight
        if callable(getattr(target, "quantize_", None)):  # a QuantizedTensor: re-quantize in place
            target.quantize_(weight.to(device=target.device))
        else:
            target.copy_(weight)
        if bias is not None:
            self.inner.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return te_rows_padded(self.inner, x, te_row_multiple(self.recipe))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, precision={self.recipe.label!r} (TransformerEngine)"


def te_row_multiple(recipe: QuantRecipe) -> int:
    """Rows (the product of an input's leading dimensions) TE's quantized GEMMs need a multiple of:
    8 for FP8, 16 for NVFP4 (its 16-element blocks run along both GEMM operands' K, and the FP4
    kernels tile rows by 16)."""
    return 16 if recipe.format in ("nvfp4", "mxfp4") else 8


def make_quantized_layer(
    linear: nn.Linear,
    recipe: QuantRecipe,
    backend: str,
    *,
    name: str,
    shared_inputs: Optional[_SharedInputQuantization],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
) -> nn.Module:
    """Backend ``backend``'s replacement for `linear` (its ``make_layer``, solbench.quant.registry), its weights
    quantized from `weight` and `bias` (default: `linear`'s own; quantized_copy passes the policy's, `linear` then
    holding a meta-device stand-in)."""
    weight = linear.weight if weight is None else weight
    bias = linear.bias if bias is None else bias
    return registry.get_backend(backend).make_layer(linear, recipe, name=name, shared_inputs=shared_inputs,
                                                    weight=weight, bias=bias)


#: The built-in backends' layer classes (a registered backend's own: solbench.quant.registry.layer_types()).
QUANTIZED_LAYER_TYPES: Tuple[type, ...] = (QuantLinear, TELinear, NativeLinear, CpuBf16Linear)
