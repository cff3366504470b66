"""solbench: the reference harness for RL post-training of text-to-image models.

Sol-RL ("FP4 Explore, BF16 Train", arXiv 2604.06916) and its baselines behind one Method interface,
with the machinery (seeded noise, rollout engine, quantization, rewards, timing, evaluation,
checkpoints, results, launching, reports) owned by the harness. See docs/architecture.md.

Stage ``base`` (solbench/stages.py), the lowest: it imports only its own modules.
"""

__version__ = "0.1.0"

from solbench import _logfilters

_logfilters.install()  # torchao's import-time noise, which diffusers triggers (see solbench/_logfilters.py)
