"""Weight checks: the real models' and rewards' files in the Hugging Face cache or a local directory,
never downloading, and the table of real models (repository, licence, sizes for the memory model: each
model card's ``weights``).

Every component of each real model's pipeline (its card's ``files``) is checked (solbench.models.model_files:
transformer, VAE, text encoders, tokenizers, scheduler, each shard of sharded weights), and the reward weights of
solbench.rewards.real; a missing one comes with its download command (solbench.models.hub).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from solbench.models import CardView
from solbench.models.card import ModelWeights  # noqa: F401 (the doctor's name for a card's weights)
from solbench.models.hub import download_command, hub_file, model_download_command
from solbench.models.model_files import missing_files

from .rows import FAIL, OK, WARN, Row


#: {model: ModelWeights}: each real model's card's ``weights`` (solbench/models/flux.py, sd3.py, sana.py), read live
MODEL_WEIGHTS = CardView("weights")


#: the models that ship with solbench (their card has no weights to download: the tiny model)
EMBEDDED_MODELS = CardView("embedded", lambda c: True if c.weights is None else None)


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
    weights = MODEL_WEIGHTS[key]
    if checkpoint is None and weights.repo_without_checkpoint:
        return weights.repo_without_checkpoint
    return weights.repo_id


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
