"""``capture_env``: what produced a run (code version, package versions, device, host, Slurm ids,
threads), as the launcher records it in a run's env.json.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from solbench.results.storage import _now


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def capture_env(repo_dir: str | os.PathLike | None = None, *, cpus=None) -> dict[str, Any]:
    """What produced a run: code version, package versions, device, host and Slurm ids, and with
    ``cpus`` (a solbench.machine.threads.CpuAllocation) the threads and cores the run was given."""
    repo = Path(repo_dir) if repo_dir else Path(__file__).resolve().parents[2]
    sha = _git(["rev-parse", "HEAD"], repo)
    porcelain = _git(["status", "--porcelain", "--untracked-files=no"], repo)
    env: dict[str, Any] = {
        "git_sha": sha or None,
        "git_dirty": bool(porcelain) if porcelain is not None else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "captured_at": _now(),
        "versions": {
            name: _package_version(name)
            for name in ("solbench", "torch", "diffusers", "transformers", "peft", "submitit", "optuna")
        },
        "slurm": {
            key.lower(): os.environ[key]
            for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_PARTITION",
                        "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT")
            if key in os.environ
        },
    }
    import solbench

    env["solbench_path"] = str(Path(solbench.__file__).resolve().parent)  # which copy of the code ran
    env["code_snapshot"] = os.environ.get("SOLBENCH_CODE_SNAPSHOT")  # set in Slurm jobs (solbench.launch)
    code_meta = Path(env["code_snapshot"] or "/nonexistent") / "CODE.json"
    if env["git_sha"] is None and code_meta.is_file():  # a snapshot is no checkout: its CODE.json says
        meta = json.loads(code_meta.read_text())
        env["git_sha"], env["git_dirty"] = meta.get("git_sha"), meta.get("git_dirty")
    if "torch" in sys.modules or env["versions"]["torch"]:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            env["device"] = "cuda"
            env["device_name"] = torch.cuda.get_device_name(0)
            env["device_count"] = torch.cuda.device_count()
            env["cuda"] = torch.version.cuda
        else:
            env["device"] = "cpu"
            env["device_name"] = platform.processor() or platform.machine()
            env["device_count"] = os.cpu_count()
    from solbench.machine.cpu import cpu_info

    env["cpu"] = cpu_info()  # model, native bf16 flags, and what full_dtype auto/native resolve to here
    if cpus is not None:
        env["cpu_allocation"] = cpus.as_dict()
    return env
