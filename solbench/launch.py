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
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import importlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench import numerics
from solbench.config import RunConfig
from solbench.errors import ConfigError, SolbenchError
from solbench.results import RunStore, atomic_write_bytes, capture_env
from solbench.threads import ENV_THREADS, LOCAL_WORKER_ENV, available_cores, cpu_allocation, requested_threads

log = logging.getLogger(__name__)

DEFAULT_RUN_FN = "solbench.trainer:train_run"
#: Overrides the local profile's ``workers`` (a number, or "auto"); `solbench run --workers` sets it.
WORKERS_ENV = "SOLBENCH_WORKERS"
LOCK_FILE = ".lock"
LAUNCH_FILE = "launch.json"
TERMINAL_STATES = ("done", "failed", "interrupted")
# squeue states of a job that still exists (everything else: it is gone or about to be)
_SLURM_ALIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED"}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------
# The run function and what runs inside a job
# ----------------------------------------------------------------------------------------------

def resolve_run_fn(ref: str | Callable) -> Callable:
    """A callable from ``"package.module:function"`` (or ``"path/to/file.py:function"``)."""
    if callable(ref):
        return ref
    module_name, sep, attr = str(ref).partition(":")
    if not sep or not attr:
        raise ConfigError(f"run function {ref!r} must look like 'package.module:function'")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"run function {ref!r}: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ConfigError(f"run function {ref!r}: module {module_name!r} not found ({err})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"run function {ref!r}: {module_name} has no attribute {attr!r}") from None


def run_fn_ref(fn: str | Callable) -> str:
    """The importable reference of a run function (jobs import it by name, never by pickle)."""
    if isinstance(fn, str):
        return fn
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in name or module == "__main__":
        raise ConfigError(f"run function {fn!r} must be a module-level function so Slurm jobs can import it")
    return f"{module}:{name}"


@dataclass
class RunTask:
    """Everything a job needs to execute one run (small and picklable)."""

    run_dir: str
    config: dict[str, Any]
    run_fn: str = DEFAULT_RUN_FN
    sys_path: list[str] = field(default_factory=list)  # prepended in the job (to import test run functions)
    lock_wait_s: float = 60.0  # how long to wait for a dying predecessor to release the run
    # --force: the time of the request. The run's results must come from an execution that started
    # after it; a run another launcher finished (or began) since then is not run again.
    force_since: float | None = None

    @property
    def run_id(self) -> str:
        return RunConfig.from_dict(self.config).run_id


def _rank() -> int:
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


