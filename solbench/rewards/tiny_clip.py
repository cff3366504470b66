"""`shapes_clip`: a tiny CLIP-style reward model trained contrastively on shapes scenes.

Our stand-in for PickScore/CLIPScore in the embedded world: a learned image-text model, so it is
imperfect and can be gamed (unlike the detector). It scores the cosine similarity of L2-normalised
image and text embeddings: range [-1, 1], higher is better; matching scene/caption pairs score
about 0.6-0.9 after training, mismatched ones near 0 or below (see docs/embedded-world.md).

Image encoder: four 3x3 convolutions (32 -> 4 px, GELU) flattened into a linear projection;
flattening, not global pooling, keeps where things are, which relations need. Text encoder: the
word tokenizer and one-layer transformer encoder of the tiny T2I model's kind (its own weights),
mean-pooled and projected. Trained by scripts/train_tiny_clip.py with grammar hard negatives
(a caption with one count, colour, shape or relation changed), so that it checks attributes
instead of only recognising which colours appear. Weights ship as
solbench/assets/tiny_clip.safetensors with tiny_clip.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from solbench.errors import MissingWeightsError
from solbench.models.tiny import TinyT2IConfig, TinyTextEncoder, WordTokenizer, _grammar_vocabulary, asset_path

ASSET_NAME = "tiny_clip"


@dataclass
class TinyCLIPConfig:
    resolution: int = 32
    embed_dim: int = 128
    conv_channels: tuple[int, ...] = (32, 64, 64, 128)  # stride 1, 2, 2, 2
    text_dim: int = 64
    text_heads: int = 4
    text_layers: int = 2
    max_length: int = 10
    vocabulary: list[str] = field(default_factory=_grammar_vocabulary)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TinyCLIPConfig":
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "conv_channels" in kwargs:
            kwargs["conv_channels"] = tuple(kwargs["conv_channels"])
        return cls(**kwargs)


class TinyCLIP(nn.Module):
    """Image and text towers into a shared embedding space (normalised outputs)."""

    def __init__(self, cfg: TinyCLIPConfig | None = None):
        super().__init__()
        self.config = cfg = cfg or TinyCLIPConfig()
        layers: list[nn.Module] = []
        in_ch, side = 3, cfg.resolution
        for i, ch in enumerate(cfg.conv_channels):
            stride = 1 if i == 0 else 2
            layers += [nn.Conv2d(in_ch, ch, 3, stride=stride, padding=1), nn.GroupNorm(8, ch), nn.GELU()]
            in_ch, side = ch, side // stride
        self.image_tower = nn.Sequential(*layers, nn.Flatten(), nn.Linear(in_ch * side * side, cfg.embed_dim))
        self.tokenizer = WordTokenizer(cfg.vocabulary, cfg.max_length)
        text_cfg = TinyT2IConfig(text_dim=cfg.text_dim, text_heads=cfg.text_heads, text_layers=cfg.text_layers,
                                 max_length=cfg.max_length, vocabulary=list(cfg.vocabulary))
        self.text_tower = TinyTextEncoder(len(self.tokenizer), text_cfg)
        self.text_proj = nn.Linear(cfg.text_dim, cfg.embed_dim)
        self.logit_scale = nn.Parameter(torch.tensor(2.3))  # exp(2.3) ~ 10, CLIP's init is log(1/0.07)

    @property
    def device(self) -> torch.device:
        return self.logit_scale.device

    def embed_images(self, images: Tensor) -> Tensor:
        """Unit embeddings [B, E] of images [B, 3, H, W] in [0, 1]."""
        return F.normalize(self.image_tower(images.to(self.device, torch.float32) * 2 - 1), dim=-1)

    def embed_texts(self, prompts: Sequence[str]) -> Tensor:
        """Unit embeddings [B, E] of prompts."""
        _, pooled = self.text_tower(self.tokenizer(list(prompts)).to(self.device))
        return F.normalize(self.text_proj(pooled), dim=-1)

    def similarity(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        """Cosine similarity [B] of each image with its own prompt."""
        return (self.embed_images(images) * self.embed_texts(prompts)).sum(-1)


def save_tiny_clip(model: TinyCLIP, folder) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / f"{ASSET_NAME}.safetensors"), metadata={"model": "solbench.rewards.tiny_clip.TinyCLIP"})
    (folder / f"{ASSET_NAME}.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")


def load_tiny_clip(device: str | torch.device | None = None) -> TinyCLIP:
    """The shipped, trained tiny CLIP (eval mode, no gradients)."""
    weights, config = asset_path(f"{ASSET_NAME}.safetensors"), asset_path(f"{ASSET_NAME}.json")
    if not weights.is_file() or not config.is_file():
        raise MissingWeightsError(
            f"the tiny CLIP reward's weights are missing ({weights}); they ship with the package: "
            f"reinstall solbench, or recreate them with `python scripts/train_tiny_clip.py`."
        )
    from safetensors.torch import load_file

    model = TinyCLIP(TinyCLIPConfig.from_dict(json.loads(config.read_text())))
    model.load_state_dict(load_file(str(weights)))
    return model.to(device or "cpu").eval().requires_grad_(False)


class ShapesCLIP:
    """`shapes_clip`: cosine similarity of the tiny CLIP's image and prompt embeddings, in [-1, 1]."""

    name = "shapes_clip"
    range = (-1.0, 1.0)
    higher_is_better = True

    def __init__(self, device: str | torch.device | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._model: TinyCLIP | None = None  # loaded on first call

    @property
    def model(self) -> TinyCLIP:
        if self._model is None:
            self._model = load_tiny_clip(self.device)
        return self._model

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        return self.model.similarity(images, prompts).to("cpu", torch.float32)


def register_rewards(register: Callable) -> None:
    register("shapes_clip", lambda device=None: ShapesCLIP(device))
