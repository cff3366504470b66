"""A model card: everything generic code needs to know about one model, in one place.

Each adapter module holds its model's ``CARD`` (solbench/models/tiny_adapter.py, flux.py, sd3.py, sana.py);
solbench.models finds them (``cards()``, ``card(name)``) and every generic module reads the card instead of a
per-model table of its own: expansion (micro-batches, native resolution, LoRA init, text length, the settings
only some models have), the builder, the FLOP counter (solbench.models.flops), the activation profiles'
probe (solbench.models.activations, solbench.measure.activation_probe), the doctor's weight and file checks
(solbench.doctor.weights, solbench.models.model_files), the published-shape builder
(solbench.measure.published) and the default explore recipe (``solbench fidelity``, the facts collect records).
Adding a model is its adapter module with a CARD, plus its tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelCard", "ModelWeights", "Probe", "OPTIONAL_SETTINGS"]

#: ModelConfig settings only some models have; a card lists the ones its model reads (``ModelCard.settings``).
OPTIONAL_SETTINGS = ("text_max_length", "prompt_instruction", "checkpoint")


@dataclass(frozen=True)
class ModelWeights:
    """A real model's Hugging Face repository and a memory profile for the doctor's estimates."""

    key: str  # ModelConfig.name
    label: str
    repo_id: str
    gated: bool
    licence: str
    transformer_b: float  # parameters of the policy transformer, billions
    frozen_b: float  # text encoders + VAE, billions
    # activation model (docs/real-models.md, "Memory per rank"): transformer blocks, hidden width,
    # text tokens in the joint sequence, latent pixels per token side at the native resolution
    blocks: int = 0
    hidden: int = 0
    text_tokens: int = 0
    pixels_per_token: int = 16  # VAE downsampling x patch size
    native_resolution: int = 1024
    cfg: bool = False  # classifier-free guidance: two forwards per sample (rollouts and losses)
    lora_params_per_rank_m: float = 0.0  # LoRA parameters per unit of rank on the default targets, millions
    vae_decode_gb_1024: float = 1.5  # VAE decoder activation per image at 1024 px, bf16
    # the repository a run loads when its spec gives neither model.path nor model.checkpoint, where that is
    # not ``repo_id`` (SANA: the adapter's SANA-1.5 default; with a checkpoint, the linear-FFN pipeline repo_id)
    repo_without_checkpoint: str | None = None


@dataclass(frozen=True)
class Probe:
    """How to run a model's transformer at small width (solbench.measure.activation_probe): config overrides
    of its published config (solbench/models/published/<model>.json, whose transformer class decides the
    forward's inputs) that keep every per-head width and ratio, the probe's width, the latent side per
    image-token count, how many blocks of each kind the published model has and the kind of a distinct last
    block (SD3's context-pre-only one)."""

    overrides: dict
    width: int
    latent_side: dict  # image tokens -> latent side (height = width) of the probe's input
    block_count: Callable[[str, dict], int] = field(default=lambda kind, config: config["num_layers"])
    last_block_suffix: str | None = None  # appended to the last block's kind when it differs (SD3)


@dataclass(frozen=True)
class ModelCard:
    """One model's defaults and descriptions (module docstring). ``None`` means the model has no such thing
    (the tiny model has no weights to download, no files to check, no native resolution to default to)."""

    name: str  # ModelConfig.name
    build: Callable[[Any, Any, Any], Any]  # (ModelConfig, torch.device, full dtype) -> ModelAdapter
    explore_recipe: str  # the explore recipe where neither a run nor a command names one (its *_main.yaml's)
    lora_init: str = "gaussian"  # finetune.lora_init when unset (solbench.models.LORA_INITS)
    # per-rank micro-batches a spec that sets none gets (rollout, reward, train; None = the whole batch)
    micro_batch: Mapping[str, int | None] = field(default_factory=lambda: {"rollout": None, "reward": None,
                                                                           "train": None})
    native_resolution: int | None = None  # pixels, when model.resolution is unset
    text_max_length: int | None = None  # T5 / Gemma tokens of an unset model.text_max_length
    text_prefix_tokens: int = 0  # tokens the transformer sees before those (SD3: CLIP-L/G's 77)
    settings: tuple[str, ...] = ()  # the OPTIONAL_SETTINGS this model reads
    setting_defaults: Mapping[str, Any] = field(default_factory=dict)  # other model.* values expansion writes out
    adapter: type | None = None  # the adapter class (from_components: solbench.measure.published)
    pipeline: str | None = None  # the diffusers pipeline class a download loads
    weights: ModelWeights | None = None  # None: embedded in solbench, nothing to download
    files: Mapping[str, tuple[str, ...]] | None = None  # component folder -> files (solbench.models.model_files)
    transformer: Any = None  # solbench.models.flops.RealModelSpec: the published architecture (FLOP formula)
    # (resolution, path, text_tokens) -> (diffusers class, config, shape key), for a model whose architecture
    # comes from its weights (the tiny model); None: from ``transformer``
    architecture: Callable[..., tuple[str, dict, tuple]] | None = None
    vae: str | None = None  # the decoder's key in solbench.models.flops.VAE_CONFIGS
    probe: Probe | None = None  # how the activation profile is measured
    order: int = 100  # where listings put it (the tiny model first, then the paper's order: FLUX.1, SD3.5, SANA)

    def __post_init__(self) -> None:
        unknown = set(self.settings) - set(OPTIONAL_SETTINGS)
        if unknown:
            raise ValueError(f"model card {self.name!r}: unknown settings {sorted(unknown)} "
                             f"(known: {', '.join(OPTIONAL_SETTINGS)})")
