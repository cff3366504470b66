"""Run results on disk: the per-run ``RunStore`` (what a run writes and how it is read back).

Layout of one run, ``results/<experiment>/<run_id>/``::

    spec.json      the resolved RunConfig (written by the launcher)
    env.json       git SHA + dirty flag, package versions, device, host, Slurm ids, threads (launcher);
                   every attempt's under ``attempts``, the run's numerics setting (solbench.machine.numerics)
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

An experiment's runs are merged into parquet tables by ``solbench.collect``, a stage above this one.

This package only re-exports its modules' names, one job each: ``storage`` (atomic writes, storage
errors, JSONL scanning), ``store`` (``RunStore``), ``env`` (``capture_env``); beside them ``stored_facts`` (the
facts' names and schema, shared by the runs, collect and the report), ``speed_rows`` (the speed block's files and
table) and ``checkpoint`` (checkpoint files). Its modules import one another directly, never this package.

Stage ``results`` (solbench/stages.py): it imports its own modules and the stages below it, machine, text, base.
"""

from solbench.results.env import _git, _package_version, capture_env
from solbench.results.storage import (CorruptLine, TableScan, _fsync_dir, _json_default, _now, _raise_storage_error,
                                      atomic_write_bytes, scan_jsonl, storage_error)
from solbench.results.store import (_CHECKPOINT_RE, _DAMAGED_STATUS_SAID, CHECKPOINTS_KEPT, STATE_NEW, STATES,
                                    TABLE_COLUMNS, RunStore)

__all__ = ["CHECKPOINTS_KEPT", "STATES", "STATE_NEW", "TABLE_COLUMNS", "CorruptLine", "RunStore", "TableScan",
           "atomic_write_bytes", "capture_env", "scan_jsonl", "storage_error"]
