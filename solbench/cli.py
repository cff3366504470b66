"""The `solbench` command line.

Each subcommand lives in its own module under solbench/commands/ and exposes:
    HELP: str                              one line for `solbench --help`
    add_arguments(parser) -> None          its arguments
    main(args) -> int                      its exit status
Modules are discovered by name, so adding a command never touches this file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from solbench import commands
from solbench.commands._common import check_environment
from solbench.errors import SolbenchError


def _command_modules() -> dict[str, object]:
    found = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        found[info.name] = importlib.import_module(f"solbench.commands.{info.name}")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="solbench", description="RL post-training benchmarks for text-to-image models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in _command_modules().items():
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_environment()  # before any work: a bad SOLBENCH_THREADS is one line, not a failed run each
        return int(args._main(args) or 0)
    except SolbenchError as err:
        print(f"solbench {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`solbench expand SPEC | head`): not an error. Point stdout at devnull
        # so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # a full disk or a read-only folder, wherever a command writes: one line
        from solbench.results import storage_error

        problem = storage_error(err)
        if problem is None:
            raise
        print(f"solbench {args.command}: error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
