"""Benchmark of solbench.quant on this machine: quantizer throughput and quantized-copy forward time.

What is timed (wall clock, time.perf_counter, CPU only; medians over --repeats rounds, each
round running every candidate once in turn so that load from other jobs hits them alike):

1. quantize + dequantize of one 4096x4096 tensor (fp32 and bf16) per format, against torchao
   0.18's reference functions on the same tensor (NVFP4Tensor.to_nvfp4(...).dequantize(),
   MXTensor.to_mx(...).dequantize()) and against `x.clone()`, the memory-bandwidth floor (one
   read, one freshly allocated write). NVFP4 quantize alone is also timed against torchao's
   nvfp4_quantize.
2. One forward pass of an embedded-size FLUX transformer (about 1.8M parameters: width 128,
   2 double + 2 single blocks, 64 image tokens of 48 channels, batch 64; and a width-512 variant
   of 28M parameters at batch 16) in fp32 and as the
   quantized copy of each recipe on each backend that runs here, plus the time of one
   sync_weights (the per-iteration re-quantization).

On CPU nothing runs in FP4: the emulated backend computes the same numbers as a Blackwell FP4
GEMM (for fidelity studies) in fp32, so its forward can only be slower than fp32. FP4 speedups
need the TransformerEngine backend on a Blackwell GPU.

3. One emulated low-precision linear layer 256x1024 @ 1024x1024 against fp32 F.linear, and the
   tiny model's transformer forward in fp32, bf16 and as quantized copies (targets: W4A4 <= 1.5x fp32).

Sections 1-3 print a "quiet" and a "loaded" column (--load): loaded runs one busy-loop process per
core beside the timed calls (started and stopped by the script), the state of a shared node. Each
cell is min / median over interleaved rounds; ratios use medians.

Usage: python benchmarks/quant.py [--repeats 7] [--size 4096] [--threads N] [--load both|quiet|loaded]
       [--sections quantize,linear,tiny,flux] [--batch 64] [--wide-batch 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from solbench.quant import RECIPES, fake_quantize, quantize, quantized_copy, sync_weights  # noqa: E402
from solbench.quant.layers import QuantLinear, te_unavailable_reason  # noqa: E402

from _load import Timing, cpu_line, maybe_loaded, paired  # noqa: E402


def interleaved_medians(candidates: Dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> Dict[str, float]:
    """Median seconds per candidate; every round runs each candidate once, in turn."""
    return {name: t.median for name, t in paired(candidates, repeats, warmup).items()}


def both(candidates: Dict[str, Callable[[], object]], repeats: int, modes: List[str], warmup: int = 1) -> Dict[str, Dict[str, Timing]]:
    """{mode: {name: Timing}} for mode in quiet / loaded (loaded: one busy-loop process per core)."""
    out = {}
    for mode in modes:
        with maybe_loaded(mode == "loaded"):
            out[mode] = paired(candidates, repeats, warmup)
    return out


def ms(t: Timing) -> str:
    return f"{1e3 * t.min:.1f} / {1e3 * t.median:.1f}"


def print_table(title: str, headers: List[str], rows: List[List[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |")


def torchao_references(x: torch.Tensor):
    """torchao's CPU reference quantize+dequantize callables (None when torchao is missing)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.mx_tensor import MXTensor
            from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, nvfp4_quantize
    except Exception as exc:  # torchao is a dev extra
        print(f"torchao unavailable ({type(exc).__name__}: {exc}); reference columns left empty")
        return {}
    per_tensor_scale = x.float().abs().max() / 2688.0
    return {
        "nvfp4": lambda: NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=per_tensor_scale).dequantize(x.dtype),
        "nvfp4 quantize only": lambda: nvfp4_quantize(x, 16, per_tensor_scale),
        "mxfp4": lambda: MXTensor.to_mx(x, torch.float4_e2m1fn_x2, 32).dequantize(x.dtype),
    }


