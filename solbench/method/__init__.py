"""The Method interface and the method registry.

A method is the maths of one RL algorithm: how it gathers its training batch through the engine and
what loss it minimises. Everything else (timing, seeding, weights, quantization, files, the optimizer,
gradient clipping and accumulation, EMA, NaN checks, checkpoints, result rows) belongs to the harness.

One iteration, as the trainer (solbench/train/trainer.py) drives it::

    it = Iteration(step, stream=f"train/{step}", generator=<seeded from run seed and step>)
    batch = method.collect(engine, prompt_ids, prompts, it)   # engine.sample / engine.score / engine.phase only
    for chunk in method.chunks(batch, it):                    # micro-batches x trained timesteps
        loss, logs = method.loss(engine, chunk)               # trainer: NaN check, backward(loss * chunk.weight)
        ...                                                   # trainer: accumulate, clip, optimizer step, EMA
                                                              # (finetune.optimizer_steps per iteration, or one
                                                              # per grad_accum micro-batches)
    method.after_update(nets, step)                           # e.g. the old-policy EMA (math only)
    # trainer: engine.sync_explore_copy() when "explore" in method.nets

A method declares:

- ``name``: the registry key.
- ``display_name``: how reports name it (``"Sol-RL"``); each run records it with its results (facts.json),
  so a report reads it without importing the method.
- ``Config``: a dataclass whose defaults are its paper's values, each field with
  ``metadata={"help": "..."}`` (one line). Its own checks of single fields go in ``__post_init__``
  (raise ValueError). A spec's ``method_config`` mapping is built into it ONCE, at expansion, strictly
  (:func:`build_method_settings`: an unknown key is an error naming it, the method and the spec line),
  and travels as that instance inside :class:`MethodSettings` (``RunConfig.method_config``, a frozen
  mapping of its canonical values, the ones hashed and stored) to ``Method(config, run)``.
- ``validate(config, run)``: the method's rules between its fields and the rest of the run (sol_rl: explore
  steps within ``sampling.steps``), yielding ``(dotted key, message)`` problems; the resolver calls it when it
  expands a spec and reports each at the line that sets the key. Rules of the Config alone (``K <= N``, a
  field's range) are its ``__post_init__``'s.
- ``trained_per_prompt(config)``: the samples it trains per prompt group (K, or the group size), which the
  harness's batch arithmetic (micro-batches, grad_accum, optimizer_steps) divides; None: no such count.
- ``axes``: the names of Config fields an experiment spec may vary (e.g. ``("n", "k")``).
- ``nets``: the network roles it needs beyond ``"policy"``: any of ``"old"``, ``"reference"``,
  ``"explore"`` (``"ema"`` always exists, for evaluation).
- ``rollout_net``: the role its training samples come from (DiffusionNFT samples with the old
  policy); the explore copy, when used, mirrors this role.
- ``tiny_config``: Config overrides that make one iteration on the embedded tiny model take seconds
  (the conformance test runs every method with them; paper defaults are tested separately).
- ``timed_phases``: the phases one iteration times besides ``"train"`` (the ``phase=`` names it gives
  the engine, e.g. ``{"rollout", "reward"}``). The conformance suite checks that an iteration times
  exactly these, so a new method file needs no test edited. Those but ``"sync"`` (the harness's re-sync of
  the explore copy) are its rollout phases (``rollout_phases()``), recorded with its results for the report.

The engine API a method may use (solbench/engine/engine.py; nothing else of the harness):

- ``engine.sample(prompt_ids, prompts, cand_idx, net=role, sampler=SamplerSpec, phase=..., stream=it.stream,
  noise_idx=None, keep_trajectory=False) -> Rollout``: one sample per (prompt id, candidate index) with
  the network of ``role`` ("policy", "old", "explore", ...), timed as ``phase``; the initial noise is a
  pure function of (run seed, stream, prompt id, noise_idx or cand_idx), so a seed can be regenerated
  exactly. ``rollout.sampler`` is the spec with guidance and shift resolved (None -> the model's default).
- ``engine.score(rollout) -> Tensor [B]``: the run's training reward (also stored on the rollout).
- ``engine.encode(prompts) -> Cond`` and ``engine.velocity(role, x_t, t, cond, guidance) -> Tensor``:
  the velocity of a role, with gradients when the role is trained. ``guidance`` None means the
  model's default (SD3.5 and SANA: CFG 4.5, FLUX.1-dev: distilled 3.5, tiny: none); 1.0 means no CFG
  (one forward per velocity). A loss must pass the guidance its samples were drawn with, i.e.
  ``rollout.sampler.guidance`` (resolved), to EVERY forward (policy, old, reference, slow copy): a
  forward that omits it silently uses the model's default and, on SD3.5/SANA, doubles the batch with CFG.
- ``engine.phase(name)``: a context that times method-side work (e.g. "select").
- ``engine.adapter.sigmas(steps, shift)``: the model's sigma schedule (t=1 first, t=0 last).

Randomness inside a method (timestep subsets, fresh noise for losses, random selection) comes only
from ``it.generator``, which the harness seeds from (run seed, step), so runs are reproducible and
resume exactly. Rollout noise comes from the engine (solbench.engine.noise), keyed by prompt and candidate.

Registration: built-in methods are the modules of ``solbench.methods`` (methods/ at the repository
root); outside packages add theirs through the entry-point group ``solbench.methods``
(``name = "package.module:MethodClass"``). Unknown names fail with close-match suggestions.

Stage ``method`` (solbench/stages.py): it imports its own modules and the stages below it, engine, rewards, models,
quant, world, report, results, machine, text, base.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

import torch

from solbench.errors import ConfigError

ENTRY_POINT_GROUP = "solbench.methods"
NET_ROLES = frozenset({"old", "reference", "explore"})


@dataclass(frozen=True)
class RunInfo:
    """What a method may know about its run (no I/O handles, no weights)."""

    prompts_per_iter: int  # prompt groups per iteration
    steps: int  # full rollout step budget
    shift: float | None = None  # sigma-schedule shift; None = the model's default
    guidance: float | None = None  # CFG / distilled guidance of rollouts AND losses; None = the model's default, 1.0 = no CFG
    finetune_mode: str = "lora"  # lora | full
    world_size: int = 1


@dataclass
class Iteration:
    """One training iteration as a method sees it."""

    step: int  # 1-based iteration index
    stream: str  # noise stream of this iteration's rollouts ("train/<step>")
    generator: torch.Generator  # the method's only source of randomness


@dataclass
class Candidate:
    """One generated sample, one row of the candidates table (the trainer adds run_id and step)."""

    prompt_id: str
    cand_idx: int
    noise_seed: int
    precision: str  # "full" | "explore"
    reward: float
    selected: bool

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Batch:
    """What ``collect`` gathered: the training data plus what the harness records about it."""

    data: dict[str, Any]  # method-specific training tensors (read only by the method's chunks/loss)
    candidates: list[Candidate]  # every sample generated this iteration
    n_images: int  # images generated for training this iteration (all precisions)
    logs: dict[str, float] = field(default_factory=dict)  # "reward", "reward_all", method extras


@dataclass
class Chunk:
    """One forward/backward unit: a micro-batch at one (or a set of) trained timestep(s).

    The trainer backpropagates ``loss * weight``; the weights of one micro-batch sum to 1, so a
    micro-batch contributes its mean loss. An optimizer step follows every ``grad_accum``
    micro-batches and the last one of the iteration.
    """

    data: dict[str, Any]
    micro_batch: int  # index of its micro-batch within the iteration
    n_micro_batches: int  # micro-batches in this iteration
    weight: float  # share of its micro-batch's loss


class Method:
    """Base class of all methods. Subclasses set the class attributes and implement the four hooks."""

    name: ClassVar[str]
    display_name: ClassVar[str | None] = None  # how reports name it; None: its registry name
    Config: ClassVar[type]
    axes: ClassVar[tuple[str, ...]] = ()
    nets: ClassVar[frozenset[str]] = frozenset()
    rollout_net: ClassVar[str] = "policy"
    tiny_config: ClassVar[Mapping[str, Any]] = {}
    timed_phases: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: Any, run: RunInfo) -> None:
        self.config = config
        self.run = run

    @classmethod
    def validate(cls, config: Any, run: Any) -> Iterable[tuple[str, str]]:
        """The method's rules between its Config's fields and the rest of the run (``run``: the resolved
        RunConfig), checked when a spec expands: ``(dotted key, message)`` for each one broken, e.g.
        ``("method_config.explore_steps", "12 explore steps exceed ... sampling.steps=10")``. A rule of the Config
        alone (a field's range, K <= N) belongs in its ``__post_init__``, which every construction runs."""
        return ()

    @classmethod
    def trained_per_prompt(cls, config: Any) -> int | None:
        """Samples trained per prompt group (K of N, or the group size): what the harness's micro-batch
        arithmetic divides. None: the method trains no fixed count per prompt."""
        return None

    @classmethod
    def shown_name(cls) -> str:
        """The name reports show (``display_name``, else the registry name)."""
        return cls.display_name or cls.name

    @classmethod
    def rollout_phases(cls) -> frozenset[str]:
        """The phases that make up its rollout: ``timed_phases`` but the harness's ``"sync"``."""
        return frozenset(cls.timed_phases) - {"sync"}

    def collect(self, engine, prompt_ids: Sequence[str], prompts: Sequence[str], it: Iteration) -> Batch:
        """Sample and score the iteration's training batch (through the engine only)."""
        raise NotImplementedError

    def chunks(self, batch: Batch, it: Iteration) -> Iterator[Chunk]:
        """Split the batch into micro-batches x trained timesteps, drawing randomness from it.generator."""
        raise NotImplementedError

    def loss(self, engine, chunk: Chunk) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss of one chunk (differentiable in the policy) and scalar logs."""
        raise NotImplementedError

    def after_update(self, nets, step: int) -> None:
        """Called once per iteration after the optimizer steps (e.g. the old-policy EMA)."""

    def state_dict(self) -> dict[str, Any]:
        """Method state beyond the networks (checkpointed by the harness)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"method {self.name!r} holds no state but the checkpoint has {sorted(state)}")


