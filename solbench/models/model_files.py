"""The files a real model's diffusers-layout download must hold, component by component.

A run loads the whole pipeline (``DiffusersPipeline.from_pretrained(..., local_files_only=True)``):
transformer, VAE, every text encoder and tokenizer, and the scheduler. ``solbench doctor`` checks each
of them here, so a download that lacks a text encoder (an interrupted ``hf download``, a too narrow
``--include``) fails the doctor instead of the run at launch. Sharded weights are checked shard by
shard: an index names its shards (``weight_map``) and every one must be there.

The layouts are those of the published repositories (FLUX.1-dev, SD3.5-Large, SANA 1.0 and SANA-1.5 1.6B in
diffusers format); ``a|b`` means either file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["COMPONENTS", "missing_files"]

_DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors.index.json|diffusion_pytorch_model.safetensors"
_WEIGHTS = "model.safetensors.index.json|model.safetensors"
_DIFFUSERS_MODEL = ("config.json", _DIFFUSERS_WEIGHTS)
_TEXT_MODEL = ("config.json", _WEIGHTS)
_CLIP_TOKENIZER = ("tokenizer_config.json", "vocab.json", "merges.txt")
_T5_TOKENIZER = ("tokenizer_config.json", "spiece.model|tokenizer.json")
_GEMMA_TOKENIZER = ("tokenizer_config.json", "tokenizer.model|tokenizer.json")
_SCHEDULER = ("scheduler_config.json",)

#: model key -> {component folder: files it must hold}
COMPONENTS: dict[str, dict[str, tuple[str, ...]]] = {
    # FluxPipeline: CLIP-L (text_encoder) and T5-XXL (text_encoder_2)
    "flux": {"transformer": _DIFFUSERS_MODEL, "vae": _DIFFUSERS_MODEL, "text_encoder": _TEXT_MODEL,
             "text_encoder_2": _TEXT_MODEL, "tokenizer": _CLIP_TOKENIZER, "tokenizer_2": _T5_TOKENIZER,
             "scheduler": _SCHEDULER},
    # StableDiffusion3Pipeline: CLIP-L, CLIP-G (text_encoder_2) and T5-XXL (text_encoder_3)
    "sd3": {"transformer": _DIFFUSERS_MODEL, "vae": _DIFFUSERS_MODEL, "text_encoder": _TEXT_MODEL,
            "text_encoder_2": _TEXT_MODEL, "text_encoder_3": _TEXT_MODEL, "tokenizer": _CLIP_TOKENIZER,
            "tokenizer_2": _CLIP_TOKENIZER, "tokenizer_3": _T5_TOKENIZER, "scheduler": _SCHEDULER},
    # SanaPipeline: Gemma-2 2B
    "sana": {"transformer": _DIFFUSERS_MODEL, "vae": _DIFFUSERS_MODEL, "text_encoder": _TEXT_MODEL,
             "tokenizer": _GEMMA_TOKENIZER, "scheduler": _SCHEDULER},
}


def missing_files(model: str, find: Callable[[str], str | None], *, transformer_weights: bool = True) -> list[str]:
    """The files of ``model``'s pipeline that are absent, as paths inside the repository.
    ``transformer_weights=False``: the transformer comes from elsewhere (model.checkpoint), so its folder
    needs only its config.json.

    ``find(relative_path)`` returns the local path of a file (alternatives with ``|``) or None
    (solbench.doctor.file_present bound to a repository or folder). ``model_index.json`` comes first,
    then each component's files, then the shards its weight indices name.
    """
    missing = [] if find("model_index.json") else ["model_index.json"]
    for folder, files in COMPONENTS[model].items():
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
