"""`solbench expand SPEC`: validate a spec and print its runs and their count, without running.

Expand is the planning command: a spec whose prompt files are not on this machine yet (the real-model specs'
data/pickscore files) is still printed, followed on stderr by the files it lacks and the command that fetches
each; `solbench run` refuses it until they are there."""

from __future__ import annotations

import json
import sys

from solbench.commands._common import (add_max_runs_argument, add_spec_argument, console, load_spec_of, print_notes,
                                       print_table)
from solbench.spec import check_launch, load_profile, runs_table

HELP = "validate a spec and print its run table (run ids, methods, axes) without running anything"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    parser.add_argument("--format", choices=("table", "ids", "json"), default="table",
                        help="table (default), ids (one run id per line) or json (the resolved run configs)")
    add_max_runs_argument(parser)


def main(args) -> int:
    spec = load_spec_of(args)
    check_launch(spec, *load_profile(spec.launch, spec.path))
    out = console()
    if args.format == "ids":
        for run in spec.runs:
            print(run.run_id)
    elif args.format == "json":
        print(json.dumps([{"run_id": r.run_id, **r.config.to_dict()} for r in spec.runs], indent=2))
    else:
        columns, rows = runs_table(spec)
        print_table(out, columns, rows, title=f"{spec.name} ({spec.path})")
        methods = sorted({r.method for r in spec.runs})
        out.print(f"{len(spec.runs)} runs ({len(methods)} methods: {', '.join(methods)}); launch profile: "
                  f"{spec.launch}", markup=False)
        print_notes(out, spec)
    if spec.missing_files:  # on stderr: the ids and json on stdout stay what a script reads
        sys.stdout.flush()
        for line in spec.missing_files:
            print(f"warning: {line}", file=sys.stderr)
        print(f"warning: `solbench run {args.spec}` refuses the spec until these files are there (checked "
              "then: their prompts against the counts and rewards the runs ask of them)", file=sys.stderr)
    return 0
