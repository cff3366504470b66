"""GPU checks: the visible GPUs, and the low-precision formats each compute capability runs natively.

Blackwell sm_100/sm_103/sm_110/sm_120/sm_121: NVFP4, MXFP4, FP8, BF16; Hopper sm_90 and Ada sm_89:
FP8, BF16; Ampere sm_8x: BF16. ``cuda`` defaults to torch.cuda (tests pass a fake namespace).
"""

from __future__ import annotations

from typing import Any

from solbench.models.memory import recipe_format  # noqa: F401 (the doctor's spec checks read it from here)

from .rows import OK, WARN, Row


def native_formats(major: int, minor: int) -> list[str]:
    """Formats the tensor cores of compute capability ``major.minor`` run natively, best first."""
    if major >= 10:  # Blackwell: B200/GB200 sm_100, B300 sm_103, Thor sm_110, RTX 50xx sm_120, GB10 sm_121
        return ["NVFP4", "MXFP4", "FP8", "BF16"]
    if (major, minor) >= (8, 9):  # Ada sm_89 and Hopper sm_90 have FP8 tensor cores
        return ["FP8", "BF16"]
    if major == 8:  # Ampere
        return ["BF16"]
    return ["FP16"]


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
