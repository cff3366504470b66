"""This CPU's rates at a run's own shapes, measured when the run starts: the profile its clock is predicted with.

The report projects Table 5 onto B200 / H100 from counted FLOPs and published peaks. On a CPU the same
projection can be checked against the clock, if it is priced with this CPU's rates instead of a GPU's.
A run with an explore copy on the CPU measures, before its first iteration, on its own thread count:

- ``gemm``: the fp32 and bf16 GEMM rates (GFLOP/s) over the explore copy's quantized Linear shapes (each
  distinct in x out at ``GEMM_ROWS`` rows, weighted by how many layers have it): what a FLOP-count projection
  assumes, the low-precision units against the fp32 units;
- ``forward``: the full-precision network's and the explore copy's whole forward at the rollout batch
  (GFLOP/s of counted forward FLOPs): the rates with everything a forward does besides its GEMMs (the
  input quantizer, attention, norms, activations in fp32).

Each is the median of ``REPEATS`` timings after one warm-up call, inputs from a private generator (the run's
random streams are untouched, so its numbers do not depend on the measurement). Written to the run folder as
``cpu_rates.json``; the report (solbench.report.cpu_check) predicts the rollout and E2E ratios from them and
shows the prediction beside the measured ratio. The harness times; no method sees this.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

__all__ = ["measure_cpu_rates", "cached_cpu_rates", "GEMM_ROWS", "REPEATS"]

GEMM_ROWS = 4096
REPEATS = 3


def _median_seconds(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _quantized_shapes(explore: torch.nn.Module) -> dict[tuple[int, int], int]:
    from solbench.quant.layers import QUANTIZED_LAYER_TYPES

    shapes: dict[tuple[int, int], int] = {}
    for module in explore.modules():
        if isinstance(module, QUANTIZED_LAYER_TYPES):
            key = (module.in_features, module.out_features)
            shapes[key] = shapes.get(key, 0) + 1
    return shapes


def gemm_rates(shapes: dict[tuple[int, int], int], rows: int = GEMM_ROWS) -> dict:
    """fp32 and bf16 GFLOP/s over ``shapes`` ((in, out) -> count) at ``rows`` rows."""
    generator = torch.Generator().manual_seed(0)
    flops = seconds32 = seconds16 = 0.0
    for (k, n), count in sorted(shapes.items()):
        x = torch.randn(rows, k, generator=generator)
        w = torch.randn(n, k, generator=generator)
        xb, wb = x.bfloat16(), w.bfloat16()
        flops += 2.0 * rows * k * n * count
        seconds32 += _median_seconds(lambda: F.linear(x, w)) * count
        seconds16 += _median_seconds(lambda: F.linear(xb, wb)) * count
    return {"rows": rows, "shapes": [[k, n, c] for (k, n), c in sorted(shapes.items())],
            "fp32_gflops": flops / seconds32 / 1e9, "bf16_gflops": flops / seconds16 / 1e9}


def forward_rates(engine, full_role: str, batch: int) -> dict:
    """GFLOP/s of one forward of ``full_role`` and of the explore copy at ``batch`` samples (counted FLOPs)."""
    adapter = engine.adapter
    per_forward = adapter.flops_per_forward()
    if per_forward is None:
        return {}
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *adapter.latent_shape, generator=generator).to(engine.device)
    t = torch.full((batch,), 0.5, device=engine.device)
    with torch.no_grad():
        cond = engine.encode([""] * batch)
        out = {"batch": batch, "full_role": full_role}
        for name, role in (("full", full_role), ("explore", "explore")):
            module = engine.net(role)
            seconds = _median_seconds(lambda: engine._velocity(module, x, t, cond, None))
            out[f"{name}_gflops"] = per_forward * adapter.forwards_per_velocity(None) * batch / seconds / 1e9
            out[f"{name}_seconds"] = seconds
    return out


def measure_cpu_rates(engine, full_role: str, batch: int) -> dict:
    """The run's ``cpu_rates.json``: GEMM and forward rates of this CPU at the run's shapes (module docstring)."""
    from solbench.machine.cpu import cpu_info

    explore = engine.net("explore")
    shapes = _quantized_shapes(explore)
    if not shapes:  # a copy that quantizes nothing (recipe none, Sol-RL's twin): no low-precision rate to measure
        return {"cpu": cpu_info(), "threads": torch.get_num_threads(), "gemm": {}, "forward": {}}
    return {"cpu": cpu_info(), "threads": torch.get_num_threads(),
            "gemm": gemm_rates(shapes), "forward": forward_rates(engine, full_role, batch)}


_CACHE: dict = {}


def cached_cpu_rates(key, engine, full_role: str, batch: int) -> dict:
    """``measure_cpu_rates`` once per process for the same ``key`` (model, recipe, backend, batch) and thread count:
    a worker running several runs of a spec measures its CPU once (each run folder still gets the record)."""
    key = (*key, torch.get_num_threads())
    if key not in _CACHE:
        _CACHE[key] = measure_cpu_rates(engine, full_role, batch)
    return _CACHE[key]
