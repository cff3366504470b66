"""Run results on disk: the per-run ``RunStore`` and ``collect`` (JSONL -> parquet per experiment).

Layout of one run, ``results/<experiment>/<run_id>/``::

    spec.json      the resolved RunConfig (written by the launcher)
    env.json       git SHA + dirty flag, package versions, device, host, Slurm ids, threads (launcher);
                   every attempt's under ``attempts``, the run's numerics setting (solbench.numerics)
    status.json    pending | running | done | failed (+ traceback) (launcher)
    checkpoints/   step_<step>.pt, atomic, the last two kept (trainer)
    tb/            TensorBoard events (trainer)
    samples/       evaluation image grids (trainer)
    metrics.jsonl, timings.jsonl, candidates.jsonl   append-only tables (trainer)

Crash safety. Every ``append`` writes its rows in one write and fsyncs, so a killed writer can at
worst leave one torn last line. Readers report such a line and skip it; the next ``append`` first
ends the torn fragment with a newline so it never swallows a good row. A run resumed from the
checkpoint of step s calls ``truncate_after(s)`` (an atomic rewrite) before writing again, so the
rows of the steps it repeats are never duplicated. The trainer must therefore write a step's rows
*before* saving that step's checkpoint.

``collect`` merges an experiment's runs into ``runs.parquet`` (one row per run, every resolved config
field flattened as a ``p_``-prefixed column), ``metrics.parquet``, ``timings.parquet`` and
``candidates.parquet``, plus ``collect_report.json`` naming every corrupt line it skipped.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import json
import logging
import operator
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.errors import StorageError

log = logging.getLogger(__name__)

#: Append-only tables and the columns every row carries (``run_id`` is added by ``append``).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "metrics": ("run_id", "step", "split", "metric", "value", "images_seen", "wall_s"),
    "timings": ("run_id", "step", "phase", "precision", "seconds", "n_images", "flops"),
    "candidates": ("run_id", "step", "prompt_id", "cand_idx", "noise_seed", "precision", "reward", "selected"),
}

#: Run states in status.json. "new" is only ever *read*: the run has no status.json yet.
STATES = ("pending", "running", "done", "failed")
STATE_NEW = "new"

CHECKPOINTS_KEPT = 2
_DAMAGED_STATUS_SAID: set[Path] = set()  # status.json files this process has reported damaged
_CHECKPOINT_RE = re.compile(r"^step_(\d+)\.pt$")


@dataclass(frozen=True)
class CorruptLine:
    """A line of a JSONL table that does not parse (typically the torn tail of a killed writer)."""

    path: str
    line_number: int  # 1-based
    text: str  # the first 200 characters
    error: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TableScan:
    """The parsed rows of one JSONL table and the lines that had to be skipped."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[CorruptLine] = field(default_factory=list)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _fsync_dir(path: Path) -> None:
    # A rename is durable only once its directory entry is; best effort where unsupported.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
_NEARLY_FULL = 1 << 20  # bytes free under which a failed write is put down to a full disk


def storage_error(err: BaseException, path: str | os.PathLike | None = None) -> StorageError | None:
    """``err`` as one StorageError naming the file, when a full disk or a folder that cannot be
    written caused it (anywhere in its chain), else None. torch's checkpoint writer reports a full
    disk as a RuntimeError ("unexpected pos 64 vs 0"): with ``path``, a failed write to a file system
    with almost nothing free is a full disk too (check before removing the partial file)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return StorageError(f"the disk is full: cannot write {path or seen.filename} ({seen.strerror})")
        if isinstance(seen, OSError) and seen.errno in _NOT_WRITABLE and (path or seen.filename):
            return StorageError(f"{path or seen.filename}: {seen.strerror}")
        seen = seen.__cause__ or seen.__context__
    if path is not None and isinstance(err, Exception):
        try:
            stat = os.statvfs(Path(path).parent)
        except OSError:
            return None
        if stat.f_bavail * stat.f_frsize < _NEARLY_FULL:
            return StorageError(f"the disk is full: cannot write {path} ({stat.f_bavail * stat.f_frsize} bytes free; "
                                f"{type(err).__name__}: {err})")
    return None


def _raise_storage_error(err: BaseException, path: Path, partial: str | os.PathLike | None = None) -> None:
    """Raise ``storage_error(err, path)`` if there is one, after removing ``partial`` (a temp file)."""
    problem = storage_error(err, path)
    if partial is not None:
        Path(partial).unlink(missing_ok=True)
    if problem is not None:
        raise problem from err


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename.

    ``fsync=False`` keeps the atomicity (readers see the old or the new file) but not the
    durability across a power cut; for frequently rewritten, disposable files (progress.json).
    A full disk or a read-only folder raises StorageError naming ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        _raise_storage_error(err, path, tmp)
        raise
    if fsync:
        _fsync_dir(path.parent)


def _json_default(obj: Any) -> Any:
    # Tensors/numpy scalars reach the tables as 0-d values; everything else as its string form.
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError, RuntimeError):
            pass
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def scan_jsonl(path: Path) -> TableScan:
    """Parse a JSONL file line by line; a line that is not a JSON object is recorded, not raised."""
    scan = TableScan()
    path = Path(path)
    if not path.exists():
        return scan
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            if not text.strip():
                continue
            try:
                row = json.loads(text)
                if not isinstance(row, dict):
                    raise ValueError(f"expected a JSON object, got {type(row).__name__}")
            except ValueError as err:
                scan.corrupt.append(CorruptLine(str(path), number, text[:200], str(err)))
                continue
            scan.rows.append(row)
    return scan


class RunStore:
    """The results folder of one run: append-only tables, JSON records and checkpoints.

    One process writes a run at a time (the launcher guarantees it with ``run_lock``). The launcher
    owns spec.json, env.json and status.json; the trainer owns the tables, checkpoints, tb/ and
    samples/.
    """

    def __init__(self, run_dir: str | os.PathLike, run_id: str):
        self.run_dir = Path(run_dir)
        self.run_id = str(run_id)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.tb_dir = self.run_dir / "tb"
        self.samples_dir = self.run_dir / "samples"

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r}, {self.run_id!r})"

    # -- tables -------------------------------------------------------------------------------

    def table_path(self, table: str) -> Path:
        if table not in TABLE_COLUMNS:
            raise ValueError(f"unknown results table {table!r}; tables are {sorted(TABLE_COLUMNS)}")
        return self.run_dir / f"{table}.jsonl"

    def append(self, table: str, rows: Iterable[dict]) -> None:
        """Append rows (each gets this run's ``run_id``) in one write, then flush and fsync.

        Every documented column of the table must be present (extra columns are kept); ``step``
        must be an integer. Raises ValueError naming the first offending row otherwise.
        """
        path = self.table_path(table)
        required = [c for c in TABLE_COLUMNS[table] if c != "run_id"]
        lines = []
        for index, row in enumerate(rows):
            missing = [c for c in required if c not in row]
            if missing:
                raise ValueError(f"{table} row {index} lacks columns {missing}: {row!r}")
            try:  # operator.index accepts int-like values (numpy ints, 0-d int tensors) but not floats
                if isinstance(row["step"], bool):
                    raise TypeError
                step = operator.index(row["step"])
            except TypeError:
                raise ValueError(f"{table} row {index}: step must be an integer, got {row['step']!r}") from None
            record = {"run_id": self.run_id, **{k: v for k, v in row.items() if k != "run_id"}, "step": step}
            lines.append(json.dumps(record, default=_json_default, separators=(",", ":")))
        if not lines:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        data = ("\n".join(lines) + "\n").encode()
        try:
            with open(path, "ab+") as handle:
                # A killed writer may have left a torn line without its newline: close it off so the
                # fragment stays one (reported, skipped) corrupt line instead of eating our first row.
                if handle.tell() > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        data = b"\n" + data
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:  # a full disk: at worst a torn last line, which a resume drops
            _raise_storage_error(err, path)
            raise

    def scan(self, table: str) -> TableScan:
        """Rows of ``table`` plus the corrupt lines skipped (see ``read``)."""
        return scan_jsonl(self.table_path(table))

    def read(self, table: str) -> list[dict]:
        """Rows of ``table`` in write order; a corrupt or truncated line is logged and skipped."""
        scan = self.scan(table)
        for bad in scan.corrupt:
            log.warning("skipping corrupt line %s:%d (%s): %r", bad.path, bad.line_number, bad.error, bad.text)
        return scan.rows

    def truncate_after(self, step: int) -> None:
        """Drop every row with ``step > step`` from every table (atomic rewrite of each file).

        ``truncate_after(-1)`` empties the tables (a run restarting with no checkpoint). A torn last
        line (no newline: the write a killed writer never finished) is dropped too: it belongs to a
        step after the last checkpoint, whose rows the resumed run writes again, so keeping it would
        only make every later collect warn about data that is complete. Other corrupt lines (damage
        from outside) are kept so that collection keeps reporting them.
        """
        for table in TABLE_COLUMNS:
            path = self.table_path(table)
            if not path.exists():
                continue
            kept: list[bytes] = []
            dropped = 0
            torn = None
            with open(path, "rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    line = raw if raw.endswith(b"\n") else raw + b"\n"
                    try:
                        row = json.loads(line)
                        row_step = int(row["step"])
                    except (ValueError, KeyError, TypeError):
                        if not raw.endswith(b"\n") and raw.strip():
                            torn = number  # the last line, unfinished: regenerated by the resumed run
                        else:
                            kept.append(line)
                        continue
                    if row_step > step:
                        dropped += 1
                    else:
                        kept.append(line)
            if dropped or torn:
                atomic_write_bytes(path, b"".join(kept))
                log.info("%s: dropped %d %s rows after step %d", self.run_id, dropped, table, step)
            if torn:
                log.warning("%s:%d: dropped the torn last line of an interrupted write (its step is rewritten "
                            "by this resumed run)", path, torn)

    def corrupt_lines(self) -> list[CorruptLine]:
        """Every line of the run's tables that does not parse (e.g. the torn tail of a killed writer)."""
        return [bad for table in TABLE_COLUMNS for bad in self.scan(table).corrupt]

    def remove_temp_files(self) -> list[Path]:
        """Delete the temporary files of atomic writes that a killed writer left behind (``.<name>.*.tmp``,
        in the run folder and checkpoints/); a checkpoint's can be gigabytes. Only safe while holding
        the run (the launcher calls it under the run lock, before the run starts)."""
        removed = []
        for folder in (self.run_dir, self.checkpoint_dir):
            if not folder.is_dir():
                continue
            for path in folder.glob(".*.tmp"):
                if path.is_file():
                    path.unlink(missing_ok=True)
                    removed.append(path)
        if removed:
            log.warning("%s: removed %d temporary file(s) of interrupted writes: %s", self.run_id, len(removed),
                        ", ".join(p.name for p in removed))
        return removed

    # -- JSON records ---------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> None:
        """Write ``<run_dir>/<name>`` (``.json`` added when missing) atomically."""
        if not name.endswith(".json"):
            name += ".json"
        text = json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"
        atomic_write_bytes(self.run_dir / name, text.encode())

    def read_json(self, name: str) -> Any | None:
        if not name.endswith(".json"):
            name += ".json"
        path = self.run_dir / name
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def write_status(self, state: str, **info: Any) -> None:
        """Record the run's state (pending | running | done | failed) with free-form details.

        Keys kept from the previous status unless overridden: ``attempt`` and ``submitted_at``.
        """
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}; states are {list(STATES)}")
        previous = self.read_status()
        status = {k: previous[k] for k in ("attempt", "submitted_at") if k in previous}
        status.update(info)
        status.update(state=state, run_id=self.run_id, updated_at=_now())
        self.write_json("status.json", status)

    def read_status(self) -> dict:
        """The stored status, or ``{"state": "new"}`` when the run has never been launched or its
        status.json is damaged (said once per process: every display and plan reads it again)."""
        try:
            status = self.read_json("status.json")
        except ValueError as err:  # a status.json is always written atomically; this is outside damage
            path = self.run_dir / "status.json"
            if path not in _DAMAGED_STATUS_SAID:
                _DAMAGED_STATUS_SAID.add(path)
                what = "is empty" if not path.read_bytes().strip() else f"is not JSON ({err})"
                log.warning("%s %s: the run reads as new, and `solbench run` launches it again (from its last "
                            "checkpoint, if it has one)", path, what)
            status = None
        return status if isinstance(status, dict) else {"state": STATE_NEW, "run_id": self.run_id}

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint_files(self) -> list[tuple[int, Path]]:
        """(step, path) of every checkpoint file, oldest first (none is loaded)."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = []
        for path in self.checkpoint_dir.iterdir():
            match = _CHECKPOINT_RE.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def save_checkpoint(self, step: int, state: dict) -> Path:
        """Save ``state`` as the checkpoint of ``step`` (tmp + rename) and keep the last two."""
        import torch

        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / f"step_{int(step):08d}.pt"
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.checkpoint_dir)
            with os.fdopen(fd, "wb") as handle:
                torch.save({"step": int(step), "state": state}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException as err:  # a full disk named as such: torch says "unexpected pos 64 vs 0"
            _raise_storage_error(err, path, tmp)
            raise
        _fsync_dir(self.checkpoint_dir)
        for _, old in self.checkpoint_files()[:-CHECKPOINTS_KEPT]:
            old.unlink(missing_ok=True)
        return path

    def has_checkpoint(self) -> bool:
        """Whether any checkpoint file exists (cheap: nothing is loaded)."""
        return bool(self.checkpoint_files())

    def latest_checkpoint(self) -> tuple[int, dict] | None:
        """(step, state) of the newest readable checkpoint, or None when there is none.

        A checkpoint that fails to load is reported and the previous one is used instead.
        """
        import torch

        for step, path in reversed(self.checkpoint_files()):
            try:
                payload = torch.load(path, map_location="cpu", weights_only=False)
            except Exception as err:  # noqa: BLE001 - any unreadable file falls back to the previous one
                log.warning("skipping unreadable checkpoint %s: %s", path, err)
                continue
            return int(payload["step"]), payload["state"]
        return None

    def clear(self, keep: Iterable[str] = ()) -> None:
        """Remove everything the run wrote (``--force`` reruns start from nothing), except the
        top-level entries named in ``keep`` (the launcher keeps its lock file, which a concurrent
        launcher may hold, and its own records)."""
        import shutil

        if not self.run_dir.exists():
            return
        keep = set(keep)
        for path in self.run_dir.iterdir():
            if path.name in keep:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


# -- environment ---------------------------------------------------------------------------------


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def capture_env(repo_dir: str | os.PathLike | None = None, *, cpus=None) -> dict[str, Any]:
    """What produced a run: code version, package versions, device, host and Slurm ids, and with
    ``cpus`` (a solbench.threads.CpuAllocation) the threads and cores the run was given."""
    repo = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent.parent
    sha = _git(["rev-parse", "HEAD"], repo)
    porcelain = _git(["status", "--porcelain", "--untracked-files=no"], repo)
    env: dict[str, Any] = {
        "git_sha": sha or None,
        "git_dirty": bool(porcelain) if porcelain is not None else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "captured_at": _now(),
        "versions": {
            name: _package_version(name)
            for name in ("solbench", "torch", "diffusers", "transformers", "peft", "submitit", "optuna")
        },
        "slurm": {
            key.lower(): os.environ[key]
            for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_PARTITION",
                        "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT")
            if key in os.environ
        },
    }
    import solbench

    env["solbench_path"] = str(Path(solbench.__file__).resolve().parent)  # which copy of the code ran
    env["code_snapshot"] = os.environ.get("SOLBENCH_CODE_SNAPSHOT")  # set in Slurm jobs (solbench.launch)
    code_meta = Path(env["code_snapshot"] or "/nonexistent") / "CODE.json"
    if env["git_sha"] is None and code_meta.is_file():  # a snapshot is no checkout: its CODE.json says
        meta = json.loads(code_meta.read_text())
        env["git_sha"], env["git_dirty"] = meta.get("git_sha"), meta.get("git_dirty")
    if "torch" in sys.modules or env["versions"]["torch"]:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            env["device"] = "cuda"
            env["device_name"] = torch.cuda.get_device_name(0)
            env["device_count"] = torch.cuda.device_count()
            env["cuda"] = torch.version.cuda
        else:
            env["device"] = "cpu"
            env["device_name"] = platform.processor() or platform.machine()
            env["device_count"] = os.cpu_count()
    from solbench.cpu import cpu_info

    env["cpu"] = cpu_info()  # model, native bf16 flags, and what full_dtype auto/native resolve to here
    if cpus is not None:
        env["cpu_allocation"] = cpus.as_dict()
    return env


# -- collect -------------------------------------------------------------------------------------


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
    found = [d for d in iter_run_dirs(experiment_dir) if wanted is None or d.name in wanted]
    if not found:
        raise SolbenchError(f"nothing to collect: {experiment_dir} holds no results of "
                            f"{'these runs' if wanted is not None else 'any run'} yet (run `solbench run SPEC` first)")
    run_rows: list[dict[str, Any]] = []
    table_rows: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLE_COLUMNS}
    corrupt: list[CorruptLine] = []

    for run_dir in found:
        spec = json.loads((run_dir / "spec.json").read_text())
        store = RunStore(run_dir, run_dir.name)
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
            "n": method_cfg.get("n"),
            "k": method_cfg.get("k"),
            "error": status.get("error"),
        }
        row.update({f"p_{key}": value for key, value in flatten(spec).items()})
        run_rows.append(row)
        for table in TABLE_COLUMNS:
            scan = store.scan(table)
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
    }
    atomic_write_bytes(experiment_dir / "collect_report.json", (json.dumps(report, indent=2) + "\n").encode())
    return CollectResult(experiment_dir, tables, corrupt, len(run_rows))


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
