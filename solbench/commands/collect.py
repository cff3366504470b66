"""`solbench collect SPEC`: merge the runs' JSONL tables into parquet tables under results/<experiment>/."""

from __future__ import annotations

from solbench.commands._common import (add_max_runs_argument, add_results_argument, add_spec_argument, console,
                                       experiment_dir, load_spec_of, print_corrupt_lines, print_damaged)
from solbench.collect import collect

HELP = "merge an experiment's run results into parquet tables (runs, metrics, timings, candidates)"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    parser.add_argument("--all", action="store_true",
                        help="collect every run folder of the experiment, also runs the spec no longer lists")
    add_max_runs_argument(parser)


def main(args) -> int:
    spec = load_spec_of(args)
    result = collect(experiment_dir(spec, args.results), None if args.all else [r.run_id for r in spec.runs])
    print_collect(result, args.spec)
    print_damaged(console(), result.damaged, args.spec)
    return 1 if result.damaged else 0


def print_collect(result, spec_arg: str = "SPEC") -> None:
    out = console()
    out.print(f"collected {result.runs} runs into {result.experiment_dir}/", markup=False)
    for name, (path, rows) in result.tables.items():
        out.print(f"  {path.name:<20} {rows:>8} rows", markup=False)
    print_corrupt_lines(out, result.corrupt, spec_arg,
                        header="skipped {n} corrupt line(s) (listed in collect_report.json)")
