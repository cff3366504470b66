"""What a spec needs from the machine (``spec_needs`` -> ``SpecNeeds``, with a ``MemoryProfile`` per
distinct run shape), and the checks of the spec itself: its formats native on the GPUs here, its
prompt files present and readable.

The spec is read through solbench.spec when it validates here; otherwise its YAML is read minimally
(base, methods, matrix and include values of model/rewards/quant/device) and a note says so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.models.memory import MemoryProfile, _runs_cfg, _whole_batch, recipe_format, run_memory_profile  # noqa: F401

from .gpu import native_formats
from .rows import FAIL, INFO, OK, WARN, Row
from .weights import EMBEDDED_MODELS


@dataclass
class SpecNeeds:
    """What a spec's runs need from the machine."""

    path: str = ""
    models: dict[str, str | None] = field(default_factory=dict)  # name -> path override
    checkpoints: dict[str, str] = field(default_factory=dict)  # name -> model.checkpoint (its transformer's file)
    rewards: set[str] = field(default_factory=set)  # training and eval rewards
    formats: set[str] = field(default_factory=set)  # formats of the explore recipes
    native: bool = False  # some run uses quant backend te/torch/auto without emulated fallback
    te: bool = False  # some run asks for backend te itself (auto and torch do without TransformerEngine)
    gpu: bool = False  # some run needs CUDA (device cuda, a real model or a native backend)
    world_size: int = 1
    notes: list[str] = field(default_factory=list)
    # what the memory estimate needs, worst case over the spec's runs
    micro_batch: dict[str, int | None] = field(default_factory=dict)  # rollout/reward/train, per rank
    explore: bool = False  # some run keeps a low-precision explore copy (Sol-RL, naive FP4)
    cpu_offload: bool = True  # False if some run keeps the text encoders and VAE on the GPU
    gradient_checkpointing: bool = True  # False if some run trains without it
    full_finetune: bool = False
    lora_rank: int = 0
    resolution: dict[str, int | None] = field(default_factory=dict)  # model -> model.resolution
    prompt_files: set[str] = field(default_factory=set)  # train_prompts / eval.prompts given as files
    profiles: list["MemoryProfile"] = field(default_factory=list)  # one per distinct run shape


def _add_run(needs: SpecNeeds, run: Mapping[str, Any]) -> None:
    model = run.get("model") or {}
    name = model.get("name", "tiny")
    needs.models.setdefault(name, model.get("path"))
    if model.get("checkpoint"):
        needs.checkpoints.setdefault(name, str(model["checkpoint"]))
    needs.rewards.update((run.get("rewards") or {}).keys())
    needs.rewards.update((run.get("eval") or {}).get("rewards") or [])
    quant = run.get("quant") or {}
    fmt = recipe_format(str(quant.get("recipe", "")))
    if fmt:
        needs.formats.add(fmt)
    from solbench.config import emulated_fallback

    backend = quant.get("backend", "auto")
    if backend in ("te", "torch", "auto") and not emulated_fallback(backend, quant.get("allow_emulated_fallback")):
        needs.native = True
        needs.te = needs.te or backend == "te"  # auto runs on torch's scaled matmul without TE
    needs.world_size = max(needs.world_size, int(run.get("world_size", 1) or 1))
    if run.get("device") == "cuda" or name not in EMBEDDED_MODELS or needs.native:
        needs.gpu = True
    from solbench.models import MICRO_BATCH_DEFAULTS, native_resolution

    res = model.get("resolution") or native_resolution(name)
    needs.resolution[name] = max(needs.resolution.get(name) or 0, res or 0) or None  # the largest run
    needs.cpu_offload = needs.cpu_offload and bool(model.get("cpu_offload", False))
    needs.gradient_checkpointing = needs.gradient_checkpointing and bool(model.get("gradient_checkpointing", False))
    finetune = run.get("finetune") or {}
    needs.full_finetune = needs.full_finetune or finetune.get("mode") == "full"
    needs.lora_rank = max(needs.lora_rank, int(finetune.get("lora_rank", 32) or 0))
    mc = run.get("method_config") or {}
    micro = dict(run.get("micro_batch") or {})
    micro.setdefault("train", mc.get("micro_batch_size"))
    if micro.get("train") is None:
        micro["train"] = mc.get("micro_batch_size")
    for key in ("rollout", "reward", "train"):
        value = micro.get(key)
        if value is None:  # the model's default, or the whole per-rank batch
            value = MICRO_BATCH_DEFAULTS.get(name, {}).get(key) or _whole_batch(run, key)
        needs.micro_batch[key] = max(needs.micro_batch.get(key) or 0, int(value))
    method = run.get("method")
    explore = True
    if method:
        try:
            from solbench.method import get_method

            explore = "explore" in get_method(method).nets
        except Exception:  # an unknown method: assume the worst
            explore = True
    needs.explore = needs.explore or explore
    profile = run_memory_profile(run, explore=explore)
    if profile is not None:
        same = next((p for p in needs.profiles if dataclasses.replace(p, label="") == dataclasses.replace(profile, label="")), None)
        if same is None:
            needs.profiles.append(profile)
        elif profile.label and profile.label not in same.label.split(", "):
            needs.profiles[needs.profiles.index(same)] = dataclasses.replace(same, label=f"{same.label}, {profile.label}")
    from solbench.spec import is_prompt_path

    for key in ("train_prompts",):
        if run.get(key) and is_prompt_path(str(run[key])):
            needs.prompt_files.add(str(run[key]))
    eval_prompts = (run.get("eval") or {}).get("prompts")
    if eval_prompts and is_prompt_path(str(eval_prompts)):
        needs.prompt_files.add(str(eval_prompts))


