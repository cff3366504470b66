"""Launching on this machine (``launch: local``): in-process, or in worker processes each pinned to its
share of the cores.

``local_workers`` decides how many runs execute at once (SOLBENCH_WORKERS, or the profile's ``workers``),
``fit_threads`` lowers that where a worker's share of the cores would be smaller than a run's
``numerics.threads``, and ``core_shares`` splits the cores among the workers. None of it changes a run's
numbers: its thread count is its config's (solbench.machine.threads), in a worker or in-process alike.

The workers are this module's own processes, one pipe each (``_WorkerPool``), not a
concurrent.futures pool: a worker that dies (killed, out of memory) fails its own run only, with the
signal that ended it in the run's status, and a fresh worker takes its share for the runs still queued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solbench.errors import ConfigError
from solbench.results import RunStore
from solbench.machine.threads import LOCAL_WORKER_ENV, available_cores, usable_cores

from .execute import DEFAULT_RUN_FN, RunTask, _cuda, _now, execute_run, run_fn_ref
from .locks import run_lock
from .plan import Submission, prepare_run

log = logging.getLogger(__name__)

#: Overrides the local profile's ``workers`` (a number, or "auto"); `solbench run --workers` sets it.
WORKERS_ENV = "SOLBENCH_WORKERS"


def run_threads(runs: Sequence[Any]) -> int:
    """The most threads one of ``runs`` computes on (their ``numerics.threads``)."""
    return max((int(run.config.numerics.threads) for run in runs), default=1)


def local_workers(setting: int | str, runs: Sequence[Any]) -> int:
    """How many of ``runs`` ``launch_local`` executes at once: SOLBENCH_WORKERS, else the profile's ``workers``.

    "auto" is as many as the cores this process may use hold runs of ``numerics.threads`` threads (one run
    per core at the default of 1 thread), and 1 where CUDA is available: local GPU runs take turns on the
    GPU. Never more than there are runs.
    """
    raw = os.environ.get(WORKERS_ENV, "").strip() or setting
    if str(raw) == "auto":
        if _cuda():
            return 1
        value = usable_cores() // run_threads(runs)
    else:
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{WORKERS_ENV}={raw!r}: give a whole number of runs at once (>= 1) or 'auto'") from None
        if value < 1:
            raise ConfigError(f"workers={raw!r}: at least 1 run at a time")
    return max(1, min(value, len(runs)))


def fit_threads(runs: Sequence[Any], workers: int) -> int:
    """``workers``, or fewer so that every worker's share of the cores holds the threads of a run
    (``numerics.threads``): a run of 2 threads is not given a worker on 1 core, where it could not have
    them. The launcher says so when it lowers the count."""
    most = run_threads(runs)
    fit = max(1, usable_cores() // most)
    if workers == 1 or most == 1 or fit >= workers:
        return workers
    log.warning("runs of %d threads (numerics.threads) on %d core(s): %d run(s) at a time instead of %d",
                most, usable_cores(), fit, workers)
    return fit


def core_shares(cores: Sequence[int], workers: int) -> list[list[int]]:
    """``cores`` split into ``workers`` contiguous, nearly equal shares (a core per worker at least)."""
    cores = list(cores)
    if workers >= len(cores):
        return [[c] for c in cores] + [list(cores) for _ in range(workers - len(cores))]
    return [cores[i * len(cores) // workers:(i + 1) * len(cores) // workers] for i in range(workers)]


def _init_local_worker(slot: int, cores: list[int], n_workers: int) -> None:
    """Pin a new worker process to its share of the cores; its runs claim (solbench.machine.threads) just those."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    _end_with_parent()
    # Ctrl-C reaches the whole process group: the launcher stops its workers (_stop_workers), so that an
    # interrupt of the launcher alone does the same and no worker goes on to the next queued run
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[LOCAL_WORKER_ENV] = f"{slot + 1}/{n_workers} on cores {','.join(map(str, cores))}"


def _worker_main(conn, slot: int, cores: list[int], n_workers: int) -> None:
    """A worker process: executes the runs its launcher sends, one at a time, until told to stop (None)
    or its launcher is gone."""
    _init_local_worker(slot, cores, n_workers)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        conn.send(execute_run(task))


def _end_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this worker when `solbench run` dies, so that a killed
    launcher does not leave its runs going on unseen (they read interrupted and resume later)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


@dataclass
class _Worker:
    process: Any
    conn: Any
    task: RunTask | None = None


