"""Quantization recipes: which Linear layers of a model run in which low precision.

A `QuantRecipe` names the number format, the weight block shape, whether activations are
quantized too (W4A4, the Sol-RL setting) or only weights, which layers stay in full precision
(name patterns and a size threshold). Which kernels run the quantized layers is not the recipe's: that is the
backend, given beside it (solbench.quant.registry; ``quantized_copy(model, recipe, backend=...)``).
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

from .formats import FORMATS, _check_e5m2_block, _check_fp8_block, _check_mxfp4_block, _check_nvfp4_block

__all__ = ["QuantRecipe", "RECIPES", "NO_RECIPE", "get_recipe", "UnknownRecipeError"]


class UnknownRecipeError(KeyError):
    """`get_recipe` was given a name that is not in `RECIPES`."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0])


# Activation blocks are fixed by the format: TE quantizes activations in 1x16 blocks for NVFP4,
# the MX spec uses 1x32, and FP8 current scaling uses one scale per tensor.
_ACTIVATION_BLOCK = {"nvfp4": (1, 16), "mxfp4": (1, 32), "fp8": None, "fp8_e5m2": None}
_DEFAULT_WEIGHT_BLOCK = {"nvfp4": (16, 16), "mxfp4": (1, 32), "fp8": None, "fp8_e5m2": None}


