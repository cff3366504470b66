"""The rollout engine: sampling the policy at a precision and scoring what it samples.

engine.py (``Engine``: sample, score, phases, explore-copy sync) returns a ``Rollout`` (rollout.py); it runs the
ODE/SDE samplers of sampling.py on the noise of noise.py (a pure function of run seed, stream, prompt and
candidate), the networks of policy.py (``PolicyNets``: trainable policy, reference, old policy, EMA, explore copy)
and the harness's clock (timing.py); distributed.py shards its work over the ranks of one run.

It may import the stages below it (models, rewards, quant, world, machine, results, text), never train, method
or anything above them (tests/test_import_direction.py).

Stage ``engine`` (solbench/stages.py): it imports its own modules and the stages below it, rewards, models, quant,
world, report, results, machine, text, base.
"""
