"""Pre-flight checks for a machine before a long job (``solbench doctor [SPEC]``).

Every check is a plain function returning :class:`Row` objects, so the checks are testable without
the hardware they describe (pass a fake ``cuda`` namespace) and the CLI only formats them. A row
says what was checked, what was found, and, when something is missing, how to get it. A row with
``status == "fail"`` is something the given spec needs and this machine lacks; the command then
exits non-zero. Without a spec, nothing is required and missing things are warnings.

What is checked:
- GPUs (``torch.cuda``): name, compute capability, the low-precision formats its tensor cores run
  natively (Blackwell sm_100/sm_103/sm_110/sm_120/sm_121: NVFP4, MXFP4, FP8, BF16; Hopper sm_90 and
  Ada sm_89: FP8, BF16; Ampere sm_8x: BF16), free memory.
- Packages: torch (and its CUDA build), transformers, diffusers, and transformer-engine: installed
  (with TE's documented ``pip install --no-build-isolation`` command when not) and importing
  ``transformer_engine.pytorch`` (the error when it does not).
- Weights in the Hugging Face cache or a local directory, never downloading: every component of the
  three real models' pipelines (solbench.models.model_files: transformer, VAE, text encoders, tokenizers,
  scheduler, each shard of sharded weights) and the reward weights of solbench.rewards.real.
- Prompt files a spec names (train_prompts / eval.prompts as .txt/.jsonl paths).
- Memory per rank, itemised for the largest run of each model (``memory_items``): weights per copy
  (policy, LoRA and optimizer, explore copy at its format's bits, text encoders/VAE), reward models
  (one instance each), the prompt cache, activations per phase at the spec's micro-batches and
  resolution, and a fixed overhead; the sum against each GPU's free memory and against B200/H100.

The estimates are rough (+-20 %): they catch "this cannot fit" and show what each setting costs,
not fine margins (docs/real-models.md, "Memory per rank").

This package: the checks, one kind a module (``gpu``, ``packages``, ``weights``, ``needs``: the spec's
needs and its own checks, ``memory``: the memory model), their ``Row`` (``rows``), and here
``run_checks``, which runs them all. Every name is importable from ``solbench.doctor`` as before.

Stage ``doctor`` (solbench/stages.py): it imports its own modules and the stages below it, launch, collect, spec,
train, method, engine, rewards, models, quant, world, report, results, machine, text, base.
"""

from __future__ import annotations

import dataclasses  # noqa: F401 (solbench.doctor.dataclasses and .importlib, reached through this module, as before)
import importlib  # noqa: F401
import importlib.metadata  # noqa: F401
import importlib.util  # noqa: F401
import os
from collections.abc import Sequence
from typing import Any

from solbench.models.hub import MODEL_DOWNLOAD_EXCLUDES, model_download_command  # noqa: F401 (importable here too)

from .gpu import _gib, check_gpus, native_formats, recipe_format
from .memory import (GPU_MEMORY_GB, REWARD_PARAMS_B, _bits, _host_memory, check_memory, estimate_gpu_gb,
                     estimate_host_gb, estimate_total_gb, memory_items, merged_copy_fits, merged_copy_gb,
                     profile_from_needs, worst_profile)
from .needs import (MemoryProfile, SpecNeeds, _add_run, _merged, _minimal_spec_needs, _runs_cfg, _whole_batch,
                    check_prompt_files, check_spec, run_profile, spec_needs)
from .packages import (GPU_EXTRA, REFERENCE_REWARD_PACKAGES, TE_INSTALL, _version, check_packages,
                       te_import_error)
from .rows import FAIL, INFO, OK, WARN, Row
from .weights import (EMBEDDED_MODELS, MODEL_WEIGHTS, ModelWeights, check_checkpoint, check_model_weights,
                      check_reward_weights, checkpoint_present, default_source, file_present)

__all__ = [
    "OK", "WARN", "FAIL", "INFO", "Row", "SpecNeeds", "ModelWeights", "MODEL_WEIGHTS", "EMBEDDED_MODELS",
    "native_formats", "recipe_format", "check_gpus", "check_packages", "check_model_weights",
    "check_reward_weights", "check_memory", "check_spec", "spec_needs", "estimate_gpu_gb", "estimate_host_gb",
    "file_present", "run_checks", "exit_code",
]


def run_checks(spec: str | os.PathLike | None = None, *, cuda: Any = None,
               cache_dir: str | os.PathLike | None = None) -> list[Row]:
    """Every check, against the spec's needs when a spec is given."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    needs = spec_needs(spec) if spec is not None else None
    rows = check_gpus(cuda)
    if needs is not None and needs.gpu and not cuda.is_available():
        rows[0].status = FAIL
    rows += check_packages(cuda_available=cuda.is_available(), need_te=bool(needs and needs.te))
    if needs is None:
        rows += check_model_weights(None, cache_dir=cache_dir)
        rows += check_reward_weights(None, cache_dir=cache_dir)
        rows += check_memory(None, cuda)
    else:
        rows += check_spec(needs, cuda)
        rows += check_prompt_files(needs)
        rows += check_model_weights(needs.models, required=True, cache_dir=cache_dir, checkpoints=needs.checkpoints)
        rows += check_reward_weights(sorted(needs.rewards), required=True, cache_dir=cache_dir)
        rows += check_memory(needs, cuda)
    return rows


def exit_code(rows: Sequence[Row]) -> int:
    """1 when a row failed (something the spec needs is missing), else 0."""
    return 1 if any(r.status == FAIL for r in rows) else 0
