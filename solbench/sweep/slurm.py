"""Slurm helpers of the sweep runner: the job id of a trial's run, and cancelling the job of a pruned one."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from solbench.launch import read_launch
from solbench.results import RunStore

log = logging.getLogger(__name__)


def _job_id(run_dir: Path) -> str | None:
    status = RunStore(run_dir, run_dir.name).read_status()
    job = status.get("slurm_job_id") or read_launch(run_dir).get("job_id")
    return str(job) if job else None


def _scancel(job_id: str) -> None:
    """Stop a pruned run's job now: SIGKILL to its batch script and steps (submitit ignores the SIGTERM
    of a plain scancel, which would leave the run training for KillWait seconds), then cancel it so
    Slurm records it CANCELLED. The run's files survive a kill (appends are fsynced, checkpoints
    atomic)."""
    for command in (["scancel", "--full", "--signal=KILL", job_id], ["scancel", job_id]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("%s failed: %s", " ".join(command), err)
            continue
        if out.returncode != 0 and "already completing or completed" not in out.stderr:
            log.warning("%s failed: %s", " ".join(command), out.stderr.strip())
