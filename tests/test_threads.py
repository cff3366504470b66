"""A run's CPU threads are its config's numerics.threads (solbench.machine.threads): claimed cores only decide
where they go, never how many there are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from solbench.machine import threads


@pytest.fixture(autouse=True)
def private_locks(tmp_path, monkeypatch):
    # a world of its own: no other solbench run's core claims on this machine reach these tests
    monkeypatch.setenv(threads.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.delenv(threads.ENV_THREADS, raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)


def test_the_configured_count_is_used_on_claimed_cores_and_restored_after():
    # Bug caught: a run that takes every core of the machine (its numbers then depend on the machine),
    # does not pin itself to the cores it claimed, or leaves its thread count and affinity on the process.
    before, cores = torch.get_num_threads(), threads.available_cores()
    with threads.cpu_allocation(1) as alloc:
        assert (alloc.threads, alloc.source, len(alloc.cores)) == (1, "config", 1)
        assert torch.get_num_threads() == 1 and threads.available_cores() == alloc.cores
    assert torch.get_num_threads() == before and threads.available_cores() == cores


def test_cores_claimed_by_other_runs_leave_the_thread_count_alone():
    # Bug caught (issue 39): with every core claimed by other solbench runs, a run fell back to 1 thread, so
    # its numbers depended on what else ran on the machine. Now it runs unpinned on its configured count.
    cores = threads.available_cores()
    with threads.claim_cores(cores) as held:
        assert [c for c, _ in held] == cores
        with threads.cpu_allocation(len(cores)) as alloc:
            assert (alloc.threads, alloc.source, alloc.cores) == (len(cores), "config", [])
            assert torch.get_num_threads() == len(cores)


def test_slurm_or_the_affinity_mask_below_the_setting_gives_one_thread_per_core_and_says_why(monkeypatch):
    # Bug caught: a run on fewer cores than its threads either oversubscribing them (every OpenMP region
    # then waits out a time slice) or changing the count without a word.
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    with threads.cpu_allocation(2) as alloc:
        assert (alloc.threads, alloc.source, alloc.wanted) == (1, "fewer cores", 2)
        assert alloc.shortfall() == "only 1 core(s) here (Slurm --cpus-per-task)"
        assert alloc.as_dict()["wanted"] == 2
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    many = len(threads.available_cores()) + 1
    with threads.cpu_allocation(many) as alloc:
        assert (alloc.threads, alloc.wanted) == (many - 1, many) and torch.get_num_threads() == many - 1
    with threads.cpu_allocation(1) as alloc:
        assert alloc.shortfall() == "" and "wanted" not in alloc.as_dict()


def test_solbench_threads_is_refused_with_where_the_setting_lives(monkeypatch):
    # Bug caught: a count from the environment silently changing a run's numbers without its run id
    # saying so (two users, one spec, two tables).
    threads.check_env()
    monkeypatch.setenv(threads.ENV_THREADS, "2")
    with pytest.raises(ValueError, match=r"SOLBENCH_THREADS='2' is not read any more: .*numerics.threads"):
        threads.check_env()
    with pytest.raises(ValueError, match=">= 1"):
        with threads.cpu_allocation(0):
            pass


def test_a_killed_run_frees_its_cores(tmp_path):
    # Bug caught: lock files that outlive a killed process (kill -9) and leave every later run unpinned.
    code = ("import time\nfrom solbench.machine import threads\n"
            "with threads.cpu_allocation(len(threads.available_cores())) as a:\n"
            "    print(a.cores, flush=True)\n    time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert child.stdout.readline().strip() == str(threads.available_cores())
        with threads.cpu_allocation(1) as while_alive:
            assert while_alive.cores == [] and while_alive.threads == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    deadline = time.time() + 10
    while True:
        with threads.cpu_allocation(1) as after:
            if after.cores or time.time() > deadline:
                break
        time.sleep(0.1)
    assert len(after.cores) == 1


def test_a_run_records_the_threads_its_config_sets(tmp_path, monkeypatch):
    # Bug caught: the launcher not applying numerics.threads (env.json's torch_threads then shows the
    # process's count) or not restoring the process's count after the run.
    import json

    from solbench.config import RunConfig
    from solbench.launch import RunTask, execute_run

    before = torch.get_num_threads()
    seen = {}

    def fake_run(cfg, store, progress=None):
        seen["threads"] = torch.get_num_threads()
        return {"ok": True}

    monkeypatch.setattr("solbench.launch.execute.resolve_run_fn", lambda name: fake_run)
    for count in (1, 2):
        cfg = RunConfig.from_dict({"method": "sol_rl", "model": {"name": "tiny"}, "iterations": 1,
                                   "numerics": {"threads": count}})
        task = RunTask(run_dir=str(tmp_path / f"run{count}"), config=cfg.to_dict(), run_fn="x:y")
        assert execute_run(task)["state"] == "done"
        env = json.loads((tmp_path / f"run{count}" / "env.json").read_text())
        had = min(count, len(threads.available_cores()))
        assert seen["threads"] == had and env["torch_threads"] == had and env["numerics"]["threads"] == had
        assert env["cpu_allocation"]["source"] == ("config" if had == count else "fewer cores")
        assert torch.get_num_threads() == before


def test_the_thread_count_is_part_of_the_run_id():
    # Bug caught: two runs that compute different numbers (1 and 2 threads) sharing one results folder.
    from solbench.config import RunConfig

    one = RunConfig.from_dict({"numerics": {"threads": 1}})
    two = RunConfig.from_dict({"numerics": {"threads": 2}})
    assert one.run_id == RunConfig().run_id != two.run_id
    assert '"numerics":{"threads":1}' in one.canonical_json()


def test_a_fidelity_run_computes_on_a_resolved_thread_count_in_its_id():
    # Bug caught: fidelity runs taking every free core (issue 39's scheduling-dependent numbers, outside the
    # training runs), or a --threads that changes the numbers without changing the run id.
    from solbench.fidelity.experiment import FidelitySettings, resolve, run_id_of

    base = resolve(FidelitySettings(seeds=4, n_prompts=2))
    two = resolve(FidelitySettings(seeds=4, n_prompts=2, threads=2))
    assert base["numerics"] == {"threads": 1} and two["numerics"] == {"threads": 2}
    assert run_id_of(base) != run_id_of(two)
    with pytest.raises(Exception, match="--threads must be >= 1"):
        resolve(FidelitySettings(seeds=4, n_prompts=2, threads=0))
