"""The work a measured phase must do, and the check that it did (solbench.measure.iteration).

Every timed phase must do its work: reward models on random weights score every image alike (ImageReward's
random head gives one value to 1e-4, CLIPScore clips to 0), and a method that drops tied groups (FlowGRPO keeps
only nonzero advantages) would train nothing and report its train phase as a time. So the measured rewards are
``UntiedReward``: the reward model still runs on every image (its time and memory are measured), and each image's
mean pixel value is added to its score, a deterministic stand-in that differs between images. Each phase row
says whether it did work (``did_work``: FLOPs for sampling and training, a changed trainable parameter for
train, images for reward); one that did not is reported as unmeasured, not as a time (measure.md).
"""

from __future__ import annotations

import torch

__all__ = ["UntiedReward", "did_work", "fingerprint"]


class UntiedReward:
    """A reward model on random weights whose scores do not tie: its own score plus each image's mean pixel
    value (a deterministic stand-in that differs between images; see the module docstring). Attributes (its
    ``batch_size``, ``load``) are the wrapped model's."""

    def __init__(self, reward) -> None:
        object.__setattr__(self, "inner", reward)

    def __call__(self, images: torch.Tensor, prompts) -> torch.Tensor:
        scores = self.inner(images, prompts)
        stand_in = images.detach().float().mean(dim=tuple(range(1, images.dim())))
        return scores + stand_in.to(scores.device, scores.dtype)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value) -> None:
        setattr(self.inner, name, value)


def fingerprint(params) -> torch.Tensor:
    """Per trainable tensor, its sum and sum of squares (float64, on the host): equal before and after an
    iteration only if no parameter moved (to float64 rounding)."""
    with torch.no_grad():
        return torch.stack([torch.stack([p.double().sum(), p.double().square().sum()]) for p in params]).cpu()


def did_work(row: dict, trained: bool | None) -> bool | None:
    """Whether a measured phase did the work it is timed for: FLOPs for the sampling phases, FLOPs and a changed
    parameter for train, images for reward; None for bookkeeping phases (select, sync, compile)."""
    if row["phase"] in ("explore", "regenerate", "rollout"):
        return bool(row["flops"])
    if row["phase"] == "train":
        return bool(row["flops"]) and bool(trained)
    if row["phase"] == "reward":
        return bool(row["n_images"])
    return None
