"""CPU threads follow the allocation (solbench.threads): explicit > Slurm > claimed cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from solbench import threads

REAL_BUSY_CORES = threads.busy_cores  # the fixture below replaces it with a quiet machine


@pytest.fixture(autouse=True)
def private_locks(tmp_path, monkeypatch):
    monkeypatch.setenv(threads.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setattr(threads, "busy_cores", lambda cores, seconds=0.25: 0.0)  # a quiet machine
    monkeypatch.delenv(threads.ENV_THREADS, raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)


def test_explicit_setting_beats_slurm_and_is_restored_after_the_run(monkeypatch):
    # Bug caught: a run that ignores SOLBENCH_THREADS, or leaves its thread count on the process.
    before = torch.get_num_threads()
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    monkeypatch.setenv(threads.ENV_THREADS, "1")
    with threads.cpu_allocation() as alloc:
        assert (alloc.threads, alloc.source) == (1, "explicit")
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_slurm_cpus_per_task_sets_the_thread_count(monkeypatch):
    # Bug caught: a Slurm task with --cpus-per-task 1 running as many threads as the node has cores.
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    with threads.cpu_allocation() as alloc:
        assert (alloc.threads, alloc.source) == (1, "slurm")
        assert torch.get_num_threads() == 1


def test_bad_explicit_values_are_rejected_with_the_variable_named(monkeypatch):
    monkeypatch.setenv(threads.ENV_THREADS, "two")
    with pytest.raises(ValueError, match="SOLBENCH_THREADS='two'"):
        threads.requested_threads()
    with pytest.raises(ValueError, match=">= 1"):
        threads.requested_threads(0)


def test_side_by_side_runs_do_not_claim_the_same_cores():
    # Bug caught: two local runs both taking every core (each OpenMP region then waits out the
    # other's time slice). The second run finds the cores claimed and takes one thread.
    cores = threads.available_cores()
    with threads.cpu_allocation() as first:
        assert first.source == "claimed" and first.cores == cores and first.threads == len(cores)
        assert sorted(os.sched_getaffinity(0)) == cores
        with threads.cpu_allocation() as second:
            assert (second.threads, second.source, second.cores) == (1, "all cores taken", [])
    # released: the next run gets them all again, and the affinity is back
    with threads.cpu_allocation() as third:
        assert third.cores == cores
    assert threads.available_cores() == cores


def test_a_killed_run_frees_its_cores(tmp_path):
    # Bug caught: lock files that outlive a killed process (kill -9) and starve every later run.
    code = ("import time\nfrom solbench import threads\n"
            "with threads.cpu_allocation() as a:\n    print(a.cores, flush=True)\n    time.sleep(60)\n")
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == str(threads.available_cores())
        with threads.cpu_allocation() as while_alive:
            assert while_alive.source == "all cores taken"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    deadline = time.time() + 10
    while True:
        with threads.cpu_allocation() as after:
            if after.source == "claimed" or time.time() > deadline:
                break
        time.sleep(0.1)
    assert after.source == "claimed" and after.cores == threads.available_cores()


def test_a_run_records_the_threads_it_was_given(tmp_path, monkeypatch):
    # Bug caught: the launcher not applying the allocation (env.json's torch_threads then shows the
    # machine's default, not the 1 thread SOLBENCH_THREADS asked for) or not restoring it after.
    import json

    from solbench.launch import RunTask, execute_run
    from solbench.config import RunConfig

    monkeypatch.setenv(threads.ENV_THREADS, "1")
    before = torch.get_num_threads()
    cfg = RunConfig.from_dict({"method": "sol_rl", "model": {"name": "tiny"}, "iterations": 1})
    seen = {}

    def fake_run(cfg, store, progress=None):
        seen["threads"] = torch.get_num_threads()
        return {"ok": True}

    monkeypatch.setattr("solbench.launch.execute.resolve_run_fn", lambda name: fake_run)
    task = RunTask(run_dir=str(tmp_path / "run"), config=cfg.to_dict(), run_fn="x:y")
    assert execute_run(task)["state"] == "done"
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert seen["threads"] == 1 and env["torch_threads"] == 1
    assert env["cpu_allocation"] == {"threads": 1, "source": "explicit", "cores": []}
    assert torch.get_num_threads() == before


def test_cores_other_programs_keep_busy_are_left_to_them(monkeypatch):
    # Bug caught: a local run taking 2 threads on 2 cores beside a busy process (each OpenMP region
    # then waits out the other process's time slice: 60 s instead of 5 s per tiny Sol-RL iteration).
    cores = threads.available_cores()
    monkeypatch.setattr(threads, "busy_cores", lambda cores, seconds=0.25: 1.0)
    with threads.cpu_allocation() as alloc:
        assert alloc.threads == max(1, len(cores) - 1) and alloc.cores == cores
        assert torch.get_num_threads() == alloc.threads


def test_busy_cores_reads_a_busy_loop_in_another_process():
    # Bug caught: a /proc/stat reading that never sees other programs (always 0) or counts idle time.
    real = REAL_BUSY_CORES
    cores = threads.available_cores()
    quiet = real(cores, 0.3)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        loaded = real(cores, 0.5)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert 0 <= quiet <= len(cores) and loaded >= 0.7
