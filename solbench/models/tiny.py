"""The embedded world's base model: a tiny pixel-space FluxTransformer2DModel and its text encoder.

Why a real diffusers architecture: LoRA targets, quantized copies and the adapter code exercised on
this model are the very ones FLUX.1 uses; only the sizes differ. The model is a rectified-flow
velocity predictor in pixel space (no VAE): a 32x32 RGB image in [-1, 1] is cut into 4x4 patches,
giving 64 tokens of 48 channels, with FLUX's 3-axis RoPE ids (0, row, column). Text is a word-level
tokenizer over the shapes grammar plus a one-layer transformer encoder (token states for joint
attention, their mean as FLUX's pooled projection). Both are pretrained together by
scripts/pretrain_tiny.py and shipped in solbench/assets/ (tiny_t2i.safetensors + tiny_t2i.json).

Conventions (docs/architecture.md): t in [0, 1] with t = 1 pure noise, x_t = (1 - t) x0 + t eps,
velocity v ~ eps - x0; the empty prompt "" is the unconditional prompt used for CFG.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor, nn

from solbench.models.batch_invariance import invariant_batch
from solbench.text.bounded_text import clip
from solbench.errors import ConfigError, MissingWeightsError
from solbench.models.base import shifted_sigmas

ASSET_NAME = "tiny_t2i"


def _grammar_vocabulary() -> list[str]:
    from solbench.world.grammar import NUMBER_WORDS, RELATIONS
    from solbench.world.scenes import COLOURS, SHAPES

    words = ["a", "an", "and", *NUMBER_WORDS.values(), *COLOURS, *SHAPES, *(s + "s" for s in SHAPES)]
    for relation in RELATIONS:
        words += relation.split()
    return sorted(set(words))


@dataclass
class TinyT2IConfig:
    """Sizes of the tiny model; stored next to the weights as tiny_t2i.json."""

    resolution: int = 32
    channels: int = 3
    patch_size: int = 4  # pixels per side of an image token
    num_layers: int = 2  # FLUX double-stream blocks
    num_single_layers: int = 2
    num_attention_heads: int = 4
    attention_head_dim: int = 32
    axes_dims_rope: tuple[int, int, int] = (8, 12, 12)  # sums to attention_head_dim
    text_dim: int = 64
    text_heads: int = 4
    text_layers: int = 1
    max_length: int = 10  # words; longer prompts are truncated
    shift: float = 1.0  # the sampling sigma-schedule shift this model is meant to be sampled with
    vocabulary: list[str] = field(default_factory=_grammar_vocabulary)

    @property
    def tokens_per_side(self) -> int:
        return self.resolution // self.patch_size

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """Per-sample shape the sampler works in (pixel space: the image itself)."""
        return (self.channels, self.resolution, self.resolution)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["latent_shape"] = list(self.latent_shape)  # exported for readers of the JSON
        return d

    @classmethod
    def from_dict(cls, data: dict, source: str | Path = "tiny model config") -> "TinyT2IConfig":
        """The config of ``data`` (a tiny_t2i.json), checked against solbench.models.tiny_bounds before anything
        is built: ConfigError naming ``source``, what is out of bounds and the parameters it would build."""
        from solbench.models.tiny_bounds import config_problem

        problem = config_problem(data, asdict(cls()))
        if problem:
            raise ConfigError(f"{source}: {problem}")
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "axes_dims_rope" in kwargs:
            kwargs["axes_dims_rope"] = tuple(kwargs["axes_dims_rope"])
        return cls(**kwargs)


class WordTokenizer:
    """Whitespace word tokenizer over a fixed vocabulary; id 0 pads, id 1 is an unknown word."""

    PAD, UNK = "<pad>", "<unk>"

    def __init__(self, vocabulary: Sequence[str], max_length: int):
        self.itos = [self.PAD, self.UNK, *vocabulary]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.itos)

    def __call__(self, prompts: Sequence[str]) -> Tensor:
        """Token ids [B, max_length] (long), padded with 0."""
        ids = torch.zeros((len(prompts), self.max_length), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            words = prompt.lower().replace(".", " ").replace(",", " ").split()[: self.max_length]
            ids[row, : len(words)] = torch.tensor([self.stoi.get(w, 1) for w in words], dtype=torch.long)
        return ids


class TinyTextEncoder(nn.Module):
    """Word embeddings + learned positions + a pre-norm transformer layer; pooled = mean of states."""

    def __init__(self, vocab_size: int, cfg: TinyT2IConfig):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.text_dim)
        self.position = nn.Parameter(torch.zeros(cfg.max_length, cfg.text_dim))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(
            cfg.text_dim, cfg.text_heads, 4 * cfg.text_dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, cfg.text_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.text_dim)

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        # The batch is padded with empty prompts to a row count that CPU GEMM kernels treat like any
        # other (solbench.models.batch_invariance): the encoder layer's fused inference path runs its
        # projections as functions, which the engine's per-layer row padding cannot reach, and at
        # one prompt's 10 rows AMD's MKL kernel gives other bits with 1 thread than with 2, so the
        # same prompt was encoded differently by a 1-thread rank (or worker) and a 2-thread process.
        batch = ids.shape[0]
        padded = invariant_batch(batch, ids.shape[1]) if batch else 0
        if padded > batch:
            ids = torch.cat([ids, ids.new_zeros(padded - batch, ids.shape[1])])
        states = self.norm(self.layers(self.embed(ids) + self.position))[:batch]
        return states, states.mean(dim=1)


def build_transformer(cfg: TinyT2IConfig) -> nn.Module:
    from diffusers import FluxTransformer2DModel

    patch_channels = cfg.channels * cfg.patch_size**2
    return FluxTransformer2DModel(
        patch_size=1,  # tokens are packed by TinyT2I, as FLUX packs 2x2 latent patches
        in_channels=patch_channels,
        out_channels=patch_channels,
        num_layers=cfg.num_layers,
        num_single_layers=cfg.num_single_layers,
        attention_head_dim=cfg.attention_head_dim,
        num_attention_heads=cfg.num_attention_heads,
        joint_attention_dim=cfg.text_dim,
        pooled_projection_dim=cfg.text_dim,
        guidance_embeds=False,
        axes_dims_rope=tuple(cfg.axes_dims_rope),
    )


class TinyT2I(nn.Module):
    """Tiny text-to-image flow model: .transformer (FluxTransformer2DModel), .text_encoder, .tokenizer."""

    def __init__(self, cfg: TinyT2IConfig | None = None):
        super().__init__()
        self.config = cfg or TinyT2IConfig()
        self.tokenizer = WordTokenizer(self.config.vocabulary, self.config.max_length)
        self.text_encoder = TinyTextEncoder(len(self.tokenizer), self.config)
        self.transformer = build_transformer(self.config)
        n = self.config.tokens_per_side
        rows, cols = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).float()
        self.register_buffer("img_ids", img_ids, persistent=False)
        self.register_buffer("txt_ids", torch.zeros(self.config.max_length, 3), persistent=False)

    # -- packing: [B, C, R, R] <-> [B, (R/p)^2, C p^2], row-major tokens like FLUX's _pack_latents
    def pack(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        p = self.config.patch_size
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def unpack(self, tokens: Tensor) -> Tensor:
        b = tokens.shape[0]
        p, n, c = self.config.patch_size, self.config.tokens_per_side, self.config.channels
        x = tokens.reshape(b, n, n, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, c, n * p, n * p)

    def encode(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """(token states [B, L, D], pooled [B, D]) of the prompts; "" is the unconditional prompt."""
        device = self.img_ids.device
        return self.text_encoder(self.tokenizer(list(prompts)).to(device))

    def velocity(self, transformer: nn.Module, x: Tensor, t: Tensor, tokens: Tensor, pooled: Tensor) -> Tensor:
        """Velocity [B, 3, R, R] (float32) at x [B, 3, R, R] in [-1, 1] pixel space and times t [B].

        `transformer` is this model's transformer or any stand-in with its call signature (a
        peft-LoRA wrapper, a quantized copy, an EMA copy): it runs in its own parameter dtype.
        """
        dtype = next(transformer.parameters()).dtype
        t = t.reshape(-1).to(x.device, dtype)
        if t.numel() == 1 and x.shape[0] > 1:
            t = t.expand(x.shape[0])
        out = transformer(
            hidden_states=self.pack(x.to(dtype)),
            encoder_hidden_states=tokens.to(dtype),
            pooled_projections=pooled.to(dtype),
            timestep=t,  # FLUX scales by 1000 inside, so [0, 1] is its native range
            img_ids=self.img_ids.to(dtype),
            txt_ids=self.txt_ids[: tokens.shape[1]].to(dtype),
            return_dict=False,
        )[0]
        return self.unpack(out).float()

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        noise: Tensor,
        steps: int = 10,
        guidance: float | None = None,
        transformer: nn.Module | None = None,
        shift: float | None = None,
    ) -> Tensor:
        """Images [B, 3, R, R] in [0, 1] by Euler steps on the 1 -> 0 time grid from `noise`.

        A reference sampler for evaluation and tests (the engine has the full set); `guidance` is
        the classifier-free guidance scale w: v = v_uncond + w (v_cond - v_uncond); `shift` the
        sigma-schedule shift (None: the model's `config.shift`; 1: a uniform grid).
        """
        net = transformer if transformer is not None else self.transformer
        tokens, pooled = self.encode(prompts)
        if guidance is not None:
            u_tokens, u_pooled = self.encode([""] * len(prompts))
        x = noise.to(self.img_ids.device, torch.float32)
        shift = self.config.shift if shift is None else shift
        ts = torch.linspace(1.0, 0.0, steps + 1) if shift == 1.0 else shifted_sigmas(steps, shift)
        for t, t_next in zip(ts[:-1], ts[1:]):
            tb = torch.full((x.shape[0],), float(t), device=x.device)
            v = self.velocity(net, x, tb, tokens, pooled)
            if guidance is not None:
                v_u = self.velocity(net, x, tb, u_tokens, u_pooled)
                v = v_u + guidance * (v - v_u)
            x = x + (t_next - t) * v
        return ((x + 1) / 2).clamp(0, 1)


def asset_path(name: str) -> Path:
    """Path of a shipped asset file (it may not exist yet)."""
    return Path(str(resources.files("solbench") / "assets" / name))


def save_tiny(model: TinyT2I, weights: Path, config: Path) -> None:
    """Write the weights (safetensors, text_encoder.* and transformer.* keys) and the JSON config."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(weights), metadata={"format": "pt", "model": "solbench.models.tiny.TinyT2I"})
    config.write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")


def tiny_weights_folder_problem(folder: str | Path) -> str | None:
    """Why `folder` cannot serve as tiny-model weights (None when it can): it must hold
    tiny_t2i.safetensors and tiny_t2i.json, as `scripts/pretrain_tiny.py --out FOLDER` writes them."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return f"{folder} is not a folder"
    missing = [n for n in (f"{ASSET_NAME}.safetensors", f"{ASSET_NAME}.json") if not (folder / n).is_file()]
    if missing:
        return f"{folder} lacks {' and '.join(missing)} (written by `scripts/pretrain_tiny.py --out {folder}`)"
    return _config_problem(folder / f"{ASSET_NAME}.json")


def _config_problem(path: Path) -> str | None:
    """Why the tiny_t2i.json at ``path`` is not a config within solbench.models.tiny_bounds (None when it is)."""
    from solbench.models.tiny_bounds import config_problem, read_config

    data, unreadable = read_config(path)
    if unreadable:
        return unreadable
    problem = config_problem(data, asdict(TinyT2IConfig()))
    return problem and f"{path}: {problem}"


def load_tiny(pretrained: bool = True, device: str | torch.device = "cpu", folder: str | Path | None = None) -> TinyT2I:
    """The tiny model: shipped pretrained weights, or (pretrained=False) a seeded random init.

    `folder`: load another variant's weights instead of the shipped ones (a folder holding
    tiny_t2i.safetensors and tiny_t2i.json, as `scripts/pretrain_tiny.py --out` writes them).
    The random init uses its own RNG state (seed 0) and leaves the global one untouched, so fast
    tests get the same model every time.
    """
    if not pretrained:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = TinyT2I()
        return model.to(device).eval()
    if folder is not None:
        problem = tiny_weights_folder_problem(folder)
        if problem:
            raise MissingWeightsError(f"tiny model weights: {problem}")
        folder = Path(folder).expanduser()
        weights, config = folder / f"{ASSET_NAME}.safetensors", folder / f"{ASSET_NAME}.json"
    else:
        weights, config = asset_path(f"{ASSET_NAME}.safetensors"), asset_path(f"{ASSET_NAME}.json")
        if not weights.is_file() or not config.is_file():
            raise MissingWeightsError(
                f"the tiny model's weights are missing ({weights} / {config.name}); they ship with the "
                f"package: reinstall solbench, or recreate them with `python scripts/pretrain_tiny.py`."
            )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from solbench.models.tiny_bounds import read_config

    data, unreadable = read_config(config)
    if unreadable:
        raise ConfigError(f"tiny model weights: {unreadable}")
    cfg = TinyT2IConfig.from_dict(data, config)  # within bounds before anything is allocated
    with torch.random.fork_rng(devices=[]):
        model = TinyT2I(cfg)
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise MissingWeightsError(f"{weights} is no safetensors weights file ({clip(err, 120)}); recreate it with "
                                  "`python scripts/pretrain_tiny.py --out FOLDER`") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise MissingWeightsError(
            f"{weights} does not match TinyT2I: missing keys {clip(missing[:5])}, unexpected keys "
            f"{clip(unexpected[:5])}; "
            f"recreate it with `python scripts/pretrain_tiny.py`."
        )
    return model.to(device).eval()
