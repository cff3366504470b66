"""The four real reward models of the paper: ImageReward, PickScore, HPSv2.1 and CLIPScore.

This package's own file holds their registration and :class:`WeightedSum`; the parts live beside it:
sources (repositories and files), preprocess (CLIP preprocessing, device and dtype), base
(:class:`ModelReward`), clip (PickScore, CLIPScore), hpsv2 and imagereward. Loading from the cache is
solbench.models.hub's.

Every reward here follows the reward contract of docs/architecture.md: it has ``name``, ``range``,
``higher_is_better`` and ``__call__(images [B,3,H,W] float in [0,1], prompts) -> [B] float32 on
CPU``. All four run on ``transformers`` alone (no ``image-reward``, ``hpsv2``, ``open_clip`` or
``torchvision``), so they work in the base install; the GPU extra is not needed for them.

Loading is lazy: constructing a reward reads nothing; the weights load on the first call (or on
``load()``), once, onto the reward's device and dtype. The trainer calls ``load()`` for every reward
of a run when it starts, so missing weights stop a run at launch, not at its first evaluation. Weights come from a local directory/file or
from the Hugging Face cache, never from the network (``local_files_only``); a missing file raises
:class:`~solbench.errors.MissingWeightsError` naming the repository and the download command.

Images are preprocessed as tensors on the reward's device (resize the short side with antialiased
bicubic interpolation, centre crop, normalise), so a batch of generated images never goes through
PIL. Each reward records the reference implementation it reproduces:

=============  ==================================================================================
reward         score (s = cosine of the L2-normalised image and text embeddings)
=============  ==================================================================================
pickscore      ``logit_scale.exp() * s / 26`` with PickScore_v1 (logit_scale.exp() = 100). The raw
               PickScore (as in the PickScore README) is ``* 26``; /26 is FlowGRPO's and
               DiffusionNFT's normalisation and puts scores near the paper's Table 1 (0.81-0.89).
clipscore      ``w * max(s, 0)`` with openai/clip-vit-large-patch14 and w = 1: the raw cosine,
               the scale of the paper's Table 1 (0.26-0.31). Hessel et al.'s CLIP-S uses w = 2.5
               (``CLIPScoreReward(scale=2.5)``); the paper's Table 4 quotes 100 * s.
hpsv2          ``s`` (no logit scale), as hpsv2.score(): HPS_v2.1_compressed.pt is an open_clip
               ViT-H-14 checkpoint, converted here to a transformers CLIPModel on load.
imagereward    ``(mlp(BLIP_text(prompt | image)[CLS]) - 0.16717362830052426) / 1.0333394966054072``,
               as ImageReward.score(): BLIP ViT-L image encoder, BERT text encoder with
               cross-attention to the image, 5-layer linear head; ImageReward.pt is converted to
               transformers' BlipVisionModel + BlipTextModel on load.
=============  ==================================================================================

Multi-reward weighted sums are ``solbench.rewards.RewardSet({"pickscore": 1.0, ...})``; for code
that holds reward objects directly, :class:`WeightedSum` does the same over instances.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

# the names below stay importable from solbench.rewards.real, as before the package was split
from solbench.models.hub import download_command, resolve_file
from solbench.rewards.real.base import ModelReward
from solbench.rewards.real.clip import PICKSCORE_DIVISOR, CLIPPreferenceReward, CLIPScoreReward, PickScoreReward  # noqa: F401
from solbench.rewards.real.hpsv2 import HPSv2Reward, convert_open_clip_state_dict, load_open_clip_as_clip_model
from solbench.rewards.real.imagereward import (  # noqa: F401
                                               IMAGEREWARD_MAX_TOKENS, IMAGEREWARD_MEAN, IMAGEREWARD_STD,
                                               ImageRewardModel, ImageRewardReward, add_blip_special_tokens,
                                               build_imagereward_tokenizer, convert_imagereward_state_dict,
                                               imagereward_text_config, imagereward_vision_config)
from solbench.rewards.real.preprocess import CLIP_MEAN, CLIP_STD, clip_preprocess
from solbench.rewards.real.sources import (  # noqa: F401
                                           BERT_BASE, CLIP_L14, HPS_FILE, HPS_REPO, IMAGEREWARD_FILE,
                                           IMAGEREWARD_MED_CONFIG, IMAGEREWARD_REPO, LAION_H14, PICKSCORE_MODEL,
                                           WEIGHTS, WeightSource)

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "WEIGHTS",
    "WeightSource",
    "ModelReward",
    "CLIPPreferenceReward",
    "PickScoreReward",
    "CLIPScoreReward",
    "HPSv2Reward",
    "ImageRewardReward",
    "ImageRewardModel",
    "WeightedSum",
    "REAL_REWARDS",
    "clip_preprocess",
    "convert_open_clip_state_dict",
    "convert_imagereward_state_dict",
    "load_open_clip_as_clip_model",
    "build_imagereward_tokenizer",
    "add_blip_special_tokens",
    "imagereward_text_config",
    "imagereward_vision_config",
    "download_command",
    "register_real_rewards",
    "resolve_file",
]



class WeightedSum:
    """``sum_k w_k * reward_k(images, prompts)`` over reward objects; returns (total, parts)."""

    def __init__(self, rewards: Mapping[str, Any], weights: Mapping[str, float]) -> None:
        if set(rewards) != set(weights):
            raise ValueError(f"rewards {sorted(rewards)} and weights {sorted(weights)} name different rewards")
        if not weights:
            raise ValueError("WeightedSum needs at least one reward")
        self.rewards, self.weights = dict(rewards), {k: float(v) for k, v in weights.items()}

    def __call__(self, images: Tensor, prompts: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        parts = {name: r(images, prompts) for name, r in self.rewards.items()}
        total = torch.zeros(images.shape[0], dtype=torch.float32)
        for name, value in parts.items():
            total = total + self.weights[name] * value
        return total, parts


REAL_REWARDS: dict[str, type[ModelReward]] = {
    "imagereward": ImageRewardReward,
    "pickscore": PickScoreReward,
    "hpsv2": HPSv2Reward,
    "clipscore": CLIPScoreReward,
}


def register_real_rewards(register: Callable[..., Any]) -> None:
    """Register the four real rewards lazily: ``register(name, factory)`` with ``factory(device=None)``.

    Nothing heavy is imported and no weights are read: the factories build unloaded reward objects,
    and those load their weights on first call.
    """
    for name, cls in REAL_REWARDS.items():
        register(name, _factory(cls))


def _factory(cls: type[ModelReward]) -> Callable[..., ModelReward]:
    def make(device: str | torch.device | None = None, **kwargs) -> ModelReward:
        return cls(device=device, **kwargs)

    make.__name__ = f"make_{cls.name}"
    make.__doc__ = cls.__doc__
    return make
