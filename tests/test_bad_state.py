"""Bad state on disk and bad input, as a new user meets them (issue 22, item 3): each gives one clear
line naming the file and what is wrong, no traceback, and loses nothing already written.

Launcher tests use the run functions of tests/_runfns.py; the disk-full test runs the real trainer on
the untrained tiny model. A full disk and a read-only folder are real: a small tmpfs and a read-only
bind mount in a mount namespace of the test's own (``unshare``), which the rest of the machine never
sees.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from solbench.cli import main as cli
from solbench.results import RunStore
from solbench.spec import load_spec

import _tiny_config as tiny_config
from _runfns import three_runs_spec

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def spec_path(tmp_path):
    path = tmp_path / "badstate.yaml"
    path.write_text(textwrap.dedent(three_runs_spec("badstate")))
    return path


def run_args(spec_path, tmp_path, *extra):
    return ["run", str(spec_path), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
            "--run-fn", "_runfns:counting_run", "--quiet", *extra]


def stores(spec, results) -> list[RunStore]:
    return [RunStore(spec.run_dir(results, r.run_id), r.run_id) for r in spec.runs]


def solbench_env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def in_private_mounts(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run the sh ``script`` in a mount namespace of its own (as root, or as a user through a user
    namespace), where it mounts a small tmpfs or a read-only bind that no other process sees."""
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    probe = subprocess.run(["unshare", "--mount", *user, "true"], capture_output=True, text=True)
    assert probe.returncode == 0, ("these tests need a private mount namespace (`unshare --mount`; as a user, "
                                   f"unprivileged user namespaces): {probe.stderr.strip()}")
    return subprocess.run(["unshare", "--mount", *user, "sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=solbench_env(COLUMNS="300"), timeout=1200)


def solbench_cmd(*args) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "solbench", *map(str, args)])


def one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"solbench {command}: error: "), err
    return lines[0]


# -- a damaged row of a finished run -----------------------------------------------------------------