@contextlib.contextmanager
def run_lock(run_dir: str | Path, wait_s: float = 0.0) -> Iterator[bool]:
    """Hold the run's exclusive lock for the block; yields False if it stayed taken for wait_s."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    acquired = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                acquired = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        if acquired:
            os.ftruncate(fd, 0)
            os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        yield acquired
    finally:
        if acquired:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def lock_is_held(run_dir: str | Path) -> bool:
    """True while some process (this one included) executes the run."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def execute_run(task: RunTask, *, progress: Callable | None = None) -> dict[str, Any]:
    """Run one run here and now, recording its status; never raises for a failing run.

    Returns {"state": "done", "result": ...} or {"state": "failed", "error": ...}, or
    {"state": "skipped"} when another live process holds the run.
    """
    from solbench.progress import ProgressWriter

    for entry in reversed(task.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    cfg = RunConfig.from_dict(task.config)
    store = RunStore(task.run_dir, cfg.run_id)
    if _rank() != 0:  # other ranks of a distributed run only compute; rank 0 keeps the records
        return {"state": "worker", "result": resolve_run_fn(task.run_fn)(cfg, store, progress=None)}
    with run_lock(store.run_dir, wait_s=task.lock_wait_s) as acquired:
        if not acquired:
            log.warning("%s is being executed by another process (%s); not starting it twice",
                        cfg.run_id, (store.run_dir / LOCK_FILE).read_text().strip())
            return {"state": "skipped"}
        # Decide again now that the run is ours: another launcher may have finished it while this
        # one waited for the lock (two `solbench run` of one spec), and running it again would
        # repeat the work and overwrite its status.
        previous = store.read_status()
        if previous["state"] == "done" and not _older_than(previous, task.force_since):
            log.info("%s was finished by another process meanwhile; not running it again", cfg.run_id)
            return {"state": "done", "result": previous.get("result"), "already_done": True}
        if task.force_since is not None and _older_than(previous, task.force_since):
            # --force, and nobody restarted the run since: start from nothing (under the lock, so
            # that no process executing the run loses its files; the lock file itself stays)
            store.clear(keep=(LOCK_FILE, "spec.json", LAUNCH_FILE))
            previous = store.read_status()
        store.remove_temp_files()  # of writes a killed predecessor left (checkpoints can be GBs)
        attempt = int(previous.get("attempt", 0)) + 1
        started = time.time()
        if not store.has_checkpoint():
            # Starting from nothing: rows of an earlier attempt that died before its first
            # checkpoint would otherwise be duplicated by this one.
            store.truncate_after(-1)
        writer = ProgressWriter(store.run_dir, iterations=cfg.iterations)
        if progress is not None:
            writer.add_listener(progress)
        try:
            # The run's threads follow its allocation (SOLBENCH_THREADS, Slurm's cpus-per-task, or
            # the cores it can claim beside other local runs) on its first attempt, and what that
            # attempt recorded on every later one (solbench.numerics); env.json keeps every attempt.
            on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and _cuda())
            previous_env = _read_env(store)
            recorded = numerics.recorded_setting(previous_env)
            with cpu_allocation(device="cuda" if on_gpu else "cpu", recorded=numerics.threads_of(recorded)) as cpus:
                env = capture_env(cpus=cpus)
                differ = numerics.differences(recorded, numerics.setting_of(env),
                                              why_threads=_why_threads(cpus)) if recorded else []
                if differ:
                    log.warning("%s", numerics.resume_warning(cfg.run_id, differ))
                store.write_json("env.json", numerics.with_attempt(previous_env, env, attempt=attempt,
                                                                   recorded=recorded, differ=differ))
                store.write_status("running", attempt=attempt, host=socket.gethostname(), pid=os.getpid(),
                                   slurm_job_id=_slurm_job_id(), started_at=_now(), started_ts=started)
                run_fn = resolve_run_fn(task.run_fn)
                result = run_fn(cfg, store, progress=writer)
        except Exception as err:  # a crashed run is recorded and the others carry on
            tb = traceback.format_exc()
            log.error("run %s failed: %s", cfg.run_id, err)
            try:
                store.write_status("failed", attempt=attempt, error=f"{type(err).__name__}: {err}", traceback=tb,
                                   seconds=round(time.time() - started, 3), finished_at=_now(),
                                   slurm_job_id=_slurm_job_id(), started_ts=started)
            except SolbenchError as unwritten:  # a full disk: the status stays "running" and reads interrupted
                log.error("run %s: its failed status is not recorded either: %s", cfg.run_id, unwritten)
            return {"state": "failed", "error": f"{type(err).__name__}: {err}"}
        store.write_status("done", attempt=attempt, seconds=round(time.time() - started, 3), finished_at=_now(),
                           result=_jsonable(result), slurm_job_id=_slurm_job_id(), started_ts=started)
        return {"state": "done", "result": _jsonable(result)}


def _read_env(store: RunStore) -> dict | None:
    """The run's env.json (None when it has none, or an unreadable one: then no setting is reused)."""
    try:
        return store.read_json("env.json")
    except (OSError, ValueError) as err:
        log.warning("%s: unreadable env.json (%s); this attempt records its own numerics setting", store.run_dir, err)
        return None


def _why_threads(cpus) -> str:
    if cpus.source == "explicit":
        return f"{ENV_THREADS} asks for {cpus.threads}"
    if cpus.source == "recorded, fewer cores":
        return f"only {cpus.threads} core(s) here"
    return ""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _older_than(status: dict, since: float | None) -> bool:
    """Whether a --force request at ``since`` still has to restart the run of ``status``: its last
    execution began before the request. A status without ``started_ts`` (new, or pending after a
    requeue or after prepare_run cleared it) holds nothing older, except a done one of old code."""
    if since is None:
        return False
    started = status.get("started_ts")
    if started is None:
        return status["state"] == "done"
    return float(started) < since


def _slurm_job_id() -> str | None:
    if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def _jsonable(obj: Any) -> Any:
    try:
        return json.loads(json.dumps(obj, default=str))
    except (TypeError, ValueError):
        return str(obj)


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


# ----------------------------------------------------------------------------------------------
# States as read from disk
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------

@dataclass
class LaunchPlan:
    """What ``launch_spec`` decided per run: launch it, or why not."""

    to_launch: list[Any]  # PlannedRun
    skipped: dict[str, str]  # run_id -> reason (done, running, ...)
    states: dict[str, str]  # run_id -> state before launching


