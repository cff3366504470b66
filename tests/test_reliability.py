"""Reliability around the runs (issue 16): interrupted reports, simultaneous launches, torn lines
surfaced, spec errors before anything runs, NaN handling, leftover temporary files, where a failed
Slurm job's log is, and a first screen free of third-party noise.

Launcher tests use the small run functions of tests/_runfns.py; the NaN tests use the real trainer
on the tiny model with untrained weights (a run takes seconds).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from solbench.cli import main as cli
from solbench.config import QuantConfig, RunConfig
from solbench.errors import NonFiniteLossError
from solbench.launch import RunTask, execute_run, prepare_run, run_lock
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.train.trainer import WEIGHT_LIMIT, Trainer

import _tiny_config as tiny_config
from _runfns import three_runs_spec

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SPEC = three_runs_spec("reliab")


@pytest.fixture
def spec_path(tmp_path):
    path = tmp_path / "reliab.yaml"
    path.write_text(textwrap.dedent(SPEC))
    return path


def run_args(spec_path, tmp_path, *extra, run_fn="_runfns:counting_run"):
    return ["run", str(spec_path), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
            "--run-fn", run_fn, "--quiet", *extra]


def stores(spec, results) -> list[RunStore]:
    return [RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in spec.runs]


def solbench_process(args, tmp_path, step_s="0"):
    """`python -m solbench ARGS` in tmp_path, importing the test run functions."""
    env = {**os.environ, "SOLBENCH_TEST_STEP_S": step_s, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "solbench", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# -- 1. a report interrupted during collect or report is written by the next `solbench run` ---------

def test_run_writes_the_report_an_interrupted_collect_or_report_did_not(spec_path, tmp_path, capsys):
    # Bug: with every run done, `run` said "nothing to do" before collecting and reporting, so a
    # kill during collect/report left no report forever, and the report's temp folder behind.
    assert cli(run_args(spec_path, tmp_path)) == 0
    index = tmp_path / "reports" / "reliab" / "index.md"
    assert index.exists()
    capsys.readouterr()

    # killed while writing the report: the old folder renamed away, the new one half written
    index.parent.rename(tmp_path / "reports" / ".reliab.old")
    (tmp_path / "reports" / ".reliab.k1ll3d").mkdir()
    assert cli(run_args(spec_path, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "the report is missing or older than the results: writing it" in out and index.exists()
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [".reliab.lock", "reliab"]

    # killed during collect, after a run changed (collect_report.json, written last, is older)
    collected = tmp_path / "results" / "reliab" / "collect_report.json"
    earlier = collected.stat().st_mtime - 60
    os.utime(collected, (earlier, earlier))
    assert cli(run_args(spec_path, tmp_path)) == 0
    assert "writing it" in capsys.readouterr().out and collected.stat().st_mtime > earlier + 30

    # up to date: nothing at all is redone
    written = index.stat().st_mtime_ns
    assert cli(run_args(spec_path, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "nothing to do: all 3 runs of reliab are done (results in" in out and "report:" not in out
    assert index.stat().st_mtime_ns == written


# -- 2. two launchers of one spec --------------------------------------------------------------------

def test_a_run_finished_while_waiting_for_its_lock_is_not_run_again(spec_path, tmp_path):
    # Bug: execute_run did not re-check "done" after taking the lock; the second execution was
    # attempt 2 and its resume at the final step reset the recorded result.
    spec = load_spec(spec_path)
    run = spec.runs[0]
    run_dir = spec.run_dir(tmp_path, run.run_id)
    task = RunTask(str(run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)])
    first = execute_run(task)
    assert first["state"] == "done"
    again = execute_run(task)  # what a second launcher that planned the run before it finished does
    assert again["state"] == "done" and again.get("already_done")
    status = RunStore(run_dir, run.run_id).read_status()
    assert status["attempt"] == 1 and status["result"] == {"steps": 4}
    assert (run_dir / "starts.txt").read_text().split() == ["1"]

    # nor does preparing it again (a launcher that planned before it finished) reset its status
    prepare_run(run, run_dir, force=False)
    assert RunStore(run_dir, run.run_id).read_status()["state"] == "done"


def test_force_never_deletes_a_run_another_process_is_executing(spec_path, tmp_path):
    # Bug: prepare_run deleted the run folder outside the lock; the executing process crashed with
    # FileNotFoundError. Now a held run is left alone and cleared under the lock, before executing.
    spec = load_spec(spec_path)
    run = spec.runs[0]
    run_dir = spec.run_dir(tmp_path, run.run_id)
    task = RunTask(str(run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)])
    assert execute_run(task)["state"] == "done"
    since = time.time()
    with run_lock(run_dir):
        prepare_run(run, run_dir, force=True, force_since=since)
        assert (run_dir / "metrics.jsonl").exists() and (run_dir / "checkpoints").is_dir()
    forced = RunTask(str(run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)], force_since=since)
    assert execute_run(forced)["state"] == "done"
    assert (run_dir / "starts.txt").read_text().split() == ["1"]  # rerun from nothing...
    assert RunStore(run_dir, run.run_id).read_status()["attempt"] == 1
    assert execute_run(forced).get("already_done")  # ...once: a second forced launcher reuses it


def test_a_run_another_launcher_executes_is_waited_for_not_failed(spec_path, tmp_path, capsys):
    # Bug: `run` counted the run the other process was executing as failed, exited 1 and wrote a
    # partial report.
    spec = load_spec(spec_path)
    run = spec.runs[0]
    store = RunStore(spec.run_dir(tmp_path / "results", run.run_id), run.run_id)
    prepare_run(run, store.run_dir, force=False)
    task = RunTask(str(store.run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)])
    script = "import pickle, sys; from solbench.launch import execute_run; execute_run(pickle.loads(bytes.fromhex(sys.argv[1])))"
    other = subprocess.Popen([sys.executable, "-c", script, pickle.dumps(task).hex()],
                             env={**os.environ, "SOLBENCH_TEST_STEP_S": "0.5"})
    deadline = time.monotonic() + 60
    while not (store.run_dir / "starts.txt").exists():
        assert time.monotonic() < deadline and other.poll() is None
        time.sleep(0.1)
    assert cli(run_args(spec_path, tmp_path)) == 0
    out = capsys.readouterr().out
    assert f"waiting for 1 run(s) that another process is executing: {run.run_id}" in out
    assert other.wait(timeout=60) == 0
    for each in stores(spec, tmp_path / "results"):
        status = each.read_status()
        assert status["state"] == "done" and status["attempt"] == 1
    assert "did not finish" not in out and (tmp_path / "reports" / "reliab" / "index.md").exists()


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_two_simultaneous_runs_of_one_spec_both_succeed_and_run_everything_once(spec_path, tmp_path, force):
    args = run_args(spec_path, tmp_path, *(["--force"] if force else []))
    if force:  # --force on finished results: both reruns race over the same folders
        assert subprocess.run([sys.executable, "-m", "solbench", *run_args(spec_path, tmp_path, "--no-report")],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)}).returncode == 0
    procs = [solbench_process(args, tmp_path, step_s="0.1") for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, out + err
        assert "Traceback" not in err, err
    for store in stores(load_spec(spec_path), tmp_path / "results"):
        status = store.read_status()
        assert status["state"] == "done" and status["attempt"] == 1 and status["result"] == {"steps": 4}
        assert (store.run_dir / "starts.txt").read_text().split() == ["1"]  # executed once
        assert [r["step"] for r in store.read("metrics")] == [0, 1, 2, 3, 4]
    assert (tmp_path / "reports" / "reliab" / "index.md").exists()


def test_resuming_at_the_final_step_keeps_the_final_eval(tmp_path):
    # Bug: a run killed after its last checkpoint resumed with nothing left to do and recorded an
    # empty final eval ({}) in status.json.
    cfg = small_config("diffusion_nft", iterations=1)
    store = RunStore(tmp_path, cfg.run_id)
    first = Trainer(cfg, store).run()
    assert first["eval"] and first["step"] == 1
    resumed = Trainer(cfg, store).run()
    assert resumed["eval"] == first["eval"]


# -- 3./4. torn lines named everywhere, dropped when regenerated; collect before any result -------------

def test_status_report_and_collect_name_a_torn_line_and_a_resume_drops_it(spec_path, tmp_path, capsys):
    assert cli(run_args(spec_path, tmp_path)) == 0
    spec = load_spec(spec_path)
    victim = stores(spec, tmp_path / "results")[0]
    reference = [(r["step"], r["value"]) for r in victim.read("metrics")]
    # a writer killed during step 4: its rows torn, no checkpoint of step 4
    with open(victim.table_path("metrics"), "ab") as handle:
        handle.write(b'{"run_id":"x","step":4,"split":"tr')
    (victim.checkpoint_dir / "step_00000004.pt").unlink()
    where = f"{victim.table_path('metrics')}:6"
    capsys.readouterr()

    assert cli(["status", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    assert where in capsys.readouterr().out  # Bug: status said nothing
    assert cli(["collect", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    assert where in capsys.readouterr().out
    assert cli(["report", str(spec_path), "--results", str(tmp_path / "results"),
                "--reports", str(tmp_path / "reports")]) == 0
    assert where in capsys.readouterr().out  # Bug: report said nothing

    # the run resumes from step 3 and rewrites step 4: the fragment must not stay in the table
    victim.write_status("failed", error="killed")
    assert cli(run_args(spec_path, tmp_path)) == 0
    assert victim.scan("metrics").corrupt == []  # Bug: kept forever, every collect warned
    assert [(r["step"], r["value"]) for r in victim.read("metrics")] == reference
    capsys.readouterr()
    assert cli(["collect", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    assert "corrupt" not in capsys.readouterr().out


def test_collect_before_any_result_is_one_clear_error(spec_path, tmp_path, capsys):
    # Bug: a traceback from mkstemp in a folder never created.
    assert cli(["collect", str(spec_path), "--results", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("solbench collect: error: nothing to collect:")
    assert str(tmp_path / "nothing" / "reliab") in err[0]


# -- 5. spec errors found by `solbench expand` ---------------------------------------------------------

@pytest.mark.parametrize("body, key_at", [
    ("base: {finetune: {lr: .nan}}\nmatrix: {method: [sol_rl]}\n", r"spec\.yaml:2: base\.finetune\.lr: nan is not a finite number"),
    ("matrix: {method: [sol_rl], finetune.lr: [1.0e-4, .inf]}\n", r"spec\.yaml:2: matrix\.finetune\.lr\[1\]: inf is not a finite"),
    ("base: {prompts_per_iter: 91}\nmatrix: {method: [sol_rl]}\n",
     r"spec\.yaml:2: run \(method=sol_rl\): prompts_per_iter: 91 exceeds the 90 prompts of 'shapes/train'"),
    ("base: {eval: {n_prompts: 40}}\nmatrix: {method: [sol_rl]}\n",
     r"spec\.yaml:2: run \(method=sol_rl\): eval\.n_prompts: 40 exceeds the 33 prompts of 'shapes/eval'"),
    ("matrix: {method: [diffusion_nft, flow_grpo], n: [4, 8]}\n",
     r"spec\.yaml:2: matrix\.n: no listed method \(diffusion_nft, flow_grpo\) has the axis 'n'.*methods with it: "
     r"naive_fp4, naive_scaling, sol_rl"),
    ("matrix: {method: [sol_rl]}\ninclude: [{method: diffusion_nft, k: 2}]\n",
     r"spec\.yaml:3: include\[0\]\.k: no listed method \(diffusion_nft\) has the axis 'k'"),
    ("base: {model: {name: tiny, path: models/tiny_v2}}\nmatrix: {method: [sol_rl]}\n",
     r"spec\.yaml:2: run \(method=sol_rl\): model\.path: 'models/tiny_v2' is no tiny model \(models/tiny_v2 is not a "
     r"folder\); use pretrained"),
])
def test_spec_errors_are_rejected_by_expand_naming_key_and_file(tmp_path, capsys, body, key_at):
    import re

    path = tmp_path / "spec.yaml"
    path.write_text("name: t\n" + body)
    assert cli(["expand", str(path)]) == 2
    err = capsys.readouterr().err
    assert re.search(key_at, err), err
    # the same spec without the mistake expands (so the check, not something else, rejected it)
    fixed = (body.replace(".nan", "1.0e-4").replace(", .inf", "").replace("91", "4").replace("40", "2")
             .replace(", n: [4, 8]", "").replace("k: 2", "group_size: 2").replace("models/tiny_v2", "random"))
    path.write_text("name: t\n" + fixed)
    assert cli(["expand", str(path)]) == 0, capsys.readouterr().err


# -- 6. NaN handling in the trainer ---------------------------------------------------------------------

def small_config(method: str, **overrides) -> RunConfig:
    return tiny_config.small_config(method, experiment="reliability", planned_iterations=3, seed=3, **overrides)


def test_diverged_weights_stop_the_run_and_the_last_checkpoint_is_finite(tmp_path):
    # Bug: weights were not checked after the optimizer step; a finite but diverged (1e30)
    # checkpoint was saved as the last good one.
    cfg = small_config("diffusion_nft")
    store = RunStore(tmp_path, cfg.run_id)
    trainer = Trainer(cfg, store)
    step = trainer.optimizer.step

    def diverging_step(*args, **kwargs):
        out = step(*args, **kwargs)
        if trainer.step == 2:
            with torch.no_grad():
                trainer.params[0].mul_(1e30)  # finite, but far past any trained weight
        return out

    trainer.optimizer.step = diverging_step
    with pytest.raises(NonFiniteLossError, match=rf"weights diverged at step 2.*max \|w\| = .*e\+\d\d.*"
                                                 rf"run {cfg.run_id}"):
        trainer.run()
    last, state = store.latest_checkpoint()
    assert last == 1
    flat = [t for t in _tensors(state["nets"]) if t.is_floating_point()]
    assert flat and all(bool(torch.isfinite(t).all()) and float(t.abs().max()) <= WEIGHT_LIMIT for t in flat)


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def test_a_nan_reward_stops_the_run_naming_step_run_and_candidate(tmp_path):
    # Bug: a NaN reward passed selection, ranked best, with no error.
    cfg = small_config("naive_scaling")
    store = RunStore(tmp_path, cfg.run_id)
    trainer = Trainer(cfg, store)
    score = trainer.engine.score_with

    def nan_at_step_2(reward_fn, rollout):
        total, parts = score(reward_fn, rollout)
        if trainer.step == 2:
            total = total.clone()
            total[1] = float("nan")
        return total, parts

    trainer.engine.score_with = nan_at_step_2
    with pytest.raises(NonFiniteLossError, match=rf"1 of 4 candidates have a non-finite reward at step 2 "
                                                 rf"\(run {cfg.run_id}\), first: prompt train-\d+, candidate 1"):
        trainer.run()
    assert store.latest_checkpoint()[0] == 1
    assert {r["step"] for r in store.read("candidates")} == {1}  # nothing recorded of step 2


def test_a_nan_on_the_fp4_path_names_step_and_run(tmp_path):
    # Bug: the quantizer's error during the explore-copy sync named neither the step nor the run.
    # Every Linear quantized: nvfp4_tiny keeps the attention projections, where LoRA trains, in fp32,
    # so a NaN there would never reach the quantizer.
    cfg = small_config("sol_rl", quant=QuantConfig(recipe="nvfp4_w4a4", backend="emulated"))
    store = RunStore(tmp_path, cfg.run_id)
    trainer = Trainer(cfg, store)
    after_update = trainer.method.after_update

    def poison(nets, step):  # a NaN in the explore copy's source (sol_rl's old policy)
        after_update(nets, step)
        if step == 2:
            with torch.no_grad():
                nets.trainable(trainer.method.rollout_net)[0].view(-1)[0] = float("nan")

    trainer.method.after_update = poison
    with pytest.raises(NonFiniteLossError, match=rf"non-finite values while syncing the explore copy at step 2 "
                                                 rf"\(run {cfg.run_id}\): .*non-finite"):
        trainer.run()
    assert store.latest_checkpoint()[0] == 1


# -- 7. temporary files of interrupted writes --------------------------------------------------------------

def test_a_resumed_run_removes_the_temporary_files_of_interrupted_writes(spec_path, tmp_path):
    # Bug: a kill during a checkpoint write left .step_*.pt.*.tmp (gigabytes with real models) forever.
    spec = load_spec(spec_path)
    run = spec.runs[0]
    run_dir = spec.run_dir(tmp_path, run.run_id)
    task = RunTask(str(run_dir), run.config.to_dict(), "_runfns:counting_run", [str(TESTS)])
    assert execute_run(task)["state"] == "done"
    store = RunStore(run_dir, run.run_id)
    leftovers = [store.checkpoint_dir / ".step_00000005.pt.a1b2c3.tmp", run_dir / ".status.json.d4e5f6.tmp"]
    for path in leftovers:
        path.write_bytes(b"partial")
    (store.checkpoint_dir / "step_00000004.pt").unlink()  # the run has step 4 left to do
    store.write_status("failed", error="killed")
    assert execute_run(task)["state"] == "done"
    assert not any(p.exists() for p in leftovers)
    assert not list(run_dir.rglob("*.tmp"))


# -- 8. where a failed Slurm job's log is ------------------------------------------------------------------

def test_status_shows_the_log_of_a_failed_slurm_job(spec_path, tmp_path, capsys):
    # Bug: only launch.json had the submitit folder; status never said where the log was.
    spec = load_spec(spec_path)
    run = spec.runs[0]
    store = RunStore(spec.run_dir(tmp_path / "results", run.run_id), run.run_id)
    store.write_json("spec.json", run.config.to_dict())
    folder = tmp_path / "results" / "reliab" / ".submitit"
    store.write_json("launch.json", {"executor": "slurm", "job_id": "41_0", "submitit_folder": str(folder)})
    store.write_status("failed", error="RuntimeError: boom", slurm_job_id="42_0")  # the requeued job failed
    assert cli(["status", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert f"{run.run_id} failed: Slurm job log {folder / '42_0_0_log.err'}" in out
    assert str(folder / "42_0_0_log.out") in out


# -- 10. the first screen is solbench's own -----------------------------------------------------------------

def test_a_command_that_loads_the_model_prints_no_torchao_or_pytree_noise(tmp_path):
    # Bug: diffusers probes torchao on every model load: failed .so loads, pytree deprecations and
    # "Unable to import torchao Tensor objects" on every command's first screen.
    assert importlib.util.find_spec("torchao") is not None, "torchao (a dev dependency) is what makes the noise"
    proc = subprocess.run([sys.executable, "-m", "solbench", "sample", "--prompts", "a red circle", "--seeds", "0",
                           "--steps", "1", "--out", str(tmp_path / "grid.png")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "grid.png").exists()  # the model was loaded, so diffusers did probe torchao
    for noise in ("torchao", "_pytree", "Failed to load", "Enum subclass"):
        assert noise not in proc.stderr, proc.stderr
