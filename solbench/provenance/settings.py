"""The settings of a resolved run that a provenance table must hold, and their values.

``run_settings(cfg)`` ENUMERATES them: every leaf of the RunConfig (method_config field by field, so a field a
method or the harness gains is a setting at once), less the paths in ``NOT_RESULTS`` (they change no number a
run computes, each with why), with each path in ``COVERED`` replaced by the derived setting(s) that hold its
effect, plus every derived setting of ``SETTINGS`` (values a run computes from its config: the rollout's
sampler, the explore recipe's layers, the evaluation protocol, ...). Settings of a part a run does not have
are not asked for: the explore copy's without one (the torch backend's only with that backend), the
evaluation EMA's when it evaluates the policy, a model's own settings (model.checkpoint, ...) on other models.

``resolve(cfg, setting)`` gives one run's value. The derived evaluation settings are computed by the functions
the trainer evaluates with (solbench.train.setup.eval_sampler, eval_resolution), so a row can only hold
what the run does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from solbench.config import RunConfig


def _method(cfg: RunConfig):
    from solbench.method import RunInfo, get_method, method_settings

    cls = get_method(cfg.method)
    return cls(method_settings(cfg.method, cfg.method_config).config,  # the typed Config expansion built
               RunInfo(prompts_per_iter=cfg.prompts_per_iter, steps=cfg.sampling.steps, shift=cfg.sampling.shift,
                       guidance=cfg.sampling.guidance, finetune_mode=cfg.finetune.mode, world_size=cfg.world_size))


def optimizer_steps_per_iteration(cfg: RunConfig) -> int:
    """Optimizer steps one iteration takes, as solbench.train.trainer.Trainer.optimize counts them."""
    mc = cfg.method_config
    trained = cfg.prompts_per_iter * mc.get("k", mc.get("group_size"))
    n_micro = -(-trained // mc["micro_batch_size"]) if mc.get("micro_batch_size") else 1
    if cfg.finetune.optimizer_steps is not None:
        return min(cfg.finetune.optimizer_steps, n_micro)
    return -(-n_micro // (cfg.finetune.grad_accum * cfg.world_size))


def _trained_timesteps(cfg: RunConfig) -> int:
    """Schedule points each trained sample is trained at per iteration (each method's chunks())."""
    mc, steps = cfg.method_config, cfg.sampling.steps
    if cfg.method == "dance_grpo":
        return max(1, int((steps - 1) * mc["timestep_fraction"]))
    if cfg.method == "awm":
        return mc["train_timesteps"]
    return max(1, int(steps * mc["timestep_fraction"]))


def _rollout_spec(cfg: RunConfig):
    method = _method(cfg)
    return method.sampler_spec() if hasattr(method, "sampler_spec") else method.rollout_spec()


def _text_max_length(cfg: RunConfig) -> int | None:
    if cfg.model.text_max_length is not None:
        return cfg.model.text_max_length
    from solbench.models import cards

    found = cards().get(cfg.model.name)
    return None if found is None else found.text_max_length  # the adapter's default (its model card's)


def _recipe(cfg: RunConfig):
    from solbench.quant import get_recipe

    return get_recipe(cfg.quant.recipe)


def _lora_init(cfg: RunConfig) -> str:
    from solbench.models import default_lora_init

    return cfg.finetune.lora_init or default_lora_init(cfg.model.name)


def _full_dtype(cfg: RunConfig) -> str | None:
    """The dtype of precision "full" on the run's device (None: device auto, decided by the machine)."""
    from solbench.models import resolve_full_dtype

    if cfg.device == "auto":
        return None
    return str(resolve_full_dtype(cfg.model.full_dtype, cfg.device)).removeprefix("torch.")


def _old_policy_decay(cfg: RunConfig) -> list[float] | None:
    mc = cfg.method_config
    for rate, cap in (("old_decay_rate", "old_decay_max"), ("slow_decay_rate", "slow_decay_max")):
        if rate in mc:
            return [mc[rate], mc[cap]]
    return None


def _eval_sampler(cfg: RunConfig):
    from solbench.train.setup import eval_sampler

    return eval_sampler(cfg)


def _eval_resolution(cfg: RunConfig) -> int | None:
    from solbench.train.setup import eval_resolution

    return eval_resolution(cfg)


# Settings that are not a dotted RunConfig path: name -> resolver of one run's value.
SETTINGS: dict[str, Callable[[RunConfig], Any]] = {
    "derived.text_max_length": _text_max_length,
    "derived.full_dtype": _full_dtype,
    "derived.group_size": lambda c: c.method_config.get("k", c.method_config.get("group_size")),
    "derived.candidates_per_prompt": lambda c: c.method_config.get("n", c.method_config.get("group_size")),
    "derived.rollout_sampler": lambda c: _rollout_spec(c).kind,
    "derived.rollout_guidance": lambda c: _rollout_spec(c).guidance,
    "derived.rollout_shift": lambda c: _rollout_spec(c).shift,  # None: the model scheduler's own
    "derived.lora_init": _lora_init,
    "derived.old_policy_decay": _old_policy_decay,
    "derived.kl_beta": lambda c: c.method_config.get("kl_beta", 0.0),
    "derived.clip_range": lambda c: c.method_config.get("clip_range"),
    "derived.trained_timesteps": _trained_timesteps,
    "derived.optimizer_steps_per_rollout": optimizer_steps_per_iteration,
    "derived.reward_weights": lambda c: sorted(c.rewards.values()),
    # the evaluation protocol, as solbench.train.trainer.Trainer.evaluate samples it
    "derived.eval_sampler": lambda c: _eval_sampler(c).kind,
    "derived.eval_guidance": lambda c: _eval_sampler(c).guidance,  # None: the model's default
    "derived.eval_shift": lambda c: _eval_sampler(c).shift,  # None: the model scheduler's own at that resolution
    "derived.eval_resolution": _eval_resolution,  # None: the model's native resolution
    "recipe.format": lambda c: _recipe(c).format,
    "recipe.activations": lambda c: _recipe(c).activations,
    "recipe.skip": lambda c: list(_recipe(c).skip),
    "recipe.min_dim": lambda c: _recipe(c).min_dim,
    "recipe.min_dim_exempt": lambda c: list(_recipe(c).min_dim_exempt),
}

# RunConfig paths that change no number a run computes: never a row, each with why.
NOT_RESULTS: dict[str, str] = {
    "experiment": "the experiment's name: where the results are written",
    "method": "the run's method: a row names its methods",
    "seed": "the run seed draws solbench's own noise streams (solbench.engine.noise), which no reference's RNG "
            "reproduces; the matrix's seeds are replicates, the same for every method",
    "model.gradient_checkpointing": "recomputes activations in the backward pass: memory, not numbers",
    "model.cpu_offload": "moves frozen parts between devices: memory, not numbers",
    "quant.allow_emulated_fallback": "false in every real spec: a run without the backend fails instead of "
                                     "computing anything else",
    "eval.grid_prompts": "which eval images the saved sample grid shows",
    "eval.explore_gap_every": "how often the harness measures the explore copy's error beside training "
                              "(solbench.train.explore_gap): extra rows, the training untouched",
    "micro_batch.rollout": "samples per sampling call: memory (bit-identical on CPU, summation order on GPU)",
    "micro_batch.reward": "images per reward-model call: memory",
    "micro_batch.train": "samples per training forward: memory (the optimizer steps are "
                         "derived.optimizer_steps_per_rollout)",
    "method_config.micro_batch_size": "micro_batch.train, written into the method's config",
    "checkpoint_every": "how often a run saves what it resumes from",
    "numerics.threads": "CPU intra-op threads: on CUDA they size only the CPU-side work, not the GPU's kernels",
    "model.compile": "torch.compile of the rollout forwards: the same computation fused (on GPU another "
                     "floating-point order, as micro-batches; the Sol-RL scripts compile theirs too)",
    "model.rollout_copy": "a rollout role's LoRA merged into a copy or applied as an adapter: the same function "
                          "(on GPU another rounding)",
}

# RunConfig paths whose effect the derived settings named here hold (their rows stand for them).
COVERED: dict[str, tuple[str, ...]] = {
    "rewards": ("derived.reward_weights",),  # which reward: the matrix axis; how many and their weights
    "model.text_max_length": ("derived.text_max_length",),
    "model.full_dtype": ("derived.full_dtype",),
    "finetune.lora_init": ("derived.lora_init",),
    "finetune.grad_accum": ("derived.optimizer_steps_per_rollout",),
    "finetune.optimizer_steps": ("derived.optimizer_steps_per_rollout",),
    "sampling.guidance": ("derived.rollout_guidance", "derived.eval_guidance"),
    "sampling.shift": ("derived.rollout_shift", "derived.eval_shift"),
    "eval.guidance": ("derived.eval_guidance",),
    "eval.resolution": ("derived.eval_resolution",),
    "eval.shift": ("derived.eval_shift",),
    "eval.sampler": ("derived.eval_sampler",),
    "method_config.group_size": ("derived.group_size",),
    "method_config.k": ("derived.group_size",),
    "method_config.n": ("derived.candidates_per_prompt",),
    "method_config.sampler": ("derived.rollout_sampler",),
    "method_config.shift": ("derived.rollout_shift",),  # DanceGRPO's own rollout shift
    "method_config.kl_beta": ("derived.kl_beta",),
    "method_config.clip_range": ("derived.clip_range",),
    "method_config.train_timesteps": ("derived.trained_timesteps",),
    "method_config.old_decay_rate": ("derived.old_policy_decay",),
    "method_config.old_decay_max": ("derived.old_policy_decay",),
    "method_config.slow_decay_rate": ("derived.old_policy_decay",),
    "method_config.slow_decay_max": ("derived.old_policy_decay",),
}

# Settings of a part only some runs have.
EXPLORE_ONLY = ("quant.recipe", "quant.backend") + tuple(s for s in SETTINGS if s.startswith("recipe."))
EMA_ONLY = ("finetune.ema_decay", "finetune.ema_every")
TORCH_BACKEND_ONLY = ("quant.fast_accum",)  # the torch backend's scaled GEMM (auto may pick it)

# The evaluation protocol: one value per model, whatever each method trains with (solbench.provenance.check
# fails a spec whose methods differ in any of these; the run seeds, which pick the eval noise, likewise).
PROTOCOL = ("derived.eval_guidance", "derived.eval_resolution", "sampling.eval_steps", "derived.eval_sampler",
            "derived.eval_shift", "eval.prompts", "eval.n_prompts", "eval.seeds_per_prompt", "eval.rewards",
            "eval.every")


def _leaves(node: Any, prefix: str) -> list[str]:
    if dataclasses.is_dataclass(node):
        return [leaf for f in dataclasses.fields(node) for leaf in _leaves(getattr(node, f.name), f"{prefix}{f.name}.")]
    path = prefix.rstrip(".")
    if path == "method_config":
        return [f"method_config.{key}" for key in node]
    return [path]


def run_settings(cfg: RunConfig) -> list[str]:
    """Every setting of ``cfg`` that changes what it computes, by enumeration (module docstring)."""
    from solbench.models import OPTIONAL_SETTINGS, setting_models

    explore = "explore" in _method(cfg).nets
    out: list[str] = []
    for path in _leaves(cfg, ""):
        if path in NOT_RESULTS:
            continue
        if path.startswith("model.") and path[len("model."):] in OPTIONAL_SETTINGS \
                and cfg.model.name not in setting_models(path[len("model."):]):
            continue
        out += COVERED.get(path, (path,))
    out += SETTINGS
    skip = set(() if explore else EXPLORE_ONLY) | set(() if cfg.eval.use_ema else EMA_ONLY)
    skip |= set(() if explore and cfg.quant.backend in ("torch", "auto") else TORCH_BACKEND_ONLY)
    return [s for s in dict.fromkeys(out) if s not in skip]


def resolve(cfg: RunConfig, setting: str) -> Any:
    """The value of ``setting`` in one resolved run (a SETTINGS name or a dotted RunConfig path such as
    ``finetune.lr`` or ``method_config.kl_beta``); KeyError for a path the run does not have."""
    if setting in SETTINGS:
        return SETTINGS[setting](cfg)
    node: Any = cfg
    for part in setting.split("."):
        if isinstance(node, Mapping):
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        else:
            raise KeyError(setting)
    return list(node) if isinstance(node, tuple) else node


# Settings compared after a normalisation of both sides. LoRA targets are a set of PEFT name suffixes; the
# references write FLUX's and SD3's attention projections as attn.<name> (flow_grpo, AWM) or <name> (Sol-RL),
# which select the same layers there (every attention projection of both models sits in a module named attn).
# Skip names: the reference keeps a layer when a name is a substring of its qualified name; solbench's
# recipes write the same names as globs (*name* for a substring; FLUX's names as bare module names, which
# select the same layers there), so both sides are compared without their '*'.
NORMALISE: dict[str, Callable[[Any], Any]] = {
    "finetune.lora_targets": lambda targets: targets if targets is None else sorted(
        str(t).removeprefix("attn.") for t in targets),
    "recipe.skip": lambda names: names if names is None else [str(n).strip("*") for n in names],
}


def same(a: Any, b: Any) -> bool:
    """Equality of YAML values and resolved settings: numbers by value (1 == 1.0, relative 1e-12), lists
    and tuples alike, dicts key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    return a == b
