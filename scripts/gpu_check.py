"""GPU-only checks of the real path, run by scripts/gpu_measure.sh before the measurement.

    python scripts/gpu_check.py --out DIR          (writes DIR/gpu_check.json; exit 1 if a check fails)

1. Environment: torch, CUDA, the GPU, TransformerEngine, versions of the carried packages.
2. The scaled-matmul explore backend (solbench.quant.native) at FLUX's layer shapes, on the format the
   GPU has (FP8 from sm_89, NVFP4 from sm_100):
   - its input quantizer gives solbench.quant.formats.quantize's codes and scales bit for bit, on the GPU;
   - it runs without a host synchronisation (torch.cuda.set_sync_debug_mode("error"));
   - its output equals F.linear of the emulated operands (the same numbers) up to the GEMM's accumulation
     order and one bf16 rounding (relative Frobenius error < 2e-3);
   - its time against the bf16 F.linear and the emulated layer;
   - FP8: the CUDA kernels its input quantizer launches (the compiled two-pass kernel: at most two, plus
     a small second stage where inductor splits the amax reduction), and with fast accumulation
     (quant.fast_accum) its error against the emulated layer and its time;
   the same for FP8 with rowwise scales (``native_fp8_rowwise``: a scale per token and per output channel,
   fp8_rowwise_flux's arithmetic), its operands against formats.quantize(x, "fp8", "channel").
3. fp32 LoRA on a bf16 CUDA transformer: adapters, gradients and AdamW state in fp32.
4. The GEMM table (``gemm_table``, about 10 s): the bf16 ``F.linear`` against ``torch._scaled_mm`` on operands
   already in FP8, tensorwise and rowwise scales, each with and without fast accumulation, at FLUX's shapes
   (16384 rows; 3072 -> 3072, 3072 -> 12288, 12288 -> 3072, 3072 -> 9216 for a fused q/k/v): the GEMM speed-up
   the explore copy's ratio rests on, measured. Each variant's error, if any, is its cell.
On a CPU the device checks are skipped and say so (the CPU tests cover that ground); the script itself
is exercised there by tests/test_gpu_scripts.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _timed(fn, repeats: int = 20) -> float:
    """Median seconds of fn() on the GPU (CUDA events), after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return sorted(times)[len(times) // 2]


def environment() -> dict:
    import importlib.metadata as md

    from solbench.quant.layers import te_unavailable_reason
    from solbench.quant.recipes import get_recipe

    import solbench.methods

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "solbench_methods": str(Path(solbench.methods.__file__).parent), "packages": {}}
    for name in ("diffusers", "transformers", "peft", "pydantic", "huggingface_hub", "tokenizers", "safetensors"):
        try:
            env["packages"][name] = md.version(name)
        except md.PackageNotFoundError:
            env["packages"][name] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    env["transformer_engine"] = te_unavailable_reason(get_recipe("fp8_w8a8")) or "usable"
    return env


