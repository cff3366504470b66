"""Low-precision copies of a policy: build once, re-quantize after every optimizer step.

Sol-RL explores with an NVFP4 copy of the current policy and trains the full-precision policy;
after each update the copy is re-quantized from the new weights (the paper's ~2% overhead).
`quantized_copy` builds the copy (a deep copy whose selected nn.Linear layers run in the recipe's
precision), `sync_weights` refreshes it in place from the policy, and `quantization_summary`
says which layer ended up in which precision and why.

The policy may carry peft LoRA adapters (a `PeftModel`, or adapters injected into the model):
the copy is always a plain model under the base names, and its weights are W + scale * B @ A
computed on the side, so the policy itself is never merged or otherwise modified.
"""

from __future__ import annotations

import copy as copy_module
import io
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Union

import torch
import torch.nn as nn

from . import registry
from .layers import _SharedInputQuantization, make_quantized_layer
from .recipes import QuantRecipe, get_recipe

__all__ = [
    "LayerQuantization",
    "quantized_copy",
    "sync_weights",
    "quantization_summary",
    "format_quantization_summary",
    "low_precision_mac_share",
    "MacShare",
]

_COPY_INFO_ATTR = "_solbench_quantization"


@dataclass(frozen=True)
class LayerQuantization:
    """One row of `quantization_summary`: a Linear layer of the copy and its precision."""

    name: str
    in_features: int
    out_features: int
    quantized: bool
    reason: str  # the precision label if quantized, else why it was skipped


@dataclass
class _CopyInfo:
    recipe: QuantRecipe
    layers: List[LayerQuantization]
    backend: str = ""


# --------------------------------------------------------------------------------------------
# peft support (optional dependency)
# --------------------------------------------------------------------------------------------


def _peft_classes():
    try:
        from peft import PeftModel
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # peft is optional: without it no model can carry adapters
        return None, None
    return PeftModel, BaseTunerLayer


def _policy_root(model: nn.Module) -> nn.Module:
    """The module whose parameter names are the base names (unwraps a peft PeftModel)."""
    peft_model_cls, _ = _peft_classes()
    if peft_model_cls is not None and isinstance(model, peft_model_cls):
        return model.get_base_model()
    return model


def _tuner_layers(root: nn.Module) -> Dict[str, nn.Module]:
    _, tuner_cls = _peft_classes()
    if tuner_cls is None:
        return {}
    return {name: m for name, m in root.named_modules() if isinstance(m, tuner_cls)}


@torch.no_grad()
def _merged_adapter_weight(name: str, layer: nn.Module) -> torch.Tensor:
    """The weight a peft LoRA layer effectively applies, W + sum(scale * B @ A), as a new tensor.

    Mirrors peft's own merge (base weight += delta, adapter by adapter in active order) without
    touching the layer.
    """
    if not (hasattr(layer, "lora_A") and hasattr(layer, "get_delta_weight")):
        raise NotImplementedError(
            f"{name}: peft layer type {type(layer).__name__} is not supported; only LoRA adapters can be merged"
        )
    weight = layer.get_base_layer().weight
    merged = weight.detach().clone()
    already_merged = list(getattr(layer, "merged_adapters", []))
    if getattr(layer, "disable_adapters", False):
        adapters, sign = already_merged, -1.0  # peft unmerges these before a disabled forward
    else:
        adapters, sign = [a for a in layer.active_adapters if a not in already_merged], 1.0
    for adapter in adapters:
        if adapter not in layer.lora_A:
            continue
        if getattr(layer, "use_dora", {}).get(adapter, False):
            raise NotImplementedError(f"{name}: DoRA adapters ({adapter!r}) are not supported")
        if getattr(layer, "lora_bias", {}).get(adapter, False):
            raise NotImplementedError(f"{name}: LoRA adapters with lora_bias ({adapter!r}) are not supported")
        delta = layer.get_delta_weight(adapter)
        if sign > 0:
            merged += delta
        else:
            merged -= delta
    return merged


