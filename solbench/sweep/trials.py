"""The trials table of a sweep: one row per Optuna trial, written as ``sweep/trials.parquet``.

``export_trials`` rewrites it after every finished trial (number, state, value, ``params_<name>``, run_id,
...; for reward_and_time studies also ``value_time`` and the Pareto front), and the report's N x K heat
map reads it (solbench/report/sweep_io.py). A trial is a cell of R seed runs: ``run_ids``, ``seeds`` and
``seed_values`` hold them ("; "-separated, seed order), ``lo``/``hi``/``covers`` the cell's interval and
``seconds_per_iter`` the mean over its seeds of the MEASURED training seconds per iteration (``clock`` says which
clock). ``counted`` says which trials count towards ``sweep.trials``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from solbench.results import atomic_write_bytes
from solbench.sweep.study import STUDY_ATTR

TRIALS_FILE = "trials.parquet"


def counted(trial) -> bool:
    """Whether a trial counts towards ``sweep.trials`` (finished, and not an invalid combination)."""
    return trial.state.is_finished() and not trial.user_attrs.get("invalid")


def trials_frame(study, param_names: Sequence[str] = ()):
    """One row per trial: number, state, value, params_<name>, run_id, reason, steps, timing."""
    import pandas as pd

    multi = len(study.directions) > 1
    direction = ",".join("minimize" if d.name == "MINIMIZE" else "maximize" for d in study.directions)
    front = {t.number for t in study.best_trials} if multi else set()
    rows = []
    names = list(dict.fromkeys([*param_names, *(p for t in study.trials for p in t.params)]))
    for trial in study.get_trials(deepcopy=False):
        values = trial.values or []
        row: dict[str, Any] = {"number": trial.number, "state": trial.state.name,
                               "value": values[0] if values else math.nan}
        if multi:  # reward_and_time: the second value and Optuna's Pareto front
            row.update(value_time=values[1] if len(values) > 1 else math.nan, pareto=trial.number in front)
        for name in names:
            row[f"params_{name}"] = trial.params.get(name)
        attrs = trial.user_attrs
        steps = sorted(trial.intermediate_values)
        seconds = [v for v in attrs.get("seed_seconds_per_iter") or () if v is not None]
        interval = attrs.get("interval") or (math.nan, math.nan)
        row.update(run_ids=_joined(attrs.get("run_ids") or ([attrs["run_id"]] if attrs.get("run_id") else [])),
                   seeds=_joined(attrs.get("seeds") or ()), seed_values=_joined(attrs.get("seed_values") or ()),
                   lo=_num(interval[0]), hi=_num(interval[1]), covers=attrs.get("covers"),
                   seconds_per_iter=sum(seconds) / len(seconds) if seconds else math.nan, clock=attrs.get("clock"))
        row.update(run_id=attrs.get("run_id"), reason=attrs.get("reason"), invalid=bool(attrs.get("invalid", False)),
                   last_step=steps[-1] if steps else None, direction=direction,
                   datetime_start=trial.datetime_start, datetime_complete=trial.datetime_complete,
                   duration=(trial.datetime_complete - trial.datetime_start).total_seconds()
                   if trial.datetime_complete and trial.datetime_start else None)
        rows.append(row)
    metric = (study.user_attrs.get(STUDY_ATTR) or {}).get("objective", {}).get("metric")
    for row in rows:
        row["metric"] = metric  # the objective's metric: the report's per-cell intervals read its eval samples
    columns = ["number", "state", "value", *(["value_time", "pareto"] if multi else []),
               *(f"params_{n}" for n in names), "run_id", "run_ids", "seeds", "seed_values", "lo", "hi", "covers",
               "seconds_per_iter", "clock", "reason", "invalid",
               "last_step", "direction", "metric", "datetime_start", "datetime_complete", "duration"]
    frame = pd.DataFrame(rows, columns=columns)
    for name in names:  # choices of one type become a typed column; mixed ones stay objects -> strings
        column = frame[f"params_{name}"]
        kinds = {type(v) for v in column if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            frame[f"params_{name}"] = column.map(lambda v: None if v is None else str(v))
    return frame


def _joined(values) -> str | None:
    return "; ".join(f"{v:.10g}" if isinstance(v, float) else str(v) for v in values) if values else None


def _num(value) -> float:
    return float(value) if value is not None else math.nan


def export_trials(study, path: Path, param_names: Sequence[str] = ()) -> Path:
    """Write the trials table as parquet (atomically) for the report; returns the path."""
    buffer = io.BytesIO()
    trials_frame(study, param_names).to_parquet(buffer, index=False)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)
