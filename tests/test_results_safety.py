"""A results directory cannot run code or reach outside itself (issue 47): checkpoints are read as tensors and
plain data only, nothing solbench writes or deletes leaves its root, a done run that lost results is said, and
bad input (environment, options, spec values) is one line naming it.

Launcher tests use the run functions of tests/_runfns.py; the checkpoint tests that need the trainer's own
state train the untrained tiny model for 2 iterations once (module fixture).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from solbench.cli import main as cli
from solbench.errors import StorageError
from solbench.results import RunStore
from solbench.spec import load_spec

import _tiny_config as tiny_config
from _runfns import three_runs_spec
from test_bad_state import one_error_line, run_args  # `solbench run` of counting_run; its one error line


class _Marker:
    """Pickled, calls open(marker, "w"): the file appears if anything unpickles it with code allowed."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def crafted_checkpoint(path: Path, marker: Path, step: int = 99) -> Path:
    """A step_*.pt whose pickle would create ``marker`` when loaded with weights_only=False."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "state": {"rng": torch.get_rng_state(), "payload": _Marker(marker)}}, path)
    return path


def rows(store: RunStore, table: str) -> list[dict]:
    """The table's rows without what the clock decides (wall_s, seconds)."""
    return [{k: v for k, v in row.items() if k not in ("wall_s", "seconds")} for row in store.read(table)]


def argparse_error(err: str, command: str) -> str:
    """The error line of an argparse refusal (after its usage line): no traceback."""
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith(f"solbench {command}: error: ")]
    return line


@pytest.fixture
def spec_path(tmp_path):
    path = tmp_path / "safety.yaml"
    path.write_text(textwrap.dedent(three_runs_spec("safety")))
    return path