class _WorkerPool:
    """``workers`` processes, each on its share of the cores, fed one run at a time through its own pipe."""

    def __init__(self, workers: int):
        import multiprocessing

        # spawned, not forked: a forked torch process inherits the parent's thread pools and locks
        self.ctx = multiprocessing.get_context("spawn")
        self.shares = core_shares(available_cores(), workers)
        self.slots: list[_Worker | None] = [None] * workers

    def _start(self, slot: int) -> _Worker:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=_worker_main, args=(child, slot, self.shares[slot], len(self.shares)),
                                   name=f"solbench-worker-{slot + 1}")
        process.start()
        child.close()
        worker = self.slots[slot] = _Worker(process, parent)
        return worker

    def busy(self) -> list[_Worker]:
        return [w for w in self.slots if w is not None and w.task is not None]

    def submit_to_idle(self, queue: deque) -> None:
        """Give each idle slot the next queued run (a fresh worker where its last one died)."""
        for slot, worker in enumerate(self.slots):
            if not queue:
                return
            if worker is not None and worker.task is not None:
                continue
            if worker is None or not worker.process.is_alive():
                worker = self._start(slot)
            task = queue.popleft()
            worker.conn.send(task)
            worker.task = task

    def collect(self, timeout: float) -> list[tuple[RunTask, dict | None, int | None]]:
        """(task, outcome, None) for each run that ended, or (task, None, exit code) for each whose
        worker died under it; waits up to ``timeout`` seconds for the first."""
        from multiprocessing.connection import wait

        busy = self.busy()
        ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=timeout)) if busy else set()
        ended = []
        for slot, worker in enumerate(self.slots):
            if worker is None or worker.task is None or not ({worker.conn, worker.process.sentinel} & ready):
                continue
            task, worker.task = worker.task, None
            outcome = None
            try:
                if worker.conn.poll():
                    outcome = worker.conn.recv()
            except (EOFError, OSError):
                outcome = None
            if outcome is None:  # the process ended without an answer: it died under its run
                worker.process.join(timeout=10)
                ended.append((task, None, worker.process.exitcode))
                worker.conn.close()
                self.slots[slot] = None
            else:
                ended.append((task, outcome, None))
        return ended

    def close(self) -> None:
        """Tell every live worker to stop and wait for it (idle ones end at once)."""
        for worker in self.slots:
            if worker is not None and worker.process.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    worker.conn.send(None)
        for worker in self.slots:
            if worker is not None:
                worker.process.join(timeout=30)


def _why_dead(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (as the kernel's out-of-memory killer or kill -9 do)" if -exitcode == signal.SIGKILL else ""
        return f"its worker process was killed by {name}{hint}"
    return f"its worker process ended with exit code {exitcode}"


def _record_dead_worker(task: RunTask, exitcode: int | None) -> str:
    """The run of a worker that died: marked failed with why (a killed process cannot say it itself);
    the next `solbench run` launches it again and it resumes from its last checkpoint."""
    why = _why_dead(exitcode)
    store = RunStore(task.run_dir, task.run_id)
    with run_lock(store.run_dir, wait_s=10) as held:
        status = store.read_status()
        if held and status["state"] in ("pending", "running"):
            store.write_status("failed", error=f"WorkerDied: {why}", finished_at=_now(),
                               **{k: status[k] for k in ("started_ts", "slurm_job_id") if k in status})
    log.error("run %s failed: %s; the other runs go on, and `solbench run` resumes it from its last checkpoint",
              task.run_id, why)
    return "failed"


def _execute_in_workers(tasks: Sequence[RunTask], workers: int, display=None) -> dict[str, str]:
    """Execute ``tasks`` in ``workers`` processes, each on its share of the cores; run_id -> state.

    A worker that dies (killed, out of memory) fails its own run only (``_record_dead_worker``) and a
    fresh worker takes its share. An interrupt of the launcher (Ctrl-C, ``kill -INT`` or ``kill -TERM``
    of its process alone) stops every worker at once and cancels the runs not started.
    """
    queue = deque(tasks)
    states: dict[str, str] = {}
    _quiet_resource_tracker()
    pool = _WorkerPool(workers)
    with _terminate_as_interrupt():
        try:
            while queue or pool.busy():
                pool.submit_to_idle(queue)
                ended = pool.collect(timeout=0.5)
                for task, outcome, exitcode in ended:
                    states[task.run_id] = outcome["state"] if outcome is not None else _record_dead_worker(task, exitcode)
                if display is not None:
                    display.tick(force=bool(ended))
        except BaseException:
            _stop_workers()
            raise
        pool.close()
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

    Under torchrun (``group``: solbench.engine.distributed.join_launch_group) every rank calls this with
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
