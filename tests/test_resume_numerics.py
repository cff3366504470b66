"""A run's numbers follow from its spec and the machine kind alone (issue 39): not from --workers, not from
other solbench runs on the machine, not from a resume, not from a lost env.json.

The thread count is the config's numerics.threads (solbench.machine.threads); what the machine decides (CPU model,
capability, torch) is recorded by the first attempt in env.json and status.json and compared by every
later one (solbench.machine.numerics), which says in one line when it cannot match it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from solbench.config import RunConfig
from solbench.launch import RunTask, execute_run
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.machine.threads import ENV_THREADS, LOCK_DIR_ENV, available_cores, claim_cores

from _runfns import three_runs_spec

TESTS = Path(__file__).resolve().parent

# Two Sol-RL runs on the shipped tiny model, small enough for a minute on 2 busy cores: evaluations
# at steps 0, 2 and 3, a checkpoint per step.
SOL_RL_SPEC = """
name: numresume
launch: local
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 3
  checkpoint_every: 1
  quant: {recipe: nvfp4_tiny, backend: emulated}
  sampling: {steps: 6, eval_steps: 6}
  eval: {every: 2, prompts: shapes/eval, n_prompts: 4, seeds_per_prompt: 1, rewards: [shapes_geneval], grid_prompts: 1}
matrix:
  method: [sol_rl]
  seed: [0, 1]
  n: [8]
  k: [4]
  explore_steps: [4]
"""


def solbench_run(spec_path, results, workers, *, env=None, run_fn="_interrupt_runfns:sigterm_at_eval"):
    cmd = [sys.executable, "-m", "solbench", "run", str(spec_path), "--results", str(results), "--no-report",
           "--quiet", "--workers", str(workers), "--run-fn", run_fn]
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in (ENV_THREADS, "SOLBENCH_WORKERS")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)


def rows(store: RunStore, table: str) -> list[dict]:
    """The table's rows without what the clock decides (wall_s, seconds)."""
    return [{k: v for k, v in row.items() if k not in ("wall_s", "seconds")} for row in store.read(table)]