def run_profile(run: Mapping[str, Any]) -> "MemoryProfile | None":
    """The memory profile of one run (a RunConfig as a dict), or None for a model the memory model has
    no row for (the embedded tiny model)."""
    needs = SpecNeeds()
    _add_run(needs, run)
    return needs.profiles[0] if needs.profiles else None


def spec_needs(path: str | os.PathLike) -> SpecNeeds:
    """Read a spec's requirements, through solbench.spec when it can validate the spec here.

    If solbench.spec is absent or rejects the spec for a reason unrelated to the machine (e.g. a
    method not installed), the YAML is read minimally (base, methods, matrix and include values of
    model/rewards/quant/device) and a note says so.
    """
    needs = SpecNeeds(path=str(path))
    try:
        from solbench.spec import load_spec
    except ImportError:
        load_spec = None
    if load_spec is not None:
        try:
            spec = load_spec(path)
        except Exception as err:  # ConfigError and registry problems: fall back, but say why
            needs.notes.append(f"spec not validated ({type(err).__name__}: {str(err).splitlines()[0][:160]}); "
                               "read its YAML minimally")
        else:
            for planned in spec.runs:
                _add_run(needs, planned.config.to_dict())
            return needs
    else:
        needs.notes.append("solbench.spec is not available; read the YAML minimally")
    _minimal_spec_needs(Path(path), needs)
    return needs


def _minimal_spec_needs(path: Path, needs: SpecNeeds) -> None:
    import yaml

    from solbench.errors import ConfigError

    from solbench.spec.yaml_lines import non_utf8

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(non_utf8(path, err)) from None
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read spec: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a spec is a YAML mapping")
    base = dict(data.get("base") or {})
    variants = [base] + [_merged(base, v) for v in (data.get("methods") or {}).values() if isinstance(v, dict)]
    matrix = data.get("matrix") or {}
    include = [dict(e) for e in data.get("include") or [] if isinstance(e, dict)]

    def values(key: str) -> list[Any]:
        v = matrix.get(key, [])
        return (v if isinstance(v, list) else [v]) + [e[key] for e in include if key in e]

    models = [m if isinstance(m, dict) else {"name": m} for m in values("model")]
    runs = [_merged(v, {"model": m}) for v in variants for m in models] if models else variants
    for key in ("quant.backend", "quant.recipe", "device"):  # dotted matrix axes the needs depend on
        section, _, leaf = key.partition(".")
        for v in values(key):
            runs = runs + [_merged(r, {section: {leaf: v}} if leaf else {section: v}) for r in runs]
    for rewards in values("rewards"):  # a matrix of training-reward dicts
        if isinstance(rewards, dict):
            needs.rewards.update(rewards)
    for run in runs:
        _add_run(needs, run)


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check_prompt_files(needs: SpecNeeds) -> list[Row]:
    """The spec's prompt files (train_prompts, eval.prompts given as .txt/.jsonl paths) exist and read."""
    rows = []
    for name in sorted(needs.prompt_files):
        try:
            from solbench.world.prompts import load_prompt_set

            prompts = load_prompt_set(name)
        except Exception as err:  # missing file, not UTF-8, bad .jsonl line, LFS pointer...
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            rows.append(Row("prompts", name, FAIL, first[:200],
                            "see docs/real-models.md, 'Prompt sets' (paths are relative to the working directory)"))
        else:
            rows.append(Row("prompts", name, OK, f"{len(prompts)} prompts"))
    return rows


def check_spec(needs: SpecNeeds, cuda: Any = None) -> list[Row]:
    """Rows for the spec itself: what it needs and whether the hardware runs its formats natively."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    rows = [Row("spec", Path(needs.path).name or "spec", INFO,
                f"models {sorted(needs.models)}, rewards {sorted(needs.rewards)}, explore formats "
                f"{sorted(needs.formats) or ['none']}, world size {needs.world_size}")]
    rows += [Row("spec", "note", WARN, note) for note in needs.notes]
    if needs.formats:
        caps = [cuda.get_device_capability(i) for i in range(cuda.device_count())] if cuda.is_available() else []
        for fmt in sorted(needs.formats):
            native = bool(caps) and all(fmt in native_formats(*c) for c in caps)
            if native:
                rows.append(Row("spec", fmt, OK, "runs natively on every visible GPU"))
            elif needs.native:
                rows.append(Row("spec", fmt, FAIL, "quant backend te/torch/auto needs native "
                                f"{fmt} (Blackwell for NVFP4/MXFP4, Hopper/Ada for FP8); not available here",
                                "run on such GPUs, or set quant.backend: emulated / allow_emulated_fallback: true"))
            else:
                rows.append(Row("spec", fmt, INFO, "emulated (quant backend emulated): numerics exact, no speed-up"))
    if needs.world_size > 1 and cuda.is_available() and cuda.device_count() < needs.world_size:
        rows.append(Row("spec", "world size", WARN,
                        f"runs use {needs.world_size} ranks; {cuda.device_count()} GPU(s) on this node (multi-node?)"))
    return rows
