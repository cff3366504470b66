"""`solbench status SPEC`: the state of every run of a spec, read from results/ (not from a live process)."""

from __future__ import annotations

import time

from solbench.commands._common import add_only_argument, add_results_argument, add_spec_argument, console, filter_runs
from solbench.launch import TERMINAL_STATES, run_states
from solbench.progress import Board, LiveDisplay, RunLine, label_of
from solbench.spec import load_spec

HELP = "show the state of every run of a spec (done, failed, running, pending, interrupted, new)"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    add_only_argument(parser)
    parser.add_argument("--watch", action="store_true", help="keep refreshing until every run has ended")
    parser.add_argument("--tracebacks", action="store_true", help="print the traceback of each failed run")


def build_board(spec, runs, results) -> Board:
    run_dirs = {r.run_id: spec.run_dir(results, r.run_id) for r in runs}
    lines = [RunLine(r.run_id, r.method, label_of(r.axes), iterations=r.config.iterations) for r in runs]

    return Board(spec.name, lines, lambda: run_states(run_dirs), run_dirs)


def main(args) -> int:
    spec = load_spec(args.spec)
    runs = filter_runs(spec, args.only)
    board = build_board(spec, runs, args.results)
    out = console()
    if args.watch:
        with LiveDisplay(board, stream=out.file) as display:
            while not all(line.state in TERMINAL_STATES for line in board.lines):
                time.sleep(2)
                display.tick()
    board.poll()
    out.print(board.render())
    if args.tracebacks:
        states = run_states({r.run_id: spec.run_dir(args.results, r.run_id) for r in runs})
        for run_id, (state, status) in states.items():
            if state == "failed":
                out.print(f"--- {run_id} ({status.get('error', '')})", markup=False)
                out.print(status.get("traceback", "(no traceback recorded)"), markup=False)
    return 0
