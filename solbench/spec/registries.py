"""The registries a spec is checked against: models, rewards, quantization recipes and prompt sets.

Each is read from its part of solbench when that part is importable (``None``: not checkable here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from solbench.errors import ConfigError


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
    """Prompt sets given as files (.txt/.jsonl paths): decoded at expansion where they are on this machine; one
    that is not is named by `solbench expand` (with the command that fetches it: ``fetch_hint``) and refused by
    `solbench run` (ExperimentSpec.missing_files) and at launch."""
    return name.endswith((".txt", ".jsonl")) or "/" in name and not name.startswith("shapes/")


#: The prompt files the shipped real-model specs name, and the command that fetches each (docs/real-models.md,
#: "Prompt sets": FlowGRPO's PickScore split).
FETCH_COMMANDS = {
    f"data/pickscore/{split}.txt": (f"mkdir -p data/pickscore && curl -fL -o data/pickscore/{split}.txt https://"
                                    f"raw.githubusercontent.com/yifan123/flow_grpo/main/dataset/pickscore/{split}.txt")
    for split in ("train", "test")
}


def fetch_hint(name: str) -> str:
    """How to get prompt file ``name``: the command that fetches it where it is one the shipped specs name, else
    where the formats are described."""
    command = FETCH_COMMANDS.get(name)
    if command:
        return f"fetch it with `{command}` (docs/real-models.md, 'Prompt sets')"
    return "experiments/README.md, 'Prompt sets', says what a prompt file holds"


#: The rewards that score only prompts of the shapes grammar (solbench.rewards.shapes: the detector parses each
#: prompt): a prompt file a run scores with one of them is parsed at expansion, not in the run's worker.
GRAMMAR_REWARDS = ("shapes_geneval", "shapes_geneval_strict")
