"""The memory rows: GPU memory per rank for the largest run of each model of a spec (the memory model,
solbench.models.memory, itemises it), host memory per node, and the check of both against this machine and
against B200/H100.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from solbench.models.memory import (FIT_SHARE, REWARD_PARAMS_B, MemoryProfile, _bits, estimate_total_gb,  # noqa: F401
                                    merged_copy_fits, merged_copy_gb)
from solbench.models.memory import memory_items as _memory_items

from .gpu import _gib
from .needs import SpecNeeds
from .rows import FAIL, INFO, OK, WARN, Row
from .weights import MODEL_WEIGHTS

# GPUs the docs size the real specs for: usable memory, GB
GPU_MEMORY_GB = {"B200": 180.0, "H100": 80.0}


def profile_from_needs(needs: SpecNeeds, model: str) -> MemoryProfile:
    """A profile from a SpecNeeds' worst-case fields (for needs built without per-run profiles)."""
    mb = needs.micro_batch
    return MemoryProfile(model=model, resolution=needs.resolution.get(model), rollout=mb.get("rollout") or 1,
                         reward=mb.get("reward") or 1, train=mb.get("train") or 1,
                         explore=needs.explore or bool(needs.formats), formats=frozenset(needs.formats),
                         cpu_offload=needs.cpu_offload if needs.profiles or needs.micro_batch else False,
                         gradient_checkpointing=needs.gradient_checkpointing, full_finetune=needs.full_finetune,
                         lora_rank=needs.lora_rank or 32, rewards=frozenset(needs.rewards))


def worst_profile(needs: SpecNeeds, model: str) -> MemoryProfile:
    """The run of ``model`` in the spec that needs the most GPU memory per rank."""
    profiles = [p for p in needs.profiles if p.model == model] or [profile_from_needs(needs, model)]
    return max(profiles, key=lambda p: estimate_total_gb(memory_items(p)))


def memory_items(profile: MemoryProfile | SpecNeeds, model: str | None = None) -> list[tuple[str, float]]:
    """(item, GB per rank) of one run shape (solbench.models.memory.memory_items); a SpecNeeds and a model name:
    its worst run."""
    if isinstance(profile, SpecNeeds):
        profile = worst_profile(profile, model)
    return _memory_items(profile)


def estimate_gpu_gb(needs: SpecNeeds) -> float:
    """GPU memory one rank needs (GB): the worst of the spec's real models, itemised by memory_items."""
    totals = [estimate_total_gb(memory_items(worst_profile(needs, m))) for m in needs.models if m in MODEL_WEIGHTS]
    if totals:
        return max(totals)
    return round(sum(REWARD_PARAMS_B.get(r, 0.0) * 4 for r in needs.rewards), 1)


def estimate_host_gb(needs: SpecNeeds, ranks_per_node: int = 1) -> float:
    """Rough host memory per node: every rank stages its bf16 weights once while loading, keeps the
    offloaded encoders and the prompt-embedding cache (LRU, solbench.models.base) in host memory."""
    from solbench.models.base import ModelAdapter

    per_rank = 0.0
    for key, mw in MODEL_WEIGHTS.items():
        if key not in needs.models:
            continue
        prompt_mb = max(mw.text_tokens, 300) * 4096 * 4 / 1e6  # float32 embeddings of one prompt (T5/Gemma width)
        per_rank = max(per_rank, (mw.transformer_b + mw.frozen_b) * 2 + ModelAdapter.cond_cache_size * prompt_mb / 1e3)
    per_rank += sum(REWARD_PARAMS_B.get(r, 0.0) * 4 for r in needs.rewards)
    per_rank += 2.0  # interpreter, torch, CUDA context staging, data
    return round(per_rank * max(1, ranks_per_node), 1)


