"""``load_spec``: read a spec file, check it against the schema and expand it into its runs.

Before the schema: NaN and inf anywhere are errors. After it: the ``report:`` options are checked by the
report's ReportOptions (when the report part is importable), then the resolver (solbench/spec/resolver.py)
expands the matrix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from solbench.errors import ConfigError
from solbench.spec.models import SpecModel, _format_validation_error
from solbench.spec.plan import ExperimentSpec
from solbench.spec.registries import Registries, _optional_registry
from solbench.spec.resolver import MAX_RUNS, _Resolver
from solbench.spec.yaml_lines import _dotted, _nearest_line, load_yaml


def load_spec(path: str | Path, *, registries: Registries | None = None, max_runs: int = MAX_RUNS,
              progress: Callable[[int, int, float], None] | None = None) -> ExperimentSpec:
    """Read, validate and expand a spec file. Raises ConfigError on any problem.

    ``max_runs``: the combinations the matrix may form (``MAX_RUNS``; `--max-runs` lifts it on purpose);
    ``progress(resolved, total, seconds)`` is called every few seconds of an expansion that takes longer."""
    path = Path(path)
    data, lines = load_yaml(path)
    _check_finite(data, (), str(path), lines)
    try:
        model = SpecModel.model_validate_json(json.dumps(data, default=_yaml_scalar_to_json), strict=True)
    except ValidationError as err:
        raise _format_validation_error(err, str(path), lines, SpecModel) from None
    _check_report_options(model.report, path, lines)
    resolver = _Resolver(model, str(path), lines, registries or Registries.discover(), max_runs=max_runs,
                         progress=progress)
    return resolver.expand(path)


def _check_finite(value: Any, loc: tuple, source: str, lines: dict[tuple, int]) -> None:
    """NaN and inf are valid YAML floats (.nan, .inf) but no valid setting: a NaN learning rate
    would only fail at the optimizer, far from the spec."""
    if isinstance(value, float) and not math.isfinite(value):
        line = _nearest_line(lines, loc)
        raise ConfigError(f"{source}:{line}: {_dotted(loc)}: {value} is not a finite number" if line else
                          f"{source}: {_dotted(loc)}: {value} is not a finite number")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _check_finite(item, loc + (key,), source, lines)


def _check_report_options(report: dict[str, Any], path: Path, lines: dict[tuple, int]) -> None:
    if not report:
        return
    options = _optional_registry("solbench.report.tables", lambda m: ["ReportOptions"] if m.ReportOptions else [])
    if not options:
        return
    from solbench.report.tables import ReportOptions

    line = lines.get(("report",))
    try:
        ReportOptions.from_mapping(report, where=f"{path}:{line}: report" if line else f"{path}: report")
    except TypeError as err:
        raise ConfigError(f"{path}:{line}: report: {err}") from None


def _yaml_scalar_to_json(value: Any) -> Any:
    # YAML dates/timestamps have no place in a spec; let the schema reject them by type.
    return str(value)