def plan_runs(spec, results_root: Path, *, force: bool = False, only: Sequence[str] | None = None) -> LaunchPlan:
    """Decide which runs to launch: everything not done (and not alive), or everything with force."""
    runs = [r for r in spec.runs if not only or r.run_id in only or any(r.run_id.startswith(o) for o in only)]
    run_dirs = {r.run_id: spec.run_dir(results_root, r.run_id) for r in runs}
    states = run_states(run_dirs)
    to_launch, skipped = [], {}
    for run in runs:
        state, _ = states[run.run_id]
        if state in ("pending", "running"):
            skipped[run.run_id] = f"already {state}"
        elif state == "done" and not force:
            skipped[run.run_id] = "done"
        else:
            to_launch.append(run)
    return LaunchPlan(to_launch, skipped, {rid: s for rid, (s, _) in states.items()})


def preflight(spec, runs: Sequence[Any]) -> None:
    """Checks that need the launching machine: prompt files given as paths exist."""
    from solbench.spec import is_prompt_path

    missing = []
    for run in runs:
        for key, name in (("train_prompts", run.config.train_prompts), ("eval.prompts", run.config.eval.prompts)):
            if is_prompt_path(name) and not Path(name).expanduser().exists():
                missing.append(f"{key}: {name}")
    if missing:
        raise ConfigError(f"{spec.path}: prompt files not found: {', '.join(sorted(set(missing)))} "
                          "(see experiments/README.md, 'Prompt sets')")


def prepare_run(run, run_dir: Path, *, force: bool, force_since: float | None = None) -> RunStore:
    """Write spec.json and the pending status of a run about to launch (--force starts it afresh).

    Only while no other process holds the run: a run being executed elsewhere keeps its files and
    status (execute_run sorts it out under the lock), and a run finished since this launcher planned
    it keeps its done status unless forced and finished before the request (``force_since``).
    """
    store = RunStore(run_dir, run.run_id)
    with run_lock(run_dir) as held:
        if not held:
            return store
        status = store.read_status()
        # with --force, whatever did not start after the request is stale: the run restarts from nothing
        stale = force and not (force_since is not None and float(status.get("started_ts", -1)) >= force_since)
        if status["state"] == "done" and not stale:
            return store  # finished by another launcher meanwhile: execute_run will reuse it
        if stale:
            store.clear(keep=(LOCK_FILE,))
        store.write_json("spec.json", run.config.to_dict())
        store.write_status("pending", submitted_at=_now(), launcher_host=socket.gethostname(),
                           launcher_pid=os.getpid())
    return store


@dataclass
class Submission:
    """Result of launching: per run the final state (local) or the Slurm job id."""

    executor: str
    states: dict[str, str] = field(default_factory=dict)  # local: run_id -> done | failed
    job_ids: dict[str, str] = field(default_factory=dict)  # slurm: run_id -> job id


def local_workers(setting: int | str, n_runs: int) -> int:
    """How many runs ``launch_local`` executes at once: SOLBENCH_WORKERS, else the profile's ``workers``.

    "auto" is one run per core this process may use (per SOLBENCH_THREADS cores when that asks for
    several threads per run), and 1 where CUDA is available: local GPU runs take turns on the GPU.
    Never more than there are runs.
    """
    raw = os.environ.get(WORKERS_ENV, "").strip() or setting
    if str(raw) == "auto":
        if _cuda():
            return 1
        per_run = requested_threads()[0] or 1
        value = len(available_cores()) // per_run
    else:
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{WORKERS_ENV}={raw!r}: give a whole number of runs at once (>= 1) or 'auto'") from None
        if value < 1:
            raise ConfigError(f"workers={raw!r}: at least 1 run at a time")
    return max(1, min(value, n_runs))


