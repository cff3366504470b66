"""What runs inside a job: one run executed here and now (``execute_run``), and the run function it calls.

The run itself writes env.json, status.json ``running`` -> ``done`` | ``failed`` (with the traceback)
and progress.json; the run function (the trainer) writes the tables and checkpoints through its
RunStore and resumes from the last checkpoint by itself. ``execute_run`` holds the run lock
(solbench.launch.locks) and, under it, decides again: a run another launcher finished meanwhile is
not run twice, and ``--force`` clears a run's folder only there. The lock also makes it safe to
remove the temporary files a killed writer left (``RunStore.remove_temp_files``) before a resume.

Run functions are named by import path (``"package.module:function"``, ``DEFAULT_RUN_FN``): jobs
import them by name, never by pickle.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import json
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.machine import numerics
from solbench.config import RunConfig
from solbench.errors import ConfigError, SolbenchError
from solbench.results import RunStore, capture_env
from solbench.machine.threads import cpu_allocation

from .locks import LOCK_FILE, run_lock
from .states import LAUNCH_FILE

log = logging.getLogger(__name__)

DEFAULT_RUN_FN = "solbench.train.trainer:train_run"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def resolve_run_fn(ref: str | Callable) -> Callable:
    """A callable from ``"package.module:function"`` (or ``"path/to/file.py:function"``)."""
    if callable(ref):
        return ref
    module_name, sep, attr = str(ref).partition(":")
    if not sep or not attr:
        raise ConfigError(f"run function {ref!r} must look like 'package.module:function'")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"run function {ref!r}: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ConfigError(f"run function {ref!r}: module {module_name!r} not found ({err})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"run function {ref!r}: {module_name} has no attribute {attr!r}") from None


def run_fn_ref(fn: str | Callable) -> str:
    """The importable reference of a run function (jobs import it by name, never by pickle)."""
    if isinstance(fn, str):
        return fn
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in name or module == "__main__":
        raise ConfigError(f"run function {fn!r} must be a module-level function so Slurm jobs can import it")
    return f"{module}:{name}"


@dataclass
class RunTask:
    """Everything a job needs to execute one run (small and picklable)."""

    run_dir: str
    config: dict[str, Any]
    run_fn: str = DEFAULT_RUN_FN
    sys_path: list[str] = field(default_factory=list)  # prepended in the job (to import test run functions)
    lock_wait_s: float = 60.0  # how long to wait for a dying predecessor to release the run
    # --force: the time of the request. The run's results must come from an execution that started
    # after it; a run another launcher finished (or began) since then is not run again.
    force_since: float | None = None

    @property
    def run_id(self) -> str:
        return RunConfig.from_dict(self.config).run_id


def _rank() -> int:
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def execute_run(task: RunTask, *, progress: Callable | None = None) -> dict[str, Any]:
    """Run one run here and now, recording its status; never raises for a failing run.

    Returns {"state": "done", "result": ...} or {"state": "failed", "error": ...}, or
    {"state": "skipped"} when another live process holds the run.
    """
    from solbench.train.progress import ProgressWriter

    for entry in reversed(task.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    cfg = RunConfig.from_dict(task.config)
    store = RunStore(task.run_dir, cfg.run_id)
    if _rank() != 0:  # other ranks of a distributed run only compute; rank 0 keeps the records
        return {"state": "worker", "result": resolve_run_fn(task.run_fn)(cfg, store, progress=None)}
    with run_lock(store.run_dir, wait_s=task.lock_wait_s) as acquired:
        if not acquired:
            log.warning("%s is being executed by another process (%s); not starting it twice",
                        cfg.run_id, (store.run_dir / LOCK_FILE).read_text().strip())
            return {"state": "skipped"}
        # Decide again now that the run is ours: another launcher may have finished it while this
        # one waited for the lock (two `solbench run` of one spec), and running it again would
        # repeat the work and overwrite its status.
        previous = store.read_status()
        if previous["state"] == "done" and not _older_than(previous, task.force_since):
            log.info("%s was finished by another process meanwhile; not running it again", cfg.run_id)
            return {"state": "done", "result": previous.get("result"), "already_done": True}
        if task.force_since is not None and _older_than(previous, task.force_since):
            # --force, and nobody restarted the run since: start from nothing (under the lock, so
            # that no process executing the run loses its files; the lock file itself stays)
            store.clear(keep=(LOCK_FILE, "spec.json", LAUNCH_FILE))
            previous = store.read_status()
        store.remove_temp_files()  # of writes a killed predecessor left (checkpoints can be GBs)
        attempt = int(previous.get("attempt", 0)) + 1
        started = time.time()
        if not store.has_checkpoint():
            # Starting from nothing: rows of an earlier attempt that died before its first
            # checkpoint would otherwise be duplicated by this one.
            store.truncate_after(-1)
        writer = ProgressWriter(store.run_dir, iterations=cfg.iterations)
        if progress is not None:
            writer.add_listener(progress)
        try:
            # The run's threads are its config's (numerics.threads; solbench.machine.threads pins them to cores of
            # their own where free); the machine's side of its numerics is compared with what its first
            # attempt recorded, in env.json and in status.json (solbench.machine.numerics).
            on_gpu = cfg.device == "cuda" or (cfg.device == "auto" and _cuda())
            previous_env = _read_env(store)
            recorded = numerics.recorded_setting(previous_env, previous)
            with cpu_allocation(cfg.numerics.threads, device="cuda" if on_gpu else "cpu") as cpus:
                env = capture_env(cpus=cpus)
                now = numerics.setting_of(env)
                differ = numerics.differences(recorded, now, wanted_threads=cpus.wanted, why_threads=cpus.shortfall())
                if recorded is None and store.has_checkpoint():
                    log.warning("%s", numerics.unproven_warning(cfg.run_id))
                    differ.append("the first attempt's numerics are unknown (env.json and status.json lost)")
                elif differ:
                    log.warning("%s", numerics.resume_warning(cfg.run_id, differ, first=recorded is None))
                store.write_json("env.json", numerics.with_attempt(previous_env, env, attempt=attempt,
                                                                   recorded=recorded, differ=differ))
                store.write_status("running", attempt=attempt, host=socket.gethostname(), pid=os.getpid(),
                                   slurm_job_id=_slurm_job_id(), started_at=_now(), started_ts=started,
                                   numerics=recorded or now)
                run_fn = resolve_run_fn(task.run_fn)
                result = run_fn(cfg, store, progress=writer)
        except Exception as err:  # a crashed run is recorded and the others carry on
            tb = traceback.format_exc()
            log.error("run %s failed: %s", cfg.run_id, err)
            try:
                store.write_status("failed", attempt=attempt, error=f"{type(err).__name__}: {err}", traceback=tb,
                                   seconds=round(time.time() - started, 3), finished_at=_now(),
                                   slurm_job_id=_slurm_job_id(), started_ts=started)
            except SolbenchError as unwritten:  # a full disk: the status stays "running" and reads interrupted
                log.error("run %s: its failed status is not recorded either: %s", cfg.run_id, unwritten)
            return {"state": "failed", "error": f"{type(err).__name__}: {err}"}
        store.write_status("done", attempt=attempt, seconds=round(time.time() - started, 3), finished_at=_now(),
                           result=_jsonable(result), slurm_job_id=_slurm_job_id(), started_ts=started)
        return {"state": "done", "result": _jsonable(result)}


def _read_env(store: RunStore) -> dict | None:
    """The run's env.json (None when it has none, or an unreadable one: then no setting is reused)."""
    try:
        return store.read_json("env.json")
    except (OSError, ValueError) as err:
        log.warning("%s: unreadable env.json (%s); this attempt records its own numerics setting", store.run_dir, err)
        return None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _older_than(status: dict, since: float | None) -> bool:
    """Whether a --force request at ``since`` still has to restart the run of ``status``: its last
    execution began before the request. A status without ``started_ts`` (new, or pending after a
    requeue or after prepare_run cleared it) holds nothing older, except a done one of old code."""
    if since is None:
        return False
    started = status.get("started_ts")
    if started is None:
        return status["state"] == "done"
    return float(started) < since


def _slurm_job_id() -> str | None:
    if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def _jsonable(obj: Any) -> Any:
    try:
        return json.loads(json.dumps(obj, default=str))
    except (TypeError, ValueError):
        return str(obj)
