"""A run's numerics: what, besides its config, changes the numbers it computes, and the record of it.

The thread count is part of the config (``numerics.threads``, solbench.config; solbench.machine.threads applies
it), so how a run is scheduled (in a worker process or in-process, with --workers 1 or 2, on a quiet or
a busy machine, resumed or not) does not change it. What the config cannot fix is the machine: the
kernels torch picks depend on the CPU model, torch's CPU capability level and the environment variables
that cap it, on GPU on the device model, and everywhere on the torch version. A run's first attempt
records that setting (``setting_of``) and every later attempt compares itself with it:

- env.json holds, besides the latest attempt's environment at its top level, ``numerics`` (the first
  attempt's setting) and ``attempts`` (every attempt's environment, each with the ``numerics`` it ran
  with and, where it differs from the record or could not have the config's thread count,
  ``numerics_differ``: "threads 2 -> 1 (only 1 core(s) here)", "cpu_capability AVX512 -> AVX2");
- status.json carries the first attempt's setting too (solbench.results.RunStore.write_status keeps it
  across attempts), so losing one of the two files cannot rewrite it; a resume from a checkpoint that
  finds neither says in one line that it cannot show its numbers match (``unproven_warning``).

An attempt whose numerics differ says so in one line (``resume_warning``). ``--force`` starts a run
afresh, record included.
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


def recorded_setting(env: dict[str, Any] | None, status: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The setting a run's first attempt recorded: env.json's, else the copy status.json carries. An
    env.json of older solbench (one attempt, no ``numerics``) gives the thread count of that attempt only."""
    if isinstance(env, dict):
        if isinstance(env.get("numerics"), dict):
            return env["numerics"]
        threads = (env.get("cpu_allocation") or {}).get("threads") or env.get("torch_threads")
        if threads:
            return {"threads": int(threads)}
    if isinstance(status, dict) and isinstance(status.get("numerics"), dict):
        return status["numerics"]
    return None


def differences(recorded: dict[str, Any] | None, now: dict[str, Any], *, wanted_threads: int | None = None,
                why_threads: str = "") -> list[str]:
    """One entry per setting this attempt does not have, e.g. "threads 2 -> 1 (only 1 core(s) here)".

    ``wanted_threads``: the config's count where it could not be had (solbench.machine.threads.CpuAllocation);
    the threads of ``recorded`` are otherwise not compared (the config sets them, and a record of older
    solbench may hold a count its scheduling picked). Every other recorded field is.
    """
    out = []
    if wanted_threads is not None and now.get("threads") != wanted_threads:
        out.append(f"threads {wanted_threads} -> {now.get('threads')}" + (f" ({why_threads})" if why_threads else ""))
    for key, was in (recorded or {}).items():
        if key != "threads" and key in now and now[key] != was:
            out.append(f"{key} {was} -> {now[key]}")
    return out


def resume_warning(run_id: str, differ: list[str], *, first: bool = False) -> str:
    if first:
        return (f"run {run_id} cannot have the numerics its config sets: {'; '.join(differ)}; its numbers may differ "
                "from the same spec's elsewhere (recorded in its env.json)")
    return (f"run {run_id} resumes with other numerics than the attempt that started it: {'; '.join(differ)}; "
            "its rows from here on may differ from an uninterrupted run's (recorded in its env.json)")


def unproven_warning(run_id: str) -> str:
    return (f"run {run_id} resumes from a checkpoint, but the numerics its first attempt ran with are lost (neither "
            "env.json nor status.json records them): its rows from here on cannot be shown to match an uninterrupted "
            "run's (recorded in its env.json)")


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
