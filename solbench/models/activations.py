"""Activation memory of the real transformers, measured on their own modules (solbench doctor's model).

What one transformer block holds per sample and forward, as it runs on a GPU:

- ``saved``: the tensors autograd keeps for the backward. Training without gradient checkpointing
  keeps every block's; with it, one block's at a time (recomputed) plus every block's inputs.
- ``inputs``: the new tensors a block is called with (what gradient checkpointing keeps per block;
  a tensor handed to several blocks, like SANA's projected caption, counts once).
- ``peak``: the most a block allocates at once in a no-grad forward (a rollout's working set).

Each is linear in the tokens a block sees, so ``measure(model)`` (solbench.measure.activation_probe) builds the
model's transformer from its published config (solbench/models/published/<model>.json) with fewer heads and
layers (its card's probe) but every per-head width and ratio kept (head width, MLP ratio, rotary axes, text and
caption widths scaled with the model width), in bf16 on CPU with fp32 LoRA adapters on the run's default targets
(as a run trains them; peft runs them in fp32, saving an fp32 copy of each adapted layer's input), at two
image-token and two text-token counts. It counts saved tensors with torch.autograd.graph.saved_tensors_hooks
(each storage once, parameters excluded), block inputs with forward pre-hooks and the no-grad peak with
solbench.measure.peak.PeakMemory, attributed to blocks by forward hooks, and solves

    bytes = 2 * width * (a * image_tokens + b * text_tokens + c)        (per block, per sample)

for (a, b, c): "bf16 widths per token", which carry over to the published width. Attention runs
through torch's flash kernel (on CPU as on GPU, it keeps the log-sum-exp, not the score matrix).
``PROFILES`` holds the measured numbers shipped in published/activations.json; the doctor reads them
(``block_bytes``) and tests/test_activations.py measures them again. A new architecture (e.g. a
linear-FFN SANA variant) gets a profile from its published config and its card's ``probe``
(solbench.models.card.Probe; ``PROBES`` reads them) with ``python -m solbench.measure.activation_probe``.
This module holds the shipped profiles and reads them; the measuring is solbench.measure.activation_probe's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from solbench.models import CardView, card

__all__ = ["BlockProfile", "ModelProfile", "PROBES", "PROFILES", "TEXT_TOKENS", "transformer_text_tokens",
           "block_bytes", "per_sample_gb", "profile"]

PUBLISHED = Path(__file__).parent / "published"
PROFILE_FILE = PUBLISHED / "activations.json"


def transformer_text_tokens(model: str, text_max_length: int | None = None) -> int:
    """Text tokens ``model``'s transformer attends to when prompts are encoded to ``text_max_length`` T5 /
    Gemma tokens (None: the adapter's default, its card's ``text_max_length``, the reference scripts'),
    after the card's ``text_prefix_tokens``: SD3's prompt embeddings put CLIP-L/G's 77 before T5's; FLUX and
    SANA attend to T5 / Gemma alone."""
    found = card(model)
    length = found.text_max_length if text_max_length is None else int(text_max_length)
    if length is None:
        raise KeyError(model)  # a model without a text length (the tiny model)
    return found.text_prefix_tokens + length


# Text tokens a real model's transformer sees per sample at the adapters' default prompt length:
# FLUX's 128 T5 tokens, SD3's 77 CLIP + 128 T5, SANA's 300 Gemma tokens (cross-attention).
TEXT_TOKENS = CardView("text_tokens", lambda c: None if c.text_max_length is None
                       else c.text_prefix_tokens + c.text_max_length)
#: {model: Probe}: each card's activation probe (solbench.measure.activation_probe measures with it)
PROBES = CardView("probe")


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

        raise ConfigError(f"no measured activation profile for model {model!r} in {PROFILE_FILE}; give its card "
                          "a probe and run `python -m solbench.measure.activation_probe`") from None

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
def shipped_profiles() -> dict:
    return json.loads(PROFILE_FILE.read_text()) if PROFILE_FILE.exists() else {}


def profile(model: str) -> ModelProfile | None:
    """The shipped profile of ``model`` (None when it has none: the doctor then says so)."""
    entry = shipped_profiles().get("models", {}).get(model)
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
