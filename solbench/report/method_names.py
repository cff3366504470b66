"""Methods as the report names and orders them: the display name each run recorded for its method
(``fact_method_display``, Method.display_name), else, for results collected before runs recorded it, the built-in
methods' table here (also the report's aliases: "nft", "naive BF16"), and the paper's order of its tables (Base,
DanceGRPO, FlowGRPO, AWM, DiffusionNFT, Sol-RL, the controls, then any other method).

Split from solbench/report/tables.py (the collected tables), which re-exports these names. The report never imports
a method: what it knows of one is what the runs stored.
"""

from __future__ import annotations

import re

import pandas as pd

# The order of the paper's tables and, for results collected before each run recorded its method's display name
# (fact_method_display), the built-in methods' display names (a fallback, and the report's aliases: "nft", "naive
# BF16"); keys are normalised (lower case, alphanumerics). The report never imports a method.
_METHODS: list[tuple[tuple[str, ...], str]] = [
    (("base",), "Base"),
    (("dancegrpo", "dance"), "DanceGRPO"),
    (("flowgrpo", "grpo"), "FlowGRPO"),
    (("awm",), "AWM"),
    (("diffusionnft", "nft"), "DiffusionNFT"),
    (("solrl", "sol"), "Sol-RL"),
    (("naivebf16", "naivebf16scaling", "naivescaling", "naive"), "naive BF16 scaling"),
    (("naivefp4",), "naive FP4"),
]
_ALIASES = {alias: display for aliases, display in _METHODS for alias in aliases}
_ORDER = {display: i for i, (_, display) in enumerate(_METHODS)}
#: Method registry name -> display name as the loaded results recorded it (fact_method_display; Tables.load).
_RECORDED: dict[str, str] = {}
METHOD_DISPLAY_FACT = "fact_method_display"
ROLLOUT_PHASES_FACT = "fact_rollout_phases"

def normalise_method(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def method_display(name: str) -> str:
    """Display name of a method registry name: the one its runs recorded (fact_method_display), else the built-in
    table's (results collected before runs recorded it, and the report's aliases); unknown names as given."""
    return _RECORDED.get(str(name)) or _ALIASES.get(normalise_method(name), str(name))


def _remember_display_names(runs: pd.DataFrame) -> None:
    """Note the display names the runs recorded for their methods (those of the current facts schema)."""
    from solbench.report.stored import run_fact

    if METHOD_DISPLAY_FACT not in runs or "method" not in runs:
        return
    recorded = run_fact(runs, METHOD_DISPLAY_FACT)
    for method, display in zip(runs["method"], recorded):
        if isinstance(display, str) and display:
            _RECORDED[str(method)] = display


def method_rank(name: str) -> int:
    return _ORDER.get(method_display(name), len(_ORDER))


def same_method(a: str, b: str) -> bool:
    """Whether two spellings name the same method (``diffusion_nft`` == ``DiffusionNFT`` == ``nft``)."""
    return method_display(a) == method_display(b)
