"""Quantization recipes: which Linear layers of a model run in which low precision.

A `QuantRecipe` names the number format, the weight block shape, whether activations are
quantized too (W4A4, the Sol-RL setting) or only weights, which layers stay in full precision
(name patterns and a minimum feature size) and the backend that runs the quantized layers.
`RECIPES` holds the named recipes; `get_recipe` looks one up (with a "did you mean" on typos).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

import torch.nn as nn

from .formats import FORMATS, _check_fp8_block, _check_mxfp4_block, _check_nvfp4_block

__all__ = ["QuantRecipe", "RECIPES", "get_recipe", "BACKENDS", "UnknownRecipeError"]


class UnknownRecipeError(KeyError):
    """`get_recipe` was given a name that is not in `RECIPES`."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0])


BACKENDS = ("emulated", "te")

# Activation blocks are fixed by the format: TE quantizes activations in 1x16 blocks for NVFP4,
# the MX spec uses 1x32, and FP8 current scaling uses one scale per tensor.
_ACTIVATION_BLOCK = {"nvfp4": (1, 16), "mxfp4": (1, 32), "fp8": None}
_DEFAULT_WEIGHT_BLOCK = {"nvfp4": (16, 16), "mxfp4": (1, 32), "fp8": None}


@dataclass(frozen=True)
class QuantRecipe:
    """How to build a low-precision copy of a model (see `quantized_copy`).

    Attributes:
        name: label used in reports and summaries.
        format: element format of quantized layers: "nvfp4", "mxfp4" or "fp8" (E4M3).
        weight_block: block shape for weights. nvfp4: (16, 16) (TE's default for weights) or
            (1, 16); mxfp4: (1, 32); fp8: None (per-tensor) or "channel" (per output channel).
            Left as None for nvfp4/mxfp4 it becomes the format's default.
        activations: True quantizes each Linear's input on every forward too (W4A4 / W8A8, what
            Sol-RL runs), False quantizes weights only (W4A16).
        skip: module-name patterns kept in full precision. A pattern is a shell glob
            (fnmatch, case-sensitive) matched against the layer's qualified name and against
            each of its ancestors' names, so "time_text_embed" skips every Linear inside that
            module; prefix "re:" for a regular expression (re.fullmatch on the same names).
        min_features: a layer is quantized only if in_features and out_features are both >= this.
        backend: "emulated" (fake quantization in plain torch, runs anywhere) or "te"
            (TransformerEngine te.Linear on Blackwell (NVFP4) / Hopper+ (FP8) GPUs).
        nonfinite: what the quantizer does with NaN/inf in weights or activations: "error"
            (default: raise, naming the layer) or "propagate" (the affected blocks become NaN).
        description: one line for humans.
    """

    name: str = "custom"
    format: str = "nvfp4"
    weight_block: Union[Tuple[int, int], str, None] = None
    activations: bool = True
    skip: Tuple[str, ...] = ()
    min_features: int = 0
    backend: str = "emulated"
    nonfinite: str = "error"
    description: str = ""
    _compiled_skip: Tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"QuantRecipe {self.name!r}"
        if self.format not in FORMATS:
            raise ValueError(f"{where}: format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        block = self.weight_block
        if isinstance(block, list):
            block = tuple(block)
        if block is None:
            block = _DEFAULT_WEIGHT_BLOCK[self.format]
        try:
            if self.format == "nvfp4":
                _check_nvfp4_block(block)
            elif self.format == "mxfp4":
                _check_mxfp4_block(block)
            else:
                _check_fp8_block(block)
        except ValueError as exc:
            raise ValueError(f"{where}: weight_block: {exc}") from None
        object.__setattr__(self, "weight_block", block)
        if self.backend not in BACKENDS:
            raise ValueError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.nonfinite not in ("error", "propagate"):
            raise ValueError(f"{where}: nonfinite must be 'error' or 'propagate', got {self.nonfinite!r}")
        if not isinstance(self.min_features, int) or isinstance(self.min_features, bool) or self.min_features < 0:
            raise ValueError(f"{where}: min_features must be a non-negative int, got {self.min_features!r}")
        if not isinstance(self.activations, bool):
            raise TypeError(f"{where}: activations must be a bool, got {self.activations!r}")
        skip = (self.skip,) if isinstance(self.skip, str) else tuple(self.skip)
        compiled = []
        for pattern in skip:
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"{where}: skip patterns must be non-empty strings, got {pattern!r}")
            if pattern.startswith("re:"):
                try:
                    compiled.append((pattern, re.compile(pattern[3:])))
                except re.error as exc:
                    raise ValueError(f"{where}: bad regular expression in skip pattern {pattern!r}: {exc}") from None
            else:
                compiled.append((pattern, None))
        object.__setattr__(self, "skip", skip)
        object.__setattr__(self, "_compiled_skip", tuple(compiled))

    @property
    def activation_block(self):
        """Block shape used for activations (fixed by the format)."""
        return _ACTIVATION_BLOCK[self.format]

    @property
    def label(self) -> str:
        """Short precision label, e.g. 'nvfp4 W4A4 (weights 16x16)'."""
        bits = {"nvfp4": 4, "mxfp4": 4, "fp8": 8}[self.format]
        acts = f"A{bits}" if self.activations else "A16"
        block = self.weight_block
        block_text = "per-tensor" if block is None else (block if isinstance(block, str) else f"{block[0]}x{block[1]}")
        return f"{self.format} W{bits}{acts} (weights {block_text})"

    def replace(self, **changes) -> "QuantRecipe":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def matching_skip_pattern(self, name: str) -> Optional[str]:
        """The first skip pattern matching `name` or one of its ancestors, else None."""
        parts = name.split(".")
        candidates = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        for pattern, regex in self._compiled_skip:
            for candidate in candidates:
                if regex is not None:
                    if regex.fullmatch(candidate):
                        return pattern
                elif fnmatch.fnmatchcase(candidate, pattern):
                    return pattern
        return None

    def skip_reason(self, name: str, layer: nn.Module) -> Optional[str]:
        """Why the Linear `layer` called `name` stays in full precision, or None to quantize it."""
        pattern = self.matching_skip_pattern(name)
        if pattern is not None:
            return f"matches skip pattern {pattern!r}"
        smaller = min(layer.in_features, layer.out_features)
        if smaller < self.min_features:
            return (
                f"{'in' if layer.in_features <= layer.out_features else 'out'}_features "
                f"{smaller} < min_features {self.min_features}"
            )
        return None


