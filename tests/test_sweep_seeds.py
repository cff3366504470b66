"""A sweep cell is R run seeds (solbench/report/sweep_cell.py, solbench/sweep/runner.py): the trial's value is the
seeds' mean, each seed's value, the cell's interval (seeds crossed with eval prompts) and its measured seconds per
iteration are kept in the trial and in trials.parquet, and the pruner decides on the mean of the seeds' intermediate values.

Trials run ``_sweep_runfns.seeded_cell_run``: a run's eval reward is (n/16 + k/100 + SEED_EFFECT[seed]) * step /
iterations with seed effects -0.3, +0.15, +0.15 (mean zero: a cell's mean is n/16 + k/100, while its seed 0 alone is
far below), and its training clock advances 0.5 + n/8 + k/4 s a step, so every number below is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from _sweep_runfns import PROMPT_EFFECT, SEED_EFFECT, cell_base, iteration_seconds, write_spec
from solbench.errors import ConfigError
from solbench.report.stats import crossed_interval
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.sweep import Sweep, open_study

TESTS = Path(__file__).resolve().parent
RUN_FN = "_sweep_runfns:seeded_cell_run"

def make_spec(tmp_path: Path, sweep: str):
    return load_spec(write_spec(tmp_path / "seeds.yaml", sweep))


def sweep(spec, results, **kwargs):
    kwargs.setdefault("workers", 1)
    return Sweep(spec, results, run_fn=RUN_FN, sys_path=[str(TESTS)], poll_s=0.2, **kwargs)


def test_a_trial_runs_its_cell_with_three_seeds_and_keeps_each_value_and_the_cell_interval(tmp_path):
    """Bug caught: a trial was one run of one seed, so a cell's value was that seed's and its interval covered the eval
    prompts only; here the value must be the mean of seeds 0, 1, 2 (seed 0 alone is 0.3 below it)."""
    spec = make_spec(tmp_path, """
        trials: 2
        sampler: grid
        storage: journal
        pruner: {kind: none}
        params: {n: {choices: [4, 8]}, k: {choices: [2]}}
    """)
    assert spec.sweep.seeds_per_cell == 3  # the default
    results = tmp_path / "results"
    result = sweep(spec, results).run()
    trials = sorted(result.study.trials, key=lambda t: t.params["n"])
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    for t in trials:
        n = t.params["n"]
        assert t.user_attrs["seeds"] == [0, 1, 2] and len(set(t.user_attrs["run_ids"])) == 3
        assert t.user_attrs["seed_values"] == pytest.approx([cell_base(n, 2) + e for e in SEED_EFFECT])
        assert t.value == pytest.approx(cell_base(n, 2))  # the mean, not seed 0's
        assert t.intermediate_values == pytest.approx({0: 0.0, 2: cell_base(n, 2) / 2, 4: cell_base(n, 2)})
        matrix = np.array([[cell_base(n, 2) + e + p for p in PROMPT_EFFECT] for e in SEED_EFFECT])
        _, lo, hi, _ = crossed_interval(matrix)
        assert t.user_attrs["interval"] == pytest.approx([lo, hi]) and lo < t.value < hi
        assert t.user_attrs["covers"] == "3 run seeds x 4 eval prompts"
        assert t.user_attrs["seed_seconds_per_iter"] == pytest.approx([iteration_seconds(n, 2)] * 3)
        for run_id, seed in zip(t.user_attrs["run_ids"], [0, 1, 2]):
            store = RunStore(spec.run_dir(results, run_id), run_id)
            assert store.read_json("spec.json")["seed"] == seed and store.read_status()["state"] == "done"
    frame = pd.read_parquet(results / "seeds" / "sweep" / "trials.parquet").sort_values("params_n")
    assert list(frame["seeds"]) == ["0; 1; 2"] * 2
    assert [len(r.split("; ")) for r in frame["run_ids"]] == [3, 3]
    assert [float(v) for v in frame["seed_values"].iloc[0].split("; ")] == pytest.approx(
        [cell_base(4, 2) + e for e in SEED_EFFECT])
    assert list(frame["seconds_per_iter"]) == pytest.approx([iteration_seconds(4, 2), iteration_seconds(8, 2)])
    assert frame["clock"].str.startswith("measured").all() and (frame["lo"] < frame["value"]).all()


def test_the_pruner_decides_on_the_mean_of_the_seeds_never_on_one_seed(tmp_path):
    """Bug caught: pruning on one seed's curve. Cell n=14's seed 0 alone is below the median at step 2 (0.30 < 0.385)
    while its mean is above it (0.45): it must complete; cell n=4's mean is below: pruned at step 2 on the mean."""
    spec = make_spec(tmp_path, """
        trials: 4
        sampler: random
        storage: journal
        pruner: {kind: median, n_startup_trials: 2}
        params: {n: {choices: [4, 8, 14, 16]}, k: {choices: [2]}}
    """)
    results = tmp_path / "results"
    study = open_study(spec, results)
    for n in (16, 8, 14, 4):
        study.enqueue_trial({"n": n, "k": 2})
    result = sweep(spec, results).run()
    states = [(t.params["n"], t.state.name) for t in result.study.trials]
    assert states == [(16, "COMPLETE"), (8, "COMPLETE"), (14, "COMPLETE"), (4, "PRUNED")]
    assert (cell_base(14, 2) + SEED_EFFECT[0]) / 2 < np.median([cell_base(16, 2) / 2, cell_base(8, 2) / 2])
    pruned = result.study.trials[3]
    assert pruned.intermediate_values == pytest.approx({0: 0.0, 2: cell_base(4, 2) / 2})  # the seeds' mean
    assert pruned.user_attrs["reason"] == "pruned at step 2 (mean of 3 seeds)"
    states = {}
    for run_id in pruned.user_attrs["run_ids"]:
        store = RunStore(spec.run_dir(results, run_id), run_id)
        status = store.read_status()
        states[store.read_json("spec.json")["seed"]] = (status["state"], status.get("pruned", False),
                                                        max(r["step"] for r in store.read("metrics")))
    # in this process the seeds run one after another: the mean exists once the last seed evaluates step 2
    assert states == {0: ("done", False, 4), 1: ("done", False, 4), 2: ("failed", True, 2)}


