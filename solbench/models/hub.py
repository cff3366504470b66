"""Weights on this machine only: the Hugging Face cache, local folders and files, and the command that
fetches what is missing.

solbench never downloads during a run. Models (solbench.models), rewards (solbench.rewards.real) and
the doctor load through here: a missing file is a MissingWeightsError that names the repository and
the exact ``hf download`` command. A leaf module: it imports nothing of solbench but its errors.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from solbench.errors import MissingWeightsError

# What the diffusers-layout runs never read: the single-file checkpoints (and SD3.5's duplicate
# text encoders), 24 to 30 GB per model. The doctor's and the loaders' download commands exclude them.
MODEL_DOWNLOAD_EXCLUDES: dict[str, tuple[str, ...]] = {
    "black-forest-labs/FLUX.1-dev": ("flux1-dev.safetensors", "ae.safetensors"),
    "stabilityai/stable-diffusion-3.5-large": ("sd3.5_large*.safetensors", "text_encoders/*"),
}


def hub_file(reference: str) -> tuple[str, str] | None:
    """(repo id, file in it) of a ``<owner>/<repo>/<path in repo>`` reference (model.checkpoint's form for a
    file in the Hugging Face cache); None for a local path (absolute, relative or ~) or anything shorter."""
    parts = reference.split("/")
    if len(parts) >= 3 and not reference.startswith(("/", ".", "~")):
        return "/".join(parts[:2]), "/".join(parts[2:])
    return None


def download_command(repo_id: str, include: Sequence[str] = ()) -> str:
    """The shell command that puts ``repo_id`` (or the ``include`` patterns of it) in the HF cache.

    Each pattern gets its own ``--include``: ``hf download`` (huggingface_hub >= 1.0) reads
    ``--include a b`` as the pattern ``a`` plus a file named ``b`` to fetch, and then ignores the
    pattern, so the space-separated form silently downloads the wrong files.
    """
    return f"hf download {repo_id}" + "".join(f" --include '{p}'" for p in include)


# The laion ViT-H-14 repository serves only its tokenizer (and processor config); AutoTokenizer also


def model_download_command(repo_id: str, layout_of: str | None = None) -> str:
    """``hf download`` of a model repository without the files the diffusers layout never reads
    (those of ``layout_of``'s layout, default ``repo_id``'s own: a copy of FLUX.1-dev under another
    name skips the same checkpoints)."""
    excludes = MODEL_DOWNLOAD_EXCLUDES.get(layout_of or repo_id, ())
    return download_command(repo_id) + "".join(f" --exclude '{p}'" for p in excludes)


def missing_weights(what: str, repo_id: str, filename: str | None, include: Sequence[str] = (), cause: str = "") -> MissingWeightsError:
    """The error for weights absent from this machine, with the command that fetches them."""
    target = f"{filename} from {repo_id}" if filename else repo_id
    msg = (
        f"{what}: {target} is not on this machine (looked in the Hugging Face cache "
        f"{hub_cache()} and, for local paths, on disk; solbench never downloads during a run).\n"
        f"  Fetch it once with:  {download_command(repo_id, include)}\n"
        f"  (`hf` is the CLI of huggingface_hub >= 1.0; set HF_HOME to use another cache, or pass a local "
        f"directory/file.)"
    )
    if cause:
        msg += f"\n  Loader said: {cause}"
    return MissingWeightsError(msg)


def hub_cache() -> str:
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
        raise missing_weights(what, str(source), filename, include or (filename,), cause=f"{type(err).__name__}") from err


def from_pretrained_local(loader: Callable[..., Any], source: str, *, what: str, include: Sequence[str] = (), **kwargs) -> Any:
    """``loader(source, local_files_only=True)``, turning 'not found' into MissingWeightsError."""
    try:
        return loader(source, local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        if Path(source).expanduser().exists():
            raise MissingWeightsError(f"{what}: could not load {source}: {err}") from err
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise missing_weights(what, source, None, include, cause=first[:300]) from err


def load_state_dict_file(path: Path) -> dict[str, Tensor]:
    """A torch checkpoint's state dict on CPU (unwrapping ``state_dict`` and DDP's ``module.`` prefix)."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    return {re.sub(r"^module\.", "", k): v for k, v in obj.items()}
