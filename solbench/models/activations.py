"""Activation memory of the real transformers, measured on their own modules (solbench doctor's model).

What one transformer block holds per sample and forward, as it runs on a GPU:

- ``saved``: the tensors autograd keeps for the backward. Training without gradient checkpointing
  keeps every block's; with it, one block's at a time (recomputed) plus every block's inputs.
- ``inputs``: the new tensors a block is called with (what gradient checkpointing keeps per block;
  a tensor handed to several blocks, like SANA's projected caption, counts once).
- ``peak``: the most a block allocates at once in a no-grad forward (a rollout's working set).

Each is linear in the tokens a block sees, so ``measure(model)`` builds the model's transformer from
its published config (solbench/models/published/<model>.json) with fewer heads and layers but every
per-head width and ratio kept (head width, MLP ratio, rotary axes, text and caption widths scaled with
the model width), in bf16 on CPU with fp32 LoRA adapters on the run's default targets (as a run trains
them; peft runs them in fp32, saving an fp32 copy of each adapted layer's input), at two image-token
and two text-token counts. It counts saved tensors with torch.autograd.graph.saved_tensors_hooks
(each storage once, parameters excluded), block inputs with forward pre-hooks and the no-grad peak with
solbench.measure.peak.PeakMemory, attributed to blocks by forward hooks, and solves

    bytes = 2 * width * (a * image_tokens + b * text_tokens + c)        (per block, per sample)

for (a, b, c): "bf16 widths per token", which carry over to the published width. Attention runs
through torch's flash kernel (on CPU as on GPU, it keeps the log-sum-exp, not the score matrix).
``PROFILES`` holds the measured numbers shipped in published/activations.json; the doctor reads them
(``block_bytes``) and tests/test_activations.py measures them again. A new architecture (e.g. a
linear-FFN SANA variant) gets a profile by adding its published config and a ``PROBES`` entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from solbench.models import TEXT_MAX_LENGTH

__all__ = ["BlockProfile", "ModelProfile", "PROBES", "PROFILES", "TEXT_TOKENS", "transformer_text_tokens",
           "block_bytes", "measure",
           "per_sample_gb", "profile"]

PUBLISHED = Path(__file__).parent / "published"
PROFILE_FILE = PUBLISHED / "activations.json"
PROBE_IMAGE_TOKENS = (16, 64)  # probe shapes: image tokens, text tokens (two of each)
PROBE_TEXT_TOKENS = (8, 24)


def transformer_text_tokens(model: str, text_max_length: int | None = None) -> int:
    """Text tokens ``model``'s transformer attends to when prompts are encoded to ``text_max_length`` T5 /
    Gemma tokens (None: the adapter's default, solbench.models.TEXT_MAX_LENGTH, the reference scripts'):
    SD3's prompt embeddings put CLIP-L/G's 77 before T5's; FLUX and SANA attend to T5 / Gemma alone."""
    length = TEXT_MAX_LENGTH[model] if text_max_length is None else int(text_max_length)
    return 77 + length if model == "sd3" else length


# Text tokens a real model's transformer sees per sample at the adapters' default prompt length:
# FLUX's 128 T5 tokens, SD3's 77 CLIP + 128 T5, SANA's 300 Gemma tokens (cross-attention).
TEXT_TOKENS = {model: transformer_text_tokens(model) for model in TEXT_MAX_LENGTH}


@dataclass(frozen=True)
class Probe:
    """How to run a model's transformer at small width: config overrides that keep every per-head
    width and ratio, the probe's width, which forward it takes (flux, sd3 or sana: the transformer
    family; a variant such as a linear-FFN SANA reuses its family's) and the latent side per image-token
    count."""

    overrides: dict
    width: int
    inputs: str  # "flux" | "sd3" | "sana": the kwargs _inputs builds
    latent_side: dict  # image tokens -> latent side (height = width) of the probe's input


