"""Launching on a real Slurm cluster (slurm/local-cluster.sh up): job arrays through submitit's
executor.batch(), crashes reported with tracebacks, a cancelled job resumed from its checkpoint
after resubmission, and a preempted job checkpointed and requeued by itself.

Skipped only when no Slurm controller answers `scontrol ping` (CI brings the cluster up first).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import torch

from solbench.launch import RunTask, execute_run, launch_spec, run_states, wait_for_runs
from solbench.results import RunStore
from solbench.spec import load_spec

from _cpu import assert_same_numbers
from _slurm import slurm_up

TESTS = Path(__file__).resolve().parent




UP, WHY = slurm_up()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(not UP, reason=WHY)]

SPEC = """
name: slurmtest
launch: debug
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: ITERATIONS
  eval: {every: 2, prompts: shapes/eval, n_prompts: 2, seeds_per_prompt: 1, rewards: [shapes_geneval]}
matrix:
  method: [diffusion_nft]
  seed: SEEDS
  group_size: [2]
"""


def make_spec(tmp_path: Path, seeds: str, iterations: int = 3):
    path = tmp_path / "slurmtest.yaml"
    path.write_text(textwrap.dedent(SPEC).replace("SEEDS", seeds).replace("ITERATIONS", str(iterations)))
    return load_spec(path)


def sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def run_dirs(spec, results):
    return {r.run_id: spec.run_dir(results, r.run_id) for r in spec.runs}


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.5)


def test_a_spec_runs_as_one_job_array_and_a_crash_is_reported_with_its_traceback(tmp_path):
    spec = make_spec(tmp_path, "[0, 1, 2]")
    results = tmp_path / "results"
    outcome = launch_spec(spec, results, run_fn="_runfns:crash_on_seed_1", sys_path=[str(TESTS)])
    job_ids = outcome.submission.job_ids
    assert outcome.executor == "slurm" and len(job_ids) == 3
    assert len({j.split("_")[0] for j in job_ids.values()}) == 1  # one array
    assert sorted(j.split("_")[1] for j in job_ids.values()) == ["0", "1", "2"]

    states = wait_for_runs(run_dirs(spec, results), poll_s=1, timeout_s=150)
    by_seed = {r.config.seed: r for r in spec.runs}
    assert states[by_seed[0].run_id] == states[by_seed[2].run_id] == "done"
    assert states[by_seed[1].run_id] == "failed"
    crashed = RunStore(spec.run_dir(results, by_seed[1].run_id), by_seed[1].run_id).read_status()
    assert crashed["error"] == "ValueError: boom: seed 1 always crashes" and "crash_on_seed_1" in crashed["traceback"]
    assert crashed["slurm_job_id"] == job_ids[by_seed[1].run_id]
    # `solbench status` names the failed job's log, and that is where the traceback is
    from solbench.commands.status import slurm_logs

    stdout, stderr = slurm_logs(spec.run_dir(results, by_seed[1].run_id), crashed)
    wait_until(lambda: stderr.is_file() and "boom: seed 1 always crashes" in stderr.read_text(), 30, "the job's log")
    done = RunStore(spec.run_dir(results, by_seed[0].run_id), by_seed[0].run_id)
    assert [r["step"] for r in done.read("metrics")] == [0, 1, 2, 3]
    env = done.read_json("env.json")
    assert env["slurm"]["slurm_array_task_id"] in {"0", "1", "2"}
    # the job ran the code snapshot taken at submission, not the checkout
    snapshot = Path(env["code_snapshot"])
    assert snapshot.parent == (results / spec.name / ".code").resolve()
    assert env["solbench_path"] == str(snapshot / "solbench") and env["git_sha"]
    assert (snapshot / "solbench" / "methods" / "sol_rl.py").is_file()
    wait_until(lambda: sacct_state(job_ids[by_seed[1].run_id]) == "FAILED", 30, "sacct FAILED")
    # the run writes "done" before its job process exits, so Slurm may still say RUNNING for a moment;
    # once the job has ended it must have exited cleanly (a done run whose job then FAILED is a bug)
    ended = lambda: sacct_state(job_ids[by_seed[0].run_id]) not in {"", "PENDING", "RUNNING", "COMPLETING"}
    wait_until(ended, 30, "the done job to end")
    assert sacct_state(job_ids[by_seed[0].run_id]) == "COMPLETED"

    # re-running relaunches only the failed run
    again = launch_spec(load_spec(spec.path), results, run_fn="_runfns:counting_run", sys_path=[str(TESTS)])
    assert list(again.submission.job_ids) == [by_seed[1].run_id]
    assert wait_for_runs(run_dirs(spec, results), poll_s=1, timeout_s=90)[by_seed[1].run_id] == "done"


def _start_and_wait_for_checkpoint(spec, results, step: int):
    os.environ["SOLBENCH_TEST_STEP_S"] = "1.0"  # inherited by the job (sbatch exports the environment)
    try:
        outcome = launch_spec(spec, results, run_fn="_runfns:counting_run", sys_path=[str(TESTS)])
    finally:
        del os.environ["SOLBENCH_TEST_STEP_S"]
    run = spec.runs[0]
    store = RunStore(spec.run_dir(results, run.run_id), run.run_id)
    wait_until(lambda: (store.latest_checkpoint() or (0,))[0] >= step, 90, f"checkpoint of step {step}")
    return outcome.submission.job_ids[run.run_id], run, store


def _assert_resumed_exactly(run, store, tmp_path):
    starts = [int(s) for s in (store.run_dir / "starts.txt").read_text().split()]
    assert starts[0] == 1 and len(starts) == 2 and starts[1] >= 3, starts
    assert [r["step"] for r in store.read("metrics")] == list(range(0, run.config.iterations + 1))
    assert [r["step"] for r in store.read("timings")] == list(range(1, run.config.iterations + 1))
    reference = RunStore(tmp_path / "reference", run.run_id)
    execute_run(RunTask(str(reference.run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)]))
    assert [r["value"] for r in store.read("metrics")] == [r["value"] for r in reference.read("metrics")]


def test_a_cancelled_job_resubmitted_resumes_from_its_checkpoint_without_duplicates(tmp_path):
    spec = make_spec(tmp_path, "[0]", iterations=10)
    results = tmp_path / "results"
    job_id, run, store = _start_and_wait_for_checkpoint(spec, results, step=2)
    subprocess.run(["scancel", job_id], check=True)
    # the killed job cannot update status.json; the state read from disk + Slurm says interrupted
    wait_until(lambda: run_states(run_dirs(spec, results))[run.run_id][0] == "interrupted", 60, "interrupted")
    assert store.read_status()["state"] == "running"

    again = launch_spec(load_spec(spec.path), results, run_fn="_runfns:counting_run", sys_path=[str(TESTS)])
    assert list(again.submission.job_ids) == [run.run_id] and again.submission.job_ids[run.run_id] != job_id
    assert wait_for_runs(run_dirs(spec, results), poll_s=1, timeout_s=90)[run.run_id] == "done"
    status = store.read_status()
    assert status["attempt"] == 2 and status["slurm_job_id"] == again.submission.job_ids[run.run_id]
    _assert_resumed_exactly(run, store, tmp_path)


def test_a_preempted_job_checkpoints_requeues_and_resumes(tmp_path):
    spec = make_spec(tmp_path, "[0]", iterations=10)
    results = tmp_path / "results"
    job_id, run, store = _start_and_wait_for_checkpoint(spec, results, step=2)
    # what Slurm sends before preempting (submitit's own test hook does the same)
    subprocess.run(["scancel", "--signal", "USR2", job_id], check=True)
    wait_until(lambda: store.read_status().get("requeued_at") is not None, 30, "checkpoint() on USR2")
    # Slurm holds a requeued job for about two minutes (its begin time); on this test cluster
    # release it at once.
    wait_until(lambda: squeue_state(job_id) == "PENDING", 30, "the job requeued as PENDING")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
    assert wait_for_runs(run_dirs(spec, results), poll_s=1, timeout_s=150)[run.run_id] == "done"
    status = store.read_status()
    assert status["attempt"] == 2 and status["slurm_job_id"] == job_id  # the same job, requeued
    _assert_resumed_exactly(run, store, tmp_path)


TWO_RANKS_PROFILE = """
description: two ranks per run on the local test cluster
executor: slurm
partition: debug
tasks_per_node: 2
cpus_per_task: 1
timeout_min: 30
env: {OMP_NUM_THREADS: "1"}
"""

TWO_RANKS_SPEC = """
name: tworanks
launch: LAUNCH
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 2
  world_size: WORLD
  sampling: {steps: 3, eval_steps: 2}
  eval: {every: 2, prompts: shapes/eval, n_prompts: 3, seeds_per_prompt: 1, rewards: [shapes_geneval]}
  quant: {recipe: nvfp4_w4a16}
