"""One rank of tests/test_gathers.py, started by torchrun:

    python -m torch.distributed.run --nproc-per-node 2 tests/_dist_gather_worker.py OUT_DIR METHOD

Builds the run's trainer on the tiny model (random weights) as one of 2 gloo ranks, collects one
iteration's batch with METHOD and walks its training chunks (everything training reads), counting
the tensor bytes this rank receives through torch.distributed.all_gather (the real collective,
wrapped). Writes OUT_DIR/rank<r>.json.
"""

import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as tdist

from solbench.config import RunConfig
from solbench.engine.distributed import init_distributed
from solbench.method import Iteration
from solbench.results import RunStore
from solbench.train.trainer import Trainer, _seeded_generator

CONFIGS = {"sol_rl": {"n": 4, "k": 2, "explore_steps": 2}, "flow_grpo": {"group_size": 3}}
STEPS = 3
RECEIVED = {"bytes": 0}


def counting_all_gather(real):
    def all_gather(tensor_list, tensor, *args, **kwargs):
        out = real(tensor_list, tensor, *args, **kwargs)
        RECEIVED["bytes"] += sum(t.numel() * t.element_size() for r, t in enumerate(tensor_list) if r != tdist.get_rank())
        return out

    return all_gather


def main(out_dir: str, method: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed(2)
    cfg = RunConfig(method=method, method_config=CONFIGS[method], prompts_per_iter=2, world_size=2, device="cpu",
                    iterations=1)
    cfg.model.path = "random"
    cfg.sampling.steps = STEPS
    trainer = Trainer(cfg, RunStore(Path(out_dir) / "run", cfg.run_id), dist=dist)
    tdist.all_gather = counting_all_gather(tdist.all_gather)
    records = trainer.draw_prompts(1)
    it = Iteration(step=1, stream="train/1", generator=_seeded_generator(cfg.seed, "method", 1))
    batch = trainer.method.collect(trainer.engine, [r.id for r in records], [r.text for r in records], it)
    chunks = list(trainer.method.chunks(batch, it))
    latent_bytes = 4 * math.prod(trainer.adapter.latent_shape)
    Path(out_dir, f"rank{dist.rank}.json").write_text(json.dumps(
        {"received": RECEIVED["bytes"], "latent_bytes": latent_bytes, "chunks": len(chunks),
         "trained": len(batch.data["prompts"])}))
    dist.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
