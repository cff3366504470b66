"""``collect``: merge the runs of one experiment folder into parquet tables (runs, metrics, timings,
candidates), with the facts the report needs from code (solbench.results.stored_facts: each run's on runs.parquet, the
paper models' in paper_model_facts.parquet), and a collect_report.json naming every corrupt line skipped and the
runs asked for (see solbench.collect).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solbench.collect.facts import paper_model_facts, provenance_record, recorded_run_facts
from solbench.results.storage import CorruptLine, _now, _raise_storage_error, atomic_write_bytes
from solbench.results.store import TABLE_COLUMNS, RunStore
from solbench.results.stored_facts import FACTS_SCHEMA, PAPER_MODEL_FACTS, PROVENANCE_TABLE, SCHEMA_COLUMN


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": value}; lists and tuples become JSON strings (parquet-friendly)."""
    flat: dict[str, Any] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                flat.update(flatten(value, name))
            else:
                flat.update(flatten(value, name) if isinstance(value, dict) else {name: _scalar(value)})
    else:
        flat[prefix] = _scalar(obj)
    return flat


def _scalar(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def iter_run_dirs(experiment_dir: Path) -> Iterator[Path]:
    """Run folders of an experiment (those holding a spec.json), in name order."""
    if not experiment_dir.is_dir():
        return
    for path in sorted(experiment_dir.iterdir()):
        if path.is_dir() and (path / "spec.json").exists():
            yield path


@dataclass
class CollectResult:
    """What ``collect`` wrote: table name -> (path, row count), and the corrupt lines it skipped."""

    experiment_dir: Path
    tables: dict[str, tuple[Path, int]]
    corrupt: list[CorruptLine]
    runs: int
    # (run_id, what it lacks) of done runs missing results (RunStore.damage): a run without its spec.json is
    # left out, one without its table collected with what it has; both are said, with the fix
    damaged: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def collect(experiment_dir: str | os.PathLike, run_ids: Iterable[str] | None = None) -> CollectResult:
    """Merge the runs of one experiment folder into parquet tables (see the module docstring).

    ``run_ids`` restricts collection to those runs (e.g. the runs a spec expands to now); by
    default every run folder is collected. Writing is atomic per file and idempotent: collecting
    twice gives the same tables.
    """
    import pandas as pd

    from solbench.errors import SolbenchError

    experiment_dir = Path(experiment_dir)
    wanted = set(run_ids) if run_ids is not None else None
    damaged = [(d.name, problem) for d in _launched_run_dirs(experiment_dir)
               if (wanted is None or d.name in wanted) and (problem := RunStore(d, d.name).damage())]
    found = [d for d in iter_run_dirs(experiment_dir) if wanted is None or d.name in wanted]
    if not found:
        raise SolbenchError(f"nothing to collect: {experiment_dir} holds no results of "
                            f"{'these runs' if wanted is not None else 'any run'} yet (run `solbench run SPEC` first)")
    run_rows: list[dict[str, Any]] = []
    table_rows: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLE_COLUMNS}
    corrupt: list[CorruptLine] = []

    for run_dir in found:
        try:
            spec = json.loads((run_dir / "spec.json").read_text())
        except (OSError, ValueError):
            spec = None
        if not isinstance(spec, dict):  # a damaged spec.json: the run is left out (and in ``damaged`` when done)
            continue
        store = RunStore(run_dir, run_dir.name)
        scans = {table: store.scan(table) for table in TABLE_COLUMNS}
        explores = any(r.get("precision") == "explore" for r in scans["timings"].rows)
        env = store.read_json("env.json") or {}
        status = store.read_status()
        method_cfg = spec.get("method_config", {})
        row: dict[str, Any] = {
            "run_id": run_dir.name,
            "experiment": spec.get("experiment"),
            "method": spec.get("method"),
            "model": (spec.get("model") or {}).get("name"),
            "status": status.get("state"),
            "seed": spec.get("seed"),
            "git_sha": env.get("git_sha"),
            "dirty": env.get("git_dirty"),
            "device": env.get("device"),
            "device_name": env.get("device_name"),
            "slurm_job_id": (env.get("slurm") or {}).get("slurm_job_id"),
            "cpu_model": (env.get("cpu") or {}).get("model"),
            "cpu_bf16_flags": ",".join((env.get("cpu") or {}).get("native_bf16_flags") or []),
            "explore_backend": (store.read_json("explore.json") or {}).get("backend"),
            **_rate_columns(store.read_json("cpu_rates.json")),
            "n": method_cfg.get("n"),
            "k": method_cfg.get("k"),
            "error": status.get("error"),
        }
        row.update({f"p_{key}": value for key, value in flatten(spec).items()})
        row.update(recorded_run_facts(store, spec, explores))  # what the report needs from code (stored_facts)
        run_rows.append(row)
        for table, scan in scans.items():
            corrupt.extend(scan.corrupt)
            table_rows[table].extend(scan.rows)

    tables: dict[str, tuple[Path, int]] = {}
    frames = {"runs": pd.DataFrame(run_rows, columns=None if run_rows else ["run_id", "experiment", "method",
                                                                              "model", "status", "seed"])}
    for table, columns in TABLE_COLUMNS.items():
        frame = pd.DataFrame(table_rows[table])
        if frame.empty:
            frame = pd.DataFrame(columns=list(columns))
        frames[table] = frame
    from solbench.results.speed_rows import speed_table

    speed = speed_table(experiment_dir)  # a spec's speed: block (solbench.speed), where one ran
    if speed is not None:
        frames["speed"] = speed
    frames[PAPER_MODEL_FACTS] = paper_model_facts()  # the cost projection's inputs, as these results' own copy
    experiment = next((str(r["experiment"]) for r in run_rows if r.get("experiment")), experiment_dir.name)
    provenance, deviations = provenance_record(experiment)  # what the report's provenance section lists
    if deviations is not None:
        frames[PROVENANCE_TABLE] = deviations
    elif (experiment_dir / f"{PROVENANCE_TABLE}.parquet").exists():
        (experiment_dir / f"{PROVENANCE_TABLE}.parquet").unlink()
    for name, frame in frames.items():
        path = experiment_dir / f"{name}.parquet"
        _write_parquet(frame, path)
        tables[name] = (path, len(frame))

    report = {
        "experiment_dir": str(experiment_dir),
        "collected_at": _now(),
        "runs": len(run_rows),
        "tables": {name: {"path": str(path), "rows": rows} for name, (path, rows) in tables.items()},
        "corrupt_lines": [bad.to_dict() for bad in corrupt],
        "damaged_runs": [{"run_id": run_id, "problem": problem} for run_id, problem in damaged],
        # the runs asked for (a spec's, when collected for one): the report names those it lacks from this
        "spec_runs": sorted(wanted) if wanted is not None else None,
        SCHEMA_COLUMN: FACTS_SCHEMA,
        "provenance": provenance,  # the experiment's provenance table (solbench.collect.facts.provenance_record)
    }
    atomic_write_bytes(experiment_dir / "collect_report.json", (json.dumps(report, indent=2) + "\n").encode())
    return CollectResult(experiment_dir, tables, corrupt, len(run_rows), damaged)


