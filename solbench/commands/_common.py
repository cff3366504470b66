"""Helpers shared by the experiment commands (run, expand, collect, status, sweep), and the checks every
command makes before it starts (``check_environment``)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from solbench.text.bounded_text import clip, clip_repr



def check_environment() -> None:
    """Environment settings no command accepts, refused before any work as one line (a ConfigError) naming
    the variable, by every command, not only those that launch runs (fidelity and sweep run work outside the
    launcher): SOLBENCH_THREADS and SOLBENCH_CORE_LOCKS (solbench.machine.threads.check_env), SOLBENCH_QUANT_COMPILE_MIN
    (solbench.quant.fused.check_env: read at import without failing, refused here)."""
    from solbench.errors import ConfigError
    from solbench.quant.fused import check_env as check_fused_env
    from solbench.machine.threads import check_env

    try:
        check_env()
        check_fused_env()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def name_value(value: str) -> str:
    """argparse type of a name-like option (fidelity --name): a spec's name pattern, so that the folder it
    names stays inside --results (no path, no '..')."""
    from solbench.spec import NAME_PATTERN

    if not re.match(NAME_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a name: letters, digits, '_', '.' and '-', beginning "
                                         "with a letter or digit (it names a folder under --results, so no path)")
    return value


def finite_float(value: str) -> float:
    """argparse type of a real-valued option: a finite number (nan and inf are refused as a spec refuses them)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number")
    return number


def bounded_int(low: int, high: int, why: str):
    """argparse type of a whole number in [low, high); ``why`` says where the bounds come from."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not low <= number < high:
            raise argparse.ArgumentTypeError(f"{number} is not >= {low} and < {high} ({why})")
        return number

    return parse


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="experiment spec (YAML), e.g. experiments/tiny_main.yaml")


def add_results_argument(parser: argparse.ArgumentParser) -> None:
    """--results, default SOLBENCH_RESULTS (read when the command line is parsed), else results."""
    default = os.environ.get("SOLBENCH_RESULTS") or "results"
    parser.add_argument("--results", default=default, metavar="DIR",
                        help=f"results root (default: {default}; env SOLBENCH_RESULTS)")


def add_reports_argument(parser: argparse.ArgumentParser) -> None:
    """--reports, default SOLBENCH_REPORTS (read when the command line is parsed), else reports."""
    default = os.environ.get("SOLBENCH_REPORTS") or "reports"
    parser.add_argument("--reports", default=default, metavar="DIR",
                        help=f"reports root (default: {default}; env SOLBENCH_REPORTS)")


def add_only_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", metavar="RUN_ID", default=None,
                        help="restrict to these runs (run ids or unique prefixes, as `solbench expand` prints; an "
                             "empty or blank one is refused)")


def add_max_runs_argument(parser: argparse.ArgumentParser) -> None:
    from solbench.spec.resolver import MAX_RUNS

    parser.add_argument("--max-runs", type=bounded_int(1, 2**63, "a number of runs"), default=MAX_RUNS, metavar="N",
                        help=f"expand a spec of up to N runs (default {MAX_RUNS:,}: a larger matrix is refused "
                             "before it is expanded, as a typo such as seed: [0, ..., 99999] would make one)")


def load_spec_of(args):
    """``load_spec(args.spec)`` within ``args.max_runs``, saying on stderr how far an expansion that takes more
    than a few seconds has come."""
    import sys

    from solbench.spec import load_spec

    def progress(resolved: int, total: int, seconds: float) -> None:
        print(f"expanding {args.spec}: {resolved:,} of {total:,} combinations resolved ({seconds:.0f} s)",
              file=sys.stderr, flush=True)

    return load_spec(args.spec, max_runs=args.max_runs, progress=progress)


def console() -> Console:
    # soft_wrap: a message is never broken at the terminal width, so paths in it stay copyable
    return Console(highlight=False, soft_wrap=True)


def print_notes(out: Console, spec) -> None:
    for note in spec.notes:
        out.print(f"note: {note}", markup=False)


def print_table(out: Console, columns: list[str], rows: list[list[str]], title: str | None = None) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def filter_runs(spec, only):
    """The spec's runs restricted by --only (ids or prefixes); errors on an id that matches nothing."""
    from solbench.errors import ConfigError

    if not only:
        return spec.runs
    from solbench.launch.plan import check_only

    check_only(only)  # '' is a prefix of every id
    chosen = []
    for wanted in only:
        matches = [r for r in spec.runs if r.run_id.startswith(wanted)]
        if not matches:
            ids = [r.run_id for r in spec.runs]
            more = f" and {len(ids) - 20:,} more (`solbench expand SPEC --format ids`)" if len(ids) > 20 else ""
            raise ConfigError(f"--only {clip(wanted, 40)}: no run of {spec.path} has that id; ids: "
                              f"{', '.join(ids[:20])}{more}")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def experiment_dir(spec, results: str) -> Path:
    return Path(results) / spec.name


