"""Checks of a spec's ``speed:`` block (``SpeedBlock``) against the spec's runs, when the spec is expanded.

The block runs after training (solbench.speed.block), so what it names is checked first: every arm a method of
the spec (or a mapping whose ``set`` keys are run settings), arm names unique, the checkpoint ``base`` or a
method of the spec. Errors name the file, the line and the key.
"""

from __future__ import annotations

from solbench.errors import ConfigError
from solbench.spec.yaml_lines import _dotted, _nearest_line


def check_speed_block(block, runs: list, source: str, lines: dict[tuple, int]) -> None:
    """ConfigError for a speed block that could not run. ``runs``: the spec's runs (PlannedRun)."""
    if block is None:
        return
    from solbench.report.tables import same_method
    from solbench.spec.speed_arms import arm_config, entry_name

    def fail(loc: tuple, message: str) -> None:
        line = _nearest_line(lines, ("speed", *loc))
        where = f"{source}:{line}" if line else source
        raise ConfigError(f"{where}: {_dotted(('speed', *loc))}: {message}")

    seen: dict[str, int] = {}
    for index, entry in enumerate(block.arms):
        name = entry_name(entry)
        if name in seen:
            fail(("arms", index), f"arm {name!r} is named twice (entries {seen[name]} and {index}); name each once")
        seen[name] = index
        try:
            arm_config(runs, entry)
        except ConfigError as err:
            fail(("arms", index), str(err))
    if block.checkpoint != "base" and not any(same_method(r.config.method, block.checkpoint) for r in runs):
        methods = ", ".join(sorted({r.config.method for r in runs}))
        fail(("checkpoint",), f"{block.checkpoint!r} is no method of the spec's runs ({methods}) nor 'base'")
