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

Usage: python benchmarks/quant.py [--repeats 7] [--size 4096] [--threads N] [--batch 64] [--wide-batch 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from solbench.quant import RECIPES, fake_quantize, quantize, quantized_copy, sync_weights  # noqa: E402
from solbench.quant.layers import te_unavailable_reason  # noqa: E402


def interleaved_medians(candidates: Dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> Dict[str, float]:
    """Median seconds per candidate; every round runs each candidate once, in turn."""
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


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


def bench_quantizers(size: int, repeats: int) -> None:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(dtype)
        # round trips decode back to the input dtype, like the copy they are compared with
        ours = {
            "nvfp4": lambda: quantize(x, "nvfp4").dequantize(),
            "nvfp4 quantize only": lambda: quantize(x, "nvfp4"),
            "nvfp4 16x16": lambda: quantize(x, "nvfp4", (16, 16)).dequantize(),
            "nvfp4 fake_quantize": lambda: fake_quantize(x, "nvfp4"),
            "mxfp4": lambda: quantize(x, "mxfp4").dequantize(),
            "fp8": lambda: quantize(x, "fp8").dequantize(),
        }
        reference = torchao_references(x)
        candidates = {f"ours {k}": v for k, v in ours.items()}
        candidates.update({f"torchao {k}": v for k, v in reference.items()})
        candidates["copy"] = lambda: x.clone()
        t = interleaved_medians(candidates, repeats)
        floor = t["copy"]
        elements = x.numel()
        for name in ours:
            ref = t.get(f"torchao {name}")
            rows.append([
                f"{name} ({str(dtype).replace('torch.', '')})",
                f"{1e3 * t['ours ' + name]:.1f}",
                f"{elements / t['ours ' + name] / 1e6:.0f}",
                f"{1e3 * ref:.1f}" if ref else "-",
                f"{ref / t['ours ' + name]:.1f}x" if ref else "-",
                f"{t['ours ' + name] / floor:.1f}x",
            ])
        rows.append([f"copy floor ({str(dtype).replace('torch.', '')})", f"{1e3 * floor:.1f}",
                     f"{elements / floor / 1e6:.0f}", "-", "-", "1.0x"])
    print_table(
        f"Quantize + dequantize of a {size}x{size} tensor (median of {repeats})",
        ["operation", "ours ms", "Melem/s", "torchao ms", "speedup vs torchao", "vs copy floor"],
        rows,
    )


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
    runnable = [n for n in ("nvfp4_w4a4", "fp8_w8a8") if te_unavailable_reason(RECIPES[n].replace(backend="te")) is None]
    if not runnable:
        reason = te_unavailable_reason(RECIPES["nvfp4_w4a4"].replace(backend="te"))
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
        candidates[name] = timed(quantized_copy(gpu_model, RECIPES[name].replace(backend="te")))
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
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per candidate (median reported)")
    parser.add_argument("--size", type=int, default=4096, help="side of the square tensor for section 1")
    parser.add_argument("--batch", type=int, default=64, help="batch of the width-128 forward benchmark")
    parser.add_argument("--wide-batch", type=int, default=16, help="batch of the width-512 forward benchmark")
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 512], help="model widths for section 2")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), load average {load:.1f} at start"
    )
    bench_quantizers(args.size, args.repeats)
    for width in args.widths:
        bench_forward(args.batch if width <= 128 else args.wide_batch, args.repeats, width)


if __name__ == "__main__":
    main()
