"""Full-precision rollouts through a LoRA role vs through a merged plain copy of it (issue 17, item 5).

    .venv/bin/python benchmarks/lora_rollout.py [--steps 10] [--repeats 5] [--batches 16,66] [--load both]

The NFT family samples its full-precision rollouts from the "old" role, which with LoRA is the
shared transformer run with adapter "old" active (solbench.engine.policy.AdapterView: peft's LoRA layers
add two rank-r matmuls per targeted linear, and the view switches adapters around each forward).
The merged rollout copy (PolicyNets(rollout_copy=True), model.rollout_copy: merged) computes the same
images (to fp32 rounding, printed as "max |dx0|") without the LoRA matmuls, at the price of its adapted
layers' weights (on FLUX 3.6 GB in bf16; the rest is shared with the policy). This script measures what
it buys on the tiny model: engine.sample of the same prompts and seeds through both (the role "old"
with and without the copy), paired and interleaved, min and median per mode. On the GPU,
scripts/rollout_speed.py measures FLUX's forward through both, eager and compiled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import cpu_line, maybe_loaded, paired  # noqa: E402

PROMPTS = ["three red circles", "a blue square and a green circle", "two yellow squares", "a red square"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", default="16,66", help="16: a tiny_main rollout group; 66: its evaluation")
    parser.add_argument("--guidance", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--load", choices=["both", "quiet", "loaded"], default="both")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    from solbench.config import FinetuneConfig
    from solbench.engine.engine import Engine, SamplerSpec
    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter
    from solbench.engine.policy import PolicyNets
    from solbench.engine.timing import PhaseTimer

    adapter = TinyAdapter(load_tiny(pretrained=True))
    nets = PolicyNets(adapter.transformer, FinetuneConfig(mode="lora", lora_rank=8, lora_alpha=16), roles=("old",),
                      explore_source="old", rollout_copy=True)
    with torch.no_grad():  # an "old" adapter that is not zero, as after some training
        generator = torch.Generator().manual_seed(0)
        for p in nets.trainable("old"):
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    nets.sync_explore_copy()  # the trainer's refresh after an update
    engine = Engine(adapter, {"old": nets["old"], "merged": nets.rollout_copy}, None, PhaseTimer(), run_seed=0)
    spec = SamplerSpec("euler", args.steps, guidance=args.guidance)
    modes = ["quiet", "loaded"] if args.load == "both" else [args.load]

    print(cpu_line())
    table = Table(title=f"tiny model, Euler {args.steps} steps, guidance {args.guidance}, {args.threads} thread(s): "
                        "seconds per engine.sample, min / median")
    table.add_column("batch", justify="right")
    for mode in modes:
        for col in (f"LoRA view {mode}", f"merged {mode}", f"speedup {mode}"):
            table.add_column(col, justify="right")
    table.add_column("max |dx0|", justify="right")
    for batch in (int(b) for b in args.batches.split(",")):
        ids = [f"p{i % len(PROMPTS)}" for i in range(batch)]
        texts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        outputs = {}

        def run(role):
            outputs[role] = engine.sample(ids, texts, range(batch), net=role, sampler=spec, phase="rollout",
                                          stream="bench").x0

        cells = [str(batch)]
        for mode in modes:
            with maybe_loaded(mode == "loaded"):
                timing = paired({"old": lambda: run("old"), "merged": lambda: run("merged")}, args.repeats)
            view, plain = timing["old"], timing["merged"]
            cells += [f"{view.min:.3f} / {view.median:.3f}", f"{plain.min:.3f} / {plain.median:.3f}",
                      f"{view.median / plain.median:.2f}x"]
        cells.append(f"{(outputs['old'] - outputs['merged']).abs().max().item():.1e}")
        table.add_row(*cells)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
