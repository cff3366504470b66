"""Helpers shared by the experiment commands (run, expand, collect, status, sweep)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

DEFAULT_RESULTS = os.environ.get("SOLBENCH_RESULTS", "results")
DEFAULT_REPORTS = os.environ.get("SOLBENCH_REPORTS", "reports")


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="experiment spec (YAML), e.g. experiments/tiny_main.yaml")


def add_results_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR",
                        help=f"results root (default: {DEFAULT_RESULTS}; env SOLBENCH_RESULTS)")


def add_only_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", nargs="+", metavar="RUN_ID", default=None,
                        help="restrict to these runs (run ids or unique prefixes, as `solbench expand` prints)")


def console() -> Console:
    return Console(highlight=False)


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
    chosen = []
    for wanted in only:
        matches = [r for r in spec.runs if r.run_id.startswith(wanted)]
        if not matches:
            raise ConfigError(f"--only {wanted}: no run of {spec.path} has that id; ids: "
                              f"{', '.join(r.run_id for r in spec.runs)}")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def experiment_dir(spec, results: str) -> Path:
    return Path(results) / spec.name