def bench_quantizers(size: int, repeats: int, modes: List[str], dtypes: List[torch.dtype]) -> None:
    rows = []
    for dtype in dtypes:
        x = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(dtype)
        # round trips decode back to the input dtype, like the copy they are compared with
        ours = {
            "nvfp4 quantize only": lambda: quantize(x, "nvfp4"),
            "nvfp4": lambda: quantize(x, "nvfp4").dequantize(),
            "nvfp4 16x16": lambda: quantize(x, "nvfp4", (16, 16)).dequantize(),
            "nvfp4 fake_quantize": lambda: fake_quantize(x, "nvfp4"),
            "mxfp4": lambda: quantize(x, "mxfp4").dequantize(),
            "mxfp4 fake_quantize": lambda: fake_quantize(x, "mxfp4"),
            "fp8": lambda: quantize(x, "fp8").dequantize(),
            "fp8 fake_quantize": lambda: fake_quantize(x, "fp8"),
        }
        reference = torchao_references(x)
        candidates = {f"ours {k}": v for k, v in ours.items()}
        candidates.update({f"torchao {k}": v for k, v in reference.items()})
        candidates["copy"] = lambda: x.clone()
        t = both(candidates, repeats, modes)
        label = str(dtype).replace("torch.", "")
        for name in ours:
            row = [f"{name} ({label})"]
            for mode in modes:
                mine, floor, ref = t[mode]["ours " + name], t[mode]["copy"], t[mode].get(f"torchao {name}")
                row += [ms(mine), f"{ref.median / mine.median:.1f}x" if ref else "-", f"{mine.median / floor.median:.1f}x"]
            rows.append(row)
        for ref_name in reference:
            rows.append([f"torchao {ref_name} ({label})"] + sum(([ms(t[m][f"torchao {ref_name}"]), "1.0x", "-"] for m in modes), []))
        rows.append([f"copy floor ({label})"] + sum(([ms(t[m]["copy"]), "-", "1.0x"] for m in modes), []))
    headers = ["operation"] + sum(([f"{m} ms min / median", f"{m} speedup vs torchao", f"{m} vs copy"] for m in modes), [])
    print_table(f"Quantize (+ dequantize) of a {size}x{size} tensor ({repeats} interleaved rounds; ratios of medians)",
                headers, rows)


def bench_linear(repeats: int, modes: List[str], rows_: int = 256, width: int = 1024) -> None:
    """One emulated low-precision linear layer (activations fake-quantized every call) vs F.linear."""
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    linear = nn.Linear(width, width)
    x = torch.randn(rows_, width)
    recipes = ["nvfp4_w4a4", "mxfp4_w4a4", "fp8_w8a8"]
    layers = {name: QuantLinear.from_linear(linear, RECIPES[name]) for name in recipes}
    candidates = {"fp32": lambda: F.linear(x, linear.weight, linear.bias)}
    for name, layer in layers.items():
        candidates[name] = (lambda m: lambda: m(x))(layer)
    with torch.no_grad():
        t = both(candidates, repeats, modes, warmup=2)
    rows = []
    for name in ["fp32"] + recipes:
        rows.append([name] + sum(([ms(t[m][name]), f"{t[m][name].median / t[m]['fp32'].median:.2f}x"] for m in modes), []))
    print_table(f"Linear {rows_}x{width} @ {width}x{width} ({repeats} interleaved rounds; ratio of medians)",
                ["precision"] + sum(([f"{m} ms min / median", f"{m} vs fp32"] for m in modes), []), rows)


def bench_tiny(repeats: int, modes: List[str], batch: int) -> None:
    """The tiny model's transformer forward (TinyT2I.velocity on prepared tensors) per precision."""
    import copy

    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter

    try:
        model = load_tiny(pretrained=True)
    except Exception:
        model = load_tiny(pretrained=False)
    adapter = TinyAdapter(model)
    policy = adapter.transformer
    nets = {"fp32": policy, "bf16": copy.deepcopy(policy).to(torch.bfloat16)}
    for name in ("nvfp4_w4a4", "nvfp4_tiny"):
        nets[name] = quantized_copy(policy, name)
    cond = adapter.encode(["three red circles"] * batch)
    x = torch.randn(batch, *adapter.latent_shape)
    t = torch.full((batch,), 0.5)
    candidates = {name: (lambda n: lambda: model.velocity(n, x, t, cond["tokens"], cond["pooled"]))(net)
                  for name, net in nets.items()}
    with torch.no_grad():
        res = both(candidates, repeats, modes, warmup=2)
    rows = [[name] + sum(([ms(res[m][name]), f"{res[m][name].median / res[m]['fp32'].median:.2f}x"] for m in modes), [])
            for name in nets]
    print_table(f"Tiny model forward, batch {batch} ({repeats} interleaved rounds; ratio of medians)",
                ["precision"] + sum(([f"{m} ms min / median", f"{m} vs fp32"] for m in modes), []), rows)


def embedded_flux(width: int = 128, heads: int = 4):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    head_dim = width // heads
    rope = [head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8]
    return FluxTransformer2DModel(
        patch_size=1, in_channels=48, num_layers=2, num_single_layers=2, attention_head_dim=head_dim,
        num_attention_heads=heads, joint_attention_dim=64, pooled_projection_dim=64, axes_dims_rope=rope,
    ).eval()


