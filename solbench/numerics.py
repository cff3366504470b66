"""A run's numerics setting: what, besides its config, changes the numbers it computes. Fixed by the
run's first attempt, recorded in its env.json and applied again by every later attempt.

On CPU the numbers depend on the torch thread count: a GEMM or a reduction split over 2 threads adds
in another order than over 1 (on an AMD EPYC (Zen 4), a tiny-model Sol-RL run of 4 iterations on 2
threads instead of 1: a training reward 0.027 apart, eval rewards 5e-4, 6 candidates selected
otherwise). They also
depend on the kernels torch picks (the CPU model, torch's CPU capability level and the environment
variables that cap it), on GPU on the device model, and everywhere on the torch version. How a run is
scheduled must not change any of it, yet it would: a local run with others beside it runs in a worker
on its one core, alone it runs in-process on every core, and a requeued Slurm job may land on another
node.

So env.json holds, besides the latest attempt's environment at its top level:

- ``numerics``: the setting of the run's first attempt (``setting_of``);
- ``attempts``: every attempt's environment, each with the ``numerics`` it ran with and, where it
  could not reproduce the recorded setting, ``numerics_differ`` ("threads 2 -> 1 (...)").

Every later attempt (a resume, or a restart of a run that died before its first checkpoint) runs on
the recorded thread count (``solbench.threads.cpu_allocation(recorded=...)``), in a worker process or
not; the launcher runs fewer runs at once where a worker's share of the cores is too small for it
(``solbench.launch.fit_recorded_threads``). Only an explicit SOLBENCH_THREADS that asks for another
count, or fewer cores than the recorded threads, change it: the attempt then says so in one line
(``resume_warning``) and records it. ``--force`` starts a run afresh, setting included.
"""

from __future__ import annotations

import os
from typing import Any


#: Environment variables that change which CPU kernels torch, MKL and oneDNN run.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def setting_of(env: dict[str, Any]) -> dict[str, Any]:
    """The numerics setting of the attempt that ``env`` (``solbench.results.capture_env``) describes."""
    import torch

    return {
        "threads": env.get("torch_threads"),
        "device": env.get("device"),
        "device_name": env.get("device_name"),
        "cpu": (env.get("cpu") or {}).get("model"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": (env.get("versions") or {}).get("torch"),
        "kernel_env": {name: os.environ[name] for name in KERNEL_ENV if name in os.environ},
    }


def recorded_setting(env: dict[str, Any] | None) -> dict[str, Any] | None:
    """The setting a run's env.json recorded; an env.json of older solbench (one attempt, no
    ``numerics``) gives the thread count of that attempt only."""
    if not isinstance(env, dict):
        return None
    if isinstance(env.get("numerics"), dict):
        return env["numerics"]
    threads = (env.get("cpu_allocation") or {}).get("threads") or env.get("torch_threads")
    return {"threads": int(threads)} if threads else None


def threads_of(setting: dict[str, Any] | None) -> int | None:
    threads = (setting or {}).get("threads")
    return int(threads) if threads else None


def differences(recorded: dict[str, Any], now: dict[str, Any], *, why_threads: str = "") -> list[str]:
    """One entry per recorded field that ``now`` does not reproduce, e.g. "threads 2 -> 1 (...)"."""
    out = []
    for key, was in recorded.items():
        if key in now and now[key] != was:
            out.append(f"{key} {was} -> {now[key]}" + (f" ({why_threads})" if key == "threads" and why_threads else ""))
    return out


def resume_warning(run_id: str, differ: list[str]) -> str:
    return (f"run {run_id} resumes with other numerics than the attempt that started it: {'; '.join(differ)}; "
            "its rows from here on may differ from an uninterrupted run's (recorded in its env.json)")


def with_attempt(previous: dict[str, Any] | None, env: dict[str, Any], *, attempt: int,
                 recorded: dict[str, Any] | None, differ: list[str]) -> dict[str, Any]:
    """env.json after this attempt: its environment at the top level, the recorded setting (this
    attempt's when there was none) as ``numerics``, every attempt so far in ``attempts``."""
    now = setting_of(env)
    entry = {**env, "attempt": attempt, "numerics": now, **({"numerics_differ": differ} if differ else {})}
    earlier: list[dict[str, Any]] = []
    if isinstance(previous, dict):
        if isinstance(previous.get("attempts"), list):
            earlier = [a for a in previous["attempts"] if isinstance(a, dict)]
        elif previous:  # env.json of older solbench: its one (last) attempt
            earlier = [previous]
    return {**entry, "numerics": recorded or now, "attempts": earlier + [entry]}
