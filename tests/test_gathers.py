"""What a rank receives from the others: the rows the method reads, not the whole global rollout.

Two gloo ranks (tests/_dist_gather_worker.py) collect one iteration on the tiny model and walk its
training chunks while torch.distributed.all_gather's received bytes are counted. Catches the engine
gathering every rollout's latents and trajectories onto every rank at sampling time: Sol-RL's N
explore latents (only their rewards are needed), FlowGRPO's per-step means (never read) and x0.
"""

from __future__ import annotations

import json

import pytest

from test_distributed import TESTS, torchrun


def _run(tmp_path, method):
    torchrun([str(TESTS / "_dist_gather_worker.py"), str(tmp_path), method], cwd=tmp_path)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_sol_rl_gathers_only_the_regenerated_latents(tmp_path):
    """2 prompts x N=4 explored (4 per rank), K=2 regenerated per prompt (2 per rank): each rank receives
    the other's 2 regenerated latents and nothing of the 8 explore candidates (before: 4 + 2 rows)."""
    for rank in _run(tmp_path, "sol_rl"):
        assert rank["trained"] == 4 and rank["chunks"] > 0
        assert rank["received"] == 2 * rank["latent_bytes"], rank


def test_flow_grpo_gathers_states_and_log_probs_but_not_means_or_x0(tmp_path):
    """2 prompts x 3 samples, 3 SDE steps: each rank receives the other's 3 trajectories' states
    (4 per sample) and log-probs, not their per-step means (3 latents each) nor x0 (before: both)."""
    from _dist_gather_worker import STEPS

    for rank in _run(tmp_path, "flow_grpo"):
        assert rank["received"] == 3 * ((STEPS + 1) * rank["latent_bytes"] + STEPS * 4), rank