def help_field(default: Any, help: str, **kwargs) -> Any:
    """A dataclass field with its one-line help text (``field(default=..., metadata={"help": ...})``)."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------

_registry: dict[str, type[Method]] = {}
_loaded = False


def register(cls: type[Method]) -> type[Method]:
    """Class decorator for built-in methods; also usable by outside code before the first lookup."""
    _check_method_class(cls, where=f"{cls.__module__}.{cls.__qualname__}")
    existing = _registry.get(cls.name)
    if existing is not None and existing is not cls:
        raise ConfigError(f"method name {cls.name!r} registered twice: {_where(existing)} and {_where(cls)}")
    _registry[cls.name] = cls
    return cls


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_method_class(cls: Any, where: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ConfigError(f"{where} is not a solbench.method.Method subclass")
    for attr in ("name", "Config"):
        if not hasattr(cls, attr):
            raise ConfigError(f"method class {where} does not define {attr!r}")
    if not dataclasses.is_dataclass(cls.Config):
        raise ConfigError(f"{where}.Config must be a dataclass")
    field_names = {f.name for f in dataclasses.fields(cls.Config)}
    unknown_axes = [a for a in cls.axes if a not in field_names]
    if unknown_axes:
        raise ConfigError(f"{where}.axes names {unknown_axes} that are not fields of its Config")
    unknown_roles = set(cls.nets) - NET_ROLES
    if unknown_roles:
        raise ConfigError(f"{where}.nets has unknown roles {sorted(unknown_roles)}; roles are {sorted(NET_ROLES)}")


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    import solbench.methods as builtin

    for info in pkgutil.iter_modules(builtin.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{builtin.__name__}.{info.name}")  # modules register on import
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _registry and _where(_registry[ep.name]) == ep.value.replace(":", "."):
            continue
        try:
            cls = ep.load()
        except Exception as exc:  # an outside package's bug must name the package
            raise ConfigError(f"could not load method {ep.name!r} from entry point {ep.value!r}: {exc}") from exc
        if getattr(cls, "name", None) != ep.name:
            raise ConfigError(f"entry point {ep.name!r} -> {ep.value!r} loads a method named {getattr(cls, 'name', None)!r}")
        register(cls)
    _loaded = True


def method_names() -> list[str]:
    """Names of every registered method, sorted."""
    _load_all()
    return sorted(_registry)


def get_method(name: str) -> type[Method]:
    """The Method class registered under ``name``; unknown names fail with close matches."""
    _load_all()
    try:
        return _registry[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_registry), n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"unknown method {name!r}{hint} (methods: {', '.join(sorted(_registry))})") from None


def config_help(name: str) -> dict[str, str]:
    """Field name -> one-line help of a method's Config."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(get_method(name).Config)}