def native_backend(kind: str) -> dict:
    """Section 2 for ``kind`` ("fp8" | "fp8_rowwise" | "nvfp4") at FLUX's attention and MLP shapes."""
    from solbench import quant
    from solbench.quant import formats
    from solbench.quant.native import (NativeLinear, native_unavailable_reason, quantize_fp8_rows, quantize_fp8_rowwise,
                                       quantize_nvfp4_rows)

    recipe = quant.get_recipe({"fp8": "fp8_w8a8", "fp8_rowwise": "fp8_rowwise_flux", "nvfp4": "nvfp4_w4a4"}[kind])
    recipe = recipe.replace(skip=(), min_dim=0)
    fmt = recipe.format
    quantize_rows = quantize_fp8_rowwise if recipe.rowwise else quantize_fp8_rows
    reason = native_unavailable_reason(recipe)
    if reason is not None or not torch.cuda.is_available():
        return {"skipped": reason or "no CUDA device"}
    out = {"shapes": []}
    torch.manual_seed(0)
    for rows, k, n in ((16 * 1024, 3072, 3072), (16 * 1024, 3072, 12288), (16 * 1024, 12288, 3072)):
        linear = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        native = NativeLinear(k, n, True, recipe, name="check", dtype=torch.bfloat16, device="cuda")
        native.load_weight(linear.weight, linear.bias)
        emulated = quant.QuantLinear.from_linear(linear, recipe, name="check")
        # operands: the sync-free quantizer against solbench's, on this GPU
        if fmt == "fp8":
            codes, decode = quantize_rows(x)
            ref = formats.quantize(x, "fp8", recipe.activation_block)
            same = (bool(torch.equal(codes.view(torch.uint8), ref.codes.view(torch.uint8)))
                    and bool(torch.equal(decode, ref.scales)))
        else:
            codes, scales, decode = quantize_nvfp4_rows(x)
            ref = formats.quantize(x, "nvfp4", (1, 16))
            same = (bool(torch.equal(codes, ref.codes))
                    and bool(torch.equal(scales.view(torch.uint8), ref.scales.view(torch.uint8))))
        weights_same = bool(torch.equal(native.dequantized_weight(torch.bfloat16), emulated.weight))
        with torch.no_grad():
            native(x)  # warm-up: cuBLAS handles and workspaces are created outside the checked call
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                y = native(x)
                synced = False
            except RuntimeError as err:
                synced = "synchroniz" in str(err)
                y = None
            finally:
                torch.cuda.set_sync_debug_mode("default")
            if y is None:
                y = native(x)
            ref_y = F.linear(formats.fake_quantize(x.float(), fmt, recipe.activation_block), native.dequantized_weight(),
                             linear.bias.float())
            rel = float((y.float() - ref_y).norm() / ref_y.norm())
            t_bf16 = _timed(lambda: F.linear(x, linear.weight, linear.bias))
            t_native = _timed(lambda: native(x))
            t_emulated = _timed(lambda: emulated(x), repeats=5)
            extra = _fp8_extras(native, x, ref_y, t_bf16, quantize_rows) if fmt == "fp8" else {}
        flops = 2 * rows * k * n
        out["shapes"].append({"rows": rows, "in": k, "out": n, "operands_bit_exact": same, "weights_bit_exact": weights_same,
                              "host_sync_free": not synced, "relative_error_vs_emulated_operands": rel,
                              "bf16_tflops": flops / t_bf16 / 1e12, "native_tflops": flops / t_native / 1e12,
                              "emulated_tflops": flops / t_emulated / 1e12, "native_speedup_vs_bf16": t_bf16 / t_native,
                              **extra})
    out["ok"] = all(s["operands_bit_exact"] and s["weights_bit_exact"] and s["host_sync_free"]
                    and s["relative_error_vs_emulated_operands"] < 2e-3 for s in out["shapes"])
    return out


def _fp8_extras(native, x, ref_y, t_bf16: float, quantize_rows) -> dict:
    """The FP8 layer's input quantizer's CUDA kernel count, and the layer with fast accumulation: its
    relative error against the emulated layer's numbers and its speed against the bf16 F.linear."""
    from torch.profiler import ProfilerActivity, profile

    from solbench.quant.native import set_fast_accum

    quantize_rows(x)  # compiled before profiling
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        quantize_rows(x)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    set_fast_accum(native, True)
    try:
        y = native(x)
        t_fast = _timed(lambda: native(x))
    finally:
        set_fast_accum(native, False)
    return {"quantizer_kernels": len(kernels), "quantizer_kernel_names": kernels[:6],
            "relative_error_fast_accum_vs_emulated_operands": float((y.float() - ref_y).norm() / ref_y.norm()),
            "fast_accum_speedup_vs_bf16": t_bf16 / t_fast}


GEMM_SHAPES = ((16384, 3072, 3072), (16384, 3072, 12288), (16384, 12288, 3072), (16384, 3072, 9216))
GEMM_VARIANTS = ("fp8_tensorwise", "fp8_tensorwise_fast", "fp8_rowwise", "fp8_rowwise_fast")


