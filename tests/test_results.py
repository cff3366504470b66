"""RunStore: append-only tables, torn-line handling, resume truncation, atomic JSON and checkpoints;
collect: parquet tables per experiment and the corrupt-line report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from solbench.collect import collect, flatten
from solbench.config import RunConfig
from solbench.results import RunStore, capture_env, scan_jsonl


def metric(step, value=1.0, metric="reward", split="train"):
    return {"step": step, "split": split, "metric": metric, "value": value, "images_seen": 8 * step, "wall_s": 0.5 * step}


def test_append_adds_run_id_and_reads_back_in_order(tmp_path):
    store = RunStore(tmp_path / "r1", "r1")
    store.append("metrics", [metric(0), metric(1, 2.0)])
    store.append("metrics", [metric(2, 3.0)])
    rows = store.read("metrics")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["value"] for r in rows] == [1.0, 2.0, 3.0]
    assert {r["run_id"] for r in rows} == {"r1"}
    # one JSON object per line, newline-terminated
    text = (tmp_path / "r1" / "metrics.jsonl").read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 3


def test_append_converts_tensor_and_numpy_scalars(tmp_path):
    import numpy as np

    store = RunStore(tmp_path, "r")
    store.append("candidates", [{"step": np.int64(3), "prompt_id": "p0", "cand_idx": 1, "noise_seed": 123,
                                 "precision": "explore", "reward": torch.tensor(0.25), "selected": np.bool_(True)}])
    (row,) = store.read("candidates")
    assert row["step"] == 3 and row["reward"] == 0.25 and row["selected"] is True


def test_append_rejects_missing_columns_unknown_table_and_bad_step(tmp_path):
    store = RunStore(tmp_path, "r")
    with pytest.raises(ValueError, match=r"lacks columns \['wall_s'\]"):
        store.append("metrics", [{k: v for k, v in metric(0).items() if k != "wall_s"}])
    with pytest.raises(ValueError, match="unknown results table 'logs'"):
        store.append("logs", [metric(0)])
    with pytest.raises(ValueError, match="step must be an integer"):
        store.append("metrics", [metric(1.5)])
    assert store.read("metrics") == []


def test_truncated_last_line_is_reported_skipped_and_not_glued_to_next_row(tmp_path, caplog):
    store = RunStore(tmp_path, "r")
    store.append("metrics", [metric(0), metric(1)])
    path = store.table_path("metrics")
    with open(path, "ab") as handle:  # a writer killed mid-line
        handle.write(b'{"run_id":"r","step":2,"split":"tr')
    rows = store.read("metrics")
    assert [r["step"] for r in rows] == [0, 1]
    assert "skipping corrupt line" in caplog.text
    scan = store.scan("metrics")
    assert len(scan.corrupt) == 1 and scan.corrupt[0].line_number == 3

    store.append("metrics", [metric(2)])  # the next writer must not lose this row
    scan = store.scan("metrics")
    assert [r["step"] for r in scan.rows] == [0, 1, 2]
    assert len(scan.corrupt) == 1


def test_truncate_after_drops_later_steps_so_resume_never_duplicates(tmp_path):
    store = RunStore(tmp_path, "r")
    for step in range(4):
        store.append("metrics", [metric(step)])
        store.append("timings", [{"step": step, "phase": "rollout", "precision": "full", "seconds": 0.1,
                                  "n_images": 4, "flops": None}])
    store.truncate_after(1)
    # the resumed run repeats steps 2 and 3
    for step in (2, 3):
        store.append("metrics", [metric(step)])
    assert [r["step"] for r in store.read("metrics")] == [0, 1, 2, 3]
    assert [r["step"] for r in store.read("timings")] == [0, 1]
    store.truncate_after(-1)
    assert store.read("metrics") == [] and store.read("timings") == []


def test_truncate_after_keeps_damaged_lines_but_drops_the_torn_tail_a_resume_rewrites(tmp_path):
    store = RunStore(tmp_path, "r")
    store.append("metrics", [metric(0)])
    with open(store.table_path("metrics"), "ab") as handle:
        handle.write(b'{"damaged\n')  # a whole line damaged from outside: kept so collect keeps reporting it
    store.append("metrics", [metric(1), metric(2)])
    with open(store.table_path("metrics"), "ab") as handle:
        handle.write(b'{"run_id":"r","step":3,"spl')  # the torn write of a killed writer (step 3)
    store.truncate_after(1)  # resuming from the checkpoint of step 1: steps 2 and 3 are written again
    scan = store.scan("metrics")
    assert [r["step"] for r in scan.rows] == [0, 1]
    assert [bad.text for bad in scan.corrupt] == ['{"damaged']


def test_status_transitions_and_new_state(tmp_path):
    store = RunStore(tmp_path / "run", "run")
    assert store.read_status()["state"] == "new"
    store.write_status("pending", attempt=0, submitted_at="t0")
    store.write_status("running", attempt=1, host="h")
    status = store.read_status()
    assert status["state"] == "running" and status["attempt"] == 1 and status["submitted_at"] == "t0"
    assert status["run_id"] == "run" and "updated_at" in status
    store.write_status("failed", error="ValueError: boom", traceback="Traceback ...")
    status = store.read_status()
    assert status["state"] == "failed" and status["traceback"] == "Traceback ..." and status["attempt"] == 1
    assert "host" not in status  # free-form details belong to one transition only
    with pytest.raises(ValueError, match="unknown run state 'finished'"):
        store.write_status("finished")


def test_write_json_is_atomic_and_leaves_no_temp_files(tmp_path):
    store = RunStore(tmp_path, "r")
    store.write_json("spec", {"b": 1, "a": [1, 2]})
    store.write_json("spec.json", {"b": 2})
    assert json.loads((tmp_path / "spec.json").read_text()) == {"b": 2}
    assert store.read_json("spec") == {"b": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_checkpoints_roundtrip_keep_last_two_and_skip_unreadable(tmp_path):
    store = RunStore(tmp_path, "r")
    assert store.latest_checkpoint() is None
    for step in (1, 2, 3):
        state = {"w": torch.full((2,), float(step)), "rng": torch.get_rng_state(), "step": step}
        store.save_checkpoint(step, state)
    names = sorted(p.name for p in store.checkpoint_dir.iterdir())
    assert names == ["step_00000002.pt", "step_00000003.pt"]
    step, state = store.latest_checkpoint()
    assert step == 3 and torch.equal(state["w"], torch.full((2,), 3.0))
    # a damaged newest file (e.g. disk trouble) falls back to the previous checkpoint
    (store.checkpoint_dir / "step_00000003.pt").write_bytes(b"not a checkpoint")
    step, state = store.latest_checkpoint()
    assert step == 2 and torch.equal(state["w"], torch.full((2,), 2.0))


def test_capture_env_records_code_versions_device_and_slurm(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    (repo / "f.txt").write_text("a")
    subprocess.run([*git, "-C", str(repo), "add", "f.txt"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "c"], check=True)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    env = capture_env(repo)
    assert len(env["git_sha"]) == 40 and env["git_dirty"] is False
    (repo / "f.txt").write_text("b")
    assert capture_env(repo)["git_dirty"] is True
    assert env["versions"]["torch"] == torch.__version__
    assert env["versions"]["solbench"] is not None
    assert env["device"] == "cpu" and env["slurm"]["slurm_job_id"] == "4242"


def test_capture_env_outside_git_has_no_sha(tmp_path):
    env = capture_env(tmp_path)
    assert env["git_sha"] is None and env["git_dirty"] is None


def test_flatten_nested_config():
    flat = flatten(RunConfig().to_dict())
    assert flat["model.name"] == "tiny"
    assert flat["finetune.lora_rank"] == 32
    assert json.loads(flat["finetune.lora_targets"]) == ["to_q", "to_k", "to_v", "to_out.0"]
    assert flat["rewards.shapes_geneval"] == 1.0


def _make_run(exp_dir, cfg: RunConfig, steps: int, state="done"):
    store = RunStore(exp_dir / cfg.run_id, cfg.run_id)
    store.write_json("spec.json", cfg.to_dict())
    store.write_json("env.json", {"git_sha": "abc", "git_dirty": False, "device": "cpu"})
    store.write_status(state)
    for step in range(steps):
        store.append("metrics", [metric(step, value=float(step))])
        store.append("candidates", [{"step": step, "prompt_id": f"p{i}", "cand_idx": i, "noise_seed": i,
                                     "precision": "explore", "reward": 0.1 * i, "selected": i % 2 == 0}
                                    for i in range(3)])
    return store


def test_collect_writes_parquet_tables_and_reports_corrupt_lines(tmp_path):
    exp = tmp_path / "exp"
    a = _make_run(exp, RunConfig(experiment="exp", method="sol_rl", method_config={"n": 8, "k": 4}), steps=3)
    b = _make_run(exp, RunConfig(experiment="exp", method="flow_grpo", seed=1), steps=2, state="failed")
    with open(b.table_path("metrics"), "ab") as handle:
        handle.write(b'{"run_id": "x", "step": 2, "va')

    result = collect(exp)
    assert result.runs == 2 and len(result.corrupt) == 1
    runs = pd.read_parquet(exp / "runs.parquet").set_index("run_id")
    assert runs.loc[a.run_id, "method"] == "sol_rl" and runs.loc[a.run_id, "status"] == "done"
    assert runs.loc[b.run_id, "status"] == "failed"
    assert runs.loc[a.run_id, "p_method_config.n"] == 8 and runs.loc[a.run_id, "p_model.name"] == "tiny"
    assert runs.loc[b.run_id, "p_seed"] == 1 and runs.loc[a.run_id, "git_sha"] == "abc"
    metrics = pd.read_parquet(exp / "metrics.parquet")
    assert len(metrics) == 5 and list(metrics.columns[:7]) == ["run_id", "step", "split", "metric", "value",
                                                               "images_seen", "wall_s"]
    assert sorted(metrics[metrics.run_id == a.run_id].step) == [0, 1, 2]
    candidates = pd.read_parquet(exp / "candidates.parquet")
    assert len(candidates) == 15 and candidates.selected.dtype == bool
    timings = pd.read_parquet(exp / "timings.parquet")
    assert timings.empty and "phase" in timings.columns
    report = json.loads((exp / "collect_report.json").read_text())
    assert report["runs"] == 2 and len(report["corrupt_lines"]) == 1
    assert report["corrupt_lines"][0]["path"].endswith(os.path.join(b.run_id, "metrics.jsonl"))

    # collecting again is idempotent: no duplicated rows
    collect(exp)
    assert len(pd.read_parquet(exp / "metrics.parquet")) == 5
    # restricting to a subset of runs
    collect(exp, run_ids=[a.run_id])
    assert set(pd.read_parquet(exp / "runs.parquet").run_id) == {a.run_id}


def test_scan_jsonl_rejects_non_object_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n\n{"a": 2}\n')
    scan = scan_jsonl(path)
    assert [r["a"] for r in scan.rows] == [1, 2]
    assert [c.line_number for c in scan.corrupt] == [2]


def test_append_from_a_killed_process_leaves_a_readable_table(tmp_path):
    # A real writer process SIGKILLed between appends: every completed append survives intact.
    script = (
        "import os, signal, sys\n"
        "from solbench.results import RunStore\n"
        "s = RunStore(sys.argv[1], 'r')\n"
        "for i in range(5):\n"
        "    s.append('metrics', [{'step': i, 'split': 'train', 'metric': 'm', 'value': i, 'images_seen': 0, 'wall_s': 0}])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)])
    assert proc.returncode == -9
    assert [r["step"] for r in RunStore(tmp_path, "r").read("metrics")] == [0, 1, 2, 3, 4]
