"""Optuna sweeps over a spec's axes: ``solbench sweep SPEC``.

A spec with a ``sweep:`` block (validated by solbench.spec, ``SweepModel``) names the axes to search
and how to score a trial::

    matrix:                       # every axis not swept has exactly one value here
      method: [sol_rl]
      seed: [0]
      explore_steps: [2]
    sweep:
      trials: 6                   # trials the study should hold (not counting invalid combinations)
      parallel: 2                 # trials in flight at once on Slurm (locally: one after another)
      sampler: tpe                # tpe | random | grid (grid needs choices or stepped ranges)
      storage: sqlite             # results/<experiment>/sweep/optuna.db (journal: optuna.journal)
      objective: {kind: final_reward, metric: shapes_geneval}
      pruner: {kind: median, n_startup_trials: 2}
      params:
        n: {choices: [4, 8]}
        k: {low: 2, high: 4, step: 2}

Each trial is an ordinary run: its sampled values and the matrix's fixed values resolve through
``ExperimentSpec.resolve`` into a RunConfig, whose hash is the run id, so the run lives in
``results/<experiment>/<run_id>/`` like any other and a run that is already done is reused without
training again. A combination the spec rejects (K > N, batch arithmetic, an ``exclude`` entry) is
recorded as a FAIL trial with ``invalid`` set and does not count towards ``trials``.

Dispatch goes through solbench.launch: with a local profile a trial runs in this process
(``execute_run``), one after another; with a Slurm profile up to ``parallel`` trials run as submitit
jobs (``launch_slurm``). While a run trains, the sweep reads the evaluation rows of its
metrics.jsonl (the objective's metric) and reports them as intermediate values at the training
step, so Optuna pruners (median, hyperband) can stop it: a pruned local run is stopped at the
evaluation that decided it, a pruned Slurm job is cancelled; either way its status.json says
``failed`` with ``pruned: true`` and it keeps its checkpoints, so the same run, proposed again,
resumes rather than restarts.

Objectives (``sweep.objective.kind``), computed from the run's curve of ``metric`` on ``split``
(rows by training step, with their cumulative training ``wall_s``):

- ``final_reward``: the value at the last evaluated step (maximised);
- ``reward_at_budget``: the curve linearly interpolated at ``wall_s = budget_s``; a run whose
  training ended before the budget keeps its final value (maximised);
- ``time_to_target``: ``wall_s`` of the first evaluation reaching ``target``, ``inf`` if none did
  (minimised). Its intermediate value is the gap ``target - reward`` (lower is better).
- ``reward_and_time``: two objectives, the final value (maximised) and the run's PROJECTED GPU seconds per
  training iteration on ``hardware`` at ``mfu`` (minimised): a multi-objective study whose Pareto front the
  report draws (solbench/sweep_pareto.py). Not pruned.

Persistence: the study lives in ``results/<experiment>/sweep/`` (SQLite ``optuna.db`` or an Optuna
journal file ``optuna.journal``; prefer the journal on network filesystems), named ``sweep.study``
(default: the spec name). Running ``solbench sweep`` again continues it: finished trials stay,
trials left running by an interrupted sweep are taken up again (their Slurm jobs watched, or their
runs relaunched, resuming from checkpoints), and new trials are asked until the study holds
``trials`` of them. One sweep process per study at a time (``sweep/.session/.lock``). After every finished
trial ``sweep/trials.parquet`` is rewritten (number, state, value, ``params_<name>``, run_id, ...),
which the report's N x K heat map reads (solbench/report/sweep_io.py).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.config import RunConfig
from solbench.errors import ConfigError, SolbenchError
from solbench.launch import (DEFAULT_RUN_FN, LOCK_FILE, RunTask, execute_run, launch_slurm, prepare_run, preflight,
                             read_launch, run_fn_ref, run_lock, run_states)
from solbench.results import RunStore, atomic_write_bytes

log = logging.getLogger(__name__)

SWEEP_DIR = "sweep"
STORAGE_FILES = {"sqlite": "optuna.db", "journal": "optuna.journal"}
TRIALS_FILE = "trials.parquet"
SESSION_DIR = ".session"  # holds the lock of the one sweep process working on the study
STUDY_ATTR = "solbench_sweep"  # study user attribute: the search space and objective it was created with
MAX_RELAUNCHES = 2  # an interrupted run (job cancelled or killed outside the sweep) is relaunched this often
MAX_CONSECUTIVE_INVALID = 50  # asks in a row that the spec rejects before the search space is called unusable

KINDS = ("final_reward", "reward_at_budget", "time_to_target", "reward_and_time")


class ObjectiveError(SolbenchError):
    """A run's metrics do not give the objective (the metric is missing, nothing evaluated yet)."""


