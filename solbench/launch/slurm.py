"""Launching on Slurm: the runs of a spec as one submitit job array, and the job each run executes in.

Slurm runs are submitit ``Checkpointable`` (``RunJob``): on timeout or preemption submitit calls
``checkpoint``, which marks the run pending and requeues the same job; the requeued job resumes from
the last checkpoint (rows written after it are dropped first by the trainer, so none is duplicated).
The launcher records how and where each run was submitted in launch.json.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from solbench.errors import SolbenchError
from solbench.results import RunStore, atomic_write_bytes

from .execute import DEFAULT_RUN_FN, RunTask, _now, _slurm_job_id, execute_run, run_fn_ref
from .plan import Submission, prepare_run
from .snapshot import CODE_SNAPSHOT_ENV, snapshot_code
from .states import LAUNCH_FILE, read_launch


def _checkpointable_base() -> type:
    try:
        from submitit.helpers import Checkpointable
    except ImportError:  # submitit is a dependency; this only keeps `import solbench.launch` light
        return object
    return Checkpointable


class RunJob(_checkpointable_base()):  # type: ignore[misc]
    """The callable a Slurm job runs: one run, requeued with its checkpoint on timeout/preemption."""

    def __init__(self, task: RunTask):
        self.task = task

    def __call__(self) -> dict[str, Any]:
        result = execute_run(self.task)
        if result["state"] == "failed":
            # The traceback is in status.json already; failing the job too makes sacct/squeue honest.
            raise RuntimeError(f"run {self.task.run_id} failed: {result['error']} (see {self.task.run_dir}/status.json)")
        return result

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Called by submitit on SIGUSR2 (timeout or preemption) before it requeues this job."""
        from submitit.helpers import DelayedSubmission

        store = RunStore(self.task.run_dir, self.task.run_id)
        step = store.latest_checkpoint()
        store.write_status("pending", requeued_at=_now(), slurm_job_id=_slurm_job_id(),
                           reason=f"timeout or preemption; resumes from step {step[0] if step else 0}")
        return DelayedSubmission(self, *args, **kwargs)


def slurm_executor(folder: Path, profile, *, name: str, code_snapshot: Path | None = None):
    """A submitit executor configured from a launch profile (jobs import ``code_snapshot`` first)."""
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm", slurm_max_num_timeout=profile.max_requeues)
    params: dict[str, Any] = dict(
        name=name,
        timeout_min=profile.timeout_min,
        nodes=profile.nodes,
        tasks_per_node=profile.tasks_per_node,
        cpus_per_task=profile.cpus_per_task,
        slurm_array_parallelism=profile.array_parallelism,
    )
    if profile.gpus_per_node:
        params["gpus_per_node"] = profile.gpus_per_node
    if profile.mem_gb is not None:
        params["mem_gb"] = profile.mem_gb
    if profile.partition:
        params["slurm_partition"] = profile.partition
    additional = dict(profile.slurm_additional_parameters)
    for key in ("account", "qos", "constraint"):
        if getattr(profile, key):
            additional[key] = getattr(profile, key)
    if additional:
        params["slurm_additional_parameters"] = additional
    setup = list(profile.setup) + [f"export {k}={json.dumps(v)}" for k, v in profile.env.items()]
    if code_snapshot is not None:
        # PYTHONSAFEPATH (Python >= 3.11): the job's working directory (often the checkout itself)
        # must not shadow the snapshot on sys.path
        setup += [f'export PYTHONPATH={json.dumps(str(code_snapshot))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
                  "export PYTHONSAFEPATH=1", f"export {CODE_SNAPSHOT_ENV}={json.dumps(str(code_snapshot))}"]
    if setup:
        params["slurm_setup"] = setup
    executor.update_parameters(**params)
    return executor


def launch_slurm(spec, runs: Sequence[Any], results_root: Path, profile, *, run_fn: str | Callable = DEFAULT_RUN_FN,
                 force: bool = False, sys_path: Sequence[str] = (), force_since: float | None = None) -> Submission:
    """Submit the runs as one Slurm job array (executor.batch()); returns once submitted."""
    ref = run_fn_ref(run_fn)
    experiment_dir = Path(results_root) / spec.name
    snapshot = snapshot_code(experiment_dir / ".code") if profile.snapshot_code else None
    executor = slurm_executor(experiment_dir / ".submitit", profile, name=f"solbench-{spec.name}",
                              code_snapshot=snapshot)
    force_since = (force_since or time.time()) if force else None
    stores = [prepare_run(run, spec.run_dir(results_root, run.run_id), force=force, force_since=force_since)
              for run in runs]
    jobs = []
    try:
        with executor.batch():
            for run, store in zip(runs, stores):
                task = RunTask(str(store.run_dir.resolve()), run.config.to_dict(), ref, list(sys_path),
                               force_since=force_since)
                jobs.append(executor.submit(RunJob(task)))
    except Exception as err:
        for store in stores:
            store.write_status("failed", error=f"submission failed: {err}", traceback=traceback.format_exc())
        raise SolbenchError(f"Slurm submission failed: {err}") from err
    submission = Submission("slurm")
    for run, store, job in zip(runs, stores, jobs):
        submission.job_ids[run.run_id] = job.job_id
        record = {"executor": "slurm", "job_id": job.job_id, "submitted_at": _now(),
                  "submitit_folder": str(experiment_dir / ".submitit"), "partition": profile.partition,
                  "code_snapshot": None if snapshot is None else str(snapshot)}
        history = read_launch(store.run_dir).get("history", [])
        record["history"] = history + [{k: record[k] for k in ("job_id", "submitted_at")}]
        atomic_write_bytes(store.run_dir / LAUNCH_FILE, (json.dumps(record, indent=2) + "\n").encode())
    return submission
