"""Weight checks: the real models' and rewards' files in the Hugging Face cache or a local directory,
never downloading, and the table of real models (repository, licence, sizes for the memory model).

Every component of the three real models' pipelines is checked (solbench.models.model_files: transformer,
VAE, text encoders, tokenizers, scheduler, each shard of sharded weights), and the reward weights of
solbench.rewards.real; a missing one comes with its download command (solbench.models.hub).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from solbench.models.hub import download_command, hub_file, model_download_command
from solbench.models.model_files import missing_files

from .rows import FAIL, OK, WARN, Row


@dataclass(frozen=True)
class ModelWeights:
    """A real model's Hugging Face repository and a memory profile for the estimates."""

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


# FLUX: 19 double + 38 single blocks of width 3072, 512 T5 tokens joined to the image tokens, VAE /8
# and 2x2 patches, guidance distilled (one forward). LoRA on to_q/k/v/to_out.0: 19 x 4 + 38 x 3 layers
# of 3072 -> 3072, r (in + out) each. SD3.5-Large: 38 joint blocks of 2432, 77 CLIP + 256 T5 tokens, CFG;
# LoRA on 38 x 4 layers. SANA: the linear-FFN SANA 1.0 1.6B Sol-RL trains (sana_main's model.checkpoint on the
# Sana_1600M pipeline; solbench.models.sana_linear), 20 blocks of 2240 over image tokens only (DC-AE /32,
# patch 1), 300 Gemma tokens by cross-attention, CFG; LoRA on 20 x 8 layers (self and cross attention).
MODEL_WEIGHTS: dict[str, ModelWeights] = {
    "flux": ModelWeights("flux", "FLUX.1-dev", "black-forest-labs/FLUX.1-dev", True,
                         "FLUX.1 [dev] Non-Commercial License (accept on the model page)", 11.9, 4.9,
                         blocks=57, hidden=3072, text_tokens=512, pixels_per_token=16, cfg=False,
                         lora_params_per_rank_m=190 * 6144 / 1e6, vae_decode_gb_1024=1.6),
    "sd3": ModelWeights("sd3", "SD3.5-Large", "stabilityai/stable-diffusion-3.5-large", True,
                        "Stability AI Community License (accept on the model page)", 8.1, 5.6,
                        blocks=38, hidden=2432, text_tokens=333, pixels_per_token=16, cfg=True,
                        lora_params_per_rank_m=152 * 4864 / 1e6, vae_decode_gb_1024=1.6),
    "sana": ModelWeights("sana", "SANA 1.0 1.6B (linear FFN)", "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers",
                         False,
                         "see the model card (NVIDIA, non-commercial)", 1.6, 2.9,
                         blocks=20, hidden=2240, text_tokens=0, pixels_per_token=32, cfg=True,
                         lora_params_per_rank_m=160 * 4480 / 1e6, vae_decode_gb_1024=1.2),
}
EMBEDDED_MODELS = ("tiny",)  # ship with solbench: nothing to download


