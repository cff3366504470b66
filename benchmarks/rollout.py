"""Rollout throughput of the tiny model through the engine: images/s, GFLOP/s, engine overhead.

    .venv/bin/python benchmarks/rollout.py [--steps 10] [--repeats 3] [--batches 1,16,64] [--load both]

For ODE (Euler) sampling at each batch size and precision (fp32, bf16, emulated NVFP4 W4A4 with the
"nvfp4_tiny" recipe) it prints the best-of-repeats images/s, the achieved GFLOP/s (FLOPs from
solbench.models.flops, counted by torch's FlopCounter) and its share of this CPU's peak, the time of a bare
model forward (TinyT2I.velocity on prepared tensors) next to the same forward inside the engine, and
the engine's per-call overhead: the share of engine.sample's wall time spent outside the model
forward (noise, schedule, padding, guidance, decoding, bookkeeping). Target: under 5% at batch 64.

The overhead is measured inside the same calls (a timer around every TinyT2I.velocity call the
engine makes), not as the difference of an engine timing and a bare-forward timing taken at another
moment: on a shared 2-core machine those two drift apart by more than the overhead itself (session 1
measured "+7%" and "-4%" that way for the same code).

"row padding" is the cost, inside the forward, of the engine's CPU row padding for bit-identical
regeneration (solbench.models.batch_invariance): the bare forward with and without it, interleaved. It is
engine machinery too; the overhead column counts the time outside the forward.

"% GEMM" is the achieved rate over an fp32 1024^3 GEMM's rate measured right before each repeat
(paired: a GEMM rate read once at start-up drifted by 2x on a shared machine). No FLOP-per-cycle
peak is assumed (Zen 4 does 32 FP32 FLOP/cycle, Zen 5 and Xeons with two 512-bit FMA pipes 64).

--load both (default) times every row quiet and again with one busy-loop process per core running
beside it (started and stopped by the script); "quiet" still shares the host with whatever else
runs there. images/s is given as best / median over repeats; "bare fwd" and "engine fwd" are both
medians of one forward (bare: prepared tensors; engine: the mean forward inside each engine.sample).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import cpu_line, gemm_gflops, maybe_loaded  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--precisions", default="fp32,bf16,nvfp4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load", choices=["both", "quiet", "loaded"], default="both",
                        help="loaded: one busy-loop process per core runs beside the timed calls")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    from solbench.models.batch_invariance import pad_linear_rows
    from solbench.engine.engine import Engine, SamplerSpec
    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter
    from solbench.quant import get_recipe, quantized_copy
    from solbench.engine.timing import PhaseTimer

    try:
        model = load_tiny(pretrained=True)
        weights = "pretrained"
    except Exception:  # weights not shipped yet: throughput does not depend on them
        model = load_tiny(pretrained=False)
        weights = "random init"
    adapter = TinyAdapter(model)
    in_forward = [0.0]  # seconds spent inside the model forward during the timed engine call
    bare_velocity = model.velocity

    def timed_velocity(*args, **kwargs):
        start = time.perf_counter()
        out = bare_velocity(*args, **kwargs)
        in_forward[0] += time.perf_counter() - start
        return out

    model.velocity = timed_velocity  # the engine reaches the model only through this call
    policy = adapter.transformer
    nets = {
        "fp32": policy,
        "bf16": copy.deepcopy(policy).to(torch.bfloat16),
        "nvfp4": quantized_copy(policy, get_recipe("nvfp4_tiny")),
    }
    modes = ["quiet", "loaded"] if args.load == "both" else [args.load]
    flops_per_image = adapter.flops_per_forward() * args.steps
    spec = SamplerSpec("euler", args.steps)
    prompts_pool = ["three red circles", "a blue square and a green circle", "two yellow squares", "a red square"]

    print(cpu_line())
    table = Table(title=f"tiny model ({weights}), Euler {args.steps} steps, {args.threads} threads; "
                        f"columns per load mode ({', '.join(modes)})")
    cols = ["precision", "batch"]
    for mode in modes:
        cols += [f"images/s {mode} (best/med)", f"% GEMM {mode}"]
    cols += ["GEMM GFLOP/s", "bare fwd ms", "engine fwd ms", "row padding", "engine overhead"]
    for col in cols:
        table.add_column(col, justify="right")
    for precision in args.precisions.split(","):
        net = nets[precision]
        role = "explore" if precision != "fp32" else "policy"
        engine = Engine(adapter, {"policy": policy, "explore": net}, None, PhaseTimer(), run_seed=0)
        for batch in (int(b) for b in args.batches.split(",")):
            ids = [f"p{i}" for i in range(batch)]
            prompts = [prompts_pool[i % len(prompts_pool)] for i in range(batch)]
            engine.sample(ids, prompts, range(batch), net=role, sampler=spec, phase="rollout", stream="warm")
            cells, quiet = [], {}
            for mode in modes:
                with maybe_loaded(mode == "loaded"):
                    sample_times, overheads, engine_fwd, gemm_share, gemms = [], [], [], [], []
                    for r in range(args.repeats):
                        gemm = gemm_gflops()  # paired: the GEMM rate of this moment
                        in_forward[0] = 0.0
                        t0 = time.perf_counter()
                        engine.sample(ids, prompts, range(batch), net=role, sampler=spec, phase="rollout", stream=f"b{r}")
                        elapsed = time.perf_counter() - t0
                        sample_times.append(elapsed)
                        overheads.append((elapsed - in_forward[0]) / elapsed)
                        engine_fwd.append(in_forward[0] / args.steps)
                        gemms.append(gemm)
                        gemm_share.append(flops_per_image * batch / elapsed / 1e9 / gemm)
                best, med = min(sample_times), statistics.median(sample_times)
                cells += [f"{batch / best:.1f}/{batch / med:.1f}", f"{100 * statistics.median(gemm_share):.1f}"]
                if mode == modes[0]:
                    quiet = dict(overhead=statistics.median(overheads), engine_fwd=statistics.median(engine_fwd),
                                 gemm=statistics.median(gemms))
            # the bare forward: the same batch (padded as the engine pads it), prepared tensors
            padded = batch + (-batch) % engine.batch_multiple
            cond = adapter.encode([prompts[i % batch] for i in range(padded)])
            x = torch.randn(padded, *adapter.latent_shape)
            t = torch.full((padded,), 0.5)
            with torch.no_grad():
                bare_velocity(net, x, t, cond["tokens"], cond["pooled"])
                fwd_times, padded_times = [], []
                for _ in range(args.repeats * 3):  # interleaved: the two see the same machine load
                    t0 = time.perf_counter()
                    bare_velocity(net, x, t, cond["tokens"], cond["pooled"])
                    fwd_times.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    with pad_linear_rows():
                        bare_velocity(net, x, t, cond["tokens"], cond["pooled"])
                    padded_times.append(time.perf_counter() - t0)
            fwd_s = statistics.median(fwd_times)
            pad_cost = statistics.median(p / f for p, f in zip(padded_times, fwd_times)) - 1 if engine.pad_rows else 0.0
            row = (precision, str(batch), *cells, f"{quiet['gemm']:.0f}", f"{1000 * fwd_s:.1f}",
                   f"{1000 * quiet['engine_fwd']:.1f}", f"{100 * pad_cost:+.1f}%", f"{100 * quiet['overhead']:.1f}%")
            table.add_row(*row)
            print("  ".join(row), flush=True)  # progress: slow precisions take minutes on 2 cores
    Console(width=140).print(table)
    print(f"FLOPs per image: {flops_per_image / 1e9:.3f} GFLOP ({args.steps} forwards of "
          f"{adapter.flops_per_forward() / 1e6:.1f} MFLOP). Engine overhead: median over repeats of the share "
          "of engine.sample time outside the model forward (first load mode).")


if __name__ == "__main__":
    main()
