"""Reading Optuna sweep results for the report: ``results/<experiment>/sweep/``.

Two forms are accepted, the first found wins:
1. ``trials.parquet`` (or ``trials.csv``): one row per trial with ``value``, optional ``state``
   (COMPLETE rows are used) and ``number``, and the sampled parameters either as bare columns
   (``n``, ``k``) or as Optuna's ``params_<name>`` columns; an optional ``direction`` column
   (``maximize``/``minimize``; a reward-and-time study writes ``maximize,minimize`` and the columns
   ``value_time`` and ``pareto``).
2. An Optuna storage file (``*.db``, ``*.sqlite``, ``*.sqlite3``: SQLite; ``*.log``/``*.journal``:
   JournalStorage). Every study in it is read with ``study.trials_dataframe()``; a ``study`` column
   tells them apart.

The result is normalised to bare parameter names (the ``params_`` prefix removed); a study read from its storage
gets the ``run_ids``, ``seeds`` and ``seed_values`` of its cells from the trials' user attributes, as
trials.parquet has them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from solbench.errors import SolbenchError

_SQLITE = (".db", ".sqlite", ".sqlite3")
_JOURNAL = (".log", ".journal", ".jsonl")


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.rename(columns={c: c[len("params_"):] for c in frame.columns if c.startswith("params_")})
    for name in ("run_id", "run_ids", "seeds", "seed_values"):  # a study read from its storage: a cell's runs
        attr = f"user_attrs_{name}"
        if name not in frame.columns and attr in frame.columns:
            frame[name] = frame[attr].map(lambda v: "; ".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
    if "value" not in frame.columns:
        raise SolbenchError(f"sweep trials table has no 'value' column (columns: {list(frame.columns)})")
    if "state" in frame.columns:
        frame = frame[frame["state"].astype(str).str.upper().str.endswith("COMPLETE")]
    frame = frame[pd.to_numeric(frame["value"], errors="coerce").notna()].copy()
    frame["value"] = frame["value"].astype(float)
    return frame.reset_index(drop=True)


def load_trials(sweep_dir: Path) -> tuple[pd.DataFrame | None, str]:
    """(completed trials, direction) from a sweep folder, or (None, "maximize") when there is none."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return None, "maximize"
    for name in ("trials.parquet", "trials.csv"):
        path = sweep_dir / name
        if path.exists():
            frame = pd.read_parquet(path) if name.endswith(".parquet") else pd.read_csv(path)
            direction = "maximize"
            if "direction" in frame.columns and frame["direction"].notna().any():
                direction = str(frame["direction"].dropna().iloc[0]).lower().split(",")[0]  # multi: the reward's
                direction = "minimize" if "min" in direction else "maximize"
            return _normalise(frame), direction
    storages = sorted(p for p in sweep_dir.iterdir() if p.suffix in _SQLITE + _JOURNAL and p.is_file())
    if not storages:
        return None, "maximize"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    frames, direction = [], "maximize"
    for path in storages:
        if path.suffix in _SQLITE:
            storage = f"sqlite:///{path.resolve()}"
        else:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            storage = JournalStorage(JournalFileBackend(str(path)))
        try:
            summaries = optuna.get_all_study_summaries(storage)
        except Exception as err:  # noqa: BLE001 - optuna raises storage-specific errors
            raise SolbenchError(f"{path}: cannot read the Optuna storage ({err})") from err
        for summary in summaries:
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            if len(study.directions) != 1:
                continue  # multi-objective sweeps have no single value to map
            direction = "minimize" if study.direction == optuna.study.StudyDirection.MINIMIZE else "maximize"
            frame = study.trials_dataframe()
            if frame.empty:
                continue
            frame["study"] = summary.study_name
            frames.append(frame)
    if not frames:
        return None, direction
    return _normalise(pd.concat(frames, ignore_index=True)), direction
