"""`solbench run SPEC`: run every run of a spec that is not done, then collect and report.

With ``launch: local`` (the default) the runs execute on this machine under a live progress
display, one run per core at a time, each in a worker process (``--workers`` changes how many; 1
runs them one after another in this process). With a Slurm profile they are submitted as one job
array and the command returns once submitted (``--wait`` blocks until they end); ``solbench status
SPEC`` follows them from disk.
Re-running a finished spec runs nothing and says so; it still collects and writes the report when
that is missing or older than the results (a collect or report that was interrupted). Runs that
another process is executing (a second ``solbench run`` of the same spec) are waited for, not
counted as failed. ``--force`` reruns from scratch.

Runs with world_size > 1 (several GPUs per run) start under torchrun on one machine
(``torchrun --nproc-per-node 8 -m solbench run SPEC``): every rank runs this command, rank 0 shows
progress, records results and writes the report. On Slurm the launch profile's tasks_per_node does it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from solbench.commands._common import (add_max_runs_argument, add_only_argument, add_reports_argument,
                                       add_results_argument, add_spec_argument, console, damaged_runs, experiment_dir,
                                       filter_runs, load_spec_of, print_damaged, print_notes, report_is_current,
                                       report_lock)
from solbench.launch import DEFAULT_RUN_FN, TERMINAL_STATES, WORKERS_ENV, launch_spec, run_states, wait_for_runs
from solbench.train.progress import LiveDisplay

HELP = "run every run of a spec that is not done (locally or on Slurm), then collect results and write the report"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    add_reports_argument(parser)
    parser.add_argument("--launch", metavar="PROFILE", default=None,
                        help="launch profile overriding the spec's (local, debug, gpu, or a .yaml path)")
    parser.add_argument("--force", action="store_true", help="rerun runs that are done (their results are replaced)")
    parser.add_argument("--wait", action="store_true", help="on Slurm, block until every run has ended")
    parser.add_argument("--workers", metavar="N", default=None, type=_workers,
                        help="locally: runs at once, each in its own process on its share of the cores "
                             "('auto': one per core; 1: one after another in this process; default: the profile's)")
    add_only_argument(parser)
    add_max_runs_argument(parser)
    parser.add_argument("--no-report", action="store_true", help="do not collect results nor write the report")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--run-fn", default=DEFAULT_RUN_FN, metavar="MODULE:FUNCTION",
                        help="the function that executes one run (default: the trainer; for tests and extensions)")


def _workers(value: str) -> str:
    """--workers: a whole number >= 1 or 'auto' (argparse names the flag in its error)."""
    if value != "auto" and not (value.isdigit() and int(value) >= 1):
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of runs at once (>= 1) or 'auto'")
    return value


def main(args) -> int:
    from solbench.commands.status import build_board

    from solbench.engine.distributed import launch_rank

    out = console()
    if args.workers is not None:
        os.environ[WORKERS_ENV] = str(args.workers)  # read by launch.local_workers, checked there
    spec = load_spec_of(args)
    spec.check_files()
    main_rank = launch_rank() == 0  # under torchrun only rank 0 talks and reports
    if main_rank:
        print_notes(out, spec)
    runs = filter_runs(spec, args.only)
    only = [r.run_id for r in runs] if args.only else None
    board = build_board(spec, runs, args.results)
    display = LiveDisplay(board, enabled=not args.quiet and main_rank)

    force_since = time.time() if args.force else None  # --force redoes what started before this request
    with display:
        result = launch_spec(spec, args.results, profile_name=args.launch, run_fn=args.run_fn, force=args.force,
                             only=only, display=display, force_since=force_since)
    if not main_rank:
        return 0
    plan = result.plan
    if result.submission is not None and plan.skipped:
        out.print(f"skipped {len(plan.skipped)} runs ({', '.join(sorted(set(plan.skipped.values())))})", markup=False)

    run_dirs = {r.run_id: spec.run_dir(args.results, r.run_id) for r in runs}
    if result.executor == "slurm" and result.submission is not None:
        jobs = sorted(set(j.split("_")[0] for j in result.submission.job_ids.values()))
        out.print(f"submitted {len(result.submission.job_ids)} runs to Slurm as job array {', '.join(jobs)} "
                  f"(profile {result.profile_path})", markup=False)
        if not args.wait:
            out.print(f"follow with: solbench status {args.spec}", markup=False)
            return 0
        with LiveDisplay(board, enabled=not args.quiet) as waiting:
            wait_for_runs(run_dirs, display=waiting)

    states = {rid: s for rid, (s, _) in run_states(run_dirs).items()}
    busy = sorted(rid for rid, s in states.items() if s not in TERMINAL_STATES)
    if busy and result.executor == "slurm" and not args.wait:
        out.print(f"nothing to submit: {len(busy)} run(s) already pending or running "
                  f"(follow with: solbench status {args.spec})", markup=False)
        return 0
    if busy:
        # Runs another launcher is executing (a second `solbench run` of this spec, racing Slurm
        # tasks): they are not failed; wait for them, then report on the whole spec.
        out.print(f"waiting for {len(busy)} run(s) that another process is executing: {', '.join(busy)}",
                  markup=False)
        with LiveDisplay(board, enabled=not args.quiet) as waiting:
            wait_for_runs({rid: run_dirs[rid] for rid in busy}, display=waiting)
        if args.force and result.executor != "slurm":
            result = _force_what_others_ran(out, spec, args, result, busy, run_dirs, force_since, board)
        states = {rid: s for rid, (s, _) in run_states(run_dirs).items()}

    failed = sorted(rid for rid, s in states.items() if s != "done")
    damaged = damaged_runs(run_dirs)  # done runs that lost results since: said, and the command exits 1
    print_damaged(out, damaged, args.spec)
    if result.submission is None and not failed:
        # Nothing left to train. The report is still written unless it is up to date, so that a
        # collect or report that was interrupted is finished by running the spec again.
        done = f"nothing to do: all {len(states)} runs of {spec.name} are done"
        new_fidelity = False
        if (getattr(spec, "fidelity", None) is not None or getattr(spec, "speed", None) is not None) \
                and not args.no_report:  # e.g. after Slurm runs ended
            from solbench.fidelity.experiment import fidelity_run_ids

            before = set(fidelity_run_ids(experiment_dir(spec, args.results)))
            new_fidelity = bool(set(run_fidelity_block(out, spec, args)) - before)
        if args.no_report or (not new_fidelity and report_is_current(spec, report_run_ids(spec, args.results),
                                                                     args.results, args.reports)):
            out.print(f"{done} (results in {experiment_dir(spec, args.results)}; --force reruns)", markup=False)
            return 1 if damaged else 0
        out.print(f"{done}; the report is missing or older than the results: writing it", markup=False)
        return 0 if report_or_say_why(out, spec, args) and not damaged else 1
    reported = True
    if not args.no_report:
        run_fidelity_block(out, spec, args)
        reported = report_or_say_why(out, spec, args)
    if failed:
        out.print(f"{len(failed)} run(s) did not finish: {', '.join(failed)} "
                  f"(see `solbench status {args.spec} --tracebacks`)", markup=False)
        return 1
    return 0 if reported and not damaged else 1


def _force_what_others_ran(out, spec, args, result, waited: list[str], run_dirs, force_since: float, board):
    """--force beside another launcher: the runs it was executing when this one planned were waited for;
    those whose execution started before the --force request are run again now (those it started
    after are the fresh results --force asked for)."""
    from solbench.launch import _older_than

    states = run_states({rid: run_dirs[rid] for rid in waited})
    stale = [rid for rid in waited if _older_than(states[rid][1], force_since)]
    if not stale:
        return result
    out.print(f"--force: {len(stale)} run(s) another process was executing started before this request; running "
              f"them again: {', '.join(stale)}", markup=False)
    with LiveDisplay(board, enabled=not args.quiet) as display:
        again = launch_spec(spec, args.results, profile_name=args.launch, run_fn=args.run_fn, force=True, only=stale,
                            display=display, force_since=force_since)
    if result.submission is None:
        return again
    if again.submission is not None:
        result.submission.states.update(again.submission.states)
    return result


def report_or_say_why(out, spec, args) -> bool:
    """finish_with_report; where the results cannot be written (a full disk, a read-only folder) one line
    says so instead of a traceback, and the command goes on to its summary. Returns whether it wrote."""
    from solbench.errors import SolbenchError
    from solbench.results import storage_error

    try:
        finish_with_report(out, spec, args)
    except (SolbenchError, OSError) as err:
        problem = err if isinstance(err, SolbenchError) else storage_error(err)
        if problem is None:
            raise
        out.print(f"collect and report failed: {problem}", markup=False)
        return False
    return True


def run_speed_block(out, spec, args) -> bool:
    """`solbench run`'s speed block after training (and after the fidelity block: it needs the machine alone);
    whether it timed a round now. A failure (no quiet machine) is said, not fatal: the training runs' report is
    still written."""
    if getattr(spec, "speed", None) is None:
        return False
    from solbench.speed.block import run_spec_block

    try:
        summary = run_spec_block(spec, args.results, echo=lambda m: out.print(m, markup=False))
    except Exception as err:  # noqa: BLE001 - the report of the training runs must still be written
        out.print(f"speed block failed: {type(err).__name__}: {err}", markup=False)
        return False
    return bool(summary and summary["ran"])


def run_fidelity_block(out, spec, args) -> list[str]:
    """The spec's ``fidelity:`` block (all-seeds ranking fidelity after training); a failure is reported,
    not fatal: the training results still get their report."""
    ids: list[str] = []
    if getattr(spec, "fidelity", None) is not None:
        from solbench.fidelity.experiment import run_spec_block

        try:
            ids = run_spec_block(spec, args.results, force=args.force, echo=lambda m: out.print(m, markup=False))
        except Exception as err:  # noqa: BLE001 - the report of the training runs must still be written
            out.print(f"fidelity block failed: {type(err).__name__}: {err}", markup=False)
    # then the speed: block, alone on the machine (solbench.speed); a round timed now is new to the report
    return ids + (["speed block"] if run_speed_block(out, spec, args) else [])


def finish_with_report(out, spec, args) -> Path | None:
    """Collect the spec's runs into parquet and write the report; prints where both are."""
    from solbench.commands.collect import print_collect
    from solbench.collect import collect

    with report_lock(args.reports, spec.name):  # one writer at a time; removes a killed writer's leftovers
        result = collect(experiment_dir(spec, args.results), report_run_ids(spec, args.results))
        print_collect(result, args.spec)
        try:
            from solbench.report import write_report
        except ImportError:
            try:
                from solbench.report.build import write_report
            except ImportError:
                out.print("report: solbench.report is not available; collected tables are listed above", markup=False)
                return None
        path = Path(write_report(spec.path, args.results, args.reports))
    out.print(f"report: {path}", markup=False)
    return path


def report_run_ids(spec, results) -> list[str]:
    """The runs the report is made of: the spec's, plus those of its ``fidelity:`` block."""
    from solbench.fidelity.experiment import fidelity_run_ids

    return [r.run_id for r in spec.runs] + (fidelity_run_ids(experiment_dir(spec, results)) if spec.fidelity else [])
