"""Choosing K of a prompt's N candidates by reward (Sol-RL, naive-FP4, naive BF16 scaling).

Modes, as in the Sol-RL public code (NVlabs/Sana train_scripts/train_utils.py):

- ``best_worst`` (default): the top floor(K/2) and the bottom ceil(K/2) by reward, the most
  contrastive pairs for the advantage.
- ``random``: K uniformly at random.
- ``mean_deviation``: the K farthest from the group mean, |r - mean|.
- ``extremes_random``: the argmax and argmin, then random others.

Deviations from the reference: ties are broken by candidate index (stable sorts) instead of by
torch.topk's unspecified order, and best_worst never returns a candidate twice (the reference can,
when rewards tie); randomness comes from the generator the harness hands in.
"""

from __future__ import annotations

import torch

SELECTION_MODES = ("best_worst", "random", "mean_deviation", "extremes_random")


def select_indices(rewards: torch.Tensor, k: int, mode: str = "best_worst",
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices (int64, CPU) of the K candidates to keep among ``rewards`` [N]."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"cannot select k={k} of n={n} candidates (need 1 <= k <= n)")
    r = rewards.detach().to("cpu", torch.float64)
    if mode == "best_worst":
        order = torch.argsort(r, descending=True, stable=True)  # ties: lower index ranks higher
        n_best = k // 2
        n_worst = k - n_best
        return torch.cat([order[:n_best], order[n - n_worst:].flip(0)])
    if mode == "random":
        return torch.randperm(n, generator=generator)[:k]
    if mode == "mean_deviation":
        return torch.argsort((r - r.mean()).abs(), descending=True, stable=True)[:k]
    if mode == "extremes_random":
        best = int(torch.argsort(r, descending=True, stable=True)[0])
        worst = int(torch.argsort(r, stable=True)[0])
        extremes = [best] if best == worst else [best, worst]
        if k <= len(extremes):
            return torch.tensor(extremes[:k], dtype=torch.long)
        mask = torch.ones(n, dtype=torch.bool)
        mask[extremes] = False
        rest = torch.nonzero(mask).squeeze(1)
        picked = rest[torch.randperm(rest.numel(), generator=generator)[: k - len(extremes)]]
        return torch.cat([torch.tensor(extremes, dtype=torch.long), picked])
    raise ValueError(f"unknown selection mode {mode!r}; modes are {', '.join(SELECTION_MODES)}")


def select_per_group(rewards: torch.Tensor, group_size: int, k: int, mode: str = "best_worst",
                     generator: torch.Generator | None = None) -> list[int]:
    """Flat indices of the K kept candidates of each consecutive group of ``group_size`` in ``rewards``.

    ``rewards`` is [P * group_size], prompt p's candidates at p*group_size .. (p+1)*group_size - 1
    (the layout of solbench.method.expand_groups). Groups keep their order; within a group the order
    is the selection's (best first for best_worst).
    """
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    chosen: list[int] = []
    for start in range(0, rewards.shape[0], group_size):
        local = select_indices(rewards[start:start + group_size], k, mode, generator)
        chosen.extend(start + int(i) for i in local)
    return chosen
