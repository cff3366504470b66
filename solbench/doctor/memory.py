"""The memory model: GPU memory per rank, itemised for the largest run of each model (``memory_items``),
host memory per node, and the check of both against this machine and against B200/H100.

Items: weights per copy (policy, LoRA and optimizer, explore copy at its format's bits, text
encoders/VAE), reward models (one instance each), the prompt cache, activations per phase at the
spec's micro-batches and resolution (solbench.models.activations), and a fixed overhead. The estimates are
rough (+-20 %): they catch "this cannot fit" and show what each setting costs, not fine margins
(docs/real-models.md, "Memory per rank").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from solbench.models.activations import per_sample_gb, transformer_text_tokens

from .gpu import _gib
from .needs import MemoryProfile, SpecNeeds
from .rows import FAIL, INFO, OK, WARN, Row
from .weights import MODEL_WEIGHTS

# GPUs the docs size the real specs for: usable memory, GB
GPU_MEMORY_GB = {"B200": 180.0, "H100": 80.0}
FIT_SHARE = 0.95  # a run fits a GPU when its estimate is at most this share of the GPU's memory

# Reward models: fp32 parameters, billions (for the memory estimate).
REWARD_PARAMS_B = {"imagereward": 0.47, "pickscore": 0.99, "hpsv2": 0.99, "clipscore": 0.43}


def _bits(formats: set[str]) -> float:
    """Bits per weight of the explore copy's quantized layers, scales included."""
    if formats & {"NVFP4"}:
        return 4.5  # 4-bit values + an E4M3 scale per 16
    if formats & {"MXFP4"}:
        return 4.25  # 4-bit values + an E8M0 scale per 32
    if "FP8" in formats:
        return 8.0
    return 16.0


def merged_copy_gb(model: str) -> float:
    """GB of a merged rollout copy of ``model`` (solbench.engine.policy): its LoRA-adapted linears in bf16, the rest
    shared with the policy. The default targets are square projections of the model's width, so a layer with
    r (in + out) = 2 r hidden LoRA parameters holds hidden^2 weights."""
    mw = MODEL_WEIGHTS[model]
    layers = mw.lora_params_per_rank_m * 1e6 / (2 * mw.hidden)
    return layers * mw.hidden ** 2 * 2 / 1e9


def merged_copy_fits(profile: MemoryProfile, capacity_gb: float) -> tuple[bool, float]:
    """(whether the run fits a GPU of ``capacity_gb`` with a merged rollout copy, its estimate with the copy):
    what model.rollout_copy: auto decides by (solbench.train.rollout_copy)."""
    need = estimate_total_gb(memory_items(dataclasses.replace(profile, rollout_copy="merged")))
    return need <= capacity_gb * FIT_SHARE, need


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
    """(item, GB per rank) for one run shape: weights per copy, reward models, caches, activations at
    its micro-batches, and allocator headroom. Rough (+-20 %), but every term the run allocates is here;
    docs/real-models.md, "Memory per rank", derives each. (A SpecNeeds and a model name: its worst run.)

    Phases run one after another, so only the largest activation term counts toward the total
    (``estimate_total_gb``); the other activation rows are listed for reference.
    """
    if isinstance(profile, SpecNeeds):
        profile = worst_profile(profile, model)
    p = profile
    mw = MODEL_WEIGHTS[p.model]
    res = p.resolution or mw.native_resolution
    side = res // mw.pixels_per_token
    cfg = 2 if (mw.cfg if p.cfg is None else p.cfg) else 1
    # per sample and forward, from the blocks' measured saved tensors, inputs and working sets
    # (solbench.models.activations: the real diffusers modules, fp32 LoRA, bf16, scaled by tokens and width)
    acts = dict(image_tokens=side * side, text_tokens=transformer_text_tokens(p.model, p.text_max_length))
    rollout_gb = per_sample_gb(p.model, **acts, training=False)
    train_gb = per_sample_gb(p.model, **acts, training=True, checkpointing=p.gradient_checkpointing)
    items: list[tuple[str, float]] = []
    items.append(("weights/policy: policy transformer (bf16, shared by every full-precision role)", mw.transformer_b * 2))
    if p.full_finetune:
        items.append(("weights/full_finetune: full fine-tuning grads + AdamW states (bf16) and old/ema/reference copies",
                      mw.transformer_b * 2 * 6))
    else:
        lora_m = mw.lora_params_per_rank_m * p.lora_rank
        # policy, old and ema adapters in fp32, the policy's grads and two AdamW moments
        items.append((f"weights/lora: LoRA r={p.lora_rank} adapters x3 + grads + AdamW (fp32)", lora_m * 1e6 * 4 * 6 / 1e9))
    if p.explore:
        bits = _bits(set(p.formats))
        label = next(iter(sorted(p.formats)), "bf16") if bits < 16 else "bf16"
        items.append((f"weights/explore_copy: explore copy ({label} quantized linears; the rest shared with the policy)",
                      mw.transformer_b * 0.98 * bits / 8))
    if p.rollout_copy == "merged" and not p.full_finetune:
        items.append(("weights/rollout_copy: merged rollout copy (bf16 LoRA-adapted linears; the rest shared with the policy)",
                      merged_copy_gb(p.model)))
    frozen = mw.frozen_b * 2
    items.append(("weights/frozen: text encoders + VAE (bf16)" + (", offloaded to host" if p.cpu_offload else ""),
                  0.0 if p.cpu_offload else frozen))
    named = sorted(r for r in p.rewards if r in REWARD_PARAMS_B)
    items.append((f"weights/rewards: {', '.join(named) or 'none'} (fp32, one instance each, shared by training and eval)",
                  sum(REWARD_PARAMS_B[r] * 4 for r in named)))
    items.append(("caches/prompt_embeddings: prompt embeddings (host memory, LRU; 0 on the GPU)", 0.0))
    items.append((f"activations/rollout: rollout, {p.rollout} samples x {cfg} forward(s) at {res} px", p.rollout * cfg * rollout_gb))
    items.append((f"activations/decode: VAE decode, 8 images at {res} px", 8 * mw.vae_decode_gb_1024 * (res / 1024) ** 2))
    items.append((f"activations/reward: reward, {p.reward} images (fp32 ViT)", p.reward * 0.06))
    items.append((f"activations/train: training, {p.train} samples x {cfg} forward(s), "
                  + ("gradient checkpointing" if p.gradient_checkpointing else "no gradient checkpointing"),
                  p.train * cfg * train_gb))
    if p.cpu_offload:
        items.append(("activations/offload: text encoders + VAE on the GPU while they run (cpu_offload)", frozen))
    items.append(("overhead/cuda: CUDA context, cuBLAS/TE workspaces, allocator fragmentation", 4.0))
    return [(name, round(gb, 1)) for name, gb in items]


def estimate_total_gb(items: Sequence[tuple[str, float]]) -> float:
    """Sum of the items, counting only the largest activation phase (phases do not overlap)."""
    acts = [gb for name, gb in items if name.startswith("activations/")]
    rest = sum(gb for name, gb in items if not name.startswith("activations/"))
    return round(rest + max(acts, default=0.0), 1)


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
