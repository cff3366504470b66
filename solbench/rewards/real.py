"""The four real reward models of the paper: ImageReward, PickScore, HPSv2.1 and CLIPScore.

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

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from solbench.errors import MissingWeightsError

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

# OpenAI CLIP normalisation: used by openai CLIP, the laion ViT-H-14 processor, open_clip/HPSv2 and BLIP.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
LAION_H14 = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
CLIP_L14 = "openai/clip-vit-large-patch14"
HPS_REPO = "xswu/HPSv2"
HPS_FILE = "HPS_v2.1_compressed.pt"
IMAGEREWARD_REPO = "THUDM/ImageReward"
IMAGEREWARD_FILE = "ImageReward.pt"
IMAGEREWARD_MED_CONFIG = "med_config.json"
BERT_BASE = "google-bert/bert-base-uncased"

PICKSCORE_DIVISOR = 26.0
IMAGEREWARD_MEAN = 0.16717362830052426
IMAGEREWARD_STD = 1.0333394966054072
IMAGEREWARD_MAX_TOKENS = 35

_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")


# --------------------------------------------------------------------------------------------------
# Where the weights live
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSource:
    """One Hugging Face repository a reward needs, and the files in it that must be present.

    ``files`` lists requirements; an entry with ``|`` is satisfied by any one of its alternatives
    (``"model.safetensors|pytorch_model.bin"``). ``include`` narrows the download command to the
    files actually used (the laion ViT-H-14 repository is only needed for its tokenizer, not its
    3.9 GB of weights).
    """

    repo_id: str
    files: tuple[str, ...]
    purpose: str
    include: tuple[str, ...] = ()
    gated: bool = False

    def command(self) -> str:
        return download_command(self.repo_id, self.include)


def download_command(repo_id: str, include: Sequence[str] = ()) -> str:
    """The shell command that puts ``repo_id`` (or the ``include`` patterns of it) in the HF cache.

    Each pattern gets its own ``--include``: ``hf download`` (huggingface_hub >= 1.0) reads
    ``--include a b`` as the pattern ``a`` plus a file named ``b`` to fetch, and then ignores the
    pattern, so the space-separated form silently downloads the wrong files.
    """
    return f"hf download {repo_id}" + "".join(f" --include '{p}'" for p in include)


# The laion ViT-H-14 repository serves only its tokenizer (and processor config); AutoTokenizer also
# reads the repository's config.json when loading by repo id from the cache (transformers 5), so it
# is required here too (`--include '*.json'` fetches it).
WEIGHTS: dict[str, tuple[WeightSource, ...]] = {
    "pickscore": (
        WeightSource(PICKSCORE_MODEL, ("config.json", "model.safetensors|pytorch_model.bin"),
                     "PickScore_v1 CLIP ViT-H/14 weights"),
        WeightSource(LAION_H14, ("preprocessor_config.json", "tokenizer.json|vocab.json", "config.json"),
                     "CLIP ViT-H/14 tokenizer and processor", include=("*.json", "*.txt")),
    ),
    "clipscore": (
        WeightSource(CLIP_L14, ("config.json", "model.safetensors|pytorch_model.bin", "tokenizer.json|vocab.json"),
                     "CLIP ViT-L/14 weights and tokenizer",
                     include=("*.json", "*.txt", "model.safetensors")),
    ),
    "hpsv2": (
        WeightSource(HPS_REPO, (HPS_FILE,), "HPSv2.1 open_clip ViT-H/14 checkpoint", include=(HPS_FILE,)),
        WeightSource(LAION_H14, ("tokenizer.json|vocab.json", "config.json"), "CLIP ViT-H/14 tokenizer",
                     include=("*.json", "*.txt")),
    ),
    "imagereward": (
        WeightSource(IMAGEREWARD_REPO, (IMAGEREWARD_FILE, IMAGEREWARD_MED_CONFIG), "ImageReward v1.0 checkpoint"),
        WeightSource(BERT_BASE, ("vocab.txt",), "BERT tokenizer used by ImageReward's BLIP",
                     include=("vocab.txt", "tokenizer_config.json", "tokenizer.json", "config.json")),
    ),
}


def _missing(what: str, repo_id: str, filename: str | None, include: Sequence[str] = (), cause: str = "") -> MissingWeightsError:
    target = f"{filename} from {repo_id}" if filename else repo_id
    msg = (
        f"{what}: {target} is not on this machine (looked in the Hugging Face cache "
        f"{_hub_cache()} and, for local paths, on disk; solbench never downloads during a run).\n"
        f"  Fetch it once with:  {download_command(repo_id, include)}\n"
        f"  (`hf` is the CLI of huggingface_hub >= 1.0; set HF_HOME to use another cache, or pass a local "
        f"directory/file.)"
    )
    if cause:
        msg += f"\n  Loader said: {cause}"
    return MissingWeightsError(msg)


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # pragma: no cover - huggingface_hub is a transformers dependency
        return "~/.cache/huggingface/hub"


def resolve_file(source: str | os.PathLike, filename: str, *, what: str, include: Sequence[str] = ()) -> Path:
    """Path of ``filename`` for ``source``: a local file, a local directory, or a cached HF repo id.

    Never downloads. Raises MissingWeightsError naming the repository and the download command.
    """
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        candidate = path / filename
        if candidate.is_file():
            return candidate
        raise MissingWeightsError(f"{what}: {candidate} does not exist (the directory {path} lacks {filename}).")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(str(source), filename, local_files_only=True))
    except Exception as err:  # LocalEntryNotFoundError, EntryNotFoundError, invalid repo id, offline mode
        raise _missing(what, str(source), filename, include or (filename,), cause=f"{type(err).__name__}") from err


def _from_pretrained(loader: Callable[..., Any], source: str, *, what: str, include: Sequence[str] = (), **kwargs) -> Any:
    """``loader(source, local_files_only=True)``, turning 'not found' into MissingWeightsError."""
    try:
        return loader(source, local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        if Path(source).expanduser().exists():
            raise MissingWeightsError(f"{what}: could not load {source}: {err}") from err
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise _missing(what, source, None, include, cause=first[:300]) from err


def _torch_load(path: Path) -> dict[str, Tensor]:
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    return {re.sub(r"^module\.", "", k): v for k, v in obj.items()}


# --------------------------------------------------------------------------------------------------
# Preprocessing on device
# --------------------------------------------------------------------------------------------------


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


def _default_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown reward dtype {dtype!r}: use float32, bfloat16 or float16") from None


# --------------------------------------------------------------------------------------------------
# Base class: lazy loading, batching, device/dtype, output contract
# --------------------------------------------------------------------------------------------------


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
        self.device = _default_device(device)
        self.dtype = _as_dtype(dtype)
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


# --------------------------------------------------------------------------------------------------
# CLIP-family rewards (transformers CLIPModel): PickScore, CLIPScore, HPSv2.1
# --------------------------------------------------------------------------------------------------


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
        return _from_pretrained(CLIPModel.from_pretrained, self.model_id, what=f"{self.name} reward model",
                                include=include)

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return _from_pretrained(AutoTokenizer.from_pretrained, self.tokenizer_id, what=f"{self.name} tokenizer",
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


# --- HPSv2.1: open_clip checkpoint -> transformers CLIPModel ----------------------------------------


def _count_layers(keys: Sequence[str], prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in keys if (m := pat.match(k))}
    if not idx:
        raise ValueError(f"no transformer blocks under {prefix!r} in the checkpoint")
    if idx != set(range(len(idx))):
        raise ValueError(f"non-contiguous block indices under {prefix!r}: {sorted(idx)}")
    return len(idx)


def convert_open_clip_state_dict(sd: Mapping[str, Tensor], *, vision_heads: int = 16, text_heads: int = 16):
    """Convert an open_clip ``CLIP`` (ViT, built-in text tower) state dict to transformers CLIPModel.

    Returns ``(CLIPConfig, state_dict)``. Dimensions come from the tensors; head counts cannot be
    read from shapes, so they are arguments (open_clip ViT-H-14: 16 and 16, i.e. head widths 80 and
    64). The text tower pools at the argmax token id like open_clip (``eos_token_id=2``, the
    transformers convention for that). Raises ValueError on a layout it does not know.
    """
    from transformers import CLIPConfig

    sd = {re.sub(r"^module\.", "", k): v for k, v in sd.items()}
    keys = list(sd)
    needed = ["visual.conv1.weight", "visual.class_embedding", "visual.positional_embedding", "visual.ln_pre.weight",
              "visual.ln_post.weight", "visual.proj", "token_embedding.weight", "positional_embedding",
              "ln_final.weight", "text_projection", "logit_scale"]
    absent = [k for k in needed if k not in sd]
    if absent:
        raise ValueError(f"not an open_clip ViT CLIP state dict: missing {absent[:5]}")
    v_width, _, patch, _ = sd["visual.conv1.weight"].shape
    n_pos = sd["visual.positional_embedding"].shape[0]
    grid = int(round(math.sqrt(n_pos - 1)))
    if grid * grid + 1 != n_pos:
        raise ValueError(f"visual.positional_embedding has {n_pos} rows, not grid^2 + 1")
    v_layers = _count_layers(keys, "visual.transformer.resblocks.")
    t_layers = _count_layers(keys, "transformer.resblocks.")
    v_mlp = sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]
    t_mlp = sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0]
    vocab, t_width = sd["token_embedding.weight"].shape
    context = sd["positional_embedding"].shape[0]
    embed_dim = sd["text_projection"].shape[1]
    if sd["visual.proj"].shape != (v_width, embed_dim):
        raise ValueError(f"visual.proj {tuple(sd['visual.proj'].shape)} != ({v_width}, {embed_dim})")
    for width, heads, tower in ((v_width, vision_heads, "vision"), (t_width, text_heads, "text")):
        if width % heads:
            raise ValueError(f"{tower} width {width} is not divisible by {heads} heads")

    config = CLIPConfig(
        text_config=dict(vocab_size=vocab, hidden_size=t_width, intermediate_size=t_mlp, num_hidden_layers=t_layers,
                         num_attention_heads=text_heads, max_position_embeddings=context, hidden_act="gelu",
                         layer_norm_eps=1e-5, projection_dim=embed_dim, eos_token_id=2, bos_token_id=0, pad_token_id=1),
        vision_config=dict(hidden_size=v_width, intermediate_size=v_mlp, num_hidden_layers=v_layers,
                           num_attention_heads=vision_heads, image_size=grid * patch, patch_size=patch,
                           hidden_act="gelu", layer_norm_eps=1e-5, projection_dim=embed_dim),
        projection_dim=embed_dim,
    )

    out: dict[str, Tensor] = {}

    def blocks(src: str, dst: str, n: int) -> None:
        for i in range(n):
            s, d = f"{src}{i}.", f"{dst}{i}."
            q, k, v = sd[s + "attn.in_proj_weight"].chunk(3, dim=0)
            qb, kb, vb = sd[s + "attn.in_proj_bias"].chunk(3, dim=0)
            out.update({
                d + "self_attn.q_proj.weight": q, d + "self_attn.q_proj.bias": qb,
                d + "self_attn.k_proj.weight": k, d + "self_attn.k_proj.bias": kb,
                d + "self_attn.v_proj.weight": v, d + "self_attn.v_proj.bias": vb,
                d + "self_attn.out_proj.weight": sd[s + "attn.out_proj.weight"],
                d + "self_attn.out_proj.bias": sd[s + "attn.out_proj.bias"],
                d + "layer_norm1.weight": sd[s + "ln_1.weight"], d + "layer_norm1.bias": sd[s + "ln_1.bias"],
                d + "layer_norm2.weight": sd[s + "ln_2.weight"], d + "layer_norm2.bias": sd[s + "ln_2.bias"],
                d + "mlp.fc1.weight": sd[s + "mlp.c_fc.weight"], d + "mlp.fc1.bias": sd[s + "mlp.c_fc.bias"],
                d + "mlp.fc2.weight": sd[s + "mlp.c_proj.weight"], d + "mlp.fc2.bias": sd[s + "mlp.c_proj.bias"],
            })

    blocks("visual.transformer.resblocks.", "vision_model.encoder.layers.", v_layers)
    blocks("transformer.resblocks.", "text_model.encoder.layers.", t_layers)
    out.update({
        "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
        "vision_model.pre_layrnorm.weight": sd["visual.ln_pre.weight"],
        "vision_model.pre_layrnorm.bias": sd["visual.ln_pre.bias"],
        "vision_model.post_layernorm.weight": sd["visual.ln_post.weight"],
        "vision_model.post_layernorm.bias": sd["visual.ln_post.bias"],
        "visual_projection.weight": sd["visual.proj"].t().contiguous(),
        "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
        "text_model.final_layer_norm.weight": sd["ln_final.weight"],
        "text_model.final_layer_norm.bias": sd["ln_final.bias"],
        "text_projection.weight": sd["text_projection"].t().contiguous(),
        "logit_scale": sd["logit_scale"].reshape(()),
    })
    return config, out


def load_open_clip_as_clip_model(sd: Mapping[str, Tensor], **heads) -> nn.Module:
    """Build a transformers CLIPModel holding an open_clip state dict (strict: every weight used)."""
    from transformers import CLIPModel

    config, hf_sd = convert_open_clip_state_dict(sd, **heads)
    with torch.device("meta"):
        model = CLIPModel(config)
    missing, unexpected = model.load_state_dict(hf_sd, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"open_clip conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, buf in list(model.named_buffers()):
        if buf.is_meta and name.endswith("position_ids"):
            mod = model.get_submodule(name.rsplit(".", 1)[0])
            mod.position_ids = torch.arange(buf.shape[-1]).expand(1, -1)
    return model.eval()


class HPSv2Reward(CLIPPreferenceReward):
    """HPSv2.1 (Wu et al. 2023): ``cos(img, txt)`` of the HPS-tuned open_clip ViT-H/14, as hpsv2.score().

    The open_clip checkpoint (xswu/HPSv2 HPS_v2.1_compressed.pt, the full model state dict) is
    converted to a transformers CLIPModel on load, so neither open_clip nor hpsv2 is needed. The
    tokenizer is the laion CLIP-ViT-H-14 one (the same BPE as open_clip's). hpsv2 scores under CUDA
    autocast (fp16); pass ``dtype="float16"`` to mirror that, float32 (default) for the exact value.
    """

    name = "hpsv2"
    range = (0.0, 0.5)  # typical span of the cosine; the exact bound is [-1, 1]

    def __init__(self, *, checkpoint: str = HPS_REPO, filename: str = HPS_FILE, tokenizer_id: str = LAION_H14,
                 vision_heads: int = 16, text_heads: int = 16, **kw) -> None:
        kw.setdefault("model_id", checkpoint)
        super().__init__(tokenizer_id=tokenizer_id, scale=1.0, **kw)
        self.checkpoint, self.filename = checkpoint, filename
        self.heads = dict(vision_heads=vision_heads, text_heads=text_heads)

    def _load_model(self) -> nn.Module:
        path = resolve_file(self.checkpoint, self.filename, what="hpsv2 reward checkpoint", include=(self.filename,))
        return load_open_clip_as_clip_model(_torch_load(path), **self.heads)


# --------------------------------------------------------------------------------------------------
# ImageReward on transformers' BLIP components
# --------------------------------------------------------------------------------------------------


def imagereward_vision_config(**overrides):
    """BLIP 'large' ViT of ImageReward (ViT-L/16 at 224 px, LayerNorm eps 1e-6 as BLIP's vit.py)."""
    from transformers import BlipVisionConfig

    cfg = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
               image_size=224, patch_size=16, hidden_act="gelu", layer_norm_eps=1e-6)
    cfg.update(overrides)
    return BlipVisionConfig(**cfg)


def imagereward_text_config(med_config: Mapping[str, Any] | None = None, *, encoder_hidden_size: int = 1024, **overrides):
    """BlipTextConfig equivalent to BLIP's med_config.json (BERT-base with cross-attention)."""
    from transformers import BlipTextConfig

    med = dict(med_config or {})
    cfg = dict(
        vocab_size=med.get("vocab_size", 30524), hidden_size=med.get("hidden_size", 768),
        intermediate_size=med.get("intermediate_size", 3072), num_hidden_layers=med.get("num_hidden_layers", 12),
        num_attention_heads=med.get("num_attention_heads", 12), hidden_act=med.get("hidden_act", "gelu"),
        layer_norm_eps=med.get("layer_norm_eps", 1e-12), max_position_embeddings=med.get("max_position_embeddings", 512),
        pad_token_id=med.get("pad_token_id", 0), encoder_hidden_size=encoder_hidden_size,
        is_decoder=True,  # transformers builds the cross-attention blocks only for is_decoder configs
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    cfg.update(overrides)
    return BlipTextConfig(**cfg)


class ImageRewardModel(nn.Module):
    """ImageReward v1.0 on transformers modules: BLIP ViT + BLIP text encoder + MLP head.

    ``forward(pixel_values, input_ids, attention_mask) -> [B]`` standardised rewards, exactly
    ImageReward.score(): the prompt's [CLS] state after cross-attending to all image tokens, through
    the 5-layer linear head (no activations, as in the package), minus ``mean``, over ``std``.
    """

    def __init__(self, vision_config, text_config) -> None:
        super().__init__()
        from transformers import BlipTextModel, BlipVisionModel

        self.vision_model = BlipVisionModel(vision_config)
        self.text_encoder = BlipTextModel(text_config, add_pooling_layer=False)
        h = text_config.hidden_size
        self.mlp = nn.Module()
        self.mlp.layers = nn.Sequential(  # indices match ImageReward's MLP (dropouts at 1, 3, 5)
            nn.Linear(h, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )
        # Plain floats, not buffers: model.to(bfloat16) must not round the package's constants.
        self.mean, self.std = IMAGEREWARD_MEAN, IMAGEREWARD_STD

    def features(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        image_embeds = self.vision_model(pixel_values=pixel_values).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        text = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                 encoder_hidden_states=image_embeds, encoder_attention_mask=image_atts)
        return text.last_hidden_state[:, 0, :]

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        feats = self.features(pixel_values, input_ids, attention_mask).float()
        raw = self.mlp.layers(feats.to(self.mlp.layers[0].weight.dtype)).float().squeeze(-1)
        return (raw - self.mean) / self.std


_IR_VISION_MAP = [
    (r"^blip\.visual_encoder\.cls_token$", "vision_model.embeddings.class_embedding"),
    (r"^blip\.visual_encoder\.pos_embed$", "vision_model.embeddings.position_embedding"),
    (r"^blip\.visual_encoder\.patch_embed\.proj\.", "vision_model.embeddings.patch_embedding."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm1\.", r"vision_model.encoder.layers.\1.layer_norm1."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm2\.", r"vision_model.encoder.layers.\1.layer_norm2."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.qkv\.", r"vision_model.encoder.layers.\1.self_attn.qkv."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.proj\.", r"vision_model.encoder.layers.\1.self_attn.projection."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.mlp\.fc([12])\.", r"vision_model.encoder.layers.\1.mlp.fc\2."),
    (r"^blip\.visual_encoder\.norm\.", "vision_model.post_layernorm."),
    (r"^blip\.text_encoder\.", "text_encoder."),
    (r"^mlp\.layers\.", "mlp.layers."),
]
# Parts of BLIP_Pretrain that ImageReward.score() never uses.
_IR_UNUSED = re.compile(r"^blip\.(vision_proj|text_proj|itm_head|temp|.*queue|.*_m\.|visual_encoder_m|text_encoder_m)"
                        r"|position_ids$|^blip\.text_encoder\.pooler\.")


def convert_imagereward_state_dict(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename ImageReward.pt keys (BLIP timm-ViT + med.py BERT + MLP) to :class:`ImageRewardModel`'s.

    Unused BLIP_Pretrain parts (projections, ITM head, momentum encoders, queues) are dropped; any
    other unknown key raises ValueError rather than being silently ignored.
    """
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in sd.items():
        key = re.sub(r"^module\.", "", key)
        # The drop rule sees the checkpoint's own key, before any renaming: med.py saves its
        # position_ids buffer (blip.text_encoder.embeddings.position_ids), which the text-encoder
        # rename below would otherwise carry into the model as an unexpected key.
        if _IR_UNUSED.search(key):
            continue
        for pat, repl in _IR_VISION_MAP:
            if re.search(pat, key):
                out[re.sub(pat, repl, key)] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"unexpected keys in the ImageReward checkpoint: {unknown[:8]}")
    return out


def build_imagereward_tokenizer(source: str = BERT_BASE) -> Any:
    """bert-base-uncased with BLIP's added [DEC] (bos) and [ENC] tokens, as BLIP's init_tokenizer()."""
    from transformers import BertTokenizer

    tok = _from_pretrained(BertTokenizer.from_pretrained, source, what="imagereward tokenizer",
                           include=WEIGHTS["imagereward"][1].include)
    return add_blip_special_tokens(tok)


def add_blip_special_tokens(tok: Any) -> Any:
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tok


class ImageRewardReward(ModelReward):
    """ImageReward v1.0 (Xu et al. 2023) reimplemented on transformers' BLIP modules.

    Reproduces ImageReward.score(prompt, image): BERT tokens padded to 35, CLIP-normalised 224 px
    image, [CLS] state of the cross-attending text encoder, linear head, standardised by the
    package's mean/std. Weights: THUDM/ImageReward (ImageReward.pt, med_config.json) plus the
    bert-base-uncased tokenizer. The image-reward package itself does not import under transformers 5.
    """

    name = "imagereward"
    range = (-2.5, 2.5)  # standardised score; typical span, not a bound

    def __init__(self, *, checkpoint: str = IMAGEREWARD_REPO, filename: str = IMAGEREWARD_FILE,
                 med_config: str = IMAGEREWARD_MED_CONFIG, tokenizer_id: str = BERT_BASE,
                 model: ImageRewardModel | None = None, tokenizer: Any = None,
                 vision_config: Mapping[str, Any] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.checkpoint, self.filename, self.med_config = checkpoint, filename, med_config
        self.vision_overrides = dict(vision_config or {})  # only for non-standard (e.g. test) checkpoints
        self.tokenizer_id = tokenizer_id
        self.model, self.tokenizer = model, tokenizer

    def _load(self) -> None:
        import json

        if self.model is None:
            include = (self.filename, self.med_config)
            ckpt = resolve_file(self.checkpoint, self.filename, what="imagereward checkpoint", include=include)
            med = json.loads(resolve_file(self.checkpoint, self.med_config, what="imagereward med_config",
                                          include=include).read_text())
            sd = convert_imagereward_state_dict(_torch_load(ckpt))
            vision_cfg = imagereward_vision_config(**self.vision_overrides)
            model = ImageRewardModel(vision_cfg, imagereward_text_config(med, encoder_hidden_size=vision_cfg.hidden_size))
            missing, unexpected = model.load_state_dict(sd, strict=False)
            missing = [k for k in missing if not k.endswith("position_ids")]
            if missing or unexpected:
                raise ValueError(f"ImageReward checkpoint does not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
            self.model = model
        if self.tokenizer is None:
            self.tokenizer = build_imagereward_tokenizer(self.tokenizer_id)
        self.model = self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.image_size = int(self.model.vision_model.config.image_size)

    def _score(self, images: Tensor, prompts: list[str]) -> Tensor:
        pixels = clip_preprocess(images, self.image_size).to(self.dtype)
        tok = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=IMAGEREWARD_MAX_TOKENS,
                             return_tensors="pt")
        return self.model(pixels, tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device))


# --------------------------------------------------------------------------------------------------
# Weighted sums and registration
# --------------------------------------------------------------------------------------------------


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
