"""Experiment specs: YAML files that expand into validated, fully resolved RunConfigs.

A spec names an experiment and describes its runs::

    name: flux_main                  # results/<name>/, reports/<name>/
    description: ...
    launch: local                    # a profile in slurm/profiles/ (local, debug, gpu, ...) or a path
    base:                            # RunConfig fields shared by every run (nested sections merge)
      model: {name: flux}
      rewards: {imagereward: 1.0}
      iterations: 300
      eval: {every: 20, prompts: ..., rewards: [...]}
    matrix:                          # lists expand to a Cartesian product
      method: [sol_rl, diffusion_nft]
      seed: [0, 1]
      n: [48, 96]                    # a method axis: only methods declaring "n" vary over it
    include: [{method: naive_fp4, n: 96, k: 24}]   # extra combinations (missing keys range over the matrix)
    exclude: [{method: diffusion_nft, seed: 1}]    # remove matrix combinations matching every given key
    methods:                         # per-method overrides (RunConfig fields, method_config)
      diffusion_nft: {method_config: {group_size: 24}}
    sweep: {...}                     # optional Optuna study over axes (solbench.sweep)

Matrix keys are ``method``, ``model`` (short for ``model.name``), any RunConfig field (``seed``,
``prompts_per_iter``) or dotted path (``finetune.lr``, ``sampling.steps``), or a method axis: a
field of a method's Config listed in its ``axes`` (``n``, ``k``, ``explore_steps``, ``selection``,
``group_size``, ...). A method axis is dropped for methods that do not declare it, and combinations
that then coincide collapse to one run (flow_grpo does not run once per K); an axis that no listed
method declares is an error.

Precedence, lowest first: RunConfig defaults < ``base`` < ``methods.<method>`` < matrix/include values.

Everything is checked before anything runs: unknown keys, wrong types, NaN/inf numbers, unknown
methods, models, rewards, quantization recipes and prompt sets, prompts_per_iter or eval.n_prompts
larger than their prompt set, a tiny model path that is neither pretrained nor random, K > N, batch
arithmetic that does not divide. Errors are ConfigError naming the file, the line, the key path and
the allowed values. (Prompt files given as paths are checked when the run is launched if they are
not on the expanding machine.)

The run id is ``RunConfig.run_id``: a short hash of the resolved run (launch fields are not part of
RunConfig, so moving a spec from a laptop to a cluster keeps its run ids and results).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from solbench.config import RunConfig
from solbench.errors import ConfigError

_STRICT = ConfigDict(extra="forbid", strict=True)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# Set by the spec itself, never by base/methods overrides or the matrix.
_RESERVED_FIELDS = ("experiment", "method")
# Run sections that merge key by key; every other field (e.g. the rewards dict) is replaced whole.
_SECTIONS = tuple(name for name, hint in typing.get_type_hints(RunConfig).items() if dataclasses.is_dataclass(hint))


# ----------------------------------------------------------------------------------------------
# YAML loading: floats like 3e-4 stay floats, duplicate keys are errors, every key has its line.
# ----------------------------------------------------------------------------------------------

class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that reads 1e-4 as a float (YAML 1.1 wants 1.0e-4) and refuses duplicate keys."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                |[-+]?\.(?:inf|Inf|INF)
                |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _index_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ConfigError(f"{source}:{key_node.start_mark.line + 1}: {_dotted(path + (key,))}: duplicate key "
                                  f"(first at line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
            _index_lines(value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, path + (index,), lines, source)


def load_yaml(path: str | Path) -> tuple[dict, dict[tuple, int]]:
    """(data, {key path: line}) of a YAML mapping file; ConfigError on syntax errors or duplicates."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read spec {path}: {err.strerror}") from None
    try:
        node = yaml.compose(text, Loader=_SpecLoader)
        data = yaml.load(text, Loader=_SpecLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _index_lines(node, (), lines, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a spec is a YAML mapping (name, base, matrix, ...), got {type(data).__name__}")
    return data, lines


def _dotted(path: Sequence) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


# ----------------------------------------------------------------------------------------------
# Schema: pydantic models generated from the RunConfig dataclasses, so they never drift apart.
# ----------------------------------------------------------------------------------------------

def _override_model(dc: type, name: str, exclude: Sequence[str] = ()) -> type[BaseModel]:
    """A strict model where every field of dataclass ``dc`` may be given (and none has to be)."""
    hints = typing.get_type_hints(dc)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        if f.name in exclude:
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            hint = _override_model(hint, f"{name}.{f.name}")
        # The hint is kept as is (not Optional): an explicit null is checked like any other value.
        fields[f.name] = (hint, Field(default=None))
    return create_model(name, __config__=_STRICT, **fields)


RunOverrides = _override_model(RunConfig, "RunOverrides", exclude=_RESERVED_FIELDS)
_FullRun = _override_model(RunConfig, "RunConfig")


class ProfileModel(BaseModel):
    """A launch profile (slurm/profiles/<name>.yaml)."""

    model_config = _STRICT
    description: str = ""
    executor: Literal["local", "slurm"] = "local"
    # local only: runs executed at once, each in its own process on its share of the cores ("auto":
    # one per core on CPU, one on a GPU machine); SOLBENCH_WORKERS or `solbench run --workers` override
    workers: Union[Annotated[int, Field(ge=1)], Literal["auto"]] = 1
    partition: Optional[str] = None
    nodes: int = Field(default=1, ge=1)
    tasks_per_node: int = Field(default=1, ge=1)  # ranks per node for torch.distributed runs
    gpus_per_node: int = Field(default=0, ge=0)
    cpus_per_task: int = Field(default=1, ge=1)
    mem_gb: Optional[float] = Field(default=None, gt=0)
    timeout_min: int = Field(default=60, ge=1)
    array_parallelism: int = Field(default=8, ge=1)
    max_requeues: int = Field(default=3, ge=0)  # timeouts/preemptions a run may resume from
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    setup: list[str] = Field(default_factory=list)  # shell lines run before each job (module load ...)
    slurm_additional_parameters: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)  # environment variables for the jobs
    snapshot_code: bool = True  # Slurm jobs import a copy of the code made at submission (results/<exp>/.code/)


class SweepParam(BaseModel):
    """One swept axis: either ``choices`` or an int/float range ``low``..``high`` (``step``, ``log``)."""

    model_config = _STRICT
    choices: Optional[list[Any]] = None
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[float] = None
    log: bool = False
    type: Literal["int", "float"] = "int"


class SweepObjective(BaseModel):
    """What a trial scores: the final eval reward, the reward reached at a wall-clock budget, the
    training time needed to reach a target reward (minimised), or the final reward and the PROJECTED GPU
    seconds per iteration together (reward_and_time: a Pareto front, solbench/sweep/pareto.py)."""

    model_config = _STRICT
    kind: Literal["final_reward", "reward_at_budget", "time_to_target", "reward_and_time"] = "final_reward"
    metric: str = "shapes_geneval"  # a metric of the metrics table
    split: str = "eval"
    budget_s: Optional[float] = Field(default=None, gt=0)  # for reward_at_budget (training wall_s)
    target: Optional[float] = None  # for time_to_target
    hardware: str = "B200"  # reward_and_time: PROJECTED GPU seconds per iteration on this profile (B200 | H100)
    mfu: float = Field(default=0.4, gt=0, le=1)  # ... at this utilisation


class SweepPruner(BaseModel):
    model_config = _STRICT
    kind: Literal["median", "hyperband", "none"] = "median"
    n_startup_trials: int = Field(default=2, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)


class SweepModel(BaseModel):
    model_config = _STRICT
    study: Optional[str] = None  # default: the spec name
    storage: Literal["sqlite", "journal"] = "sqlite"  # file under results/<experiment>/
    trials: int = Field(default=8, ge=1)
    parallel: int = Field(default=1, ge=1)  # trials in flight at once (Slurm jobs or local workers)
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    sampler_seed: int = 0
    objective: SweepObjective = Field(default_factory=SweepObjective)
    pruner: SweepPruner = Field(default_factory=SweepPruner)
    params: dict[str, SweepParam]


class FidelityBlock(BaseModel):
    """A spec's ``fidelity:`` block: the unbiased all-seeds ranking fidelity `solbench run` measures after
    training (solbench.fidelity.run_spec_block), one fidelity run per explore recipe, results under the
    spec's experiment folder."""

    model_config = _STRICT
    # a method of the spec (its lowest-seed main run's final checkpoint) or "base"; a list measures each
    # (e.g. [sol_rl, base]: fidelity at the end and at the start of training)
    checkpoint: Union[str, list[str]] = "sol_rl"
    role: Literal["policy", "ema", "old"] = "policy"
    n_prompts: int = Field(default=8, ge=1)  # M: the first M eval prompts of the run
    seeds: int = Field(default=8, ge=3)  # N seeds per prompt, each at both precisions (3+: report.fidelity.MIN_PAIRS)
    recipes: list[str] = Field(default_factory=list)  # default: the run's recipe; "none" = step budget only
    explore_steps: int = Field(default=6, ge=1)
    steps: int = Field(default=10, ge=1)
    prompts: Optional[str] = None  # default: the run's eval prompts
    rewards: list[str] = Field(default_factory=list)  # default: the run's training rewards
    batch_seeds: Optional[int] = Field(default=None, ge=1)


class SpecModel(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    launch: str = "local"
    base: RunOverrides = Field(default_factory=RunOverrides)  # type: ignore[valid-type]
    matrix: dict[str, Any] = Field(default_factory=dict)
    include: list[dict[str, Any]] = Field(default_factory=list)
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    methods: dict[str, RunOverrides] = Field(default_factory=dict)  # type: ignore[valid-type]
    sweep: Optional[SweepModel] = None
    report: dict[str, Any] = Field(default_factory=dict)  # options of solbench.report (ReportOptions)
    fidelity: Optional[FidelityBlock] = None  # all-seeds ranking fidelity measured after training

    @field_validator("matrix")
    @classmethod
    def _matrix_lists_not_empty(cls, matrix: dict[str, Any]) -> dict[str, Any]:
        for key, values in matrix.items():
            if isinstance(values, list) and not values:
                raise ValueError(f"matrix.{key} is an empty list: every axis needs at least one value")
        return matrix


# ----------------------------------------------------------------------------------------------
# Registries of other parts (validated against when they are importable)
# ----------------------------------------------------------------------------------------------

def _optional_registry(module: str, getter: Callable[[Any], Iterable[str]]) -> list[str] | None:
    """Names from another part's registry, or None while that part does not exist yet."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and (err.name == module or module.startswith(err.name + ".")):
            return None
        raise
    try:
        return sorted(getter(mod))
    except AttributeError:
        return None


@dataclass
class Registries:
    """Known names used for validation; ``None`` means "not checkable here" (the part is missing)."""

    models: list[str] | None = None
    rewards: list[str] | None = None
    recipes: list[str] | None = None
    prompt_set_exists: Callable[[str], bool] | None = None
    prompt_set_size: Callable[[str], int | None] | None = None  # prompts in a set; None: cannot be read here

    @classmethod
    def discover(cls) -> "Registries":
        size = _prompt_set_sizer()
        return cls(
            models=_optional_registry("solbench.models", lambda m: m.model_names()),
            rewards=_optional_registry("solbench.rewards", lambda m: m.names()),
            recipes=_optional_registry("solbench.quant", lambda m: list(m.RECIPES)),
            prompt_set_exists=None if size is None else (lambda name: size(name) is not None),
            prompt_set_size=size,
        )


def _prompt_set_sizer() -> Callable[[str], int | None] | None:
    loader = _optional_registry("solbench.world.prompts", lambda m: ["load_prompt_set"] if m.load_prompt_set else [])
    if not loader:
        return None
    import functools

    from solbench.world.prompts import load_prompt_set

    @functools.lru_cache(maxsize=None)  # every run of a spec names the same few sets
    def size(name: str) -> int | None:
        try:
            return len(load_prompt_set(name))
        except (ConfigError, FileNotFoundError, KeyError, ValueError):
            return None

    return size


def is_prompt_path(name: str) -> bool:
    """Prompt sets given as files (.txt/.jsonl paths) are checked at launch, not at expansion."""
    return name.endswith((".txt", ".jsonl")) or "/" in name and not name.startswith("shapes/")


# ----------------------------------------------------------------------------------------------
# Expansion
# ----------------------------------------------------------------------------------------------

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
    fidelity: FidelityBlock | None = None  # the spec's `fidelity:` block (solbench.fidelity.run_spec_block)

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


def load_spec(path: str | Path, *, registries: Registries | None = None) -> ExperimentSpec:
    """Read, validate and expand a spec file. Raises ConfigError on any problem."""
    path = Path(path)
    data, lines = load_yaml(path)
    _check_finite(data, (), str(path), lines)
    try:
        model = SpecModel.model_validate_json(json.dumps(data, default=_yaml_scalar_to_json), strict=True)
    except ValidationError as err:
        raise _format_validation_error(err, str(path), lines, SpecModel) from None
    _check_report_options(model.report, path, lines)
    resolver = _Resolver(model, str(path), lines, registries or Registries.discover())
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


def _format_validation_error(err: ValidationError, source: str, lines: dict[tuple, int],
                             root_model: type[BaseModel] | None, prefix: tuple = ()) -> ConfigError:
    messages = []
    for item in err.errors():
        loc = prefix + tuple(item["loc"])
        line = _nearest_line(lines, loc)
        where = f"{source}:{line}" if line else source
        kind = item["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(root_model, tuple(item["loc"])[:-1]) if root_model else []
            key = str(loc[-1])
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"unknown key {key!r}{hint}; allowed keys: {', '.join(allowed)}"
            path = _dotted(loc)
        else:
            msg = item["msg"]
            if kind != "missing" and "input" in item and not isinstance(item["input"], (dict, list)):
                msg += f", got {item['input']!r}"
            path = _dotted(loc)
        messages.append(f"{where}: {path}: {msg}")
    return ConfigError("\n".join(messages) if len(messages) > 1 else messages[0])


def _nearest_line(lines: dict[tuple, int], loc: tuple) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model at ``loc``; dict/list hops are skipped."""
    current: Any = model
    skip_name = False  # after a dict-valued field (methods: {name: RunOverrides}) comes a free name
    for part in loc:
        if isinstance(part, int):
            continue
        if skip_name:
            skip_name = False
            continue
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(part))
            if info is None:
                return []
            skip_name = typing.get_origin(info.annotation) is dict
            current = _unwrap_model(info.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def _deep_merge(target: dict, overrides: Mapping) -> dict:
    """Merge ``overrides`` into ``target``: sections and method_config merge per key, other values replace."""
    for key, value in overrides.items():
        if key in (*_SECTIONS, "method_config") and isinstance(value, Mapping) and isinstance(target.get(key), dict):
            target[key] = {**target[key], **value}
        else:
            target[key] = value
    return target


class _Resolver:
    """Turns matrix combinations into validated RunConfigs for one spec."""

    def __init__(self, model: SpecModel, source: str, lines: dict[tuple, int], registries: Registries):
        from solbench.method import get_method, method_names

        self.model = model
        self.source = source
        self.lines = lines
        self.registries = registries
        self.get_method = get_method
        self.method_names = method_names()
        self.notes: list[str] = []
        # Overrides as validated (so 1 and 1.0 hash alike); only the keys the user wrote.
        self.base = model.base.model_dump(exclude_unset=True)
        self.per_method = {name: ov.model_dump(exclude_unset=True) for name, ov in model.methods.items()}
        for name in self.per_method:
            self._check_method_name(name, ("methods", name))
        self.method_axes = {name: tuple(get_method(name).axes) for name in self.method_names}

    # -- helpers -------------------------------------------------------------------------------

    def _where(self, loc: tuple) -> str:
        line = _nearest_line(self.lines, loc)
        return f"{self.source}:{line}" if line else self.source

    def _error(self, loc: tuple, message: str) -> ConfigError:
        return ConfigError(f"{self._where(loc)}: {_dotted(loc)}: {message}")

    def _key_where(self, key: str, method: str, loc: tuple) -> str:
        """file:line where a run's value of ``key`` (dotted) is set: the matrix, the method's overrides
        or base, the most specific first; else the combination's own line."""
        parts = tuple(key.split("."))
        for candidate in (("matrix", key), ("methods", method, *parts), ("base", *parts)):
            if candidate in self.lines:
                return self._where(candidate)
        return self._where(loc)

    def _check_method_name(self, name: Any, loc: tuple) -> None:
        if name not in self.method_names:
            close = difflib.get_close_matches(str(name), self.method_names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self._error(loc, f"unknown method {name!r}{hint}; methods: {', '.join(self.method_names)}")

    def _key_kind(self, key: str, loc: tuple) -> str:
        """'method' | 'path' (a RunConfig field) | 'axis' (a method axis); errors otherwise."""
        if key == "method":
            return "method"
        if key in _RESERVED_FIELDS:
            raise self._error(loc, f"{key!r} is set by the spec's name, not the matrix")
        if key == "model" or _is_run_path(key):
            return "path"
        all_axes = sorted({a for axes in self.method_axes.values() for a in axes})
        if key in all_axes:
            return "axis"
        fields = sorted(f.name for f in dataclasses.fields(RunConfig) if f.name not in _RESERVED_FIELDS)
        close = difflib.get_close_matches(key, all_axes + fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        config_owners = [m for m in self.method_names
                         if key in {f.name for f in dataclasses.fields(self.get_method(m).Config)}]
        extra = (f"; {key!r} is a Config field of {', '.join(config_owners)} but not a declared axis: set it under "
                 f"methods.<name>.method_config") if config_owners else ""
        raise self._error(loc, f"unknown matrix key {key!r}{hint}{extra}. Allowed: method, model, a RunConfig field "
                               f"or dotted path ({', '.join(fields)}), or a method axis ({', '.join(all_axes)})")

    # -- expansion ------------------------------------------------------------------------------

    def expand(self, path: Path) -> ExperimentSpec:
        model = self.model
        matrix = {key: (values if isinstance(values, list) else [values]) for key, values in model.matrix.items()}
        for key in matrix:
            self._key_kind(key, ("matrix", key))
        for index, entry in enumerate(model.include):
            for key in entry:
                self._key_kind(key, ("include", index, key))
        for index, entry in enumerate(model.exclude):
            for key in entry:
                if key not in matrix:
                    raise self._error(("exclude", index, key),
                                      f"exclude key {key!r} is not a matrix key ({', '.join(matrix)})")
        if "method" not in matrix and not model.include:
            raise self._error(("matrix",), "no runs: give matrix.method (a list of methods) or include entries")
        # the method names first: every later check depends on the list of methods
        for index, method in enumerate(matrix.get("method", [])):
            self._check_method_name(method, ("matrix", "method", index))
        for index, entry in enumerate(model.include):
            methods = entry.get("method", [])
            for method in (methods if isinstance(methods, list) else [methods]):
                self._check_method_name(method, ("include", index, "method"))
        self._check_axes_used(matrix)

        combos: list[tuple[dict, tuple]] = []
        if "method" in matrix:
            keys = list(matrix)
            for values in itertools.product(*(matrix[k] for k in keys)):
                combo = dict(zip(keys, values))
                if not any(_matches(combo, entry) for entry in model.exclude):
                    combos.append((combo, ("matrix",)))
        for index, entry in enumerate(model.include):
            # keys the entry does not give range over the matrix's values
            free = [k for k in matrix if k not in entry]
            listed = {k: (v if isinstance(v, list) else [v]) for k, v in entry.items()}
            if "method" not in listed and "method" not in free:
                raise self._error(("include", index), "include entry needs a method (no matrix.method to range over)")
            keys = list(listed) + free
            pools = [listed[k] for k in listed] + [matrix[k] for k in free]
            for values in itertools.product(*pools):
                combos.append((dict(zip(keys, values)), ("include", index)))

        runs: dict[str, PlannedRun] = {}
        duplicates = 0
        for combo, loc in combos:
            run = self.resolve(combo, loc)
            if run.run_id in runs:
                duplicates += 1
                continue
            runs[run.run_id] = run
        if duplicates:
            self.notes.append(f"{duplicates} combination(s) collapsed into identical runs (axes a method does not use "
                              "are dropped)")
        if not runs:
            raise self._error(("matrix",), "the spec expands to no runs (everything excluded?)")
        axis_keys = list(matrix) + [k for entry in model.include for k in entry if k not in matrix]
        return ExperimentSpec(name=model.name, path=path, description=model.description, launch=model.launch,
                              runs=list(runs.values()), sweep=model.sweep, axis_keys=list(dict.fromkeys(axis_keys)),
                              notes=self.notes, _resolver=self, fidelity=model.fidelity)

    def _check_axes_used(self, matrix: dict[str, list]) -> None:
        """A method axis is dropped for methods that lack it; one that no listed method has would be
        dropped everywhere, silently: an error (a typo'd method list, or the wrong axis)."""
        def methods_of(values: Any) -> list:
            return [m for m in (values if isinstance(values, list) else [values]) if m in self.method_axes]

        listed = methods_of(matrix.get("method", []))
        for entry in self.model.include:
            listed += methods_of(entry.get("method", []))
        entries = [(("matrix", key), key, listed) for key in matrix]
        in_matrix = methods_of(matrix.get("method", []))  # what an include entry without a method ranges over
        entries += [(("include", i, key), key, methods_of(entry["method"]) if "method" in entry else in_matrix)
                    for i, entry in enumerate(self.model.include) for key in entry]
        for loc, key, methods in entries:
            if self._key_kind(key, loc) != "axis" or any(key in self.method_axes[m] for m in methods):
                continue
            owners = sorted(m for m, axes in self.method_axes.items() if key in axes)
            raise self._error(loc, f"no listed method ({', '.join(dict.fromkeys(methods))}) has the axis {key!r}, "
                                   f"so it would vary nothing; methods with it: {', '.join(owners)}")

    def resolve(self, combo: dict[str, Any], loc: tuple) -> PlannedRun:
        method = combo.get("method")
        self._check_method_name(method, loc + ("method",))
        label = ", ".join(f"{k}={v}" for k, v in combo.items())
        cfg = RunConfig().to_dict()
        cfg["experiment"] = self.model.name
        cfg["method"] = method
        cfg["method_config"] = {}
        _deep_merge(cfg, self.base)
        _deep_merge(cfg, self.per_method.get(method, {}))
        used: dict[str, Any] = {"method": method}
        method_axes = self.method_axes[method]
        for key, value in combo.items():
            if key == "method":
                continue
            kind = self._key_kind(key, loc + (key,))
            if kind == "axis":
                if key in method_axes:
                    cfg["method_config"][key] = value
                    used[key] = value
                continue
            _set_path(cfg, "model.name" if key == "model" else key, value)
            used[key] = value

        # Types of the merged run (matrix values included), then the method's own Config.
        try:
            checked = _FullRun.model_validate_json(json.dumps(cfg), strict=True).model_dump()
        except ValidationError as err:
            raise ConfigError(f"{self._where(loc)}: run ({label}): "
                              + str(_format_validation_error(err, "", {}, _FullRun)).lstrip(": ")) from None
        try:
            from solbench.method import validate_method_config

            method_cfg = validate_method_config(method, checked["method_config"],
                                                where=f"{self._where(loc)}: run ({label}): method_config")
        except ConfigError:
            raise
        checked["method_config"] = json.loads(json.dumps(dataclasses.asdict(method_cfg)))
        self._resolve_micro_batches(checked, loc, label)
        self._resolve_model_defaults(checked)
        config = RunConfig.from_dict(checked)
        self._check_run(config, loc, label)
        return PlannedRun(config=config, axes=used)

    def _resolve_micro_batches(self, checked: dict, loc: tuple, label: str) -> None:
        """micro_batch.{rollout,reward,train}: the model's defaults where unset (solbench.models), and
        ``train`` written into the method's micro_batch_size (the same setting) when it has one."""
        try:
            from solbench.models import resolve_micro_batches
        except ImportError:  # the models part is absent: nothing to resolve against
            return
        mc = checked["method_config"]
        try:
            checked["micro_batch"] = resolve_micro_batches(checked["model"]["name"], checked.get("micro_batch") or {},
                                                           mc.get("micro_batch_size"))
        except ConfigError as err:
            raise ConfigError(f"{self._where(loc)}: run ({label}): {err}") from None
        if "micro_batch_size" in mc:
            mc["micro_batch_size"] = checked["micro_batch"]["train"]

    def _resolve_model_defaults(self, checked: dict) -> None:
        """A real model's unset text length, prompt instruction and LoRA init written out as its reference
        defaults (solbench.models.reference_defaults), so the run id says what the run does."""
        try:
            from solbench.models import reference_defaults
        except ImportError:  # the models part is absent
            return
        for section, values in reference_defaults(checked["model"]["name"]).items():
            for key, value in values.items():
                if checked[section].get(key) is None:
                    checked[section][key] = value

    def _check_run(self, cfg: RunConfig, loc: tuple, label: str) -> None:
        """Names against registries, positive counts and batch arithmetic."""
        where = f"{self._where(loc)}: run ({label})"
        reg = self.registries

        def fail(key: str, message: str) -> None:
            raise ConfigError(f"{where}: {key}: {message}")

        def check_name(key: str, value: str, known: list[str] | None, what: str) -> None:
            if known is not None and value not in known:
                close = difflib.get_close_matches(value, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                fail(key, f"unknown {what} {value!r}{hint}; allowed: {', '.join(known)}")

        check_name("model.name", cfg.model.name, reg.models, "model")
        if not cfg.rewards:
            fail("rewards", "at least one training reward is needed")
        for reward in cfg.rewards:
            check_name(f"rewards.{reward}", reward, reg.rewards, "reward")
        for index, reward in enumerate(cfg.eval.rewards):
            check_name(f"eval.rewards[{index}]", reward, reg.rewards, "reward")
        check_name("quant.recipe", cfg.quant.recipe, reg.recipes, "quantization recipe")
        for key, name in (("train_prompts", cfg.train_prompts), ("eval.prompts", cfg.eval.prompts)):
            if is_prompt_path(name):
                # a file: decoded now where it is on this machine (so that no run fails on it in its
                # worker); one that is not here is looked for at launch (launch.preflight)
                if reg.prompt_set_size is not None and Path(name).expanduser().is_file():
                    from solbench.world.prompts import load_prompt_set

                    try:
                        load_prompt_set(name)
                    except ConfigError as err:
                        fail(key, str(err))
                continue
            if reg.prompt_set_exists is not None and not reg.prompt_set_exists(name):
                fail(key, f"unknown prompt set {name!r} (embedded sets are named shapes/<split>; files end in "
                          ".txt or .jsonl)")
        # Counts against the sets (a prompt file that is not on this machine is checked at launch).
        size = reg.prompt_set_size or (lambda name: None)
        for key, wanted, name in (("prompts_per_iter", cfg.prompts_per_iter, cfg.train_prompts),
                                  ("eval.n_prompts", cfg.eval.n_prompts, cfg.eval.prompts)):
            available = size(name)
            if wanted is not None and available is not None and wanted > available:
                raise ConfigError(f"{self._key_where(key, cfg.method, loc)}: run ({label}): {key}: {wanted} exceeds "
                                  f"the {available} prompts of {name!r}")
        # The tiny model's weights: the shipped ones, a random init or a folder of pretrained weights
        # (solbench.models._build_tiny).
        if cfg.model.name == "tiny" and cfg.model.path not in (None, "pretrained", "random"):
            from solbench.models.tiny import tiny_weights_folder_problem

            problem = tiny_weights_folder_problem(cfg.model.path)
            if problem:
                raise ConfigError(f"{self._key_where('model.path', cfg.method, loc)}: run ({label}): model.path: "
                                  f"{cfg.model.path!r} is no tiny model ({problem}); use pretrained (the shipped "
                                  "weights, the default), random (an untrained init) or a folder written by "
                                  "scripts/pretrain_tiny.py --out")
        for key in ("iterations", "prompts_per_iter", "world_size", "checkpoint_every", "eval.every",
                    "eval.seeds_per_prompt", "sampling.steps", "sampling.eval_steps", "finetune.grad_accum",
                    "finetune.lora_rank"):
            if _get_path(cfg, key) < 1:
                fail(key, f"must be >= 1, got {_get_path(cfg, key)}")
        steps = cfg.finetune.optimizer_steps
        if steps is not None:
            if steps < 1:
                fail("finetune.optimizer_steps", f"must be >= 1 or null, got {steps}")
            if cfg.finetune.grad_accum != 1:
                fail("finetune.optimizer_steps", f"set either optimizer_steps or grad_accum (got grad_accum="
                                                 f"{cfg.finetune.grad_accum}): optimizer_steps fixes the steps per iteration")
            if steps > 1 and not cfg.method_config.get("micro_batch_size"):
                fail("finetune.optimizer_steps", f"{steps} steps per iteration need method_config.micro_batch_size "
                                                 "(the batch is one micro-batch without it)")
        if cfg.eval.n_prompts is not None and cfg.eval.n_prompts < 1:
            fail("eval.n_prompts", f"must be >= 1 or null (all), got {cfg.eval.n_prompts}")
        if cfg.finetune.mode not in ("lora", "full"):
            fail("finetune.mode", f"must be lora or full, got {cfg.finetune.mode!r}")
        if cfg.finetune.lora_init not in (None, "gaussian", "kaiming"):
            fail("finetune.lora_init", f"must be gaussian, kaiming or null (the model's default), got "
                                       f"{cfg.finetune.lora_init!r}")
        if cfg.finetune.ema_every < 1:
            fail("finetune.ema_every", f"must be >= 1, got {cfg.finetune.ema_every}")
        if reg.models is not None:
            from solbench.models import check_model_settings

            try:
                check_model_settings(cfg.model)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None
        if cfg.device not in ("auto", "cpu", "cuda"):
            fail("device", f"must be auto, cpu or cuda, got {cfg.device!r}")
        if cfg.quant.backend not in ("emulated", "te", "torch", "auto"):
            fail("quant.backend", f"must be emulated, te, torch or auto, got {cfg.quant.backend!r}")
        if cfg.prompts_per_iter % cfg.world_size:
            fail("prompts_per_iter", f"{cfg.prompts_per_iter} prompt groups do not split over world_size="
                                     f"{cfg.world_size} ranks; use a multiple of {cfg.world_size}")
        mc = cfg.method_config
        if "n" in mc and "k" in mc and not mc["k"] <= mc["n"]:
            fail("method_config.k", f"K={mc['k']} exceeds N={mc['n']} (K <= N)")
        trained_per_prompt = mc.get("k", mc.get("group_size"))
        micro = mc.get("micro_batch_size")
        if trained_per_prompt is not None and micro:
            per_rank = cfg.prompts_per_iter // cfg.world_size * trained_per_prompt
            if per_rank % micro:
                fail("method_config.micro_batch_size",
                     f"{micro} does not divide the {per_rank} trained samples per rank "
                     f"({cfg.prompts_per_iter // cfg.world_size} prompts x {trained_per_prompt})")
            n_micro = per_rank // micro
            steps = cfg.finetune.optimizer_steps
            if steps is not None and (n_micro * cfg.world_size) % steps:
                fail("finetune.optimizer_steps", f"{steps} does not divide the {n_micro * cfg.world_size} micro-batches "
                                                 f"per iteration ({cfg.world_size} ranks x {per_rank} samples / "
                                                 f"micro_batch_size {micro})")
            if n_micro % cfg.finetune.grad_accum:
                fail("finetune.grad_accum", f"{cfg.finetune.grad_accum} does not divide the {n_micro} micro-batches "
                                            f"per iteration ({per_rank} samples / micro_batch_size {micro})")


def _is_run_path(key: str) -> bool:
    parts = key.split(".")
    current: Any = RunConfig
    for part in parts:
        if not (isinstance(current, type) and dataclasses.is_dataclass(current)):
            return False
        hints = typing.get_type_hints(current)
        if part not in hints or part in _RESERVED_FIELDS:
            return False
        current = hints[part]
    return True


def _set_path(cfg: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _get_path(cfg: RunConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _matches(combo: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    for key, wanted in entry.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        if combo.get(key) not in options:
            return False
    return True


# ----------------------------------------------------------------------------------------------
# Launch profiles
# ----------------------------------------------------------------------------------------------

def profile_search_path(spec_path: Path | None = None) -> list[Path]:
    """Folders searched for slurm/profiles/<name>.yaml: next to the spec's project, cwd, the checkout."""
    roots = []
    if spec_path is not None:
        roots.append(Path(spec_path).resolve().parent.parent)
    roots += [Path.cwd(), Path(__file__).resolve().parent.parent]
    return list(dict.fromkeys(root / "slurm" / "profiles" for root in roots))


def load_profile(name: str, spec_path: Path | None = None) -> tuple[str, ProfileModel]:
    """(path, profile) for a profile name (``local``, ``debug``, ...) or a .yaml path."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        candidates = [Path(name)]
        if spec_path is not None:
            candidates.insert(0, Path(spec_path).parent / name)
    else:
        if not re.match(NAME_PATTERN, name):
            raise ConfigError(f"launch profile {name!r} is not a valid profile name")
        candidates = [folder / f"{name}.yaml" for folder in profile_search_path(spec_path)]
    for path in candidates:
        if path.is_file():
            data, lines = load_yaml(path)
            try:
                return str(path), ProfileModel.model_validate_json(json.dumps(data), strict=True)
            except ValidationError as err:
                raise _format_validation_error(err, str(path), lines, ProfileModel) from None
    if name == "local":  # the default works without any profile file
        return "<builtin local>", ProfileModel(executor="local", workers="auto",
                                               description="this machine, one run per core at a time")
    known = sorted({p.stem for folder in profile_search_path(spec_path) if folder.is_dir()
                    for p in folder.glob("*.yaml")})
    raise ConfigError(f"launch profile {name!r} not found (looked in {', '.join(str(c) for c in candidates)}); "
                      f"profiles: {', '.join(known) or 'none'}")


def check_launch(spec: ExperimentSpec, profile_path: str, profile: ProfileModel) -> None:
    """Ranks per run against the launch profile, before anything is submitted.

    On Slurm each rank of a run is one task (one per GPU), so world_size must equal nodes x
    tasks_per_node, and a GPU profile runs one task per GPU.
    """
    if profile.executor != "slurm":
        return
    ranks = profile.nodes * profile.tasks_per_node
    if profile.gpus_per_node and profile.tasks_per_node != profile.gpus_per_node:
        raise ConfigError(f"{profile_path}: tasks_per_node={profile.tasks_per_node} but gpus_per_node="
                          f"{profile.gpus_per_node}; solbench runs one rank (task) per GPU, set them equal")
    wrong = sorted({r.config.world_size for r in spec.runs if r.config.world_size != ranks})
    if wrong:
        raise ConfigError(f"{spec.path}: world_size {', '.join(map(str, wrong))} does not match launch profile "
                          f"{profile_path}, which starts nodes x tasks_per_node = {profile.nodes} x "
                          f"{profile.tasks_per_node} = {ranks} ranks per run; set world_size: {ranks} or use a "
                          "profile with that many tasks")


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
