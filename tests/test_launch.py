"""Local launching: runs execute in-process with status transitions, crashes are recorded and the
others carry on, finished specs are not rerun (unless forced), killed runs are detected from disk and
resume from their checkpoint with no lost or duplicated rows; and the CLI commands around it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from types import SimpleNamespace

import pandas as pd
import pytest

from solbench.cli import main as cli
from solbench.config import RunConfig
from solbench.launch import RunTask, execute_run, launch_spec, run_lock, run_states
from solbench.results import RunStore
from solbench.spec import load_spec

from _runfns import three_runs_spec

TESTS = Path(__file__).resolve().parent
SPEC = three_runs_spec("launchtest")


@pytest.fixture
def spec_path(tmp_path):
    path = tmp_path / "launchtest.yaml"
    path.write_text(textwrap.dedent(SPEC))
    return path


def steps(store: RunStore, table="metrics") -> list[int]:
    return [r["step"] for r in store.read(table)]


def stores(spec, results):
    return {r.config.seed: RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in spec.runs}


def test_local_runs_record_status_env_spec_rows_and_skip_when_done(spec_path, tmp_path):
    results = tmp_path / "results"
    spec = load_spec(spec_path)
    outcome = launch_spec(spec, results, run_fn="_runfns:counting_run")
    assert outcome.executor == "local" and set(outcome.submission.states.values()) == {"done"}
    for seed, store in stores(spec, results).items():
        status = store.read_status()
        assert status["state"] == "done" and status["attempt"] == 1 and status["seconds"] >= 0
        assert json.loads((store.run_dir / "spec.json").read_text())["seed"] == seed
        env = store.read_json("env.json")
        assert env["versions"]["solbench"] and env["device"] == "cpu"
        assert steps(store) == [0, 1, 2, 3, 4] and steps(store, "timings") == [1, 2, 3, 4]
        assert json.loads((store.run_dir / "progress.json").read_text())["step"] == 4

    again = launch_spec(load_spec(spec_path), results, run_fn="_runfns:counting_run")
    assert again.submission is None and set(again.plan.skipped.values()) == {"done"}

    forced = launch_spec(load_spec(spec_path), results, run_fn="_runfns:counting_run", force=True)
    assert len(forced.submission.states) == 3
    for store in stores(spec, results).values():
        assert steps(store) == [0, 1, 2, 3, 4]  # rerun from scratch, not appended
        assert (store.run_dir / "starts.txt").read_text().split() == ["1"]


def test_a_crashing_run_is_failed_with_its_traceback_and_the_rest_carry_on(spec_path, tmp_path):
    results = tmp_path / "results"
    spec = load_spec(spec_path)
    outcome = launch_spec(spec, results, run_fn="_runfns:crash_on_seed_1")
    by_seed = stores(spec, results)
    assert sorted(outcome.submission.states.values()) == ["done", "done", "failed"]
    failed = by_seed[1].read_status()
    assert failed["state"] == "failed" and failed["error"] == "ValueError: boom: seed 1 always crashes"
    assert "Traceback (most recent call last)" in failed["traceback"] and "crash_on_seed_1" in failed["traceback"]
    assert by_seed[0].read_status()["state"] == by_seed[2].read_status()["state"] == "done"
    # a failed run is launched again by the next `run` (and only it)
    plan = launch_spec(load_spec(spec_path), results, run_fn="_runfns:counting_run").plan
    assert [r.config.seed for r in plan.to_launch] == [1]
    assert by_seed[1].read_status()["state"] == "done" and by_seed[1].read_status()["attempt"] == 2


def test_killed_run_reads_interrupted_and_resumes_without_duplicates(spec_path, tmp_path):
    results = tmp_path / "results"
    spec = load_spec(spec_path)
    run = spec.runs[0]
    run_dir = spec.run_dir(results, run.run_id)
    store = RunStore(run_dir, run.run_id)
    store.write_json("spec.json", run.config.to_dict())
    task = RunTask(str(run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)])
    script = ("import pickle, sys; from solbench.launch import execute_run; "
              "execute_run(pickle.loads(bytes.fromhex(sys.argv[1])))")
    import pickle

    env = {**os.environ, "SOLBENCH_TEST_STEP_S": "0.3"}
    proc = subprocess.Popen([sys.executable, "-c", script, pickle.dumps(task).hex()], env=env)
    deadline = time.monotonic() + 60
    while store.latest_checkpoint() is None or store.latest_checkpoint()[0] < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    assert run_states({run.run_id: run_dir})[run.run_id][0] == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert store.read_status()["state"] == "running"  # nobody could update it...
    assert run_states({run.run_id: run_dir})[run.run_id][0] == "interrupted"  # ...but the lock tells

    outcome = launch_spec(load_spec(spec_path), results, run_fn="_runfns:counting_run", only=[run.run_id])
    assert outcome.submission.states == {run.run_id: "done"}
    starts = (run_dir / "starts.txt").read_text().split()
    assert starts[0] == "1" and int(starts[1]) >= 3  # resumed after its last checkpoint, not from scratch
    assert steps(store) == [0, 1, 2, 3, 4] and steps(store, "timings") == [1, 2, 3, 4]
    # the resumed values equal those of an uninterrupted run (RNG state restored from the checkpoint)
    reference = RunStore(tmp_path / "reference", run.run_id)
    execute_run(RunTask(str(reference.run_dir), run.config.to_dict(), "_runfns:counting_run"))
    assert [r["value"] for r in store.read("metrics")] == [r["value"] for r in reference.read("metrics")]
    assert store.read_status()["attempt"] == 2


def test_a_run_that_finishes_while_its_liveness_is_checked_reads_done_not_interrupted(spec_path, tmp_path,
                                                                                      monkeypatch):
    # The race CI hit: a poll read status "running", the run then wrote "done" and released its
    # lock, and the lock check found it free: the poll called a finished run interrupted, and
    # wait_for_runs returned on it. The check must read the status again before saying so.
    import socket

    import solbench.launch.states as launch

    spec = load_spec(spec_path)
    run = spec.runs[0]
    run_dir = spec.run_dir(tmp_path / "results", run.run_id)
    store = RunStore(run_dir, run.run_id)
    store.write_status("running", attempt=1, host=socket.gethostname(), pid=os.getpid())

    def finishes_meanwhile(path):
        store.write_status("done", attempt=1)
        return False

    monkeypatch.setattr(launch, "lock_is_held", finishes_meanwhile)
    state, status = run_states({run.run_id: run_dir})[run.run_id]
    assert (state, status["state"]) == ("done", "done")
    # a status that stays put while the lock is free is a dead run
    monkeypatch.setattr(launch, "lock_is_held", lambda path: False)
    store.write_status("running", attempt=2, host=socket.gethostname(), pid=os.getpid())
    assert run_states({run.run_id: run_dir})[run.run_id][0] == "interrupted"


def test_a_run_is_never_executed_twice_at_once(spec_path, tmp_path):
    spec = load_spec(spec_path)
    run = spec.runs[0]
    run_dir = spec.run_dir(tmp_path, run.run_id)
    task = RunTask(str(run_dir), run.config.to_dict(), "_runfns:counting_run", lock_wait_s=0.0)
    with run_lock(run_dir) as held:
        assert held
        assert run_states({run.run_id: run_dir})[run.run_id][0] == "new"
        assert execute_run(task) == {"state": "skipped"}
    assert not (run_dir / "metrics.jsonl").exists()
    assert execute_run(task)["state"] == "done"


def test_cli_expand_run_status_collect(spec_path, tmp_path, capsys):
    results = str(tmp_path / "results")
    assert cli(["expand", str(spec_path)]) == 0
    out = capsys.readouterr().out
    assert "3 runs (1 methods: diffusion_nft)" in out
    assert cli(["expand", str(spec_path), "--format", "ids"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids == [r.run_id for r in load_spec(spec_path).runs]

    assert cli(["run", str(spec_path), "--results", results, "--run-fn", "_runfns:crash_on_seed_1", "--quiet",
                "--no-report"]) == 1
    out = capsys.readouterr().out
    assert "1 run(s) did not finish" in out
    assert cli(["status", str(spec_path), "--results", results, "--tracebacks"]) == 0
    out = capsys.readouterr().out
    assert out.count("done") >= 2 and "failed" in out and "boom: seed 1 always crashes" in out

    assert cli(["run", str(spec_path), "--results", results, "--run-fn", "_runfns:counting_run", "--quiet",
                "--no-report"]) == 0
    assert cli(["run", str(spec_path), "--results", results, "--run-fn", "_runfns:counting_run", "--quiet",
                "--reports", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out
    assert "nothing to do: all 3 runs of launchtest are done" in out

    # a torn last line (a writer killed mid-write) is reported by collect and skipped
    victim = RunStore(Path(results) / "launchtest" / ids[0], ids[0])
    with open(victim.table_path("metrics"), "ab") as handle:
        handle.write(b'{"run_id": "x", "step": 9')
    assert cli(["collect", str(spec_path), "--results", results]) == 0
    out = capsys.readouterr().out
    assert "collected 3 runs" in out and "skipped 1 corrupt line" in out
    metrics = pd.read_parquet(Path(results) / "launchtest" / "metrics.parquet")
    assert len(metrics) == 15 and not metrics.duplicated(["run_id", "step", "metric"]).any()
    runs = pd.read_parquet(Path(results) / "launchtest" / "runs.parquet")
    assert set(runs.status) == {"done"} and set(runs["p_method_config.group_size"]) == {2}


def test_cli_errors_name_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmatrix: {method: [sol_rl], nn: [1]}\n")
    assert cli(["expand", str(bad)]) == 2
    assert "bad.yaml:2: matrix.nn: unknown matrix key 'nn'" in capsys.readouterr().err


def test_end_to_end_with_the_real_trainer_on_the_smoke_setting(tmp_path, capsys):
    """spec -> launcher -> solbench.train.trainer.train_run -> results -> collect -> report, via the CLI.

    The smoke spec's settings with one method and untrained tiny weights (model.path: random), so
    the test does not depend on the shipped pretrained weights and stays a few seconds long.
    """
    pytest.importorskip("solbench.train.trainer", reason="the trainer (solbench/train/trainer.py) is not in this checkout")
    import yaml

    smoke = yaml.safe_load((TESTS.parent / "experiments" / "smoke.yaml").read_text())
    smoke["base"]["model"]["path"] = "random"
    smoke["matrix"]["method"] = ["diffusion_nft"]
    for axis in ("n", "k", "explore_steps"):  # sol_rl's axes: an axis no listed method has is an error
        del smoke["matrix"][axis]
    spec_path = tmp_path / "smoke.yaml"
    spec_path.write_text(yaml.safe_dump(smoke))
    results, reports = tmp_path / "results", tmp_path / "reports"
    assert cli(["run", str(spec_path), "--results", str(results), "--reports", str(reports), "--quiet"]) == 0
    out = capsys.readouterr().out
    (run,) = load_spec(spec_path).runs
    store = RunStore(results / "smoke" / run.run_id, run.run_id)
    assert store.read_status()["state"] == "done"
    metrics = store.read("metrics")
    assert {r["step"] for r in metrics if r["split"] == "eval"} == {0, 2}  # base model and the end
    assert {r["step"] for r in metrics if r["split"] == "train"} == {1, 2}
    assert {r["step"] for r in store.read("candidates")} == {1, 2}
    assert store.latest_checkpoint()[0] == 2
    runs = pd.read_parquet(results / "smoke" / "runs.parquet")
    assert list(runs.status) == ["done"] and list(runs["p_method_config.group_size"]) == [2]
    assert "report:" in out and (reports / "smoke").is_dir()
    assert cli(["run", str(spec_path), "--results", str(results), "--reports", str(reports), "--quiet"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_code_snapshot_has_the_installed_layout_is_shared_and_imports_first(tmp_path):
    import solbench.methods
    from solbench.launch import snapshot_code

    snapshot = snapshot_code(tmp_path / ".code")
    assert snapshot_code(tmp_path / ".code") == snapshot  # identical code: one snapshot
    assert len([p for p in (tmp_path / ".code").iterdir()]) == 1
    for rel in ("solbench/launch/__init__.py", "solbench/methods/sol_rl.py", "solbench/methods/flow_grpo.py",
                "solbench/world/prompts/shapes_train.jsonl", "solbench/assets/tiny_t2i.safetensors"):
        assert (snapshot / rel).is_file(), rel
    source = Path(solbench.methods.__file__).parent / "sol_rl.py"
    assert (snapshot / "solbench/methods/sol_rl.py").read_bytes() == source.read_bytes()
    assert not list(snapshot.rglob("__pycache__"))
    meta = json.loads((snapshot / "CODE.json").read_text())
    assert meta["files"] > 50 and "git_sha" in meta
    # a job with the snapshot first on PYTHONPATH (and the working directory kept off sys.path, as
    # the Slurm setup lines do) imports the harness and the methods from it, even from the checkout
    probe = ("import solbench, solbench.methods.sol_rl as m, solbench.method as reg; "
             "print(solbench.__file__); print(m.__file__); print(sorted(reg.method_names()))")
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(snapshot), "PYTHONSAFEPATH": "1"},
                         cwd=Path(solbench.methods.__file__).parent.parent,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == str(snapshot / "solbench" / "__init__.py")
    assert out[1] == str(snapshot / "solbench" / "methods" / "sol_rl.py")
    assert "sol_rl" in out[2] and "flow_grpo" in out[2]


# -- local worker processes: one run per core --------------------------------------------------------

def test_local_workers_auto_is_one_run_per_core_and_the_setting_can_be_overridden(monkeypatch):
    """Catches: "auto" oversubscribing (more runs than cores, or several threads per run times one
    run per core), GPU machines running several runs on one GPU, or a bad override passing silently."""
    import solbench.launch.local as launch
    from solbench.errors import ConfigError

    monkeypatch.setattr(launch, "usable_cores", lambda: 4)
    monkeypatch.setattr(launch, "_cuda", lambda: False)
    monkeypatch.delenv("SOLBENCH_WORKERS", raising=False)
    runs = lambda n, threads=1: [SimpleNamespace(config=RunConfig.from_dict({"numerics": {"threads": threads}}))  # noqa: E731
                                 for _ in range(n)]
    assert launch.local_workers("auto", runs(14)) == 4
    assert launch.local_workers("auto", runs(3)) == 3  # never more workers than runs
    assert launch.local_workers(1, runs(14)) == 1
    assert launch.local_workers("auto", runs(14, threads=2)) == 2  # two threads per run: a run per two cores
    assert launch.fit_threads(runs(14, threads=2), 4) == 2  # --workers 4 cannot give runs of 2 threads their cores
    assert launch.fit_threads(runs(14), 6) == 6  # one thread a run: a share of one core always holds it
    monkeypatch.setenv("SOLBENCH_WORKERS", "3")
    assert launch.local_workers("auto", runs(14)) == 3
    monkeypatch.setenv("SOLBENCH_WORKERS", "many")
    with pytest.raises(ConfigError, match="SOLBENCH_WORKERS='many'"):
        launch.local_workers(1, runs(14))
    monkeypatch.setenv("SOLBENCH_WORKERS", "auto")
    monkeypatch.setattr(launch, "_cuda", lambda: True)
    assert launch.local_workers(4, runs(14)) == 1


def test_core_shares_split_the_cores_without_overlap():
    from solbench.launch import core_shares

    assert core_shares([0, 1], 2) == [[0], [1]]
    assert core_shares(list(range(8)), 3) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert core_shares([4, 5, 6, 7], 1) == [[4, 5, 6, 7]]


def test_a_local_profile_with_an_invalid_workers_value_is_an_error_naming_the_file(tmp_path):
    from solbench.errors import ConfigError
    from solbench.spec import load_profile

    path = tmp_path / "mine.yaml"
    path.write_text("executor: local\nworkers: 0\n")
    with pytest.raises(ConfigError, match="mine.yaml"):
        load_profile(str(path))


def test_local_runs_execute_side_by_side_in_worker_processes_with_the_same_results(spec_path, tmp_path,
                                                                                  monkeypatch):
    """Catches: workers running the runs one after another (no gain), in this process (no
    isolation, no pinning), on overlapping cores, losing a run's state, or computing other numbers
    than the in-process launcher."""
    results = tmp_path / "results"
    monkeypatch.setenv("SOLBENCH_CORE_LOCKS", str(tmp_path / "locks"))  # no other solbench run's claims count here
    monkeypatch.setenv("SOLBENCH_WORKERS", "2")
    # rendezvous_run: a run only goes on once a second one has started beside it, so runs executed
    # one after another fail this test instead of merely taking longer
    outcome = launch_spec(load_spec(spec_path), results, run_fn="_runfns:rendezvous_run", sys_path=[str(TESTS)])
    spec = load_spec(spec_path)
    stores = [RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in spec.runs]
    assert outcome.submission.states == {r.run_id: "done" for r in spec.runs}, [s.read_status() for s in stores]
    pids = [s.read_json("env.json")["pid"] for s in stores]
    assert os.getpid() not in pids and len(set(pids)) == 2  # two worker processes shared the three runs
    workers = [s.read_json("env.json")["cpu_allocation"] for s in stores]
    if len(os.sched_getaffinity(0)) >= 2:  # each worker pinned to its own core, one thread there
        first, second = {w["local_worker"]: frozenset(w["cores"]) for w in workers}.values()
        assert first and second and not first & second
        assert all(w["threads"] == 1 for w in workers)
    # the same numbers as one after another in this process
    monkeypatch.setenv("SOLBENCH_WORKERS", "1")
    launch_spec(load_spec(spec_path), tmp_path / "inproc", run_fn="_runfns:counting_run", sys_path=[str(TESTS)])
    for run, store in zip(spec.runs, stores):
        reference = RunStore(spec.run_dir(tmp_path / "inproc", run.run_id), run.run_id)
        assert reference.read_json("env.json")["pid"] == os.getpid()
        assert [r["value"] for r in store.read("metrics")] == [r["value"] for r in reference.read("metrics")]


def test_killing_the_launcher_stops_its_workers_and_the_runs_resume(spec_path, tmp_path):
    """Catches: worker processes outliving a killed `solbench run` (runs going on unseen, holding
    their cores), or their runs not resuming from the checkpoint afterwards."""
    results = tmp_path / "results"
    env = {**os.environ, "SOLBENCH_WORKERS": "2", "SOLBENCH_TEST_STEP_S": "1.5",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # rendezvous_run: the first two runs start together, so both are running when the launcher dies
    cmd = [sys.executable, "-m", "solbench", "run", str(spec_path), "--results", str(results), "--quiet",
           "--no-report", "--run-fn", "_runfns:rendezvous_run"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spec = load_spec(spec_path)
    stores = [RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in spec.runs]
    deadline = time.monotonic() + 90
    while sum((s.latest_checkpoint() or (0,))[0] >= 1 for s in stores) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "two runs never got going"
        time.sleep(0.2)
    pids = {s.read_status()["pid"] for s in stores if s.read_status()["state"] == "running"}
    assert len(pids) == 2
    proc.kill()
    proc.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"

    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, "worker processes outlived the killed launcher"
        time.sleep(0.2)
    states = run_states({s.run_id: s.run_dir for s in stores})
    assert sorted(state for state, _ in states.values()).count("interrupted") >= 2

    again = subprocess.run(cmd, env={**env, "SOLBENCH_TEST_STEP_S": "0"}, capture_output=True, text=True,
                           timeout=180)
    assert again.returncode == 0, again.stderr[-2000:]
    for store in stores:
        assert store.read_status()["state"] == "done"
        assert steps(store) == [0, 1, 2, 3, 4]  # resumed without duplicated or lost rows


def _launcher(spec_path, results, run_ids, tmp_path, **env):
    """`solbench run` of ``run_ids`` in a subprocess on 2 workers, with a claim folder of its own."""
    env = {**os.environ, "SOLBENCH_WORKERS": "2", "SOLBENCH_CORE_LOCKS": str(tmp_path / "locks"),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **env}
    env.pop("SOLBENCH_THREADS", None)
    cmd = [sys.executable, "-m", "solbench", "run", str(spec_path), "--results", str(results), "--quiet",
           "--no-report", "--run-fn", "_runfns:rendezvous_run", "--only", *run_ids]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_running(stores, proc, at_step=1, timeout=120):
    deadline = time.monotonic() + timeout
    while not all(s.read_status()["state"] == "running" and (s.latest_checkpoint() or (0,))[0] >= at_step
                  for s in stores):
        assert time.monotonic() < deadline and proc.poll() is None, \
            f"the runs never got going: {[s.read_status() for s in stores]}"
        time.sleep(0.1)


@pytest.mark.parametrize("n_runs", [2, 3])
def test_a_worker_killed_with_sigkill_fails_its_own_run_only_and_the_launcher_finishes_the_rest(
        spec_path, tmp_path, n_runs):
    """Catches (issue 39): one worker killed as the out-of-memory killer kills it breaking the whole worker
    pool (every run reported "ended abnormally"), or, with a run still queued, the launcher waiting for
    ever on that run's pending status, which carries its own live PID."""
    results = tmp_path / "results"
    spec = load_spec(spec_path)
    runs = spec.runs[:n_runs]
    stores = [RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in runs]
    proc = _launcher(spec_path, results, [r.run_id for r in runs], tmp_path, SOLBENCH_TEST_STEP_S="1")
    _wait_running(stores[:2], proc)
    os.kill(int(stores[0].read_status()["pid"]), signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out + err
    victim = stores[0].read_status()
    assert (victim["state"], victim["error"]) == ("failed", "WorkerDied: its worker process was killed by SIGKILL "
                                                            "(as the kernel's out-of-memory killer or kill -9 do)")
    assert f"run {runs[0].run_id} failed: its worker process was killed by SIGKILL" in err
    for store in stores[1:]:  # the other worker's run, and the queued one on a fresh worker
        assert store.read_status()["state"] == "done" and steps(store) == [0, 1, 2, 3, 4]
    assert f"1 run(s) did not finish: {runs[0].run_id}" in out
    # the next `solbench run` resumes the killed run from its last checkpoint
    again = _launcher(spec_path, results, [r.run_id for r in runs], tmp_path, SOLBENCH_WORKERS="1")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, out + err
    assert stores[0].read_status()["state"] == "done" and steps(stores[0]) == [0, 1, 2, 3, 4]
    assert int((stores[0].run_dir / "starts.txt").read_text().split()[-1]) >= 2


def test_force_beside_a_launcher_running_the_same_runs_reruns_them_after_it(spec_path, tmp_path, monkeypatch, capsys):
    """Catches (issue 39): `solbench run --force` started while another launcher executes the same runs
    waiting for them and then saying "nothing to do: all 2 runs ... are done", rerunning none."""
    results = tmp_path / "results"
    spec = load_spec(spec_path)
    runs = spec.runs[:2]
    stores = [RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in runs]
    other = _launcher(spec_path, results, [r.run_id for r in runs], tmp_path, SOLBENCH_TEST_STEP_S="0.5")
    _wait_running(stores, other)
    monkeypatch.setenv("SOLBENCH_WORKERS", "1")
    monkeypatch.setenv("SOLBENCH_CORE_LOCKS", str(tmp_path / "locks"))
    requested = time.time()
    assert cli(["run", str(spec_path), "--results", str(results), "--force", "--quiet", "--no-report",
                "--run-fn", "_runfns:counting_run", "--only", *[r.run_id for r in runs]]) == 0
    out = capsys.readouterr().out
    assert other.wait(timeout=60) == 0
    assert "--force: 2 run(s) another process was executing started before this request; running them again" in out
    assert "nothing to do" not in out
    for store in stores:
        status = store.read_status()
        assert status["state"] == "done" and status["started_ts"] >= requested
        assert store.read_json("env.json")["pid"] == os.getpid()
        assert (store.run_dir / "starts.txt").read_text().split() == ["1"] and steps(store) == [0, 1, 2, 3, 4]


def test_solbench_threads_is_refused_before_any_run_starts(spec_path, tmp_path, monkeypatch, capsys):
    """Catches (issue 39): SOLBENCH_THREADS=abc or =0 ending `solbench run` in a ValueError traceback, or
    (with --workers 1) every run marked failed and an empty report written; and any value changing the
    numbers from outside the spec."""
    for value in ("abc", "0", "2"):
        monkeypatch.setenv("SOLBENCH_THREADS", value)
        assert cli(["run", str(spec_path), "--results", str(tmp_path / "results"), "--quiet",
                    "--run-fn", "_runfns:counting_run"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [f"solbench run: error: SOLBENCH_THREADS={value!r} is not read any more: a run's thread count is "
                                    "its spec's numerics.threads (default 1, part of the run id); unset it and set "
                                    "that instead"], err
    assert not (tmp_path / "results").exists()