PROBES: dict[str, Probe] = {
    # 2 heads x 128 (rotary axes 16 + 56 + 56 kept); T5 / pooled CLIP inputs narrowed with the width
    "flux": Probe({"num_attention_heads": 2, "num_layers": 2, "num_single_layers": 2, "joint_attention_dim": 64,
                   "pooled_projection_dim": 64}, 256, "flux", {16: 8, 64: 16}),
    # 4 heads x 64; three blocks: two joint ones and the last, context-pre-only one (SD3.5-Large's 38th)
    "sd3": Probe({"num_attention_heads": 4, "num_layers": 3, "caption_projection_dim": 256, "joint_attention_dim": 64,
                  "pooled_projection_dim": 64, "pos_embed_max_size": 32}, 256, "sd3", {16: 8, 64: 16}),
    # 7 self-attention heads x 32, 2 cross-attention heads x 112 (width 224), MLP ratio 2.5 kept
    "sana": Probe({"num_attention_heads": 7, "num_cross_attention_heads": 2, "cross_attention_dim": 224,
                   "caption_channels": 64, "num_layers": 2}, 224, "sana", {16: 4, 64: 8}),
}


@dataclass(frozen=True)
class BlockProfile:
    """One kind of block: how many the published model has and its (a, b, c) per quantity."""

    name: str
    count: int
    saved: tuple[float, float, float]
    inputs: tuple[float, float, float]
    peak: tuple[float, float, float]


@dataclass(frozen=True)
class ModelProfile:
    model: str
    width: int  # the published model's width
    blocks: tuple[BlockProfile, ...]


def block_bytes(coeffs: tuple[float, float, float], width: int, image_tokens: int, text_tokens: int) -> float:
    """Bytes of one block's quantity per sample: 2 * width * (a L_img + b L_txt + c)."""
    a, b, c = coeffs
    return 2.0 * width * (a * image_tokens + b * text_tokens + c)


def per_sample_gb(model: str, image_tokens: int, text_tokens: int, *, training: bool,
                  checkpointing: bool = False) -> float:
    """GB of activations one sample's forward holds at its peak:

    - no-grad (rollouts): the largest block's input plus its peak working set;
    - training with gradient checkpointing: every block's inputs, plus the block being recomputed
      (its saved tensors) and the working set of its backward (its peak);
    - training without: every block's saved tensors plus the largest working set.
    """
    try:
        prof = PROFILES[model]
    except KeyError:
        from solbench.errors import ConfigError

        raise ConfigError(f"no measured activation profile for model {model!r} in {PROFILE_FILE}; add a PROBES "
                          "entry and run `python -m solbench.models.activations`") from None

    def each(quantity: str) -> list[tuple[int, float]]:
        return [(b.count, block_bytes(getattr(b, quantity), prof.width, image_tokens, text_tokens)) for b in prof.blocks]

    peak = max(v for _, v in each("peak"))
    if not training:
        total = max(v for _, v in each("inputs")) + peak
    elif checkpointing:
        total = sum(n * v for n, v in each("inputs")) + max(v for _, v in each("saved")) + peak
    else:
        total = sum(n * v for n, v in each("saved")) + peak
    return total / 1e9


# --------------------------------------------------------------------------------------------------
# The shipped profiles
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _shipped() -> dict:
    return json.loads(PROFILE_FILE.read_text()) if PROFILE_FILE.exists() else {}


def profile(model: str) -> ModelProfile | None:
    """The shipped profile of ``model`` (None when it has none: the doctor then says so)."""
    entry = _shipped().get("models", {}).get(model)
    if entry is None:
        return None
    return ModelProfile(model, int(entry["width"]), tuple(
        BlockProfile(b["name"], int(b["count"]), tuple(b["saved"]), tuple(b["inputs"]), tuple(b["peak"]))
        for b in entry["blocks"]))


class _Profiles(dict):
    def __missing__(self, model):
        found = profile(model)
        if found is None:
            raise KeyError(model)
        return found