def _launched_run_dirs(experiment_dir: Path) -> Iterator[Path]:
    """Run folders of an experiment with a status.json or a spec.json (a done run may have lost its spec.json)."""
    if experiment_dir.is_dir():
        for path in sorted(experiment_dir.iterdir()):
            if path.is_dir() and ((path / "status.json").exists() or (path / "spec.json").exists()):
                yield path


def _write_parquet(frame, path: Path) -> None:
    # Mixed-type object columns (e.g. a method log that is sometimes a string) would make pyarrow
    # fail; such columns are stored as strings rather than losing the whole table.
    import pandas as pd

    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            kinds = {type(v) for v in frame[column] if v is not None and not (isinstance(v, float) and pd.isna(v))}
            if len(kinds - {int, float}) > 0 and len(kinds) > 1:
                frame[column] = frame[column].map(lambda v: None if v is None else str(v))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException as err:
        _raise_storage_error(err, path, tmp)
        raise


def _rate_columns(rates) -> dict[str, Any]:
    """The runs table's ``rate_*`` columns from a run's cpu_rates.json (solbench.train.cpu_rates): GFLOP/s of the fp32
    and bf16 GEMMs and of the full-precision and explore forwards; empty when the run measured none."""
    if not isinstance(rates, dict):
        return {}
    gemm, forward = rates.get("gemm") or {}, rates.get("forward") or {}
    values = {"rate_gemm_fp32": gemm.get("fp32_gflops"), "rate_gemm_bf16": gemm.get("bf16_gflops"),
              "rate_forward_full": forward.get("full_gflops"), "rate_forward_explore": forward.get("explore_gflops")}
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
