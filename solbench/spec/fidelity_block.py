"""Checks of a spec's ``fidelity:`` block (``FidelityBlock``) against the spec's runs and the registries.

The block runs after training (solbench.fidelity.experiment.run_spec_block), so everything it names is checked when the
spec is expanded: the checkpoint's method, the explore recipes and rewards, and that the explore stage is the
short one (``explore_steps`` <= ``steps``). Errors name the file, the line and the key.
"""

from __future__ import annotations

import difflib

from solbench.errors import ConfigError
from solbench.spec.models import FidelityBlock
from solbench.spec.registries import Registries
from solbench.spec.yaml_lines import _dotted, _nearest_line

#: The recipe name that explores in full precision (solbench.fidelity.experiment.NO_QUANT: the step-budget-only control).
NO_QUANT = "none"


def check_fidelity_block(block: FidelityBlock | None, runs: list, source: str, lines: dict[tuple, int],
                         registries: Registries) -> None:
    """ConfigError for a fidelity block that could not run. ``runs``: the spec's runs (PlannedRun); every checkpoint
    entry names one of their methods or 'base', and a checkpoint mapping's arm, seeds and steps must be on disk once
    they are done (solbench.spec.fidelity_plan.entry_problem, which the block's runner plans with)."""
    if block is None:
        return
    from solbench.spec.fidelity_plan import entries, entry_method, entry_problem

    def fail(loc: tuple, message: str) -> None:
        line = _nearest_line(lines, ("fidelity", *loc))
        raise ConfigError(f"{source}:{line}: {_dotted(('fidelity', *loc))}: {message}" if line else
                          f"{source}: {_dotted(('fidelity', *loc))}: {message}")

    if block.explore_steps > block.steps:
        fail(("explore_steps",), f"{block.explore_steps} exceeds steps ({block.steps}): the explore stage is the "
                                 "short one; lower explore_steps or raise steps")
    recipes = None if registries.recipes is None else [*registries.recipes, NO_QUANT]
    for index, entry in enumerate(entries(block)):
        loc = ("checkpoint", index) if isinstance(block.checkpoint, list) else ("checkpoint",)
        # its method first (a string entry is just that), then a mapping's arm, seeds and steps
        problem = entry_problem(entry_method(entry), runs) or (None if isinstance(entry, str) else
                                                                entry_problem(entry, runs))
        if problem:
            fail(loc, problem)
        if not isinstance(entry, str):
            _check_names(lambda key, message: fail((*loc, *key), message), "recipes", entry.recipes, recipes,
                         "quantization recipe")
    _check_names(fail, "recipes", block.recipes, recipes, "quantization recipe")
    _check_names(fail, "rewards", block.rewards, registries.rewards, "reward")


def _check_names(fail, key: str, given: list[str], known: list[str] | None, what: str) -> None:
    if known is None:
        return
    for index, name in enumerate(given):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            fail((key, index), f"unknown {what} {name!r}{hint}; allowed: {', '.join(sorted(known))}")