def file_present(repo_or_dir: str, filename: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """Path of ``filename`` if a local directory or the HF cache has it; never downloads.

    ``filename`` may list alternatives separated by ``|``.
    """
    from huggingface_hub import try_to_load_from_cache

    for name in filename.split("|"):
        local = Path(repo_or_dir).expanduser()
        if local.is_dir():
            if (local / name).is_file():
                return str(local / name)
            continue
        try:
            hit = try_to_load_from_cache(repo_or_dir, name, cache_dir=cache_dir)
        except Exception:  # invalid repo id and the like
            hit = None
        if isinstance(hit, str) and Path(hit).is_file():
            return hit
    return None


def default_source(key: str, checkpoint: str | None = None) -> str:
    """The repository a run of model ``key`` loads when its spec gives no model.path: SANA without
    model.checkpoint loads the adapter's own default (SANA-1.5), with one the linear-FFN pipeline."""
    if key == "sana" and checkpoint is None:
        from solbench.models.sana import DEFAULT_ID

        return DEFAULT_ID
    return MODEL_WEIGHTS[key].repo_id


def checkpoint_present(checkpoint: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """Path of a model.checkpoint (a local file, or ``<repo id>/<file>`` in the Hugging Face cache) if it is
    here; never downloads."""
    local = Path(checkpoint).expanduser()
    if local.is_file():
        return str(local)
    in_hub = hub_file(checkpoint)
    return file_present(*in_hub, cache_dir) if in_hub else None


def check_checkpoint(key: str, checkpoint: str, *, required: bool = False,
                     cache_dir: str | os.PathLike | None = None) -> Row:
    """The row of a spec's model.checkpoint (the native SANA checkpoint Sol-RL's SANA runs load)."""
    found = checkpoint_present(checkpoint, cache_dir)
    if found:
        return Row("models", f"{key} checkpoint", OK, f"model.checkpoint {checkpoint}: present ({found})")
    in_hub = hub_file(checkpoint)
    fix = download_command(in_hub[0], [in_hub[1]]) if in_hub else "set model.checkpoint to an existing file"
    return Row("models", f"{key} checkpoint", FAIL if required else WARN,
               f"model.checkpoint {checkpoint}: not found (a local file, or <repo id>/<file> in the Hugging Face "
               "cache; nothing is downloaded at run time)", fix)


def check_model_weights(models: Mapping[str, str | None] | None = None, *, required: bool = False,
                        cache_dir: str | os.PathLike | None = None,
                        checkpoints: Mapping[str, str] | None = None) -> list[Row]:
    """Rows for real models: ``models`` maps model name -> local path/repo override (None = default);
    ``checkpoints`` model name -> model.checkpoint, whose transformer comes from that file (the pipeline's
    transformer folder then needs only its config) and is checked on its own row.

    Without ``models``, all three real models are listed (as warnings when missing).
    """
    if models is None:
        models = {key: None for key in MODEL_WEIGHTS}
    checkpoints = dict(checkpoints or {})
    rows = []
    for key, override in models.items():
        if key in EMBEDDED_MODELS:
            rows.append(Row("models", key, OK, "embedded in solbench (no download)"))
            continue
        mw = MODEL_WEIGHTS.get(key)
        if mw is None:
            rows.append(Row("models", key, WARN, "unknown model: presence not checked"))
            continue
        checkpoint = checkpoints.get(key)
        default = default_source(key, checkpoint)
        source = override or default
        missing = missing_files(key, lambda name: file_present(source, name, cache_dir),  # every component
                                transformer_weights=checkpoint is None)
        label = f"{mw.label if default == mw.repo_id else key} ({source})"
        if not missing:
            rows.append(Row("models", key, OK, f"{label}: present"))
        else:
            gate = " Gated: accept the licence on huggingface.co, then `hf auth login`." if mw.gated else ""
            fix = model_download_command(default) if override is None or not Path(override).expanduser().is_dir() \
                else f"complete the local directory {override}"
            rows.append(Row("models", key, FAIL if required else WARN,
                            f"{label}: missing {', '.join(missing[:2])}{'...' if len(missing) > 2 else ''}.{gate}", fix))
        if checkpoint is not None:
            rows.append(check_checkpoint(key, checkpoint, required=required, cache_dir=cache_dir))
    return rows


def check_reward_weights(names: Iterable[str] | None = None, *, required: bool = False,
                         cache_dir: str | os.PathLike | None = None) -> list[Row]:
    """Rows for the real rewards' weights (solbench.rewards.real.WEIGHTS); other rewards are embedded."""
    from solbench.rewards.real import WEIGHTS

    names = list(WEIGHTS) if names is None else list(names)
    rows = []
    for name in names:
        sources = WEIGHTS.get(name)
        if sources is None:
            rows.append(Row("rewards", name, OK, "embedded reward (no weights to download)"))
            continue
        missing = [(s, [f for f in s.files if not file_present(s.repo_id, f, cache_dir)]) for s in sources]
        missing = [(s, fs) for s, fs in missing if fs]
        if not missing:
            rows.append(Row("rewards", name, OK, "present: " + ", ".join(s.repo_id for s in sources)))
            continue
        detail = "; ".join(f"{s.repo_id} lacks {', '.join(fs)}" for s, fs in missing)
        fix = " && ".join(s.command() for s, _ in missing)
        rows.append(Row("rewards", name, FAIL if required else WARN, detail, fix))
    return rows
