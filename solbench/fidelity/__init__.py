"""The ranking-fidelity experiment (``solbench fidelity``, experiment.py): how well the explore copy ranks a
prompt's candidates against full precision, at the checkpoints a spec's ``fidelity:`` block names
(solbench/spec/fidelity_plan.py, checked when the spec expands) and the checkpoint it measures (checkpoint.py).

Stage ``fidelity`` (solbench/stages.py): it imports its own modules and the stages below it, measure, doctor,
launch, collect, spec, train, method, engine, rewards, models, quant, world, report, results, machine, text, base.
"""
