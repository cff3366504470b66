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
- Packages: torch (and its CUDA build), transformers, diffusers, and the ``gpu`` extra
  (transformer-engine, importable only on a CUDA machine).
- Weights in the Hugging Face cache or a local directory, never downloading: the three real models
  (FLUX.1-dev, SD3.5-Large, SANA-1.5 1.6B) and the reward weights of solbench.rewards.real.
- Memory: free GPU and host memory against a rough per-rank estimate for the spec's models.

Memory estimates are deliberately rough (weights + explore copy + rewards + a headroom term for
activations with gradient checkpointing); they catch "this cannot fit", not fine margins.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
            rows.append(Row("packages", dist, FAIL if need_te else WARN, f"not installed: {purpose}",
                            "pip install -e '.[gpu]' (on a CUDA machine with cuDNN)"))
            continue
        if not cuda_available:
            rows.append(Row("packages", dist, FAIL if need_te else INFO,
                            f"{v or 'installed'}; not importable without CUDA ({purpose})"))
            continue
        try:
            importlib.import_module(module)
        except Exception as err:  # TE raises all kinds of errors when cuDNN/CUDA libraries are missing
            rows.append(Row("packages", dist, FAIL if need_te else WARN,
                            f"{v or 'installed'} but import fails: {type(err).__name__}: {str(err)[:120]}",
                            "reinstall transformer-engine matching the torch CUDA version; check cuDNN"))
        else:
            rows.append(Row("packages", dist, OK, f"{v or 'installed'}, importable ({purpose})"))
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
    files: tuple[str, ...]  # presence checks; "a|b" = either
    gated: bool
    licence: str
    transformer_b: float  # parameters of the policy transformer, billions
    frozen_b: float  # text encoders + VAE, billions
    activations_gb: float  # rough activation memory per rank with gradient checkpointing


_PIPE = ("model_index.json", "transformer/config.json",
         "transformer/diffusion_pytorch_model.safetensors.index.json|transformer/diffusion_pytorch_model.safetensors",
         "vae/config.json")

MODEL_WEIGHTS: dict[str, ModelWeights] = {
    "flux": ModelWeights("flux", "FLUX.1-dev", "black-forest-labs/FLUX.1-dev", _PIPE, True,
                         "FLUX.1 [dev] Non-Commercial License (accept on the model page)", 11.9, 4.9, 16.0),
    "sd3": ModelWeights("sd3", "SD3.5-Large", "stabilityai/stable-diffusion-3.5-large", _PIPE, True,
                        "Stability AI Community License (accept on the model page)", 8.1, 5.6, 14.0),
    "sana": ModelWeights("sana", "SANA-1.5 1.6B", "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers", _PIPE, False,
                         "see the model card (NVIDIA, non-commercial)", 1.6, 2.9, 8.0),
}
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


def _download_cmd(repo_id: str, include: Sequence[str] = ()) -> str:
    from solbench.rewards.real import download_command

    return download_command(repo_id, include)


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
        missing = [f for f in mw.files if not file_present(source, f, cache_dir)]
        label = f"{mw.label} ({source})"
        if not missing:
            rows.append(Row("models", key, OK, f"{label}: present"))
        else:
            gate = " Gated: accept the licence on huggingface.co, then `hf auth login`." if mw.gated else ""
            fix = f"{_download_cmd(mw.repo_id)}" if override is None or not Path(override).expanduser().is_dir() \
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
    native: bool = False  # some run uses quant backend te/auto without emulated fallback
    gpu: bool = False  # some run needs CUDA (device cuda, a real model or a native backend)
    world_size: int = 1
    notes: list[str] = field(default_factory=list)


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
    if backend in ("te", "auto") and not quant.get("allow_emulated_fallback", False):
        needs.native = True
    needs.world_size = max(needs.world_size, int(run.get("world_size", 1) or 1))
    if run.get("device") == "cuda" or name not in EMBEDDED_MODELS or needs.native:
        needs.gpu = True


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


