"""``Rollout``: B generated samples of one engine call (solbench.engine.engine) and everything needed to score,
select, regenerate and train on them: prompts, candidate indices, noise seeds, the precision and dtype
that ran, final latents, decoded images, the trajectory and the rewards.

With several ranks the latents are gathered on first read (``Gathered``), only the rows a method
selected (``index`` does not communicate), and each rank keeps the images it decoded
(``image_rows``). solbench.engine.engine re-exports ``Rollout``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from solbench.engine.distributed import Gathered, cat_rows, take_rows
from solbench.engine.sampling import SamplerSpec, Trajectory

__all__ = ["Rollout"]


def _positions(idx: Sequence[int] | Tensor) -> Tensor:
    """Sample positions as a long tensor from indices or a bool mask."""
    pos = torch.as_tensor(idx)
    if pos.dtype == torch.bool:
        pos = pos.nonzero().flatten()
    return pos.long().reshape(-1)


@dataclass(repr=False, eq=False)
class Rollout:
    """B generated samples and everything needed to score, select, regenerate and train on them.

    ``x0`` (and the trajectory's tensors) may be spread over the ranks and are gathered on first read."""

    prompt_ids: list[str]
    prompts: list[str]
    cand_idx: list[int]
    noise_seeds: list[int]  # seeds of the initial noise (candidates table)
    precision: str  # "full" | "explore"
    dtype: str  # what actually ran: "float32", "bfloat16", "nvfp4_tiny(float32)", ...
    x0: Tensor = Gathered()  # final latents [B, *latent_shape], float32 (a ShardedRows until read)
    images: Tensor  # [B, 3, H, W] float32 in [0, 1], in host memory
    sampler: SamplerSpec  # with guidance and shift resolved
    net: str = "policy"
    stream: str = ""
    trajectory: Trajectory | None = None
    rewards: Tensor | None = None
    reward_parts: dict[str, Tensor] = field(default_factory=dict)
    # positions whose decoded images ``images`` holds, in order; None = all of them. With several
    # ranks each keeps only the images it decoded (the rewards of all are gathered by Engine.score).
    image_rows: list[int] | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def __repr__(self) -> str:  # never reads x0: that would gather on one rank only
        return (f"Rollout({len(self)} samples, net={self.net!r}, precision={self.precision!r}, dtype={self.dtype!r}, "
                f"stream={self.stream!r}, scored={self.rewards is not None})")

    def index(self, idx: Sequence[int] | Tensor) -> "Rollout":
        """The sub-rollout of samples ``idx`` (in that order), e.g. the K of N that Sol-RL selects."""
        pos = _positions(idx)
        rows = pos.tolist()

        def take(t: Tensor) -> Tensor:
            return t[pos.to(t.device)]

        if self.image_rows is None:
            images, image_rows = take(self.images), None
        else:  # keep the images this rank holds, renumbered to the sub-rollout's positions
            held = {row: i for i, row in enumerate(self.image_rows)}
            kept = [(new, held[old]) for new, old in enumerate(rows) if old in held]
            image_rows = [new for new, _ in kept]
            images = self.images[torch.tensor([i for _, i in kept], dtype=torch.long, device=self.images.device)]

        return replace(
            self,
            prompt_ids=[self.prompt_ids[i] for i in rows],
            prompts=[self.prompts[i] for i in rows],
            cand_idx=[self.cand_idx[i] for i in rows],
            noise_seeds=[self.noise_seeds[i] for i in rows],
            x0=take_rows(self.__dict__["x0"], pos),  # not gathered: only the rows kept
            images=images,
            image_rows=image_rows,
            trajectory=None if self.trajectory is None else self.trajectory.index(pos),
            rewards=None if self.rewards is None else take(self.rewards),
            reward_parts={k: take(v) for k, v in self.reward_parts.items()},
        )

    @classmethod
    def cat(cls, rollouts: Sequence["Rollout"]) -> "Rollout":
        """Concatenate rollouts made by the same network, precision and sampler."""
        if not rollouts:
            raise ValueError("Rollout.cat needs at least one rollout")
        first = rollouts[0]
        for r in rollouts[1:]:
            if (r.precision, r.dtype, r.sampler, r.net) != (first.precision, first.dtype, first.sampler, first.net):
                raise ValueError(
                    "Rollout.cat: rollouts differ in precision/dtype/sampler/net "
                    f"({(first.precision, first.dtype, first.sampler, first.net)} vs "
                    f"{(r.precision, r.dtype, r.sampler, r.net)})")

        def cat_list(name):
            return [item for r in rollouts for item in getattr(r, name)]

        trajectories = [r.trajectory for r in rollouts]
        rewards = [r.rewards for r in rollouts]
        image_rows = None
        if any(r.image_rows is not None for r in rollouts):
            image_rows, offset = [], 0
            for r in rollouts:
                image_rows += [offset + i for i in (range(len(r)) if r.image_rows is None else r.image_rows)]
                offset += len(r)
        part_names = set(first.reward_parts)
        same_parts = all(set(r.reward_parts) == part_names for r in rollouts)
        return replace(
            first,
            prompt_ids=cat_list("prompt_ids"), prompts=cat_list("prompts"), cand_idx=cat_list("cand_idx"),
            noise_seeds=cat_list("noise_seeds"),
            x0=cat_rows([r.__dict__["x0"] for r in rollouts]), images=torch.cat([r.images for r in rollouts]),
            image_rows=image_rows,
            stream=first.stream if all(r.stream == first.stream for r in rollouts) else "",
            trajectory=None if any(t is None for t in trajectories) else Trajectory.cat(trajectories),
            rewards=None if any(r is None for r in rewards) else torch.cat(rewards),
            reward_parts={k: torch.cat([r.reward_parts[k] for r in rollouts]) for k in part_names} if same_parts else {},
        )