@contextlib.contextmanager
def report_lock(reports_root: str | os.PathLike, name: str) -> Iterator[None]:
    """Hold ``<reports>/.<name>.lock`` while collecting and writing one experiment's report, so two
    launchers of one spec do not swap report folders under each other; on entry, remove the
    temporary folders (``.<name>.*``) that a report writer killed mid-way left behind."""
    root = Path(reports_root)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, however the process ends
        for leftover in root.glob(f".{glob.escape(name)}.*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        yield
    finally:
        os.close(fd)


def report_is_current(spec, run_ids, results: str, reports: str) -> bool:
    """Whether reports/<name>/index.md was written from a collect of every run folder of ``run_ids``
    and nothing those runs wrote (status, tables) changed since. False after a collect or report
    that was interrupted, so `solbench run` writes it again instead of saying "nothing to do"."""
    index = Path(reports) / spec.name / "index.md"
    collected = experiment_dir(spec, results) / "collect_report.json"
    try:
        index_time, collect_time = index.stat().st_mtime, collected.stat().st_mtime
        collected_runs = json.loads(collected.read_text()).get("runs")
    except (OSError, ValueError):
        return False
    run_dirs = [spec.run_dir(results, run_id) for run_id in run_ids]
    if collected_runs != sum((d / "spec.json").exists() for d in run_dirs) or index_time < collect_time:
        return False
    written = [p.stat().st_mtime for d in run_dirs if d.is_dir() for p in d.iterdir()
               if p.name == "status.json" or p.suffix == ".jsonl"]
    return collect_time >= max(written, default=0.0)


def print_corrupt_lines(out: Console, corrupt, spec_arg: str = "SPEC", limit: int = 10, *,
                        header: str = "warning: {n} corrupt line(s) in the results tables") -> None:
    """Name every unreadable (torn or damaged) table line by file and line number, and the command
    that rewrites its rows."""
    corrupt = [bad if isinstance(bad, dict) else bad.to_dict() for bad in corrupt]
    if not corrupt:
        return
    out.print(header.format(n=len(corrupt)) + "; their rows are left out of the collected tables and the report:",
              markup=False)
    for bad in corrupt[:limit]:
        out.print(f"  {bad['path']}:{bad['line_number']}: {clip(bad['error'])}: {clip_repr(bad['text'], 60)}",
                  markup=False)
    if len(corrupt) > limit:
        out.print(f"  ... and {len(corrupt) - limit} more", markup=False)
    for hint in repair_hints(corrupt, spec_arg):
        out.print(f"  {hint}", markup=False)


def damaged_runs(run_dirs: dict[str, Path]) -> list[tuple[str, str]]:
    """(run_id, what it lacks) of the done runs that lost results (RunStore.damage)."""
    from solbench.results import RunStore

    return [(run_id, problem) for run_id, run_dir in run_dirs.items()
            if (problem := RunStore(run_dir, run_id).damage())]


def print_damaged(out: Console, damaged: list[tuple[str, str]], spec_arg: str = "SPEC") -> None:
    """One line per done run that lost results, naming what it lacks and the command that reruns it."""
    for run_id, problem in damaged:
        out.print(f"warning: run {run_id} is done but {problem}: its results are incomplete (a run without its "
                  f"spec.json is left out of the collected tables); `solbench run {spec_arg} --force --only {run_id}` "
                  "reruns it", markup=False)


def repair_hints(corrupt: list[dict], spec_arg: str) -> list[str]:
    """The commands that rewrite the rows of ``corrupt`` lines (CorruptLine dicts): resuming a run
    that is not done drops its torn last line and computes that step again; any other damaged row
    (of a finished run, or before a run's last checkpoint) only a rerun from scratch rewrites."""
    from solbench.results import RunStore

    resume, rerun = [], []
    for run_dir in dict.fromkeys(Path(bad["path"]).parent for bad in corrupt):
        lines = [bad for bad in corrupt if Path(bad["path"]).parent == run_dir]
        torn = all(_is_torn_tail(Path(bad["path"]), bad["line_number"]) for bad in lines)
        done = RunStore(run_dir, run_dir.name).read_status()["state"] == "done"
        (resume if torn and not done else rerun).append(run_dir.name)
    hints = []
    if resume:
        hints.append(f"`solbench run {spec_arg}` rewrites them: resuming {', '.join(resume)} drops the torn last "
                     "line and computes its step again")
    if rerun:
        hints.append(f"`solbench run {spec_arg} --force --only {' '.join(rerun)}` rewrites them (reruns from "
                     "scratch: resuming does not rewrite a finished run's rows, nor those before its last checkpoint)")
    return hints


def _is_torn_tail(path: Path, line_number: int) -> bool:
    """Whether line ``line_number`` of ``path`` is its last line and lacks its newline (a cut-short write)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return bool(data) and not data.endswith(b"\n") and data.count(b"\n") + 1 == line_number