@dataclass(frozen=True)
class QuantRecipe:
    """How to build a low-precision copy of a model (see `quantized_copy`).

    Attributes:
        name: label used in reports and summaries.
        format: element format of quantized layers: "nvfp4", "mxfp4", "fp8" (E4M3) or "fp8_e5m2"
            (per-tensor E5M2: what TE's DelayedScaling(fp8_format=Format.E2M1) runs, see RECIPES).
        weight_block: block shape for weights. nvfp4: (16, 16) (TE's default for weights) or
            (1, 16); mxfp4: (1, 32); fp8: None (per-tensor) or "channel" (per output channel).
            Left as None for nvfp4/mxfp4 it becomes the format's default.
        activations: True quantizes each Linear's input on every forward too (W4A4 / W8A8, what
            Sol-RL runs), False quantizes weights only (W4A16).
        skip: module-name patterns kept in full precision. A pattern is a shell glob
            (fnmatch, case-sensitive) matched against the layer's qualified name and against
            each of its ancestors' names, so "time_text_embed" skips every Linear inside that
            module; prefix "re:" for a regular expression (re.fullmatch on the same names).
        min_dim: a Linear whose in_features and out_features are both <= min_dim stays in full
            precision (0: no size rule). This is the reference's rule, `max(in, out) <= min_dim`
            in Sana's train_scripts/train_utils.py::replace_linear_with_te, which Sol-RL's FLUX.1,
            SD3 and SANA scripts all call.
        min_dim_exempt: patterns (as in `skip`) of layers the size rule does not apply to: layers
            that the reference model fuses into one Linear above min_dim and diffusers splits
            into smaller ones (SANA's cross-attention kv_linear, 2240 -> 4480, is diffusers'
            attn2.to_k and attn2.to_v, 2240 -> 2240 each).
        min_dim_per_width: the size threshold as a share of the model's width (its hidden size,
            attention heads x head dim) instead of a number of features, for a rule scaled across
            models of several widths (the embedded tiny model's recipes: SANA's threshold is its
            width, share 1.0; FLUX's is 1000 of 3072). `for_width` turns it into min_dim =
            round(share x width); `quantized_copy` and the FLOP split do so with the model's width.
            None (the default): min_dim is the threshold as written. Not both.
        nonfinite: what the quantizer does with NaN/inf in weights or activations: "error"
            (default: raise, naming the layer) or "propagate" (the affected blocks become NaN).
        rowwise: fp8 only: activations scaled per row (one scale per token) instead of per tensor.
            With weight_block "channel" (one scale per output channel) this is torchao's float8
            rowwise recipe, which backend torch runs as one scaled GEMM (scale_a [M, 1], scale_b
            [1, N]); a per-row scale can be computed by the kernel that produces the input.
        description: one line for humans.
    """

    name: str = "custom"
    format: str = "nvfp4"
    weight_block: Union[Tuple[int, int], str, None] = None
    activations: bool = True
    skip: Tuple[str, ...] = ()
    min_dim: int = 0
    min_dim_exempt: Tuple[str, ...] = ()
    min_dim_per_width: Optional[float] = None
    nonfinite: str = "error"
    rowwise: bool = False
    description: str = ""
    _compiled_skip: Tuple = field(default=(), init=False, repr=False, compare=False)
    _compiled_exempt: Tuple = field(default=(), init=False, repr=False, compare=False)

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
            elif self.format == "fp8_e5m2":
                _check_e5m2_block(block)
            else:
                _check_fp8_block(block)
        except ValueError as exc:
            raise ValueError(f"{where}: weight_block: {exc}") from None
        object.__setattr__(self, "weight_block", block)
        if self.nonfinite not in ("error", "propagate"):
            raise ValueError(f"{where}: nonfinite must be 'error' or 'propagate', got {self.nonfinite!r}")
        if not isinstance(self.min_dim, int) or isinstance(self.min_dim, bool) or self.min_dim < 0:
            raise ValueError(f"{where}: min_dim must be a non-negative int, got {self.min_dim!r}")
        share = self.min_dim_per_width
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
                raise ValueError(f"{where}: min_dim_per_width must be a positive number or None, got {share!r}")
            if self.min_dim:
                raise ValueError(f"{where}: give the size threshold as min_dim ({self.min_dim}) or as "
                                 f"min_dim_per_width ({share}), not both")
        if not isinstance(self.activations, bool):
            raise TypeError(f"{where}: activations must be a bool, got {self.activations!r}")
        if not isinstance(self.rowwise, bool) or (self.rowwise and self.format != "fp8"):
            raise ValueError(f"{where}: rowwise (a scale per activation row) is a bool for format fp8 only, got "
                             f"{self.rowwise!r} with format {self.format!r}")
        skip = (self.skip,) if isinstance(self.skip, str) else tuple(self.skip)
        exempt = (self.min_dim_exempt,) if isinstance(self.min_dim_exempt, str) else tuple(self.min_dim_exempt)
        object.__setattr__(self, "skip", skip)
        object.__setattr__(self, "min_dim_exempt", exempt)
        object.__setattr__(self, "_compiled_skip", _compile_patterns(skip, f"{where}: skip"))
        object.__setattr__(self, "_compiled_exempt", _compile_patterns(exempt, f"{where}: min_dim_exempt"))

    @property
    def activation_block(self):
        """Block shape used for activations (fixed by the format; fp8 with ``rowwise``: "channel", a scale per row)."""
        return "channel" if self.rowwise else _ACTIVATION_BLOCK[self.format]

    @property
    def quantizes_nothing(self) -> bool:
        """Whether every Linear stays in full precision (a skip pattern "*": the recipe ``none``, whose copy is the
        source merged, in full precision)."""
        return "*" in self.skip

    @property
    def label(self) -> str:
        """Short precision label, e.g. 'nvfp4 W4A4 (weights 16x16)'."""
        if self.quantizes_nothing:
            return "full precision (no layer quantized)"
        bits = {"nvfp4": 4, "mxfp4": 4, "fp8": 8, "fp8_e5m2": 8}[self.format]
        acts = f"A{bits}" if self.activations else "A16"
        block = self.weight_block
        block_text = "per-tensor" if block is None else (block if isinstance(block, str) else f"{block[0]}x{block[1]}")
        rows = ", activations per row" if self.rowwise else ""
        return f"{self.format} W{bits}{acts} (weights {block_text}{rows})"

    def replace(self, **changes) -> "QuantRecipe":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def for_width(self, width: int) -> "QuantRecipe":
        """This recipe on a model of hidden size `width`: a threshold given per width made absolute
        (min_dim = round(min_dim_per_width x width)); a recipe with an absolute min_dim unchanged."""
        if self.min_dim_per_width is None:
            return self
        if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
            raise ValueError(f"QuantRecipe {self.name!r}: model width must be a positive int, got {width!r}")
        return self.replace(min_dim=int(round(self.min_dim_per_width * width)), min_dim_per_width=None)

    def matching_skip_pattern(self, name: str) -> Optional[str]:
        """The first skip pattern matching `name` or one of its ancestors, else None."""
        return _first_match(self._compiled_skip, name)

    def skip_reason(self, name: str, layer: nn.Module) -> Optional[str]:
        """Why the Linear `name` stays in full precision under this recipe, or None if it is quantized."""
        if self.min_dim_per_width is not None:
            raise ValueError(f"QuantRecipe {self.name!r} sets its size threshold per model width "
                             f"(min_dim_per_width {self.min_dim_per_width}): bind it to the model first, "
                             "recipe.for_width(width) or solbench.quant.recipe_for_model(recipe, model)")
        pattern = self.matching_skip_pattern(name)
        if pattern is not None:
            return f"matches skip pattern {pattern!r}"
        larger = max(layer.in_features, layer.out_features)
        if self.min_dim > 0 and larger <= self.min_dim and _first_match(self._compiled_exempt, name) is None:
            return f"in_features {layer.in_features} and out_features {layer.out_features} <= min_dim {self.min_dim}"
        return None


