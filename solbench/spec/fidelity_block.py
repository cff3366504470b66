"""Checks of a spec's ``fidelity:`` block (``FidelityBlock``) against the spec's runs and the registries.

The block runs after training (solbench.fidelity.run_spec_block), so everything it names is checked when the
spec is expanded: the checkpoint's method, the explore recipes and rewards, and that the explore stage is the
short one (``explore_steps`` <= ``steps``). Errors name the file, the line and the key.
"""

from __future__ import annotations

import difflib

from solbench.errors import ConfigError
from solbench.spec.models import FidelityBlock
from solbench.spec.registries import Registries
from solbench.spec.yaml_lines import _dotted, _nearest_line

#: The recipe name that explores in full precision (solbench.fidelity.NO_QUANT: the step-budget-only control).
NO_QUANT = "none"


def check_fidelity_block(block: FidelityBlock | None, methods: list[str], source: str, lines: dict[tuple, int],
                         registries: Registries, runs: list | None = None) -> None:
    """ConfigError for a fidelity block that could not run; ``methods``: the methods of the spec's runs; ``runs``
    (PlannedRun): with them, a checkpoint mapping's arm, seeds and steps are checked too (a step the run will not
    keep on disk, solbench.fidelity_plan.entry_problem)."""
    if block is None:
        return

    def fail(loc: tuple, message: str) -> None:
        line = _nearest_line(lines, ("fidelity", *loc))
        raise ConfigError(f"{source}:{line}: {_dotted(('fidelity', *loc))}: {message}" if line else
                          f"{source}: {_dotted(('fidelity', *loc))}: {message}")

    if block.explore_steps > block.steps:
        fail(("explore_steps",), f"{block.explore_steps} exceeds steps ({block.steps}): the explore stage is the "
                                 "short one; lower explore_steps or raise steps")
    checkpoints = list(block.checkpoint) if isinstance(block.checkpoint, list) else [block.checkpoint]
    for index, entry in enumerate(checkpoints):
        which = entry if isinstance(entry, str) else entry.method  # a mapping (FidelityCheckpoint) names its method
        loc = ("checkpoint", index) if isinstance(block.checkpoint, list) else ("checkpoint",)
        if which != "base" and not any(_same_method(which, method) for method in methods):
            fail(loc, f"{which!r} is no method of the spec's runs ({', '.join(sorted(set(methods)))}) nor 'base'")
        if not isinstance(entry, str) and runs is not None:
            from solbench.fidelity_plan import entry_problem

            problem = entry_problem(entry, runs)
            if problem:
                fail(loc, problem)
        if not isinstance(entry, str):
            _check_names(lambda key, message: fail((*loc, *key), message), "recipes", entry.recipes,
                         None if registries.recipes is None else [*registries.recipes, NO_QUANT], "quantization recipe")
    _check_names(fail, "recipes", block.recipes, None if registries.recipes is None else
                 [*registries.recipes, NO_QUANT], "quantization recipe")
    _check_names(fail, "rewards", block.rewards, registries.rewards, "reward")


def _check_names(fail, key: str, given: list[str], known: list[str] | None, what: str) -> None:
    if known is None:
        return
    for index, name in enumerate(given):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            fail((key, index), f"unknown {what} {name!r}{hint}; allowed: {', '.join(sorted(known))}")


def _same_method(a: str, b: str) -> bool:
    """Whether two spellings name one method, as the fidelity block's runner matches them (report.tables)."""
    try:
        from solbench.report.tables import same_method
    except ImportError:  # the report part is absent: exact names only
        return a == b
    return same_method(a, b)
