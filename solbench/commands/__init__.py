"""Subcommands of the `solbench` CLI, one module each (see solbench/cli.py)."""
