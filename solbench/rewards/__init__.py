"""Reward registry: every reward is a callable (images, prompts) -> scores, looked up by name.

Contract (docs/architecture.md): a reward has `name`, `range` (lo, hi), `higher_is_better`, and
`__call__(images [B, 3, H, W] float in [0, 1] on any device, prompts: list[str]) -> [B] float32 on CPU`.

Registered names are factories, built on `get(name, device)`; nothing heavy loads before that, and
the real-model rewards (solbench.rewards.real: imagereward, pickscore, hpsv2, clipscore) load their
weights on first call. Unknown names fail with close-match suggestions. `RewardSet({name: weight})`
evaluates a weighted sum and returns (total, {name: scores}).

| name                   | range          | what                                                        |
|------------------------|----------------|-------------------------------------------------------------|
| shapes_geneval         | [0, 1]         | graded GenEval-style score of the detector (training)       |
| shapes_geneval_strict  | {0, 1}         | GenEval "correct": all requirements met (evaluation)        |
| shapes_clip            | [-1, 1]        | cosine similarity of the tiny CLIP (a learned, gameable RM) |
| jpeg_compressibility   | [-size, 0]     | minus the JPEG size in kB (DDPO)                            |
| jpeg_incompressibility | [0, size]      | the JPEG size in kB (DDPO's opposite task)                  |
| colorfulness           | [0, ~1.1]      | Hasler-Suesstrunk colourfulness (an aesthetic-style statistic)|

Stage ``rewards`` (solbench/stages.py): it imports its own modules and the stages below it, models, quant, world,
report, results, machine, text, base.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from solbench.errors import ConfigError

__all__ = ["Reward", "RewardSet", "get", "names", "register"]


@runtime_checkable
class Reward(Protocol):
    name: str
    range: tuple[float, float]
    higher_is_better: bool

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor: ...


RewardFactory = Callable[..., Reward]
_REGISTRY: dict[str, RewardFactory] = {}
_BUILTINS_LOADED = False


def register(name: str, factory: RewardFactory) -> None:
    """Add a reward factory `factory(device=None, **kwargs) -> Reward` under `name` (once)."""
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"reward {name!r} is already registered (by {_REGISTRY[name]!r})")
    _REGISTRY[name] = factory


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from solbench.rewards import image_stats, real, shapes, tiny_clip

    for module in (shapes, image_stats, tiny_clip):
        module.register_rewards(register)
    real.register_real_rewards(register)


def names() -> list[str]:
    """All registered reward names, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def get(name: str, device: str | torch.device | None = None, **kwargs) -> Reward:
    """Build the reward `name` for `device`; unknown names raise ConfigError with close matches."""
    _load_builtins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"unknown reward {name!r}.{hint} Known rewards: {', '.join(sorted(_REGISTRY))}")
    reward = _REGISTRY[name](device=device, **kwargs)
    if not isinstance(reward, Reward):
        raise TypeError(f"reward factory for {name!r} returned {type(reward).__name__}, not a Reward")
    return reward


class RewardSet:
    """A weighted sum of registered rewards: `RewardSet({"shapes_geneval": 1.0, "shapes_clip": 0.5})`.

    Calling it returns (total [B], {name: scores [B]}), all float32 on CPU.
    """

    def __init__(self, weights: Mapping[str, float], device: str | torch.device | None = None,
                 rewards: Mapping[str, Reward] | None = None):
        """``rewards`` supplies instances by name (shared with evaluation, so each reward model is
        loaded once); names it lacks are built with ``get``."""
        if not weights:
            raise ConfigError("a RewardSet needs at least one reward (got an empty mapping)")
        self.weights = {name: float(w) for name, w in weights.items()}
        given = dict(rewards or {})
        self.rewards = {name: given[name] if name in given else get(name, device=device) for name in self.weights}

    @property
    def names(self) -> list[str]:
        return list(self.weights)

    def __call__(self, images: Tensor, prompts: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        prompts = list(prompts)
        parts = {name: reward(images, prompts).to("cpu", torch.float32) for name, reward in self.rewards.items()}
        total = torch.zeros(images.shape[0], dtype=torch.float32)
        for name, scores in parts.items():
            total = total + self.weights[name] * scores
        return total, parts

    def __repr__(self) -> str:
        return f"RewardSet({self.weights})"
