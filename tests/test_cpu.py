"""CPU capability detection (solbench.machine.cpu) and the opt-in bf16 "full" precision."""

import torch

from solbench.machine import cpu
from solbench.models import resolve_full_dtype

SAPPHIRE_RAPIDS = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "processor\t: 0\nmodel name\t: AMD EPYC 9454 48-Core Processor\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
SKYLAKE = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU\nflags\t\t: fpu avx2 avx512f avx512dq\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    """Catches: a Skylake (avx512f but no bf16 instructions; bf16 ran at 0.21x there) being
    reported as native bf16, or AMX / Zen 4 chips being missed."""
    assert cpu.native_bf16_flags(SAPPHIRE_RAPIDS) == ["amx_bf16", "avx512_bf16"]
    assert cpu.native_bf16(ZEN4) and not cpu.native_bf16(SKYLAKE)
    assert cpu.cpu_model(ZEN4) == "AMD EPYC 9454 48-Core Processor"
    assert cpu.native_bf16("") is False  # no /proc/cpuinfo (macOS, containers): not native


def test_default_full_precision_on_cpu_stays_fp32(monkeypatch):
    """Catches: bf16 becoming the CPU default (every test and golden number assumes fp32);
    bf16 is only picked when asked for with full_dtype "native" on a native-bf16 CPU."""
    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: True)
    assert resolve_full_dtype("auto", "cpu") == torch.float32
    assert resolve_full_dtype("native", "cpu") == torch.bfloat16
    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: False)
    assert resolve_full_dtype("native", "cpu") == torch.float32


def test_env_records_the_cpu_capability():
    """Catches: env.json losing which CPU ran a run and whether bf16 was native on it."""
    from solbench.results import capture_env

    env = capture_env()
    assert env["cpu"]["native_bf16"] == cpu.native_bf16()
    assert env["cpu"]["full_dtype"]["auto"] == "float32"
    assert env["cpu"]["model"]
