"""Optuna sweeps (solbench.sweep, `solbench sweep`): objectives on hand-written metrics rows, search
space checks, a study that persists and continues (new trials added, finished ones kept, done runs
reused, a trial cut off by Ctrl-C taken up again and resumed), median pruning of a known-bad curve,
invalid combinations, the trials table the report reads, and trials in parallel on Slurm.

Trials run ``_runfns.eval_curve_run`` (eval reward = (n/16 + k/100 + seed/1000) * step / iterations,
``wall_s`` = step), so every value below is known in advance. One slow test sweeps through the real
trainer; the Slurm test skips only when `scontrol ping` fails.
"""

from __future__ import annotations

import math
import re
import subprocess
import textwrap
from datetime import datetime
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from solbench.cli import main as cli
from solbench.errors import ConfigError
from solbench.launch import lock_is_held
from solbench.results import RunStore
from solbench.spec import load_spec

from _slurm import slurm_up
from solbench.sweep import (CurvePoint, Objective, Sweep, final_reward, metric_curve, open_study, reward_at_budget,
                            run_sweep, search_space, time_to_target)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RUN_FN = "_runfns:eval_curve_run"

SPEC = """
name: sweeptest
launch: LAUNCH
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 4
  eval: {every: 2, prompts: shapes/eval, n_prompts: 2, seeds_per_prompt: 1, rewards: [shapes_geneval]}
matrix:
  method: [sol_rl]
  seed: [0]
sweep:
  SWEEP
"""


def make_spec(tmp_path: Path, sweep: str, launch: str = "local", name: str = "sweeptest"):
    path = tmp_path / f"{name}.yaml"
    body = textwrap.dedent(SPEC).replace("LAUNCH", launch).replace("name: sweeptest", f"name: {name}")
    path.write_text(body.replace("SWEEP", textwrap.indent(textwrap.dedent(sweep).strip(), "  ").lstrip()))
    return load_spec(path)


def quality(n: int, k: int, seed: int = 0) -> float:
    return n / 16 + k / 100 + seed / 1000


def sweep(spec, results, **kwargs):
    kwargs.setdefault("workers", 1)
    return Sweep(spec, results, run_fn=RUN_FN, sys_path=[str(TESTS)], poll_s=0.2, **kwargs)


def summary(study) -> list[tuple]:
    return [(t.number, t.state.name, t.value, dict(t.params), t.user_attrs.get("run_id")) for t in study.trials]


# ----------------------------------------------------------------------------------------------
# Objectives on hand-written rows
# ----------------------------------------------------------------------------------------------

ROWS = [
    {"step": 0, "split": "eval", "metric": "r", "value": 0.10, "wall_s": 0.0},
    {"step": 2, "split": "train", "metric": "r", "value": 9.00, "wall_s": 4.0},  # other split: ignored
    {"step": 2, "split": "eval", "metric": "r/count", "value": 9.0, "wall_s": 4.0},  # other metric: ignored
    {"step": 4, "split": "eval", "metric": "r", "value": 0.20, "wall_s": 10.0},
    {"step": 2, "split": "eval", "metric": "r", "value": 0.30, "wall_s": 4.0},  # out of order
    {"step": 4, "split": "eval", "metric": "r", "value": 0.50, "wall_s": 10.0},  # rewritten step: last wins
    {"step": 6, "split": "eval", "metric": "r", "value": float("nan"), "wall_s": 12.0},  # not finite: skipped
    {"step": 8, "split": "eval", "metric": "r", "value": 0.70, "wall_s": 20.0},
]


def test_metric_curve_keeps_one_finite_point_per_step_in_step_order():
    assert metric_curve(ROWS, "r") == [CurvePoint(0, 0.10, 0.0), CurvePoint(2, 0.30, 4.0), CurvePoint(4, 0.50, 10.0),
                                       CurvePoint(8, 0.70, 20.0)]
    assert metric_curve(ROWS, "r", split="train") == [CurvePoint(2, 9.0, 4.0)]
    assert metric_curve(ROWS, "missing") == []


