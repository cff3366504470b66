"""solbench's stages, top (the drivers) to bottom (the leaves): which packages and modules each holds, and its job.

The rule: a module imports only modules of its own stage or of a stage below it in ``STAGES``, at module level
and inside functions alike, so the tree reads top to bottom and a lower stage never needs a higher one to load or
to be understood. A new package or top-level module is placed in a stage here before anything imports it.
tests/test_import_direction.py holds both (every module of solbench/ and methods/ in exactly one stage, no import
pointing up), and each package's ``__init__`` docstring names its stage and the stages it may import.

``holds``: names relative to the ``solbench`` package, a package standing for all its modules; ``methods`` is the
repository's methods/ folder, installed as solbench.methods; ``__init__`` is solbench/__init__.py itself.
This module is data only: it imports nothing.
"""

from __future__ import annotations

from typing import NamedTuple


class Stage(NamedTuple):
    name: str
    holds: tuple[str, ...]
    job: str


STAGES: tuple[Stage, ...] = (
    Stage("cli", ("cli", "__main__", "commands"),
          "the command line: parse a command, call the stage that does it, print its answer"),
    Stage("sweep", ("sweep",), "Optuna sweeps over a spec's axes: trials of run-seed cells, the study, its table"),
    Stage("speed", ("speed",), "a spec's speed: block: its arms timed in interleaved rounds for Table 5"),
    Stage("fidelity", ("fidelity",), "the ranking-fidelity experiment: how well the explore copy ranks candidates"),
    Stage("measure", ("measure",),
          "what a run really costs on this hardware: peak memory and seconds per phase, the paper models' facts"),
    Stage("doctor", ("doctor",), "what this machine lacks for a spec: GPUs, packages, weights, memory"),
    Stage("launch", ("launch",), "a spec's runs launched locally or on Slurm, resumed, their states read"),
    Stage("collect", ("collect",), "an experiment's run folders merged into the parquet tables a report reads"),
    Stage("spec", ("spec", "provenance"),
          "a spec file expanded into validated, resolved runs, and the provenance of each setting"),
    Stage("train", ("train",), "one run's training loop: its setup, iterations, evaluation and what it records"),
    Stage("method", ("method", "methods"), "the RL methods' maths behind one interface, and their registry"),
    Stage("engine", ("engine",), "sampling the policy at a precision: noise, samplers, rollouts, networks by role"),
    Stage("rewards", ("rewards",), "reward models by name: the embedded world's and the paper's real ones"),
    Stage("models", ("models",), "model adapters and their cards: builders, FLOPs, activations, memory, files"),
    Stage("quant", ("quant",), "low precision: formats, recipes, backends and the quantized copy of a policy"),
    Stage("world", ("world",), "the embedded shapes world: scenes, grammar, detector, prompt sets"),
    Stage("report", ("report",), "reports from stored results alone: tables, figures, findings, pages"),
    Stage("results", ("results",), "run results on disk: the run store, atomic writes, the stored facts' schema"),
    Stage("machine", ("machine",), "the machine a run is on: CPU features, threads, numerics"),
    Stage("text", ("text",), "text from outside the program, bounded, and a spec's text read without the spec code"),
    Stage("base", ("__init__", "config", "errors", "_logfilters", "stages"),
          "the resolved run config, the errors, log filters and this stage list"),
)


def stage_names() -> tuple[str, ...]:
    """The stages' names, top to bottom."""
    return tuple(stage.name for stage in STAGES)


def below(name: str) -> tuple[str, ...]:
    """The stages a module of stage ``name`` may import besides its own, top to bottom."""
    names = stage_names()
    return names[names.index(name) + 1:]
