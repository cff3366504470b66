"""``RunStore``: the results folder of one run (append-only tables, JSON records, checkpoints).

The layout of a run folder and the crash-safety rules the store keeps are described in
solbench.results; the primitives it writes with are in solbench.results.storage.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from solbench.errors import StorageError
from solbench.results.checkpoint import UnreadableCheckpoint, plain_problem, read_checkpoint
from solbench.results.storage import (CorruptLine, TableScan, _fsync_dir, _json_default, _now, _raise_storage_error,
                                      atomic_write_bytes, scan_jsonl)

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

        Keys kept from the previous status unless overridden: ``attempt``, ``submitted_at`` and
        ``numerics`` (the first attempt's numerics setting, solbench.machine.numerics: kept here as well as in
        env.json, so that losing one file cannot rewrite it).
        """
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}; states are {list(STATES)}")
        previous = self.read_status()
        status = {k: previous[k] for k in ("attempt", "submitted_at", "numerics") if k in previous}
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

    def damage(self) -> str | None:
        """What a done run lacks of its results (its spec.json, or its main table: metrics.jsonl, a fidelity
        run's candidates.jsonl), e.g. deleted or damaged from outside; None when it lacks nothing or is not
        done. Such a run is reported by `run`, `status` and `collect`, never collected as complete silently."""
        if self.read_status().get("state") != "done":
            return None
        spec_file = self.run_dir / "spec.json"
        try:
            spec = json.loads(spec_file.read_text())
        except FileNotFoundError:
            return f"{spec_file} is missing"
        except (OSError, ValueError) as err:
            return f"{spec_file} is not JSON ({type(err).__name__}: {err})"
        if not isinstance(spec, dict):
            return f"{spec_file} is not a run's spec (a JSON {type(spec).__name__})"
        table = self.table_path("candidates" if spec.get("kind") == "fidelity" else "metrics")
        if not table.is_file():
            return f"{table} is missing"
        if table.stat().st_size == 0:
            return f"{table} is empty"
        return None

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
        """Save ``state`` as the checkpoint of ``step`` (tmp + rename) and keep the last two.

        ``state`` holds tensors and plain data only (solbench.results.checkpoint), so that reading it back
        runs no code; anything else is a TypeError naming where it is, before any file is written."""
        import torch

        problem = plain_problem(state)
        if problem:
            raise TypeError(f"checkpoint of step {step}: {problem}; a checkpoint holds tensors, dicts, lists, tuples, "
                            "str, int, float, bool and None only (loaded with torch.load(weights_only=True))")
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

    def latest_checkpoint(self, check: Callable[[dict], str | None] | None = None) -> tuple[int, dict] | None:
        """(step, state) of the newest readable checkpoint, or None when there is none.

        Files are loaded as tensors and plain data only (``read_checkpoint``: nothing in them runs). One that
        does not load so (cut short, damaged, crafted, or written before checkpoints held plain data only), or
        whose state ``check`` finds lacking (it returns what is missing), is reported in one line and the
        previous one is used instead.
        """
        files = self.checkpoint_files()
        for index in range(len(files) - 1, -1, -1):
            try:
                return read_checkpoint(files[index][1], check)
            except UnreadableCheckpoint as err:
                fallback = (f"using the previous one, {files[index - 1][1].name}" if index else
                            "no earlier checkpoint is left: the run starts from step 0")
                log.warning("skipping unreadable checkpoint %s; %s", err, fallback)
        return None

    def links(self) -> list[Path]:
        """The run folder, or entries of it or of its checkpoints/, that are symbolic links. Everything a run
        writes or deletes stays inside its folder; through a link it would not (``--force`` would empty the
        link's target), so the launcher refuses such a folder (``link_problem``)."""
        if self.run_dir.is_symlink():
            return [self.run_dir]
        found = []
        for folder in (self.run_dir, self.checkpoint_dir):  # a checkpoints/ link is an entry of the run folder
            if folder.is_dir() and not folder.is_symlink():
                found += [path for path in sorted(folder.iterdir()) if path.is_symlink()]
        return found

    def link_problem(self) -> str | None:
        """One line naming the links of ``links`` and what to do, or None when there are none."""
        found = self.links()
        if not found:
            return None
        named = ", ".join(f"{path} -> {os.readlink(path)}" for path in found[:3]) + (" ..." if len(found) > 3 else "")
        return (f"run {self.run_id}: {named} {'is a symbolic link' if len(found) == 1 else 'are symbolic links'}; "
                "solbench writes and deletes only inside the run folder, never through a link: remove the link (or "
                "put the folder itself there) and run again")

    def clear(self, keep: Iterable[str] = ()) -> None:
        """Remove everything the run wrote (``--force`` reruns start from nothing), except the
        top-level entries named in ``keep`` (the launcher keeps its lock file, which a concurrent
        launcher may hold, and its own records). Links inside the folder are removed, never followed; a
        run folder that is itself a link is refused (StorageError): emptying it would delete outside the
        results root."""
        import shutil

        if self.run_dir.is_symlink():
            raise StorageError(f"{self.run_dir} is a symbolic link (to {os.readlink(self.run_dir)}); not clearing it: "
                               "solbench deletes only inside the results root. Remove the link and run again")
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
