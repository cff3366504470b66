"""Sweep cells fanned out on Slurm (solbench/sweep/runner.py): the seed runs of two cells go out together as one
submitit job array, the study lives in one Optuna journal file the sweep shares on the file system, and a sweep
process killed (kill -9) while those jobs train is continued by the next one: it watches the live jobs instead of
submitting them again, so every cell runs once with all its seeds.

Needs the local test cluster (bash slurm/local-cluster.sh up); skips, saying so, when `scontrol ping` fails."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from _slurm import slurm_up
from _sweep_runfns import cell_base, run_dirs, sweep_child, write_spec
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.sweep import Sweep

TESTS = Path(__file__).resolve().parent
RUN_FN = "_sweep_runfns:seeded_cell_run"
SLURM_UP, SLURM_WHY = slurm_up()

SWEEP = """
trials: 3
parallel: 2
seeds_per_cell: 3
sampler: grid
storage: journal
pruner: {kind: none}
params: {n: {choices: [4, 8, 16]}, k: {choices: [2]}}
"""


def _span(store: RunStore) -> tuple[float, float]:
    status = store.read_status()
    end = datetime.fromisoformat(status["finished_at"]).timestamp()
    return end - status["seconds"], end


@pytest.mark.slurm
@pytest.mark.skipif(not SLURM_UP, reason=SLURM_WHY)
def test_two_cells_train_at_once_on_slurm_and_a_killed_sweep_resumes_without_running_a_cell_twice(tmp_path):
    """Bug caught: a sweep on Slurm ran one run per trial (no seeds), and a sweep process killed while its jobs
    trained could submit the cut-off cell's runs again or lose its seeds."""
    spec_path = write_spec(tmp_path / "fanout.yaml", SWEEP, launch="debug")
    results = tmp_path / "results"
    child = sweep_child(spec_path, results, step_s=1.5, poll_s=0.5)  # the jobs inherit 1.5 s a step
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            assert child.poll() is None, "the sweep ended before it could be killed"
            training = [d for d in run_dirs(results, "fanout") if RunStore(d, d.name).latest_checkpoint() is not None
                        and RunStore(d, d.name).read_status()["state"] == "running"]
            if training:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no Slurm job trained a run within 240 s")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert len(run_dirs(results, "fanout")) == 6  # the two cells in flight, 3 seeds each, submitted before the kill

    events: list[str] = []
    os.environ["SOLBENCH_TEST_STEP_S"] = "1.5"
    try:
        result = Sweep(load_spec(spec_path), results, run_fn=RUN_FN, sys_path=[str(TESTS)], poll_s=0.5,
                       echo=events.append).run()
    finally:
        del os.environ["SOLBENCH_TEST_STEP_S"]
    trials = result.study.trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3, [t.user_attrs for t in trials]
    assert sorted(t.params["n"] for t in trials) == [4, 8, 16]  # every cell once
    assert any("(watched)" in e for e in events)  # the live jobs were watched, not submitted again
    for t in trials:
        assert t.user_attrs["seeds"] == [0, 1, 2] and len(t.user_attrs["seed_values"]) == 3
        assert t.value == pytest.approx(cell_base(t.params["n"], 2))
    dirs = run_dirs(results, "fanout")
    assert len(dirs) == 9
    for d in dirs:
        assert (d / "starts.txt").read_text().split() == ["1"]  # each run trained once, by one job
    first, second = trials[0], trials[1]
    spans = [[_span(RunStore(spec_dir, spec_dir.name)) for spec_dir in (results / "fanout" / r for r in t.user_attrs["run_ids"])]
             for t in (first, second)]
    # the two cells trained at once: some run of one overlaps some run of the other
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans[0] for b0, b1 in spans[1]), spans
    jobs = [j for t in (first, second) for j in t.user_attrs["job_ids"]]
    assert len({j.split("_")[0] for j in jobs}) == 1  # one job array for both cells' seeds