PROFILES = _Profiles()


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------


def _published(model: str) -> dict:
    return json.loads((PUBLISHED / f"{model}.json").read_text())


def _probe_transformer(model: str) -> tuple[nn.Module, dict]:
    import diffusers

    from solbench.config import FinetuneConfig
    from solbench.engine.policy import PolicyNets

    spec = _published(model)["components"]["transformer"]
    config = {**spec["config"], **PROBES[model].overrides}
    torch.manual_seed(0)
    transformer = getattr(diffusers, spec["class"]).from_config(config).to(torch.bfloat16)
    PolicyNets(transformer, FinetuneConfig(lora_rank=1, lora_alpha=2), set())  # fp32 LoRA on the default targets
    return transformer, config


def _inputs(model: str, config: dict, image_tokens: int, text_tokens: int) -> dict:
    family = PROBES[model].inputs
    side = PROBES[model].latent_side[image_tokens]
    bf16 = dict(dtype=torch.bfloat16)  # dtypes as the adapters pass them (solbench.models.*._forward)
    if family == "flux":
        img_ids = torch.zeros(side // 2, side // 2, 3)
        img_ids[..., 1] = torch.arange(side // 2)[:, None]
        img_ids[..., 2] = torch.arange(side // 2)[None, :]
        return dict(hidden_states=torch.randn(1, image_tokens, config["in_channels"], **bf16),
                    encoder_hidden_states=torch.randn(1, text_tokens, config["joint_attention_dim"], **bf16),
                    pooled_projections=torch.randn(1, config["pooled_projection_dim"], **bf16),
                    timestep=torch.full((1,), 0.5, **bf16), guidance=torch.full((1,), 1.0),
                    img_ids=img_ids.reshape(-1, 3).to(torch.bfloat16), txt_ids=torch.zeros(text_tokens, 3, **bf16),
                    return_dict=False)
    if family == "sd3":
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
    probe = PROBES[model]
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
        kinds.setdefault(_kind(model, name, len(counts[shapes[0]])), []).append(name)
    blocks = []
    for kind, names in kinds.items():
        # the last instance of a kind: its inputs are the new ones every such block gets (the first
        # block also sees what all blocks share, rotary tables or SANA's projected caption: a few MB)
        name = names[-1]
        blocks.append({"name": kind, "count": _published_count(model, kind, published),
                       **{q: _solve({s: counts[s][name][q] for s in shapes}, probe.width)
                          for q in ("saved", "inputs", "peak")}})
    return {"width": heads, "blocks": blocks}


def _kind(model: str, instance: str, n_blocks: int) -> str:
    """The block kind of a probe block instance (SD3's last block is context-pre-only)."""
    kind = instance.split("[")[0]
    if model == "sd3" and instance.endswith(f".{n_blocks - 1}]"):
        return kind + "(context_pre_only)"
    return kind


def _published_count(model: str, kind: str, config: dict) -> int:
    if model == "flux":
        return config["num_single_layers"] if kind.startswith("FluxSingle") else config["num_layers"]
    if model == "sd3":
        return 1 if kind.endswith("(context_pre_only)") else config["num_layers"] - 1
    return config["num_layers"]


def write_profiles(models=tuple(PROBES), path: Path = PROFILE_FILE) -> dict:
    """Measure ``models`` and write the shipped profile file (python -m solbench.models.activations)."""
    import diffusers

    data = {"about": "bf16 widths per token of one block per sample: bytes = 2 * width * (a * image_tokens + "
                     "b * text_tokens + c); measured by solbench.models.activations.measure (see its docstring)",
            "diffusers": diffusers.__version__, "torch": torch.__version__,
            "models": {m: measure(m) for m in models}}
    path.write_text(json.dumps(data, indent=1) + "\n")
    _shipped.cache_clear()
    return data


if __name__ == "__main__":
    print(json.dumps(write_profiles(), indent=1))
