"""The machine a run is on: what its CPU offers (cpu.py), a run's thread count (threads.py) and the machine side
of its numerics, recorded and compared (numerics.py).

A leaf stage: it imports nothing of solbench but its errors, so that every stage above may ask it.

Stage ``machine`` (solbench/stages.py): it imports its own modules and the stages below it, text, base.
"""