def _effective_tensors(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Every parameter and buffer the policy computes with, under base names, LoRA merged.

    Unadapted tensors are returned as they are (no copy); only adapted weights are new tensors.
    """
    root = _policy_root(model)
    tuners = _tuner_layers(root)
    prefixes = sorted(tuners, key=len, reverse=True)
    tensors: Dict[str, torch.Tensor] = {}
    for name, tensor in list(root.named_parameters()) + list(root.named_buffers()):
        mapped = _base_name(name, prefixes)
        if mapped is not None:
            tensors[mapped] = tensor
    for name, layer in tuners.items():
        tensors[_join(name, "weight")] = _merged_adapter_weight(name, layer)
    return tensors


def _base_name(name: str, tuner_prefixes: List[str]) -> Optional[str]:
    """Map a name inside a peft layer to the plain layer's name; None for adapter tensors."""
    for prefix in tuner_prefixes:
        if prefix == "" or name.startswith(prefix + "."):
            rest = name[len(prefix) + 1 :] if prefix else name
            if rest.startswith("base_layer."):
                return _join(prefix, rest[len("base_layer.") :])
            return None  # lora_A / lora_B / dropout ... belong to the adapter
    return name


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


def _strip_adapters(policy_root: nn.Module, copy_root: nn.Module, skip: Iterable[str] = ()) -> None:
    """Replace every peft layer in the copy by its base layer holding the merged weight (the layers
    named in ``skip`` keep their weight as it is: quantized_copy replaces them from the policy)."""
    skip = set(skip)
    for name, layer in _tuner_layers(policy_root).items():
        copied = copy_root.get_submodule(name)
        base = copied.get_base_layer()
        if name not in skip:
            with torch.no_grad():
                base.weight.copy_(_merged_adapter_weight(name, layer))
        if name:
            _set_submodule(copy_root, name, base)
        else:
            raise NotImplementedError("a peft layer at the root of the model is not supported")
    # diffusers/transformers models record their adapters on the model; the copy has none.
    for attribute in ("peft_config",):
        copy_root.__dict__.pop(attribute, None)
    if getattr(copy_root, "_hf_peft_config_loaded", False):
        copy_root._hf_peft_config_loaded = False


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def quantized_copy(
    model: nn.Module,
    recipe: Union[str, QuantRecipe],
    *,
    backend: Optional[str] = None,
    share_input_quantization: bool = True,
    share_frozen: bool = True,
) -> nn.Module:
    """A deep copy of `model` whose nn.Linear layers run in `recipe`'s precision on `backend`'s kernels.

    Args:
        model: the policy: any nn.Module, possibly a peft `PeftModel` or a model with LoRA
            adapters injected. It is not modified.
        recipe: a `QuantRecipe` or a name from `RECIPES` ("nvfp4_flux", "nvfp4_tiny", ...).
        backend: a registered backend's name (solbench.quant.registry; None: the fallback, emulation). One that
            cannot run the recipe here raises BackendUnavailableError saying why (decided once per process).
        share_input_quantization: backends whose layers share it (``Backend.shares_inputs``: emulated,
            cpu_bf16 and torch's scaled matmul). Layers fed the very same activation
            tensor (q/k/v projections) quantize it once; results are bit-identical. Turn off
            under torch.compile, which cannot trace the identity check.
        share_frozen: the copy reuses (does not copy) the frozen parameters of layers it keeps in
            full precision and that carry no LoRA adapter (embedders, norms, skipped Linears), as
            they are equal in both models. This saves their memory on real models; the price is
            that moving the copy to another device or dtype moves those parameters of `model` too.

    Returns:
        The copy, in eval mode with requires_grad False everywhere, under the base model's names
        (no peft wrapper, adapters merged). Layers not selected by the recipe stay plain
        nn.Linear in the original dtype. Refresh it after optimizer steps with `sync_weights`.
    """
    root = _policy_root(model)
    recipe = recipe_for_model(recipe, root)
    kernels = registry.get_backend(backend) if backend is not None else registry.fallback()
    # fail at once, even if the recipe ends up quantizing no layer
    registry.require(kernels.name, recipe, next((p.device for p in root.parameters()), None))
    tuners = _tuner_layers(root)
    # The Linears the copy quantizes, by their base name, with the full-precision module that holds
    # their weight in the policy (a peft layer's base_layer). Their weights are never deep-copied:
    # the copy gets a meta-device stand-in and the quantized layer is built from the policy's weight
    # (or, for an adapted layer, from W + scale * B @ A formed for that one layer and dropped after).
    # Copying them first cost a full-precision transformer's worth of transient memory (+23 GB on FLUX).
    quantized = {name: linear for name, linear in _base_linears(root, tuners).items() if quantizes(recipe, name, linear, kernels.name)}
    memo = {id(p): p for p in _shareable_parameters(root, recipe, kernels.name)} if share_frozen else {}
    for linear in quantized.values():
        memo[id(linear.weight)] = nn.Parameter(torch.empty_like(linear.weight, device="meta"), requires_grad=False)
    copied = copy_module.deepcopy(root, memo)
    _strip_adapters(root, copied, skip=set(quantized))
    for parameter in copied.parameters():
        parameter.grad = None
    copied.requires_grad_(False)
    shared = _SharedInputQuantization() if share_input_quantization and kernels.shares_inputs else None

    rows: List[LayerQuantization] = []
    for name, module in list(copied.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        reason = recipe.skip_reason(name, module)
        if reason is None and name not in quantized:
            reason = f"backend {kernels.name} needs in/out features divisible by {kernels.feature_multiple}"
        if reason is None:
            weight = _merged_adapter_weight(name, tuners[name]) if name in tuners else quantized[name].weight
            layer = make_quantized_layer(module, recipe, kernels.name, name=name, shared_inputs=shared,
                                         weight=weight.detach(), bias=quantized[name].bias)
            _set_submodule(copied, name, layer)
            del weight
        rows.append(
            LayerQuantization(name, module.in_features, module.out_features, reason is None, reason or recipe.label)
        )
    copied.eval()
    object.__setattr__(copied, _COPY_INFO_ATTR, _CopyInfo(recipe, rows, kernels.name))
    return copied


def _base_linears(root: nn.Module, tuners: Dict[str, nn.Module]) -> Dict[str, nn.Linear]:
    """Every nn.Linear the policy computes with, under its base name (a peft layer's base_layer
    under the peft layer's name), mapped to the module holding its full-precision weight."""
    found: Dict[str, nn.Linear] = {}
    for name, module in root.named_modules():
        if name in tuners:
            base = module.get_base_layer()
            if isinstance(base, nn.Linear):
                found[name] = base
        elif isinstance(module, nn.Linear) and not any(name.startswith(t + ".") for t in tuners if t):
            found[name] = module
    return found


def model_width(config) -> int:
    """The hidden size of a diffusers transformer (FLUX, SD3, SANA, the tiny model) from its config
    (a dict or the model's ``config``): attention heads x head dim."""
    get = config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))
    heads, head_dim = get("num_attention_heads"), get("attention_head_dim")
    if not (isinstance(heads, int) and isinstance(head_dim, int)):
        raise ValueError("the model's config names no num_attention_heads and attention_head_dim, so its width "
                         f"is unknown (got {heads!r}, {head_dim!r})")
    return heads * head_dim