def test_objectives_final_budget_interpolation_and_time_to_target():
    curve = metric_curve(ROWS, "r")
    assert final_reward(curve) == 0.70
    assert reward_at_budget(curve, 7.0) == pytest.approx(0.30 + (7 - 4) / (10 - 4) * (0.50 - 0.30))  # 0.40
    assert reward_at_budget(curve, 15.0) == pytest.approx(0.60)
    assert reward_at_budget(curve, 4.0) == pytest.approx(0.30)  # exactly on a point
    assert reward_at_budget(curve, 0.0) == pytest.approx(0.10)
    assert reward_at_budget(curve, 99.0) == pytest.approx(0.70)  # training ended before the budget
    assert time_to_target(curve, 0.5) == 10.0  # first reached at step 4, not later
    assert time_to_target(curve, 0.25) == 4.0
    assert time_to_target(curve, 0.71) == math.inf

    assert Objective("final_reward", "r").value(ROWS) == 0.70
    assert Objective("reward_at_budget", "r", budget_s=7.0).value(ROWS) == pytest.approx(0.40)
    ttt = Objective("time_to_target", "r", target=0.5)
    assert ttt.value(ROWS) == 10.0 and ttt.direction == "minimize"
    assert ttt.intermediate(CurvePoint(2, 0.30, 4.0)) == pytest.approx(0.2)  # the gap, lower is better
    with pytest.raises(ConfigError, match="budget_s"):
        Objective("reward_at_budget", "r")
    with pytest.raises(ConfigError, match="target"):
        Objective("time_to_target", "r")
    with pytest.raises(Exception, match="no eval rows of metric 'missing'"):
        Objective("final_reward", "missing").value(ROWS)


# ----------------------------------------------------------------------------------------------
# Search space
# ----------------------------------------------------------------------------------------------

def test_search_space_maps_params_and_rejects_bad_declarations(tmp_path):
    spec = make_spec(tmp_path, """
        params:
          n: {choices: [4, 8]}
          k: {low: 2, high: 6, step: 2}
          finetune.lr: {low: 1.0e-5, high: 1.0e-3, log: true, type: float}
    """)
    space = search_space(spec)
    assert space.fixed == {"method": "sol_rl", "seed": 0}
    assert isinstance(space.distributions["n"], optuna.distributions.CategoricalDistribution)
    k = space.distributions["k"]
    assert (k.low, k.high, k.step) == (2, 6, 2)
    assert space.distributions["finetune.lr"].log
    run = spec.resolve(space.assignment({"n": 8, "k": 4, "finetune.lr": 1e-4}), ("sweep",))
    assert run.config.method_config["n"] == 8 and run.config.finetune.lr == 1e-4

    with pytest.raises(ConfigError, match=r"sweeptest.yaml:\d+: .*unknown matrix key 'kk'"):
        search_space(make_spec(tmp_path, "params: {kk: {choices: [1]}}"))
    with pytest.raises(ConfigError, match="not both"):
        search_space(make_spec(tmp_path, "params: {n: {choices: [4], low: 1, high: 4}}"))
    with pytest.raises(ConfigError, match="whole low/high/step"):
        search_space(make_spec(tmp_path, "params: {n: {low: 1.5, high: 4}}"))
    # a range that reaches outside the field's bounds (FIELD_BOUNDS): a negative learning rate
    with pytest.raises(ConfigError, match=r"sweeptest.yaml:\d+: sweep.params.finetune.lr.low: should be greater than "
                                          r"0, got -0.001 \(finetune.lr's range\)"):
        search_space(make_spec(tmp_path, "params: {finetune.lr: {low: -1.0e-3, high: 1.0e-3, type: float}}"))
    with pytest.raises(ConfigError, match=r"sweep.params.finetune.weight_decay.choices: should be greater than or "
                                          r"equal to 0, got -0.1"):
        search_space(make_spec(tmp_path, "params: {finetune.weight_decay: {choices: [0.0, -0.1]}}"))
    # a grid sampler needs a finite grid: refused by search_space itself, before a study can exist
    with pytest.raises(ConfigError, match=r"sweeptest.yaml:\d+: sweep.params.finetune.lr: a continuous or log range, "
                                          "which sampler grid cannot enumerate"):
        search_space(make_spec(tmp_path, """
            sampler: grid
            params: {finetune.lr: {low: 1.0e-5, high: 1.0e-3, type: float}}
        """))
    path = tmp_path / "sweeptest.yaml"
    path.write_text(path.read_text().replace("seed: [0]", "seed: [0, 1]"))
    with pytest.raises(ConfigError, match=r"sweeptest.yaml:\d+: matrix.seed: 2 values.*sweep.params.seed"):
        search_space(load_spec(path))


