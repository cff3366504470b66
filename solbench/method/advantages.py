"""Group statistics shared by the methods: per-prompt advantages, global std, clipping.

Every sample belongs to a group (the samples of one prompt). The advantage of a sample is its reward
minus its group's mean, divided by a standard deviation: the group's own (GRPO), or the std over the
whole batch (``global_std``, the default of FlowGRPO, DiffusionNFT, AWM and Sol-RL configs, which
keeps a group whose samples all score alike from blowing up). Statistics are computed in float64,
like the references' numpy stat trackers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def group_advantages(
    rewards: torch.Tensor,
    groups: Sequence[Hashable],
    *,
    global_std: bool,
    eps: float = 1e-4,
    clip: float | None = 5.0,
    unbiased: bool = False,
) -> torch.Tensor:
    """A = (r - mean_group) / (std + eps), clipped to [-clip, clip]; float32 [B].

    ``unbiased`` uses the n-1 standard deviation (DanceGRPO's torch.std); the FlowGRPO/NFT stat
    tracker uses the population std (numpy's default). A group of one sample has advantage 0.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if len(groups) != rewards.shape[0]:
        raise ValueError(f"{len(groups)} group labels for {rewards.shape[0]} rewards")
    r = rewards.detach().to("cpu", torch.float64)
    advantages = torch.zeros_like(r)
    if global_std:
        global_sd = _std(r, unbiased)
    for members in group_members(groups).values():
        idx = torch.tensor(members)
        group = r[idx]
        sd = global_sd if global_std else _std(group, unbiased)
        advantages[idx] = (group - group.mean()) / (sd + eps)
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    return advantages.to(torch.float32).to(rewards.device)


def group_members(groups: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Group label -> positions, in order of first appearance."""
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    return members


def _std(x: torch.Tensor, unbiased: bool) -> torch.Tensor:
    if x.numel() < 2:
        return torch.zeros((), dtype=x.dtype)
    return x.std(correction=1 if unbiased else 0)


def group_reward_std(rewards: torch.Tensor, groups: Sequence[Hashable]) -> float:
    """Mean over groups of the within-group (population) reward std: how much signal a batch carries."""
    r = rewards.detach().to("cpu", torch.float64)
    stds = [_std(r[torch.tensor(m)], unbiased=False) for m in group_members(groups).values()]
    return float(torch.stack(stds).mean()) if stds else 0.0