def expand_groups(prompt_ids: Sequence[str], prompts: Sequence[str], n: int) -> tuple[list[str], list[str], list[int]]:
    """Each prompt repeated n times, with candidate indices 0..n-1: (prompt_ids, prompts, cand_idx)."""
    ids = [pid for pid in prompt_ids for _ in range(n)]
    texts = [text for text in prompts for _ in range(n)]
    cand = [c for _ in prompt_ids for c in range(n)]
    return ids, texts, cand


def micro_batches(n: int, size: int | None) -> list[slice]:
    """Consecutive slices of at most ``size`` samples covering range(n) (one slice when size is None)."""
    size = n if size is None else int(size)
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def mean_dims(x: torch.Tensor) -> torch.Tensor:
    """Mean over every dimension but the first (per-sample mean)."""
    return x.mean(dim=tuple(range(1, x.ndim)))


def broadcast_time(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t [B] reshaped to broadcast against ``like`` [B, ...]."""
    return t.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


def velocity_deviation(engine, role: str, v: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, cond,
                       guidance: float | None) -> torch.Tensor:
    """mean ||v - v_role(x_t, t)||^2 over the batch, with no gradient through the frozen ``role``.

    The KL-style regulariser of DiffusionNFT and AWM toward the reference (or a slow copy);
    ``guidance`` must be the one ``v`` was computed with (no default, so that no caller forgets it).
    """
    with torch.no_grad():
        v_role = engine.velocity(role, x_t, t, cond, guidance).float()
    return mean_dims((v - v_role) ** 2).mean()


@torch.no_grad()
def ema_into_role(nets, role: str, decay: float) -> None:
    """theta_role <- decay * theta_role + (1 - decay) * theta_policy over the trainable parameters."""
    for target, new in zip(nets.trainable(role), nets.trainable("policy"), strict=True):
        target.mul_(decay).add_(new.detach(), alpha=1 - decay)


# The typed settings path (solbench/method/settings.py), re-exported: ``from solbench.method import MethodSettings``.
from solbench.method.settings import (  # noqa: E402
    MethodSettings,
    build_method_settings,
    method_settings,
    validate_method_config,
)