# ----------------------------------------------------------------------------------------------
# Persistence and resume
# ----------------------------------------------------------------------------------------------

def test_the_study_persists_continues_and_reuses_done_runs(tmp_path):
    spec = make_spec(tmp_path, """
        trials: 2
        seeds_per_cell: 1
        sampler: random
        storage: sqlite
        pruner: {kind: none}
        params:
          n: {choices: [4, 8, 16]}
          k: {choices: [2]}
    """)
    results = tmp_path / "results"
    first = sweep(spec, results).run()
    assert [t.state.name for t in first.study.trials] == ["COMPLETE", "COMPLETE"]
    for t in first.study.trials:
        assert t.value == pytest.approx(quality(t.params["n"], 2))
        assert sorted(t.intermediate_values) == [0, 2, 4]
        store = RunStore(spec.run_dir(results, t.user_attrs["run_id"]), t.user_attrs["run_id"])
        assert store.read_json("spec.json")["method_config"]["n"] == t.params["n"]
    before = summary(first.study)
    assert (results / "sweeptest" / "sweep" / "optuna.db").exists()

    # A second invocation (a new process would do the same: everything is read from disk).
    second = run_sweep(load_spec(spec.path), results, trials=5, run_fn=RUN_FN, poll_s=0.2)
    after = summary(second.study)
    assert len(after) == 5 and after[:2] == before  # the first trials are kept as they were
    assert all(state == "COMPLETE" for _, state, *_ in after)
    assert second.finished_now == [2, 3, 4]
    # 5 trials over 3 possible runs: repeated params reuse the run (trained once, started once).
    run_ids = {run_id for *_, run_id in after}
    assert len(run_ids) <= 3
    for run_id in run_ids:
        assert (spec.run_dir(results, run_id) / "starts.txt").read_text().split() == ["1"]

    frame = pd.read_parquet(results / "sweeptest" / "sweep" / "trials.parquet")
    assert list(frame["number"]) == [0, 1, 2, 3, 4] and set(frame["state"]) == {"COMPLETE"}
    assert list(frame["params_n"]) == [p["n"] for _, _, _, p, _ in after]
    assert frame["value"].tolist() == pytest.approx([v for _, _, v, _, _ in after])
    assert set(frame["direction"]) == {"maximize"}
    from solbench.report.sweep_io import load_trials

    trials, direction = load_trials(results / "sweeptest" / "sweep")
    assert direction == "maximize" and {"n", "k", "value", "run_id"} <= set(trials.columns) and len(trials) == 5

    # Nothing left to do: a third invocation asks nothing.
    third = run_sweep(load_spec(spec.path), results, trials=5, run_fn=RUN_FN, poll_s=0.2)
    assert third.finished_now == [] and len(third.study.trials) == 5

    # The study refuses a changed search space instead of mixing it in.
    spec.path.write_text(spec.path.read_text().replace("[4, 8, 16]", "[4, 8, 32]"))
    with pytest.raises(ConfigError, match="sweep.params differs .* set sweep.study to a new name"):
        run_sweep(load_spec(spec.path), results, run_fn=RUN_FN)


