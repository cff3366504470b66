"""GPU profiles the projections price FLOPs with: dense peak throughput per precision (no sparsity).
A leaf of solbench.report: the paper-scale projection (cost.py), each run's projected clock
(clock.py), sweeps and the doctor's measurement read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """Dense peak throughput in PFLOP/s (no sparsity). ``fp4`` None: no native FP4 tensor cores."""

    name: str
    bf16: float
    fp8: float
    fp4: float | None
    source: str

    def explore_peak(self) -> tuple[float, str]:
        return (self.fp4, "NVFP4") if self.fp4 else (self.fp8, "FP8")


HARDWARE: dict[str, Hardware] = {
    "B200": Hardware("B200", bf16=2.25, fp8=4.5, fp4=9.0, source="NVIDIA B200 dense peaks (shared/reference/nvfp4.md)"),
    "H100": Hardware("H100", bf16=0.99, fp8=1.98, fp4=None, source="NVIDIA H100 SXM dense peaks; no FP4 on Hopper"),
}


def get_hardware(name: str) -> Hardware:
    from solbench.errors import ConfigError

    key = name.upper()
    if key not in HARDWARE:
        raise ConfigError(f"unknown hardware profile {name!r}; profiles: {', '.join(HARDWARE)}")
    return HARDWARE[key]
