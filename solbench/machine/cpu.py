"""What the CPU offers: model name, native bf16 arithmetic, and the dtype "full" precision uses.

"Full" precision on CPU is float32 by default (every test and golden number assumes it). Where
the CPU computes bf16 natively (AVX512_BF16 dot products or AMX tiles; /proc/cpuinfo flags
avx512_bf16, amx_bf16), ``model.full_dtype: native`` picks bfloat16 instead. Whether that is
faster depends on the GEMM library's kernels for the chip, not on the flag alone: measure with
benchmarks/rollout.py --precisions fp32,bf16 (docs/quantization.md has this machine's numbers).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = ["cpu_flags", "cpu_model", "native_bf16", "native_bf16_flags", "cpu_info", "BF16_FLAGS"]

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 flags of native bf16 arithmetic (AMX tiles, AVX512 dot products)


@functools.lru_cache(maxsize=None)
def _cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU feature flags (x86 "flags", ARM "Features") of the first processor, lower case."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.lower().split())
    return frozenset()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's marketing name ("Intel(R) Xeon(R) Processor", "AMD EPYC 9454 ...")."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("model name", "cpu model", "hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def native_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The native-bf16 flags this CPU has (empty: bf16 is emulated through fp32 conversions)."""
    flags = cpu_flags(cpuinfo)
    extra = ["bf16"] if platform.machine().lower() in ("aarch64", "arm64") and "bf16" in flags else []
    return [f for f in BF16_FLAGS if f in flags] + extra


def native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes bf16 natively (AMX, AVX512_BF16, or Arm's BF16 extension)."""
    return bool(native_bf16_flags(cpuinfo))


def cpu_info() -> dict:
    """For env.json: the CPU model, its native-bf16 flags, and what ``full_dtype`` resolves to."""
    return {"model": cpu_model(), "native_bf16": native_bf16(), "native_bf16_flags": native_bf16_flags(),
            "full_dtype": {"auto": "float32", "native": "bfloat16" if native_bf16() else "float32"}}
