"""Which FLOPs of a forward run at which precision under a quantization recipe.

One rule decides whether an nn.Linear runs quantized: ``solbench.quant.model.quantizes`` (the recipe's
skip patterns and its ``max(in, out) <= min_dim`` size rule, as the reference's
``replace_linear_with_te`` applies them, plus TransformerEngine's 16-divisibility on the ``te``
backend); ``quantized_copy`` builds the explore copy with it. This module applies the same rule to the
model's layers as they are shaped at a run's resolution and token counts (``solbench.models.flops.linear_layers``:
a forward on the meta device with a hook on every nn.Linear), so the cost projection of the paper's
setting (solbench/report/cost.py) and the projected clock of each run (solbench/report/clock.py) price
exactly the FLOPs the recipe puts in low precision, and everything else (attention products, the layers
the recipe keeps, convolutions) at full precision.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

from solbench.models.flops import LinearLayer, linear_layers, model_architecture
from solbench.quant.model import quantizes, recipe_for_config
from solbench.quant.recipes import QuantRecipe, get_recipe

#: A quantization recipe name that quantizes nothing (fidelity's step-budget control, BF16 methods).
NO_RECIPE = "none"


@dataclass(frozen=True)
class PrecisionSplit:
    """FLOPs of one forward of one sample, split by the precision the recipe runs them at."""

    model: str
    recipe: str
    total: float  # every matrix product of the forward (FlopCounterMode)
    linear: float  # the nn.Linear layers
    quantized: float  # the nn.Linear layers the recipe quantizes
    layers: tuple[tuple[LinearLayer, bool], ...]  # every Linear and whether it is quantized

    @property
    def quantized_share(self) -> float:
        """Share of the forward's FLOPs in quantized layers (the rest runs at full precision)."""
        return self.quantized / self.total if self.total else 0.0

    @property
    def linear_share(self) -> float:
        return self.linear / self.total if self.total else 0.0

    def kept(self) -> list[LinearLayer]:
        """The Linear layers the recipe keeps at full precision."""
        return [layer for layer, q in self.layers if not q]


def split_layers(layers: tuple[LinearLayer, ...], total: float, recipe: QuantRecipe | str, *,
                 model: str = "", backend: str | None = None) -> PrecisionSplit:
    """Apply ``recipe``'s rule on ``backend`` (``quantizes``; None: emulation's) to ``layers``: the PrecisionSplit
    of that forward."""
    if recipe == NO_RECIPE:
        marked = tuple((layer, False) for layer in layers)
        name = NO_RECIPE
    else:
        recipe = get_recipe(recipe)
        marked = tuple((layer, quantizes(recipe, layer.name, SimpleNamespace(
            in_features=layer.in_features, out_features=layer.out_features), backend)) for layer in layers)
        name = recipe.name
    return PrecisionSplit(model, name, float(total), float(sum(layer.flops for layer in layers)),
                          float(sum(layer.flops for layer, q in marked if q)), marked)


def precision_split(model: str, recipe: QuantRecipe | str, *, resolution: int | None = None,
                    path: str | None = None, backend: str | None = None,
                    text_tokens: int | None = None) -> PrecisionSplit:
    """The PrecisionSplit of one forward of ``model`` (tiny | flux | sd3 | sana) at ``resolution`` under
    ``recipe`` (a name, a QuantRecipe or ``"none"``). ``backend`` (a registered backend, e.g. "te"; None:
    emulation's rule): on ``te`` a layer whose features are not divisible by 16 stays in full precision.
    ``text_tokens``: a real model's text length (default: its pipeline's maximum, solbench.models.flops)."""
    if isinstance(recipe, str):
        return _cached_split(model, recipe, resolution, path, backend, text_tokens)
    return _split(model, recipe, resolution, path, backend, text_tokens)


def _split(model, recipe, resolution, path, backend, text_tokens=None) -> PrecisionSplit:
    class_name, config, shape_key = model_architecture(model, resolution=resolution, path=path,
                                                       text_tokens=text_tokens)
    total, layers = linear_layers(class_name, config, shape_key)
    if recipe != NO_RECIPE:
        recipe = recipe_for_config(recipe, config)  # a size threshold given per width, at this model's
    return split_layers(layers, total, recipe, model=model, backend=backend)


def run_text_tokens(model: str, text_max_length: int | None) -> int | None:
    """The text tokens a run's transformer attends to, as ``precision_split`` takes them: a real model's
    prompts encoded to the run's ``model.text_max_length`` (None: the adapter's default; SD3 adds CLIP's 77,
    solbench.models.activations.transformer_text_tokens), not the pipeline's maximum; None for the tiny model,
    whose token counts come from its weights' JSON."""
    if model == "tiny":
        return None
    from solbench.models.activations import transformer_text_tokens

    return transformer_text_tokens(model, text_max_length)


@functools.lru_cache(maxsize=256)
def _cached_split(model, recipe: str, resolution, path, backend, text_tokens=None) -> PrecisionSplit:
    return _split(model, recipe, resolution, path, backend, text_tokens)
