"""`solbench report SPEC`: tables and figures laid out like the paper's, from collected results alone.

Reads results/<experiment>/*.parquet (written by `solbench collect`, also run at the end of
`solbench run`) and writes reports/<experiment>/: index.md, index.html (figures embedded), one CSV
per table and one PNG per figure. SPEC is a spec file (its `experiment` name and optional `report:`
options are used), an experiment name, or a results folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from solbench.text.bounded_text import clip
from solbench.commands._common import (add_reports_argument, add_results_argument, console, print_corrupt_lines,
                                       report_lock)

HELP = "write reports/<experiment>/ (Markdown, HTML, CSV, PNG) from an experiment's collected results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", nargs="?", help="spec YAML file, experiment name, or results/<experiment> folder")
    add_results_argument(parser)
    add_reports_argument(parser)
    parser.add_argument("--only", default=None, help="comma-separated report kinds to run (see --list)")
    parser.add_argument("--list", action="store_true", help="list the report kinds and exit")
    parser.add_argument("--reference", default=None, help="reference method of the convergence speedup (default: diffusion_nft)")
    parser.add_argument("--baseline", default=None, help="timing baseline method (default: naive_bf16)")
    parser.add_argument("--target", default=None, help="method whose speedup the timing table reports (default: sol_rl)")
    parser.add_argument("--warmup", type=int, default=None, help="training iterations dropped before timing medians (default: 1)")
    parser.add_argument("--hardware", default=None, help="cost projection hardware profile: B200 | H100 (default: B200)")
    parser.add_argument("--mfu", type=float, default=None, help="cost projection: assumed utilisation of peak (default: 0.4)")
    parser.add_argument("--n-boot", type=int, default=None, help="bootstrap resamples for ratio intervals (default: 2000)")
    parser.add_argument("--strict", action="store_true", help="fail on the first report kind that raises")


def main(args: argparse.Namespace) -> int:
    from solbench.report import ReportOptions, kinds, write_report
    from solbench.report.build import completeness_warnings, resolve_experiment

    if args.list:
        for kind in kinds():
            print(f"{kind.name:18s} {kind.title}: {kind.description}")
        return 0
    if not args.spec:
        from solbench.errors import ConfigError

        raise ConfigError("give SPEC: a spec file, an experiment name, or a results folder (or --list)")
    experiment, results_dir, spec_options = resolve_experiment(args.spec, args.results)
    options = dict(spec_options)
    overrides = {"reference_method": args.reference, "baseline_method": args.baseline, "target_method": args.target,
                 "warmup": args.warmup, "hardware": args.hardware, "mfu": args.mfu, "n_boot": args.n_boot,
                 "kinds": [k.strip() for k in args.only.split(",") if k.strip()] if args.only else None}
    options.update({k: v for k, v in overrides.items() if v is not None})
    with report_lock(args.reports, experiment):  # one writer at a time; removes a killed writer's leftovers
        index = write_report(args.spec, args.results, args.reports,
                             options=ReportOptions.from_mapping(options, where=f"{args.spec}: report"),
                             strict=args.strict)
    print(f"report: {index}")
    print(f"        {index.with_name('index.html')}")
    out = console()
    results_dir = Path(results_dir)
    for warning in completeness_warnings(args.spec, results_dir, _collected_run_ids(results_dir)):
        out.print(f"warning: {clip(warning, 1000)}", markup=False)  # it may quote what the results hold
    spec_arg = args.spec if Path(args.spec).suffix in (".yaml", ".yml") else "SPEC"
    print_corrupt_lines(out, _collected_corrupt_lines(results_dir), spec_arg)
    return 0


def _collected_run_ids(results_dir: Path) -> list[str]:
    import pandas as pd

    return [str(r) for r in pd.read_parquet(results_dir / "runs.parquet", columns=["run_id"])["run_id"]]


def _collected_corrupt_lines(results_dir: Path) -> list[dict]:
    """The table lines the last collect skipped (collect_report.json), which the report's numbers lack."""
    try:
        return json.loads((results_dir / "collect_report.json").read_text()).get("corrupt_lines", [])
    except (OSError, ValueError):
        return []
