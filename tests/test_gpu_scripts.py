"""scripts/gpu_measure.sh, the one command a session with a lent GPU runs, dry on this CPU.

The script lays solbench out as installed (symlinks, methods/ as solbench.methods) without pip, runs
scripts/gpu_check.py (its device checks skip here and say so), scripts/rollout_speed.py (the rollout arms'
forward, eager here: compiling needs CUDA under model.compile auto) and `solbench doctor SPEC --measure`,
and writes gpu_check.json, rollout_speed.csv/.json, measure.json, measure.md and its log into $OUT. Here it runs the tiny shapes of
tests/test_measure.py's FLUX spec; on the GPU the same lines run flux_main at published shapes
(docs/measured/README.md).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from test_measure import SPEC

ROOT = Path(__file__).resolve().parents[1]


def _python_without_solbench(tmp_path: Path) -> tuple[str, str]:
    """A python like the GPU machine's: this interpreter's packages, but no solbench installed.

    Returns (wrapper, site): the wrapper runs this interpreter with -S (no site-packages, so no editable
    install's finder), and ``site`` holds links to every installed distribution except solbench's.
    """
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = tmp_path / "site"
    site.mkdir()
    for entry in purelib.iterdir():
        if not entry.name.lower().startswith(("solbench", "__editable__", "_solbench")):
            (site / entry.name).symlink_to(entry)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), str(site)


def test_gpu_measure_script_runs_the_check_and_the_measurement_and_collects_their_files(tmp_path):
    """Also the bug of `python -m solbench` importing the repository's solbench/ (no methods/ in it) ahead of
    the laid-out copy: the interpreter here has no solbench installed, as on the GPU machine."""
    spec = tmp_path / "measure_check.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    out = tmp_path / "out"
    python, site = _python_without_solbench(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=python, PYTHONPATH=site, OUT=str(out), SOLBENCH_WHEELS=str(tmp_path / "no-wheels"),
               SOLBENCH_MEASURE_ARGS="--tiny --methods sol_rl,naive_scaling", SOLBENCH_SPEED_ARGS="--tiny --repeats 2",
               SOLBENCH_SKIP_BLOCK="1")  # the speed block at published shapes needs a GPU (tests/test_speed_block.py)
    proc = subprocess.run(["bash", "scripts/gpu_measure.sh", str(spec), "120"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_measure.log", "measure.json", "measure.md",
                                                     "rollout_speed.csv", "rollout_speed.json"]
    check = json.loads((out / "gpu_check.json").read_text())
    assert check["native_fp8"] == {"skipped": "no CUDA device"} or "skipped" in check["native_fp8"]
    assert check["environment"]["packages"]["diffusers"]
    # solbench imported from the script's installed-layout symlinks, methods/ as solbench.methods
    assert check["environment"]["solbench_methods"].startswith("/tmp/solbench_measure.")
    measured = json.loads((out / "measure.json").read_text())
    assert [m["method"] for m in measured["methods"]] == ["sol_rl", "naive_scaling"]
    assert not any(m["error"] for m in measured["methods"])
    # the rollout arms at the spec's Sol-RL shapes (micro-batch 4), eager on this CPU; the compiled rows need CUDA
    with (out / "rollout_speed.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["arm", "precision", "compiled", "batch", "seconds_per_forward", "tflops", "compile_seconds",
                             "error"]
    # the default plan's eager arms (explore_fast has no fast accumulation to add on a CPU: skipped, saying so)
    assert [(r["arm"], r["compiled"], r["batch"]) for r in rows] == [("merged", "False", "4"), ("explore_rowwise", "False", "4"),
                                                                     ("explore", "False", "4"), ("lora", "False", "4")]
    assert all(float(r["seconds_per_forward"]) > 0 and float(r["tflops"]) > 0 and not r["error"] for r in rows)
    speed = json.loads((out / "rollout_speed.json").read_text())
    assert "compiled arms" in speed["skipped"][0] and "merged_vs_lora_eager" in speed["ratios"]
    log = (out / "gpu_measure.log").read_text()
    assert "no wheels in" in log and "status 0" in log


def test_gpu_measure_stops_at_once_when_diffusers_does_not_import(tmp_path):
    """The bug: without the carried wheels the script warned and went on, and every step then failed on
    `import diffusers` after the GPU machine had started. Now it stops before the first step, exit 4, saying why
    and how to carry the wheels."""
    python, site = _python_without_solbench(tmp_path)
    for entry in Path(site).iterdir():
        if entry.name.lower().startswith("diffusers"):
            entry.unlink()
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=python, PYTHONPATH=site, OUT=str(out), SOLBENCH_WHEELS=str(tmp_path / "no-wheels"))
    proc = subprocess.run(["bash", "scripts/gpu_measure.sh", "experiments/flux_main.yaml", "120"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "diffusers or pydantic does not import (ModuleNotFoundError: No module named 'diffusers')" in proc.stdout
    assert "fetch_gpu_wheels.sh" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_measure.log"]  # nothing ran