def test_a_trial_cut_off_by_ctrl_c_is_taken_up_again_and_its_run_resumes(tmp_path, monkeypatch):
    spec = make_spec(tmp_path, """
        trials: 1
        seeds_per_cell: 1
        storage: journal
        params: {n: {choices: [8]}, k: {choices: [2]}}
    """)
    results = tmp_path / "results"
    monkeypatch.setenv("SOLBENCH_TEST_INTERRUPT_AT", "2")
    with pytest.raises(KeyboardInterrupt):
        sweep(spec, results).run()
    study = open_study(spec, results, create=False)
    (trial,) = study.trials
    assert trial.state.name == "RUNNING" and trial.intermediate_values == {0: 0.0, 2: pytest.approx(quality(8, 2) / 2)}
    run_dir = spec.run_dir(results, trial.user_attrs["run_id"])

    result = sweep(load_spec(spec.path), results).run()
    (trial,) = result.study.trials
    assert trial.state.name == "COMPLETE" and trial.value == pytest.approx(quality(8, 2))
    assert (run_dir / "starts.txt").read_text().split() == ["1", "3"]  # resumed after the step-2 checkpoint
    store = RunStore(run_dir, run_dir.name)
    assert [r["step"] for r in store.read("metrics") if r["split"] == "eval"] == [0, 2, 4]
    assert store.read_status()["state"] == "done"
    assert (results / "sweeptest" / "sweep" / "optuna.journal").exists()


# ----------------------------------------------------------------------------------------------
# Pruning, objectives through the sweep, invalid combinations
# ----------------------------------------------------------------------------------------------

def test_median_pruner_stops_a_run_below_the_median_of_completed_trials(tmp_path):
    spec = make_spec(tmp_path, """
        trials: 3
        seeds_per_cell: 1
        sampler: random
        storage: journal
        pruner: {kind: median, n_startup_trials: 2}
        params: {n: {choices: [4, 8, 16]}, k: {choices: [2]}}
    """)
    results = tmp_path / "results"
    study = open_study(spec, results)
    for n in (16, 8, 4):  # a known order: two good curves, then one below their median
        study.enqueue_trial({"n": n, "k": 2})
    result = sweep(spec, results).run()
    states = [(t.params["n"], t.state.name) for t in result.study.trials]
    assert states == [(16, "COMPLETE"), (8, "COMPLETE"), (4, "PRUNED")]
    pruned = result.study.trials[2]
    # step 0 ties the median (0.0); step 2: 0.135 < median(0.51, 0.26) -> pruned there
    assert pruned.intermediate_values == {0: 0.0, 2: pytest.approx(quality(4, 2) / 2)}
    assert pruned.user_attrs["reason"] == "pruned at step 2"
    store = RunStore(spec.run_dir(results, pruned.user_attrs["run_id"]), pruned.user_attrs["run_id"])
    status = store.read_status()
    assert status["state"] == "failed" and status["pruned"] is True and "pruned by sweep" in status["error"]
    assert max(r["step"] for r in store.read("metrics")) == 2  # stopped at the deciding evaluation
    assert store.latest_checkpoint()[0] == 1  # and resumable from there
    frame = pd.read_parquet(results / "sweeptest" / "sweep" / "trials.parquet")
    assert list(frame["state"]) == ["COMPLETE", "COMPLETE", "PRUNED"] and list(frame["last_step"]) == [4, 4, 2]