def fit_recorded_threads(spec, runs: Sequence[Any], results_root: Path, workers: int) -> int:
    """``workers``, or fewer so that every worker's share of the cores holds the thread count that a
    run's first attempt recorded (solbench.numerics): a run started in-process on 2 threads resumes
    on 2, not in a worker on 1 core. SOLBENCH_THREADS, when set, decides every run's count."""
    if workers == 1 or requested_threads()[0] is not None:
        return workers
    needed = {}
    for run in runs:
        threads = numerics.threads_of(numerics.recorded_setting(_read_env(
            RunStore(spec.run_dir(results_root, run.run_id), run.run_id))))
        if threads:
            needed[run.run_id] = threads
    most = max(needed.values(), default=1)
    fit = max(1, len(available_cores()) // most)
    if fit >= workers:
        return workers
    log.warning("%d run(s) go on with the %d threads their first attempt ran on (%s): %d run(s) at a time instead "
                "of %d", sum(t == most for t in needed.values()), most,
                ", ".join(r for r, t in needed.items() if t == most), fit, workers)
    return fit


def core_shares(cores: Sequence[int], workers: int) -> list[list[int]]:
    """``cores`` split into ``workers`` contiguous, nearly equal shares (a core per worker at least)."""
    cores = list(cores)
    if workers >= len(cores):
        return [[c] for c in cores] + [list(cores) for _ in range(workers - len(cores))]
    return [cores[i * len(cores) // workers:(i + 1) * len(cores) // workers] for i in range(workers)]


def _init_local_worker(counter, lock, shares: list[list[int]]) -> None:
    """Pin a new worker process to its share of the cores; its runs claim (solbench.threads) just those."""
    with lock:
        index = counter.value
        counter.value += 1
    slot = index % len(shares)
    cores = shares[slot]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    _end_with_parent()
    # Ctrl-C reaches the whole process group: the launcher stops its workers (_stop_workers), so that an
    # interrupt of the launcher alone does the same and no worker goes on to the next queued run
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[LOCAL_WORKER_ENV] = f"{slot + 1}/{len(shares)} on cores {','.join(map(str, cores))}"


def _end_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this worker when `solbench run` dies, so that a killed
    launcher does not leave its runs going on unseen (they read interrupted and resume later)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


def _execute_in_workers(tasks: Sequence[RunTask], workers: int, display=None) -> dict[str, str]:
    """Execute ``tasks`` in ``workers`` processes, each on its share of the cores; run_id -> state.

    Spawned, not forked: a forked torch process inherits the parent's thread pools and locks. A
    worker that dies (killed, out of memory) leaves its run interrupted on disk; the next
    `solbench run` resumes it. An interrupt of the launcher (Ctrl-C, ``kill -INT`` or ``kill -TERM``
    of its process alone) stops every worker at once and cancels the runs not started.
    """
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    shares = core_shares(available_cores(), workers)
    states: dict[str, str] = {}
    _quiet_resource_tracker()
    with _terminate_as_interrupt(), concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_local_worker,
            initargs=(ctx.Value("i", 0), ctx.Lock(), shares)) as pool:
        try:
            futures = {pool.submit(execute_run, task): task for task in tasks}
            waiting = set(futures)
            while waiting:
                finished, waiting = concurrent.futures.wait(waiting, timeout=0.5)
                for future in finished:
                    run_id = futures[future].run_id
                    try:
                        states[run_id] = future.result()["state"]
                    except Exception as err:  # the worker process died: the run reads interrupted on disk
                        log.error("run %s: its worker process ended abnormally (%s); `solbench run` resumes it",
                                  run_id, err)
                        states[run_id] = "interrupted"
                if display is not None:
                    display.tick(force=bool(finished))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_workers()
            raise
    return states


def _stop_workers(grace_s: float = 30.0) -> None:
    """SIGTERM to this launcher's worker processes (its only multiprocessing children): their runs stop
    where they are, as a killed run does (their lock released, read back as interrupted, resumed
    from the last checkpoint by the next `solbench run`)."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout=grace_s)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM to the launcher stops it as Ctrl-C does (KeyboardInterrupt): its workers stopped, its
    worker pool's semaphores released. Killed outright, it would leave the workers to finish dying
    on their own and multiprocessing's resource tracker to warn of leaked semaphores."""
    import threading

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _quiet_resource_tracker() -> None:
    """A launcher killed with SIGKILL cannot release its worker pool's semaphores; multiprocessing's
    resource tracker (started with the pool, with this process's -W options) then removes them and
    warns of "leaked semaphore objects" on the terminal. The removal is all there is to do: no warning."""
    option = "ignore:resource_tracker:UserWarning"
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)


def launch_local(spec, runs: Sequence[Any], results_root: Path, *, run_fn: str | Callable = DEFAULT_RUN_FN,
                 force: bool = False, display=None, sys_path: Sequence[str] = (), group=None,
                 force_since: float | None = None, workers: int = 1) -> Submission:
    """Run every run on this machine; a failing run does not stop the others.

    ``workers`` 1: one after another in this process. More: that many at once, each in a worker
    process pinned to its share of the cores (``local_workers`` decides how many).

    Under torchrun (``group``: solbench.distributed.join_launch_group) every rank calls this with
    the same runs; rank 0 prepares the run folders and the others wait for it, then all execute
    each run together (rank 0 records it), one run after another.
    """
    ref = run_fn_ref(run_fn)
    main = group is None or group.is_main
    force_since = (force_since or time.time()) if force else None
    stores = [prepare_run(run, spec.run_dir(results_root, run.run_id), force=force, force_since=force_since) if main
              else RunStore(spec.run_dir(results_root, run.run_id), run.run_id) for run in runs]
    if group is not None:
        group.barrier()  # rank 0 has (re)set the folders before any rank looks for checkpoints
    submission = Submission("local")
    if workers > 1 and group is None:
        tasks = [RunTask(str(store.run_dir), run.config.to_dict(), ref, list(sys_path), force_since=force_since)
                 for run, store in zip(runs, stores)]
        submission.states.update(_execute_in_workers(tasks, workers, display))
        return submission
    for run, store in zip(runs, stores):
        task = RunTask(str(store.run_dir), run.config.to_dict(), ref, list(sys_path), force_since=force_since)
        tick = (lambda *a, **k: display.tick()) if display is not None else None
        outcome = execute_run(task, progress=tick)
        submission.states[run.run_id] = outcome["state"]
        if display is not None:
            display.tick(force=True)
    return submission


CODE_SNAPSHOT_ENV = "SOLBENCH_CODE_SNAPSHOT"


def snapshot_code(dest_root: Path) -> Path:
    """Copy the solbench code running now into ``dest_root/<content hash>/``; returns that folder.

    Slurm jobs may start hours after submission and requeued jobs start again later still; with the
    snapshot first on their PYTHONPATH they run the code of submission time, not whatever the
    checkout holds by then. The copy has the installed layout (solbench/, with methods/ as
    solbench/methods/), so it imports without the editable install's path mapping. Identical code
    shares one snapshot; CODE.json beside it records where it came from and the git state.
    """
    import hashlib

    import solbench
    import solbench.methods

    package = Path(solbench.__file__).resolve().parent
    methods = Path(solbench.methods.__file__).resolve().parent
    sources = {Path("solbench"): package}
    if methods != package / "methods":  # a checkout: methods/ at the top maps to solbench.methods
        sources[Path("solbench/methods")] = methods
    files: list[tuple[Path, Path]] = []  # (relative destination, source)
    for rel_root, root in sources.items():
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files.append((rel_root / path.relative_to(root), path))
    digest = hashlib.sha256()
    for rel, path in files:
        digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    snapshot = Path(dest_root) / digest.hexdigest()[:16]
    if (snapshot / "CODE.json").exists():
        return snapshot.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_mkdir(Path(dest_root))))
    for rel, path in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, tmp / rel)
    env = capture_env()
    meta = {"source": {str(k): str(v) for k, v in sources.items()}, "files": len(files),
            "git_sha": env.get("git_sha"), "git_dirty": env.get("git_dirty"), "created_at": _now()}
    (tmp / "CODE.json").write_text(json.dumps(meta, indent=2) + "\n")
    try:
        os.replace(tmp, snapshot)
    except OSError:  # another submission made the same snapshot meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return snapshot.resolve()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


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


