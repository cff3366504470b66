"""Prompt-independent image statistics used as rewards: JPEG (in)compressibility and colourfulness.

- `jpeg_compressibility` (DDPO, Black et al. 2023): minus the size in kB (1000 bytes) of the image
  saved as JPEG at quality 95 with PIL, exactly DDPO's ddpo_pytorch/rewards.py. Range (-inf, 0];
  at 32x32 a flat image takes 0.64 kB (JPEG headers), a shapes scene about 1.1 kB and uniform
  noise about 1.8 kB. Higher = simpler images (flat colour, fewer edges): an easy reward to game,
  which is why DDPO uses it.
- `jpeg_incompressibility`: the size in kB itself (DDPO's opposite task), range [0, inf).
- `colorfulness`: Hasler & Suesstrunk (2003) colourfulness, sqrt(sd_rg^2 + sd_yb^2) +
  0.3 sqrt(mean_rg^2 + mean_yb^2) with rg = R - G and yb = (R + G)/2 - B, on RGB in [0, 1]
  (the paper's 0-255 values divided by 255). Range [0, 1.84] in theory (0 for grey images; a
  typical shapes scene, rendered or generated, scores about 0.27). An "aesthetic-style" statistic: it rewards vivid,
  saturated colour regardless of the prompt, like the colour bias of learned aesthetic models.

All take images [B, 3, H, W] in [0, 1] on any device and return float32 [B] on the CPU.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor

JPEG_QUALITY = 95


def jpeg_sizes_kb(images: Tensor, quality: int = JPEG_QUALITY) -> Tensor:
    """JPEG file sizes in kB (1000 bytes) of images [B, 3, H, W] in [0, 1]."""
    arrays = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for array in arrays:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegCompressibility:
    """DDPO's compressibility reward: -(JPEG size in kB); `incompressible=True` gives +size."""

    higher_is_better = True

    def __init__(self, incompressible: bool = False, device: str | torch.device | None = None):
        self.incompressible = incompressible
        self.name = "jpeg_incompressibility" if incompressible else "jpeg_compressibility"
        self.range = (0.0, math.inf) if incompressible else (-math.inf, 0.0)

    def __call__(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        sizes = jpeg_sizes_kb(images)
        return sizes if self.incompressible else -sizes


def colorfulness(images: Tensor) -> Tensor:
    """Hasler-Suesstrunk colourfulness [B] of images [B, 3, H, W] in [0, 1] (vectorised)."""
    x = images.detach().float().clamp(0, 1).flatten(2)
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    rg, yb = r - g, 0.5 * (r + g) - b
    spread = torch.sqrt(rg.var(dim=1, unbiased=False) + yb.var(dim=1, unbiased=False))
    centre = torch.sqrt(rg.mean(dim=1) ** 2 + yb.mean(dim=1) ** 2)
    return (spread + 0.3 * centre).to("cpu", torch.float32)


class Colorfulness:
    """Hasler-Suesstrunk colourfulness (prompt-independent); range [0, 1.84], grey = 0."""

    name = "colorfulness"
    range = (0.0, 1.3 * math.sqrt(2.0))  # (sd + 0.3 mean) over rg, yb in [-1, 1]: at most 1.3 * sqrt(2)
    higher_is_better = True

    def __init__(self, device: str | torch.device | None = None):
        pass

    def __call__(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        return colorfulness(images)


def register_rewards(register: Callable) -> None:
    register("jpeg_compressibility", lambda device=None: JpegCompressibility(False, device))
    register("jpeg_incompressibility", lambda device=None: JpegCompressibility(True, device))
    register("colorfulness", lambda device=None: Colorfulness(device))
