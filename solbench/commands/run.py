"""`solbench run SPEC`: run every run of a spec that is not done, then collect and report.

With ``launch: local`` (the default) the runs execute here, one after another, under a live
progress display. With a Slurm profile they are submitted as one job array and the command returns
once submitted (``--wait`` blocks until they end); ``solbench status SPEC`` follows them from disk.
Re-running a finished spec does nothing and says so; ``--force`` reruns from scratch.

Runs with world_size > 1 (several GPUs per run) start under torchrun on one machine
(``torchrun --nproc-per-node 8 -m solbench run SPEC``): every rank runs this command, rank 0 shows
progress, records results and writes the report. On Slurm the launch profile's tasks_per_node does it.
"""

from __future__ import annotations

from pathlib import Path

from solbench.commands._common import (DEFAULT_REPORTS, add_only_argument, add_results_argument, add_spec_argument,
                                       console, experiment_dir, filter_runs, print_notes)
from solbench.launch import DEFAULT_RUN_FN, launch_spec, run_states, wait_for_runs
from solbench.progress import LiveDisplay
from solbench.spec import load_spec

HELP = "run every run of a spec that is not done (locally or on Slurm), then collect results and write the report"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    parser.add_argument("--reports", default=DEFAULT_REPORTS, metavar="DIR", help="reports root (default: reports)")
    parser.add_argument("--launch", metavar="PROFILE", default=None,
                        help="launch profile overriding the spec's (local, debug, gpu, or a .yaml path)")
    parser.add_argument("--force", action="store_true", help="rerun runs that are done (their results are replaced)")
    parser.add_argument("--wait", action="store_true", help="on Slurm, block until every run has ended")
    add_only_argument(parser)
    parser.add_argument("--no-report", action="store_true", help="do not collect results nor write the report")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--run-fn", default=DEFAULT_RUN_FN, metavar="MODULE:FUNCTION",
                        help="the function that executes one run (default: the trainer; for tests and extensions)")


def main(args) -> int:
    from solbench.commands.status import build_board

    from solbench.distributed import launch_rank

    out = console()
    spec = load_spec(args.spec)
    main_rank = launch_rank() == 0  # under torchrun only rank 0 talks and reports
    if main_rank:
        print_notes(out, spec)
    runs = filter_runs(spec, args.only)
    only = [r.run_id for r in runs] if args.only else None
    board = build_board(spec, runs, args.results)
    display = LiveDisplay(board, enabled=not args.quiet and main_rank)

    with display:
        result = launch_spec(spec, args.results, profile_name=args.launch, run_fn=args.run_fn, force=args.force,
                             only=only, display=display)
    if not main_rank:
        return 0
    plan = result.plan
    if result.submission is None:
        reasons = sorted(set(plan.skipped.values()))
        out.print(f"nothing to do: all {len(plan.skipped)} runs of {spec.name} are {' or '.join(reasons)} "
                  f"(results in {experiment_dir(spec, args.results)}; --force reruns)", markup=False)
        return 0
    if plan.skipped:
        out.print(f"skipped {len(plan.skipped)} runs ({', '.join(sorted(set(plan.skipped.values())))})", markup=False)

    run_dirs = {r.run_id: spec.run_dir(args.results, r.run_id) for r in runs}
    if result.executor == "slurm":
        jobs = sorted(set(j.split("_")[0] for j in result.submission.job_ids.values()))
        out.print(f"submitted {len(result.submission.job_ids)} runs to Slurm as job array {', '.join(jobs)} "
                  f"(profile {result.profile_path})", markup=False)
        if not args.wait:
            out.print(f"follow with: solbench status {args.spec}", markup=False)
            return 0
        with LiveDisplay(board, enabled=not args.quiet) as waiting:
            wait_for_runs(run_dirs, display=waiting)

    states = {rid: s for rid, (s, _) in run_states(run_dirs).items()}
    failed = sorted(rid for rid, s in states.items() if s != "done")
    if not args.no_report:
        finish_with_report(out, spec, args)
    if failed:
        out.print(f"{len(failed)} run(s) did not finish: {', '.join(failed)} "
                  f"(see `solbench status {args.spec} --tracebacks`)", markup=False)
        return 1
    return 0


def finish_with_report(out, spec, args) -> Path | None:
    """Collect the spec's runs into parquet and write the report; prints where both are."""
    from solbench.commands.collect import print_collect
    from solbench.results import collect

    result = collect(experiment_dir(spec, args.results), [r.run_id for r in spec.runs])
    print_collect(result)
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