# ----------------------------------------------------------------------------------------------
# Objectives: pure functions of a run's metrics rows
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CurvePoint:
    """One evaluation of the objective's metric: training step, value and cumulative training time."""

    step: int
    value: float
    wall_s: float


def metric_curve(rows: Iterable[Mapping[str, Any]], metric: str, split: str = "eval") -> list[CurvePoint]:
    """The curve of ``metric`` on ``split`` from metrics-table rows, one point per step, by step.

    A step written twice keeps its last row; rows without a finite numeric value are skipped.
    """
    by_step: dict[int, CurvePoint] = {}
    for row in rows:
        if row.get("split") != split or row.get("metric") != metric:
            continue
        try:
            value = float(row["value"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        wall = row.get("wall_s")
        by_step[int(row["step"])] = CurvePoint(int(row["step"]), value, float(wall) if wall is not None else 0.0)
    return [by_step[step] for step in sorted(by_step)]


def final_reward(curve: Sequence[CurvePoint]) -> float:
    """The value at the last evaluated step."""
    if not curve:
        raise ObjectiveError("no evaluation rows")
    return curve[-1].value


def reward_at_budget(curve: Sequence[CurvePoint], budget_s: float) -> float:
    """The curve linearly interpolated at ``wall_s = budget_s``.

    Before the first evaluation the first value holds; after the last one (training ended before
    the budget) the last value holds.
    """
    if not curve:
        raise ObjectiveError("no evaluation rows")
    if budget_s <= curve[0].wall_s:
        return curve[0].value
    for before, after in zip(curve, curve[1:]):
        if before.wall_s <= budget_s <= after.wall_s:
            span = after.wall_s - before.wall_s
            if span <= 0:
                return after.value
            return before.value + (budget_s - before.wall_s) / span * (after.value - before.value)
    return curve[-1].value


def time_to_target(curve: Sequence[CurvePoint], target: float) -> float:
    """``wall_s`` of the first evaluation whose value reaches ``target``; ``inf`` when none does."""
    if not curve:
        raise ObjectiveError("no evaluation rows")
    for point in curve:
        if point.value >= target:
            return point.wall_s
    return math.inf


@dataclass(frozen=True)
class Objective:
    """What a trial scores (see the module docstring), from a spec's ``sweep.objective``."""

    kind: str = "final_reward"
    metric: str = "shapes_geneval"
    split: str = "eval"
    budget_s: float | None = None
    target: float | None = None
    hardware: str = "B200"  # reward_and_time: the projected clock's hardware profile and utilisation
    mfu: float = 0.4

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"sweep.objective.kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "reward_at_budget" and not (self.budget_s and self.budget_s > 0):
            raise ConfigError("sweep.objective: kind reward_at_budget needs budget_s (seconds of training, > 0)")
        if self.kind == "time_to_target" and self.target is None:
            raise ConfigError("sweep.objective: kind time_to_target needs target (the reward to reach)")

    @classmethod
    def from_model(cls, model: Any, where: str = "") -> "Objective":
        try:
            return cls(kind=model.kind, metric=model.metric, split=model.split, budget_s=model.budget_s,
                       target=model.target, hardware=model.hardware, mfu=model.mfu)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}" if where else str(err)) from None

    @property
    def direction(self) -> str:
        return "minimize" if self.kind == "time_to_target" else "maximize"

    @property
    def multi(self) -> bool:
        """Two objectives (reward_and_time): no single value, no pruning."""
        from solbench.sweep_pareto import KIND

        return self.kind == KIND

    @property
    def directions(self) -> list[str]:
        from solbench.sweep_pareto import DIRECTIONS

        return list(DIRECTIONS) if self.multi else [self.direction]

    def values(self, rows: Iterable[Mapping[str, Any]], timing_rows: Iterable[Mapping[str, Any]] = (),
               config: RunConfig | None = None) -> list[float]:
        """The objective values of a finished run (one, or [reward, projected s/iteration] when ``multi``)."""
        if not self.multi:
            return [self.value(rows)]
        from solbench.sweep_pareto import reward_and_time

        return reward_and_time(self, rows, timing_rows, config)

    def curve(self, rows: Iterable[Mapping[str, Any]]) -> list[CurvePoint]:
        return metric_curve(rows, self.metric, self.split)

    def value(self, rows: Iterable[Mapping[str, Any]]) -> float:
        """The objective of a finished run from its metrics rows; ObjectiveError if it has none."""
        curve = self.curve(rows)
        if not curve:
            raise ObjectiveError(f"the run has no {self.split} rows of metric {self.metric!r}")
        if self.kind == "final_reward":
            return final_reward(curve)
        if self.kind == "reward_at_budget":
            return reward_at_budget(curve, float(self.budget_s))
        return time_to_target(curve, float(self.target))

    def intermediate(self, point: CurvePoint) -> float:
        """The value reported to the pruner for one evaluation (same direction as the objective)."""
        if self.kind == "time_to_target":
            return float(self.target) - point.value
        return point.value

    def describe(self) -> str:
        name = f"{self.split}/{self.metric}"
        if self.kind == "reward_at_budget":
            return f"{name} at {self.budget_s:g} s of training (maximize)"
        if self.kind == "time_to_target":
            return f"training seconds until {name} >= {self.target:g} (minimize)"
        if self.multi:
            return (f"final {name} (maximize) and PROJECTED {self.hardware} seconds per iteration at {self.mfu:.0%} "
                    "(minimize): Pareto front")
        return f"final {name} (maximize)"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.multi:  # studies recorded before reward_and_time existed keep matching their objective
            data.pop("hardware")
            data.pop("mfu")
        return data


# ----------------------------------------------------------------------------------------------
# Search space: the sweep's params over the matrix's fixed values
# ----------------------------------------------------------------------------------------------

@dataclass
class SearchSpace:
    """Optuna distributions of the swept keys, the fixed matrix values and the spec's excludes."""

    distributions: dict[str, Any]  # name -> optuna BaseDistribution
    fixed: dict[str, Any]  # matrix keys with one value
    exclude: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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
                raise ConfigError(f"sweep.sampler grid: sweep.params.{name} is a continuous or log range; give "
                                  "choices, or low/high with a step and log: false")
        return grid

    def describe(self) -> dict[str, Any]:
        from optuna.distributions import distribution_to_json

        return {name: json.loads(distribution_to_json(dist)) for name, dist in self.distributions.items()}


def search_space(spec) -> SearchSpace:
    """The search space of a spec's ``sweep:`` block; ConfigError naming the file and line on problems."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from solbench.spec import load_yaml

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
    return SearchSpace(distributions, fixed, exclude, notes)


# ----------------------------------------------------------------------------------------------
# Study, storage and the trials table
# ----------------------------------------------------------------------------------------------

def sweep_dir(spec, results_root: str | Path) -> Path:
    return Path(results_root) / spec.name / SWEEP_DIR


def storage_path(spec, results_root: str | Path) -> Path:
    return sweep_dir(spec, results_root) / STORAGE_FILES[spec.sweep.storage]


def study_name(spec) -> str:
    return spec.sweep.study or spec.name


def _storage(path: Path):
    if path.suffix == ".db":
        return f"sqlite:///{path.resolve()}"
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def _grid_sampler(grid: dict[str, list[Any]], seed: int):
    """A GridSampler that never calls ``study.stop()`` (which only works inside ``study.optimize``);
    the sweep loop stops asking once every grid point was tried instead."""
    from optuna.samplers import GridSampler

    class AskTellGridSampler(GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGridSampler(grid, seed=seed)


def make_sampler(kind: str, space: SearchSpace, seed: int):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return _grid_sampler(space.grid(), seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(model: Any):
    import optuna

    if model.kind == "none":
        return optuna.pruners.NopPruner()
    if model.kind == "hyperband":  # resources are training steps; the budget is learned from the first trials
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=model.n_startup_trials, n_warmup_steps=model.n_warmup_steps)


def open_study(spec, results_root: str | Path, *, create: bool = True, space: SearchSpace | None = None,
               objective: Objective | None = None):
    """The spec's Optuna study in results/<experiment>/sweep/ (created when missing and ``create``).

    A study created with another search space or objective is refused (Optuna cannot mix them):
    name a new ``sweep.study`` instead.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = storage_path(spec, results_root)
    name = study_name(spec)
    if not create and not path.exists():
        raise SolbenchError(f"no sweep study at {path} (run `solbench sweep {spec.path}` first)")
    path.parent.mkdir(parents=True, exist_ok=True)
    space = space or search_space(spec)
    objective = objective or Objective.from_model(spec.sweep.objective, f"{spec.path}: sweep.objective")
    try:
        if create:
            study = optuna.create_study(storage=_storage(path), study_name=name, directions=objective.directions,
                                        load_if_exists=True, pruner=make_pruner(spec.sweep.pruner))
        else:
            study = optuna.load_study(study_name=name, storage=_storage(path), pruner=make_pruner(spec.sweep.pruner))
    except KeyError:
        raise SolbenchError(f"{path} holds no study {name!r}") from None
    except Exception as err:  # noqa: BLE001 - optuna raises storage-specific errors
        if isinstance(err, SolbenchError):
            raise
        raise SolbenchError(f"{path}: cannot open the Optuna study {name!r}: {type(err).__name__}: {err}") from err
    wanted = {"objective": objective.to_dict(), "params": space.describe()}
    recorded = study.user_attrs.get(STUDY_ATTR)
    if recorded is None:
        if create:
            study.set_user_attr(STUDY_ATTR, wanted)
    else:
        changed = [part for part in ("objective", "params") if recorded.get(part) != wanted[part]]
        if changed:
            raise ConfigError(
                f"{spec.path}: sweep.{changed[0]} differs from the one study {name!r} in {path} was created with "
                f"({json.dumps(recorded.get(changed[0]), sort_keys=True)} there, "
                f"{json.dumps(wanted[changed[0]], sort_keys=True)} now); Optuna cannot mix them in one study: "
                "set sweep.study to a new name (or remove the study file)")
    return study


def counted(trial) -> bool:
    """Whether a trial counts towards ``sweep.trials`` (finished, and not an invalid combination)."""
    return trial.state.is_finished() and not trial.user_attrs.get("invalid")


def trials_frame(study, param_names: Sequence[str] = ()):
    """One row per trial: number, state, value, params_<name>, run_id, reason, steps, timing."""
    import pandas as pd

    multi = len(study.directions) > 1
    direction = ",".join("minimize" if d.name == "MINIMIZE" else "maximize" for d in study.directions)
    front = {t.number for t in study.best_trials} if multi else set()
    rows = []
    names = list(dict.fromkeys([*param_names, *(p for t in study.trials for p in t.params)]))
    for trial in study.get_trials(deepcopy=False):
        values = trial.values or []
        row: dict[str, Any] = {"number": trial.number, "state": trial.state.name,
                               "value": values[0] if values else math.nan}
        if multi:  # reward_and_time: the second value and Optuna's Pareto front
            row.update(value_time=values[1] if len(values) > 1 else math.nan, pareto=trial.number in front)
        for name in names:
            row[f"params_{name}"] = trial.params.get(name)
        attrs = trial.user_attrs
        steps = sorted(trial.intermediate_values)
        row.update(run_id=attrs.get("run_id"), reason=attrs.get("reason"), invalid=bool(attrs.get("invalid", False)),
                   last_step=steps[-1] if steps else None, direction=direction,
                   datetime_start=trial.datetime_start, datetime_complete=trial.datetime_complete,
                   duration=(trial.datetime_complete - trial.datetime_start).total_seconds()
                   if trial.datetime_complete and trial.datetime_start else None)
        rows.append(row)
    metric = (study.user_attrs.get(STUDY_ATTR) or {}).get("objective", {}).get("metric")
    for row in rows:
        row["metric"] = metric  # the objective's metric: the report's per-cell intervals read its eval samples
    columns = ["number", "state", "value", *(["value_time", "pareto"] if multi else []),
               *(f"params_{n}" for n in names), "run_id", "reason", "invalid",
               "last_step", "direction", "metric", "datetime_start", "datetime_complete", "duration"]
    frame = pd.DataFrame(rows, columns=columns)
    for name in names:  # choices of one type become a typed column; mixed ones stay objects -> strings
        column = frame[f"params_{name}"]
        kinds = {type(v) for v in column if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            frame[f"params_{name}"] = column.map(lambda v: None if v is None else str(v))
    return frame


def export_trials(study, path: Path, param_names: Sequence[str] = ()) -> Path:
    """Write the trials table as parquet (atomically) for the report; returns the path."""
    buffer = io.BytesIO()
    trials_frame(study, param_names).to_parquet(buffer, index=False)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


# ----------------------------------------------------------------------------------------------
# The sweep loop
# ----------------------------------------------------------------------------------------------

class _StopRun(BaseException):
    """Raised from the progress listener to stop a pruned in-process run.

    A BaseException so that execute_run does not record it as a crash; the sweep records the prune.
    """


@dataclass
class _Flight:
    """A run being trained for one or more trials (trials with the same params share their run)."""

    config: RunConfig
    run_dir: Path
    trials: list[Any]  # optuna.Trial, the first decides pruning
    reported: dict[int, set[int]] = field(default_factory=dict)  # trial number -> steps reported
    metrics_size: int = -1
    launched: bool = False
    relaunches: int = 0
    job_id: str | None = None
    stopping: bool = False  # pruned; waiting for the job to be gone to record it
    pruned_at: int | None = None

    @property
    def run_id(self) -> str:
        return self.config.run_id

    @property
    def store(self) -> RunStore:
        return RunStore(self.run_dir, self.run_id)


@dataclass
class SweepResult:
    """What a ``Sweep.run`` did and where the study is."""

    study: Any  # optuna.Study
    storage: Path
    trials_path: Path
    target: int
    finished_now: list[int] = field(default_factory=list)  # trial numbers finished by this invocation
    notes: list[str] = field(default_factory=list)

    @property
    def best(self):
        """The best COMPLETE trial, or None."""
        complete = [t for t in self.study.trials if t.state.name == "COMPLETE" and t.values]
        if not complete or len(self.study.directions) > 1:
            return None
        return self.study.best_trial


class Sweep:
    """An Optuna study over a spec's axes whose trials are runs (see the module docstring).

    ``run_fn`` executes one run (default: the trainer; tests pass a module-level function), and
    ``sys_path`` entries are prepended inside Slurm jobs so they can import it. ``echo`` receives one
    line per trial event.
    """

    def __init__(self, spec, results_root: str | Path = "results", *, profile_name: str | None = None,
                 run_fn: str | Callable = DEFAULT_RUN_FN, sys_path: Sequence[str] = (), poll_s: float = 5.0,
                 echo: Callable[[str], None] | None = None):
        from solbench.spec import load_profile

        if spec.sweep is None:
            raise ConfigError(f"{spec.path}: no sweep: block to run (see experiments/README.md, 'Sweeps')")
        self.spec = spec
        self.results_root = Path(results_root)
        self.space = search_space(spec)
        self.objective = Objective.from_model(spec.sweep.objective, f"{spec.path}: sweep.objective")
        self.profile_path, self.profile = load_profile(profile_name or spec.launch, spec.path)
        self.run_fn = run_fn_ref(run_fn)
        self.sys_path = list(sys_path)
        self.poll_s = poll_s
        self.echo = echo or (lambda line: None)
        self.dir = sweep_dir(spec, self.results_root)
        self.notes = list(self.space.notes)
        self.parallel = spec.sweep.parallel
        if self.profile.executor == "local" and self.parallel > 1:
            self.notes.append(f"profile {self.profile_path} runs in this process: trials run one at a time "
                              f"(sweep.parallel={self.parallel} applies on Slurm)")
            self.parallel = 1
        self.study = None
        self._flights: dict[str, _Flight] = {}  # run_id -> flight
        self._stopping: dict[str, _Flight] = {}
        self._finished_now: list[int] = []

    # -- entry point --------------------------------------------------------------------------

    def run(self, trials: int | None = None) -> SweepResult:
        """Run (or continue) the study until it holds ``trials`` counted trials (default: the spec's)."""
        target = int(trials if trials is not None else self.spec.sweep.trials)
        if target < 0:
            raise ConfigError(f"--trials must be >= 0, got {target}")
        self.dir.mkdir(parents=True, exist_ok=True)
        with run_lock(self.dir / SESSION_DIR, wait_s=0) as acquired:
            if not acquired:
                holder = (self.dir / SESSION_DIR / LOCK_FILE).read_text().strip()
                raise SolbenchError(f"another `solbench sweep` runs study {study_name(self.spec)!r} of "
                                    f"{self.spec.name} (host pid: {holder}); wait for it or stop it first")
            self.study = open_study(self.spec, self.results_root, space=self.space, objective=self.objective)
            self.study.sampler = make_sampler(self.spec.sweep.sampler, self.space,
                                              self.spec.sweep.sampler_seed + len(self.study.trials))
            try:
                self._adopt_orphans()
                self._loop(target)
                self._wait_for_stopping(timeout_s=max(30.0, 6 * self.poll_s))
            finally:
                self.export()
        return SweepResult(self.study, storage_path(self.spec, self.results_root), self.dir / TRIALS_FILE, target,
                           self._finished_now, self.notes)

    def export(self) -> Path | None:
        if self.study is None:
            return None
        return export_trials(self.study, self.dir / TRIALS_FILE, self.space.names)

    # -- the loop -----------------------------------------------------------------------------

    def _in_flight(self) -> int:
        return sum(len(f.trials) for f in self._flights.values())

    def _wanted(self, target: int) -> bool:
        """Whether another trial should be asked: the study is short of ``target`` and the grid is not used up."""
        done = sum(1 for t in self.study.get_trials(deepcopy=False) if counted(t))
        return done + self._in_flight() < target and not self._grid_used_up()

    def _loop(self, target: int) -> None:
        invalid_in_row = 0
        while True:
            while self._in_flight() < self.parallel and self._wanted(target):
                flight, invalid = self._new_trial()
                if invalid:
                    invalid_in_row += 1
                    if invalid_in_row >= MAX_CONSECUTIVE_INVALID:
                        raise ConfigError(f"{self.spec.path}: sweep: the last {invalid_in_row} sampled combinations "
                                          f"were all rejected (last: {invalid}); narrow sweep.params")
                    continue
                invalid_in_row = 0
            launches = [f for f in self._flights.values() if not f.launched]
            if launches:
                self._launch(launches)  # locally: runs them here and now
            if not self._flights:
                if not self._wanted(target):
                    return
                continue  # local runs ended (or were pruned) during the launch: ask for more
            self._poll()
            if self._flights and (self.profile.executor != "local" or not launches):
                time.sleep(self.poll_s)  # Slurm jobs, or runs executed by another process

    def _grid_used_up(self) -> bool:
        if self.spec.sweep.sampler != "grid":
            return False
        size = math.prod(len(values) for values in self.space.grid().values())
        started = sum(1 for t in self.study.get_trials(deepcopy=False)
                      if "grid_id" in t.system_attrs and (t.state.is_finished() or t.state.name == "RUNNING"))
        if started >= size:
            note = f"all {size} combinations of the grid were tried"
            if note not in self.notes:
                self.notes.append(note)
            return True
        return False

    def _new_trial(self) -> tuple[_Flight | None, str | None]:
        """Ask a trial and attach it to its run; (flight or None when finished at once, invalid reason)."""
        trial = self.study.ask(self.space.distributions)
        label = _label(trial.params)
        assignment = self.space.assignment(trial.params)
        entry = self.space.excluded_by(assignment)
        try:
            if entry is not None:
                raise ConfigError(f"excluded by the spec's exclude entry {entry}")
            run = self.spec.resolve(assignment, ("sweep", "params"))
            self._check_objective_metric(run.config)
        except ConfigError as err:
            if isinstance(err, _MetricMismatch):  # a spec error: stop the sweep
                trial.set_user_attr("invalid", True)
                self._tell(trial, "FAIL", reason=str(err))
                raise
            reason = f"invalid combination: {err}"
            trial.set_user_attr("invalid", True)
            self._tell(trial, "FAIL", reason=reason)
            self.echo(f"trial {trial.number}: {label}: skipped, the spec rejects it ({err})")
            return None, str(err)
        trial.set_user_attr("run_id", run.run_id)
        flight = self._flights.get(run.run_id)
        if flight is not None:  # the same run is already training for another trial
            flight.trials.append(trial)
            flight.reported[trial.number] = set()
            self.echo(f"trial {trial.number}: {label}: run {run.run_id} (already training for trial "
                      f"{flight.trials[0].number})")
            return flight, None
        flight = _Flight(run.config, self.spec.run_dir(self.results_root, run.run_id), [trial], {trial.number: set()})
        return self._place(flight, label), None

    def _check_objective_metric(self, config: RunConfig) -> None:
        objective = self.objective
        if objective.split == "eval" and objective.metric.split("/")[0] not in config.eval.rewards:
            raise _MetricMismatch(f"{self.spec.path}: sweep.objective.metric {objective.metric!r} is not an eval "
                                  f"reward of the runs (eval.rewards: {', '.join(config.eval.rewards)})")

    def _place(self, flight: _Flight, label: str) -> _Flight | None:
        """Decide what a new or adopted flight needs: reuse a done run, watch a live one, or launch."""
        state, _ = run_states({flight.run_id: flight.run_dir})[flight.run_id]
        numbers = ", ".join(str(t.number) for t in flight.trials)
        if state == "done":
            self.echo(f"trial {numbers}: {label}: run {flight.run_id} is done: reused")
            self._finish(flight, "done")
            return None
        self._flights[flight.run_id] = flight
        if state in ("pending", "running"):
            flight.launched = True
            flight.job_id = _job_id(flight.run_dir)
            self.echo(f"trial {numbers}: {label}: run {flight.run_id} is {state} already: watching it")
        else:
            self.echo(f"trial {numbers}: {label}: run {flight.run_id}")
        return flight

    def _adopt_orphans(self) -> None:
        """Trials left RUNNING by an interrupted sweep: watch their runs again, or relaunch them."""
        import optuna

        for frozen in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            run_id = frozen.user_attrs.get("run_id")
            config = None
            if run_id:
                stored = RunStore(self.spec.run_dir(self.results_root, run_id), run_id).read_json("spec.json")
                config = RunConfig.from_dict(stored) if stored else None
            if config is None:
                self._tell(trial, "FAIL", reason="the sweep was interrupted before this trial's run was launched")
                continue
            if run_id in self._flights:
                self._flights[run_id].trials.append(trial)
                self._flights[run_id].reported[trial.number] = set(frozen.intermediate_values)
                continue
            flight = _Flight(config, self.spec.run_dir(self.results_root, run_id), [trial],
                             {trial.number: set(frozen.intermediate_values)})
            self.echo(f"trial {trial.number}: taken up again from the interrupted sweep")
            self._place(flight, _label(frozen.params))

    # -- launching ----------------------------------------------------------------------------

    def _launch(self, flights: list[_Flight]) -> None:
        from solbench.spec import PlannedRun

        runs = [PlannedRun(f.config, {}) for f in flights]
        preflight(self.spec, runs)
        if self.profile.executor == "local":
            for flight in flights:
                self._execute_here(flight)
            return
        submission = launch_slurm(self.spec, runs, self.results_root, self.profile, run_fn=self.run_fn,
                                  sys_path=self.sys_path)
        for flight in flights:
            flight.launched = True
            flight.job_id = submission.job_ids.get(flight.run_id)
            for trial in flight.trials:
                trial.set_user_attr("job_id", flight.job_id)
        self.echo(f"submitted {len(flights)} trial run(s) to Slurm: "
                  f"{', '.join(f'{f.run_id} (job {f.job_id})' for f in flights)}")

    def _execute_here(self, flight: _Flight) -> None:
        from solbench.spec import PlannedRun

        store = prepare_run(PlannedRun(flight.config, {}), flight.run_dir, force=False)
        flight.launched = True
        task = RunTask(str(store.run_dir), flight.config.to_dict(), self.run_fn, self.sys_path)

        def listener(run_id: str, step: int, phase: str, info: dict) -> None:
            if self._observe(flight):
                raise _StopRun(step)

        try:
            execute_run(task, progress=listener)
        except _StopRun:
            self._record_pruned_run(flight)

    # -- watching -----------------------------------------------------------------------------

    def _observe(self, flight: _Flight) -> bool:
        """Report new evaluation points of a flight's run; True when its trials should be pruned."""
        path = flight.store.table_path("metrics")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if size == flight.metrics_size or flight.stopping:
            return False
        flight.metrics_size = size
        if self.objective.multi:  # Optuna prunes single-objective studies only
            return False
        curve = self.objective.curve(flight.store.read("metrics"))
        new = False
        for trial in flight.trials:
            seen = flight.reported.setdefault(trial.number, set())
            for point in curve:
                if point.step not in seen:
                    trial.report(self.objective.intermediate(point), point.step)
                    seen.add(point.step)
                    new = True
        if not new or not curve or curve[-1].step >= flight.config.iterations:
            return False  # nothing new, or the final evaluation: nothing left to save by stopping
        owner = flight.trials[0]
        if owner.should_prune():
            flight.pruned_at = curve[-1].step
            self._prune(flight)
            return True
        return False

    def _prune(self, flight: _Flight) -> None:
        """Tell the study its trials are pruned and stop the run (cancel its job on Slurm)."""
        flight.stopping = True
        self._flights.pop(flight.run_id, None)
        for trial in flight.trials:
            self._tell(trial, "PRUNED", reason=f"pruned at step {flight.pruned_at}")
        self.echo(f"trial {', '.join(str(t.number) for t in flight.trials)}: pruned at step {flight.pruned_at} "
                  f"(run {flight.run_id})")
        if self.profile.executor != "local":
            job = flight.job_id or _job_id(flight.run_dir)
            if job:
                _scancel(job)
            self._stopping[flight.run_id] = flight

    def _record_pruned_run(self, flight: _Flight) -> None:
        store = flight.store
        status = store.read_status()
        store.write_status("failed", pruned=True,
                           error=f"pruned by sweep {study_name(self.spec)!r} at step {flight.pruned_at}",
                           slurm_job_id=status.get("slurm_job_id"))

    def _poll(self) -> None:
        for flight in list(self._flights.values()):
            self._observe(flight)
        self._check_stopping()
        if not self._flights:
            return
        states = run_states({f.run_id: f.run_dir for f in self._flights.values()})
        for run_id, (state, status) in states.items():
            flight = self._flights.get(run_id)
            if flight is None:
                continue
            if state in ("done", "failed"):
                self._flights.pop(run_id)
                self._finish(flight, state, status.get("error"))
            elif state in ("interrupted", "new"):
                if flight.relaunches >= MAX_RELAUNCHES:
                    self._flights.pop(run_id)
                    self._finish(flight, "failed", f"run {state} after {flight.relaunches + 1} launches (job "
                                                   "cancelled or killed outside the sweep)")
                    continue
                if flight.launched:
                    flight.relaunches += 1
                    self.echo(f"run {run_id} was {state}: launching it again (resumes from its checkpoint)")
                flight.launched = False
                self._launch([flight])

    def _check_stopping(self) -> None:
        """Record pruned Slurm runs as pruned once their cancelled job is gone (one that finished
        before the cancel landed stays done)."""
        if not self._stopping:
            return
        states = run_states({run_id: flight.run_dir for run_id, flight in self._stopping.items()})
        for run_id, (state, _) in states.items():
            if state not in ("pending", "running"):
                if state == "interrupted":
                    self._record_pruned_run(self._stopping[run_id])
                self._stopping.pop(run_id)

    def _wait_for_stopping(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._stopping and time.monotonic() < deadline:
            self._check_stopping()
            if self._stopping:
                time.sleep(min(self.poll_s, 1.0))
        for run_id in self._stopping:
            log.warning("pruned run %s still had a live job when the sweep ended", run_id)

    def _finish(self, flight: _Flight, state: str, error: str | None = None) -> None:
        """Tell the study the outcome of a flight's run: its objective, or why it has none."""
        rows = flight.store.read("metrics")
        curve = [] if self.objective.multi else self.objective.curve(rows)
        for trial in flight.trials:  # intermediate values of a reused run, so later pruning sees them
            seen = flight.reported.setdefault(trial.number, set())
            for point in curve:
                if point.step not in seen:
                    trial.report(self.objective.intermediate(point), point.step)
                    seen.add(point.step)
        numbers = ", ".join(str(t.number) for t in flight.trials)
        if state != "done":
            for trial in flight.trials:
                self._tell(trial, "FAIL", reason=f"run {flight.run_id} failed: {error or 'see its status.json'}")
            self.echo(f"trial {numbers}: run {flight.run_id} failed ({error})")
            return
        try:
            values = self.objective.values(rows, flight.store.read("timings") if self.objective.multi else (),
                                           flight.config)
        except ObjectiveError as err:
            for trial in flight.trials:
                self._tell(trial, "FAIL", reason=f"run {flight.run_id}: {err}")
            self.echo(f"trial {numbers}: no objective: {err}")
            return
        for trial in flight.trials:
            self._tell(trial, "COMPLETE", value=values if self.objective.multi else values[0])
        self.echo(f"trial {numbers}: {', '.join(f'{v:.6g}' for v in values)} (run {flight.run_id})")

    def _tell(self, trial, state: str, *, value: float | list[float] | None = None, reason: str | None = None) -> None:
        import optuna

        if reason:
            trial.set_user_attr("reason", reason)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.study.tell(trial, value if state == "COMPLETE" else None, state=optuna.trial.TrialState[state],
                            skip_if_finished=True)
        if not trial.user_attrs.get("invalid"):
            self._finished_now.append(trial.number)
        self.export()


class _MetricMismatch(ConfigError):
    """The objective's metric is not evaluated by the runs: a spec error, not an invalid combination."""


def _label(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _job_id(run_dir: Path) -> str | None:
    status = RunStore(run_dir, run_dir.name).read_status()
    job = status.get("slurm_job_id") or read_launch(run_dir).get("job_id")
    return str(job) if job else None


def _scancel(job_id: str) -> None:
    """Stop a pruned run's job now: SIGKILL to its batch script and steps (submitit ignores the SIGTERM
    of a plain scancel, which would leave the run training for KillWait seconds), then cancel it so
    Slurm records it CANCELLED. The run's files survive a kill (appends are fsynced, checkpoints
    atomic)."""
    for command in (["scancel", "--full", "--signal=KILL", job_id], ["scancel", job_id]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("%s failed: %s", " ".join(command), err)
            continue
        if out.returncode != 0 and "already completing or completed" not in out.stderr:
            log.warning("%s failed: %s", " ".join(command), out.stderr.strip())


def run_sweep(spec, results_root: str | Path = "results", *, trials: int | None = None, **kwargs: Any) -> SweepResult:
    """Run or continue ``spec``'s sweep (see ``Sweep``); returns the study and what happened."""
    return Sweep(spec, results_root, **kwargs).run(trials)
