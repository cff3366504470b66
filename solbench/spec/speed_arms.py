"""Which run configurations a spec's ``speed:`` block times: one per arm (solbench.spec.models.SpeedBlock.arms).

An arm is a method of the spec, timed with the config of its main run (solbench.spec.fidelity_plan.arm_runs: the
arm Table 5's Findings compare, its lowest seed), or a mapping (``SpeedArm``) naming the method's arm and
settings changed by dotted key, so that an arm no training run has (Sol-RL exploring in full precision,
``{name: sol_rl_fp_preview, method: sol_rl, set: {quant.recipe: none}}``) is one more entry. Each arm is timed
in each ``sampling`` variant: ``eager`` (model.compile off) and ``compiled`` (model.compile on: inductor), as
arms of their own, every arm built alike. Nothing here runs anything: the block's runner is solbench.speed.block.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from solbench.config import RunConfig
from solbench.errors import ConfigError

#: model.compile of each sampling variant
VARIANTS = {"eager": "off", "compiled": "on"}


@dataclass(frozen=True)
class Arm:
    """One timed arm: its label, the sampling variant and the resolved config it trains with."""

    name: str
    variant: str
    config: RunConfig

    @property
    def key(self) -> str:
        """The arm's folder and row label: its name, with the variant where it is not eager."""
        return self.name if self.variant == "eager" else f"{self.name}@{self.variant}"


def entry_name(entry) -> str:
    return entry if isinstance(entry, str) else entry.name


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    target = data
    for part in parts[:-1]:
        if not isinstance(target.get(part), dict):
            raise KeyError(key)
        target = target[part]
    if parts[-1] not in target:
        raise KeyError(key)
    target[parts[-1]] = value


def arm_config(runs: list, entry) -> RunConfig:
    """The RunConfig an entry times (ConfigError naming what is wrong): its method's main run, its ``set`` applied."""
    from solbench.spec.fidelity_plan import arm_runs

    method = entry if isinstance(entry, str) else entry.method
    arm = arm_runs(runs, method, None if isinstance(entry, str) else entry.iterations)
    if not arm:
        methods = ", ".join(sorted({r.config.method for r in runs}))
        raise ConfigError(f"{method!r} is no method of the spec's runs ({methods})")
    cfg = arm[0].config
    if isinstance(entry, str) or not entry.set:
        return cfg
    data = cfg.to_dict()
    for key, value in entry.set.items():
        if key in ("method", "experiment", "seed"):
            raise ConfigError(f"set.{key}: an arm keeps its method, experiment and seed")
        try:
            _set_dotted(data, key, value)
        except KeyError:
            raise ConfigError(f"set.{key}: no such run setting (a dotted key of the run config, e.g. quant.recipe)") \
                from None
    if "quant.recipe" in entry.set and "quant.backend" not in entry.set:
        # another explore copy takes backend auto as the resolver writes it out here (the run's backend, cpu_bf16 say,
        # may not run it: recipe none's copy quantizes nothing and resolves to emulation)
        from solbench.method import get_method
        from solbench.quant.backends import resolve_on_cpu

        data["quant"].update(backend="auto", allow_emulated_fallback=True)
        resolve_on_cpu(data["quant"], data["device"], data["model"]["name"],
                       explores="explore" in get_method(data["method"]).nets)
    return RunConfig.from_dict(json.loads(json.dumps(data)))


def block_arms(runs: list, block) -> list[Arm]:
    """Every (arm, sampling variant) the block times, in the block's order, variants outer."""
    configs = [(entry_name(e), arm_config(runs, e)) for e in block.arms]
    out = []
    for variant in block.sampling:
        for name, cfg in configs:
            model = dataclasses.replace(cfg.model, compile=VARIANTS[variant])
            out.append(Arm(name, variant, dataclasses.replace(cfg, model=model)))
    return out


def round_order(arms: list, index: int) -> list:
    """The order the arms run in round ``index`` (0-based): the block's order rotated by ``index``, so that each
    arm runs first, second, ... in turn and no arm always follows the same one's cache and clock state."""
    if not arms:
        return []
    shift = index % len(arms)
    return list(arms[shift:]) + list(arms[:shift])
