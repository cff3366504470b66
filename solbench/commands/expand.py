"""`solbench expand SPEC`: validate a spec and print its runs and their count, without running."""

from __future__ import annotations

import json

from solbench.commands._common import add_spec_argument, console, print_notes, print_table
from solbench.spec import check_launch, load_profile, load_spec, runs_table

HELP = "validate a spec and print its run table (run ids, methods, axes) without running anything"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    parser.add_argument("--format", choices=("table", "ids", "json"), default="table",
                        help="table (default), ids (one run id per line) or json (the resolved run configs)")


def main(args) -> int:
    spec = load_spec(args.spec)
    spec.check_files()
    check_launch(spec, *load_profile(spec.launch, spec.path))
    out = console()
    if args.format == "ids":
        for run in spec.runs:
            print(run.run_id)
        return 0
    if args.format == "json":
        print(json.dumps([{"run_id": r.run_id, **r.config.to_dict()} for r in spec.runs], indent=2))
        return 0
    columns, rows = runs_table(spec)
    print_table(out, columns, rows, title=f"{spec.name} ({spec.path})")
    methods = sorted({r.method for r in spec.runs})
    out.print(f"{len(spec.runs)} runs ({len(methods)} methods: {', '.join(methods)}); launch profile: {spec.launch}",
              markup=False)
    print_notes(out, spec)
    return 0