def test_reward_against_measured_seconds_per_iteration_is_a_two_objective_study(tmp_path):
    """Bug caught: the sweep's time axis existed only as a projection; clock: measured must give each cell its own
    runs' training seconds per iteration (0.5 + n/8 + k/4 here), labelled measured."""
    spec = make_spec(tmp_path, """
        trials: 2
        seeds_per_cell: 2
        sampler: grid
        storage: journal
        objective: {kind: reward_and_time, metric: shapes_geneval, clock: measured}
        pruner: {kind: none}
        params: {n: {choices: [4, 16]}, k: {choices: [2]}}
    """)
    result = sweep(spec, tmp_path / "results").run()
    by_n = {t.params["n"]: t for t in result.study.trials}
    for n, t in by_n.items():
        assert t.values == pytest.approx([cell_base(n, 2) + (SEED_EFFECT[0] + SEED_EFFECT[1]) / 2,
                                          iteration_seconds(n, 2)])
    assert {t.number for t in result.study.best_trials} == {by_n[4].number, by_n[16].number}  # both on the front
    assert "MEASURED" in sweep(spec, tmp_path / "results").objective.describe()


def test_a_swept_seed_with_several_seeds_per_cell_is_refused(tmp_path):
    """Bug caught: sweeping `seed` while every cell also runs seeds 0..R-1 would train the same runs for other cells."""
    spec = make_spec(tmp_path, """
        trials: 2
        params: {n: {choices: [4]}, k: {choices: [2]}, seed: {choices: [0, 1]}}
    """)
    with pytest.raises(ConfigError, match="seed is swept .* seeds_per_cell: 1"):
        sweep(spec, tmp_path / "results")


def test_local_workers_run_a_cells_seeds_side_by_side_and_a_pruned_cells_running_seed_is_stopped(tmp_path, monkeypatch):
    """Bug caught: locally a sweep ran one run at a time on a 2-core machine; with two workers the seeds of a cell
    run at once, and a cell pruned on its seeds' mean has its still-running seed stopped (its worker ended) and
    recorded pruned, not left to finish."""
    spec = make_spec(tmp_path, """
        trials: 3
        parallel: 1
        sampler: random
        storage: journal
        pruner: {kind: median, n_startup_trials: 2}
        params: {n: {choices: [4, 8, 16]}, k: {choices: [2]}}
    """)
    results = tmp_path / "results"
    study = open_study(spec, results)
    for n in (16, 8, 4):
        study.enqueue_trial({"n": n, "k": 2})
    monkeypatch.setenv("SOLBENCH_TEST_STEP_S", "0.6")  # inherited by the workers
    result = sweep(spec, results, workers=2).run()
    states = [(t.params["n"], t.state.name) for t in result.study.trials]
    assert states == [(16, "COMPLETE"), (8, "COMPLETE"), (4, "PRUNED")]
    first = result.study.trials[0]
    spans = []
    for run_id in first.user_attrs["run_ids"][:2]:  # seeds 0 and 1 went to the two workers together
        status = RunStore(spec.run_dir(results, run_id), run_id).read_status()
        spans.append((status["started_ts"], status["started_ts"] + status["seconds"]))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
    pruned = result.study.trials[2]
    last = RunStore(spec.run_dir(results, pruned.user_attrs["run_ids"][2]), pruned.user_attrs["run_ids"][2])
    status = last.read_status()
    assert status["state"] == "failed" and status["pruned"] is True
    assert max(r["step"] for r in last.read("metrics")) < 4  # stopped before it finished
