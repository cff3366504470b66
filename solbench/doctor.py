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
  three real models' pipelines (solbench.model_files: transformer, VAE, text encoders, tokenizers,
  scheduler, each shard of sharded weights) and the reward weights of solbench.rewards.real.
- Prompt files a spec names (train_prompts / eval.prompts as .txt/.jsonl paths).
- Memory per rank, itemised for the largest run of each model (``memory_items``): weights per copy
  (policy, LoRA and optimizer, explore copy at its format's bits, text encoders/VAE), reward models
  (one instance each), the prompt cache, activations per phase at the spec's micro-batches and
  resolution, and a fixed overhead; the sum against each GPU's free memory and against B200/H100.

The estimates are rough (+-20 %): they catch "this cannot fit" and show what each setting costs,
not fine margins (docs/real-models.md, "Memory per rank").
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.hub import MODEL_DOWNLOAD_EXCLUDES, model_download_command  # noqa: F401 (importable here too)
from solbench.activations import TEXT_TOKENS, per_sample_gb
from solbench.model_files import missing_files

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"

__all__ = [
    "OK", "WARN", "FAIL", "INFO", "Row", "SpecNeeds", "ModelWeights", "MODEL_WEIGHTS", "EMBEDDED_MODELS",
    "native_formats", "recipe_format", "check_gpus", "check_packages", "check_model_weights",
    "check_reward_weights", "check_memory", "check_spec", "spec_needs", "estimate_gpu_gb", "estimate_host_gb",
    "file_present", "run_checks", "exit_code",
]


@dataclass
class Row:
    """One line of the doctor's report."""

    section: str  # "gpu", "packages", "models", "rewards", "memory", "spec"
    item: str
    status: str  # ok | warn | fail | info
    detail: str
    fix: str = ""  # how to get what is missing (a command), if anything
    gb: float | None = None  # memory rows: the amount itemised, GB (1e9 bytes) per rank


# --------------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------------


def native_formats(major: int, minor: int) -> list[str]:
    """Formats the tensor cores of compute capability ``major.minor`` run natively, best first."""
    if major >= 10:  # Blackwell: B200/GB200 sm_100, B300 sm_103, Thor sm_110, RTX 50xx sm_120, GB10 sm_121
        return ["NVFP4", "MXFP4", "FP8", "BF16"]
    if (major, minor) >= (8, 9):  # Ada sm_89 and Hopper sm_90 have FP8 tensor cores
        return ["FP8", "BF16"]
    if major == 8:  # Ampere
        return ["BF16"]
    return ["FP16"]


def recipe_format(recipe: str) -> str | None:
    """The low-precision format a quantization recipe name stands for (``nvfp4_flux`` -> NVFP4)."""
    name = recipe.lower()
    for fmt in ("nvfp4", "mxfp4", "fp8"):
        if name.startswith(fmt) or f"_{fmt}" in name:
            return fmt.upper()
    return None


def _gib(n_bytes: float) -> float:
    return n_bytes / 2**30


def check_gpus(cuda: Any = None) -> list[Row]:
    """One row per visible GPU (or one row saying there is none). ``cuda`` defaults to torch.cuda."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    if not cuda.is_available():
        import torch

        build = getattr(torch.version, "cuda", None)
        why = "torch has no CUDA build (CPU wheel)" if build is None else f"torch CUDA {build} sees no device"
        return [Row("gpu", "GPU", WARN, f"none: {why}; formats run emulated on CPU (slow)",
                    "run on a CUDA machine; install torch with CUDA (pip install -e '.[gpu]' does not change torch)")]
    rows = []
    for i in range(cuda.device_count()):
        major, minor = cuda.get_device_capability(i)
        name = cuda.get_device_name(i)
        try:
            free, total = cuda.mem_get_info(i)
            mem = f", {_gib(free):.0f}/{_gib(total):.0f} GiB free"
        except Exception:  # a busy or MIG-partitioned device may refuse
            mem = ""
        rows.append(Row("gpu", f"cuda:{i}", OK,
                        f"{name}, sm_{major}{minor}, native {'+'.join(native_formats(major, minor))}{mem}"))
    return rows


# --------------------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------------------

# The ``gpu`` extra of pyproject.toml: (distribution, import name, what it is for).
GPU_EXTRA: tuple[tuple[str, str, str], ...] = (
    ("transformer-engine", "transformer_engine", "native NVFP4/FP8 GEMMs (quant backend te/auto)"),
)
# Reference reward packages: optional; solbench.rewards.real does not need them (it runs on
# transformers), they only allow cross-checking scores against the original code.
REFERENCE_REWARD_PACKAGES: tuple[tuple[str, str, str], ...] = (
    ("image-reward", "ImageReward", "original ImageReward package (cross-check only)"),
    ("hpsv2", "hpsv2", "original HPSv2 package (cross-check only)"),
    ("open-clip-torch", "open_clip", "open_clip (cross-check only)"),
)


# TransformerEngine's own instructions (docs.nvidia.com/deeplearning/transformer-engine, "pip - from
# PyPI"): the PyTorch extension is a source distribution compiled against the installed torch, so it
# needs --no-build-isolation, the CUDA toolkit (12.8+ for Blackwell) and cuDNN on the machine.
TE_INSTALL = "pip install --no-build-isolation 'transformer_engine[pytorch]>=2.8'  (CUDA 12.8+, cuDNN 9.3+)"


def te_import_error() -> str | None:
    """None if ``transformer_engine.pytorch`` (and its recipes) import here, else why not."""
    try:
        importlib.import_module("transformer_engine.pytorch")
        importlib.import_module("transformer_engine.common.recipe")
    except Exception as err:  # TE raises all kinds of errors when cuDNN/CUDA libraries are missing
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:120] if str(err).strip() else ''}"
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_packages(*, cuda_available: bool | None = None, need_te: bool = False) -> list[Row]:
    """Core packages, the gpu extra and the optional reference reward packages."""
    import torch

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    rows = [Row("packages", "torch", OK, f"{torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")]
    for dist in ("transformers", "diffusers", "peft", "huggingface_hub"):
        v = _version(dist)
        rows.append(Row("packages", dist, OK if v else FAIL, v or "not installed", "" if v else "pip install -e ."))
    for dist, module, purpose in GPU_EXTRA:
        v = _version(dist) or _version(dist.replace("-", "_"))
        found = v is not None or importlib.util.find_spec(module) is not None
        if not found:
            rows.append(Row("packages", dist, FAIL if need_te else WARN, f"not installed: {purpose}", TE_INSTALL))
            continue
        error = te_import_error()
        if error is None:
            rows.append(Row("packages", dist, OK, f"{v or 'installed'}, transformer_engine.pytorch imports ({purpose})"))
        elif not cuda_available:
            rows.append(Row("packages", dist, FAIL if need_te else INFO,
                            f"{v or 'installed'}; transformer_engine.pytorch does not import without CUDA: {error}"))
        else:
            rows.append(Row("packages", dist, FAIL if need_te else WARN,
                            f"{v or 'installed'} but transformer_engine.pytorch does not import: {error}",
                            "reinstall against this torch and CUDA: pip uninstall -y transformer-engine "
                            "transformer-engine-torch transformer-engine-cu12, then " + TE_INSTALL))
    for dist, module, purpose in REFERENCE_REWARD_PACKAGES:
        v = _version(dist)
        rows.append(Row("packages", dist, INFO, f"{v} ({purpose})" if v else f"not installed ({purpose}; not needed)"))
    return rows


# --------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------


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
# LoRA on 38 x 4 layers. SANA 1.5 1.6B: 20 blocks of 2240 over image tokens only (DC-AE /32, patch 1),
# 300 Gemma tokens by cross-attention, CFG; LoRA on 20 x 8 layers (self and cross attention).
MODEL_WEIGHTS: dict[str, ModelWeights] = {
    "flux": ModelWeights("flux", "FLUX.1-dev", "black-forest-labs/FLUX.1-dev", True,
                         "FLUX.1 [dev] Non-Commercial License (accept on the model page)", 11.9, 4.9,
                         blocks=57, hidden=3072, text_tokens=512, pixels_per_token=16, cfg=False,
                         lora_params_per_rank_m=190 * 6144 / 1e6, vae_decode_gb_1024=1.6),
    "sd3": ModelWeights("sd3", "SD3.5-Large", "stabilityai/stable-diffusion-3.5-large", True,
                        "Stability AI Community License (accept on the model page)", 8.1, 5.6,
                        blocks=38, hidden=2432, text_tokens=333, pixels_per_token=16, cfg=True,
                        lora_params_per_rank_m=152 * 4864 / 1e6, vae_decode_gb_1024=1.6),
    "sana": ModelWeights("sana", "SANA-1.5 1.6B", "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers", False,
                         "see the model card (NVIDIA, non-commercial)", 1.6, 2.9,
                         blocks=20, hidden=2240, text_tokens=0, pixels_per_token=32, cfg=True,
                         lora_params_per_rank_m=160 * 4480 / 1e6, vae_decode_gb_1024=1.2),
}
# GPUs the docs size the real specs for: usable memory, GB
GPU_MEMORY_GB = {"B200": 180.0, "H100": 80.0}
EMBEDDED_MODELS = ("tiny",)  # ship with solbench: nothing to download

# Reward models: fp32 parameters, billions (for the memory estimate).
REWARD_PARAMS_B = {"imagereward": 0.47, "pickscore": 0.99, "hpsv2": 0.99, "clipscore": 0.43}


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


def check_model_weights(models: Mapping[str, str | None] | None = None, *, required: bool = False,
                        cache_dir: str | os.PathLike | None = None) -> list[Row]:
    """Rows for real models: ``models`` maps model name -> local path/repo override (None = default).

    Without ``models``, all three real models are listed (as warnings when missing).
    """
    if models is None:
        models = {key: None for key in MODEL_WEIGHTS}
    rows = []
    for key, override in models.items():
        if key in EMBEDDED_MODELS:
            rows.append(Row("models", key, OK, "embedded in solbench (no download)"))
            continue
        mw = MODEL_WEIGHTS.get(key)
        if mw is None:
            rows.append(Row("models", key, WARN, "unknown model: presence not checked"))
            continue
        source = override or mw.repo_id
        missing = missing_files(key, lambda name: file_present(source, name, cache_dir))  # every component
        label = f"{mw.label} ({source})"
        if not missing:
            rows.append(Row("models", key, OK, f"{label}: present"))
        else:
            gate = " Gated: accept the licence on huggingface.co, then `hf auth login`." if mw.gated else ""
            fix = model_download_command(mw.repo_id) if override is None or not Path(override).expanduser().is_dir() \
                else f"complete the local directory {override}"
            rows.append(Row("models", key, FAIL if required else WARN,
                            f"{label}: missing {', '.join(missing[:2])}{'...' if len(missing) > 2 else ''}.{gate}", fix))
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


# --------------------------------------------------------------------------------------------------
# Spec requirements and memory
# --------------------------------------------------------------------------------------------------


@dataclass
class SpecNeeds:
    """What a spec's runs need from the machine."""

    path: str = ""
    models: dict[str, str | None] = field(default_factory=dict)  # name -> path override
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


@dataclass(frozen=True)
class MemoryProfile:
    """What one run's GPU memory depends on (solbench.doctor.memory_items)."""

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
    label: str = ""  # which run(s): "sol_rl", ...


def _add_run(needs: SpecNeeds, run: Mapping[str, Any]) -> None:
    model = run.get("model") or {}
    name = model.get("name", "tiny")
    needs.models.setdefault(name, model.get("path"))
    needs.rewards.update((run.get("rewards") or {}).keys())
    needs.rewards.update((run.get("eval") or {}).get("rewards") or [])
    quant = run.get("quant") or {}
    fmt = recipe_format(str(quant.get("recipe", "")))
    if fmt:
        needs.formats.add(fmt)
    backend = quant.get("backend", "emulated")
    if backend in ("te", "torch", "auto") and not quant.get("allow_emulated_fallback", False):
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
    if name in MODEL_WEIGHTS:
        rewards = set((run.get("rewards") or {}).keys()) | set((run.get("eval") or {}).get("rewards") or [])
        profile = MemoryProfile(
            model=name, resolution=res, explore=explore, formats=frozenset([fmt] if fmt else []),
            rollout=int(micro.get("rollout") or MICRO_BATCH_DEFAULTS.get(name, {}).get("rollout") or _whole_batch(run, "rollout")),
            reward=int(micro.get("reward") or MICRO_BATCH_DEFAULTS.get(name, {}).get("reward") or _whole_batch(run, "reward")),
            train=int(micro.get("train") or MICRO_BATCH_DEFAULTS.get(name, {}).get("train") or _whole_batch(run, "train")),
            cpu_offload=bool(model.get("cpu_offload", False)),
            gradient_checkpointing=bool(model.get("gradient_checkpointing", False)),
            full_finetune=finetune.get("mode") == "full", lora_rank=int(finetune.get("lora_rank", 32) or 32),
            rewards=frozenset(rewards), cfg=_runs_cfg(name, (run.get("sampling") or {}).get("guidance")),
            label=str(method or ""))
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


def _whole_batch(run: Mapping[str, Any], key: str) -> int:
    """Samples per rank one phase handles at once when its micro-batch is unset."""
    mc = run.get("method_config") or {}
    ranks = max(1, int(run.get("world_size", 1) or 1))
    prompts = max(1, int(run.get("prompts_per_iter", 1) or 1) // ranks)
    per_prompt = mc.get("n") or mc.get("group_size") or 1
    if key == "train":
        per_prompt = mc.get("k") or mc.get("group_size") or 1
    return prompts * int(per_prompt)


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

    try:
        data = yaml.safe_load(path.read_text()) or {}
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


def _bits(formats: set[str]) -> float:
    """Bits per weight of the explore copy's quantized layers, scales included."""
    if formats & {"NVFP4"}:
        return 4.5  # 4-bit values + an E4M3 scale per 16
    if formats & {"MXFP4"}:
        return 4.25  # 4-bit values + an E8M0 scale per 32
    if "FP8" in formats:
        return 8.0
    return 16.0


def profile_from_needs(needs: SpecNeeds, model: str) -> MemoryProfile:
    """A profile from a SpecNeeds' worst-case fields (for needs built without per-run profiles)."""
    mb = needs.micro_batch
    return MemoryProfile(model=model, resolution=needs.resolution.get(model), rollout=mb.get("rollout") or 1,
                         reward=mb.get("reward") or 1, train=mb.get("train") or 1,
                         explore=needs.explore or bool(needs.formats), formats=frozenset(needs.formats),
                         cpu_offload=needs.cpu_offload if needs.profiles or needs.micro_batch else False,
                         gradient_checkpointing=needs.gradient_checkpointing, full_finetune=needs.full_finetune,
                         lora_rank=needs.lora_rank or 32, rewards=frozenset(needs.rewards))


def _runs_cfg(model: str, guidance) -> bool | None:
    """Whether a run of ``model`` with ``sampling.guidance`` runs two forwards per sample (as
    ModelAdapter.velocity decides: CFG models at a scale other than 1.0; None takes the model's default)."""
    if guidance is None or model not in MODEL_WEIGHTS:
        return None
    return MODEL_WEIGHTS[model].cfg and float(guidance) != 1.0


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
    # (solbench.activations: the real diffusers modules, fp32 LoRA, bf16, scaled by tokens and width)
    acts = dict(image_tokens=side * side, text_tokens=TEXT_TOKENS[p.model])
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
                f"{'fits' if need <= cap * 0.95 else 'does NOT fit'}"
                for gpu, cap, need in (("B200", GPU_MEMORY_GB["B200"], total), ("H100", GPU_MEMORY_GB["H100"], h100)))
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


# --------------------------------------------------------------------------------------------------
# All together
# --------------------------------------------------------------------------------------------------


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
        rows += check_model_weights(needs.models, required=True, cache_dir=cache_dir)
        rows += check_reward_weights(sorted(needs.rewards), required=True, cache_dir=cache_dir)
        rows += check_memory(needs, cuda)
    return rows


def exit_code(rows: Sequence[Row]) -> int:
    """1 when a row failed (something the spec needs is missing), else 0."""
    return 1 if any(r.status == FAIL for r in rows) else 0
