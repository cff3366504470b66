"""Methods, one file each. Installed as solbench.methods; see solbench/method/__init__.py for the interface.

Stage ``method`` (solbench/stages.py): it imports its own modules and the stages below it, engine, rewards, models,
quant, world, report, results, machine, text, base.
"""
