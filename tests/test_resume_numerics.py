"""Numerics that do not depend on how a run was scheduled (issue 22, item 2).

A run's thread count changes its numbers (on an AMD EPYC, the Sol-RL spec below on 2 threads instead
of 1: candidate rewards up to 0.05 apart, eval rewards 1e-6). It is fixed by the run's first
attempt, recorded in env.json and used again by every later attempt, in a worker process or
in-process; env.json keeps every attempt; an attempt that cannot reproduce it says so in one line
and records it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from solbench.launch import RunTask, execute_run, launch_spec
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.threads import ENV_THREADS, LOCK_DIR_ENV, available_cores

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


def solbench_run(spec_path, results, workers, *, env=None):
    cmd = [sys.executable, "-m", "solbench", "run", str(spec_path), "--results", str(results), "--no-report",
           "--quiet", "--workers", str(workers), "--run-fn", "_interrupt_runfns:sigterm_at_eval"]
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in (ENV_THREADS, "SOLBENCH_WORKERS")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)


def rows(store: RunStore, table: str) -> list[dict]:
    """The table's rows without what the clock decides (wall_s, seconds)."""
    return [{k: v for k, v in row.items() if k not in ("wall_s", "seconds")} for row in store.read(table)]


@pytest.mark.slow
def test_sigterm_at_an_eval_then_a_resume_with_another_worker_count_gives_the_uninterrupted_rows(tmp_path):
    # Bug caught: with one worker per run (2 runs, --workers 2) each run computes on 1 thread; resumed
    # by `solbench run --workers 1` it ran in-process on every core it could claim (2 here), and on a
    # CPU whose sums depend on the thread count (AMD EPYC: every one tried) its rows after the resume
    # differed from an uninterrupted run's. And env.json kept only the last attempt.
    spec_path = tmp_path / "numresume.yaml"
    spec_path.write_text(textwrap.dedent(SOL_RL_SPEC))
    spec = load_spec(spec_path)
    interrupted, reference = tmp_path / "interrupted", tmp_path / "reference"

    first = solbench_run(spec_path, interrupted, 2, env={"SOLBENCH_TEST_SIGTERM_AT": "2"})
    assert first.returncode == 1 and "did not finish" in first.stdout, first.stdout + first.stderr[-3000:]
    stores = [RunStore(spec.run_dir(interrupted, r.run_id), r.run_id) for r in spec.runs]
    assert (interrupted / "numresume" / ".sigterm-sent").exists()
    seen = {s.run_id: (s.read_status(), [step for step, _ in s.checkpoint_files()]) for s in stores}
    assert all(status["state"] == "running" and ckpts for status, ckpts in seen.values()), \
        (seen, first.stdout[-2000:], first.stderr[-3000:])
    stopped_at = [s.latest_checkpoint()[0] for s in stores]
    assert min(stopped_at) < spec.runs[0].config.iterations  # a resume has steps left to compute

    second = solbench_run(spec_path, interrupted, 1)
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "other numerics" not in second.stderr

    full = solbench_run(spec_path, reference, 2)  # uninterrupted, one worker per run as the first attempt
    assert full.returncode == 0, full.stdout + full.stderr[-3000:]
    for run, store in zip(spec.runs, stores):
        same = RunStore(spec.run_dir(reference, run.run_id), run.run_id)
        for table in ("metrics", "candidates"):
            assert rows(store, table) == rows(same, table), f"{run.run_id} {table}"
        env = store.read_json("env.json")
        attempts = env["attempts"]
        assert [a["attempt"] for a in attempts] == [1, 2]
        assert attempts[0]["cpu_allocation"]["local_worker"]  # attempt 1 in a worker, attempt 2 in-process
        assert "local_worker" not in attempts[1]["cpu_allocation"]
        assert attempts[0]["pid"] != attempts[1]["pid"]
        assert env["numerics"]["threads"] == 1
        assert [a["numerics"]["threads"] for a in attempts] == [1, 1]
        assert attempts[1]["cpu_allocation"]["source"] == "recorded"


THREE = three_runs_spec("pinned")


@pytest.fixture
def private_cores(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))  # no other solbench run's claims interfere
    monkeypatch.delenv(ENV_THREADS, raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)


def interrupted_after_step_2(spec, results, run, monkeypatch, threads: str) -> RunStore:
    """Attempt 1 of ``run`` on ``threads`` threads (SOLBENCH_THREADS), stopped by KeyboardInterrupt
    after its checkpoint of step 2 as Ctrl-C would stop it."""
    monkeypatch.setenv(ENV_THREADS, threads)
    monkeypatch.setenv("SOLBENCH_TEST_INTERRUPT_AT", "2")
    store = RunStore(spec.run_dir(results, run.run_id), run.run_id)
    store.write_json("spec.json", run.config.to_dict())
    with pytest.raises(KeyboardInterrupt):
        execute_run(RunTask(str(store.run_dir), run.config.to_dict(), "_runfns:eval_curve_run", [str(TESTS)]))
    monkeypatch.delenv(ENV_THREADS)
    monkeypatch.delenv("SOLBENCH_TEST_INTERRUPT_AT")
    return store


