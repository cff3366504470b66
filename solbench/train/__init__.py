"""One training run: the iterations, evaluation, checkpoints and result rows of one RunConfig (trainer.py), what a
run is built from (setup.py: device, networks by role, explore copy, seeds), which path full-precision rollouts
take (rollout_copy.py), the CPU rates a run's clock is predicted with (cpu_rates.py), the explore copy's error
measured beside training (explore_gap.py) and live progress (progress.py).

It drives a method (solbench.method) through the engine (solbench.engine); it never imports launch, spec or
anything above it (tests/test_import_direction.py).

Stage ``train`` (solbench/stages.py): it imports its own modules and the stages below it, method, engine, rewards,
models, quant, world, report, results, machine, text, base.
"""
