"""scripts/gpu_measure.sh, the one command a session with a lent GPU runs, dry on this CPU.

The script lays solbench out as installed (symlinks, methods/ as solbench.methods) without pip, runs
scripts/gpu_check.py (its device checks skip here and say so) and `solbench doctor SPEC --measure`, and
copies gpu_check.json, measure.json, measure.md and its log into $OUT. Here it runs the tiny shapes of a
small FLUX spec; on the GPU the same lines run flux_main at published shapes (docs/measured/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
    name: measure_dry
    launch: local
    base:
      model: {name: flux, resolution: 512, gradient_checkpointing: true}
      rewards: {pickscore: 1.0}
      train_prompts: data/pickscore/train.txt
      prompts_per_iter: 16
      world_size: 8
      device: cuda
      micro_batch: {rollout: 4, reward: 4, train: 2}
      finetune: {lora_rank: 4, lora_alpha: 8, optimizer_steps: 1}
      quant: {recipe: nvfp4_flux, backend: te}
      sampling: {steps: 2, eval_steps: 2, guidance: 1.0}
      eval: {prompts: data/pickscore/test.txt, n_prompts: 2, seeds_per_prompt: 1, rewards: [pickscore]}
    matrix:
      method: [sol_rl]
      n: [4]
      k: [2]
      explore_steps: [1]
"""


def test_gpu_measure_script_runs_the_check_and_the_measurement_and_collects_their_files(tmp_path):
    spec = tmp_path / "measure_dry.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=sys.executable, OUT=str(out), SOLBENCH_WHEELS=str(tmp_path / "no-wheels"),
               SOLBENCH_MEASURE_ARGS="--tiny")
    proc = subprocess.run(["bash", "scripts/gpu_measure.sh", str(spec), "120"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_measure.log", "measure.json", "measure.md"]
    check = json.loads((out / "gpu_check.json").read_text())
    assert check["native_fp8"] == {"skipped": "no CUDA device"} or "skipped" in check["native_fp8"]
    assert check["environment"]["packages"]["diffusers"]
    # solbench imported from the script's installed-layout symlinks, methods/ as solbench.methods
    assert check["environment"]["solbench_methods"].startswith("/tmp/solbench_measure.")
    measured = json.loads((out / "measure.json").read_text())
    assert [m["method"] for m in measured["methods"]] == ["sol_rl"] and not measured["methods"][0]["error"]
    log = (out / "gpu_measure.log").read_text()
    assert "no wheels in" in log and "status 0" in log
