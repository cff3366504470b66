"""`solbench speed SPEC`: the spec's ``speed:`` block alone (Table 5 timed on a quiet machine), then the report.

The same block `solbench run SPEC` runs after training (solbench.speed): every arm from the same model state, R
rounds of M iterations, interleaved and rotated, alone on the machine; a spec without a block gets the default one
(naive BF16 scaling, Sol-RL and naive FP4, those the spec runs). An interrupted block continues where it
stopped. ``--published`` builds the models and rewards at their published shapes with random weights (as
``solbench doctor SPEC --measure``), for a GPU's Table 5 at true shapes.
"""

from __future__ import annotations

from solbench.commands._common import add_reports_argument, add_results_argument, add_spec_argument, console

HELP = "time Table 5's arms alone on this machine (the spec's speed: block), interleaved rounds, then report"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    add_reports_argument(parser)
    parser.add_argument("--rounds", type=int, default=None, metavar="R", help="rounds (default: the block's)")
    parser.add_argument("--published", action="store_true",
                        help="models and rewards at their published shapes with random weights (a GPU's true shapes)")
    parser.add_argument("--no-report", action="store_true", help="do not collect results nor write the report")


def main(args) -> int:
    from solbench.errors import ConfigError
    from solbench.spec import load_spec

    out = console()
    spec = load_spec(args.spec)
    if spec.speed is None:  # the default block over the Table 5 methods the spec runs (a real spec on a lent GPU)
        from solbench.report.tables import same_method
        from solbench.spec.models import SpeedBlock

        arms = [m for m in SpeedBlock().arms if any(same_method(r.config.method, m) for r in spec.runs)]
        if len(arms) < 2:
            raise ConfigError(f"{args.spec}: the spec has no speed: block and runs fewer than two of "
                              f"{', '.join(SpeedBlock().arms)}: nothing to time against naive BF16 scaling")
        spec.speed = SpeedBlock(arms=arms)
        out.print(f"{args.spec} has no speed: block: timing the default block's arms {', '.join(arms)}", markup=False)
    if args.rounds is not None:
        if args.rounds < 2:
            raise ConfigError(f"--rounds must be >= 2 (an interval needs two rounds), got {args.rounds}")
        spec.speed = spec.speed.model_copy(update={"rounds": args.rounds})
    from solbench.speed.block import run_spec_block

    run_spec_block(spec, args.results, published=args.published, echo=lambda m: out.print(m, markup=False))
    if args.no_report:
        return 0
    from solbench.commands.run import report_or_say_why

    return 0 if report_or_say_why(out, spec, args) else 1
