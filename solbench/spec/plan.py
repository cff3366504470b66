"""An expanded spec: its planned runs (``PlannedRun``, ``ExperimentSpec``) and the table of them that
``solbench expand`` prints (``runs_table``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.config import RunConfig
from solbench.spec.models import FidelityBlock, SweepModel


@dataclass
class PlannedRun:
    """One run of an experiment: its resolved config and the matrix values that apply to it."""

    config: RunConfig
    axes: dict[str, Any]  # matrix/include keys that this run uses (dropped axes omitted)

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @property
    def method(self) -> str:
        return self.config.method


@dataclass
class ExperimentSpec:
    """A validated spec: its runs, launch profile name and optional sweep."""

    name: str
    path: Path
    description: str
    launch: str
    runs: list[PlannedRun]
    sweep: SweepModel | None
    axis_keys: list[str]  # matrix keys in spec order (the columns of `solbench expand`)
    notes: list[str] = field(default_factory=list)  # checks that could not run here, dropped duplicates
    _resolver: "_Resolver | None" = field(default=None, repr=False)
    fidelity: FidelityBlock | None = None  # the spec's `fidelity:` block (solbench.fidelity.experiment.run_spec_block)
    speed: Any = None  # the spec's `speed:` block (solbench.spec.models.SpeedBlock; solbench.speed.run_spec_block)
    # "file:line: key: prompt file ... not found" of the runs' prompt files missing here (refused by expand and run)
    missing_files: list[str] = field(default_factory=list)

    def check_files(self) -> None:
        """ConfigError naming the spec line of every prompt file its runs name that is not on this machine."""
        if self.missing_files:
            from solbench.errors import ConfigError

            raise ConfigError("\n".join(self.missing_files))

    def resolve(self, assignment: Mapping[str, Any], where: tuple = ("sweep",)) -> PlannedRun:
        """Resolve one more combination of matrix keys (used by sweeps); ``where`` is the key path
        reported in errors."""
        assert self._resolver is not None
        return self._resolver.resolve(dict(assignment), tuple(where))

    def check_key(self, key: str, loc: tuple = ()) -> str:
        """Kind of a matrix/sweep key ('method', 'path' or 'axis'); ConfigError listing the allowed keys
        otherwise. ``loc`` is the key's path in the spec file (for the line in the message)."""
        assert self._resolver is not None
        return self._resolver._key_kind(key, loc or (key,))

    def run_dir(self, results_root: str | Path, run_id: str) -> Path:
        return Path(results_root) / self.name / run_id


def runs_table(spec: ExperimentSpec) -> tuple[list[str], list[list[str]]]:
    """Columns and rows describing the runs (what `solbench expand` prints)."""
    keys = [k for k in spec.axis_keys if k != "method"]
    columns = ["run_id", "method", *keys]
    rows = []
    for run in spec.runs:
        rows.append([run.run_id, run.method, *("-" if k not in run.axes else _short(run.axes[k]) for k in keys)])
    return columns, rows


def _short(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
