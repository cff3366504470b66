"""The search space of a sweep: the spec's ``sweep.params`` as Optuna distributions over the matrix's fixed values.

``search_space`` checks the ``sweep:`` block against the spec's YAML (errors name the file and line) and
returns a ``SearchSpace``: the distributions, the fixed matrix values and the spec's ``exclude`` entries.
Everything it can check is checked there, before a study is created (a study keeps the definition it was
created with): the ranges against the fields' bounds (solbench.spec.models.FIELD_BOUNDS), and that a grid
sampler has a finite grid. ``SearchSpace.resolved_corners`` gives the runs a sweep checks up front.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from solbench.errors import ConfigError


@dataclass
class SearchSpace:
    """Optuna distributions of the swept keys, the fixed matrix values and the spec's excludes."""

    distributions: dict[str, Any]  # name -> optuna BaseDistribution
    fixed: dict[str, Any]  # matrix keys with one value
    exclude: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    where: Any = None  # where(*key path) -> "file:line: key.path", for messages about the spec's sweep block

    @property
    def names(self) -> list[str]:
        return list(self.distributions)

    def assignment(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Matrix keys for spec.resolve: the fixed values, then the sampled ones."""
        return {**self.fixed, **{name: params[name] for name in self.distributions}}

    def excluded_by(self, assignment: Mapping[str, Any]) -> dict[str, Any] | None:
        for entry in self.exclude:
            if all(assignment.get(key) in (wanted if isinstance(wanted, list) else [wanted])
                   for key, wanted in entry.items()):
                return entry
        return None

    def corners(self, limit: int = 256) -> Iterator[dict[str, Any]]:
        """Assignments (as ``assignment`` gives them) over every choice and both ends of every range, the
        spec's exclude entries left out; at most ``limit``."""
        from optuna.distributions import CategoricalDistribution

        pools = [list(dist.choices) if isinstance(dist, CategoricalDistribution)
                 else list(dict.fromkeys((dist.low, dist.high))) for dist in self.distributions.values()]
        combos = (self.assignment(dict(zip(self.distributions, values))) for values in itertools.product(*pools))
        yield from itertools.islice((a for a in combos if self.excluded_by(a) is None), limit)

    def resolved_corners(self, spec) -> Iterator[Any]:
        """The RunConfigs of ``corners`` as a trial resolves them (``spec.resolve``), so that a sweep can check
        them before its study exists; a combination the spec rejects is left out (a trial asking it is skipped)."""
        for assignment in self.corners():
            try:
                yield spec.resolve(assignment, ("sweep", "params")).config
            except ConfigError:
                continue

    def grid(self) -> dict[str, list[Any]]:
        """Every value of every axis (for the grid sampler); ConfigError for continuous ranges."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        grid = {}
        for name, dist in self.distributions.items():
            if isinstance(dist, CategoricalDistribution):
                grid[name] = list(dist.choices)
            elif isinstance(dist, IntDistribution) and not dist.log:
                grid[name] = list(range(dist.low, dist.high + 1, dist.step))
            elif isinstance(dist, FloatDistribution) and dist.step is not None and not dist.log:
                count = int(round((dist.high - dist.low) / dist.step)) + 1
                grid[name] = [round(dist.low + i * dist.step, 12) for i in range(count)]
            else:
                at = self.where("sweep", "params", name) if self.where else f"sweep.params.{name}"
                raise ConfigError(f"{at}: a continuous or log range, which sampler grid cannot enumerate; give "
                                  "choices, or low/high with a step and log: false")
        return grid

    def describe(self) -> dict[str, Any]:
        from optuna.distributions import distribution_to_json

        return {name: json.loads(distribution_to_json(dist)) for name, dist in self.distributions.items()}


def search_space(spec) -> SearchSpace:
    """The search space of a spec's ``sweep:`` block; ConfigError naming the file and line on problems."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from solbench.spec import load_yaml
    from solbench.spec.models import bound_problem

    if spec.sweep is None:
        raise ConfigError(f"{spec.path}: no sweep: block (see experiments/README.md, 'Sweeps')")
    data, lines = load_yaml(spec.path)

    def where(*loc: Any) -> str:
        for end in range(len(loc), 0, -1):
            if tuple(loc[:end]) in lines:
                return f"{spec.path}:{lines[tuple(loc[:end])]}: {'.'.join(str(p) for p in loc)}"
        return f"{spec.path}: {'.'.join(str(p) for p in loc)}"

    distributions: dict[str, Any] = {}
    for name, param in spec.sweep.params.items():
        loc = ("sweep", "params", name)
        spec.check_key(name, loc)
        if param.choices is not None:
            if param.low is not None or param.high is not None or param.step is not None:
                raise ConfigError(f"{where(*loc)}: give choices, or low/high (and step), not both")
            if not param.choices:
                raise ConfigError(f"{where(*loc, 'choices')}: empty; give at least one value")
            for value in param.choices:
                if value is not None and not isinstance(value, (bool, int, float, str)):
                    raise ConfigError(f"{where(*loc, 'choices')}: {value!r} is a {type(value).__name__}; sweep "
                                      "choices are numbers, strings, booleans or null")
                problem = bound_problem(name, value)
                if problem:
                    raise ConfigError(f"{where(*loc, 'choices')}: {problem} ({name})")
            if len(set(map(json.dumps, param.choices))) != len(param.choices):
                raise ConfigError(f"{where(*loc, 'choices')}: duplicate values in {param.choices}")
            distributions[name] = CategoricalDistribution(param.choices)
            continue
        if param.low is None or param.high is None:
            raise ConfigError(f"{where(*loc)}: needs choices: [...] or a range low: ..., high: ...")
        if param.low > param.high:
            raise ConfigError(f"{where(*loc)}: low {param.low:g} is above high {param.high:g}")
        if param.log and param.step is not None:
            raise ConfigError(f"{where(*loc)}: a log range takes no step")
        if param.log and param.low <= 0:
            raise ConfigError(f"{where(*loc)}: a log range needs low > 0, got {param.low:g}")
        if param.step is not None and param.step <= 0:
            raise ConfigError(f"{where(*loc, 'step')}: must be > 0, got {param.step:g}")
        for end in ("low", "high"):
            problem = bound_problem(name, getattr(param, end))
            if problem:
                raise ConfigError(f"{where(*loc, end)}: {problem} ({name}'s range)")
        if param.type == "int":
            bounds = [param.low, param.high] + ([param.step] if param.step is not None else [])
            if any(not float(b).is_integer() for b in bounds):
                raise ConfigError(f"{where(*loc)}: an int range needs whole low/high/step (or type: float)")
            distributions[name] = IntDistribution(int(param.low), int(param.high), log=param.log,
                                                  step=int(param.step) if param.step is not None else 1)
        else:
            distributions[name] = FloatDistribution(float(param.low), float(param.high), log=param.log,
                                                    step=param.step)

    fixed: dict[str, Any] = {}
    for key, values in (data.get("matrix") or {}).items():
        if key in distributions:
            continue
        values = values if isinstance(values, list) else [values]
        if len(values) != 1:
            raise ConfigError(f"{where('matrix', key)}: {len(values)} values, but a sweep fixes every axis it does "
                              f"not search: keep one value, or move it to sweep.params.{key} with choices: {values}")
        fixed[key] = values[0]
    if "method" not in fixed and "method" not in distributions:
        raise ConfigError(f"{where('matrix')}: a sweep needs matrix.method (one method) or sweep.params.method")
    notes = []
    if data.get("include"):
        notes.append("include entries are not part of the sweep (it samples sweep.params over the matrix)")
    exclude = [dict(entry) for entry in data.get("exclude") or []]
    space = SearchSpace(distributions, fixed, exclude, notes, where)
    if spec.sweep.sampler == "grid":
        space.grid()  # a continuous range is an error now, not after the study exists
    return space
