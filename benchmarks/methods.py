"""Benchmark every method on the embedded world: seconds per iteration by phase, reward after a budget.

For each method the harness trains the tiny model with the same prompts and seeds, iterating until
a fixed wall-clock budget of training (evaluation excluded) is spent, then evaluates the EMA
weights on the held-out prompts. It prints one markdown table:

- seconds per iteration in each phase (median over iterations): explore, select, regenerate,
  rollout (single-stage sampling), reward, train, sync; "rollout total" = every phase before
  training, "e2e" = the whole iteration;
- the eval reward before training and after the budget, and iterations done;

followed by Sol-RL's rollout and end-to-end speedups over naive BF16 scaling (the paper's Table 5,
measured here). The defaults scale the paper's N=96, K=24 (24-in-96) down to N=24, K=6 at the same
4:1 ratio, with G = K for the single-stage baselines (the paper's 24-in-24 DiffusionNFT).

Run from the repository root (CPU, a few minutes with the defaults)::

    .venv/bin/python benchmarks/methods.py --budget-s 60 --out results/bench_methods
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from solbench.config import EvalConfig, FinetuneConfig, ModelConfig, RunConfig, SamplingConfig
from solbench.method import method_names
from solbench.results import RunStore
from solbench.train.trainer import Trainer

PHASES = ("explore", "select", "regenerate", "rollout", "reward", "train", "sync")
ROLLOUT_PHASES = ("explore", "select", "regenerate", "rollout", "reward")


def method_config(method: str, n: int, k: int, explore_steps: int) -> dict:
    if method == "sol_rl":
        return {"n": n, "k": k, "explore_steps": explore_steps}
    if method in ("naive_fp4", "naive_scaling"):
        return {"n": n, "k": k}
    if method == "awm":
        return {"group_size": k, "train_timesteps": 3}
    return {"group_size": k}


def run_config(args, method: str) -> RunConfig:
    return RunConfig(
        experiment="bench_methods", method=method,
        method_config=method_config(method, args.n, args.k, args.explore_steps),
        model=ModelConfig(name="tiny", path="random" if args.random_weights else None),
        rewards={args.reward: 1.0}, prompts_per_iter=args.prompts, iterations=10**6, seed=args.seed,
        finetune=FinetuneConfig(lr=args.lr),
        sampling=SamplingConfig(steps=args.steps, eval_steps=args.steps),
        eval=EvalConfig(prompts="shapes/heldout", n_prompts=args.eval_prompts, seeds_per_prompt=2,
                        rewards=[args.reward], grid_prompts=4),
        device="cpu")


def bench_method(args, method: str) -> dict:
    cfg = run_config(args, method)
    store = RunStore(Path(args.out) / method, cfg.run_id)
    store.truncate_after(-1)
    trainer = Trainer(cfg, store)
    before = trainer.evaluate()[args.reward]
    while trainer.wall_s < args.budget_s:
        trainer.step += 1
        trainer.train_iteration()
    after = trainer.evaluate()[args.reward]
    per_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in store.read("timings"):
        if row["phase"] in PHASES and row["step"] >= 1:
            per_step[row["step"]][row["phase"]] += row["seconds"]
    steps = sorted(per_step)[1:] or sorted(per_step)  # the first iteration carries one-off warm-up
    median = {phase: statistics.median(per_step[s].get(phase, 0.0) for s in steps) for phase in PHASES}
    median["rollout total"] = statistics.median(sum(per_step[s].get(p, 0.0) for p in ROLLOUT_PHASES) for s in steps)
    median["e2e"] = statistics.median(sum(per_step[s].values()) for s in steps)
    return {"method": method, "iterations": trainer.step, "reward_before": before, "reward_after": after, **median}


def markdown(results: list[dict], args) -> str:
    cols = list(PHASES) + ["rollout total", "e2e"]
    lines = [f"Embedded world, N={args.n}, K={args.k} (G=K), {args.prompts} prompts/iter, {args.steps} steps "
             f"(Sol-RL explores with {args.explore_steps}), budget {args.budget_s:.0f} s of training, "
             f"reward {args.reward} on {args.eval_prompts} held-out prompts x 2 seeds.", "",
             "| method | " + " | ".join(cols) + " | iters | reward before | reward after |",
             "|---" * (len(cols) + 4) + "|"]
    for r in results:
        cells = [f"{r[c]:.2f}" for c in cols]
        lines.append(f"| {r['method']} | " + " | ".join(cells)
                     + f" | {r['iterations']} | {r['reward_before']:.3f} | {r['reward_after']:.3f} |")
    by_name = {r["method"]: r for r in results}
    if "sol_rl" in by_name and "naive_scaling" in by_name:
        sol, naive = by_name["sol_rl"], by_name["naive_scaling"]
        lines += ["", f"Sol-RL vs naive_scaling: rollout {naive['rollout total']:.2f} s -> {sol['rollout total']:.2f} s "
                      f"({naive['rollout total'] / sol['rollout total']:.2f}x), end-to-end {naive['e2e']:.2f} s -> "
                      f"{sol['e2e']:.2f} s ({naive['e2e'] / sol['e2e']:.2f}x)"]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="*", default=None, help="methods to run (default: all registered)")
    parser.add_argument("--n", type=int, default=24, help="candidates per prompt for sol_rl / naive_*")
    parser.add_argument("--k", type=int, default=6, help="trained samples per prompt (and G of the other methods)")
    parser.add_argument("--explore-steps", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=2, help="prompt groups per iteration")
    parser.add_argument("--budget-s", type=float, default=60.0, help="training wall-clock budget per method")
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--reward", default="shapes_geneval")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-weights", action="store_true", help="untrained tiny model (smoke test)")
    parser.add_argument("--out", default="results/bench_methods")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = []
    for method in args.methods or method_names():
        start = time.perf_counter()
        results.append(bench_method(args, method))
        print(f"{method}: {results[-1]['iterations']} iterations in {time.perf_counter() - start:.0f} s", flush=True)
    table = markdown(results, args)
    print(table)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "table.md").write_text(table + "\n")
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
