"""`solbench doctor [SPEC]`: check this machine before a long job.

Lists GPUs (compute capability, natively supported formats, free memory), packages (the gpu extra,
transformer-engine importability), model and reward weights present in the Hugging Face cache or
local directories (nothing is downloaded), and free memory against a rough estimate of what SPEC
needs. With a SPEC, exits 1 if anything it needs is missing; without one, only reports.
The checks themselves live in solbench.doctor.
"""

from __future__ import annotations

import argparse
import json

HELP = "check GPUs, packages, model/reward weights and memory before a long job (exit 1 if SPEC can't run)"

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", default=None,
                        help="experiment spec (YAML); its models, rewards and formats become requirements")
    parser.add_argument("--cache-dir", default=None,
                        help="Hugging Face hub cache to look in (default: HF_HUB_CACHE / HF_HOME)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--measure", action="store_true",
                        help="run one iteration of each of SPEC's methods here at the published shapes (random "
                             "weights, one prompt group) and write per-phase seconds and peak memory beside the "
                             "doctor's prediction (solbench.measure; docs/measured/README.md)")
    parser.add_argument("--out", default=None, help="--measure: folder for measure.json and measure.md "
                                                    "(default results/measure/<spec name>)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="--measure: seconds; no method is started that would end past it (default 480)")
    parser.add_argument("--methods", default=None, help="--measure: comma-separated methods (default: all, "
                                                        "sol_rl and naive_scaling first)")
    parser.add_argument("--tiny", action="store_true", help="--measure: the tiny shapes the CPU tests use")
    parser.add_argument("--isolate", action="store_true",
                        help="--measure: each method in its own process, so a CUDA error that ends one process "
                             "(an illegal memory access) ends only that method's row")


def main(args: argparse.Namespace) -> int:
    from solbench.doctor import exit_code, run_checks

    if args.measure:
        return _measure(args)

    rows = run_checks(args.spec, cache_dir=args.cache_dir)
    if args.json:
        print(json.dumps([row.__dict__ for row in rows], indent=2))
        return exit_code(rows)

    import textwrap

    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    width = max(60, min(console.width, 120))
    console.print("[bold]solbench doctor[/]" + (f": {escape(args.spec)}" if args.spec else ""))
    last = None
    for row in rows:
        if row.section != last:
            console.print(f"[bold]{row.section}[/]")
            last = row.section
        # one row = "  status item: detail" wrapped under itself, then "fix:" on its own lines
        head = f"  {row.status:<4} "
        body = textwrap.wrap(f"{row.item}: {row.detail}", width - len(head)) or [""]
        console.print(f"  [{_STYLE.get(row.status, 'white')}]{row.status:<4}[/] " + escape(body[0]))
        for line in body[1:]:
            console.print(" " * len(head) + escape(line))
        if row.fix:
            for i, line in enumerate(textwrap.wrap(row.fix, width - len(head) - 5, break_on_hyphens=False)):
                console.print(" " * len(head) + ("fix: " if i == 0 else "     ") + escape(line))
    failed = [r for r in rows if r.status == "fail"]
    if failed:
        console.print(f"[bold red]{len(failed)} problem(s) would stop this spec:[/] "
                      + ", ".join(f"{r.section}/{r.item}" for r in failed))
    elif args.spec:
        console.print("[green]nothing this spec needs is missing[/]")
    return exit_code(rows)


def _measure(args: argparse.Namespace) -> int:
    from pathlib import Path

    from solbench.errors import ConfigError
    from solbench.measure.iteration import measure_spec
    from solbench.measure.table import markdown

    if not args.spec:
        raise ConfigError("--measure needs a SPEC")
    out = Path(args.out) if args.out else Path("results") / "measure" / Path(args.spec).stem
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    result = measure_spec(args.spec, out, tiny=args.tiny, budget_s=args.budget, methods=methods, isolate=args.isolate)
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    print(f"wrote {out / 'measure.json'} and {out / 'measure.md'}")
    return 1 if any(m["error"] for m in result["methods"]) else 0
