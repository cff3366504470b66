"""Live progress of an experiment: runs done/failed/running and, per run, iteration, phase and reward.

Everything shown is read from the results folder (status.json and progress.json of each run), so the
same display serves in-process runs and Slurm jobs on other machines. Inside a run, the launcher's
``ProgressWriter`` turns the trainer's ``progress(run_id, step, phase, info)`` calls into a throttled
progress.json. On a terminal the board is a rich table refreshed in place; elsewhere (CI logs) it
prints one line per state change and per new iteration.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.results import atomic_write_bytes

PROGRESS_FILE = "progress.json"


class ProgressWriter:
    """The trainer's ``progress`` callback for one run: writes progress.json at most once a second
    (and always when the iteration changes), so a display in another process can follow the run."""

    def __init__(self, run_dir: str | Path, iterations: int | None = None, min_interval_s: float = 1.0):
        self.path = Path(run_dir) / PROGRESS_FILE
        self.iterations = iterations
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self._last_step: int | None = None
        self._info_step: int | None = None
        self._step_info: dict = {}
        self._listeners: list[Callable[[str, int, str, dict], None]] = []

    def add_listener(self, listener: Callable[[str, int, str, dict], None]) -> None:
        self._listeners.append(listener)

    def __call__(self, run_id: str, step: int, phase: str, info: dict | None = None) -> None:
        info = dict(info or {})
        # a step's record keeps what earlier calls of the same step said: its training reward stays in it
        # when its evaluation is reported (the board would otherwise show the previous step's reward)
        self._step_info = {**self._step_info, **info} if step == self._info_step else dict(info)
        self._info_step = step
        now = time.monotonic()
        if step != self._last_step or now - self._last_write >= self.min_interval_s:
            self._last_step, self._last_write = step, now
            record = {"run_id": run_id, "step": int(step), "iterations": self.iterations, "phase": phase,
                      "info": {k: _plain(v) for k, v in self._step_info.items()}, "time": time.time()}
            atomic_write_bytes(self.path, json.dumps(record).encode(), fsync=False)
        for listener in self._listeners:
            listener(run_id, step, phase, info)


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        try:
            value = item()
        except (TypeError, ValueError, RuntimeError):
            return str(value)
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def read_progress(run_dir: str | Path) -> dict:
    path = Path(run_dir) / PROGRESS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class RunLine:
    """One row of the board."""

    run_id: str
    method: str
    label: str  # the run's matrix values, e.g. "n=16 k=4"
    state: str = "new"
    step: int | None = None
    iterations: int | None = None
    phase: str = ""
    reward: float | None = None
    error: str = ""


def reward_of(info: dict) -> float | None:
    """The number worth showing from a progress info dict: 'reward' if present, else an eval reward."""
    for key in ("reward", "eval_reward"):
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


STATE_STYLES = {"done": "green", "failed": "red", "running": "cyan", "pending": "yellow",
                "interrupted": "magenta", "new": "dim"}


@dataclass
class Board:
    """The state of every run of one experiment, refreshed from disk by ``poll``."""

    title: str
    lines: list[RunLine]
    read_states: Callable[[], dict[str, tuple[str, dict]]]  # {run_id: (effective state, status dict)}
    run_dirs: dict[str, Path]
    started: float = field(default_factory=time.monotonic)

    def poll(self) -> list[tuple[RunLine, str]]:
        """Refresh every line; returns (line, what changed) for state changes and new iterations."""
        changes = []
        states = self.read_states()
        for line in self.lines:
            state, status = states[line.run_id]
            progress = read_progress(self.run_dirs[line.run_id])
            old_state, old_step = line.state, line.step
            line.state = state
            if progress:
                line.step = progress.get("step")
                line.iterations = progress.get("iterations") or line.iterations
                line.phase = str(progress.get("phase", ""))[:40]  # progress.json may hold anything: a phase name is short
                reward = reward_of(progress.get("info", {}))
                line.reward = reward if reward is not None else line.reward
            line.error = (status.get("error") or "").splitlines()[0][:80] if status.get("error") else ""
            if state != old_state:
                changes.append((line, f"{old_state} -> {state}"))
            elif state == "running" and line.step != old_step and line.step is not None:
                changes.append((line, "step"))
        return changes

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.lines:
            counts[line.state] = counts.get(line.state, 0) + 1
        return counts

    def summary(self) -> str:
        counts = self.counts()
        order = ["done", "failed", "running", "pending", "interrupted", "new"]
        parts = [f"{counts[s]} {s}" for s in order if counts.get(s)]
        elapsed = time.monotonic() - self.started
        return f"{self.title}: {len(self.lines)} runs: {', '.join(parts)} ({elapsed:.0f} s)"

    def render(self):
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=escape(self.summary()), title_justify="left", expand=False)
        for column in ("run", "method", "params", "state", "iter", "phase", "reward", "error"):
            table.add_column(column, no_wrap=column != "error")
        for line in self.lines:
            iteration = "" if line.step is None else f"{line.step}/{line.iterations or '?'}"
            reward = "" if line.reward is None else f"{line.reward:.4f}"
            style = STATE_STYLES.get(line.state, "")
            # text from the runs is shown as written: "[enforce fail at ...]" in an error is no markup
            table.add_row(escape(line.run_id[:8]), escape(line.method), escape(line.label), f"[{style}]{line.state}[/]",
                          iteration, escape(line.phase) if line.state == "running" else "", reward, escape(line.error))
        return table


class LiveDisplay:
    """Shows a Board while work goes on: a live table on a terminal, log lines elsewhere.

    Use as a context manager and call ``tick()`` now and then (the terminal view also refreshes on
    its own twice a second from a background thread).
    """

    def __init__(self, board: Board, *, stream=None, enabled: bool = True, log_steps: bool = True):
        from rich.console import Console

        self.board = board
        # soft_wrap: log lines stay whole in files and CI logs instead of wrapping at 80 columns.
        self.console = Console(file=stream or sys.stderr, soft_wrap=True)
        self.enabled = enabled
        self.log_steps = log_steps
        self._live = None
        self._last_tick = 0.0

    def __enter__(self) -> "LiveDisplay":
        self.board.poll()
        if self.enabled and self.console.is_terminal:
            from rich.live import Live

            self._live = Live(get_renderable=self._render_polled, console=self.console, refresh_per_second=2,
                              transient=False)
            self._live.__enter__()
        return self

    def _render_polled(self):
        self.board.poll()
        return self.board.render()

    def tick(self, force: bool = False) -> None:
        """Log what changed since the last tick (at most twice a second unless forced)."""
        if self._live is not None or not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_tick < 0.5:
            return
        self._last_tick = now
        for line, change in self.board.poll():
            if change == "step" and not self.log_steps:
                continue
            iteration = "" if line.step is None else f" iter {line.step}/{line.iterations or '?'}"
            reward = "" if line.reward is None else f" reward {line.reward:.4f}"
            what = f"{line.phase}" if change == "step" else change
            error = f" ({line.error})" if line.error and line.state == "failed" else ""
            self.console.print(f"[{line.run_id[:8]} {line.method} {line.label}] {what}{iteration}{reward}{error}",
                               highlight=False, markup=False)

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
        else:
            self.tick(force=True)
        if self.enabled:
            self.console.print(self.board.summary(), highlight=False, markup=False)


def label_of(axes: dict[str, Any], skip: Sequence[str] = ("method",)) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in axes.items() if k not in skip)


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value)
