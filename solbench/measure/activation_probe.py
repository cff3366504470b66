"""Measuring the activation profiles solbench.models.activations ships (published/activations.json).

solbench.models.activations describes what is measured (per block and sample: saved tensors, block inputs, the
no-grad peak, each linear in the tokens) and reads the shipped numbers; this module measures them: it builds a
model's transformer at the small width its card's ``probe`` gives (solbench.models.card.Probe) from its published
config, with fp32 LoRA adapters on the run's default targets (solbench.engine.policy.PolicyNets), counts the three
quantities with saved-tensor hooks, forward hooks and solbench.measure.peak.PeakMemory, and solves for the
per-token coefficients. ``python -m solbench.measure.activation_probe`` rewrites the shipped file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from solbench.models import card
from solbench.models.activations import PROBES, PROFILE_FILE, PUBLISHED, shipped_profiles
from solbench.models.card import Probe

__all__ = ["PROBE_IMAGE_TOKENS", "PROBE_TEXT_TOKENS", "measure", "write_profiles"]




PROBE_IMAGE_TOKENS = (16, 64)  # probe shapes: image tokens, text tokens (two of each)
PROBE_TEXT_TOKENS = (8, 24)


def _published(model: str) -> dict:
    return json.loads((PUBLISHED / f"{model}.json").read_text())


def _probe_transformer(model: str) -> tuple[nn.Module, dict]:
    import diffusers

    from solbench.config import FinetuneConfig
    from solbench.engine.policy import PolicyNets

    spec = _published(model)["components"]["transformer"]
    config = {**spec["config"], **card(model).probe.overrides}
    torch.manual_seed(0)
    transformer = getattr(diffusers, spec["class"]).from_config(config).to(torch.bfloat16)
    PolicyNets(transformer, FinetuneConfig(lora_rank=1, lora_alpha=2), set())  # fp32 LoRA on the default targets
    return transformer, config


def _inputs(model: str, config: dict, image_tokens: int, text_tokens: int) -> dict:
    probe = card(model).probe
    family = _published(model)["components"]["transformer"]["class"]  # the forward's kwargs are its class's
    side = probe.latent_side[image_tokens]
    bf16 = dict(dtype=torch.bfloat16)  # dtypes as the adapters pass them (solbench.models.*._forward)
    if family == "FluxTransformer2DModel":
        img_ids = torch.zeros(side // 2, side // 2, 3)
        img_ids[..., 1] = torch.arange(side // 2)[:, None]
        img_ids[..., 2] = torch.arange(side // 2)[None, :]
        return dict(hidden_states=torch.randn(1, image_tokens, config["in_channels"], **bf16),
                    encoder_hidden_states=torch.randn(1, text_tokens, config["joint_attention_dim"], **bf16),
                    pooled_projections=torch.randn(1, config["pooled_projection_dim"], **bf16),
                    timestep=torch.full((1,), 0.5, **bf16), guidance=torch.full((1,), 1.0),
                    img_ids=img_ids.reshape(-1, 3).to(torch.bfloat16), txt_ids=torch.zeros(text_tokens, 3, **bf16),
                    return_dict=False)
    if family == "SD3Transformer2DModel":
        return dict(hidden_states=torch.randn(1, config["in_channels"], side, side, **bf16),
                    encoder_hidden_states=torch.randn(1, text_tokens, config["joint_attention_dim"], **bf16),
                    pooled_projections=torch.randn(1, config["pooled_projection_dim"], **bf16),
                    timestep=torch.full((1,), 500.0, **bf16), return_dict=False)
    return dict(hidden_states=torch.randn(1, config["in_channels"], side, side, **bf16),
                encoder_hidden_states=torch.randn(1, text_tokens, config["caption_channels"], **bf16),
                timestep=torch.full((1,), 500.0), return_dict=False)


def _blocks(transformer: nn.Module) -> list[tuple[str, nn.Module]]:
    """The transformer's repeated blocks: the members of its ModuleLists of one class, in order."""
    found = []
    for list_name, child in transformer.named_children():
        if isinstance(child, nn.ModuleList) and len({type(m) for m in child}) == 1:
            found += [(f"{type(m).__name__}[{list_name}.{i}]", m) for i, m in enumerate(child)]
    return found


