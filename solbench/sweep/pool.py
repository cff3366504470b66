"""A sweep's local worker processes: the runs of the cells in flight, as many at once as the local profile's
``workers`` (solbench/launch/local.py ``local_workers``: one per core at the default of 1 thread a run), each in a
worker process pinned to its share of the cores, fed from one queue.

The sweep loop does not wait on it: ``pump`` hands queued runs to idle workers and collects the ones that ended
(their run folders say how: the loop reads ``run_states`` as it does for Slurm jobs), and ``stop`` ends the run of
a pruned cell at once (SIGTERM to its worker: the run reads interrupted, its checkpoints kept, and the sweep records
it pruned) or takes it off the queue. Workers die with the sweep process (PR_SET_PDEATHSIG), so a sweep killed
with kill -9 leaves its runs interrupted, and the next `solbench sweep` resumes them from their checkpoints.
"""

from __future__ import annotations

from collections import deque

from solbench.launch.execute import RunTask
from solbench.launch.local import _quiet_resource_tracker, _WorkerPool


class SweepPool:
    """``workers`` worker processes and the queue of runs waiting for one."""

    def __init__(self, workers: int):
        _quiet_resource_tracker()
        self.workers = workers
        self.queue: deque[RunTask] = deque()
        self._pool = _WorkerPool(workers)

    def submit(self, task: RunTask) -> None:
        self.queue.append(task)

    def pump(self, timeout: float) -> None:
        """Give idle workers queued runs, then wait up to ``timeout`` s for one to end."""
        self._pool.submit_to_idle(self.queue)
        self._pool.collect(timeout=timeout)
        self._pool.submit_to_idle(self.queue)

    def stop(self, run_id: str) -> bool:
        """Take ``run_id`` off the queue, or end the worker executing it; True when it was executing."""
        for task in list(self.queue):
            if task.run_id == run_id:
                self.queue.remove(task)
                return False
        for worker in self._pool.busy():
            if worker.task is not None and worker.task.run_id == run_id:
                worker.process.terminate()
                worker.process.join(timeout=30)
                return True
        return False

    def close(self) -> None:
        self.queue.clear()
        self._pool.close()