def test_a_damaged_row_of_a_finished_run_is_named_with_the_command_that_rewrites_it(spec_path, tmp_path, capsys):
    # Bug caught: collect and report dropped the row without saying so in the report, and the hint
    # said "resuming the run rewrites its rows": `run` then said "nothing to do", the row stayed lost.
    assert cli(run_args(spec_path, tmp_path)) == 0
    victim = stores(load_spec(spec_path), tmp_path / "results")[0]
    complete = victim.read("metrics")
    lines = victim.table_path("metrics").read_bytes().splitlines(keepends=True)
    lines[2] = lines[2][:25] + b"\n"  # damage from outside, in the middle of a finished run's table
    victim.table_path("metrics").write_bytes(b"".join(lines))
    capsys.readouterr()

    assert cli(["collect", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert f"{victim.table_path('metrics')}:3:" in out
    repair = f"solbench run {spec_path} --force --only {victim.run_id}"
    assert f"`{repair}` rewrites them" in out
    assert cli(["report", str(spec_path), "--results", str(tmp_path / "results"),
                "--reports", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out
    assert "warning: Built from fewer rows than the runs wrote: 1 corrupt line(s)" in out and repair in out
    index = tmp_path / "reports" / "badstate" / "index.md"
    assert "**Warning.** Built from fewer rows than the runs wrote" in index.read_text()

    # the command named really repairs it (the reports and results roots as given before)
    assert cli([*shlex.split(repair)[1:], "--results", str(tmp_path / "results"), "--reports",
                str(tmp_path / "reports"), "--run-fn", "_runfns:counting_run", "--quiet"]) == 0
    assert victim.corrupt_lines() == [] and victim.read("metrics") == complete
    assert "Built from fewer rows" not in index.read_text()


def test_a_torn_last_line_of_an_unfinished_run_is_rewritten_by_resuming_and_the_hint_says_so(spec_path, tmp_path,
                                                                                          capsys):
    # Bug caught: one hint for every damaged row; a torn tail of an interrupted run needs no --force.
    assert cli(run_args(spec_path, tmp_path)) == 0
    victim = stores(load_spec(spec_path), tmp_path / "results")[0]
    complete = victim.read("metrics")
    with open(victim.table_path("metrics"), "ab") as handle:
        handle.write(b'{"run_id":"x","step":4,"split":"tr')  # killed while writing step 4's rows again
    (victim.checkpoint_dir / "step_00000004.pt").unlink()
    victim.write_status("failed", error="killed")
    capsys.readouterr()
    assert cli(["status", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert f"`solbench run {spec_path}` rewrites them: resuming {victim.run_id} drops the torn last line" in out
    assert cli(run_args(spec_path, tmp_path)) == 0
    assert victim.corrupt_lines() == [] and victim.read("metrics") == complete


# -- a read-only results folder ------------------------------------------------------------------------

def test_a_read_only_results_folder_is_one_line_for_run_run_force_and_collect(spec_path, tmp_path):
    # Bug caught: tracebacks (PermissionError on the run's .lock, on collect's .runs.parquet.*.tmp).
    assert cli(run_args(spec_path, tmp_path)) == 0
    spec = load_spec(spec_path)
    stores(spec, tmp_path / "results")[1].write_status("failed", error="killed")  # a run left to do
    results, out = tmp_path / "results", tmp_path / "out"
    out.mkdir()
    common = ["--results", results, "--reports", tmp_path / "reports"]
    script = f"""
mount --bind {results} {results} && mount -o remount,bind,ro {results} || exit 90
{solbench_cmd("run", spec_path, *common, "--run-fn", "_runfns:counting_run", "--quiet")} > {out}/o1 2> {out}/e1
echo $? > {out}/rc1
{solbench_cmd("run", spec_path, *common, "--run-fn", "_runfns:counting_run", "--quiet", "--force")} > {out}/o2 2> {out}/e2
echo $? > {out}/rc2
{solbench_cmd("collect", spec_path, "--results", results)} > {out}/o3 2> {out}/e3
echo $? > {out}/rc3
"""
    done = in_private_mounts(script, tmp_path)
    assert done.returncode == 0, done.stderr
    for n, command in ((1, "run"), (2, "run"), (3, "collect")):
        assert (out / f"rc{n}").read_text().strip() == "2"
        line = one_error_line((out / f"e{n}").read_text(), command)
        assert line.endswith(": Read-only file system") and str(results / "badstate") in line, line
    assert all(s.read_status()["state"] in ("done", "failed") for s in stores(spec, results))  # nothing lost


# -- a full disk -----------------------------------------------------------------------------------------

FULL_SPEC = """
name: full
launch: local
base:
  model: {name: tiny, path: random}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 1
  iterations: 2
  checkpoint_every: 1
  sampling: {steps: 2, eval_steps: 2}
  eval: {every: 2, prompts: shapes/eval, n_prompts: 1, seeds_per_prompt: 1, rewards: [shapes_geneval], grid_prompts: 1}
matrix:
  method: [diffusion_nft]
  group_size: [2]
"""


@pytest.mark.slow
def test_a_full_disk_names_the_checkpoint_and_says_so_collect_is_one_line_and_the_run_resumes(tmp_path):
    # Bug caught: the run's error read "RuntimeError: [enforce fail at inline_container.cc:672] .
    # unexpected pos 64 vs 0" (the status table dropped the bracketed part), naming neither the file
    # nor the full disk; collect then crashed with a traceback (OSError: [Errno 28]) and the end of
    # `solbench run` (its summary) never printed.
    spec_path = tmp_path / "full.yaml"
    spec_path.write_text(textwrap.dedent(FULL_SPEC))
    (run,) = load_spec(spec_path).runs
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    out.mkdir()
    reports = tmp_path / "reports"
    run_cmd = solbench_cmd("run", spec_path, "--results", results, "--reports", reports, "--quiet")
    script = f"""
mount -t tmpfs -o size=1m solbench-full {results} || exit 90
{run_cmd} > {out}/o1 2> {out}/e1; echo $? > {out}/rc1
{solbench_cmd("status", spec_path, "--results", results)} > {out}/o2 2> {out}/e2
mount -o remount,size=64m {results} || exit 91
{run_cmd} > {out}/o3 2> {out}/e3; echo $? > {out}/rc3
rm -rf {reports}
dd if=/dev/zero of={results}/filler bs=1M 2> /dev/null
{run_cmd} > {out}/o4 2> {out}/e4; echo $? > {out}/rc4
{solbench_cmd("collect", spec_path, "--results", results)} > {out}/o5 2> {out}/e5; echo $? > {out}/rc5
rm {results}/filler
{run_cmd} > {out}/o6 2> {out}/e6; echo $? > {out}/rc6
cp -a {results}/full {out}/results
"""
    done = in_private_mounts(script, tmp_path)
    assert done.returncode == 0, done.stderr
    text = {name: (out / name).read_text() for name in os.listdir(out) if (out / name).is_file()}
    checkpoint = results / "full" / run.run_id / "checkpoints" / "step_00000001.pt"
    # 1. the checkpoint of step 1 does not fit: the run fails naming it and the full disk; the summary prints
    assert text["rc1"].strip() == "1" and "Traceback" not in text["e1"], text["e1"]
    assert f"1 run(s) did not finish: {run.run_id}" in text["o1"]
    assert f"the disk is full: cannot write {checkpoint}" in text["e1"]
    # 2. the status table shows the error as written (brackets included)
    assert "StorageError: the disk is full: cannot write" in text["o2"], text["o2"]
    # 3. with space back the run goes on and finishes
    assert text["rc3"].strip() == "0", text["e3"]
    # 4./5. the disk full again while collecting: one line each, and `run` still ends with its summary
    assert text["rc4"].strip() == "1" and "Traceback" not in text["e4"], text["e4"]
    assert (f"collect and report failed: the disk is full: cannot write {results / 'full'}" in text["o4"]), text["o4"]
    assert text["rc5"].strip() == "2"
    line = one_error_line(text["e5"], "collect")
    assert f"the disk is full: cannot write {results / 'full'}" in line
    # 6. with space back the report is written, from every row
    assert text["rc6"].strip() == "0" and "report:" in text["o6"], text["e6"]
    store = RunStore(out / "results" / run.run_id, run.run_id)
    assert [r["step"] for r in store.read("metrics") if (r["split"], r["metric"]) == ("eval", "shapes_geneval")] == [0, 2]
    assert sorted({r["step"] for r in store.read("metrics") if r["split"] == "train"}) == [1, 2]
    assert store.read_json("env.json")["attempts"][-1]["attempt"] == 2


def test_the_status_table_shows_an_error_with_brackets_as_written(spec_path, tmp_path, capsys, monkeypatch):
    # Bug caught: rich read "[enforce fail at inline_container.cc:672]" as markup and dropped it.
    monkeypatch.setenv("COLUMNS", "250")  # room for the error column
    spec = load_spec(spec_path)
    store = stores(spec, tmp_path / "results")[0]
    store.write_json("spec.json", spec.runs[0].config.to_dict())
    store.write_status("failed", error="RuntimeError: [enforce fail at x.cc:6] . pos 64")
    assert cli(["status", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    assert "[enforce fail at x.cc:6]" in capsys.readouterr().out


# -- a deleted run folder --------------------------------------------------------------------------------

def test_a_report_from_fewer_runs_than_the_spec_has_says_so(spec_path, tmp_path, capsys):
    # Bug caught: a run folder deleted after collecting, then `solbench report`: exit 0, "3 runs
    # (3 done)" from the old tables, no warning.
    assert cli(run_args(spec_path, tmp_path)) == 0
    spec = load_spec(spec_path)
    gone = spec.runs[2].run_id
    shutil.rmtree(spec.run_dir(tmp_path / "results", gone))
    capsys.readouterr()
    report = ["report", str(spec_path), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports")]
    assert cli(report) == 0
    out = capsys.readouterr().out
    said = f"The collected tables hold 1 run(s) whose folder is gone from {tmp_path / 'results' / 'badstate'}: {gone}"
    assert f"warning: {said}" in out
    index = tmp_path / "reports" / "badstate" / "index.md"
    assert said in index.read_text()
    # collected again: the tables hold 2 runs, and the report says the spec has 3
    assert cli(["collect", str(spec_path), "--results", str(tmp_path / "results")]) == 0
    assert cli(report) == 0
    said = f"Built from 2 of the spec's 3 runs: {gone} were not collected"
    assert said in capsys.readouterr().out and said in index.read_text()


# -- fidelity ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ("--seeds 2", "--seeds must be >= 3 to rank seeds"),
    ("--n-prompts 0", "--n-prompts must be >= 1, got 0"),
    # more explore steps than full-precision steps: accepted, and measured
    ("--explore-steps 3", "--explore-steps 3 exceeds --steps 1: the explore stage is the short one"),
    # an unknown recipe: a KeyError traceback (UnknownRecipeError)
    ("--recipe bogus", "--recipe bogus: unknown quantization recipe 'bogus'."),
    # two recipes, the second unknown: the first one ran for 7 s, then the traceback, and no report
    ("--recipes nvfp4_tiny,bogus", "--recipes bogus: unknown quantization recipe 'bogus'."),
])
def test_fidelity_settings_that_cannot_be_measured_are_one_line_before_sampling(tmp_path, capsys, change, message):
    # Bug caught: --seeds 2 passed validation, sampled, then KeyError: 'run_id' (no prompt group of
    # fewer than 3 seeds is ranked); --n-prompts 0 said "the prompt set 'shapes/eval' has 33 prompts".
    args = ["fidelity", "--steps", "1", "--explore-steps", "1", "--n-prompts", "1", "--seeds", "3",
            "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"), "--device", "cpu"]
    flag, value = change.split()
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert cli(args) == 2
    assert message in one_error_line(capsys.readouterr().err, "fidelity")
    assert not (tmp_path / "results").exists()  # nothing sampled, nothing written
    assert not (tmp_path / "reports").exists()


def test_fidelity_of_a_run_falls_back_from_an_unreadable_last_checkpoint_as_a_resume_and_says_what_it_measures(
        tmp_path, capsys):
    # Bugs caught: `fidelity --checkpoint RUN_DIR` whose last checkpoint was cut short was an error, where a
    # resume of the run falls back to the previous checkpoint (RunStore.latest_checkpoint); and the
    # checkpoint of an unfinished run (step 1 of 2) was measured without a word on screen. (Before that the
    # fallback was taken quietly, a log warning only: now each is a line on screen and in the run's spec.json.)
    from solbench.train.trainer import Trainer

    cfg = tiny_config.small_config("diffusion_nft", experiment="fid", planned_iterations=2, seed=0)
    store = RunStore(tmp_path / "fid" / cfg.run_id, cfg.run_id)
    store.write_json("spec.json", cfg.to_dict())
    Trainer(cfg, store).run()
    store.write_status("done")
    earlier, final = sorted(store.checkpoint_dir.glob("step_*.pt"))
    final.write_bytes(final.read_bytes()[:1000])  # cut short
    args = ["fidelity", "--checkpoint", str(store.run_dir), "--seeds", "3", "--n-prompts", "1", "--steps", "1",
            "--explore-steps", "1", "--no-report", "--results", str(tmp_path / "results"), "--device", "cpu"]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert (f"note: --checkpoint {store.run_dir}: {final} cannot be read (cut short?); measuring the previous "
            "checkpoint, step 1, as a resume of the run would start from it") in out
    assert f"note: --checkpoint {store.run_dir}: measuring step 1 of 2, not the run's final policy" in out
    (measured,) = [d for d in (tmp_path / "results").glob("*/*") if d.is_dir()]
    recorded = json.loads((measured / "spec.json").read_text())["checkpoint"]
    assert recorded["step"] == 1 and recorded["path"] == str(earlier)

    # the run was killed before its final checkpoint: measured, saying the run is not finished
    final.unlink()
    store.write_status("running")
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert (f"note: --checkpoint {store.run_dir}: the run is not finished (status running): measuring step 1 of 2, "
            "not its final policy") in out
    assert "done already" in out  # the same checkpoint as before: the same fidelity run

    # a file named explicitly is that file or an error naming it (no fallback behind the user's back)
    final.write_bytes(earlier.read_bytes()[:1000])
    args[args.index(str(store.run_dir))] = str(final)
    assert cli(args) == 2
    assert f"cannot read {final} as a solbench checkpoint" in one_error_line(capsys.readouterr().err, "fidelity")


# -- the environment -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, value", [("fidelity", "abc"), ("sweep", "0")])
def test_a_bad_solbench_threads_is_one_line_before_any_work_in_every_command(tmp_path, capsys, monkeypatch, command,
                                                                            value):
    # Bug caught: SOLBENCH_THREADS=abc (or 0) was a ValueError traceback; `solbench run` now refuses it before any
    # run (tests/test_launch.py), and the commands that run work outside the launcher (fidelity, sweep) too.
    spec = tmp_path / "sweepy.yaml"
    spec.write_text(textwrap.dedent("""
        name: sweepy
        base: {model: {name: tiny, path: random}, iterations: 1, prompts_per_iter: 1,
               eval: {every: 1, n_prompts: 1, seeds_per_prompt: 1, rewards: [shapes_geneval]}}
        matrix: {method: [sol_rl], seed: [0]}
        sweep: {trials: 1, params: {n: {choices: [4]}, k: {choices: [2]}}}
    """))
    args = {"fidelity": ["fidelity", "--model-path", "random", "--steps", "1", "--explore-steps", "1", "--n-prompts",
                         "1", "--seeds", "3", "--results", str(tmp_path / "results"), "--reports",
                         str(tmp_path / "reports"), "--device", "cpu"],
            "sweep": ["sweep", str(spec), "--results", str(tmp_path / "results"), "--run-fn", "_runfns:eval_curve_run",
                      "--no-collect"]}[command]
    monkeypatch.setenv("SOLBENCH_THREADS", value)
    assert cli(args) == 2
    assert f"SOLBENCH_THREADS={value!r}" in one_error_line(capsys.readouterr().err, command)
    assert not (tmp_path / "results").exists() and not (tmp_path / "reports").exists()  # nothing started
    monkeypatch.delenv("SOLBENCH_THREADS")
    if command == "sweep":  # the control: without it the same command runs
        assert cli(args) == 0


# -- interrupting the launcher -------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["INT", "TERM", "KILL"])
def test_a_signal_to_the_launcher_alone_stops_its_workers_and_leaves_no_semaphore_warning(spec_path, tmp_path, sig):
    # Bug caught: `kill -INT <launcher pid>` (not the group) waited for every running run and even
    # started the queued one, then exited 130; a kill -TERM or -KILL printed "resource_tracker: There
    # appear to be 7 leaked semaphore objects to clean up at shutdown".
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "solbench", "run", str(spec_path), "--results", str(results), "--quiet",
           "--no-report", "--workers", "2", "--run-fn", "_runfns:rendezvous_run"]
    # SIGINT as an interactive shell leaves it: a test session started as a background job (`pytest &` in a
    # script) inherits SIGINT ignored, and the launcher would never see the signal
    proc = subprocess.Popen(cmd, env=solbench_env(SOLBENCH_TEST_STEP_S="3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    spec = load_spec(spec_path)
    runs = stores(spec, results)
    deadline = time.monotonic() + 300
    while sum(s.has_checkpoint() for s in runs) < 2:  # two runs going, one queued
        assert time.monotonic() < deadline and proc.poll() is None, "two runs never got going"
        time.sleep(0.2)
    workers = {s.read_status()["pid"] for s in runs if s.read_status()["state"] == "running"}
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)  # ends once every process holding its stderr (workers too) has
    assert proc.returncode == (130 if sig != signal.SIGKILL else -signal.SIGKILL), err
    assert "leaked semaphore" not in err and "Traceback" not in err, err
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "the workers outlived the launcher"
        time.sleep(0.2)
    states = sorted(s.read_status()["state"] for s in runs)
    assert "done" not in states, states  # stopped where they were, not run to their end
    queued = [s for s in runs if not (s.run_dir / "starts.txt").exists()]
    assert len(queued) == 1 and queued[0].read_status()["state"] == "pending"  # the queued run never started


# -- bad input ------------------------------------------------------------------------------------------------

def test_a_prompt_file_that_is_not_utf8_is_an_error_when_the_spec_is_expanded(tmp_path, capsys):
    # Bug caught: found only once each run had started in its worker (every run marked failed).
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("a red circle\nun carr\u00e9 bleu\n".encode("latin-1"))
    path = tmp_path / "latin.yaml"
    path.write_text(textwrap.dedent(three_runs_spec("latin")).replace("prompts_per_iter: 2",
                                                                      f"prompts_per_iter: 2\n  train_prompts: {prompts}"))
    assert cli(["expand", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err, "expand")
    assert f"train_prompts: {prompts}: not UTF-8 text" in line
    assert cli(["run", str(path), "--results", str(tmp_path / "results"), "--quiet"]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err and not (tmp_path / "results").exists()
    # UTF-8 prompts expand (prompts of the shapes grammar: a prompt outside it is refused at expand too)
    prompts.write_text("a red circle\na blue square\n")
    assert cli(["expand", str(path)]) == 0


def test_an_empty_status_json_is_reported_once_saying_what_it_means(spec_path, tmp_path, capsys):
    # Bug caught: "unreadable status.json" four times for one `solbench status`, not saying what happens.
    assert cli(run_args(spec_path, tmp_path, "--no-report")) == 0
    victim = stores(load_spec(spec_path), tmp_path / "results")[0]
    (victim.run_dir / "status.json").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "solbench", "status", str(spec_path), "--results",
                           str(tmp_path / "results")], capture_output=True, text=True, env=solbench_env())
    assert proc.returncode == 0
    said = [line for line in proc.stderr.splitlines() if "status.json" in line]
    assert said == [f"{victim.run_dir / 'status.json'} is empty: the run reads as new, and `solbench run` launches "
                    "it again (from its last checkpoint, if it has one)"]


def test_a_bad_workers_value_names_the_flag(spec_path, tmp_path, capsys):
    # Bug caught: `--workers abc` was reported as "SOLBENCH_WORKERS='abc'", a variable nobody set.
    with pytest.raises(SystemExit) as exit_:
        cli(run_args(spec_path, tmp_path, "--workers", "abc"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "solbench run: error: argument --workers: 'abc'" in err and "SOLBENCH_WORKERS" not in err
    assert not (tmp_path / "results").exists()
