"""Run functions for the sweep's cell tests (tests/test_sweep_seeds.py, tests/test_sweep_resume.py): every number
they write is known in advance.

``seeded_cell_run``: eval reward of a run at step s = (cell_base(n, k) + SEED_EFFECT[seed % 3]) * s / iterations, at
step 0, every ``eval.every`` steps and at the end, with one ``eval_sample`` row per eval prompt around it (a prompt
effect, mean zero); its train rows' ``wall_s`` grow by ``iteration_seconds(n, k)`` a step (recorded, not slept), so
the measured seconds per iteration are known too. A checkpoint per step; resumes from its checkpoint. Knobs from
the environment (Slurm jobs and local workers inherit them): SOLBENCH_TEST_STEP_S, real seconds slept a step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from solbench.config import RunConfig
from solbench.results import RunStore

SEED_EFFECT = (-0.3, 0.15, 0.15)  # seeds 0, 1, 2: mean zero, seed 0 alone far below its cell's mean
PROMPTS = 4
PROMPT_EFFECT = (-0.03, -0.01, 0.01, 0.03)


def cell_base(n: int, k: int) -> float:
    return n / 16 + k / 100


def iteration_seconds(n: int, k: int) -> float:
    return 0.5 + n / 8 + k / 4


def run_value(cfg: RunConfig, step: int) -> float:
    n, k = int(cfg.method_config["n"]), int(cfg.method_config["k"])
    return (cell_base(n, k) + SEED_EFFECT[cfg.seed % 3]) * step / cfg.iterations


def seeded_cell_run(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    step_s = float(os.environ.get("SOLBENCH_TEST_STEP_S", "0"))
    n, k = int(cfg.method_config["n"]), int(cfg.method_config["k"])
    per_iter = iteration_seconds(n, k)
    resumed = store.latest_checkpoint()
    start = 1 if resumed is None else resumed[0] + 1
    store.truncate_after(start - 1)
    with open(store.run_dir / "starts.txt", "a") as handle:
        handle.write(f"{start}\n")

    def evaluate(step: int) -> None:
        value = run_value(cfg, step)
        store.append("metrics", [{"step": step, "split": "eval_sample", "metric": "shapes_geneval",
                                  "value": value + PROMPT_EFFECT[p], "images_seen": 0, "wall_s": step * per_iter,
                                  "prompt_id": f"eval-{p:04d}", "eval_seed": 0} for p in range(PROMPTS)]
                     + [{"step": step, "split": "eval", "metric": "shapes_geneval", "value": value,
                         "images_seen": 0, "wall_s": step * per_iter}])
        if progress is not None:
            progress(store.run_id, step, "eval", {"shapes_geneval": value})

    if resumed is None:
        evaluate(0)
    for step in range(start, cfg.iterations + 1):
        time.sleep(step_s)
        store.append("metrics", [{"step": step, "split": "train", "metric": "loss", "value": 1.0 / step,
                                  "images_seen": 4 * step, "wall_s": step * per_iter}])
        if progress is not None:
            progress(store.run_id, step, "train", {})
        if step % cfg.eval.every == 0 or step == cfg.iterations:
            evaluate(step)
        store.save_checkpoint(step, {"step": step})
    return {"steps": cfg.iterations}


# The cell tests' spec: Sol-RL runs of 4 iterations evaluated every 2 on 4 prompts, the sweep block given by each test.
SPEC = """
name: NAME
launch: LAUNCH
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 4
  eval: {every: 2, prompts: shapes/eval, n_prompts: 4, seeds_per_prompt: 1, rewards: [shapes_geneval]}
matrix:
  method: [sol_rl]
  seed: [0]
sweep:
  SWEEP
"""


def write_spec(path: Path, sweep: str, launch: str = "local") -> Path:
    """Write the cell tests' spec named after ``path`` with the sweep block ``sweep``; returns ``path``."""
    import textwrap

    block = textwrap.indent(textwrap.dedent(sweep).strip(), "  ").lstrip()
    path.write_text(textwrap.dedent(SPEC).replace("NAME", path.stem).replace("LAUNCH", launch).replace("SWEEP", block))
    return path


def run_dirs(results: Path, name: str) -> list[Path]:
    """The run folders of experiment ``name``."""
    root = results / name
    return [p for p in root.iterdir() if (p / "spec.json").exists()] if root.exists() else []


def sweep_child(spec_path: Path, results: Path, *, workers: int | None = None, step_s: float = 0.25,
                poll_s: float = 0.2):
    """A `Sweep` of ``spec_path`` running ``seeded_cell_run`` in a child process (for the tests that kill it)."""
    import subprocess
    import sys

    tests = str(Path(__file__).resolve().parent)
    code = (f"import sys; sys.path.insert(0, {tests!r})\n"
            "from solbench.spec import load_spec\nfrom solbench.sweep import Sweep\n"
            f"Sweep(load_spec({str(spec_path)!r}), {str(results)!r}, run_fn='_sweep_runfns:seeded_cell_run', "
            f"sys_path=[{tests!r}], poll_s={poll_s}, workers={workers!r}).run()\n")
    env = {**os.environ, "SOLBENCH_TEST_STEP_S": str(step_s)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=Path(tests).parent, env=env)
