"""The ranking-fidelity experiment (``solbench fidelity``, experiment.py): how well the explore copy ranks a
prompt's candidates against full precision, at the checkpoints a spec's ``fidelity:`` block names (plan.py)
and the checkpoint it measures (checkpoint.py).
"""
