"""solbench.quant: NVFP4 / MXFP4 / FP8 quantization and low-precision copies of a policy.

Sol-RL ("FP4 Explore, BF16 Train") explores with an NVFP4 copy of the policy. This package
provides the pieces:

- `quantize(x, fmt, block)` -> `QuantizedTensor` (packed codes + scales, TransformerEngine's
  arithmetic to the bit) and `QuantizedTensor.dequantize`; `fake_quantize` for both at once.
- `QuantRecipe`, `RECIPES`, `get_recipe`: which layers run in which precision
  ("nvfp4_flux", "nvfp4_sana", "nvfp4_tiny", "nvfp4_w4a4", ...); `recipe_for_model` binds a recipe
  whose size threshold follows the model's width (the tiny model's) to a model.
- the backends that run a copy's quantized layers (emulated, te, torch, cpu_bf16): one `Backend` record each in
  `registry` (name, label, availability with its reason, layer factory, whether it computes on low-precision
  units), registered in solbench.quant.backends; `get_backend` looks one up (with a "did you mean" on typos).
- `quantized_copy(model, recipe, backend=...)`, `sync_weights(copy, model)`, `quantization_summary(copy)`,
  `low_precision_mac_share(copy, forward)` (the share of Linear MACs a copy runs in low precision).
- `error_stats`, `layer_error_report`: relative MSE / SNR, per tensor and per layer.

See docs/quantization.md.

Stage ``quant`` (solbench/stages.py): it imports its own modules and the stages below it, world, report, results,
machine, text, base.
"""

from . import registry
from .formats import FORMATS, NonFiniteError, QuantizedTensor, fake_quantize, quantize
from .layers import BackendUnavailableError, QuantLinear, TELinear
from .model import (LayerQuantization, MacShare, low_precision_mac_share, quantization_summary, quantized_copy,
                    recipe_for_model, sync_weights)
from .recipes import RECIPES, QuantRecipe, UnknownRecipeError, get_recipe
from .registry import Backend, UnknownBackendError, get_backend
from .stats import LayerError, error_stats, layer_error_report
from . import backends  # noqa: E402,F401 - registers the built-in backends in the registry (solbench.quant.registry)

__all__ = [
    "quantize",
    "fake_quantize",
    "QuantizedTensor",
    "FORMATS",
    "NonFiniteError",
    "QuantRecipe",
    "get_recipe",
    "RECIPES",
    "UnknownRecipeError",
    "quantized_copy",
    "recipe_for_model",
    "sync_weights",
    "quantization_summary",
    "LayerQuantization",
    "low_precision_mac_share",
    "MacShare",
    "QuantLinear",
    "TELinear",
    "BackendUnavailableError",
    "Backend",
    "get_backend",
    "UnknownBackendError",
    "registry",
    "error_stats",
    "layer_error_report",
    "LayerError",
]