def test_time_to_target_minimises_and_invalid_combinations_do_not_count(tmp_path):
    spec = make_spec(tmp_path, """
        trials: 10
        seeds_per_cell: 1
        sampler: grid
        storage: journal
        objective: {kind: time_to_target, metric: shapes_geneval, target: 0.3}
        pruner: {kind: none}
        params: {n: {choices: [2, 4, 8]}, k: {choices: [4]}}
    """)
    results = tmp_path / "results"
    result = sweep(spec, results).run()
    by_n = {t.params["n"]: t for t in result.study.trials}
    assert by_n[2].state.name == "FAIL" and by_n[2].user_attrs["invalid"]  # K=4 > N=2
    assert "k <= n" in by_n[2].user_attrs["reason"]
    assert by_n[8].value == 4.0  # 0.54 at step 4 (wall 4 s); 0.27 at step 2 is short of 0.3
    assert by_n[4].value == math.inf  # reaches 0.29 only
    assert result.study.best_trial.params["n"] == 8 and result.study.direction.name == "MINIMIZE"
    assert any("all 3 combinations of the grid" in note for note in result.notes)  # ended: grid used up
    assert len(result.study.trials) == 3

    budget = make_spec(tmp_path, """
        trials: 1
        seeds_per_cell: 1
        storage: journal
        objective: {kind: reward_at_budget, metric: shapes_geneval, budget_s: 3}
        params: {n: {choices: [8]}, k: {choices: [4]}}
    """, name="budgettest")
    (trial,) = sweep(budget, results).run().study.trials
    assert trial.value == pytest.approx(0.75 * quality(8, 4))  # halfway between steps 2 and 4

    wrong = make_spec(tmp_path, """
        storage: journal
        objective: {metric: shapes_clip}
        params: {n: {choices: [8]}, k: {choices: [4]}}
    """, name="wrongmetric")
    with pytest.raises(ConfigError, match="'shapes_clip' is not an eval reward of the runs"):
        sweep(wrong, results).run()


def test_a_crashing_run_fails_its_trial_with_the_error_and_the_others_complete(tmp_path):
    spec = make_spec(tmp_path, """
        trials: 2
        seeds_per_cell: 1
        sampler: grid
        storage: journal
        objective: {metric: reward, split: train}
        params: {seed: {choices: [0, 1]}, n: {choices: [4]}, k: {choices: [2]}}
    """)
    results = tmp_path / "results"
    result = Sweep(spec, results, run_fn="_runfns:crash_on_seed_1", poll_s=0.2).run()
    by_seed = {t.params["seed"]: t for t in result.study.trials}
    assert by_seed[1].state.name == "FAIL"
    assert "ValueError: boom: seed 1 always crashes" in by_seed[1].user_attrs["reason"]
    ok = by_seed[0]
    rows = RunStore(spec.run_dir(results, ok.user_attrs["run_id"]), "x").read("metrics")
    last_train = [r["value"] for r in rows if r["split"] == "train" and r["metric"] == "reward"][-1]
    assert ok.state.name == "COMPLETE" and ok.value == last_train


# ----------------------------------------------------------------------------------------------
# A rejected spec leaves no study behind
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, good, message", [
    ("objective: {metric: shapes_clip}", "objective: {metric: shapes_geneval}",
     r"sweeptest.yaml:\d+: sweep.objective.metric: 'shapes_clip' is not an eval reward of the runs "
     r"\(eval.rewards: shapes_geneval\)"),
    ("sampler: grid\nparams: {n: {choices: [8]}, k: {choices: [2]}, finetune.lr: {low: 1.0e-4, high: 1.0e-3, type: float}}",
     "sampler: grid\nparams: {n: {choices: [8]}, k: {choices: [2]}, finetune.lr: {choices: [1.0e-4, 1.0e-3]}}",
     r"sweeptest.yaml:\d+: sweep.params.finetune.lr: a continuous or log range, which sampler grid cannot enumerate"),
])
def test_a_rejected_sweep_spec_creates_no_study_and_the_corrected_spec_runs(tmp_path, capsys, bad, good, message):
    # Bug caught: `solbench sweep` refused the objective's metric (or a grid sampler's continuous range) only
    # after it had created optuna.db with that definition, so the corrected spec was refused in turn: "sweep.objective
    # differs from the one study 'sweeptest' ... was created with".
    body = "trials: 1\nstorage: sqlite\npruner: {kind: none}\n"
    params = "params: {n: {choices: [8]}, k: {choices: [2]}}\n"
    spec = make_spec(tmp_path, body + bad + ("" if "params:" in bad else "\n" + params))
    results = tmp_path / "results"
    args = ["sweep", str(spec.path), "--results", str(results), "--run-fn", RUN_FN, "--poll", "0.2", "--no-collect"]
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("solbench sweep: error: "), err
    assert re.search(message, err), err
    assert not (results / "sweeptest" / "sweep" / "optuna.db").exists()  # nothing recorded the bad definition

    spec.path.write_text(spec.path.read_text().replace(bad.split("\n")[-1], good.split("\n")[-1]))
    assert cli(args) == 0, capsys.readouterr().err
    (trial,) = open_study(load_spec(spec.path), results, create=False).trials
    assert trial.state.name == "COMPLETE" and trial.params["n"] == 8