def _compile_patterns(patterns: Tuple[str, ...], where: str) -> Tuple:
    """(pattern, compiled regex or None for a shell glob) per pattern, checked."""
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{where} patterns must be non-empty strings, got {pattern!r}")
        if pattern.startswith("re:"):
            try:
                compiled.append((pattern, re.compile(pattern[3:])))
            except re.error as exc:
                raise ValueError(f"{where}: bad regular expression in pattern {pattern!r}: {exc}") from None
        else:
            compiled.append((pattern, None))
    return tuple(compiled)


def _first_match(compiled: Tuple, name: str) -> Optional[str]:
    """The first pattern matching `name` or one of its ancestors' names, else None."""
    parts = name.split(".")
    candidates = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    for pattern, regex in compiled:
        for candidate in candidates:
            if regex.fullmatch(candidate) if regex is not None else fnmatch.fnmatchcase(candidate, pattern):
                return pattern
    return None


# Sol-RL's recipes, as its scripts (Sana's train_scripts/sol_rl) build the NVFP4 explore copy:
# replace_linear_with_te keeps a Linear in BF16 when a skip name is a substring of its qualified
# name or when max(in_features, out_features) <= min_dim.
# FLUX.1 (train_flux1.py defaults): the embedders and the final norm by name, min_dim 1000.
_FLUX_SKIP = ("x_embedder", "context_embedder", "time_text_embed", "norm_out")
# SANA (configs/sol_rl/sana.py, native Sana module names) -> diffusers' SanaTransformer2DModel:
# t_embedder, t_block -> time_embed; y_embedder -> caption_projection; x_embedder -> patch_embed;
# final_layer -> norm_out, proj_out; the fused self-attention attn.qkv -> attn1.to_q/k/v
# (cfg_embedder and logvar_linear have no diffusers counterpart in SANA 1.6B). min_dim 2240, the
# model width, so every square 2240 x 2240 layer (attn.proj, cross_attn.q_linear, cross_attn.proj)
# stays in BF16 too; the fused cross_attn.kv_linear (2240 -> 4480) is quantized, and so are its
# diffusers halves attn2.to_k / to_v.
_SANA_SKIP = ("time_embed", "caption_projection", "patch_embed", "norm_out", "proj_out",
              "*.attn1.to_q", "*.attn1.to_k", "*.attn1.to_v")
