"""Short arm labels for the report's first pages, and the one table that maps each label to its full settings.

An arm's full label (``Tables.runs["arm"]``) names every setting that varies among its method's runs:
"Sol-RL (recipe=nvfp4_tiny_flux, explore_steps=6, k=4, n=16, selection=best_worst, iterations=32,
backend=cpu_bf16)". The short label names only the settings where the arm differs from its method's usual
value (the value most of the method's arms have): "Sol-RL 32 it", "Sol-RL N=8", "naive FP4 mxfp4_w4a4". The
backend is named only where two arms would otherwise share a label (it follows from the recipe and the machine).
Labels are unique over the report; an arm whose short label would collide keeps its full label.
"""

from __future__ import annotations

import pandas as pd

from solbench.report.findings_common import EXPLORING_METHODS
from solbench.report.tables import (HORIZON, Tables, _checkpoint_label, _fmt_setting, _hashable, _short_setting,
                                    same_method)

_BACKEND = "p_quant.backend"
_EXPLORE_COPY = ("p_quant.recipe", _BACKEND)


def _part(column: str, value) -> str:
    """One setting in a few characters: N=8, K=2, 2 explore steps, 32 it, the recipe or mode by its name."""
    text = _fmt_setting(value)
    name = _short_setting(column)
    if column == HORIZON:
        return f"{text} it"
    if name in ("n", "k"):
        return f"{name.upper()}={text}"
    if name == "explore_steps":
        return f"{text} explore steps"
    if name in ("recipe", "selection", "backend"):
        return text
    return f"{name}={text}"


def _usual(values: pd.Series):
    """The value most arms have, or None where two values tie (then every arm names its own)."""
    counts = values.value_counts(dropna=False)
    if len(counts) > 1 and counts.iloc[0] == counts.iloc[1]:
        return None
    return counts.index[0]


def short_labels(tables: Tables) -> dict[str, str]:
    """{full arm label: short label} for every arm of the results (training and fidelity runs)."""
    runs = tables.runs
    settings = tables.setting_columns()
    labels: dict[str, str] = {}
    for (_model, _method), group in runs.groupby(["model", "method"], sort=False):
        arms = group.drop_duplicates("arm").set_index("arm")
        varying = [c for c in settings if c in arms and arms[c].map(_hashable).nunique(dropna=False) > 1]
        usual = {c: _usual(arms[c].map(_hashable)) for c in varying}
        checkpoint = [c for c in varying if c.startswith("p_checkpoint.")]

        def parts(arm: str, with_backend: bool) -> list[str]:
            run = arms.loc[arm]
            out = [_checkpoint_label(run, runs)] if checkpoint else []
            for c in varying:
                if c.startswith("p_checkpoint.") or (c == _BACKEND and not with_backend):
                    continue
                value = _hashable(run[c])
                if value != usual[c] or usual[c] is None:
                    out.append(_part(c, value))
            return out

        for with_backend in (False, True):
            chosen = {arm: " ".join([str(arms.loc[arm, "method_display"]), *parts(arm, with_backend)])
                      for arm in arms.index}
            if len(set(chosen.values())) == len(chosen):
                break
        labels.update(chosen)
    seen: dict[str, int] = {}
    for short in labels.values():
        seen[short] = seen.get(short, 0) + 1
    return {arm: (short if seen[short] == 1 else arm) for arm, short in labels.items()}


def arm_settings(tables: Tables) -> pd.DataFrame:
    """One row per arm: its short label, method, run seeds, every setting that tells arms apart, its full label."""
    labels = short_labels(tables)
    runs = tables.runs
    settings = tables.setting_columns()
    fidelity = set(tables.fidelity_runs["run_id"])
    rows = []
    for arm in tables.arm_order():
        mine = runs[runs["arm"] == arm]
        first = mine.iloc[0]
        measured = first["run_id"] in fidelity  # a fidelity run has a checkpoint (the base model's or a run's)
        row = {"label": labels.get(arm, arm), "method": first["method_display"], "model": first["model"],
               "run seeds": int(mine["seed"].nunique()), "runs": len(mine)}
        for c in settings:
            if c.startswith("p_checkpoint."):
                row.setdefault("checkpoint", _checkpoint_label(first, runs) if measured else "-")
                continue
            value = _hashable(first[c]) if c in mine else None
            if c in _EXPLORE_COPY and not (measured or any(same_method(first["method"], m) for m in EXPLORING_METHODS)):
                value = None  # a method that samples in full precision only records a recipe it never uses
            row[_short_setting(c)] = "-" if value is None else _fmt_setting(value)
        row["full label"] = arm
        rows.append(row)
    return pd.DataFrame(rows)


def relabel(text: str, labels: dict[str, str]) -> str:
    """``text`` with every full arm label replaced by its short label (the longest first, so that no label is
    replaced inside a longer one)."""
    for arm in sorted(labels, key=len, reverse=True):
        if labels[arm] != arm:
            text = text.replace(arm, labels[arm])
    return text