def estimate_gpu_gb(needs: SpecNeeds) -> float:
    """Rough GPU memory one rank needs: bf16 model + explore copy + fp32 rewards + activations."""
    total = 0.0
    for name in needs.models:
        mw = MODEL_WEIGHTS.get(name)
        if mw is None:
            continue
        bits = 4.5 if needs.formats & {"NVFP4", "MXFP4"} else 8.5 if "FP8" in needs.formats else 0.0
        model_gb = (mw.transformer_b + mw.frozen_b) * 2 + mw.transformer_b * bits / 8 + mw.activations_gb
        total = max(total, model_gb)  # runs of different models do not share a process
    rewards_gb = sum(REWARD_PARAMS_B.get(r, 0.0) * 4 for r in needs.rewards)
    return round(total + rewards_gb, 1) if total else round(rewards_gb, 1)


def estimate_host_gb(needs: SpecNeeds, ranks_per_node: int = 1) -> float:
    """Rough host memory per node: every rank stages its bf16 weights once while loading."""
    per_rank = max(((mw.transformer_b + mw.frozen_b) * 2 for k, mw in MODEL_WEIGHTS.items() if k in needs.models),
                   default=0.0)
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
    """Free GPU memory (per device) and host memory against the spec's rough needs."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    host = host if host is not None else _host_memory()
    rows = []
    gpu_need = estimate_gpu_gb(needs) if needs else 0.0
    if cuda.is_available():
        for i in range(cuda.device_count()):
            free, total = (_gib(x) for x in cuda.mem_get_info(i))
            if needs and gpu_need:
                status = OK if free >= gpu_need else FAIL
                fix = "" if status == OK else ("free the GPU, or set model.gradient_checkpointing / model.cpu_offload, "
                                               "or use a GPU with more memory")
                rows.append(Row("memory", f"cuda:{i}", status,
                                f"{free:.0f} GiB free of {total:.0f}; spec needs ~{gpu_need:.0f} GiB per rank", fix))
            else:
                rows.append(Row("memory", f"cuda:{i}", INFO, f"{free:.0f} GiB free of {total:.0f}"))
    elif needs and needs.gpu:
        rows.append(Row("memory", "GPU", FAIL, f"spec needs a CUDA GPU (~{gpu_need:.0f} GiB per rank); none here",
                        "run on a GPU node (launch profile with gpus_per_node)"))
    if host is not None:
        avail, total = host
        if needs:
            ranks = (cuda.device_count() if cuda.is_available() else 1) if needs.gpu else 1
            host_need = estimate_host_gb(needs, ranks)
            status = OK if avail >= host_need else WARN
            rows.append(Row("memory", "host", status,
                            f"{avail:.0f} GiB available of {total:.0f}; ~{host_need:.0f} GiB to load {ranks} rank(s)"))
        else:
            rows.append(Row("memory", "host", INFO, f"{avail:.0f} GiB available of {total:.0f}"))
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
                rows.append(Row("spec", fmt, FAIL, "quant backend te/auto needs native "
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
    rows += check_packages(cuda_available=cuda.is_available(), need_te=bool(needs and needs.native))
    if needs is None:
        rows += check_model_weights(None, cache_dir=cache_dir)
        rows += check_reward_weights(None, cache_dir=cache_dir)
        rows += check_memory(None, cuda)
    else:
        rows += check_spec(needs, cuda)
        rows += check_model_weights(needs.models, required=True, cache_dir=cache_dir)
        rows += check_reward_weights(sorted(needs.rewards), required=True, cache_dir=cache_dir)
        rows += check_memory(needs, cuda)
    return rows


def exit_code(rows: Sequence[Row]) -> int:
    """1 when a row failed (something the spec needs is missing), else 0."""
    return 1 if any(r.status == FAIL for r in rows) else 0