# Sol-RL's FLUX recipe: the public code swaps nn.Linear for te.Linear except the embedders and
# the final norm, and layers under 1000 features.
_FLUX_SKIP = ("x_embedder", "context_embedder", "time_text_embed", "norm_out")

RECIPES: Dict[str, QuantRecipe] = {
    recipe.name: recipe
    for recipe in (
        QuantRecipe(
            name="nvfp4_flux",
            format="nvfp4",
            skip=_FLUX_SKIP,
            min_features=1000,
            description="Sol-RL FLUX.1 recipe: NVFP4 W4A4, embedders and norm_out in BF16, layers < 1000 features skipped",
        ),
        QuantRecipe(
            name="nvfp4_sana",
            format="nvfp4",
            # Sana's own code skips the fused self-attention `attn.qkv`; diffusers'
            # SanaTransformer2DModel splits it into attn1.to_q / to_k / to_v.
            skip=("*.attn1.to_q", "*.attn1.to_k", "*.attn1.to_v"),
            min_features=2240,
            description="Sol-RL SANA recipe: NVFP4 W4A4, self-attention q/k/v in BF16, layers < 2240 features skipped",
        ),
        QuantRecipe(
            name="nvfp4_w4a4",
            format="nvfp4",
            description="NVFP4 weights (16x16) and activations (1x16) on every Linear",
        ),
        QuantRecipe(
            name="nvfp4_w4a16",
            format="nvfp4",
            activations=False,
            description="NVFP4 weights only (16x16) on every Linear; activations stay in full precision",
        ),
        QuantRecipe(
            name="mxfp4_w4a4",
            format="mxfp4",
            description="MXFP4 (OCP MX) weights and activations, 32-element blocks, on every Linear",
        ),
        QuantRecipe(
            name="fp8_w8a8",
            format="fp8",
            description="FP8 E4M3 weights and activations with per-tensor current scaling on every Linear",
        ),
        QuantRecipe(
            name="nvfp4_tiny",
            format="nvfp4",
            # The embedded feasibility run: quantizing x_embedder (raw pixel patches) destroys the
            # FP4-vs-fp32 ranking fidelity; the proj_out layers (final and per single block) also
            # stay in full precision.
            skip=_FLUX_SKIP + ("proj_out", "*.proj_out"),
            min_features=0,
            description="NVFP4 W4A4 for the embedded tiny FLUX model: embedders, norm_out and proj_out layers in fp32",
        ),
    )
}


def get_recipe(recipe: Union[str, QuantRecipe]) -> QuantRecipe:
    """The named recipe from `RECIPES` (a `QuantRecipe` is returned unchanged)."""
    if isinstance(recipe, QuantRecipe):
        return recipe
    if not isinstance(recipe, str):
        raise TypeError(f"expected a recipe name or QuantRecipe, got {type(recipe).__name__}")
    try:
        return RECIPES[recipe]
    except KeyError:
        close = difflib.get_close_matches(recipe, RECIPES, n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownRecipeError(
            f"unknown quantization recipe {recipe!r}.{hint} Known recipes: {', '.join(sorted(RECIPES))}"
        ) from None
