"""CLIP-family rewards on transformers' CLIPModel: the shared cosine scorer, PickScore and CLIPScore
(HPSv2.1, also a CLIPModel once converted, is in solbench.rewards.real.hpsv2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from solbench.models.hub import from_pretrained_local
from solbench.rewards.real.base import ModelReward
from solbench.rewards.real.preprocess import CLIP_MEAN, CLIP_STD, clip_preprocess
from solbench.rewards.real.sources import CLIP_L14, LAION_H14, PICKSCORE_MODEL, WEIGHTS

PICKSCORE_DIVISOR = 26.0


class CLIPPreferenceReward(ModelReward):
    """score = ``scale * f(cos(image_emb, text_emb))`` for a transformers ``CLIPModel``.

    ``scale`` is a number, or ``"logit_scale"`` for the model's own ``logit_scale.exp()``;
    ``divisor`` divides the result; ``clamp_min`` applies ``max(cos, clamp_min)`` first (CLIPScore's
    ``max(cos, 0)``). Pass ``model``/``tokenizer`` to use in-memory modules (tests, custom weights)
    instead of loading ``model_id``/``tokenizer_id``.
    """

    max_text_tokens = 77

    def __init__(self, *, model_id: str | None = None, tokenizer_id: str | None = None,
                 model: nn.Module | None = None, tokenizer: Any = None, scale: float | str = 1.0,
                 divisor: float = 1.0, clamp_min: float | None = None, image_size: int | None = None,
                 mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD, **kw) -> None:
        super().__init__(**kw)
        if model is None and model_id is None:
            raise ValueError(f"{type(self).__name__}: give model_id (repo id or local path) or a model")
        self.model_id = model_id
        self.tokenizer_id = tokenizer_id or model_id
        self.model = model
        self.tokenizer = tokenizer
        self.scale = scale
        self.divisor = float(divisor)
        self.clamp_min = clamp_min
        self.image_size = image_size
        self.mean, self.std = tuple(mean), tuple(std)

    # -- loading -------------------------------------------------------------------------------
    def _load_model(self) -> nn.Module:
        from transformers import CLIPModel

        src = WEIGHTS.get(self.name, ())
        include = next((s.include for s in src if s.repo_id == self.model_id), ())
        return from_pretrained_local(CLIPModel.from_pretrained, self.model_id, what=f"{self.name} reward model",
                                include=include)

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return from_pretrained_local(AutoTokenizer.from_pretrained, self.tokenizer_id, what=f"{self.name} tokenizer",
                                include=("*.json", "*.txt"))

    def _load(self) -> None:
        if self.model is None:
            self.model = self._load_model()
        if self.tokenizer is None:
            self.tokenizer = self._load_tokenizer()
        self.model = self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        if self.image_size is None:
            self.image_size = int(self.model.config.vision_config.image_size)

    # -- scoring -------------------------------------------------------------------------------
    def embed(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """L2-normalised (image, text) embeddings in float32, [b, D] each. Loads the model if needed."""
        self.load()
        pixels = clip_preprocess(images.to(self.device), self.image_size, self.mean, self.std).to(self.dtype)
        vision = self.model.vision_model(pixel_values=pixels)
        img = self.model.visual_projection(vision.pooler_output)
        tok = self.tokenizer(list(prompts), padding=True, truncation=True, max_length=self.max_text_tokens,
                             return_tensors="pt")
        text = self.model.text_model(input_ids=tok["input_ids"].to(self.device),
                                     attention_mask=tok["attention_mask"].to(self.device))
        txt = self.model.text_projection(text.pooler_output)
        img = F.normalize(img.float(), dim=-1)
        txt = F.normalize(txt.float(), dim=-1)
        return img, txt

    def _scale_value(self) -> Tensor | float:
        if self.scale == "logit_scale":
            return self.model.logit_scale.detach().float().exp()
        return float(self.scale)

    def _score(self, images: Tensor, prompts: list[str]) -> Tensor:
        img, txt = self.embed(images, prompts)
        cos = (img * txt).sum(-1)
        if self.clamp_min is not None:
            cos = cos.clamp_min(self.clamp_min)
        return self._scale_value() * cos / self.divisor


class PickScoreReward(CLIPPreferenceReward):
    """PickScore v1 (Kirstain et al. 2023), normalised by 26 as in FlowGRPO/DiffusionNFT.

    ``score = logit_scale.exp() * cos(img, txt) / divisor`` with PickScore_v1's CLIP ViT-H/14 and
    the laion CLIP-ViT-H-14 tokenizer/processor. ``divisor=1`` gives the raw PickScore of the
    PickScore README (about 21-23 for good images).
    """

    name = "pickscore"
    range = (0.0, 1.0)  # typical span after /26; the exact bound is +-100/26

    def __init__(self, *, model_id: str = PICKSCORE_MODEL, tokenizer_id: str = LAION_H14,
                 divisor: float = PICKSCORE_DIVISOR, **kw) -> None:
        super().__init__(model_id=model_id, tokenizer_id=tokenizer_id, scale="logit_scale", divisor=divisor, **kw)


class CLIPScoreReward(CLIPPreferenceReward):
    """CLIPScore with CLIP ViT-L/14: ``scale * max(cos(img, txt), 0)``.

    ``scale=1`` (default) is the raw cosine the paper's Table 1 reports (0.26-0.31); Hessel et al.'s
    CLIP-S is ``scale=2.5``; ``scale=100`` gives Table 4's "CLIP score" (27-30).
    """

    name = "clipscore"
    range = (0.0, 1.0)

    def __init__(self, *, model_id: str = CLIP_L14, tokenizer_id: str | None = None, scale: float = 1.0, **kw) -> None:
        super().__init__(model_id=model_id, tokenizer_id=tokenizer_id or model_id, scale=float(scale), clamp_min=0.0, **kw)