def test_a_run_started_on_2_threads_resumes_on_2_even_where_workers_would_give_it_1_core(
        tmp_path, monkeypatch, private_cores, caplog):
    # Bug caught: a run whose first attempt ran in-process on 2 threads went on in a worker process
    # pinned to 1 core on 1 thread (`solbench run --workers 2` with 2 runs left): other numbers.
    # Now the launcher runs fewer runs at once so that the run gets its 2 threads back; on a
    # machine with fewer cores than that, the resume says it cannot reproduce them.
    spec_path = tmp_path / "pinned.yaml"
    spec_path.write_text(textwrap.dedent(THREE))
    spec = load_spec(spec_path)
    results = tmp_path / "results"
    store = interrupted_after_step_2(spec, results, spec.runs[0], monkeypatch, "2")
    assert store.read_json("env.json")["torch_threads"] == 2

    monkeypatch.setenv("SOLBENCH_WORKERS", "2")
    with caplog.at_level(logging.WARNING):
        outcome = launch_spec(load_spec(spec_path), results, run_fn="_runfns:eval_curve_run", sys_path=[str(TESTS)])
    assert set(outcome.submission.states.values()) == {"done"}
    env = store.read_json("env.json")  # its top level: the latest attempt
    if len(available_cores()) >= 2:
        assert env["torch_threads"] == 2 and env["cpu_allocation"]["source"] == "recorded"
        assert env["pid"] == os.getpid()  # run in this process, not in a worker on 1 core
        assert "go on with the 2 threads their first attempt ran on" in caplog.text
        assert "numerics_differ" not in env
    else:  # one core: 2 threads cannot be had without oversubscribing it
        assert env["numerics_differ"] == ["threads 2 -> 1 (only 1 core(s) here)"]
    assert [a["attempt"] for a in env["attempts"]] == [1, 2] and env["numerics"]["threads"] == 2
    assert [r["step"] for r in store.read("metrics")] == [0, 1, 2, 2, 3, 4, 4]


def test_an_explicit_thread_count_that_differs_is_used_said_in_one_line_and_recorded(
        tmp_path, monkeypatch, private_cores, caplog):
    # Bug caught: nothing said that a resume ran on other threads than the run's first attempt, and
    # env.json, rewritten by every attempt, showed only the last one's.
    spec_path = tmp_path / "pinned.yaml"
    spec_path.write_text(textwrap.dedent(THREE))
    spec = load_spec(spec_path)
    run = spec.runs[0]
    store = interrupted_after_step_2(spec, tmp_path / "results", run, monkeypatch, "2")
    monkeypatch.setenv(ENV_THREADS, "1")
    with caplog.at_level(logging.WARNING):
        outcome = execute_run(RunTask(str(store.run_dir), run.config.to_dict(), "_runfns:eval_curve_run", [str(TESTS)]))
    assert outcome["state"] == "done"
    said = [r.getMessage() for r in caplog.records if "other numerics" in r.getMessage()]
    assert said == [f"run {run.run_id} resumes with other numerics than the attempt that started it: threads 2 -> 1 "
                    f"({ENV_THREADS} asks for 1); its rows from here on may differ from an uninterrupted run's "
                    "(recorded in its env.json)"]
    env = json.loads((store.run_dir / "env.json").read_text())
    assert env["numerics"]["threads"] == 2  # the run's setting stays its first attempt's
    assert [(a["attempt"], a["numerics"]["threads"], a.get("numerics_differ")) for a in env["attempts"]] == [
        (1, 2, None), (2, 1, [f"threads 2 -> 1 ({ENV_THREADS} asks for 1)"])]


def test_a_recorded_thread_count_above_the_cores_here_takes_one_thread_per_core_and_says_it(private_cores):
    # Bug caught: a resume on fewer cores than its first attempt's threads either oversubscribing
    # them (every OpenMP region then waits out a time slice) or changing the count unsaid.
    import torch

    from solbench import threads

    cores = available_cores()
    before = torch.get_num_threads()
    with threads.cpu_allocation(recorded=len(cores) + 1) as alloc:
        assert (alloc.threads, alloc.source) == (len(cores), "recorded, fewer cores")
        assert torch.get_num_threads() == len(cores)
    with threads.cpu_allocation(recorded=1) as alloc:  # fits: taken, on one claimed core
        assert (alloc.threads, alloc.source) == (1, "recorded") and len(alloc.cores) == 1
        assert threads.available_cores() == alloc.cores
    assert torch.get_num_threads() == before and threads.available_cores() == cores
