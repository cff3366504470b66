"""Package checks: torch (and its CUDA build), transformers, diffusers, the ``gpu`` extra
(transformer-engine: installed, with TE's documented ``pip install --no-build-isolation`` command when
not, and importing ``transformer_engine.pytorch``) and the optional reference reward packages."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

from .rows import FAIL, INFO, OK, WARN, Row

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