def stores(spec_path, tmp_path) -> list[RunStore]:
    spec = load_spec(spec_path)
    return [RunStore(spec.run_dir(tmp_path / "results", r.run_id), r.run_id) for r in spec.runs]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny diffusion_nft run of 2 iterations by the real trainer, done: its checkpoints of steps 1 and 2."""
    from solbench.train.trainer import Trainer

    root = tmp_path_factory.mktemp("trained")
    cfg = tiny_config.small_config("diffusion_nft", experiment="safe", planned_iterations=2, seed=0)
    store = RunStore(root / "safe" / cfg.run_id, cfg.run_id)
    store.write_json("spec.json", cfg.to_dict())
    Trainer(cfg, store).run()
    store.write_status("done")
    return cfg, store


def copy_run(trained_run, tmp_path) -> RunStore:
    cfg, store = trained_run
    run_dir = tmp_path / "safe" / cfg.run_id
    shutil.copytree(store.run_dir, run_dir)
    return RunStore(run_dir, cfg.run_id)


# -- 1. checkpoints: tensors and plain data only -------------------------------------------------------

def test_the_trainers_checkpoint_loads_as_tensors_and_plain_data_and_resumes_bit_for_bit(trained_run, tmp_path):
    # Bugs caught: the trainer's checkpoint held numpy's RNG state as an ndarray (and the loader used
    # weights_only=False), so it could only be read with pickle, which runs whatever a file names.
    cfg, done = trained_run
    for _, path in done.checkpoint_files():
        payload = torch.load(path, map_location="cpu", weights_only=True)
        assert payload["step"] in (1, 2) and isinstance(payload["state"]["rng"]["numpy"]["keys"], torch.Tensor)
    # a run killed after step 1 resumes from it (RNG states restored from plain data) and ends where
    # the uninterrupted run ended, row for row
    from solbench.train.trainer import Trainer

    store = copy_run(trained_run, tmp_path)
    (store.checkpoint_dir / "step_00000002.pt").unlink()
    store.write_status("running")
    Trainer(cfg, store).run()
    assert rows(store, "metrics") == rows(done, "metrics")
    assert rows(store, "candidates") == rows(done, "candidates")


def test_a_state_that_only_pickle_could_load_is_refused_at_saving(tmp_path):
    # Bug caught: any object went into a checkpoint (a numpy array, a custom class), making it one that
    # weights_only loading refuses: the run's own resume would then start over.
    store = RunStore(tmp_path / "r", "r")
    with pytest.raises(TypeError, match=r"state\.rng\.numpy\[1\] is a numpy\.ndarray"):
        store.save_checkpoint(1, {"rng": {"numpy": np.random.get_state()}})
    assert not store.checkpoint_files()


def test_a_crafted_checkpoint_runs_no_code_on_resume_and_the_previous_one_is_used(spec_path, tmp_path, caplog):
    # Bug caught: `solbench run` resuming a run loaded step_*.pt with pickle: a crafted __reduce__ ran (the
    # marker file appeared) and the run was marked failed.
    assert cli(run_args(spec_path, tmp_path, "--no-report")) == 0
    store = stores(spec_path, tmp_path)[0]
    before = store.read("metrics")
    marker = tmp_path / "marker"
    crafted = crafted_checkpoint(store.checkpoint_dir / "step_00000099.pt", marker)
    store.write_status("failed", error="to resume it")
    with caplog.at_level(logging.WARNING):
        assert cli(run_args(spec_path, tmp_path, "--no-report", "--only", store.run_id)) == 0
    assert not marker.exists()
    assert f"skipping unreadable checkpoint {crafted}: its pickle names io.open" in caplog.text
    assert "using the previous one, step_00000004.pt" in caplog.text
    assert (store.run_dir / "starts.txt").read_text().split()[-1] == "5"  # resumed after step 4: nothing redone
    assert store.read_status()["state"] == "done" and store.read("metrics") == before


def test_a_checkpoint_that_loads_but_lacks_what_a_resume_needs_falls_back_to_the_previous_one(
        trained_run, tmp_path, caplog):
    # Bug caught: a checkpoint without 'step' in its state failed the resume with KeyError: 'step' (stored
    # as the run's failure) where a truncated one falls back to the previous checkpoint.
    from solbench.train.trainer import Trainer

    cfg, done = trained_run
    store = copy_run(trained_run, tmp_path)
    last = store.checkpoint_dir / "step_00000002.pt"
    state = torch.load(last, weights_only=True)["state"]
    del state["step"]
    torch.save({"step": 2, "state": state}, last)
    store.write_status("running")
    with caplog.at_level(logging.WARNING):
        Trainer(cfg, store).run()
    assert f"skipping unreadable checkpoint {last}: the checkpoint lacks 'step'" in caplog.text
    assert rows(store, "metrics") == rows(done, "metrics")  # step 2 computed again from step 1, identically


def test_fidelity_checkpoint_refuses_a_crafted_file_and_falls_back_from_one_in_a_run_folder(
        trained_run, tmp_path, capsys):
    # Bug caught: `solbench fidelity --checkpoint` loaded the file with pickle: the marker appeared.
    from solbench.fidelity.checkpoint import load_checkpoint

    store = copy_run(trained_run, tmp_path)
    marker = tmp_path / "marker"
    crafted = crafted_checkpoint(store.checkpoint_dir / "step_00000099.pt", marker)
    args = ["fidelity", "--checkpoint", str(crafted), "--seeds", "3", "--n-prompts", "1", "--steps", "1",
            "--explore-steps", "1", "--no-report", "--results", str(tmp_path / "results"), "--device", "cpu"]
    assert cli(args) == 2
    line = one_error_line(capsys.readouterr().err, "fidelity")
    assert f"cannot read {crafted} as a solbench checkpoint (its pickle names io.open" in line
    assert not marker.exists() and not (tmp_path / "results").exists()
    # the run folder: measured from the checkpoint a resume would take, saying the crafted one is unreadable
    checkpoint = load_checkpoint(store.run_dir)
    assert checkpoint.step == 2 and not marker.exists()
    assert any(f"{crafted} cannot be read" in note for note in checkpoint.notes)


def test_fidelity_checkpoint_without_network_weights_is_one_line_naming_what_it_lacks(trained_run, tmp_path, capsys):
    # Bug caught: a checkpoint that loads but lacks nets.trainable was a KeyError: 'trainable' traceback.
    store = copy_run(trained_run, tmp_path)
    last = store.checkpoint_dir / "step_00000002.pt"
    state = torch.load(last, weights_only=True)["state"]
    del state["nets"]["trainable"]
    torch.save({"step": 2, "state": state}, last)
    args = ["fidelity", "--checkpoint", str(last), "--seeds", "3", "--no-report", "--results",
            str(tmp_path / "results"), "--device", "cpu"]
    assert cli(args) == 2
    assert "the checkpoint lacks 'nets.trainable'" in one_error_line(capsys.readouterr().err, "fidelity")


def test_fidelity_checkpoint_of_a_run_whose_spec_json_is_corrupt_names_the_file_and_the_rerun(trained_run, tmp_path):
    # Bug caught: a corrupt spec.json beside the checkpoint was a JSONDecodeError traceback.
    from solbench.errors import ConfigError
    from solbench.fidelity.checkpoint import load_checkpoint

    store = copy_run(trained_run, tmp_path)
    (store.run_dir / "spec.json").write_text('{"method": ')
    with pytest.raises(ConfigError, match=rf"{store.run_dir}/spec.json is not a run's spec .*`solbench run SPEC "
                                          rf"--force --only {store.run_id}` reruns the run"):
        load_checkpoint(store.run_dir)


def test_the_slurm_requeue_reads_no_crafted_checkpoint(tmp_path, caplog):
    # Bug caught: RunJob.checkpoint (submitit's requeue on timeout) read the newest checkpoint with pickle.
    from solbench.config import RunConfig
    from solbench.launch import RunJob, RunTask

    control = crafted_checkpoint(tmp_path / "control.pt", tmp_path / "control_marker")
    torch.load(control, weights_only=False)  # the control: unpickled with code allowed, the file does run code
    assert (tmp_path / "control_marker").exists()
    cfg = RunConfig(experiment="slurmsafe")
    store = RunStore(tmp_path / cfg.run_id, cfg.run_id)
    store.save_checkpoint(3, {"rng": torch.get_rng_state()})
    marker = tmp_path / "marker"
    crafted_checkpoint(store.checkpoint_dir / "step_00000099.pt", marker)
    with caplog.at_level(logging.WARNING):
        RunJob(RunTask(str(store.run_dir), cfg.to_dict())).checkpoint()
    assert not marker.exists()
    assert "step_00000099.pt: its pickle names io.open" in caplog.text
    assert store.read_status()["reason"] == "timeout or preemption; resumes from step 3"


def test_an_older_runs_pickle_only_checkpoint_names_the_file_and_the_rerun(tmp_path, caplog):
    # Bug caught: nothing said what happens to checkpoints written before issue 47 (numpy RNG state as an
    # array): now they are not loaded, and the message says how to redo the run.
    store = RunStore(tmp_path / "abc123", "abc123")
    store.checkpoint_dir.mkdir(parents=True)
    old = store.checkpoint_dir / "step_00000002.pt"
    torch.save({"step": 2, "state": {"rng": {"numpy": np.random.get_state()}}}, old)
    with caplog.at_level(logging.WARNING):
        assert store.latest_checkpoint() is None
    assert f"{old}: its pickle names numpy" in caplog.text
    assert "`solbench run SPEC --force --only abc123`" in caplog.text
    assert "no earlier checkpoint is left: the run starts from step 0" in caplog.text


# -- 2. nothing written or deleted outside the root ----------------------------------------------------

def test_run_force_through_a_symlinked_run_folder_deletes_nothing_outside_the_results_root(
        spec_path, tmp_path, capsys):
    # Bug caught: `run --force --only ID` with the run folder replaced by a link emptied the link's target.
    assert cli(run_args(spec_path, tmp_path, "--no-report")) == 0
    store = stores(spec_path, tmp_path)[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "IMPORTANT.txt").write_text("keep me")
    shutil.rmtree(store.run_dir)
    store.run_dir.symlink_to(elsewhere)
    capsys.readouterr()
    assert cli(run_args(spec_path, tmp_path, "--no-report", "--force", "--only", store.run_id)) == 2
    line = one_error_line(capsys.readouterr().err, "run")
    assert f"{store.run_dir} -> {elsewhere} is a symbolic link" in line and "remove the link" in line
    assert [p.name for p in elsewhere.iterdir()] == ["IMPORTANT.txt"]
    with pytest.raises(StorageError, match="symbolic link"):  # the store refuses it too (fidelity, sweeps)
        store.clear()
    assert (elsewhere / "IMPORTANT.txt").read_text() == "keep me"


def test_links_inside_a_run_folder_are_refused_and_never_followed(spec_path, tmp_path, capsys):
    # Bugs caught: a checkpoints/ link took checkpoint writes (and the deletion of old ones) outside the
    # run folder; a .lock link to a file had that file truncated by the run lock.
    from solbench.launch import run_lock

    assert cli(run_args(spec_path, tmp_path, "--no-report")) == 0
    store = stores(spec_path, tmp_path)[1]
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (store.run_dir / ".lock").unlink()
    (store.run_dir / ".lock").symlink_to(precious)
    with pytest.raises(StorageError, match=r"\.lock is a symbolic link"):
        with run_lock(store.run_dir):
            pass
    capsys.readouterr()
    assert cli(run_args(spec_path, tmp_path, "--no-report", "--force")) == 2
    assert ".lock -> " in one_error_line(capsys.readouterr().err, "run")
    assert precious.read_text() == "keep me"


@pytest.mark.parametrize("name", ["../../escape", "ABSOLUTE", "a/b", ".hidden"])
def test_fidelity_name_is_held_to_the_spec_name_pattern(tmp_path, capsys, name):
    # Bug caught: `fidelity --name ../../escape` (or an absolute name) wrote its run outside --results.
    results = tmp_path / "deep" / "results"
    results.mkdir(parents=True)
    name = str(tmp_path / "absolute") if name == "ABSOLUTE" else name
    with pytest.raises(SystemExit) as exit_info:
        cli(["fidelity", "--name", name, "--results", str(results), "--no-report", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert f"argument --name: {name!r} is not a name" in argparse_error(capsys.readouterr().err, "fidelity")
    assert [p.name for p in tmp_path.rglob("*")] == ["deep", "results"]  # nothing written, inside or out


# -- 3. a done run that lost results ---------------------------------------------------------------

def test_a_done_run_without_metrics_or_spec_is_said_by_run_status_and_collect(spec_path, tmp_path, capsys):
    # Bugs caught: a done run whose metrics.jsonl was deleted was collected with the other runs' rows only,
    # exit 0 and not a word; one whose spec.json was corrupt was never reported (collect crashed or skipped it).
    assert cli(run_args(spec_path, tmp_path, "--no-report")) == 0
    lost_metrics, lost_spec, fine = stores(spec_path, tmp_path)
    (lost_metrics.run_dir / "metrics.jsonl").unlink()
    (lost_spec.run_dir / "spec.json").write_text("{not json")
    results = ["--results", str(tmp_path / "results")]
    capsys.readouterr()
    for command, code in ((["collect", str(spec_path), *results], 1), (["status", str(spec_path), *results], 0),
                          (run_args(spec_path, tmp_path, "--no-report"), 1)):
        assert cli(command) == code, command
        out = capsys.readouterr().out
        for store, lacks in ((lost_metrics, "metrics.jsonl is missing"), (lost_spec, "spec.json is not JSON")):
            assert f"warning: run {store.run_id} is done but {store.run_dir}/{lacks}" in out, (command, out)
            assert f"`solbench run {spec_path} --force --only {store.run_id}` reruns it" in out
        assert f"run {fine.run_id} is done but" not in out
    report = json.loads((tmp_path / "results" / "safety" / "collect_report.json").read_text())
    assert {d["run_id"] for d in report["damaged_runs"]} == {lost_metrics.run_id, lost_spec.run_id}
    assert report["runs"] == 2  # the run without a readable spec.json is left out, the others collected
    # the fix named works: both are rerun and nothing is said any more
    assert cli(run_args(spec_path, tmp_path, "--no-report", "--force", "--only", lost_metrics.run_id,
                        lost_spec.run_id)) == 0
    assert "is done but" not in capsys.readouterr().out


# -- 4. one-line errors ----------------------------------------------------------------------------

def test_a_spec_that_is_not_utf8_is_one_line_naming_the_file_and_line(tmp_path, capsys):
    # Bug caught: expand, run, doctor and report died with a UnicodeDecodeError traceback.
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\nbase:\n  description: caf\xe9\n".encode("latin-1"))
    for command in (["expand", str(path)], ["run", str(path), "--results", str(tmp_path / "r")],
                    ["doctor", str(path)], ["report", str(path), "--results", str(tmp_path / "r")]):
        assert cli(command) == 2, command
        line = one_error_line(capsys.readouterr().err, command[0])
        assert f"{path}:3: not UTF-8 text (byte e9 at column 19)" in line, line


def test_environment_variables_are_refused_at_the_command_lines_start_naming_them(tmp_path):
    # Bugs caught: SOLBENCH_QUANT_COMPILE_MIN=abc was a ValueError at import of solbench/quant/fused.py (so
    # every command, and every library import, died); SOLBENCH_CORE_LOCKS under a file a NotADirectoryError.
    env = {**os.environ, "SOLBENCH_QUANT_COMPILE_MIN": "abc"}
    imported = subprocess.run([sys.executable, "-c", "import solbench.quant.fused as f; print(f.MIN_ELEMENTS)"],
                              env=env, capture_output=True, text=True)
    assert imported.returncode == 0 and imported.stdout.strip() == str(1 << 16), imported.stderr
    spec = tmp_path / "s.yaml"
    spec.write_text(textwrap.dedent(three_runs_spec("envs")))
    command = subprocess.run([sys.executable, "-m", "solbench", "expand", str(spec)], env=env, capture_output=True,
                             text=True)
    assert command.returncode == 2
    assert "SOLBENCH_QUANT_COMPILE_MIN='abc' is not a whole number" in one_error_line(command.stderr, "expand")
    afile = tmp_path / "afile"
    afile.write_text("")
    env = {**os.environ, "SOLBENCH_CORE_LOCKS": str(afile / "locks")}
    command = subprocess.run([sys.executable, "-m", "solbench", "expand", str(spec)], env=env, capture_output=True,
                             text=True)
    assert command.returncode == 2
    assert f"is under {afile}, which is not a folder" in one_error_line(command.stderr, "expand")


def test_fidelity_guidance_nan_and_seeds_are_refused_with_one_bound(tmp_path, capsys):
    # Bugs caught: `--guidance nan` reached the first layer (NonFiniteError traceback), where a spec's nan
    # is "not a finite number"; `--seeds -5` said ">= 1" and `--seeds 2` said ">= 3".
    base = ["fidelity", "--results", str(tmp_path / "results"), "--no-report", "--device", "cpu"]
    with pytest.raises(SystemExit):
        cli([*base, "--guidance", "nan"])
    assert "argument --guidance: nan is not a finite number" in argparse_error(capsys.readouterr().err, "fidelity")
    for seeds in ("-5", "2"):
        assert cli([*base, "--seeds", seeds]) == 2
        line = one_error_line(capsys.readouterr().err, "fidelity")
        assert f"--seeds must be >= 3 to rank seeds" in line and line.endswith(f"got {seeds}")
    assert not (tmp_path / "results").exists()


# -- 5. report reads SOLBENCH_REPORTS ----------------------------------------------------------------

def test_report_honours_solbench_reports_as_run_does(spec_path, tmp_path, monkeypatch):
    # Bug caught: `solbench report` wrote to ./reports whatever SOLBENCH_REPORTS said.
    assert cli(run_args(spec_path, tmp_path, "--no-report")) == 0
    assert cli(["collect", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    monkeypatch.setenv("SOLBENCH_REPORTS", str(tmp_path / "env_reports"))
    monkeypatch.chdir(tmp_path)
    assert cli(["report", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    assert (tmp_path / "env_reports" / "safety" / "index.md").is_file()
    assert not (tmp_path / "reports").exists()


# -- 6. bounds at expansion ------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("  iterations: 100000000000000000000000",
     "base.iterations: Input should be less than or equal to 1000000, got 100000000000000000000000 (more than"),
    ("  seed: -1", "base.seed: Input should be greater than or equal to 0, got -1 (the run seed seeds numpy's"),
    ("  seed: 18446744073709551617", "base.seed: Input should be less than 4294967296"),
    ("  finetune: {lr: 1.0e+308}", "base.finetune.lr: Input should be less than or equal to 1, got 1e+308 (AdamW"),
    ("  rewards: {shapes_geneval: -1.0e+308}", "base.rewards.shapes_geneval: Input should be greater than or equal "
                                               "to -1000, got -1e+308 (a reward weight"),
    ("  numerics: {threads: 100000}", "base.numerics.threads: Input should be less than or equal to 1024, got 100000 "
                                      "(no CPU solbench runs on has more than 1024 cores)"),
    ("  prompts_per_iter: 100000000000000000000", "base.prompts_per_iter: Input should be less than or equal to 65536"),
    ("  method_config: {group_size: 100000000000000000000}",
     "method_config.group_size: should be less than or equal to 65536, got 100000000000000000000"),
])
def test_values_no_run_can_use_are_refused_at_expansion_with_the_reason(tmp_path, capsys, line, message):
    # Bug caught: expand accepted iterations 1e23, lr 1e308, seed -1 and 2**64+1, a reward weight of -1e308,
    # threads 100000: each failed (or ran forever) only in the run.
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\nbase:\n{line}\nmatrix:\n  method: [diffusion_nft]\n")
    assert cli(["expand", str(path)]) == 2
    error = one_error_line(capsys.readouterr().err, "expand")
    assert error.startswith(f"solbench expand: error: {path}:3") and message in error, error


def test_a_prompt_file_that_does_not_exist_is_refused_at_expansion_naming_the_spec_line(tmp_path, capsys,
                                                                                        monkeypatch):
    # Bug caught: expand accepted a train_prompts file that does not exist; the run found out at launch. (Expand,
    # the planning command, prints the runs and names the file on stderr: tests/test_hostile_specs.py.)
    monkeypatch.chdir(tmp_path)  # the file's path is relative to the working directory
    path = tmp_path / "prompts.yaml"
    path.write_text("name: p\nbase:\n  train_prompts: nowhere/train.txt\nmatrix:\n  method: [diffusion_nft]\n")
    assert cli(["run", str(path), "--results", str(tmp_path / "r")]) == 2
    error = one_error_line(capsys.readouterr().err, "run")
    assert f"{path}:3: train_prompts: prompt file 'nowhere/train.txt' not found" in error, error
    assert not (tmp_path / "r").exists()
    assert cli(["expand", str(path)]) == 0
    assert f"warning: {path}:3: train_prompts: prompt file 'nowhere/train.txt' not found" in capsys.readouterr().err
    assert load_spec(path).missing_files  # the library still expands it (doctor, provenance: files come later)
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "train.txt").write_text("a red circle\n" * 8)  # (in the grammar its reward parses)
    assert cli(["expand", str(path)]) == 0


def test_report_names_are_held_to_the_spec_name_pattern(tmp_path, capsys):
    """Bug caught: `solbench report` took the experiment name from its argument or from an unvalidated spec's
    `name` and wrote reports/<name>: '../escape' wrote the report outside the reports root."""
    spec = tmp_path / "evil.yaml"
    spec.write_text("name: ../../escape\n")
    for command in (["report", str(spec), "--results", str(tmp_path / "r"), "--reports", str(tmp_path / "rep")],
                    ["report", "../escape", "--results", str(tmp_path / "r"), "--reports", str(tmp_path / "rep")]):
        assert cli(command) == 2, command
        assert "is not an experiment name" in one_error_line(capsys.readouterr().err, "report")
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()
