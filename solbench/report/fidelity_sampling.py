"""Sampling for the standalone ranking-fidelity experiment (the unbiased version of Table 8).

Training data of Sol-RL only has full-precision rewards for the K selected seeds, so rank
correlations computed from it are conditioned on the selection. This experiment samples M prompts x N
seeds from one fixed checkpoint at BOTH precisions, with no training: each seed through the explore
(low-precision) copy with the explore sampler, and the same seed through the full-precision policy
with the full sampler, every image scored by every reward. The result is a candidates table in the
collect format (plus ``reward_name``), which ``ranking_fidelity`` reports as "all seeds" groups.

``fidelity_experiment`` takes a ready ``solbench.engine.engine.Engine`` whose roles "explore" and "policy"
hold the checkpoint's low-precision copy and full-precision policy (built the way the trainer
builds them), so that noise, samplers, precision handling and timing are exactly those of training.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from solbench.errors import ConfigError


def fidelity_experiment(engine, prompts: Sequence[dict] | Sequence[str], n_seeds: int, *, explore_sampler,
                        full_sampler, run_id: str = "fidelity", step: int = 0, stream: str = "fidelity",
                        batch_seeds: int | None = None) -> pd.DataFrame:
    """Candidates table of ``prompts`` x ``n_seeds`` seeds at both precisions, for every reward.

    Args:
        engine: an Engine with roles "explore" and "policy" (and the run's rewards).
        prompts: prompt records ``{"id", "text"}`` (solbench.world.prompts) or plain strings (ids
            become ``p0``, ``p1``, ...).
        n_seeds: candidates per prompt (noise indices 0..n_seeds-1 of ``stream``).
        explore_sampler / full_sampler: SamplerSpec of the explore (e.g. 6-step ODE) and full rollouts.
        batch_seeds: seeds per engine call (memory bound); default all of a prompt's seeds at once.

    Returns one row per (prompt, seed, precision, reward): run_id, step, prompt_id, cand_idx,
    noise_seed, precision ("explore" | "full"), reward, selected (False), reward_name ("total" for
    the weighted sum the engine scores with, then each component reward by name).
    """
    if n_seeds < 2:
        raise ConfigError(f"fidelity_experiment needs at least 2 seeds per prompt to rank them, got {n_seeds}")
    records = [p if isinstance(p, dict) else {"id": f"p{i}", "text": str(p)} for i, p in enumerate(prompts)]
    if not records:
        raise ConfigError("fidelity_experiment: no prompts given")
    chunk = batch_seeds or n_seeds
    rows: list[dict] = []
    for record in records:
        for start in range(0, n_seeds, chunk):
            idx = list(range(start, min(start + chunk, n_seeds)))
            ids, texts = [record["id"]] * len(idx), [record["text"]] * len(idx)
            for net, precision, sampler, phase in (("explore", "explore", explore_sampler, "explore"),
                                                   ("policy", "full", full_sampler, "regenerate")):
                rollout = engine.sample(ids, texts, idx, net=net, sampler=sampler, phase=phase, stream=stream)
                total = engine.score(rollout)
                scores = {"total": total, **rollout.reward_parts}
                for name, values in scores.items():
                    values = values.detach().float().cpu().tolist()
                    for j, cand in enumerate(idx):
                        rows.append(dict(run_id=run_id, step=step, prompt_id=record["id"], cand_idx=cand,
                                         noise_seed=int(rollout.noise_seeds[j]), precision=precision,
                                         reward=float(values[j]), selected=False, reward_name=name))
    return pd.DataFrame(rows)