def test_a_study_of_rejected_trials_only_is_started_anew_by_a_corrected_spec(tmp_path):
    # Bug caught: a spec whose every combination the spec rejects (K > N) left a study that holds no result,
    # yet refused the corrected search space as another one ("sweep.params differs from the one study ...").
    spec = make_spec(tmp_path, """
        trials: 1
        seeds_per_cell: 1
        sampler: grid
        storage: journal
        params: {n: {choices: [2]}, k: {choices: [4]}}
    """)
    results = tmp_path / "results"
    first = sweep(spec, results).run()
    (rejected,) = first.study.trials
    assert rejected.state.name == "FAIL" and rejected.user_attrs["invalid"]

    spec.path.write_text(spec.path.read_text().replace("k: {choices: [4]}", "k: {choices: [2]}"))
    second = sweep(load_spec(spec.path), results).run()
    (trial,) = second.study.trials
    assert trial.state.name == "COMPLETE" and trial.value == pytest.approx(quality(2, 2))
    assert any("held only 1 trial(s) the spec rejected" in note and "started anew" in note for note in second.notes)

    # a study that holds a result is still refused under another definition (test_the_study_persists... too)
    spec.path.write_text(spec.path.read_text().replace("n: {choices: [2]}", "n: {choices: [4]}"))
    with pytest.raises(ConfigError, match="sweep.params differs from the one study"):
        sweep(load_spec(spec.path), results).run()


# ----------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------

def test_cli_prints_the_trials_and_the_best_and_show_reads_the_study(tmp_path, capsys):
    spec = make_spec(tmp_path, """
        trials: 2
        seeds_per_cell: 1
        sampler: grid
        storage: journal
        params: {n: {choices: [4, 8]}, k: {choices: [2]}}
    """)
    results = str(tmp_path / "results")
    args = [str(spec.path), "--results", results, "--run-fn", RUN_FN, "--poll", "0.2"]
    assert cli(["sweep", *args, "--no-collect"]) == 0
    out = capsys.readouterr().out
    best = [t for t in open_study(spec, results, create=False).trials if t.params["n"] == 8][0]
    assert f"top trial: #{best.number} value {quality(8, 2):.6g} (n=8, k=2) run {best.user_attrs['run_id']}" in out
    assert "not judged against noise" in out  # the best set needs the collected eval samples (tests/test_sweep_cells.py)
    assert "2 trials counted (2 complete)" in out and "trials table:" in out

    assert cli(["sweep", str(spec.path), "--results", results, "--show"]) == 0
    assert f"top trial: #{best.number}" in capsys.readouterr().out
    assert cli(["sweep", str(spec.path), "--results", str(tmp_path / "elsewhere"), "--show"]) == 2
    assert "no sweep study" in capsys.readouterr().err


