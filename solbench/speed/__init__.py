"""Table 5 from a controlled speed measurement: a spec's ``speed:`` block (solbench.spec.models.SpeedBlock).

After training (``solbench run``) or alone (``solbench speed SPEC``), every arm of the block is timed from the same
model state, R rounds of M iterations per arm, the arms interleaved and their order rotated each round, one arm at
a time with no other solbench work on the machine, each at its own threads, after a warm-up; a round whose load
(other programs' busy cores) passes the bound is repeated. Modules: ``iteration`` (one real training iteration
of an arm, timed per phase), ``block`` (rounds, rotation, the load repeat, resume, the rows). Which configs the arms
run is the spec's (solbench/spec/speed_arms.py, checked when the spec expands); the block's files and its collected
table are solbench/results/speed_rows.py's; the paired ratios over rounds the report reads are
solbench/report/speed_stats.py's.

Stage ``speed`` (solbench/stages.py): it imports its own modules and the stages below it, fidelity, measure, doctor,
launch, collect, spec, train, method, engine, rewards, models, quant, world, report, results, machine, text, base.
"""