def _host_memory() -> tuple[float, float] | None:
    """(available, total) host memory in GiB."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return _gib(vm.available), _gib(vm.total)
    except ImportError:
        try:
            info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
            kb = lambda k: float(info[k].strip().split()[0]) * 1024  # noqa: E731
            return _gib(kb("MemAvailable")), _gib(kb("MemTotal"))
        except (OSError, KeyError, ValueError):
            return None


def check_memory(needs: SpecNeeds | None = None, cuda: Any = None, host: tuple[float, float] | None = None) -> list[Row]:
    """Memory per rank, itemised (weights per copy, rewards, caches, activations at the spec's
    micro-batches), the sum against each GPU's free memory and against B200/H100, and host memory."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    host = host if host is not None else _host_memory()
    rows = []
    gpu_need = estimate_gpu_gb(needs) if needs else 0.0
    if needs:
        for model in sorted(m for m in needs.models if m in MODEL_WEIGHTS):
            profile = worst_profile(needs, model)
            items = memory_items(profile)
            if profile.label:
                rows.append(Row("memory", f"{model}/largest_run", INFO,
                                f"{profile.label} at {profile.resolution or MODEL_WEIGHTS[model].native_resolution} px"))
            for name, gb in items:
                key, label = name.split(": ", 1)
                rows.append(Row("memory", f"{model}/{key}", INFO, f"{gb:.1f} GB, {label}", gb=gb))
            total = estimate_total_gb(items)
            # Hopper runs no FP4: there the explore copy would be FP8 (quant recipe fp8_w8a8)
            h100 = (estimate_total_gb(memory_items(dataclasses.replace(profile, formats=frozenset({"FP8"}))))
                    if profile.explore and profile.formats & {"NVFP4", "MXFP4"} else total)
            fits = ", ".join(
                f"{gpu} ({cap:.0f} GB{', FP8 explore copy: %.1f GB' % need if need != total else ''}) "
                f"{'fits' if need <= cap * FIT_SHARE else 'does NOT fit'}"
                for gpu, cap, need in (("B200", GPU_MEMORY_GB["B200"], total), ("H100", GPU_MEMORY_GB["H100"], h100)))
            if profile.rollout_copy == "auto" and not profile.full_finetune:
                picks = []
                for gpu, prof in (("B200", profile), ("H100", dataclasses.replace(profile, formats=frozenset({"FP8"}))
                                                       if h100 != total else profile)):
                    fits_copy, with_copy = merged_copy_fits(prof, GPU_MEMORY_GB[gpu])
                    picks.append(f"{gpu} {'merged' if fits_copy else 'LoRA'} ({with_copy:.1f} GB with it)")
                fits += (f"; model.rollout_copy auto, a {merged_copy_gb(model):.1f} GB merged rollout copy: "
                         + ", ".join(picks))
            rows.append(Row("memory", f"{model}/total", INFO,
                            f"{total:.1f} GB (largest activation phase only); {fits}", gb=total))
    if cuda.is_available():
        for i in range(cuda.device_count()):
            free, total = (_gib(x) * 2**30 / 1e9 for x in cuda.mem_get_info(i))
            if needs and gpu_need:
                status = OK if free >= gpu_need else FAIL
                fix = "" if status == OK else ("free the GPU, or lower micro_batch.*, set model.cpu_offload, "
                                               "or use a GPU with more memory (docs/real-models.md)")
                rows.append(Row("memory", f"cuda:{i}", status,
                                f"{free:.0f} GB free of {total:.0f}; spec needs ~{gpu_need:.0f} GB per rank", fix))
            else:
                rows.append(Row("memory", f"cuda:{i}", INFO, f"{free:.0f} GB free of {total:.0f}"))
    # without a GPU the gpu section already says so (once); nothing more to compare here
    if host is not None:
        avail, total = host
        if needs:
            ranks = (cuda.device_count() if cuda.is_available() else 1) if needs.gpu else 1
            host_need = estimate_host_gb(needs, ranks)
            status = OK if avail >= host_need else WARN
            rows.append(Row("memory", "host", status,
                            f"{avail:.0f} GiB available of {total:.0f}; ~{host_need:.0f} GB to load {ranks} rank(s)"))
        else:
            rows.append(Row("memory", "host", INFO, f"{avail:.0f} GiB available of {total:.0f}"))
    return rows