@pytest.fixture
def private_cores(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))  # no other solbench run's claims interfere
    monkeypatch.delenv(ENV_THREADS, raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    return tmp_path / "locks"


@pytest.mark.slow
def test_sigterm_at_an_eval_then_a_resume_without_env_json_and_another_worker_count_gives_the_uninterrupted_rows(
        tmp_path, private_cores):
    # Bugs caught: a run resumed by `solbench run --workers 1` computing on every core it could claim where
    # its first attempt, one of 2 runs on 2 workers, had one (other rows after the resume on every CPU whose
    # sums depend on the thread count); and a lost env.json letting the resume record its own numerics as
    # if the first attempt had run with them (issue 39).
    spec_path = tmp_path / "numresume.yaml"
    spec_path.write_text(textwrap.dedent(SOL_RL_SPEC))
    spec = load_spec(spec_path)
    interrupted, reference = tmp_path / "interrupted", tmp_path / "reference"
    locks = {LOCK_DIR_ENV: str(private_cores)}

    first = solbench_run(spec_path, interrupted, 2, env={"SOLBENCH_TEST_SIGTERM_AT": "2", **locks})
    assert first.returncode == 1 and "did not finish" in first.stdout, first.stdout + first.stderr[-3000:]
    stores = [RunStore(spec.run_dir(interrupted, r.run_id), r.run_id) for r in spec.runs]
    assert (interrupted / "numresume" / ".sigterm-sent").exists()
    seen = {s.run_id: (s.read_status(), [step for step, _ in s.checkpoint_files()]) for s in stores}
    # the launcher outlived its workers: each run failed with the signal that ended its worker
    assert all(status["state"] == "failed" and status["error"].startswith("WorkerDied: its worker process was "
                                                                          "killed by SIGTERM") and ckpts
               for status, ckpts in seen.values()), (seen, first.stdout[-2000:], first.stderr[-3000:])
    stopped_at = [s.latest_checkpoint()[0] for s in stores]
    assert min(stopped_at) < spec.runs[0].config.iterations  # a resume has steps left to compute
    first_numerics = [s.read_json("env.json")["numerics"] for s in stores]
    for store in stores:
        (store.run_dir / "env.json").unlink()  # lost: status.json still holds the first attempt's setting

    second = solbench_run(spec_path, interrupted, 1, env=locks)
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "other numerics" not in second.stderr and "are lost" not in second.stderr

    full = solbench_run(spec_path, reference, 2, env=locks)  # uninterrupted, one worker per run as the first attempt
    assert full.returncode == 0, full.stdout + full.stderr[-3000:]
    for run, store, numerics in zip(spec.runs, stores, first_numerics):
        same = RunStore(spec.run_dir(reference, run.run_id), run.run_id)
        for table in ("metrics", "candidates"):
            assert rows(store, table) == rows(same, table), f"{run.run_id} {table}"
        env = store.read_json("env.json")
        assert env["numerics"] == numerics  # the first attempt's, recovered from status.json
        (attempt,) = env["attempts"]  # the env.json of attempt 1 is gone; attempt 2 is in-process
        assert attempt["attempt"] == 2 and "local_worker" not in attempt["cpu_allocation"]
        assert attempt["cpu_allocation"]["source"] == "config" and attempt["numerics"]["threads"] == 1
        assert "numerics_differ" not in attempt


def same_spec_rows(spec, results) -> dict[str, dict[str, list[dict]]]:
    return {r.run_id: {t: rows(RunStore(spec.run_dir(results, r.run_id), r.run_id), t) for t in ("metrics", "candidates")}
            for r in spec.runs}


@pytest.mark.slow
def test_workers_1_workers_2_and_a_machine_whose_cores_other_runs_hold_write_identical_rows(tmp_path, private_cores):
    # Bug caught (issue 39): --workers 1 ran a run in-process on every free core, --workers 2 on one core
    # each, and beside other solbench runs on 1 thread: three thread counts, three sets of numbers (171 of
    # 264 metric rows differed between --workers 1 and 2 on an Intel Xeon).
    spec_path = tmp_path / "numresume.yaml"
    spec_path.write_text(textwrap.dedent(SOL_RL_SPEC).replace("iterations: 3", "iterations: 2")
                         .replace("every: 2", "every: 1"))
    spec = load_spec(spec_path)
    locks = {LOCK_DIR_ENV: str(private_cores)}
    results = {}
    for label, workers in (("one", 1), ("two", 2)):
        done = solbench_run(spec_path, tmp_path / label, workers, env=locks, run_fn="solbench.train.trainer:train_run")
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        results[label] = same_spec_rows(spec, tmp_path / label)
    # beside another solbench run that holds every core (its claims), with a busy loop on each core
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in available_cores()]
    try:
        with claim_cores(available_cores()) as held:
            assert len(held) == len(available_cores())
            done = solbench_run(spec_path, tmp_path / "busy", 2, env=locks, run_fn="solbench.train.trainer:train_run")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    results["busy"] = same_spec_rows(spec, tmp_path / "busy")
    for run in spec.runs:
        env = RunStore(spec.run_dir(tmp_path / "busy", run.run_id), run.run_id).read_json("env.json")
        assert env["cpu_allocation"]["cores"] == [] and env["torch_threads"] == 1  # unpinned, same count
    counted = sum(len(tables["metrics"]) for tables in results["one"].values())
    assert counted >= 2 * 8 and all(results[label] == results["one"] for label in ("two", "busy"))


THREE = three_runs_spec("pinned")


def interrupted_after_step_2(tmp_path, monkeypatch, config: dict | None = None) -> tuple[RunConfig, RunStore]:
    """Attempt 1 of a run, stopped by KeyboardInterrupt after its checkpoint of step 2 as Ctrl-C would."""
    spec_path = tmp_path / "pinned.yaml"
    spec_path.write_text(textwrap.dedent(THREE))
    run = load_spec(spec_path).runs[0]
    cfg = RunConfig.from_dict({**run.config.to_dict(), **(config or {})})
    monkeypatch.setenv("SOLBENCH_TEST_INTERRUPT_AT", "2")
    store = RunStore(tmp_path / "results" / cfg.run_id, cfg.run_id)
    store.write_json("spec.json", cfg.to_dict())
    with pytest.raises(KeyboardInterrupt):
        execute_run(RunTask(str(store.run_dir), cfg.to_dict(), "_runfns:eval_curve_run", [str(TESTS)]))
    monkeypatch.delenv("SOLBENCH_TEST_INTERRUPT_AT")
    return cfg, store