def recipe_for_config(recipe: Union[str, QuantRecipe], config) -> QuantRecipe:
    """`recipe` (a name or QuantRecipe) bound to the transformer whose config (a dict or the model's
    ``config``) is given: a size threshold given per width (`QuantRecipe.min_dim_per_width`) becomes the
    number of features at this model's width; any other recipe comes back as it is."""
    recipe = get_recipe(recipe)
    if recipe.min_dim_per_width is None:
        return recipe
    try:
        width = model_width(config)
    except ValueError as err:
        raise ValueError(f"recipe {recipe.name!r} sets its size threshold per model width: {err}") from None
    return recipe.for_width(width)


def recipe_for_model(recipe: Union[str, QuantRecipe], model: nn.Module) -> QuantRecipe:
    """`recipe_for_config` with the config of `model` (a transformer, peft-wrapped or not)."""
    return recipe_for_config(recipe, getattr(_policy_root(model), "config", None))


def quantizes(recipe: QuantRecipe, name: str, module, backend: Optional[str] = None) -> bool:
    """Whether `recipe` on `backend` (None: the fallback, emulation) replaces the nn.Linear `name` by a quantized
    layer: the one rule `quantized_copy` applies and the cost projections count with (solbench.models.shares): not
    skipped by the recipe, and in/out features a multiple of the backend's ``feature_multiple``. ``module`` needs
    only ``in_features`` and ``out_features``."""
    if recipe.skip_reason(name, module) is not None:
        return False
    multiple = (registry.get_backend(backend) if backend is not None else registry.fallback()).feature_multiple
    return not (module.in_features % multiple or module.out_features % multiple)


def _shareable_parameters(root: nn.Module, recipe: QuantRecipe, backend: str) -> List[nn.Parameter]:
    """Frozen parameters the copy can reuse: outside LoRA layers and outside quantized Linears."""
    tuner_prefixes = list(_tuner_layers(root))
    shareable = []
    for name, module in root.named_modules():
        if any(name == p or name.startswith(p + ".") for p in tuner_prefixes if p):
            continue  # the copy merges the adapter into this layer's weight
        if isinstance(module, nn.Linear) and quantizes(recipe, name, module, backend):
            continue
        shareable += [p for p in module.parameters(recurse=False) if not p.requires_grad]
    return shareable


