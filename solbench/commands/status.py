"""`solbench status SPEC`: the state of every run of a spec, read from results/ (not from a live process).

Below the table: where the log of a failed or interrupted Slurm job is, and every corrupt (torn)
line of the runs' tables by file and line."""

from __future__ import annotations

import time
from pathlib import Path

from solbench.text.bounded_text import clip, clip_end
from solbench.commands._common import (add_max_runs_argument, add_only_argument, add_results_argument,
                                       add_spec_argument, console, damaged_runs, filter_runs, load_spec_of,
                                       print_corrupt_lines, print_damaged)
from solbench.launch import TERMINAL_STATES, read_launch, run_states
from solbench.train.progress import Board, LiveDisplay, RunLine, label_of
from solbench.results import RunStore

HELP = "show the state of every run of a spec (done, failed, running, pending, interrupted, new)"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    add_only_argument(parser)
    parser.add_argument("--watch", action="store_true", help="keep refreshing until every run has ended")
    parser.add_argument("--tracebacks", action="store_true", help="print the traceback of each failed run")
    add_max_runs_argument(parser)


def build_board(spec, runs, results) -> Board:
    run_dirs = {r.run_id: spec.run_dir(results, r.run_id) for r in runs}
    lines = [RunLine(r.run_id, r.method, label_of(r.axes), iterations=r.config.iterations) for r in runs]

    return Board(spec.name, lines, lambda: run_states(run_dirs), run_dirs)


def main(args) -> int:
    spec = load_spec_of(args)
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
    run_dirs = {r.run_id: spec.run_dir(args.results, r.run_id) for r in runs}
    states = run_states(run_dirs)
    for run_id, (state, status) in states.items():
        logs = slurm_logs(run_dirs[run_id], status) if state in ("failed", "interrupted") else None
        if logs:
            out.print(f"{run_id} {state}: Slurm job log {logs[1]} (stdout {logs[0]})", markup=False)
    print_corrupt_lines(out, [bad for run_id, run_dir in run_dirs.items()
                              for bad in RunStore(run_dir, run_id).corrupt_lines()], args.spec)
    print_damaged(out, damaged_runs(run_dirs), args.spec)
    if args.tracebacks:  # what status.json holds, bounded: a results folder from elsewhere may hold anything
        for run_id, (state, status) in states.items():
            if state == "failed":
                out.print(f"--- {run_id} ({clip(status.get('error', ''), 1000)})", markup=False)
                out.print(clip_end(status.get("traceback", "(no traceback recorded)"), 20_000), markup=False)
    return 0


def slurm_logs(run_dir: Path, status: dict) -> tuple[Path, Path] | None:
    """(stdout, stderr) files of the Slurm job that last ran the run, from launch.json's submitit
    folder and the job id (the requeued or executing job's from status.json, else the submitted one)."""
    launch = read_launch(run_dir)
    job_id = status.get("slurm_job_id") or launch.get("job_id")
    if launch.get("executor") != "slurm" or not job_id or not launch.get("submitit_folder"):
        return None
    from submitit.core.utils import JobPaths

    paths = JobPaths(launch["submitit_folder"], job_id=str(job_id), task_id=0)  # task 0: the run's rank 0
    return paths.stdout, paths.stderr
