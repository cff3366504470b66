"""GenEval-style rewards of the shapes world, computed by the programmatic detector.

- `shapes_geneval` (range [0, 1], higher is better): the graded score, a continuous mean of soft
  per-requirement scores (object count with colour and shape quality, relation margin). Training
  reward: it moves with small improvements, so it ranks a group of samples well.
- `shapes_geneval_strict` (values {0, 1}): GenEval's "correct", 1 when every requirement of the
  prompt is met. Evaluation metric; its mean over prompts is the GenEval-style accuracy.

Both carry the evaluation check ``extra_objects`` (objects detected beyond what the prompt asks for),
which the trainer stores per eval sample and the report's reward-hacking table reads.

Prompts must be in the shapes grammar (solbench.world.grammar); others raise PromptParseError.
See solbench.world.detector for the exact rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from solbench.world.detector import extra_objects, score_images


class ShapesGenEval:
    """Detector-based GenEval score of shapes-world images (graded, or strict 0/1)."""

    higher_is_better = True
    range = (0.0, 1.0)

    def __init__(self, strict: bool = False, device: str | torch.device | None = None):
        # The detector runs on the CPU (numpy + scipy); `device` is accepted for the registry's sake.
        self.strict = strict
        self.name = "shapes_geneval_strict" if strict else "shapes_geneval"
        # evaluation-time checks the trainer stores per eval sample (split eval_check), not rewards
        self.checks = {"extra_objects": extra_objects}

    def __call__(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        return score_images(images, list(prompts), strict=self.strict)

    def __repr__(self) -> str:
        return f"ShapesGenEval(strict={self.strict})"


def register_rewards(register: Callable) -> None:
    register("shapes_geneval", lambda device=None: ShapesGenEval(strict=False, device=device))
    register("shapes_geneval_strict", lambda device=None: ShapesGenEval(strict=True, device=device))