@torch.no_grad()
def sync_weights(copy: nn.Module, model: nn.Module) -> None:
    """Re-quantize `copy` in place from the current weights of `model` (the policy).

    Every parameter and buffer of the copy is refreshed: quantized layers re-quantize from the
    policy's weight (LoRA merged on the side, the policy untouched), everything else is copied.
    The copy keeps its devices and dtypes. Raises if the two models do not line up by name and
    shape.
    """
    _copy_info(copy)
    tensors = _effective_tensors(model)

    def source(name: str) -> torch.Tensor:
        try:
            return tensors[name]
        except KeyError:
            raise ValueError(
                f"sync_weights: the policy has no parameter or buffer {name!r}, which the copy has; "
                "was the copy built from a different model?"
            ) from None

    inside_quantized_layers = set()  # ids of TELinear internals, refreshed by the layer itself
    quantized_types = registry.layer_types()
    for name, module in copy.named_modules():
        if id(module) in inside_quantized_layers:
            continue
        if isinstance(module, quantized_types):
            inside_quantized_layers.update(id(m) for m in module.modules() if m is not module)
            bias = source(_join(name, "bias")) if module.bias is not None else None
            module.load_weight(source(_join(name, "weight")), bias)
            continue
        for local, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            full = _join(name, local)
            src = source(full)
            if src.shape != tensor.shape:
                raise ValueError(
                    f"sync_weights: {full!r} has shape {tuple(src.shape)} in the policy but {tuple(tensor.shape)} in the copy"
                )
            if tensor is not src:  # parameters shared with the policy are current already
                tensor.copy_(src)


def quantization_summary(copy: nn.Module, *, print_table: bool = False, file=None) -> List[LayerQuantization]:
    """One row per nn.Linear of the original model: its name, size, and precision or skip reason.

    With print_table=True the rows are also printed as a table (to `file`, default stdout).
    """
    rows = list(_copy_info(copy).layers)
    if print_table:
        print(format_quantization_summary(rows, recipe=_copy_info(copy).recipe), file=file)
    return rows


@dataclass(frozen=True)
class MacShare:
    """Multiply-accumulates of a copy's Linear layers over one forward, and the share run in low precision."""

    quantized_macs: int
    total_macs: int
    quantized_layers: int
    layers: int

    @property
    def share(self) -> float:
        return self.quantized_macs / self.total_macs if self.total_macs else 0.0


def low_precision_mac_share(copy: nn.Module, forward) -> MacShare:
    """The share of the Linear MACs the quantized `copy` runs in low precision, over one call of `forward()`.

    `forward` runs the copy once (e.g. a velocity at batch 1); every Linear of the original model
    (the rows of `quantization_summary`) counts in_features x out_features per input row it sees, so
    layers on image tokens, text tokens or one pooled vector weigh by the rows they really process.
    """
    rows = {row.name: row for row in quantization_summary(copy)}
    macs = {name: 0 for name in rows}
    handles = []
    for name, module in copy.named_modules():
        if name in rows:
            row = rows[name]

            def count(module, args, name=name, row=row):
                macs[name] += args[0].numel() // row.in_features * row.in_features * row.out_features

            handles.append(module.register_forward_pre_hook(count))
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return MacShare(sum(macs[n] for n, r in rows.items() if r.quantized), sum(macs.values()),
                    sum(r.quantized for r in rows.values()), len(rows))


def format_quantization_summary(rows: Iterable[LayerQuantization], recipe: Optional[QuantRecipe] = None) -> str:
    """Render summary rows as a fixed-width text table with a totals line."""
    rows = list(rows)
    headers = ("layer", "in", "out", "status", "precision / reason")
    table = [(r.name, str(r.in_features), str(r.out_features), "quantized" if r.quantized else "skipped", r.reason) for r in rows]
    widths = [max([len(h)] + [len(t[i]) for t in table]) for i, h in enumerate(headers)]
    out = io.StringIO()
    if recipe is not None:
        out.write(f"recipe {recipe.name}: {recipe.description or recipe.label}\n")
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out.write(line + "\n" + "-" * len(line) + "\n")
    for t in table:
        out.write("  ".join(c.rjust(w) if i in (1, 2) else c.ljust(w) for i, (c, w) in enumerate(zip(t, widths))) + "\n")
    n_quantized = sum(r.quantized for r in rows)
    params = sum(r.in_features * r.out_features for r in rows)
    quantized_params = sum(r.in_features * r.out_features for r in rows if r.quantized)
    share = 100.0 * quantized_params / params if params else 0.0
    out.write(f"{n_quantized} of {len(rows)} Linear layers quantized ({share:.1f}% of Linear weights)")
    return out.getvalue()


def _copy_info(copy: nn.Module) -> _CopyInfo:
    info = getattr(copy, _COPY_INFO_ATTR, None)
    if info is None:
        raise TypeError(
            f"{type(copy).__name__} is not a quantized copy: build it with solbench.quant.quantized_copy(model, recipe)"
        )
    return info
