"""One rank of the engine-level distributed test (tests/test_distributed.py), started by torchrun.

    python -m torch.distributed.run --nproc-per-node 2 tests/_dist_worker.py OUT_DIR

Every rank makes the same engine calls on the tiny model (random weights): a stochastic rollout with
trajectories of 5 samples (uneven shards), scored with a reward, then one backward of a loss on
rank-specific data followed by the gradient all-reduce. Each rank saves what it saw to OUT_DIR/rank<r>.pt.
"""

import sys
from pathlib import Path

import torch

from solbench.engine.distributed import init_distributed
from solbench.engine.engine import Engine, SamplerSpec
from solbench.models.tiny import load_tiny
from solbench.models.tiny_adapter import TinyAdapter
from solbench.rewards import RewardSet
from solbench.engine.timing import PhaseTimer

PROMPT_IDS = ["a", "a", "b", "b", "c"]
PROMPTS = ["two red circles", "two red circles", "a blue square", "a blue square", "a green triangle"]
CANDIDATES = [0, 1, 0, 1, 0]


def build():
    torch.manual_seed(0)
    adapter = TinyAdapter(load_tiny(pretrained=False))
    return adapter, RewardSet({"colorfulness": 1.0, "jpeg_compressibility": 0.5}, "cpu")


def rollout(engine):
    spec = SamplerSpec("flowgrpo_sde", 3, noise_level=0.7)
    out = engine.sample(PROMPT_IDS, PROMPTS, CANDIDATES, sampler=spec, phase="rollout", stream="train/1",
                        keep_trajectory=True)
    engine.score(out)
    return out


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed(2)
    adapter, rewards = build()
    engine = Engine(adapter, {"policy": adapter.transformer}, rewards, PhaseTimer(), run_seed=3, dist=dist)
    out = rollout(engine)
    params = [p for p in adapter.transformer.parameters() if p.requires_grad][:3]
    loss = sum((p * (dist.rank + 1)).sum() for p in params)  # rank r contributes (r + 1) to every gradient
    loss.backward()
    dist.sum_gradients(params)
    torch.save({"rank": dist.rank, "image_rows": out.image_rows, "x0": out.x0, "log_probs": out.trajectory.log_probs,
                "xs": out.trajectory.xs, "rewards": out.rewards, "parts": out.reward_parts,
                "grads": [p.grad for p in params]}, Path(out_dir) / f"rank{dist.rank}.pt")
    dist.close()


if __name__ == "__main__":
    main(sys.argv[1])
