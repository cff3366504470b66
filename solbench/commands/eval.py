"""`solbench eval`: score a model on a prompt set with any rewards, one table row per skill.

Every prompt is sampled with seeds 0..N-1 of the noise stream "eval" (the fixed evaluation seeds
a training run uses too), and every reward is reported as the mean over prompts x seeds, per skill
and overall. ``--json`` also writes the numbers for scripts.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from solbench.commands.sample import add_model_arguments, build_engine, parse_seeds
from solbench.errors import ConfigError

HELP = "score a model on a prompt set with rewards; prints a table per skill"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-set", default="shapes/eval", help="prompt set name or .txt/.jsonl file")
    parser.add_argument("--n-prompts", type=int, default=None, help="first N prompts only (default all)")
    parser.add_argument("--rewards", default="shapes_geneval_strict,shapes_geneval",
                        help="comma-separated reward names (default shapes_geneval_strict,shapes_geneval)")
    parser.add_argument("--seeds", default="2",
                        help="a count N (seeds 0..N-1), or a range 0-7 / list 0,3,5 (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="images per sampling call (default 64)")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    add_model_arguments(parser)


def _seeds(text: str) -> list[int]:
    text = text.strip()
    return list(range(int(text))) if text.isdigit() else parse_seeds(text)


def evaluate(engine, spec, role, records, reward_names, seeds, batch):
    """Mean of each reward per skill and overall: {skill: {"n": int, reward: mean}}."""
    from solbench.rewards import RewardSet

    rewards = RewardSet({name: 1.0 for name in reward_names}, device=engine.device)
    jobs = [(r, s) for r in records for s in seeds]
    parts: dict[str, list[torch.Tensor]] = defaultdict(list)
    for start in range(0, len(jobs), batch):
        chunk = jobs[start: start + batch]
        rollout = engine.sample([r.id for r, _ in chunk], [r.text for r, _ in chunk], [s for _, s in chunk],
                                net=role, sampler=spec, phase="eval", stream="eval")
        with engine.phase("reward", precision=rollout.precision, n_images=len(chunk)):
            _, scores = rewards(rollout.images, rollout.prompts)
        for name in reward_names:
            parts[name].append(scores[name])
    scores = {name: torch.cat(parts[name]) for name in reward_names}
    skills = [r.skill or "all" for r, _ in jobs]
    table: dict[str, dict[str, float]] = {}
    for skill in sorted(set(skills)) + ["overall"]:
        mask = torch.tensor([skill == "overall" or s == skill for s in skills])
        table[skill] = {"n": int(mask.sum())} | {name: scores[name][mask].mean().item() for name in reward_names}
    return table


def print_table(table, reward_names, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Table(title=title)
    out.add_column("skill")
    out.add_column("images", justify="right")
    for name in reward_names:
        out.add_column(name, justify="right")
    for skill, row in table.items():
        style = "bold" if skill == "overall" else None
        out.add_row(skill, str(row["n"]), *(f"{row[name]:.4f}" for name in reward_names), style=style)
    Console(width=max(100, 24 + 24 * len(reward_names))).print(out)


def main(args) -> int:
    from solbench.world.prompts import load_prompt_set

    reward_names = [n.strip() for n in args.rewards.split(",") if n.strip()]
    if not reward_names:
        raise ConfigError("--rewards: name at least one reward")
    records = load_prompt_set(args.prompt_set)[: args.n_prompts]
    if not records:
        raise ConfigError(f"--prompt-set {args.prompt_set}: no prompts")
    seeds = _seeds(args.seeds)
    engine, spec, role = build_engine(args)
    table = evaluate(engine, spec, role, records, reward_names, seeds, args.batch)
    rows = engine.timer.drain()
    seconds = sum(r.seconds for r in rows if r.phase == "eval")
    title = (f"{args.model} on {args.prompt_set}: {len(records)} prompts x {len(seeds)} seeds, "
             f"{spec.kind} {spec.steps} steps, precision {args.precision}")
    print_table(table, reward_names, title)
    n_images = table["overall"]["n"]
    print(f"sampling: {seconds:.2f} s, {n_images / max(seconds, 1e-9):.1f} images/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "prompt_set": args.prompt_set, "seeds": seeds,
                                         "sampler": spec.kind, "steps": spec.steps,
                                         "precision": args.precision, "table": table}, indent=2) + "\n")
    return 0
