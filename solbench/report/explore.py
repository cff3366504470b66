"""What ran in low precision: the explore format, recipe and backend behind a fidelity or speed number.

A number measured on an explore copy means little without the copy: NVFP4 at FLUX's coverage (every block
Linear) and at SANA's (attention in full precision) rank seeds differently, FP8 is not FP4, and an emulated
backend (fake quantization in full precision, what CPU runs use) says nothing about FP4 hardware. Every
fidelity and speed number of a report names them (issue 41, item 5), from the runs' own settings
(``p_quant.recipe``, ``p_quant.backend``), the recipe's format recorded with them (``fact_explore_format``,
solbench.results.stored_facts) and, where a fidelity run measured it, the share of the linear multiply-accumulates its
copy ran in low precision (``p_quant.mac_share``). A backend's words and whether it computes on low-precision units
are the runs' own record too (``fact_quant_backends``, from solbench.quant.registry where the run or collect ran):
this module never asks the registry (``stored_backends``).
"""

from __future__ import annotations

import json
import math

import pandas as pd

from solbench.report.stored import run_fact
from solbench.results.stored_facts import BACKENDS_FACT

FORMAT_NAMES = {"none": "step budget only (full precision)", "nvfp4": "NVFP4", "mxfp4": "MXFP4", "fp8": "FP8",
                "fp8_e5m2": "FP8 (E5M2, per tensor)"}
# Results collected before the runs recorded their backends (no ``fact_quant_backends`` column, or runs that predate
# the facts): the backends' words and low-precision units as they were when that fact was added (the four built-in
# backends and auto). Newer results carry them per run (``stored_backends``), a backend registered since included.
_OLDER_RESULTS_BACKENDS = {
    "emulated": {"label": "emulated backend (fake-quantized in full precision)", "low_precision": False},
    "te": {"label": "TransformerEngine backend", "low_precision": True},
    "torch": {"label": "torch scaled-matmul backend", "low_precision": True},
    "cpu_bf16": {"label": "cpu_bf16 backend (the format's values on the CPU's bf16 units)", "low_precision": True},
    "auto": {"label": "backend auto (each run's choice in its explore.json)", "low_precision": None},
}


def stored_backends(runs: pd.DataFrame | None) -> dict[str, dict]:
    """{backend: {"label", "low_precision"}} as ``runs`` recorded them (``fact_quant_backends``: the registry where
    each run started or was collected); a name none of them recorded (results collected before the fact) keeps the
    older results' words (``_OLDER_RESULTS_BACKENDS``)."""
    backends = {name: dict(record) for name, record in _OLDER_RESULTS_BACKENDS.items()}
    if runs is None or BACKENDS_FACT not in runs:
        return backends
    for value in run_fact(runs, BACKENDS_FACT).dropna().unique():
        try:
            recorded = json.loads(value)
        except (TypeError, ValueError):
            continue  # an unreadable record: the older words stand
        if isinstance(recorded, dict):
            backends.update({str(k): v for k, v in recorded.items() if isinstance(v, dict) and v.get("label")})
    return backends


def low_precision_backends(runs: pd.DataFrame | None) -> set[str]:
    """The backends whose explore copy computes on low-precision units, as ``runs`` recorded them (a clock of theirs
    speaks to the method's speed)."""
    return {name for name, record in stored_backends(runs).items() if record.get("low_precision")}


def recipe_format(recipe: str, fmt: str | None = None) -> str:
    """'NVFP4', 'MXFP4', 'FP8', ... of a quantization recipe: its ``fmt`` as recorded with the runs
    (``recipe_formats``); without one, the format its name starts with, else the name itself."""
    recipe = str(recipe)
    if recipe == "none":
        return FORMAT_NAMES["none"]
    if fmt is None or (isinstance(fmt, float) and math.isnan(fmt)):
        fmt = next((prefix for prefix in ("nvfp4", "mxfp4", "fp8") if recipe.startswith(prefix)), recipe)
    return FORMAT_NAMES.get(str(fmt), str(fmt))


def recipe_label(recipe: str, fmt: str | None = None) -> str:
    """'NVFP4 (nvfp4_tiny)', 'step budget only (full precision)', ... for a quantization recipe name and its
    recorded format ``fmt`` (``recipe_formats``)."""
    recipe = str(recipe)
    if recipe == "none":
        return FORMAT_NAMES["none"]
    fmt = recipe_format(recipe, fmt)
    return f"{fmt} ({recipe})" if fmt != recipe else recipe