@dataclass
class LaunchResult:
    plan: LaunchPlan
    submission: Submission | None
    profile_path: str
    executor: str


def launch_spec(spec, results_root: str | Path = "results", *, profile_name: str | None = None,
                run_fn: str | Callable = DEFAULT_RUN_FN, force: bool = False, only: Sequence[str] | None = None,
                display=None, sys_path: Sequence[str] = ()) -> LaunchResult:
    """Launch every run of ``spec`` that is not done (all of them with ``force``)."""
    from solbench.spec import check_launch, load_profile

    from solbench.distributed import join_launch_group

    results_root = Path(results_root)
    force_since = time.time() if force else None  # the --force request: runs started after it are not redone
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
        workers = 1 if group.enabled else local_workers(profile.workers, len(plan.to_launch))
        workers = fit_recorded_threads(spec, plan.to_launch, results_root, workers)
        submission = launch_local(spec, plan.to_launch, results_root, run_fn=run_fn, force=force, display=display,
                                  sys_path=sys_path, group=group if group.enabled else None,
                                  force_since=force_since, workers=workers)
        return LaunchResult(plan, submission, profile_path, profile.executor)
    finally:
        group.close()


def spec_run_dirs(spec, results_root: str | Path) -> dict[str, Path]:
    return {run.run_id: spec.run_dir(results_root, run.run_id) for run in spec.runs}
