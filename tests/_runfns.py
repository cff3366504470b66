"""Small run functions for the launcher tests, importable by name inside Slurm jobs.

They follow the trainer's contract (``fn(cfg, store, progress=None) -> dict``): resume from
``store.latest_checkpoint()`` after ``store.truncate_after``, write a step's rows before its
checkpoint, and draw their "training" numbers from a generator whose state is checkpointed, so an
interrupted and resumed run must produce exactly the rows of an uninterrupted one.

Knobs come from the environment (Slurm jobs inherit the submitter's): SOLBENCH_TEST_STEP_S, seconds
slept per step (default 0).
"""

from __future__ import annotations

import os
import time

import torch

from solbench.config import RunConfig
from solbench.results import RunStore

# The launcher tests' spec: three tiny DiffusionNFT runs of 4 iterations (run with the functions below).
THREE_RUNS_SPEC = """
name: {name}
launch: local
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 4
  eval: {every: 2, prompts: shapes/eval, n_prompts: 2, seeds_per_prompt: 1, rewards: [shapes_geneval]}
matrix:
  method: [diffusion_nft]
  seed: [0, 1, 2]
  group_size: [2]
"""


def three_runs_spec(name: str) -> str:
    """THREE_RUNS_SPEC under experiment name ``name``."""
    return THREE_RUNS_SPEC.replace("{name}", name)


