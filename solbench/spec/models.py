"""The pydantic schema of specs and launch profiles, and how its validation errors read.

The run sections (``base``, ``methods.<name>``) are models generated from the RunConfig dataclasses, so
the schema never drifts from the config; every model is strict (unknown keys and wrong types are errors).
``_format_validation_error`` turns a pydantic ValidationError into a ConfigError naming the file, line and
key path, with the allowed keys of the model at that path.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from solbench.config import RunConfig
from solbench.errors import ConfigError
from solbench.spec.yaml_lines import _dotted, _nearest_line

_STRICT = ConfigDict(extra="forbid", strict=True)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# Set by the spec itself, never by base/methods overrides or the matrix.
_RESERVED_FIELDS = ("experiment", "method")


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
