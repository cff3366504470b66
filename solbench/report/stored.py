"""The facts recorded with the results (solbench.results.stored_facts), as the report reads them, and what it says when
results predate them.

The report computes nothing from code: the share of a forward a recipe quantizes, a recipe's format, a model's
default explore recipe, the eval grid's prompts and the paper models' FLOPs, text tokens and trained timesteps
are columns of runs.parquet and the table paper_model_facts.parquet, written by the runs and by ``solbench
collect``. Results collected before that lack them: the header carries one line naming the command that brings
them up to date (``stale_facts_warnings``) and each section that needs a fact says it is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from solbench.results.stored_facts import FACTS_SCHEMA, PAPER_MODEL_FACTS, SCHEMA_COLUMN


def collect_command(spec_arg: str = "SPEC") -> str:
    return f"`solbench collect {spec_arg}`"


def missing(what: str, spec_arg: str = "SPEC") -> str:
    """The sentence a section gives for a fact the collected tables lack."""
    return (f"The collected tables lack {what} (these results were collected before solbench recorded it with "
            f"them); {collect_command(spec_arg)} brings them up to date.")


def current(frame: pd.DataFrame) -> pd.Series:
    """Per row of a collected table: whether it carries the facts of this schema."""
    if SCHEMA_COLUMN not in frame:
        return pd.Series(False, index=frame.index)
    return pd.to_numeric(frame[SCHEMA_COLUMN], errors="coerce").fillna(-1) >= FACTS_SCHEMA


def paper_model_facts(tables) -> pd.DataFrame | None:
    """The paper models' facts collected with these results (one row per model), or None when they lack them."""
    return None if tables.results_dir is None else paper_model_facts_in(Path(tables.results_dir))


def paper_model_facts_in(results_dir: Path) -> pd.DataFrame | None:
    path = results_dir / f"{PAPER_MODEL_FACTS}.parquet"
    if not path.is_file():
        return None
    frame = pd.read_parquet(path)
    if frame.empty or not current(frame).all():
        return None
    return frame


def run_fact(runs: pd.DataFrame, column: str) -> pd.Series:
    """A fact column of ``runs`` (NaN where a run lacks it, or predates the facts)."""
    if column not in runs:
        return pd.Series(float("nan"), index=runs.index, dtype=object)
    return runs[column].where(current(runs))


def default_explore_recipe(tables, model: str) -> str | None:
    """The default explore recipe of ``model`` as its runs recorded it (None when none did)."""
    runs = pd.concat([tables.done_runs, tables.fidelity_runs])
    values = run_fact(runs[runs["model"].astype(str) == str(model)], "fact_default_explore_recipe").dropna()
    return str(values.iloc[0]) if len(values) else None


def stale_facts_warnings(results_dir: Path, spec_arg: str = "SPEC") -> list[str]:
    """One line when the collected tables lack the facts of this schema (runs collected before them), naming
    the command that brings them up to date; none when they have them."""
    lacking = []
    runs = Path(results_dir) / "runs.parquet"
    if runs.is_file():
        try:
            frame = pd.read_parquet(runs, columns=["run_id", SCHEMA_COLUMN])
        except Exception:  # noqa: BLE001 - no such column (pyarrow and pandas raise several types)
            frame = pd.DataFrame(columns=["run_id"])
        stale = int((~current(frame)).sum())
        if stale:
            lacking.append(f"runs.parquet has {stale} run(s) without them")
    if paper_model_facts_in(Path(results_dir)) is None:
        lacking.append(f"{PAPER_MODEL_FACTS}.parquet is missing or older")
    if not lacking:
        return []
    return [f"These results were collected before solbench recorded the facts its report reads from them "
            f"(schema {FACTS_SCHEMA}: {'; '.join(lacking)}): {collect_command(spec_arg)} brings them up to date; until "
            "then the sections that need them say what is missing."]


def uncollected_runs_warnings(results_dir: Path, collected: set[str], spec_arg: str = "SPEC") -> list[str]:
    """The runs the last collect was asked for (a spec's runs, recorded in collect_report.json) that the collected
    tables lack, in one line; none when collect was not given a spec."""
    try:
        wanted = json.loads((Path(results_dir) / "collect_report.json").read_text()).get("spec_runs") or []
    except (OSError, ValueError, AttributeError):
        wanted = []
    absent = [r for r in wanted if r not in collected]
    if not absent:
        return []
    return [f"Built from {len(wanted) - len(absent)} of the spec's {len(wanted)} runs: {', '.join(absent)} were "
            f"not collected (`solbench run {spec_arg}` runs what is missing, then collects)."]
