"""ModelReward: a reward backed by a network that loads on first use (lazy loading, batching,
device and dtype, the reward contract's output: [B] float32 on CPU)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from solbench.rewards.real.preprocess import as_dtype, default_device


class ModelReward:
    """A reward backed by a neural network that loads on first use.

    Subclasses implement ``_load()`` (set up modules on ``self.device``/``self.dtype``) and
    ``_score(images_on_device_fp32, prompts) -> Tensor [b]``. This class validates inputs, moves
    images to the device, splits into chunks of ``batch_size`` and returns float32 on CPU.
    """

    name: str = "model_reward"
    range: tuple[float, float] = (-math.inf, math.inf)
    higher_is_better: bool = True

    def __init__(self, *, device: str | torch.device | None = None, dtype: str | torch.dtype = torch.float32,
                 batch_size: int = 32) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = default_device(device)
        self.dtype = as_dtype(dtype)
        self.batch_size = int(batch_size)
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> "ModelReward":
        """Load the weights now (idempotent). Raises MissingWeightsError when they are absent."""
        if not self._loaded:
            self._load()
            self._loaded = True
        return self

    def _load(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _score(self, images: Tensor, prompts: list[str]) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] != 3:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"{self.name}: expected images as a float tensor [B,3,H,W] in [0,1], got {shape}")
        prompts = list(prompts)
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{self.name}: {images.shape[0]} images but {len(prompts)} prompts")
        self.load()
        out = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = images[start : start + self.batch_size].to(self.device, torch.float32, non_blocking=True)
            out.append(self._score(chunk, prompts[start : start + self.batch_size]).float().cpu())
        if not out:
            return torch.zeros(0, dtype=torch.float32)
        return torch.cat(out).reshape(-1).to(torch.float32)

    def __repr__(self) -> str:
        state = "loaded" if self._loaded else "not loaded"
        return f"{type(self).__name__}(name={self.name!r}, device={self.device}, dtype={self.dtype}, {state})"