def bench_te(model, inputs, repeats: int) -> List[List[str]]:
    """TransformerEngine rows: bf16 on the GPU vs te copies, or why they cannot run here."""
    runnable = [n for n in ("nvfp4_w4a4", "fp8_w8a8") if te_unavailable_reason(RECIPES[n]) is None]
    if not runnable:
        reason = te_unavailable_reason(RECIPES["nvfp4_w4a4"])
        return [["nvfp4_w4a4 / fp8_w8a8", "te", "-", "-", "-", f"not run: {reason}"]]
    import copy

    device = torch.device("cuda")
    gpu_model = copy.deepcopy(model).to(device, torch.bfloat16)
    gpu_inputs = {
        k: (v.to(device, torch.bfloat16) if v.is_floating_point() else v.to(device)) if torch.is_tensor(v) else v
        for k, v in inputs.items()
    }

    def timed(module):
        def run():
            module(**gpu_inputs)
            torch.cuda.synchronize()  # time the GPU work, not the launch
        return run

    candidates = {"bf16": timed(gpu_model)}
    for name in runnable:
        candidates[name] = timed(quantized_copy(gpu_model, RECIPES[name], backend="te"))
    with torch.no_grad():
        t = interleaved_medians(candidates, repeats, warmup=3)
    rows = [["bf16 (GPU)", "-", f"{1e3 * t['bf16']:.2f}", "1.00x", "-", torch.cuda.get_device_name()]]
    for name in runnable:
        rows.append([name, "te", f"{1e3 * t[name]:.2f}", f"{t[name] / t['bf16']:.2f}x", "-", "vs bf16 on the GPU"])
    return rows


def bench_forward(batch: int, repeats: int, width: int) -> None:
    model = embedded_flux(width)
    gen = torch.Generator().manual_seed(1)
    inputs = dict(
        hidden_states=torch.randn(batch, 64, 48, generator=gen),
        encoder_hidden_states=torch.randn(batch, 8, 64, generator=gen),
        pooled_projections=torch.randn(batch, 64, generator=gen),
        timestep=torch.rand(batch, generator=gen),
        img_ids=torch.randn(64, 3, generator=gen),
        txt_ids=torch.randn(8, 3, generator=gen),
        return_dict=False,
    )
    recipes = ["nvfp4_w4a4", "nvfp4_tiny", "nvfp4_w4a16", "mxfp4_w4a4", "fp8_w8a8"]
    copies = {name: quantized_copy(model, name) for name in recipes}
    candidates = {"fp32": lambda: model(**inputs)}
    for name, copy_ in copies.items():
        candidates[name] = (lambda c: lambda: c(**inputs))(copy_)
    syncs = {f"sync {name}": (lambda c: lambda: sync_weights(c, model))(copy_) for name, copy_ in copies.items()}
    with torch.no_grad():
        t = interleaved_medians(candidates, repeats)
    ts = interleaved_medians(syncs, max(3, repeats // 2))
    params = sum(p.numel() for p in model.parameters())
    rows = [["fp32", "-", f"{1e3 * t['fp32']:.1f}", "1.00x", "-", ""]]
    for name in recipes:
        rows.append([name, "emulated", f"{1e3 * t[name]:.1f}", f"{t[name] / t['fp32']:.2f}x",
                     f"{1e3 * ts['sync ' + name]:.1f}", ""])
    rows.extend(bench_te(model, inputs, repeats))
    print_table(
        f"Forward of a FLUX transformer, width {width}, {params / 1e6:.2f}M parameters, batch {batch} x 72 tokens "
        f"(median of {repeats})",
        ["recipe", "backend", "forward ms", "vs fp32", "sync_weights ms", "note"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per candidate (min and median reported)")
    parser.add_argument("--size", type=int, default=4096, help="side of the square tensor for section 1")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="input dtypes of section 1")
    parser.add_argument("--batch", type=int, default=64, help="batch of the width-128 forward benchmark")
    parser.add_argument("--tiny-batch", type=int, default=16, help="batch of the tiny-model forward benchmark")
    parser.add_argument("--wide-batch", type=int, default=16, help="batch of the width-512 forward benchmark")
    parser.add_argument("--widths", type=int, nargs="*", default=[128, 512], help="FLUX model widths for section 4")
    parser.add_argument("--sections", default="quantize,linear,tiny,flux", help="which sections to run")
    parser.add_argument("--load", choices=["both", "quiet", "loaded"], default="both",
                        help="loaded: one busy-loop process per core runs beside the timed calls")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = ["quiet", "loaded"] if args.load == "both" else [args.load]
    sections = args.sections.split(",")
    print(cpu_line())
    print("'quiet' = nothing started by this script; the host may run other jobs (load average above). "
          "'loaded' = plus one busy-loop process per core.")
    if "quantize" in sections:
        bench_quantizers(args.size, args.repeats, modes, [getattr(torch, d) for d in args.dtypes.split(",")])
    if "linear" in sections:
        bench_linear(args.repeats, modes)
    if "tiny" in sections:
        bench_tiny(args.repeats, modes, args.tiny_batch)
    if "flux" in sections:
        for width in args.widths:
            bench_forward(args.batch if width <= 128 else args.wide_batch, args.repeats, width)


if __name__ == "__main__":
    main()
