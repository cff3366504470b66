"""Sweep cells fanned out on Slurm (solbench/sweep/runner.py): the seed runs of two cells go out together as one
submitit job array, the study lives in one Optuna journal file the sweep shares on the file system, and a sweep
process killed (kill -9) while those jobs train is continued by the next one: it watches the live jobs instead of
submitting them again, so every cell runs once with all its seeds.

Needs the local test cluster (bash slurm/local-cluster.sh up); skips, saying so, when `scontrol ping` fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from _slurm import slurm_up
from _sweep_runfns import cell_base
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.sweep import Sweep

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RUN_FN = "_sweep_runfns:seeded_cell_run"
SLURM_UP, SLURM_WHY = slurm_up()

SPEC = """
name: fanout
launch: debug
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 4
  eval: {every: 2, prompts: shapes/eval, n_prompts: 4, seeds_per_prompt: 1, rewards: [shapes_geneval]}
matrix:
  method: [sol_rl]
  seed: [0]
sweep:
  trials: 3
  parallel: 2
  seeds_per_cell: 3
  sampler: grid
  storage: journal
  pruner: {kind: none}
  params: {n: {choices: [4, 8, 16]}, k: {choices: [2]}}
"""


def _run_dirs(results: Path) -> list[Path]:
    root = results / "fanout"
    return [p for p in root.iterdir() if (p / "spec.json").exists()] if root.exists() else []


def _span(store: RunStore) -> tuple[float, float]:
    status = store.read_status()
    end = datetime.fromisoformat(status["finished_at"]).timestamp()
    return end - status["seconds"], end


@pytest.mark.slurm
@pytest.mark.skipif(not SLURM_UP, reason=SLURM_WHY)
def test_two_cells_train_at_once_on_slurm_and_a_killed_sweep_resumes_without_running_a_cell_twice(tmp_path):
    """Bug caught: a sweep on Slurm ran one run per trial (no seeds), and a sweep process killed while its jobs
    trained could submit the cut-off cell's runs again or lose its seeds."""
    spec_path = tmp_path / "fanout.yaml"
    spec_path.write_text(textwrap.dedent(SPEC))
    results = tmp_path / "results"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from solbench.spec import load_spec
        from solbench.sweep import Sweep
        Sweep(load_spec({str(spec_path)!r}), {str(results)!r}, run_fn={RUN_FN!r}, sys_path=[{str(TESTS)!r}],
              poll_s=0.5).run()
    """)
    env = {**os.environ, "SOLBENCH_TEST_STEP_S": "1.5"}  # inherited by the jobs: about 6 s of training a run
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            assert child.poll() is None, "the sweep ended before it could be killed"
            training = [d for d in _run_dirs(results) if RunStore(d, d.name).latest_checkpoint() is not None
                        and RunStore(d, d.name).read_status()["state"] == "running"]
            if training:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no Slurm job trained a run within 240 s")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert len(_run_dirs(results)) == 6  # the two cells in flight, 3 seeds each, submitted before the kill

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
    dirs = _run_dirs(results)
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