matrix:
  method: [sol_rl]
  n: [4]
  k: [2]
  explore_steps: [2]
"""


def test_a_two_rank_run_through_submitit_tasks_matches_one_process(tmp_path):
    """submitit starts one task per rank (tasks_per_node=2); the ranks join one gloo group and the
    run's candidates (seeds, FP4 and full rewards, selections) equal a single process's."""
    (tmp_path / "two.yaml").write_text(textwrap.dedent(TWO_RANKS_PROFILE))
    for world, launch in ((2, str(tmp_path / "two.yaml")), (1, "local")):
        (tmp_path / f"spec{world}.yaml").write_text(
            textwrap.dedent(TWO_RANKS_SPEC).replace("LAUNCH", launch).replace("WORLD", str(world)))
    results = tmp_path / "results"
    two = load_spec(tmp_path / "spec2.yaml")
    outcome = launch_spec(two, results)
    assert outcome.executor == "slurm" and len(outcome.submission.job_ids) == 1
    states = wait_for_runs(run_dirs(two, results), poll_s=1, timeout_s=240)
    run = two.runs[0]
    store = RunStore(two.run_dir(results, run.run_id), run.run_id)
    assert states[run.run_id] == "done", store.read_status()
    one = load_spec(tmp_path / "spec1.yaml")
    launch_spec(one, results)
    single = RunStore(one.run_dir(results, one.runs[0].run_id), one.runs[0].run_id)

    def key(row):
        return row["step"], row["prompt_id"], row["cand_idx"], row["precision"], row["selected"]

    rows2, rows1 = store.read("candidates"), single.read("candidates")
    assert len(rows2) == len(rows1) == 2 * (2 * 4 + 2 * 2)  # 2 steps x (N explore + K full) x 2 prompts
    assert [key(r) for r in rows2] == [key(r) for r in rows1]
    for a, b in zip(rows2, rows1):
        assert a["reward"] == pytest.approx(b["reward"], abs=1e-5)
    step1_2, step1_1 = [r for r in rows2 if r["step"] == 1], [r for r in rows1 if r["step"] == 1]
    without_reward = lambda rows: [{k: v for k, v in r.items() if k not in ("reward", "run_id")} for r in rows]  # noqa: E731
    assert without_reward(step1_2) == without_reward(step1_1)
    # step 1 starts from the same weights: bit for bit where this CPU's GEMM is row-invariant (tests/_cpu.py)
    assert_same_numbers(torch.tensor([r["reward"] for r in step1_2], dtype=torch.float64),
                        torch.tensor([r["reward"] for r in step1_1], dtype=torch.float64), "step-1 rewards")
    logs = sorted((results / "tworanks" / ".submitit").glob("*_log.out"))
    assert len(logs) == 2  # one submitit task per rank