def gemm_table(device=None, shapes=GEMM_SHAPES, timer=None) -> dict:
    """Section 4: per shape (rows, in, out), TFLOP/s of the bf16 F.linear and of torch._scaled_mm on FP8 operands
    (tensorwise: 0-dim scales; rowwise: [M, 1] and [1, N]; ``_fast``: use_fast_accum), and each FP8 variant's
    speed-up over bf16. Only the GEMM: the operands are quantized before timing. ``timer(fn)`` gives seconds
    (default: the CUDA-event median); a variant that raises has its error instead of numbers."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and timer is None:
        return {"skipped": "no CUDA device"}
    timer = timer or _timed
    torch.manual_seed(0)
    table = []
    for m, k, n in shapes:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5
        a, b = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()  # b column-major, as cuBLAS wants it
        one = torch.ones((), device=device)
        scales = {"tensorwise": (one, one),
                  "rowwise": (torch.ones(m, 1, device=device), torch.ones(1, n, device=device))}
        flops = 2 * m * k * n
        row = {"rows": m, "in": k, "out": n}
        calls = {"bf16": lambda: F.linear(x, w)}
        for variant in GEMM_VARIANTS:
            sa, sb = scales[variant.split("_")[1]]
            fast = variant.endswith("_fast")
            calls[variant] = (lambda sa=sa, sb=sb, fast=fast:
                              torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast))
        for name, fn in calls.items():
            try:
                seconds = timer(fn)
                row[f"{name}_tflops"] = float(f"{flops / seconds / 1e12:.4g}")  # 4 significant digits
            except Exception as err:  # one variant this torch/GPU lacks: its cell says why
                row[f"{name}_error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
        for variant in GEMM_VARIANTS:
            if f"{variant}_tflops" in row and "bf16_tflops" in row:
                row[f"{variant}_speedup_vs_bf16"] = round(row[f"{variant}_tflops"] / row["bf16_tflops"], 3)
        table.append(row)
        del x, w, a, b
    return {"device": str(device), "shapes": table}


def lora_state() -> dict:
    """Section 3: fp32 LoRA state on a bf16 transformer on the GPU."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    from diffusers import FluxTransformer2DModel

    from solbench.config import FinetuneConfig
    from solbench.engine.policy import PolicyNets

    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64,
                                   num_attention_heads=2, joint_attention_dim=64, pooled_projection_dim=64,
                                   axes_dims_rope=[16, 24, 24]).to("cuda", torch.bfloat16)
    nets = PolicyNets(model, FinetuneConfig(lora_rank=4, lora_alpha=8), {"old"})
    params = nets.trainable("policy")
    out = model(hidden_states=torch.randn(2, 64, 16, device="cuda", dtype=torch.bfloat16),
                encoder_hidden_states=torch.randn(2, 8, 64, device="cuda", dtype=torch.bfloat16),
                pooled_projections=torch.randn(2, 64, device="cuda", dtype=torch.bfloat16),
                timestep=torch.full((2,), 0.5, device="cuda", dtype=torch.bfloat16),
                img_ids=torch.zeros(64, 3, device="cuda"), txt_ids=torch.zeros(8, 3, device="cuda"), return_dict=False)[0]
    out.float().pow(2).mean().backward()
    opt = torch.optim.AdamW(params, lr=1e-3)
    opt.step()
    dtypes = {str(p.dtype) for p in params} | {str(p.grad.dtype) for p in params} | {
        str(v.dtype) for p in params for v in opt.state[p].values() if v.ndim}
    return {"dtypes": sorted(dtypes), "ok": dtypes == {"torch.float32"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for gpu_check.json")
    args = parser.parse_args()
    start = time.perf_counter()
    report = {"environment": environment()}
    print(json.dumps(report["environment"], indent=1), flush=True)
    for name, fn in (("gemm_table", gemm_table), ("native_fp8", lambda: native_backend("fp8")),
                     ("native_fp8_rowwise", lambda: native_backend("fp8_rowwise")),
                     ("native_nvfp4", lambda: native_backend("nvfp4")), ("lora_fp32_on_bf16", lora_state)):
        try:
            report[name] = fn()
        except Exception as err:  # a check that crashes is a failed check; the others still run
            report[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        print(name, json.dumps(report[name], indent=1), flush=True)
    report["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    failed = [k for k, v in report.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"gpu_check: {'FAILED ' + ', '.join(failed) if failed else 'ok'} ({report['seconds']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
