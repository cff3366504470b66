"""Launching on this machine (``launch: local``): in-process, or in worker processes each pinned to its
share of the cores.

``local_workers`` decides how many runs execute at once (SOLBENCH_WORKERS, or the profile's
``workers``), ``fit_recorded_threads`` lowers that so that a resumed run keeps the thread count its
first attempt recorded, and ``core_shares`` splits the cores among the workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from solbench import numerics
from solbench.errors import ConfigError
from solbench.results import RunStore
from solbench.threads import LOCAL_WORKER_ENV, available_cores, requested_threads

from .execute import DEFAULT_RUN_FN, RunTask, _cuda, _read_env, execute_run, run_fn_ref
from .plan import Submission, prepare_run

log = logging.getLogger(__name__)

#: Overrides the local profile's ``workers`` (a number, or "auto"); `solbench run --workers` sets it.
WORKERS_ENV = "SOLBENCH_WORKERS"


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
