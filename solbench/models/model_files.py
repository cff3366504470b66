"""The files a real model's diffusers-layout download must hold, component by component.

A run loads the whole pipeline (``DiffusersPipeline.from_pretrained(..., local_files_only=True)``):
transformer, VAE, every text encoder and tokenizer, and the scheduler. ``solbench doctor`` checks each
of them here, so a download that lacks a text encoder (an interrupted ``hf download``, a too narrow
``--include``) fails the doctor instead of the run at launch. Sharded weights are checked shard by
shard: an index names its shards (``weight_map``) and every one must be there.

Each model card's ``files`` gives its layout (that of the published repository in diffusers format: FLUX.1-dev,
SD3.5-Large, SANA 1.0 and SANA-1.5 1.6B), built from the component layouts here; ``a|b`` means either file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from solbench.models import CardView, card

__all__ = ["COMPONENTS", "missing_files", "DIFFUSERS_MODEL", "TEXT_MODEL", "CLIP_TOKENIZER", "T5_TOKENIZER",
           "GEMMA_TOKENIZER", "SCHEDULER"]

_DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors.index.json|diffusion_pytorch_model.safetensors"
_WEIGHTS = "model.safetensors.index.json|model.safetensors"
# The component layouts a model card's ``files`` is made of (component folder -> these files)
DIFFUSERS_MODEL = ("config.json", _DIFFUSERS_WEIGHTS)
TEXT_MODEL = ("config.json", _WEIGHTS)
CLIP_TOKENIZER = ("tokenizer_config.json", "vocab.json", "merges.txt")
T5_TOKENIZER = ("tokenizer_config.json", "spiece.model|tokenizer.json")
GEMMA_TOKENIZER = ("tokenizer_config.json", "tokenizer.model|tokenizer.json")
SCHEDULER = ("scheduler_config.json",)


#: model key -> {component folder: files it must hold}: each model card's ``files``, read live
COMPONENTS = CardView("files")


def missing_files(model: str, find: Callable[[str], str | None], *, transformer_weights: bool = True) -> list[str]:
    """The files of ``model``'s pipeline that are absent, as paths inside the repository.
    ``transformer_weights=False``: the transformer comes from elsewhere (model.checkpoint), so its folder
    needs only its config.json.

    ``find(relative_path)`` returns the local path of a file (alternatives with ``|``) or None
    (solbench.doctor.file_present bound to a repository or folder). ``model_index.json`` comes first,
    then each component's files, then the shards its weight indices name.
    """
    missing = [] if find("model_index.json") else ["model_index.json"]
    for folder, files in card(model).files.items():
        if folder == "transformer" and not transformer_weights:
            files = ("config.json",)
        for name in files:
            wanted = "|".join(f"{folder}/{alt}" for alt in name.split("|"))
            found = find(wanted)
            if found is None:
                missing.append(wanted)
            elif found.endswith(".index.json"):
                missing += [f"{folder}/{shard}" for shard in _shards(found) if find(f"{folder}/{shard}") is None]
    return missing


def _shards(index_path: str | os.PathLike) -> list[str]:
    """The shard files a safetensors index names (none if it cannot be read)."""
    try:
        weight_map = json.loads(Path(index_path).read_text()).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return []
    return sorted(set(weight_map.values()))