def _count(transformer: nn.Module, kwargs: dict) -> dict[str, dict[str, int]]:
    """Per block instance: saved-tensor bytes (grad enabled), new-input bytes and no-grad peak bytes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from solbench.measure.peak import PeakMemory

    blocks = _blocks(transformer)
    params = {p.untyped_storage()._cdata for p in transformer.parameters()}
    out = {name: {"saved": 0, "inputs": 0, "peak": 0} for name, _ in blocks}
    seen_saved, seen_inputs = set(), set(params)
    # Storages are told apart by their StorageImpl's address, which the allocator hands to a new storage
    # once the old one is freed: a block's input freed before a later block's new input was allocated made
    # that input look "seen" and went uncounted, depending on the machine's allocator (a FLUX profile of
    # inputs [1.5, 2.5, -44.0] instead of [1.0, 1.0, 0.0] on CI). Every storage counted is kept alive here
    # until the count is done, so no address is reused.
    alive: list = []
    current: list[str] = []

    def pack(t):
        storage = t.untyped_storage()
        key = storage._cdata
        if current and key not in params and key not in seen_saved:
            seen_saved.add(key)
            alive.append(storage)
            out[current[-1]]["saved"] += storage.nbytes()
        return t

    handles = []
    for name, block in blocks:
        def pre(module, args, kw, name=name):
            current.append(name)
            for t in list(args) + list(kw.values()):
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in seen_inputs:
                    seen_inputs.add(t.untyped_storage()._cdata)
                    alive.append(t.untyped_storage())
                    out[name]["inputs"] += t.untyped_storage().nbytes()

        def post(module, args, kw, result):
            current.pop()

        handles += [block.register_forward_pre_hook(pre, with_kwargs=True),
                    block.register_forward_hook(post, with_kwargs=True)]
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                transformer(**kwargs)
            alive.clear()
            for h in handles:
                h.remove()
            for name, block in blocks:  # the no-grad peak, one block at a time
                peaks = {}

                def start(module, args, kw, name=name):
                    peaks[name] = PeakMemory("cpu").__enter__()

                def stop(module, args, kw, result, name=name):
                    meter = peaks[name]
                    meter.__exit__(None, None, None)
                    out[name]["peak"] = max(out[name]["peak"], meter.bytes)

                hooks = [block.register_forward_pre_hook(start, with_kwargs=True),
                         block.register_forward_hook(stop, with_kwargs=True)]
                with torch.no_grad():
                    transformer(**kwargs)
                for h in hooks:
                    h.remove()
    finally:
        for h in handles:
            h.remove()
    return out


def _solve(points: dict[tuple[int, int], float], width: int) -> list[float]:
    """(a, b, c) of bytes = 2 * width * (a L + b T + c) through the probe's three points."""
    (l1, l2), (t1, t2) = PROBE_IMAGE_TOKENS, PROBE_TEXT_TOKENS
    base = points[(l1, t1)]
    a = (points[(l2, t1)] - base) / (l2 - l1)
    b = (points[(l1, t2)] - base) / (t2 - t1)
    c = base - a * l1 - b * t1
    return [round(v / (2 * width), 4) for v in (a, b, c)]


def measure(model: str) -> dict:
    """Measure ``model``'s block profile now (CPU, seconds): the entry PROFILES ships for it."""
    probe = card(model).probe
    transformer, config = _probe_transformer(model)
    (l1, l2), (t1, t2) = PROBE_IMAGE_TOKENS, PROBE_TEXT_TOKENS
    shapes = [(l1, t1), (l2, t1), (l1, t2)]
    counts = {}
    for shape in shapes:
        torch.manual_seed(1)
        counts[shape] = _count(transformer, _inputs(model, config, *shape))
    published = _published(model)["components"]["transformer"]["config"]
    heads = published.get("num_attention_heads") * published.get("attention_head_dim")
    kinds: dict[str, list[str]] = {}
    for name in counts[shapes[0]]:
        kinds.setdefault(_kind(probe, name, len(counts[shapes[0]])), []).append(name)
    blocks = []
    for kind, names in kinds.items():
        # the last instance of a kind: its inputs are the new ones every such block gets (the first
        # block also sees what all blocks share, rotary tables or SANA's projected caption: a few MB)
        name = names[-1]
        blocks.append({"name": kind, "count": probe.block_count(kind, published),
                       **{q: _solve({s: counts[s][name][q] for s in shapes}, probe.width)
                          for q in ("saved", "inputs", "peak")}})
    return {"width": heads, "blocks": blocks}


def _kind(probe: Probe, instance: str, n_blocks: int) -> str:
    """The block kind of a probe block instance (a distinct last block, SD3's context-pre-only one, gets the
    probe's ``last_block_suffix``)."""
    kind = instance.split("[")[0]
    if probe.last_block_suffix and instance.endswith(f".{n_blocks - 1}]"):
        return kind + probe.last_block_suffix
    return kind


def write_profiles(models=None, path: Path = PROFILE_FILE) -> dict:
    """Measure ``models`` (default: every model whose card has a probe) and write the shipped profile file
    (python -m solbench.measure.activation_probe)."""
    import diffusers

    models = tuple(PROBES) if models is None else tuple(models)
    data = {"about": "bf16 widths per token of one block per sample: bytes = 2 * width * (a * image_tokens + "
                     "b * text_tokens + c); measured by solbench.measure.activation_probe.measure (see "
                     "solbench.models.activations)",
            "diffusers": diffusers.__version__, "torch": torch.__version__,
            "models": {m: measure(m) for m in models}}
    path.write_text(json.dumps(data, indent=1) + "\n")
    shipped_profiles.cache_clear()
    return data


if __name__ == "__main__":
    print(json.dumps(write_profiles(), indent=1))
