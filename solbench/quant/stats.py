"""Error statistics of low-precision tensors and layers (relative MSE, SNR in dB, per layer).

Reports use these to say how far a quantized copy drifts from the full-precision policy:
`error_stats` compares two tensors, `layer_error_report` hooks every quantized layer of a copy
and the matching layer of the reference model and compares their outputs on example inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn

from . import registry
from .model import _policy_root

__all__ = ["error_stats", "layer_error_report", "LayerError"]


def error_stats(x: torch.Tensor, x_hat: torch.Tensor) -> Dict[str, float]:
    """How well `x_hat` approximates `x` (computed in float64).

    Returns a dict with:
        rel_mse: sum((x_hat - x)^2) / sum(x^2); 0 if both are zero, inf if only x is.
        snr_db: -10 * log10(rel_mse) (inf for an exact match).
        max_abs_error, mean_abs_error: of x_hat - x.
        cosine: cosine similarity of the flattened tensors (1.0 if both are zero).
        numel: number of elements compared.
    """
    if x.shape != x_hat.shape:
        raise ValueError(f"error_stats: shapes differ: {tuple(x.shape)} vs {tuple(x_hat.shape)}")
    a = x.detach().reshape(-1).to(torch.float64)
    b = x_hat.detach().reshape(-1).to(torch.float64).to(a.device)
    diff = b - a
    signal = float(a.square().sum())
    noise = float(diff.square().sum())
    if noise == 0.0:
        rel_mse = 0.0
    elif signal == 0.0:
        rel_mse = math.inf
    else:
        rel_mse = noise / signal
    snr_db = math.inf if rel_mse == 0.0 else (-math.inf if math.isinf(rel_mse) else -10.0 * math.log10(rel_mse))
    norms = float(a.norm()) * float(b.norm())
    cosine = float(a.dot(b)) / norms if norms > 0 else (1.0 if signal == 0.0 and float(b.square().sum()) == 0.0 else 0.0)
    return {
        "rel_mse": rel_mse,
        "snr_db": snr_db,
        "max_abs_error": float(diff.abs().max()) if diff.numel() else 0.0,
        "mean_abs_error": float(diff.abs().mean()) if diff.numel() else 0.0,
        "cosine": cosine,
        "numel": int(a.numel()),
    }


@dataclass(frozen=True)
class LayerError:
    """Output error of one quantized layer against the reference model.

    in_model: the copy's layer output vs the reference layer output during full forward passes,
        so it includes error carried in from earlier quantized layers.
    isolated: the copy's layer applied to the reference layer's own input, so it is the error
        this layer's quantization adds by itself.
    """

    name: str
    in_model: Dict[str, float]
    isolated: Dict[str, float]


def _first_tensor(output: Any) -> torch.Tensor:
    """The main tensor of a module output (tensor, tuple/list, dict or a ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        values = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    elif hasattr(output, "to_tuple"):
        values = list(output.to_tuple())
    else:
        values = []
    for value in values:
        try:
            return _first_tensor(value)
        except TypeError:
            continue
    raise TypeError(f"cannot find a tensor in a module output of type {type(output).__name__}")


def _call(module: nn.Module, inputs: Union[Mapping[str, Any], Sequence[Any], torch.Tensor]):
    if isinstance(inputs, Mapping):
        return module(**inputs)
    if isinstance(inputs, torch.Tensor):
        return module(inputs)
    return module(*inputs)


@torch.no_grad()
def layer_error_report(
    model: nn.Module,
    copy: nn.Module,
    example_inputs: Union[Mapping[str, Any], Sequence[Any], torch.Tensor],
    *,
    layers: Optional[Sequence[str]] = None,
) -> List[LayerError]:
    """Per-layer output error of a quantized copy against its reference model.

    Args:
        model: the full-precision reference (may be a peft model; names are matched on the base).
        copy: a copy made by `quantized_copy` (from `model` or a model of the same architecture).
        example_inputs: keyword arguments (dict), positional arguments (tuple/list) or a tensor,
            passed to both models.
        layers: names to report (default: every quantized layer of the copy).

    Returns:
        One `LayerError` per layer, in the copy's module order, followed by one named "<output>"
        for the models' outputs (its `isolated` equals `in_model`).
    """
    reference_root = _policy_root(model)
    names = [n for n, m in copy.named_modules() if isinstance(m, registry.layer_types())]
    if layers is not None:
        unknown = sorted(set(layers) - set(names))
        if unknown:
            raise KeyError(f"layer_error_report: not quantized layers of the copy: {unknown}")
        names = [n for n in names if n in set(layers)]

    reference_inputs: Dict[str, torch.Tensor] = {}
    reference_outputs: Dict[str, torch.Tensor] = {}
    copy_outputs: Dict[str, torch.Tensor] = {}
    handles = []

    def capture_reference(name):
        def hook(module, args, output):
            reference_inputs[name] = args[0]
            reference_outputs[name] = _first_tensor(output)

        return hook

    def capture_copy(name):
        def hook(module, args, output):
            copy_outputs[name] = _first_tensor(output)

        return hook

    try:
        for name in names:
            try:
                reference_layer = reference_root.get_submodule(name)
            except AttributeError:
                raise KeyError(f"layer_error_report: the reference model has no module {name!r}") from None
            handles.append(reference_layer.register_forward_hook(capture_reference(name)))
            handles.append(copy.get_submodule(name).register_forward_hook(capture_copy(name)))
        reference_out = _first_tensor(_call(model, example_inputs))
        copy_out = _first_tensor(_call(copy, example_inputs))
    finally:
        for handle in handles:
            handle.remove()

    report = []
    for name in names:
        if name not in reference_outputs or name not in copy_outputs:
            continue  # the layer did not run on these inputs
        layer = copy.get_submodule(name)
        isolated = layer(reference_inputs[name])
        report.append(
            LayerError(
                name=name,
                in_model=error_stats(reference_outputs[name], copy_outputs[name]),
                isolated=error_stats(reference_outputs[name], isolated),
            )
        )
    output_error = error_stats(reference_out, copy_out)
    report.append(LayerError(name="<output>", in_model=output_error, isolated=output_error))
    return report
