"""Deciding which runs of a spec to launch, and preparing their folders before any launcher runs them.

The launcher writes spec.json and status.json ``pending`` (``prepare_run``) before anything runs,
only while it can take the run lock, so two launchers of one spec never delete files under each
other; ``Submission`` is what a launcher (solbench.launch.local, solbench.launch.slurm) returns.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.errors import ConfigError
from solbench.results import RunStore

from .execute import _now
from .locks import LOCK_FILE, run_lock
from .states import run_states


@dataclass
class LaunchPlan:
    """What ``launch_spec`` decided per run: launch it, or why not."""

    to_launch: list[Any]  # PlannedRun
    skipped: dict[str, str]  # run_id -> reason (done, running, ...)
    states: dict[str, str]  # run_id -> state before launching


def check_only(only: Sequence[str] | None) -> None:
    """ConfigError for an empty or blank run id prefix: every id starts with '', so `--force --only ''` would
    rerun every run of the spec."""
    for wanted in only or ():
        if not wanted.strip():
            raise ConfigError(f"--only {wanted!r}: no run id (an empty prefix would select every run); give run "
                              "ids or their first characters, as `solbench expand SPEC --format ids` prints them")


def plan_runs(spec, results_root: Path, *, force: bool = False, only: Sequence[str] | None = None) -> LaunchPlan:
    """Decide which runs to launch: everything not done (and not alive), or everything with force."""
    check_only(only)
    runs = [r for r in spec.runs if not only or r.run_id in only or any(r.run_id.startswith(o) for o in only)]
    run_dirs = {r.run_id: spec.run_dir(results_root, r.run_id) for r in runs}
    links = [problem for rid, run_dir in run_dirs.items() if (problem := RunStore(run_dir, rid).link_problem())]
    if links:  # before any lock, status or --force clear writes or deletes through one
        raise ConfigError("; ".join(links))
    states = run_states(run_dirs)
    to_launch, skipped = [], {}
    for run in runs:
        state, _ = states[run.run_id]
        if state in ("pending", "running"):
            skipped[run.run_id] = f"already {state}"
        elif state == "done" and not force:
            skipped[run.run_id] = "done"
        else:
            to_launch.append(run)
    return LaunchPlan(to_launch, skipped, {rid: s for rid, (s, _) in states.items()})


def preflight(spec, runs: Sequence[Any]) -> None:
    """Checks that need the launching machine: prompt files given as paths exist."""
    from solbench.spec import is_prompt_path

    missing = []
    for run in runs:
        for key, name in (("train_prompts", run.config.train_prompts), ("eval.prompts", run.config.eval.prompts)):
            if is_prompt_path(name) and not Path(name).expanduser().exists():
                missing.append(f"{key}: {name}")
    if missing:
        raise ConfigError(f"{spec.path}: prompt files not found: {', '.join(sorted(set(missing)))} "
                          "(see experiments/README.md, 'Prompt sets')")


def prepare_run(run, run_dir: Path, *, force: bool, force_since: float | None = None) -> RunStore:
    """Write spec.json and the pending status of a run about to launch (--force starts it afresh).

    Only while no other process holds the run: a run being executed elsewhere keeps its files and
    status (execute_run sorts it out under the lock), and a run finished since this launcher planned
    it keeps its done status unless forced and finished before the request (``force_since``).
    """
    store = RunStore(run_dir, run.run_id)
    problem = store.link_problem()  # (plan_runs said so for a spec's runs; a sweep's trials come here directly)
    if problem:
        raise ConfigError(problem)
    with run_lock(run_dir) as held:
        if not held:
            return store
        status = store.read_status()
        # with --force, whatever did not start after the request is stale: the run restarts from nothing
        stale = force and not (force_since is not None and float(status.get("started_ts", -1)) >= force_since)
        if status["state"] == "done" and not stale:
            return store  # finished by another launcher meanwhile: execute_run will reuse it
        if stale:
            store.clear(keep=(LOCK_FILE,))
        store.write_json("spec.json", run.config.to_dict())
        store.write_status("pending", submitted_at=_now(), launcher_host=socket.gethostname(),
                           launcher_pid=os.getpid())
    return store


@dataclass
class Submission:
    """Result of launching: per run the final state (local) or the Slurm job id."""

    executor: str
    states: dict[str, str] = field(default_factory=dict)  # local: run_id -> done | failed
    job_ids: dict[str, str] = field(default_factory=dict)  # slurm: run_id -> job id