# SD3 (configs/sol_rl/sd3.py nvfp4_skip_modules, diffusers' SD3Transformer2DModel names, as train_sd3.py
# loads it): replace_linear_with_te skips a layer when a skip name is a SUBSTRING of its qualified name,
# so "norm1" also skips every norm1_context, and "ff_context" the text stream's feed-forward; min_dim 2432,
# SD3.5-Large's width, so every square 2432 x 2432 attention projection stays in BF16 as well. What runs
# NVFP4: the image stream's feed-forward (ff.net.0.proj 2432 -> 9728, ff.net.2 9728 -> 2432).
_SD3_SKIP = tuple(f"*{name}*" for name in ("pos_embed", "context_embedder", "time_text_embed", "norm_out",
                                           "norm1", "ff_context"))
_SD3_DESCRIPTION = ("embedders, norm_out, every norm1/norm1_context modulation and the text-stream feed-forward "
                    "(substring skips), and layers with in and out features <= 2432, in BF16")

RECIPES: Dict[str, QuantRecipe] = {
    recipe.name: recipe
    for recipe in (
        QuantRecipe(
            name="nvfp4_flux",
            format="nvfp4",
            skip=_FLUX_SKIP,
            min_dim=1000,
            description="Sol-RL FLUX.1 recipe: NVFP4 W4A4, embedders and norm_out in BF16, "
                        "layers with in and out features <= 1000 in BF16",
        ),
        QuantRecipe(
            name="nvfp4_sana",
            format="nvfp4",
            skip=_SANA_SKIP,
            min_dim=2240,
            min_dim_exempt=("*.attn2.to_k", "*.attn2.to_v"),
            description="Sol-RL SANA recipe: NVFP4 W4A4, embedders, final layer and self-attention q/k/v in "
                        "BF16, layers with in and out features <= 2240 in BF16 (cross-attention k/v quantized)",
        ),
        QuantRecipe(
            name="nvfp4_sd3",
            format="nvfp4",
            skip=_SD3_SKIP,
            min_dim=2432,
            description="Sol-RL SD3.5 recipe (configs/sol_rl/sd3.py): NVFP4 W4A4; " + _SD3_DESCRIPTION,
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
            # The paper's rule scaled to the embedded tiny FLUX model: FLUX's name skips, and SANA's
            # size threshold, which is that model's width (min_dim 2240 on a 2240-wide model), at the
            # tiny model's width (min_dim_per_width 1.0: 128 on the shipped width-128 model, 256 on a
            # width-256 one): every Linear with in and out features <= the width (the attention
            # projections, q/k/v/out of both streams) stays in fp32. FLUX's own threshold
            # (1000 on a 3072-wide model) scales to 42 and would keep none. Measured
            # (docs/embedded-world.md, 33 held-out prompts x 16 seeds, shapes_geneval): the size rule
            # lifts NVFP4's rank correlation from 0.78 to 0.86 on the v1 weights; the shipped v2
            # reaches 0.92 with it. The proj_out layers (final and per single block) also stay in
            # full precision, as in the feasibility run, where quantizing x_embedder (raw pixel
            # patches) destroyed the ranking.
            skip=_FLUX_SKIP + ("proj_out", "*.proj_out"),
            min_dim_per_width=1.0,
            description="NVFP4 W4A4 for the embedded tiny FLUX model: embedders, norm_out, proj_out layers and "
                        "layers with in and out features <= the model's width (128 shipped: attention) in fp32",
        ),
        QuantRecipe(
            name="nvfp4_tiny_flux",
            format="nvfp4",
            # FLUX.1's rule (nvfp4_flux) scaled to the embedded tiny FLUX model: the same name skips
            # (the embedders and norm_out), and FLUX's size threshold in proportion to the width,
            # 1000 / 3072 of it (42 at the shipped width 128, 83 at 256). No Linear of the tiny model
            # is that small on both sides, so every block Linear and the final proj_out run NVFP4:
            # 41 of 48 Linears, as nvfp4_flux puts 495 of FLUX.1's 504 in NVFP4. The SANA analogue,
            # nvfp4_tiny, keeps the attention in fp32.
            skip=_FLUX_SKIP,
            min_dim_per_width=1000 / 3072,
            description="NVFP4 W4A4, FLUX.1's rule scaled to the embedded tiny FLUX model: embedders and norm_out "
                        "in fp32, layers with in and out features <= 1000/3072 of the width (none) in fp32; every "
                        "block Linear NVFP4",
        ),
    )
}


