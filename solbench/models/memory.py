"""The memory model: the GPU memory one rank of a run needs, itemised (``memory_items``) from the run's shape
(``MemoryProfile``; ``run_memory_profile`` reads it from a resolved config) and each real model's card (its
``weights``: sizes, width, LoRA parameters per rank).

Items: weights per copy (policy, LoRA and optimizer, explore copy at its format's bits, text
encoders/VAE), reward models (one instance each), the prompt cache, activations per phase at the
run's micro-batches and resolution (solbench.models.activations), and a fixed overhead. The estimates are
rough (+-20 %): they catch "this cannot fit" and show what each setting costs, not fine margins
(docs/real-models.md, "Memory per rank").

Read by the trainer (``model.rollout_copy: auto``, solbench.train.rollout_copy: ``merged_copy_fits``), the doctor
(solbench.doctor.memory: a spec's worst run, against this machine and B200/H100) and the measured peaks' comparison
(solbench.measure.iteration).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from solbench.models import CardView
from solbench.models.activations import per_sample_gb, transformer_text_tokens

#: {model: ModelWeights} of the real models (their cards' ``weights``; the tiny model has none)
MODEL_WEIGHTS = CardView("weights")

FIT_SHARE = 0.95  # a run fits a GPU when its estimate is at most this share of the GPU's memory

# Reward models: fp32 parameters, billions (for the memory estimate).
REWARD_PARAMS_B = {"imagereward": 0.47, "pickscore": 0.99, "hpsv2": 0.99, "clipscore": 0.43}


@dataclass(frozen=True)
class MemoryProfile:
    """What one run's GPU memory depends on (``memory_items``)."""

    model: str
    resolution: int | None = None  # None = the model's native resolution
    rollout: int = 1  # micro-batches per rank
    reward: int = 1
    train: int = 1
    explore: bool = False
    formats: frozenset = frozenset()
    cpu_offload: bool = False
    gradient_checkpointing: bool = True
    full_finetune: bool = False
    lora_rank: int = 32
    rewards: frozenset = frozenset()
    cfg: bool | None = None  # two forwards per sample (CFG); None = the model's default guidance
    text_max_length: int | None = None  # model.text_max_length: T5 / Gemma tokens per prompt; None = default
    rollout_copy: str = "lora"  # model.rollout_copy: merged counts the merged rollout copy; auto is resolved per GPU
    label: str = ""  # which run(s): "sol_rl", ...


def recipe_format(recipe: str) -> str | None:
    """The low-precision format a quantization recipe runs in (``nvfp4_flux`` -> NVFP4,
    ``te_delayed_e2m1_flux`` -> FP8: its recipe object's format is fp8_e5m2), from the recipe object when the
    name is registered, else from the name; None for a recipe that quantizes nothing."""
    from solbench.quant.recipes import RECIPES

    known = RECIPES.get(recipe)
    name = (known.format if known is not None else recipe).lower()
    for fmt in ("nvfp4", "mxfp4", "fp8"):
        if name.startswith(fmt) or f"_{fmt}" in name:
            return fmt.upper()
    return None


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


def memory_items(profile: MemoryProfile) -> list[tuple[str, float]]:
    """(item, GB per rank) for one run shape: weights per copy, reward models, caches, activations at
    its micro-batches, and allocator headroom. Rough (+-20 %), but every term the run allocates is here;
    docs/real-models.md, "Memory per rank", derives each.

    Phases run one after another, so only the largest activation term counts toward the total
    (``estimate_total_gb``); the other activation rows are listed for reference.
    """
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


def run_memory_profile(run: Mapping[str, Any], *, explore: bool) -> MemoryProfile | None:
    """The memory profile of one run (a RunConfig as a dict) whose method keeps an explore copy when ``explore``;
    None for a model the memory model has no row for (the embedded tiny model). Unset micro-batches take the
    model's defaults (its card's), else the whole per-rank batch."""
    model = run.get("model") or {}
    name = model.get("name", "tiny")
    if name not in MODEL_WEIGHTS:
        return None
    from solbench.models import MICRO_BATCH_DEFAULTS, native_resolution

    fmt = recipe_format(str((run.get("quant") or {}).get("recipe", "")))
    finetune = run.get("finetune") or {}
    micro = dict(run.get("micro_batch") or {})
    if micro.get("train") is None:
        micro["train"] = (run.get("method_config") or {}).get("micro_batch_size")

    def per_rank(key: str) -> int:
        return int(micro.get(key) or MICRO_BATCH_DEFAULTS.get(name, {}).get(key) or _whole_batch(run, key))

    rewards = set((run.get("rewards") or {}).keys()) | set((run.get("eval") or {}).get("rewards") or [])
    return MemoryProfile(
        model=name, resolution=model.get("resolution") or native_resolution(name), explore=explore,
        formats=frozenset([fmt] if fmt else []), rollout=per_rank("rollout"), reward=per_rank("reward"),
        train=per_rank("train"), cpu_offload=bool(model.get("cpu_offload", False)),
        gradient_checkpointing=bool(model.get("gradient_checkpointing", False)),
        full_finetune=finetune.get("mode") == "full", lora_rank=int(finetune.get("lora_rank", 32) or 32),
        rewards=frozenset(rewards), cfg=_runs_cfg(name, (run.get("sampling") or {}).get("guidance")),
        text_max_length=model.get("text_max_length"), label=str(run.get("method") or ""),
        rollout_copy=str(model.get("rollout_copy", "auto")) if finetune.get("mode", "lora") == "lora" else "lora")


def _whole_batch(run: Mapping[str, Any], key: str) -> int:
    """Samples per rank one phase handles at once when its micro-batch is unset."""
    mc = run.get("method_config") or {}
    ranks = max(1, int(run.get("world_size", 1) or 1))
    prompts = max(1, int(run.get("prompts_per_iter", 1) or 1) // ranks)
    per_prompt = mc.get("n") or mc.get("group_size") or 1
    if key == "train":
        per_prompt = mc.get("k") or mc.get("group_size") or 1
    return prompts * int(per_prompt)


def _runs_cfg(model: str, guidance) -> bool | None:
    """Whether a run of ``model`` with ``sampling.guidance`` runs two forwards per sample (as
    ModelAdapter.velocity decides: CFG models at a scale other than 1.0; None takes the model's default)."""
    if guidance is None or model not in MODEL_WEIGHTS:
        return None
    return MODEL_WEIGHTS[model].cfg and float(guidance) != 1.0