def test_a_resume_that_lost_both_records_of_its_numerics_says_so_in_one_line(tmp_path, monkeypatch, private_cores,
                                                                              caplog):
    # Bug caught: a resume after env.json (and the status's copy) were lost recording its own numerics as
    # the run's without a word, so nothing could tell that its rows may not match the first attempt's.
    cfg, store = interrupted_after_step_2(tmp_path, monkeypatch)
    recorded = store.read_status()["numerics"]
    assert recorded == store.read_json("env.json")["numerics"] and recorded["threads"] == 1
    (store.run_dir / "env.json").unlink()
    status = store.read_status()
    del status["numerics"]
    store.write_json("status.json", status)
    with caplog.at_level(logging.WARNING):
        assert execute_run(RunTask(str(store.run_dir), cfg.to_dict(), "_runfns:eval_curve_run", [str(TESTS)]))[
            "state"] == "done"
    said = [r.getMessage() for r in caplog.records if "numerics" in r.getMessage()]
    assert said == [f"run {cfg.run_id} resumes from a checkpoint, but the numerics its first attempt ran with are "
                    "lost (neither env.json nor status.json records them): its rows from here on cannot be shown to "
                    "match an uninterrupted run's (recorded in its env.json)"]
    (attempt,) = store.read_json("env.json")["attempts"]
    assert attempt["numerics_differ"] == ["the first attempt's numerics are unknown (env.json and status.json lost)"]


def test_a_resume_on_another_cpu_capability_says_so_and_records_it(tmp_path, monkeypatch, private_cores, caplog):
    # Bug caught: a resume whose kernels differ from its first attempt's (another CPU kind after a Slurm
    # requeue, or a capped capability) going on without a word.
    cfg, store = interrupted_after_step_2(tmp_path, monkeypatch)
    was = store.read_json("env.json")["numerics"]["cpu_capability"]
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "ELSEWHERE")
    with caplog.at_level(logging.WARNING):
        execute_run(RunTask(str(store.run_dir), cfg.to_dict(), "_runfns:eval_curve_run", [str(TESTS)]))
    said = [r.getMessage() for r in caplog.records if "other numerics" in r.getMessage()]
    assert said == [f"run {cfg.run_id} resumes with other numerics than the attempt that started it: cpu_capability "
                    f"{was} -> ELSEWHERE; its rows from here on may differ from an uninterrupted run's (recorded in "
                    "its env.json)"]
    env = store.read_json("env.json")
    assert env["numerics"]["cpu_capability"] == was  # the run's record stays its first attempt's
    assert [a.get("numerics_differ") for a in env["attempts"]] == [None, [f"cpu_capability {was} -> ELSEWHERE"]]


def test_a_thread_count_above_the_cores_here_takes_one_thread_per_core_and_says_it(tmp_path, monkeypatch,
                                                                                    private_cores, caplog):
    # Bug caught: a run whose numerics.threads cannot be had running on fewer threads unsaid (its numbers are
    # then not its spec's), or oversubscribing the cores.
    many = len(available_cores()) + 1
    spec_path = tmp_path / "pinned.yaml"
    spec_path.write_text(textwrap.dedent(THREE))
    run = load_spec(spec_path).runs[0]
    cfg = RunConfig.from_dict({**run.config.to_dict(), "numerics": {"threads": many}})
    store = RunStore(tmp_path / "results" / cfg.run_id, cfg.run_id)
    with caplog.at_level(logging.WARNING):
        execute_run(RunTask(str(store.run_dir), cfg.to_dict(), "_runfns:eval_curve_run", [str(TESTS)]))
    differ = f"threads {many} -> {many - 1} (only {many - 1} core(s) here)"
    assert [r.getMessage() for r in caplog.records if "numerics" in r.getMessage()] == [
        f"run {cfg.run_id} cannot have the numerics its config sets: {differ}; its numbers may differ from the same "
        "spec's elsewhere (recorded in its env.json)"]
    env = store.read_json("env.json")
    assert env["attempts"][0]["numerics_differ"] == [differ] and env["cpu_allocation"]["wanted"] == many
