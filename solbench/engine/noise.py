"""Seeded noise: every random draw of a rollout is a pure function of its key.

A candidate's initial noise depends only on (run seed, stream, prompt id, candidate index), never on
batch size, batch position, rank or device. That is what lets Sol-RL explore a seed in NVFP4 and
regenerate exactly the same seed in full precision, and what lets every method see identical
prompt/noise streams for the same run seed.

Noise is always drawn on the CPU in float32 from a freshly seeded torch.Generator and only then
moved to the target device and dtype, so it is bit-identical everywhere.

Streams separate independent uses of the same (prompt, candidate): "train/<step>" for training
rollouts of iteration <step> (so a prompt drawn twice gets fresh seeds), "eval" for the fixed
evaluation seeds, and "<stream>/sde/<t>" for the per-step noise of stochastic samplers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

_SEED_MASK = (1 << 63) - 1


def noise_seed(run_seed: int, stream: str, prompt_id: str, cand_idx: int) -> int:
    """The 63-bit integer seed of one candidate's noise (recorded in the candidates table)."""
    key = f"{int(run_seed)}|{stream}|{prompt_id}|{int(cand_idx)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & _SEED_MASK


def seeded_normal(seed: int, shape: Sequence[int]) -> torch.Tensor:
    """Standard normal float32 CPU tensor from its own generator."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)


def candidate_noise(
    run_seed: int,
    stream: str,
    prompt_ids: Sequence[str],
    cand_idx: Sequence[int],
    shape: Sequence[int],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, list[int]]:
    """Stacked noise [B, *shape] for candidates (prompt_ids[i], cand_idx[i]) and their seeds."""
    if len(prompt_ids) != len(cand_idx):
        raise ValueError(f"prompt_ids ({len(prompt_ids)}) and cand_idx ({len(cand_idx)}) differ in length")
    seeds = [noise_seed(run_seed, stream, p, c) for p, c in zip(prompt_ids, cand_idx)]
    if not seeds:
        return torch.empty((0, *shape), device=device, dtype=dtype), seeds
    noise = torch.stack([seeded_normal(s, shape) for s in seeds])
    return noise.to(device=device, dtype=dtype), seeds


def step_noise(seeds: Sequence[int], step: int, shape: Sequence[int], *, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Per-step noise of a stochastic sampler, derived from each candidate's seed and the step index."""
    derived = [noise_seed(s, "sde", str(step), 0) for s in seeds]
    if not derived:
        return torch.empty((0, *shape), device=device, dtype=dtype)
    return torch.stack([seeded_normal(d, shape) for d in derived]).to(device=device, dtype=dtype)
