"""What the trainer (solbench.train.trainer) builds a run from, and the pure helpers its loop is scheduled by.

Building: the device (``resolve_device``), the networks by role with the explore copy of the run's
quantization recipe (``build_policy_nets``, ``quant_explore_fns``; the standalone fidelity
experiment builds them the same way), the store as a rank other than 0 sees it (``FollowerStore``)
and the global seeds. Scheduling: the per-step generators (``_seeded_generator``), the micro-batches
sharing an optimizer step (``step_group``), the chunk look-ahead and the prompts a sample grid shows
(``grid_prompt_indices``); the evaluation protocol's sampler and resolution (``eval_sampler``,
``eval_resolution``). solbench.train.trainer re-exports every name here.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from solbench.config import RunConfig
from solbench.errors import ConfigError
from solbench.method import Chunk
from solbench.engine.noise import noise_seed
from solbench.engine.policy import PolicyNets

log = logging.getLogger(__name__)

ExploreFns = tuple[Callable[[nn.Module], nn.Module], Callable[[nn.Module, nn.Module], None]]


class FollowerStore:
    """The run store as a rank other than 0 sees it: reads (the checkpoint to resume from) go
    through, writes are dropped, because rank 0 writes every row and checkpoint of the run."""

    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def append(self, table: str, rows) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def write_json(self, name: str, obj) -> None:
        pass

    def write_status(self, state: str, **info) -> None:
        pass

    def save_checkpoint(self, step: int, state: dict) -> None:
        return None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {name!r} requested but CUDA is not available here")
    return torch.device(name)


def quant_explore_fns(quant_cfg) -> ExploreFns:
    """(factory, sync) for the explore copy from the run's quantization recipe (solbench.quant).

    The backend is resolved when the copy is built, on the device of the module it copies
    (solbench.quant.backends.choose_backend): "auto" takes TransformerEngine, then torch's scaled
    matmul (GPUs without TE), then, only with allow_emulated_fallback, the emulated quantizer;
    "emulated", "te" and "torch" are used as given (emulating only with the fallback allowed). The
    choice is left on ``factory.choice`` (a BackendChoice; the trainer records it in explore.json).
    """
    from solbench import quant
    from solbench.quant.backends import choose_backend

    recipe = quant.get_recipe(quant_cfg.recipe)

    def factory(module: nn.Module) -> nn.Module:
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        choice = choose_backend(recipe, quant_cfg.backend, allow_emulated_fallback=quant_cfg.emulated_fallback,
                                device=device)
        if choice.backend == "emulated" and quant_cfg.backend != "emulated":
            log.warning("quant backend %s unavailable here: emulating %s (%s)", quant_cfg.backend, recipe.name,
                        "; ".join(f"{b}: {why}" for b, why in choice.passed_over.items()))
        factory.choice = choice
        if quant_cfg.fast_accum and choice.backend != "torch":
            raise ConfigError(f"quant.fast_accum applies to backend torch's FP8 GEMM; this run explores on backend "
                              f"{choice.backend!r} (quant.backend {quant_cfg.backend!r}): remove quant.fast_accum")
        copy = quant.quantized_copy(module, recipe, backend=choice.backend)
        if choice.backend == "torch":  # quant.fast_accum (q/k/v share one input quantization: quantized_copy)
            from solbench.quant.native import set_fast_accum

            set_fast_accum(copy, quant_cfg.fast_accum)
        return copy

    factory.choice = None

    def sync(explore: nn.Module, source: nn.Module) -> None:
        quant.sync_weights(explore, source)

    return factory, sync


def build_policy_nets(cfg: RunConfig, adapter, roles, *, explore_source: str = "policy",
                      explore: ExploreFns | None = None) -> PolicyNets:
    """The networks of a run by role, on ``adapter.transformer``, as the trainer builds them.

    With "explore" in ``roles`` the explore copy mirrors ``explore_source`` through ``explore``
    (default: the run's quantization recipe, ``quant_explore_fns(cfg.quant)``). Load a checkpoint
    into the result with ``nets.load_state_dict(state["nets"])`` (which re-syncs the explore copy).
    Also used by the standalone fidelity experiment (solbench.fidelity.experiment).
    """
    from solbench.models.compile import resolve_compile
    from solbench.models import default_lora_init
    from solbench.train.rollout_copy import choose_rollout_copy

    factory, sync = (explore or quant_explore_fns(cfg.quant)) if "explore" in roles else (None, None)
    finetune = cfg.finetune
    if finetune.lora_init is None:  # the model's default: gaussian on the real models, as every reference
        finetune = dataclasses.replace(finetune, lora_init=default_lora_init(cfg.model.name))
    device = next(adapter.transformer.parameters()).device
    rollout = choose_rollout_copy(cfg, device)  # model.rollout_copy, auto by the doctor's memory model
    mode = resolve_compile(cfg.model.compile, device)
    nets = PolicyNets(adapter.transformer, finetune, roles, explore_source=explore_source,
                      explore_factory=factory, explore_sync=sync, rollout_copy=rollout.path == "merged",
                      compile_mode=mode)
    nets.explore_backend = getattr(factory, "choice", None)  # the resolved quant.backend (BackendChoice)
    nets.rollout_record = {**rollout.record(), "rollout_role": explore_source, "compile_requested": cfg.model.compile,
                           "compile_mode": mode, "compiled_blocks": nets.compiled_blocks}
    if nets.compiled_blocks:
        _record_compile_fallbacks(nets)
    return nets


def _record_compile_fallbacks(nets: PolicyNets) -> None:
    """rollout.json's ``compile_fallback``: each sampling network whose compiled blocks failed to compile and
    went back to eager (solbench.models.compile.on_fallback), with the error; ``nets.rollout_record_changed`` (the
    trainer's rewrite of rollout.json) is called after each entry."""
    from solbench.models.compile import on_fallback
    from solbench.engine.policy import AdapterView

    entries = nets.rollout_record["compile_fallback"] = []
    networks = {}
    for role, net in [*nets._nets.items(), ("rollout_copy", nets.rollout_copy)]:
        net = object.__getattribute__(net, "_shared") if isinstance(net, AdapterView) else net
        if net is not None:
            networks.setdefault(id(net), (role, net))

    def listener_for(role: str):
        def heard(entry: dict) -> None:
            entries.append({"role": role, **entry})
            changed = getattr(nets, "rollout_record_changed", None)
            if changed is not None:
                changed()
        return heard

    for role, net in networks.values():
        already = on_fallback(net, listener_for(role))
        if already is not None:
            entries.append({"role": role, **already})


def eval_sampler(cfg: RunConfig):
    """The sampler of a run's evaluation: ``eval.sampler`` at ``sampling.eval_steps`` with the protocol's guidance
    and shift (eval.guidance / eval.shift; unset, the run's sampling.guidance / sampling.shift). Its image side is
    ``eval_resolution(cfg)``. solbench.provenance resolves the derived.eval_* settings with the same two."""
    from solbench.engine.sampling import SamplerSpec

    ev, sampling = cfg.eval, cfg.sampling
    return SamplerSpec(ev.sampler, sampling.eval_steps,
                       guidance=sampling.guidance if ev.guidance is None else ev.guidance,
                       shift=sampling.shift if ev.shift is None else ev.shift)


def eval_resolution(cfg: RunConfig) -> int | None:
    """Image side of a run's evaluation samples: eval.resolution, unset the run's model.resolution (None:
    the model's native one)."""
    return cfg.model.resolution if cfg.eval.resolution is None else cfg.eval.resolution


def grid_prompt_indices(skills: list, n: int) -> list[int]:
    """Indices of the ``n`` eval prompts a sample grid shows: the first prompt of each skill (in order of first
    appearance), then the second of each, ..., so colour and position prompts appear beside single objects."""
    by_skill: dict = {}
    for i, skill in enumerate(skills):
        by_skill.setdefault(skill, []).append(i)
    picked: list[int] = []
    for rank in range(max((len(v) for v in by_skill.values()), default=0)):
        picked += [v[rank] for v in by_skill.values() if rank < len(v)]
    return sorted(picked[:n])


def _seeded_generator(run_seed: int, purpose: str, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(noise_seed(run_seed, purpose, str(step), 0))


def step_group(micro_batch: int, n_micro_batches: int, steps: int) -> range:
    """The micro-batches sharing ``micro_batch``'s optimizer step when an iteration's ``n_micro_batches``
    are split into ``steps`` consecutive groups as evenly as possible (finetune.optimizer_steps)."""
    groups = min(steps, n_micro_batches)
    g = micro_batch * groups // n_micro_batches
    start = -(-g * n_micro_batches // groups)  # ceil: the first micro-batch m with m * groups // n >= g
    stop = -(-(g + 1) * n_micro_batches // groups)
    return range(start, stop)


def _lookahead(items: Iterator[Chunk]) -> Iterator[tuple[Chunk, Chunk | None]]:
    """(item, next item or None) pairs, so the caller knows where a micro-batch ends."""
    current = next(items, None)
    while current is not None:
        upcoming = next(items, None)
        yield current, upcoming
        current = upcoming


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
