"""Preprocessing on the reward's device (CLIP-style resize, crop and normalisation) and the device
and dtype arguments every real reward takes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

# OpenAI CLIP normalisation: used by openai CLIP, the laion ViT-H-14 processor, open_clip/HPSv2 and BLIP.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_preprocess(images: Tensor, size: int, mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD) -> Tensor:
    """CLIP-style preprocessing of a [B,3,H,W] batch in [0,1], on the batch's device.

    Short side resized to ``size`` (bicubic, antialiased: the PIL/torchvision filter), centre
    crop ``size`` x ``size`` (torchvision's rounding), values clamped to [0,1] like the uint8
    round trip of PIL-based processors, then ``(x - mean) / std``. Square inputs (what text-to-image
    models generate) resize straight to ``size`` and the crop is a no-op.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [B,3,H,W], got {tuple(images.shape)}")
    x = images.float()
    h, w = x.shape[-2:]
    if (h, w) != (size, size):
        short, long = (h, w) if h <= w else (w, h)
        new_long = int(size * long / short)
        new_h, new_w = (size, new_long) if h <= w else (new_long, size)
        x = F.interpolate(x, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
        top = int(round((new_h - size) / 2.0))
        left = int(round((new_w - size) / 2.0))
        x = x[..., top : top + size, left : left + size]
    x = x.clamp(0.0, 1.0)
    m = torch.tensor(mean, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    s = torch.tensor(std, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x - m) / s


def default_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown reward dtype {dtype!r}: use float32, bfloat16 or float16") from None
