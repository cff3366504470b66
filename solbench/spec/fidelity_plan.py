"""Which checkpoints a spec's ``fidelity:`` block measures (solbench.fidelity.experiment.run_spec_block runs them).

An entry of ``fidelity.checkpoint`` is ``base`` (the base model), a method of the spec (the final checkpoint of
the lowest-seed run of that method's main arm), or a mapping (``solbench.spec.models.FidelityCheckpoint``)
that picks an arm (``iterations``), run seeds (``seeds``) and checkpoint steps (``steps``), with recipes of its
own: fidelity of intermediate checkpoints and of several seeds' final policies, so that a report can put
fidelity against training iteration (solbench/report/fidelity_steps.py).

The main arm of a method is the one the report's Findings compare (solbench.report.findings_common.main_arm):
most seeds, then the explore copy (quant.recipe) most common among all the spec's runs (tiny_paper's dose arms run
Sol-RL on other copies with as many seeds as its main arm), then the most method settings at their most common
value, then the most common horizon. A run keeps
its last ``CHECKPOINTS_KEPT`` checkpoints (solbench.results.store), saved every ``checkpoint_every`` iterations
and at its last: ``kept_steps`` says which survive, and ``entry_problem`` refuses, when the spec is expanded, a
step that will not be on disk when the block runs after training.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from solbench.report.tables import same_method
from solbench.results.store import CHECKPOINTS_KEPT

BASE = "base"


@dataclass
class Planned:
    """One checkpoint to measure: ``run`` (the spec's PlannedRun; None for the base model), ``step`` (None: the
    run's final checkpoint) and the recipes (empty: the block's)."""

    run: Any
    step: int | None
    recipes: list[str]


def entries(block) -> list:
    """The block's checkpoint entries as a list (a string, a mapping, or a list of them)."""
    return list(block.checkpoint) if isinstance(block.checkpoint, list) else [block.checkpoint]


def entry_method(entry) -> str:
    return entry if isinstance(entry, str) else entry.method


def kept_steps(config) -> list[int]:
    """The checkpoint steps a run of ``config`` (a RunConfig) has on disk when it is done."""
    every, last = max(int(config.checkpoint_every), 1), int(config.iterations)
    saved = sorted(set(range(every, last + 1, every)) | {last})
    return saved[-CHECKPOINTS_KEPT:]


def arm_runs(runs: list, method: str, iterations: int | None = None) -> list:
    """The runs (PlannedRun) of ``method``'s main arm (module docstring), or of its arm with ``iterations``,
    in seed order."""
    mine = [r for r in runs if same_method(r.config.method, method)
            and (iterations is None or r.config.iterations == iterations)]
    if not mine:
        return []
    arms: dict[tuple, list] = {}
    for r in mine:
        key = (json.dumps(r.config.method_config, sort_keys=True, default=str), r.config.iterations,
               r.config.quant.recipe)
        arms.setdefault(key, []).append(r)
    copy = Counter(r.config.quant.recipe for r in runs).most_common(1)[0][0]  # the spec's explore copy
    settings = {key: json.loads(key[0]) for key in arms}
    weights = Counter()  # runs per (setting, value): the most common value is the default an ablation varies around
    for key, group in arms.items():
        for name, value in settings[key].items():
            weights[(name, json.dumps(value, sort_keys=True, default=str))] += len(group)
    modes = {}
    for (name, value), count in weights.items():
        if count > modes.get(name, (None, -1))[1]:
            modes[name] = (value, count)
    horizon = Counter({key[1]: len(group) for key, group in arms.items()}).most_common(1)[0][0]

    def rank(key):
        at_mode = sum(json.dumps(v, sort_keys=True, default=str) == modes[n][0] for n, v in settings[key].items())
        return (len({r.config.seed for r in arms[key]}), key[2] == copy, at_mode, key[1] == horizon)

    best = max(arms, key=rank)
    return sorted(arms[best], key=lambda r: (r.config.seed, r.run_id))


def entry_problem(entry, runs: list) -> str | None:
    """Why the block could not measure ``entry`` once the runs are done (None when it can)."""
    if isinstance(entry, str):
        if entry == BASE or any(same_method(r.config.method, entry) for r in runs):
            return None
        methods = ", ".join(sorted({r.config.method for r in runs}))
        return f"{entry!r} is no method of the spec's runs ({methods}) nor 'base'"
    arm = arm_runs(runs, entry.method, entry.iterations)
    if not arm:
        where = f" with iterations {entry.iterations}" if entry.iterations else ""
        return f"no run of method {entry.method!r}{where} in the spec"
    seeds = sorted({r.config.seed for r in arm})
    missing = [s for s in entry.seeds if s not in seeds]
    if missing:
        return f"seeds {missing} are not among the arm's run seeds {seeds}"
    for run in arm:
        if entry.seeds and run.config.seed not in entry.seeds:
            continue
        kept = kept_steps(run.config)
        lost = [s for s in entry.steps if s not in kept]
        if lost:
            return (f"steps {lost}: a run of this arm ({run.config.iterations} iterations, checkpoint_every "
                    f"{run.config.checkpoint_every}) keeps the checkpoints of steps {kept} only (its last "
                    f"{CHECKPOINTS_KEPT}); set checkpoint_every so that they are among them")
    return None


def plan(runs: list, block) -> list[Planned]:
    """What to measure, entry by entry, before looking at which runs are done."""
    out = []
    for entry in entries(block):
        if entry == BASE:
            out.append(Planned(None, None, []))
        elif isinstance(entry, str):
            arm = arm_runs(runs, entry)
            if arm:
                out.append(Planned(arm[0], None, []))
        else:
            arm = arm_runs(runs, entry.method, entry.iterations)
            chosen = [r for r in arm if r.config.seed in entry.seeds] if entry.seeds else arm[:1]
            for run in chosen:
                for step in entry.steps or [None]:
                    out.append(Planned(run, None if step == run.config.iterations else step, list(entry.recipes)))
    return out


def planned_count(runs: list, block) -> int:
    """How many fidelity runs the block makes once every run is done: one per checkpoint and recipe, each once
    (a method's final checkpoint named twice is one run)."""
    keys = set()
    for planned in plan(runs, block):
        where = None if planned.run is None else (planned.run.run_id, planned.step)
        keys |= {(where, recipe) for recipe in planned.recipes or list(block.recipes) or [None]}
    return len(keys)