def recipe_formats(runs: pd.DataFrame) -> dict[str, str]:
    """{recipe: format} as the runs recorded them (``fact_explore_format``); recipes without one are absent."""
    if "p_quant.recipe" not in runs:
        return {}
    formats = pd.DataFrame({"recipe": runs["p_quant.recipe"].astype(str), "fmt": run_fact(runs, "fact_explore_format")})
    return {str(r): str(f) for r, f in formats.dropna().drop_duplicates("recipe").itertuples(index=False)}


def backend_label(backend, backends: dict[str, dict] | None = None) -> str:
    """A backend in words, from ``backends`` (``stored_backends`` of the runs it ran in; None: the older results')."""
    if backend is None or (isinstance(backend, float) and math.isnan(backend)):
        return "backend not recorded"
    record = (stored_backends(None) if backends is None else backends).get(str(backend))
    return record["label"] if record else f"{backend} backend"


def _values(runs: pd.DataFrame, column: str) -> list[str]:
    if column not in runs:
        return []
    return sorted({str(v) for v in runs[column].dropna()})


def explore_text(runs: pd.DataFrame, *, with_share: pd.DataFrame | None = None) -> str:
    """The explore copies of ``runs`` in words: "NVFP4 (nvfp4_tiny_flux), emulated backend (fake-quantized in
    full precision)"; several recipes or backends are each named. ``with_share``: fidelity runs whose measured
    low-precision share of the linear MACs is added per recipe."""
    recipes, backends = _values(runs, "p_quant.recipe"), _values(runs, "p_quant.backend")
    if not recipes:
        return "explore recipe not recorded"
    parts, formats = [], recipe_formats(runs)
    for recipe in recipes:
        text = recipe_label(recipe, formats.get(recipe))
        share = mac_share_text(with_share, recipe) if with_share is not None else ""
        parts.append(text + (f", {share}" if share else ""))
    if all(recipe == "none" for recipe in recipes):  # nothing ran in low precision: no backend to name
        return "; ".join(parts)
    words = stored_backends(runs)
    return "; ".join(parts) + ", " + (" / ".join(backend_label(b, words) for b in backends) or backend_label(None))


def mac_share_text(fidelity_runs: pd.DataFrame, recipe: str) -> str:
    """'99.5 % of the linear MACs in low precision (41 of 48 Linears)', as the fidelity runs of ``recipe``
    measured it when they built the copy; '' when none did (or they disagree)."""
    if fidelity_runs is None or fidelity_runs.empty or "p_quant.mac_share" not in fidelity_runs:
        return ""
    mine = fidelity_runs[fidelity_runs.get("p_quant.recipe", pd.Series(dtype=object)).astype(str) == str(recipe)]
    shares = pd.to_numeric(mine["p_quant.mac_share"], errors="coerce").dropna().unique()
    if len(shares) != 1:
        return ""
    layers = ""
    if {"p_quant.quantized_linears", "p_quant.linears"} <= set(mine.columns):
        q = pd.to_numeric(mine["p_quant.quantized_linears"], errors="coerce").dropna().unique()
        n = pd.to_numeric(mine["p_quant.linears"], errors="coerce").dropna().unique()
        if len(q) == 1 and len(n) == 1:
            layers = f" ({int(q[0])} of {int(n[0])} Linears)"
    return f"{100 * shares[0]:.1f} % of the linear MACs in low precision{layers}"


def explore_backends(runs: pd.DataFrame) -> set[str]:
    """The backends the explore copies of ``runs`` computed on: each run's resolved choice (``explore_backend``,
    from its explore.json) where recorded, else its spec's ``p_quant.backend``."""
    out = set()
    for _, row in runs.iterrows():
        value = row.get("explore_backend")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            value = row.get("p_quant.backend")
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out.add(str(value))
    return out


def on_low_precision_units(runs: pd.DataFrame) -> bool:
    """Whether every explore copy of ``runs`` computed on low-precision units (as the runs recorded their backends:
    ``low_precision_backends``)."""
    backends = explore_backends(runs)
    return bool(backends) and backends <= low_precision_backends(runs)


def explore_runs(tables) -> pd.DataFrame:
    """The done training runs that ran an explore stage (timing rows at precision 'explore')."""
    t = tables.timings
    ids = set(t.loc[t["precision"] == "explore", "run_id"]) if "precision" in t else set()
    return tables.done_runs[tables.done_runs["run_id"].isin(ids)]