# What Sol-RL's PUBLIC CODE computes, beside the paper's NVFP4. Its train_utils.py runs the explore copy under
# te.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E2M1, amax_history_len=16, amax_compute_algo="max")).
# A DelayedScaling recipe quantizes through per-tensor Float8 quantizers, and TransformerEngine maps every
# fp8_format but E4M3 and HYBRID to FP8 E5M2 (transformer_engine/pytorch/quantization.py get_fp8_te_dtype,
# get_fp8_max): per-tensor E5M2 weights and activations, not NVFP4 (only NVFP4BlockScaling is NVFP4). These
# recipes keep each model's layer selection and run that format: on the te backend with that very recipe
# object, emulated with current per-tensor scaling (solbench.quant.fp8._fake_quantize_fp8_e5m2 says
# where delayed and current scaling differ). The nvfp4_* recipes above are the paper's NVFP4.
for _model, _base in (("flux", "nvfp4_flux"), ("sd3", "nvfp4_sd3"), ("sana", "nvfp4_sana")):
    RECIPES[f"te_delayed_e2m1_{_model}"] = RECIPES[_base].replace(
        name=f"te_delayed_e2m1_{_model}", format="fp8_e5m2", weight_block=None,
        description=f"what Sol-RL's public code runs on {_model} (TE DelayedScaling(Format.E2M1) = per-tensor FP8 "
                    f"E5M2 weights and activations) with {_base}'s layers; not the paper's NVFP4")


# FP8 with rowwise scales (issue 46): a scale per token for activations and per output channel for weights, the
# scaling torchao's float8 rowwise and flux-fast run on Hopper, with nvfp4_flux's layers. A per-row activation
# scale needs no global amax, so it can fuse into the kernel that produces the input (norm/modulation, GELU).
RECIPES["fp8_rowwise_flux"] = RECIPES["nvfp4_flux"].replace(
    name="fp8_rowwise_flux", format="fp8", weight_block="channel", rowwise=True,
    description="FP8 E4M3 W8A8 with rowwise scales (per token, per output channel) and nvfp4_flux's layers")


# MXFP4 at FLUX's coverage on the embedded tiny model (issue 48's dose-response: one format coarser than NVFP4 on the
# same layers): nvfp4_tiny_flux's layers in OCP MXFP4 (blocks of 32, power-of-two E8M0 scales) instead of NVFP4.
RECIPES["mxfp4_tiny_flux"] = RECIPES["nvfp4_tiny_flux"].replace(
    name="mxfp4_tiny_flux", format="mxfp4", weight_block=None,
    description="MXFP4 W4A4 on nvfp4_tiny_flux's layers (FLUX.1's rule scaled to the tiny model): every block Linear")


#: The explore recipe that quantizes nothing (issue 54): the explore copy is the rollout policy itself, merged, in full
#: precision. A Sol-RL run with it is the full-precision-preview twin: the same N, K, explore steps and selection, the
#: preview run at full precision, so Sol-RL against it is the copy's precision alone and the twin against naive BF16
#: scaling is the short preview and the regeneration of K of N. Its skip "*" keeps every Linear a plain nn.Linear
#: holding the merged weights (quantized_copy, refreshed by sync_weights as any copy). ``activations`` False makes every
#: low-precision backend decline it (no weight-only mode), so backend auto resolves to emulation, which is what a copy
#: without a quantized layer computes with on any machine (the run records backend emulated: nothing is emulated).
NO_RECIPE = "none"
RECIPES[NO_RECIPE] = QuantRecipe(
    name=NO_RECIPE, format="nvfp4", activations=False, skip=("*",),
    description="no layer quantized: the explore copy is the rollout policy merged, in full precision (Sol-RL's "
                "full-precision-preview twin; fidelity's step-budget control)")


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