def counting_run(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    step_s = float(os.environ.get("SOLBENCH_TEST_STEP_S", "0"))
    resumed = store.latest_checkpoint()
    if resumed is None:
        start, generator = 1, torch.Generator().manual_seed(cfg.seed)
        store.truncate_after(-1)  # a restart from nothing must not keep rows of an earlier attempt
        store.append("metrics", [{"step": 0, "split": "eval", "metric": "reward", "value": 0.0,
                                  "images_seen": 0, "wall_s": 0.0}])
    else:
        last, state = resumed
        store.truncate_after(last)
        start, generator = last + 1, torch.Generator()
        generator.set_state(state["rng"])
    with open(store.run_dir / "starts.txt", "a") as handle:  # evidence of each (re)start, for the tests
        handle.write(f"{start}\n")
    for step in range(start, cfg.iterations + 1):
        if progress is not None:
            progress(store.run_id, step, "rollout", {})
        time.sleep(step_s)
        value = float(torch.rand((), generator=generator))
        store.append("metrics", [{"step": step, "split": "train", "metric": "reward", "value": value,
                                  "images_seen": 4 * step, "wall_s": step * step_s}])
        store.append("timings", [{"step": step, "phase": "rollout", "precision": "full", "seconds": step_s,
                                  "n_images": 4, "flops": None}])
        if progress is not None:
            progress(store.run_id, step, "train", {"reward": value})
        store.save_checkpoint(step, {"rng": generator.get_state()})
    return {"steps": cfg.iterations}


def rendezvous_run(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    """counting_run that first waits until a second run of the experiment has started beside it
    (a file per started run in ``<experiment>/.rendezvous/``). Runs executed one after another
    never meet: the first one fails after 60 s. Tests of side-by-side execution use it instead of
    timing assumptions (how long a worker takes to import torch varies by seconds under load)."""
    folder = store.run_dir.parent / ".rendezvous"
    folder.mkdir(exist_ok=True)
    (folder / store.run_id).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("no second run started beside this one within 60 s")
        time.sleep(0.05)
    return counting_run(cfg, store, progress)


def crash_on_seed_1(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    """Like counting_run, but the run with seed 1 crashes after writing its first row."""
    if cfg.seed == 1:
        store.append("metrics", [{"step": 0, "split": "eval", "metric": "reward", "value": 0.0,
                                  "images_seen": 0, "wall_s": 0.0}])
        raise ValueError("boom: seed 1 always crashes")
    return counting_run(cfg, store, progress)


def curve_value(cfg: RunConfig, step: int) -> float:
    """The eval reward ``eval_curve_run`` writes at ``step``: a straight line from 0 to its quality,
    quality = n/16 + k/100 + seed/1000 (method axes a method lacks count as 0)."""
    mc = cfg.method_config
    quality = mc.get("n", 0) / 16 + mc.get("k", 0) / 100 + cfg.seed / 1000
    return quality * step / cfg.iterations


def eval_curve_run(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    """A run with a known eval curve for sweep tests: eval rows of ``shapes_geneval`` (``curve_value``)
    at step 0, every ``cfg.eval.every`` steps and at the end, ``wall_s`` = 1 s per step (recorded, not
    slept), a checkpoint per step; resumes from its checkpoint. SOLBENCH_TEST_STEP_S: real seconds
    slept per step; SOLBENCH_TEST_INTERRUPT_AT=s: a first attempt raises KeyboardInterrupt after the
    checkpoint of step s (as Ctrl-C would), a resumed one does not."""
    step_s = float(os.environ.get("SOLBENCH_TEST_STEP_S", "0"))
    interrupt_at = int(os.environ.get("SOLBENCH_TEST_INTERRUPT_AT", "-1"))
    resumed = store.latest_checkpoint()
    start = 1 if resumed is None else resumed[0] + 1
    store.truncate_after(start - 1)

    def evaluate(step: int) -> None:
        value = curve_value(cfg, step)
        store.append("metrics", [{"step": step, "split": "eval", "metric": "shapes_geneval", "value": value,
                                  "images_seen": 4 * step, "wall_s": float(step)}])
        if progress is not None:
            progress(store.run_id, step, "eval", {"shapes_geneval": value})

    with open(store.run_dir / "starts.txt", "a") as handle:
        handle.write(f"{start}\n")
    if resumed is None:
        evaluate(0)
    for step in range(start, cfg.iterations + 1):
        time.sleep(step_s)
        store.append("metrics", [{"step": step, "split": "train", "metric": "loss", "value": 1.0 / step,
                                  "images_seen": 4 * step, "wall_s": float(step)}])
        if progress is not None:
            progress(store.run_id, step, "train", {})
        if step % cfg.eval.every == 0 or step == cfg.iterations:
            evaluate(step)
        store.save_checkpoint(step, {"step": step})
        if step == interrupt_at and resumed is None:
            raise KeyboardInterrupt
    return {"steps": cfg.iterations}


SAMPLE_PROMPTS = 8


def sample_value(cfg: RunConfig, prompt: int) -> float:
    """eval_samples_run's final score of one eval prompt: n / 16 + prompt effect + a residual (sd 0.05) seeded by
    (n, k, run seed, prompt): cells that differ only in k have the same expected score."""
    n, k = int(cfg.method_config.get("n", 4)), int(cfg.method_config.get("k", 2))
    residual = torch.Generator().manual_seed(1000 * n + 100 * k + 10 * cfg.seed + prompt)
    return n / 16 + 0.2 * (prompt - SAMPLE_PROMPTS / 2) / SAMPLE_PROMPTS + 0.05 * float(torch.randn(1, generator=residual))


def eval_samples_run(cfg: RunConfig, store: RunStore, progress=None) -> dict:
    """A run for the sweep's per-cell intervals and reward-vs-time objective: at step 0 and at the end, eval rows of
    ``shapes_geneval`` and one eval_sample row per eval prompt (``sample_value``; step 0: the same minus 0.5),
    and per training step timings with FLOP counts: explore n x 1e9 FLOPs at explore precision, train 1e9."""
    store.truncate_after(-1)
    for step in (0, cfg.iterations):
        values = [sample_value(cfg, p) - (0.5 if step == 0 else 0.0) for p in range(SAMPLE_PROMPTS)]
        store.append("metrics", [{"step": step, "split": "eval_sample", "metric": "shapes_geneval", "value": v,
                                  "images_seen": 0, "wall_s": float(step), "prompt_id": f"eval-{p:04d}", "eval_seed": 0}
                                 for p, v in enumerate(values)]
                     + [{"step": step, "split": "eval", "metric": "shapes_geneval", "value": sum(values) / len(values),
                         "images_seen": 0, "wall_s": float(step)}])
        if step == 0:
            for s in range(1, cfg.iterations + 1):
                n = int(cfg.method_config.get("n", 4))
                store.append("timings", [
                    {"step": s, "phase": "explore", "precision": "explore", "seconds": 0.1, "n_images": n,
                     "flops": n * 1e9, "load": 0.0},
                    {"step": s, "phase": "train", "precision": "full", "seconds": 0.1, "n_images": 2, "flops": 1e9,
                     "load": 0.0}])
    return {"steps": cfg.iterations}
