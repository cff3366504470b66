"""The pydantic schema of specs and launch profiles, and how its validation errors read.

The run sections (``base``, ``methods.<name>``) are models generated from the RunConfig dataclasses, so
the schema never drifts from the config; every model is strict (unknown keys and wrong types are errors), and
``FIELD_BOUNDS`` puts the numeric ranges of RunConfig fields into them (a negative learning rate is an error
naming its key and line at expansion, not torch's "Invalid learning rate" in every run).
``_format_validation_error`` turns a pydantic ValidationError into a ConfigError naming the file, line and
key path, with the allowed keys of the model at that path.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from solbench.config import RunConfig
from solbench.errors import ConfigError
from solbench.spec.yaml_lines import _dotted, _nearest_line
from solbench.text.spec_text import NAME_PATTERN  # a leaf module: the report shares it
from solbench.machine.threads import MAX_THREADS

_STRICT = ConfigDict(extra="forbid", strict=True)
# Set by the spec itself, never by base/methods overrides or the matrix.
_RESERVED_FIELDS = ("experiment", "method")


SEED_LIMIT = 1 << 32  # numpy's global generator (seeded with the run seed) takes seeds below 2**32
ITERATION_LIMIT = 10**6
COUNT_LIMIT = 1 << 16
REWARD_WEIGHT_LIMIT = 1e3
_ITERATION_FIELDS = ("iterations", "checkpoint_every", "eval.every")
_COUNT_FIELDS = ("prompts_per_iter", "world_size", "eval.n_prompts", "eval.seeds_per_prompt", "sampling.steps",
                 "sampling.eval_steps", "finetune.lora_rank", "finetune.grad_accum", "finetune.optimizer_steps",
                 "finetune.ema_every", "micro_batch.rollout", "micro_batch.reward", "micro_batch.train")

#: Numeric ranges of RunConfig fields (dotted paths), part of the schema wherever a run's value is given
#: (``base``, ``methods.<name>``, the matrix, a sweep's sampled values, and the defaults): pydantic's
#: operators gt/ge/lt/le. A tuple field's bound applies to each item, an optional field's to its value, a
#: mapping's to each of its values. Counts that must be >= 1 are checked with the whole run
#: (solbench/spec/resolver.py, ``_check_run``); their upper bounds, values no run can use, are here.
FIELD_BOUNDS: dict[str, dict[str, float]] = {
    "finetune.lr": {"gt": 0, "le": 1},  # AdamW refuses lr < 0; lr 0 trains nothing
    "finetune.weight_decay": {"ge": 0},
    "finetune.grad_clip": {"ge": 0},  # 0 turns clipping off (the trainer clips at inf)
    "finetune.lora_alpha": {"gt": 0},
    "finetune.adam_betas": {"ge": 0, "lt": 1},
    "finetune.ema_decay": {"ge": 0, "le": 1},
    "sampling.shift": {"gt": 0},
    "model.resolution": {"ge": 1},
    "eval.grid_prompts": {"ge": 0, "le": COUNT_LIMIT},
    "seed": {"ge": 0, "lt": SEED_LIMIT},
    "rewards": {"ge": -REWARD_WEIGHT_LIMIT, "le": REWARD_WEIGHT_LIMIT},
    "numerics.threads": {"le": MAX_THREADS},
    **{path: {"le": ITERATION_LIMIT} for path in _ITERATION_FIELDS},
    **{path: {"le": COUNT_LIMIT} for path in _COUNT_FIELDS},
}

#: Why a bound of FIELD_BOUNDS is what it is, said after pydantic's "Input should be ...".
BOUND_REASONS: dict[str, str] = {
    "seed": "the run seed seeds numpy's global generator, which takes 0 <= seed < 2**32",
    "finetune.lr": "AdamW moves each weight by about lr per step: past 1 no run trains",
    "rewards": f"a reward weight scales its reward in the training sum; past +-{REWARD_WEIGHT_LIMIT:g} it only "
               "risks overflow, and the weights' ratios are what mixes rewards",
    "numerics.threads": f"no CPU solbench runs on has more than {MAX_THREADS} cores",
    **{path: f"more than {ITERATION_LIMIT:,} iterations is beyond any run's budget" for path in _ITERATION_FIELDS},
    **{path: f"a count past {COUNT_LIMIT:,} (2**16): more prompts, samples, steps or ranks than any machine holds"
       for path in (*_COUNT_FIELDS, "eval.grid_prompts")},
}

_BOUND_WORDS = {"gt": (operator.gt, "greater than"), "ge": (operator.ge, "greater than or equal to"),
                "lt": (operator.lt, "less than"), "le": (operator.le, "less than or equal to")}


def bound_problem(path: str, value: Any) -> str | None:
    """What is wrong with ``value`` for the RunConfig field ``path`` (dotted) by ``FIELD_BOUNDS``, else None
    (for values given outside a run section, e.g. a sweep's range ends)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    for op, limit in FIELD_BOUNDS.get(path, {}).items():
        check, words = _BOUND_WORDS[op]
        if not check(value, limit):
            return f"should be {words} {limit:g}, got {value!r}"
    return None


def _bounded(hint: Any, bounds: dict[str, float]) -> Any:
    """``hint`` with ``bounds`` on its numbers: each item of a tuple, the value of an Optional."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return Union[tuple(arg if arg is type(None) else _bounded(arg, bounds) for arg in args)]
    if origin is tuple:
        return tuple[tuple(_bounded(arg, bounds) for arg in args)]
    if origin is dict:  # the values of a mapping (reward name -> weight)
        return dict[args[0], _bounded(args[1], bounds)]
    return Annotated[hint, Field(**bounds)]


def _override_model(dc: type, name: str, exclude: Sequence[str] = (), prefix: str = "",
                    bounded: set[str] | None = None) -> type[BaseModel]:
    """A strict model where every field of dataclass ``dc`` may be given (and none has to be), with the
    ``FIELD_BOUNDS`` of its fields (``prefix``: the dotted path of ``dc`` in RunConfig)."""
    hints = typing.get_type_hints(dc)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        if f.name in exclude:
            continue
        hint = hints[f.name]
        path = prefix + f.name
        if dataclasses.is_dataclass(hint):
            hint = _override_model(hint, f"{name}.{f.name}", prefix=f"{path}.", bounded=bounded)
        elif path in FIELD_BOUNDS:
            hint = _bounded(hint, FIELD_BOUNDS[path])
            if bounded is not None:
                bounded.add(path)
        # The hint is kept as is (not Optional): an explicit null is checked like any other value.
        fields[f.name] = (hint, Field(default=None))
    return create_model(name, __config__=_STRICT, **fields)


_applied: set[str] = set()
RunOverrides = _override_model(RunConfig, "RunOverrides", exclude=_RESERVED_FIELDS, bounded=_applied)
_FullRun = _override_model(RunConfig, "RunConfig")
if set(FIELD_BOUNDS) - _applied:  # a renamed or removed field: its bound would silently check nothing
    raise RuntimeError(f"FIELD_BOUNDS names no RunConfig field: {', '.join(sorted(set(FIELD_BOUNDS) - _applied))}")


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
    # reward_and_time's time axis: the PROJECTED GPU seconds above, or each cell's MEASURED training seconds per
    # iteration on its own runs' clock (solbench/report/sweep_cell.py)
    clock: Literal["projected", "measured"] = "projected"


class SweepPruner(BaseModel):
    model_config = _STRICT
    kind: Literal["median", "hyperband", "none"] = "median"
    n_startup_trials: int = Field(default=2, ge=0)
    n_warmup_steps: int = Field(default=0, ge=0)


class SweepModel(BaseModel):
    model_config = _STRICT
    study: Optional[str] = None  # default: the spec name
    storage: Literal["sqlite", "journal"] = "sqlite"  # file under results/<experiment>/
    storage_url: Optional[str] = None  # a database URL (postgresql://..., mysql://...) instead of the file
    seeds_per_cell: int = Field(default=3, ge=1)  # run seeds a trial (one cell) trains; its value is their mean
    trials: int = Field(default=8, ge=1)
    parallel: int = Field(default=1, ge=1)  # trials in flight at once (Slurm jobs or local workers)
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    sampler_seed: int = 0
    objective: SweepObjective = Field(default_factory=SweepObjective)
    pruner: SweepPruner = Field(default_factory=SweepPruner)
    params: dict[str, SweepParam]


class FidelityCheckpoint(BaseModel):
    """One entry of ``fidelity.checkpoint`` as a mapping: checkpoints of a method's runs picked by arm, seed and
    step (solbench.fidelity.experiment.plan_block), e.g. ``{method: sol_rl, steps: [16, 32], seeds: [0, 1, 2]}``."""

    model_config = _STRICT
    method: str
    iterations: Optional[int] = Field(default=None, ge=1)  # the arm that ran this many (default: the main arm)
    steps: list[int] = Field(default_factory=list)  # checkpoint steps, each one the run keeps (default: its final)
    seeds: list[int] = Field(default_factory=list)  # run seeds (default: the arm's lowest)
    recipes: list[str] = Field(default_factory=list)  # default: the block's recipes


class FidelityBlock(BaseModel):
    """A spec's ``fidelity:`` block: the unbiased all-seeds ranking fidelity `solbench run` measures after
    training (solbench.fidelity.experiment.run_spec_block), one fidelity run per explore recipe, results under the
    spec's experiment folder."""

    model_config = _STRICT
    # a method of the spec (its lowest-seed main run's final checkpoint), "base", or a FidelityCheckpoint mapping
    # (other seeds, steps, arms, recipes); a list measures each (e.g. [sol_rl, base]: at the end and the start)
    checkpoint: Union[str, FidelityCheckpoint, list[Union[str, FidelityCheckpoint]]] = "sol_rl"
    role: Literal["policy", "ema", "old"] = "policy"
    n_prompts: int = Field(default=8, ge=1)  # M: the first M eval prompts of the run
    seeds: int = Field(default=8, ge=3)  # N seeds per prompt, each at both precisions (3+: report.fidelity.MIN_PAIRS)
    recipes: list[str] = Field(default_factory=list)  # default: the run's recipe; "none" = step budget only
    explore_steps: int = Field(default=6, ge=1)
    steps: int = Field(default=10, ge=1)
    prompts: Optional[str] = None  # default: the run's eval prompts
    rewards: list[str] = Field(default_factory=list)  # default: the run's training rewards
    batch_seeds: Optional[int] = Field(default=None, ge=1)


class SpeedArm(BaseModel):
    """One arm of a ``speed:`` block as a mapping: a method's main run (solbench.spec.fidelity_plan.arm_runs) with
    settings changed by dotted key, e.g. ``{name: sol_rl_fp_preview, method: sol_rl, set: {quant.recipe: none}}``."""

    model_config = _STRICT
    name: str = Field(pattern=NAME_PATTERN)
    method: str
    iterations: Optional[int] = Field(default=None, ge=1)  # the method's arm that ran this many (default: its main)
    set: dict[str, Any] = Field(default_factory=dict)  # dotted RunConfig keys -> values (quant.recipe: none)


class SpeedBlock(BaseModel):
    """A spec's ``speed:`` block: Table 5 timed after training, every arm from the same model state, alone on the
    machine, R rounds of M iterations, the arms interleaved and their order rotated each round (solbench.speed)."""

    model_config = _STRICT
    # methods of the spec (their main run's config) or SpeedArm mappings; the first is the baseline of the ratios
    arms: list[Union[str, SpeedArm]] = Field(default_factory=lambda: ["naive_scaling", "sol_rl", "naive_fp4"],
                                            min_length=2)
    rounds: int = Field(default=5, ge=2)  # R: paired ratios per arm (2+ for an interval)
    iterations: int = Field(default=2, ge=1)  # M: timed iterations per arm and round (their median is the round's)
    warmup: int = Field(default=1, ge=0)  # untimed iterations per arm before its first round in a process
    checkpoint: str = "base"  # base, or a method of the spec: its main run's final policy in every arm
    sampling: list[Literal["eager", "compiled"]] = Field(default_factory=lambda: ["eager"], min_length=1)
    load_bound: float = Field(default=0.25, ge=0)  # other programs' busy cores above which a round is repeated
    repeats: int = Field(default=3, ge=0)  # repeats of one round before the block gives up for a quiet machine
    wait_s: float = Field(default=600.0, ge=0)  # how long to wait for other solbench work to free the cores
    target: Optional[float] = Field(default=None, gt=0)  # declared E2E ratio for power (default: the paper's)
    target_rollout: Optional[float] = Field(default=None, gt=0)  # declared rollout ratio (default: the paper's)
    # every arm built once and kept (True), or built, warmed up and freed in each round (False: real models on one
    # GPU, where the arms do not fit in memory together); default True on CPU, False on CUDA
    resident: Optional[bool] = None


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
    speed: Optional[SpeedBlock] = None  # Table 5 timed alone after training (solbench.speed)

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
            reason = _bound_reason(loc) if kind in ("greater_than", "greater_than_equal", "less_than",
                                                    "less_than_equal") else None
            if reason:
                msg += f" ({reason})"
            path = _dotted(loc)
        messages.append(f"{where}: {path}: {msg}")
    return ConfigError("\n".join(messages) if len(messages) > 1 else messages[0])


def _bound_reason(loc: tuple) -> str | None:
    """BOUND_REASONS of the RunConfig field at the end of ``loc`` (after base, methods.<name> or a matrix key;
    a mapping's value: its field without the key)."""
    parts = [str(part) for part in loc if not isinstance(part, int)]
    for start in range(len(parts)):
        for stop in (len(parts), len(parts) - 1):
            reason = BOUND_REASONS.get(".".join(parts[start:stop]))
            if reason and stop > start:
                return reason
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
