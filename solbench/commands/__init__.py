"""Subcommands of the `solbench` CLI, one module each (see solbench/cli.py).

Stage ``cli`` (solbench/stages.py): it imports its own modules and the stages below it, sweep, speed, fidelity,
measure, doctor, launch, collect, spec, train, method, engine, rewards, models, quant, world, report, results,
machine, text, base.
"""
