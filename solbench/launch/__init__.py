"""Launching the runs of a spec: on this machine (``launch: local``: in worker processes, one run per
core, or in-process) or as Slurm job arrays via submitit.

Who writes what in ``results/<experiment>/<run_id>/``:

- the launcher: spec.json, launch.json (how and where the run was submitted: executor, Slurm job id)
  and status.json ``pending`` before anything runs;
- the run itself (``execute_run``, in-process or inside the Slurm job): env.json, status.json
  ``running`` -> ``done`` | ``failed`` (with the traceback) and progress.json; the run function (the
  trainer) writes the tables and checkpoints through its RunStore and resumes from the last
  checkpoint by itself.

States are always read back from disk (``run_states``), never from in-memory futures, so ``solbench
status`` in another shell, or after the submitting process is gone, sees the truth. A run whose
status says pending/running but whose process or Slurm job no longer exists reads as
``interrupted`` and is launched again (it resumes from its checkpoint).

One process runs a run at a time: ``execute_run`` holds an exclusive lock on ``<run_dir>/.lock``
(released by the OS however the process ends), so a resubmission that races a dying job waits for it.
Under the lock it decides again: a run another launcher finished meanwhile is not run twice, and
``--force`` clears a run's folder only there (``prepare_run`` only when it can take the lock), so
two launchers of one spec never delete files under each other. The lock also makes it safe to
remove the temporary files a killed writer left (``RunStore.remove_temp_files``) before a resume.

Slurm runs are submitit ``Checkpointable`` (``RunJob``): on timeout or preemption submitit calls
``checkpoint``, which marks the run pending and requeues the same job; the requeued job resumes from
the last checkpoint (rows written after it are dropped first by the trainer, so none is duplicated).

This package: ``launch_spec`` (here) plans and launches the runs of a spec; its parts, one job a
module, are ``locks`` (the run lock), ``execute`` (what runs inside a job), ``states`` (states read
from disk, waiting), ``plan`` (which runs to launch, their folders prepared), ``local`` (this
machine: worker processes and their core shares), ``snapshot`` (code snapshots for Slurm jobs) and
``slurm`` (submitit job arrays). Every name is importable from ``solbench.launch`` as before.

Stage ``launch`` (solbench/stages.py): it imports its own modules and the stages below it, collect, spec, train,
method, engine, rewards, models, quant, world, report, results, machine, text, base.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .execute import (DEFAULT_RUN_FN, RunTask, _cuda, _jsonable, _now, _older_than, _rank, _read_env, _slurm_job_id,
                      execute_run, resolve_run_fn, run_fn_ref)
from .local import (WORKERS_ENV, _end_with_parent, _execute_in_workers, _init_local_worker, _quiet_resource_tracker,
                    _stop_workers, _terminate_as_interrupt, core_shares, fit_threads, launch_local, local_workers,
                    run_threads)
from .locks import LOCK_FILE, lock_is_held, run_lock
from .plan import LaunchPlan, Submission, plan_runs, preflight, prepare_run
from .slurm import RunJob, _checkpointable_base, launch_slurm, slurm_executor
from .snapshot import CODE_SNAPSHOT_ENV, _mkdir, snapshot_code
from .states import (_SLURM_ALIVE, LAUNCH_FILE, TERMINAL_STATES, _pid_alive, active_slurm_jobs, read_launch,
                     run_states, slurm_available, wait_for_runs)


@dataclass
class LaunchResult:
    plan: LaunchPlan
    submission: Submission | None
    profile_path: str
    executor: str


def launch_spec(spec, results_root: str | Path = "results", *, profile_name: str | None = None,
                run_fn: str | Callable = DEFAULT_RUN_FN, force: bool = False, only: Sequence[str] | None = None,
                display=None, sys_path: Sequence[str] = (), force_since: float | None = None) -> LaunchResult:
    """Launch every run of ``spec`` that is not done (all of them with ``force``).

    ``force_since``: when the --force request was made (default: now); a run whose execution started
    after it is not redone."""
    from solbench.spec import check_launch, load_profile

    from solbench.engine.distributed import join_launch_group

    from solbench.errors import ConfigError
    from solbench.machine.threads import check_env

    try:
        check_env()  # SOLBENCH_THREADS would change the numbers from outside the spec: refused before any run
    except ValueError as err:
        raise ConfigError(str(err)) from None
    results_root = Path(results_root)
    force_since = (force_since or time.time()) if force else None  # the --force request: runs started after it are kept
    profile_path, profile = load_profile(profile_name or spec.launch, spec.path)
    if profile.executor != "local":
        check_launch(spec, profile_path, profile)
        plan = plan_runs(spec, results_root, force=force, only=only)
        if not plan.to_launch:
            return LaunchResult(plan, None, profile_path, profile.executor)
        preflight(spec, plan.to_launch)
        submission = launch_slurm(spec, plan.to_launch, results_root, profile, run_fn=run_fn, force=force,
                                  sys_path=sys_path, force_since=force_since)
        return LaunchResult(plan, submission, profile_path, profile.executor)
    group = join_launch_group()  # under torchrun the ranks share one process group for every run
    try:
        # every rank follows rank 0's plan: a rank planning later would see the runs as running
        plan = group.broadcast(plan_runs(spec, results_root, force=force, only=only) if group.is_main else None)
        if not plan.to_launch:
            return LaunchResult(plan, None, profile_path, profile.executor)
        preflight(spec, plan.to_launch)
        workers = 1 if group.enabled else fit_threads(plan.to_launch, local_workers(profile.workers, plan.to_launch))
        submission = launch_local(spec, plan.to_launch, results_root, run_fn=run_fn, force=force, display=display,
                                  sys_path=sys_path, group=group if group.enabled else None,
                                  force_since=force_since, workers=workers)
        return LaunchResult(plan, submission, profile_path, profile.executor)
    finally:
        group.close()


def spec_run_dirs(spec, results_root: str | Path) -> dict[str, Path]:
    return {run.run_id: spec.run_dir(results_root, run.run_id) for run in spec.runs}
