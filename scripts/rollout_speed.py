"""One transformer forward of each rollout arm at a spec's shapes: writes rollout_speed.csv (issue 40).

    python scripts/rollout_speed.py --out DIR [--spec experiments/flux_main.yaml] [--tiny] [--repeats 5]
                                    [--budget 240] [--compile auto|on|off]

The model is the spec's (FLUX.1 for flux_main) at its published shapes with random weights
(solbench.measure.published), at the spec's resolution, text length, guidance and rollout micro-batch,
with the spec's LoRA (as solbench's PolicyNets builds it: fp32 adapters on the bf16 transformer). Arms:

- ``lora``: the BF16 rollout through peft's unmerged LoRA (the old policy's adapter active);
- ``merged``: the BF16 rollout through the merged rollout copy (model.rollout_copy: merged);
- ``explore``: the explore copy in what ``quant.backend: auto`` takes here (FP8 through torch's scaled
  matmul on Hopper, with the spec recipe's layer selection; NVFP4 on Blackwell), as solbench doctor
  --measure builds it;

each eager and then compiled (solbench.compile, model.compile's mode; ``--compile auto`` compiles on CUDA
only). Rows: ``arm, precision, compiled, batch, seconds_per_forward, tflops``, where seconds_per_forward is
the median time of one batched call divided by the batch (seconds per sample forward, as
docs/measured/H200.md counts it) and tflops the model's closed-form FLOPs (solbench.flops) over that time.
rollout_speed.json adds the compile seconds of each compiled arm, the speed ratios the issue asks about
and the environment. The CSV is rewritten after every arm, so a run cut short keeps what it measured;
``--budget`` starts no arm past that many seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

COLUMNS = ("arm", "precision", "compiled", "batch", "seconds_per_forward", "tflops")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _first_run(spec: str):
    """The spec's first Sol-RL run (the arms' shapes and LoRA), else its first run."""
    from solbench.spec import load_spec

    runs = [planned.config for planned in load_spec(spec).runs]
    return next((cfg for cfg in runs if cfg.method == "sol_rl"), runs[0])


def build(cfg, device: torch.device, tiny: bool):
    """(adapter, nets, explore recipe, notes): the model at the run's shapes, its LoRA roles, the merged
    rollout copy and the explore copy, nothing compiled yet."""
    import dataclasses

    from solbench.measure.iteration import _explore_fns
    from solbench.measure.published import build_adapter
    from solbench.models import default_lora_init
    from solbench.policy import PolicyNets

    adapter = build_adapter(cfg.model.name, device, torch.bfloat16, tiny=tiny,
                            resolution=None if tiny else cfg.model.resolution)
    notes: list[str] = []
    factory, sync, recipe, backend = _explore_fns(cfg, device, notes)
    finetune = cfg.finetune
    if finetune.lora_init is None:
        finetune = dataclasses.replace(finetune, lora_init=default_lora_init(cfg.model.name))
    nets = PolicyNets(adapter.transformer, finetune, {"old", "explore"}, explore_source="old",
                      explore_factory=factory, explore_sync=sync, rollout_copy=True)
    with torch.no_grad():  # a trained-looking old policy: B != 0, so the LoRA branch computes something
        for p in nets.trainable("old"):
            p.add_(torch.randn_like(p) * 1e-3)
    nets.sync_explore_copy()
    return adapter, nets, f"{recipe.name} ({backend})", notes


def measure(args) -> dict:
    from solbench.compile import compile_blocks, resolve_compile, sampling

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = _first_run(args.spec)
    batch = cfg.micro_batch.rollout or 1
    adapter, nets, explore_label, notes = build(cfg, device, args.tiny)
    per_forward = adapter.flops_per_forward()
    guidance = cfg.sampling.guidance if cfg.sampling.guidance is not None else adapter.default_guidance
    forwards = batch * adapter.forwards_per_velocity(guidance)  # sample forwards per velocity call (CFG: 2 each)
    prompts = [f"a photo of object number {i} on a table" for i in range(batch)]
    with torch.no_grad():
        cond = adapter.encode(prompts)
        x = torch.randn(batch, *adapter.latent_shape, device=device, dtype=torch.bfloat16)
        t = torch.full((batch,), 0.7, device=device)
    arms = [("lora", "bf16", nets["old"], nets.policy), ("merged", "bf16", nets.rollout_copy, nets.rollout_copy),
            ("explore", explore_label, nets["explore"], nets["explore"])]
    mode = resolve_compile(args.compile, device)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "spec": args.spec, "model": cfg.model.name, "latent_shape": list(adapter.latent_shape), "batch": batch,
           "guidance": guidance, "lora_rank": cfg.finetune.lora_rank, "compile_mode": mode, "notes": notes,
           "rows": [], "compile_seconds": {}, "skipped": []}
    start = time.perf_counter()
    path = Path(args.out) / "rollout_speed.csv"
    plan = [(arm, precision, module, owner, False) for arm, precision, module, owner in arms]
    if mode is None:
        out["skipped"].append(f"compiled arms: model.compile {args.compile!r} compiles nothing on {device.type}")
    else:
        plan += [(arm, precision, module, owner, True) for arm, precision, module, owner in arms]
    for arm, precision, module, owner, compiled in plan:
        if time.perf_counter() - start > args.budget:
            out["skipped"].append(f"{arm} {'compiled' if compiled else 'eager'}: past the {args.budget:.0f} s budget")
            continue
        if compiled and "emulated" in precision:
            out["skipped"].append(f"{arm} compiled: an emulated copy is not compiled (solbench.policy)")
            continue

        def forward(module=module):
            with torch.no_grad(), sampling():
                return adapter.velocity(module, x, t, cond, guidance)

        if compiled:
            compile_blocks(owner, mode)
            first = time.perf_counter()
            forward()
            _sync(device)
            out["compile_seconds"][arm] = round(time.perf_counter() - first, 1)
        else:
            forward()  # warm-up: cuBLAS handles, workspaces
        seconds = statistics.median(_timed(forward, device, args.repeats)) / forwards
        out["rows"].append({"arm": arm, "precision": precision, "compiled": compiled, "batch": batch,
                            "seconds_per_forward": float(f"{seconds:.4g}"),  # 4 significant digits: tiny shapes too
                            "tflops": float(f"{per_forward / seconds / 1e12:.4g}") if per_forward else None})
        print(json.dumps(out["rows"][-1]), flush=True)
        _write_csv(path, out["rows"])
    out["ratios"] = _ratios(out["rows"])
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _ratios(rows: list[dict]) -> dict:
    """The issue's two speed-ups where both rows exist: FP8 compiled explore over BF16 compiled (the faster
    of LoRA and merged), and BF16 compiled over BF16 eager (per BF16 arm)."""
    time_of = {(r["arm"], r["compiled"]): r["seconds_per_forward"] for r in rows}
    ratios = {}
    bf16_compiled = [time_of[(a, True)] for a in ("lora", "merged") if (a, True) in time_of]
    if ("explore", True) in time_of and bf16_compiled:
        ratios["explore_compiled_vs_best_bf16_compiled"] = round(min(bf16_compiled) / time_of[("explore", True)], 3)
    for arm in ("lora", "merged", "explore"):
        if (arm, True) in time_of and (arm, False) in time_of:
            ratios[f"{arm}_compiled_vs_eager"] = round(time_of[(arm, False)] / time_of[(arm, True)], 3)
    if ("merged", False) in time_of and ("lora", False) in time_of:
        ratios["merged_vs_lora_eager"] = round(time_of[("lora", False)] / time_of[("merged", False)], 3)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for rollout_speed.csv and rollout_speed.json")
    parser.add_argument("--spec", default="experiments/flux_main.yaml", help="the spec whose Sol-RL run gives the shapes")
    parser.add_argument("--tiny", action="store_true", help="the published model's tiny shapes (the CPU test)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per arm (after one warm-up)")
    parser.add_argument("--budget", type=float, default=240.0, help="start no arm after this many seconds")
    parser.add_argument("--compile", default="auto", help="model.compile for the compiled arms (auto: CUDA only)")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = measure(args)
    (Path(args.out) / "rollout_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"rollout_speed: {len(result['rows'])} rows, {result['ratios']} ({result['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
