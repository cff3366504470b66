"""One run's facts a report needs from code, computed where code may run: by the trainer when the run starts (its
``FACTS_FILE``, facts.json) and by ``solbench collect`` (solbench.collect.facts) from a run's resolved config
(spec.json) for runs that predate them; solbench.results.stored_facts names them and their schema.

``run_facts(spec, explores=...)``: one run's facts (the quantized share of its explore forward, its recipe's
format, its model's default explore recipe, its eval grid's prompts); never raises: what cannot be computed here is
left empty and said in ``fact_notes``.
"""

from __future__ import annotations

import json
from typing import Any

from solbench.results.stored_facts import BACKENDS_FACT, FACTS_SCHEMA, RUN_FACTS, SCHEMA_COLUMN

FACTS_FILE = "facts.json"


def run_facts(spec: dict, *, explores: bool) -> dict[str, Any]:
    """The RUN_FACTS of one run from its resolved config (spec.json's mapping); ``explores``: whether the run
    has an explore stage (only then is the share of its explore forward counted)."""
    model = spec.get("model") or {}
    quant = spec.get("quant") or {}
    name = str(model.get("name") or "tiny")
    recipe = quant.get("recipe")
    notes: list[str] = []
    facts: dict[str, Any] = {SCHEMA_COLUMN: FACTS_SCHEMA, **{column: None for column in RUN_FACTS}}

    def attempt(what: str, compute):
        try:
            return compute()
        except Exception as err:  # noqa: BLE001 - a fact this machine cannot compute is said, not fatal
            notes.append(f"{what}: {type(err).__name__}: {err}")
            return None

    if recipe is None:
        from solbench.config import QuantConfig

        recipe = QuantConfig().recipe
    recipe = str(recipe)
    if explores:
        facts["fact_quantized_share"] = attempt("quantized share", lambda: _quantized_share(name, recipe, model))
    facts["fact_explore_format"] = attempt("explore format", lambda: _recipe_format(recipe))
    from solbench.models import DEFAULT_EXPLORE_RECIPES

    facts["fact_default_explore_recipe"] = DEFAULT_EXPLORE_RECIPES.get(name)
    facts[BACKENDS_FACT] = attempt("quant backends", quant_backends_fact)
    facts.update(attempt("method", lambda: method_facts(spec.get("method"))) or {})
    grid = attempt("eval grid prompts", lambda: _grid(spec.get("eval") or {}))
    if grid is not None:
        facts["fact_eval_grid_prompts"] = json.dumps(grid[0])
        facts["fact_eval_grid_columns"] = grid[1]
    facts["fact_notes"] = "; ".join(notes)
    return facts


def method_facts(method: str | None) -> dict[str, Any]:
    """The METHOD_FACTS of a run of ``method``: its display name and rollout phases, as the method declares them
    (none for a run of no registered method, e.g. a fidelity measurement)."""
    from solbench.method import get_method, method_names

    if str(method or "sol_rl") not in method_names():
        return {}
    cls = get_method(str(method or "sol_rl"))
    return {"fact_method_display": cls.shown_name(), "fact_rollout_phases": json.dumps(sorted(cls.rollout_phases()))}


def quant_backends_fact() -> str:
    """``fact_quant_backends``: every registered quantization backend's label and low-precision flag, and auto's
    words, as JSON (solbench.quant.registry; the report reads them from here, never from the registry)."""
    from solbench.quant import registry

    backends = {name: registry.get_backend(name).record() for name in registry.backend_names()}
    backends[registry.AUTO] = {"label": registry.AUTO_LABEL, "low_precision": None}
    return json.dumps(backends, sort_keys=True)


def _quantized_share(model: str, recipe: str, settings: dict) -> float:
    """solbench.models.shares' share on TransformerEngine's backend (the hardware a projection prices), at the
    run's resolution, weights and text length (a real model's prompts at model.text_max_length)."""
    from solbench.models.shares import precision_split, run_text_tokens

    resolution, length, path = settings.get("resolution"), settings.get("text_max_length"), settings.get("path")
    if model == "tiny" and path in ("pretrained", "random"):  # the shipped architecture (solbench.models._build_tiny)
        path = None
    split = precision_split(model, recipe, resolution=int(resolution) if resolution else None, path=path, backend="te",
                            text_tokens=run_text_tokens(model, int(length) if length else None))
    return float(split.quantized_share)


def _recipe_format(recipe: str) -> str:
    if recipe == "none":  # the full-precision explore twin: nothing in low precision
        return "none"
    from solbench.quant import get_recipe

    return str(get_recipe(recipe).format)


def _grid(settings: dict) -> tuple[list[str], int] | None:
    """(row prompt texts, columns) of the run's eval grid: the first ``grid_prompts`` of the first ``n_prompts``
    prompts of the eval set, ``seeds_per_prompt`` columns (the rule of grids saved without their JSON)."""
    from solbench.config import EvalConfig

    defaults = EvalConfig()
    if not settings.get("prompts"):
        return None
    from solbench.world.prompts import load_prompt_set

    records = load_prompt_set(settings["prompts"])
    if settings.get("n_prompts"):
        records = records[: int(settings["n_prompts"])]
    def setting(name: str) -> int:
        value = settings.get(name)
        return int(getattr(defaults, name) if value is None else value)

    rows = min(setting("grid_prompts"), len(records))
    return [r.text for r in records[:rows]], setting("seeds_per_prompt")