@pytest.mark.slow
def test_the_shipped_sweep_spec_runs_a_trial_through_the_real_trainer(tmp_path, monkeypatch):
    """Bug caught: a shipped sweep spec whose settings (explore recipe, LoRA, EMA eval, its three eval rewards) the
    real trainer cannot run as a sweep trial, or a trial whose value is not the run's final eval reading or whose
    intermediate values miss an evaluation. One iteration on one training prompt and one eval prompt at one seed:
    the trial's value is read off whatever the run evaluates, so more images check nothing more (the shipped
    settings, sampling steps included, are kept). The CPU-rate measurement a CPU run makes before training (a third
    of this test's time; it changes no number of the run) is left out: tests/test_cpu_rates.py holds it."""
    from solbench.train.trainer import Trainer

    monkeypatch.setattr(Trainer, "_record_cpu_rates", lambda self: None)
    data = yaml.safe_load((REPO / "experiments" / "sweep_nk.yaml").read_text())
    assert set(data["sweep"]["params"]) == {"n", "k"}
    data["base"]["iterations"] = 1
    data["base"]["prompts_per_iter"] = 1
    data["base"]["eval"]["every"] = 1
    data["base"]["eval"]["n_prompts"] = 1
    data["base"]["eval"]["seeds_per_prompt"] = 1
    data["base"]["eval"]["grid_prompts"] = 1
    data["sweep"]["params"] = {"n": {"choices": [4]}, "k": {"choices": [2]}}
    data["sweep"]["seeds_per_cell"] = 1
    path = tmp_path / "sweep_nk.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(path)
    result = run_sweep(spec, tmp_path / "results", trials=1)
    (trial,) = result.study.trials
    assert trial.state.name == "COMPLETE", trial.user_attrs
    rows = RunStore(spec.run_dir(tmp_path / "results", trial.user_attrs["run_id"]), "x").read("metrics")
    final = [r["value"] for r in rows if r["split"] == "eval" and r["metric"] == "shapes_geneval" and r["step"] == 1]
    assert final and trial.value == pytest.approx(final[0]) and sorted(trial.intermediate_values) == [0, 1]


# ----------------------------------------------------------------------------------------------
# Slurm
# ----------------------------------------------------------------------------------------------



SLURM_UP, SLURM_WHY = slurm_up()


@pytest.mark.slurm
@pytest.mark.skipif(not SLURM_UP, reason=SLURM_WHY)
def test_trials_run_in_parallel_on_slurm_and_a_pruned_job_is_cancelled(tmp_path, monkeypatch):
    spec = make_spec(tmp_path, """
        trials: 3
        seeds_per_cell: 1
        parallel: 2
        sampler: random
        storage: journal
        pruner: {kind: median, n_startup_trials: 2}
        params: {n: {choices: [4, 8, 16]}, k: {choices: [2]}}
    """, launch="debug")
    results = tmp_path / "results"
    study = open_study(spec, results)
    for n in (16, 8, 4):
        study.enqueue_trial({"n": n, "k": 2})
    # Inherited by the jobs: 3 s per step leaves the pruned run (decided at step 2 of 4) 6 s of training,
    # more than the test cluster takes to kill a cancelled job (KillWait=5).
    monkeypatch.setenv("SOLBENCH_TEST_STEP_S", "3.0")
    events: list[str] = []
    result = Sweep(spec, results, run_fn=RUN_FN, sys_path=[str(TESTS)], poll_s=0.5, echo=events.append).run()
    trials = result.study.trials
    assert [(t.params["n"], t.state.name) for t in trials] == [(16, "COMPLETE"), (8, "COMPLETE"), (4, "PRUNED")]
    assert [t.value for t in trials[:2]] == pytest.approx([quality(16, 2), quality(8, 2)])
    jobs = [t.user_attrs["job_ids"][0] for t in trials]
    # the first two went out together as one job array, the third as its own job
    assert jobs[0].split("_")[0] == jobs[1].split("_")[0] != jobs[2].split("_")[0]
    assert any("submitted 2 run(s) of 2 cell(s)" in e for e in events)
    pruned = RunStore(spec.run_dir(results, trials[2].user_attrs["run_id"]), trials[2].user_attrs["run_id"])
    status = pruned.read_status()
    assert status["state"] == "failed" and status["pruned"] is True
    assert max(r["step"] for r in pruned.read("metrics")) < 4  # cancelled before it finished
    assert not lock_is_held(pruned.run_dir)  # its process is gone; Slurm at most cleans up after it
    out = subprocess.run(["squeue", "-h", "-o", "%T", "-j", jobs[2]], capture_output=True, text=True)
    assert out.stdout.strip() in ("", "COMPLETING")
    # the two completed trials ran concurrently: their runs' lifetimes overlap
    spans = []
    for t in trials[:2]:
        status = RunStore(spec.run_dir(results, t.user_attrs["run_id"]), t.user_attrs["run_id"]).read_status()
        end = datetime.fromisoformat(status["finished_at"]).timestamp()
        spans.append((end - status["seconds"], end))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans
