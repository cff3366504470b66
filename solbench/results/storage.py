"""Storage primitives of the results folder: atomic writes, storage errors, JSONL scanning.

``atomic_write_bytes`` writes a file via a temporary file and an atomic rename (fsynced, with its
folder); ``storage_error`` turns a full disk or a folder that cannot be written into one
StorageError naming the file; ``scan_jsonl`` parses an append-only table line by line, recording
(``CorruptLine``) rather than raising on a line that does not parse. Used by the run store
(solbench.results.store) and by collection (solbench.collect.collection).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import errno
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.errors import StorageError


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
