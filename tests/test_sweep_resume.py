"""A sweep killed (kill -9) in the middle of a cell and started again covers every cell exactly once
(solbench/sweep/runner.py): the RUNNING trial's cell is taken up again (its finished seeds reused, the one cut off
resumed from its checkpoint, the rest run), no run starts twice from nothing, no seed is lost, and the grid sampler
asks the cells not yet tried.

The sweep runs in a child process on ``_sweep_runfns.seeded_cell_run`` (0.25 s a step), killed once a run of its
first cell has a checkpoint, then continued in this process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from _sweep_runfns import cell_base, run_dirs, sweep_child, write_spec
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.sweep import Sweep

TESTS = Path(__file__).resolve().parent
RUN_FN = "_sweep_runfns:seeded_cell_run"

SWEEP = """
trials: 4
parallel: PARALLEL
sampler: grid
storage: journal
pruner: {kind: none}
params: {n: {choices: [4, 8]}, k: {choices: [2, 4]}}
"""


def _kill_mid_cell(spec_path: Path, results: Path, workers: int, seeds_started: int) -> dict[str, bool]:
    """Start the sweep in a child process and kill -9 it once ``seeds_started`` runs started and one of the runs
    that has not finished holds a checkpoint of step 1 or 2 of its 4 (the middle of a cell); run id -> whether it held
    a checkpoint."""
    child = sweep_child(spec_path, results, workers=workers)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            assert child.poll() is None, "the sweep ended before it could be killed"
            dirs = run_dirs(results, "resume")
            started = [d for d in dirs if (d / "starts.txt").exists()]
            mid = [d for d in started if RunStore(d, d.name).read_status()["state"] == "running"
                   and (RunStore(d, d.name).latest_checkpoint() or (99,))[0] <= 2]  # 2+ steps (0.5 s) still to go
            if len(started) >= seeds_started and mid:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no run reached the middle of a cell in 120 s")
    finally:
        held = {d.name: RunStore(d, d.name).latest_checkpoint() is not None for d in run_dirs(results, "resume")}
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    return held


@pytest.mark.parametrize("workers, parallel", [(1, 1), (2, 2)], ids=["in-process", "two-local-workers"])
def test_a_sweep_killed_mid_cell_covers_every_grid_cell_once_after_a_restart(tmp_path, workers, parallel):
    """Bug caught: killed during its first trial and started again, the sweep repeated that trial's cell as trial 1
    ("run ... is done: reused": GridSampler numbers its first trials' grid points through a permutation seeded by
    the sampler seed, which the resume had moved on by the trials held), never ran one cell and still printed
    "4 trials counted (4 complete)"."""
    spec_path = write_spec(tmp_path / "resume.yaml", SWEEP.replace("PARALLEL", str(parallel)))
    results = tmp_path / "results"
    held = _kill_mid_cell(spec_path, results, workers, seeds_started=2)

    events: list[str] = []
    result = Sweep(load_spec(spec_path), results, run_fn=RUN_FN, sys_path=[str(TESTS)], poll_s=0.2, workers=1,
                   echo=events.append).run()
    trials = result.study.trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4, [(t.state.name, t.user_attrs) for t in trials]
    cells = sorted((t.params["n"], t.params["k"]) for t in trials)
    assert cells == [(4, 2), (4, 4), (8, 2), (8, 4)]  # every cell once
    assert any("taken up again from the interrupted sweep" in e for e in events)
    for t in trials:
        assert t.user_attrs["seeds"] == [0, 1, 2] and len(t.user_attrs["seed_values"]) == 3  # no seed lost
        assert t.value == pytest.approx(cell_base(t.params["n"], t.params["k"]))
    dirs = run_dirs(results, "resume")
    assert len(dirs) == 12  # 4 cells x 3 seeds, no run of another cell
    resumed = 0
    for d in dirs:
        starts = (d / "starts.txt").read_text().split()
        if held.get(d.name):  # it had a checkpoint when the sweep was killed: never trained again from the start
            assert starts.count("1") == 1 and len(starts) <= 2, (d.name, starts)
        elif d.name not in held:  # not started then: trained once
            assert starts == ["1"], (d.name, starts)
        resumed += len(starts) > 1 and starts[1] != "1"
        store = RunStore(d, d.name)
        assert store.read_status()["state"] == "done"
        assert sorted(r["step"] for r in store.read("metrics") if r["split"] == "train") == [1, 2, 3, 4]
    assert resumed >= 1  # the run cut off mid-cell went on from its checkpoint
