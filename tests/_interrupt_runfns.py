"""Run functions that interrupt the real trainer at a chosen point (importable by name in worker processes).

``sigterm_at_eval``: solbench.train.trainer.train_run, except that the first run of the experiment to finish
the evaluation of step SOLBENCH_TEST_SIGTERM_AT sends SIGTERM to its own process there: its eval rows
are written, the checkpoint of that step is not. Once per experiment folder (a marker file); a resumed
attempt runs without SOLBENCH_TEST_SIGTERM_AT and so runs through. Before the signal it waits until every
other run of the experiment has a checkpoint, so that each run has started (and recorded its setting) when
the attempt dies, then stops them with SIGTERM as it stops itself (a worker pool leaves the other workers
running when one dies); another run that reaches that evaluation first waits there to be stopped.
"""

from __future__ import annotations

import os
import signal
import time

from solbench.config import RunConfig
from solbench.results import RunStore
from solbench.train.trainer import train_run


def sigterm_at_eval(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    at = int(os.environ.get("SOLBENCH_TEST_SIGTERM_AT", "-1"))
    experiment = store.run_dir.parent

    def relay(run_id, step, phase, info):
        if progress is not None:
            progress(run_id, step, phase, info)
        if phase != "eval" or step != at:
            return
        try:
            os.close(os.open(experiment / ".sigterm-sent", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            # sent already by another run of this attempt (a resumed attempt has no SOLBENCH_TEST_SIGTERM_AT): wait
            # here to be stopped with it, so that no run of the interrupted attempt finishes however the two
            # workers are scheduled
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(0.2)
            raise RuntimeError("the interrupted attempt's workers were never stopped")
        others = [d for d in experiment.iterdir() if d.is_dir() and d != store.run_dir and (d / "spec.json").exists()]
        deadline = time.monotonic() + 300
        while not all(RunStore(d, d.name).has_checkpoint() for d in others):
            if time.monotonic() > deadline:
                raise RuntimeError("the other runs of the experiment never wrote a checkpoint")
            time.sleep(0.2)
        # the whole attempt dies here: the other runs' workers (their pids are in their status) and this one. A
        # worker pool does not stop the other workers when one dies (Python 3.11 noticed it only when they
        # returned), so they would run to their end or wait
        for d in others:
            pid = RunStore(d, d.name).read_status().get("pid")
            if pid and pid != os.getpid():
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass
        os.kill(os.getpid(), signal.SIGTERM)

    return train_run(cfg, store, progress=relay)
