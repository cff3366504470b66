"""Measuring what a run really costs: peak memory per phase (``peak``), and the true-shape check
``solbench doctor SPEC --measure`` (``published``: the real models at their published shapes with
random weights; ``iteration``: one iteration per method, timed and measured per phase; ``table``:
the JSON and Markdown it writes). See docs/measured/README.md.

Stage ``measure`` (solbench/stages.py): it imports its own modules and the stages below it, doctor, launch, collect,
spec, train, method, engine, rewards, models, quant, world, report, results, machine, text, base.
"""
