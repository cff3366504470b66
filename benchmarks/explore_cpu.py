"""The explore forward against the full-precision forward on this CPU, per quantization backend.

    .venv/bin/python benchmarks/explore_cpu.py [--batch 64] [--repeats 7] [--threads 1] [--recipe nvfp4_tiny_flux]
                                               [--backends emulated,cpu_bf16] [--profile] [--compiled]

One forward of the shipped tiny model (width 256) at tiny_main's explore batch (4 prompts x N = 16
candidates = 64 samples), through the engine's own call (its row padding included), in fp32 (the
full-precision network every full-step rollout uses) and as the explore copy of ``--recipe`` on each
backend: ``emulated`` (fake quantization, fp32 GEMMs) and ``cpu_bf16`` (the same NVFP4 values on the
CPU's bf16 units, solbench.quant.cpu_bf16). Candidates are timed round-robin (benchmarks/_load.paired),
min and median over ``--repeats`` rounds; the ratio is full precision's median over the backend's.

``--compiled`` adds each network compiled as a run's sampling forwards are (solbench.models.compile.compile_blocks,
inductor's default mode, inside ``sampling()``), both arms alike: rows "<name>+compiled", each ratio against the
eager fp32 median and, for the explore copies, against compiled fp32 (the speed block's ``sampling: [compiled]``
arms compare that pair). Compilation happens in the warm-up round and is not timed.

``--profile`` adds where one forward of each arm spends its time (torch.profiler, self CPU time by
kind: GEMMs, the input quantizer, attention, elementwise), the breakdown issue 45 asks for when the
target (explore forward >= 1.5x full precision) is not met. Goal rows print "goal met" or by how much
they fall short; nothing here is a test (tests/test_benchmark_scripts.py runs it at the smallest size).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import cpu_line, paired  # noqa: E402

GOAL = 1.5  # issue 45: explore forward at least 1.5x the full-precision forward at tiny_main's shapes

KINDS = (("GEMM", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")),
         ("input quantizer", ("CompiledFxGraph", "Torch-Compiled Region", "TorchDynamo", "aten::amax", "aten::abs")),
         ("attention", ("scaled_dot_product",)),
         ("GEMM epilogue (scale, bias)", ("aten::addcmul",)))


def profile_breakdown(fn) -> dict[str, float]:
    """Milliseconds of self CPU time per kind of op in one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    out = {kind: 0.0 for kind, _ in KINDS}
    out["other (norms, activations, copies)"] = 0.0
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1000.0
        kind = next((k for k, keys in KINDS if any(key in event.key for key in keys)), "other (norms, activations, copies)")
        out[kind] += ms
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (a run's numerics.threads, default 1)")
    parser.add_argument("--recipe", default="nvfp4_tiny_flux")
    parser.add_argument("--backends", default="emulated,cpu_bf16")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--compiled", action="store_true", help="also every network compiled (inductor), both arms alike")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from solbench.engine.engine import Engine
    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter
    from solbench.quant import quantized_copy, recipe_for_model
    from solbench.engine.timing import PhaseTimer

    model = load_tiny(pretrained=True)
    adapter = TinyAdapter(model)
    policy = adapter.transformer
    recipe = recipe_for_model(args.recipe, policy)
    nets = {"fp32": policy}
    for backend in args.backends.split(","):
        nets[backend] = quantized_copy(policy, recipe, backend=backend)
    engine = Engine(adapter, {"policy": policy}, None, PhaseTimer(), run_seed=0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, *adapter.latent_shape, generator=generator)
    t = torch.full((args.batch,), 0.5)
    prompts = ["three red circles", "a blue square and a green circle", "two yellow squares", "a red square"]
    with torch.no_grad():
        cond = engine.encode([prompts[i % len(prompts)] for i in range(args.batch)])

    def forward(net, compiled: bool = False):
        from solbench.models.compile import sampling

        def call():
            with torch.no_grad(), (sampling() if compiled else contextlib.nullcontext()):
                return engine._velocity(net, x, t, cond, None)
        return call

    calls = {name: forward(net) for name, net in nets.items()}
    if args.compiled:
        import copy

        from solbench.models.compile import compile_blocks

        for name, net in list(nets.items()):
            twin = copy.deepcopy(net)
            compile_blocks(twin, "default")
            calls[f"{name}+compiled"] = forward(twin, compiled=True)

    print(cpu_line())
    print(f"tiny model forward, batch {args.batch}, recipe {recipe.name}, {args.threads} thread(s), "
          f"{args.repeats} rounds (min / median ms; speedup = fp32 median / median)")
    timings = paired(calls, repeats=args.repeats)
    base = timings["fp32"].median
    for name, timing in timings.items():
        ratio = base / timing.median
        goal = "" if name.split("+")[0] in ("fp32", "emulated") else (
            "  goal met" if ratio >= GOAL else f"  {GOAL:.1f}x goal: short by {GOAL / ratio - 1:.0%}")
        twin = ""
        if name.endswith("+compiled") and name != "fp32+compiled":
            twin = f"   {timings['fp32+compiled'].median / timing.median:5.2f}x compiled fp32"
        print(f"{name:19s} {1000 * timing.min:8.1f} / {1000 * timing.median:8.1f} ms   {ratio:5.2f}x{goal}{twin}")
    if args.profile:
        print("where one forward spends its time (self CPU ms, torch.profiler):")
        rows = {name: profile_breakdown(forward(net)) for name, net in nets.items()}
        kinds = list(next(iter(rows.values())))
        print(f"{'':36s}" + "".join(f"{name:>12s}" for name in rows))
        for kind in kinds:
            print(f"{kind:36s}" + "".join(f"{rows[name][kind]:12.1f}" for name in rows))


if __name__ == "__main__":
    main()
