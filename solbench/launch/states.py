"""Run states as read back from disk, and waiting until every run has ended.

States are always read back from disk (``run_states``), never from in-memory futures, so ``solbench
status`` in another shell, or after the submitting process is gone, sees the truth. A run whose
status says pending/running but whose process (its lock, solbench.launch.locks) or Slurm job
(``squeue``) no longer exists reads as ``interrupted`` and is launched again (it resumes from its
checkpoint). ``wait_for_runs`` polls those states until every run is done, failed or interrupted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from solbench.results import RunStore

from .locks import lock_is_held

LAUNCH_FILE = "launch.json"
TERMINAL_STATES = ("done", "failed", "interrupted")
# squeue states of a job that still exists (everything else: it is gone or about to be)
_SLURM_ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED"}


def read_launch(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / LAUNCH_FILE).read_text())
    except (OSError, ValueError):
        return {}


def slurm_available() -> bool:
    return shutil.which("squeue") is not None


def active_slurm_jobs(job_ids: Sequence[str]) -> set[str] | None:
    """The subset of job ids (``123`` or ``123_4``) that Slurm still holds; None if Slurm can't be asked."""
    if not job_ids:
        return set()
    if not slurm_available():
        return None
    array_parents = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(array_parents)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        # squeue fails for ids it no longer knows at all: then none of them is alive.
        if "Invalid job id" in out.stderr:
            return set()
        return None
    alive = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in _SLURM_ALIVE:
            alive.add(parts[0])
    return {j for j in job_ids if j in alive}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_states(run_dirs: dict[str, Path]) -> dict[str, tuple[str, dict]]:
    """run_id -> (effective state, status dict) for every run, asking Slurm once for all jobs.

    The effective state is the stored one, except that pending/running runs whose process or job
    is gone read as ``interrupted`` (only when the status did not change while that was checked).
    """
    statuses: dict[str, dict] = {}
    jobs: dict[str, str] = {}
    for run_id, run_dir in run_dirs.items():
        status = RunStore(run_dir, run_id).read_status()
        statuses[run_id] = status
        if status["state"] in ("pending", "running"):
            job = status.get("slurm_job_id") or read_launch(run_dir).get("job_id")
            if job:
                jobs[run_id] = str(job)
    alive_jobs = active_slurm_jobs(sorted(set(jobs.values()))) if jobs else set()
    here = socket.gethostname()
    result = {}
    for run_id, status in statuses.items():
        state = status["state"]
        run_dir = run_dirs[run_id]
        if state in ("pending", "running"):
            alive = None
            if lock_is_held(run_dir):
                alive = True
            elif state == "running" and status.get("host") == here:
                alive = False  # the lock dies with its process: nobody here runs it any more
            elif run_id in jobs and alive_jobs is not None:
                alive = jobs[run_id] in alive_jobs
            elif state == "pending" and status.get("launcher_host") == here and status.get("launcher_pid"):
                alive = _pid_alive(int(status["launcher_pid"]))
            if alive is False:
                # Read the status again: the run may have finished (status written, then lock
                # released) or started (lock taken, then status written) between the read above
                # and the liveness check. Only a status unchanged across the check is a dead run.
                fresh = RunStore(run_dir, run_id).read_status()
                if fresh == status:
                    state = "interrupted"
                else:
                    state, status = fresh["state"], fresh
        result[run_id] = (state, status)
    return result


def wait_for_runs(run_dirs: dict[str, Path], *, poll_s: float = 2.0, timeout_s: float | None = None,
                  display=None) -> dict[str, str]:
    """Block until every run is done, failed or interrupted (read from disk); returns the states."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        states = {rid: s for rid, (s, _) in run_states(run_dirs).items()}
        if display is not None:
            display.tick()
        if all(s in TERMINAL_STATES for s in states.values()):
            return states
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"runs still active after {timeout_s} s: "
                               f"{sorted(r for r, s in states.items() if s not in TERMINAL_STATES)}")
        time.sleep(poll_s)
