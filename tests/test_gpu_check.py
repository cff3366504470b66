"""scripts/gpu_check.py's GEMM table (issue 46) wired on CPU: torch's CPU ``_scaled_mm`` takes the same tensorwise and
rowwise scales, so every variant runs here at a toy shape; the speeds are the GPU's to measure (no timing asserted)."""

from __future__ import annotations

import time

import torch

from _scripts import script_module


def _wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return max(time.perf_counter() - start, 1e-9)


def test_gemm_table_has_every_variant_at_every_shape():
    """Catches a variant left out of the table (tensorwise / rowwise, with and without fast accumulation), a
    row without its bf16 reference, or the speed-up computed the wrong way round (bf16 time over FP8 time)."""
    check = script_module("gpu_check")
    assert check.GEMM_SHAPES == ((16384, 3072, 3072), (16384, 3072, 12288), (16384, 12288, 3072), (16384, 3072, 9216))
    table = check.gemm_table("cpu", shapes=((32, 64, 48), (16, 32, 96)), timer=_wall)
    assert [(r["rows"], r["in"], r["out"]) for r in table["shapes"]] == [(32, 64, 48), (16, 32, 96)]
    for row in table["shapes"]:
        assert not [k for k in row if k.endswith("_error")], row
        assert row["bf16_tflops"] > 0
        for variant in check.GEMM_VARIANTS:
            assert row[f"{variant}_tflops"] > 0
            assert row[f"{variant}_speedup_vs_bf16"] == round(row[f"{variant}_tflops"] / row["bf16_tflops"], 3)
    assert check.gemm_table("cpu") == {"skipped": "no CUDA device"}  # without a timer: GPU only


def test_a_variant_that_raises_is_its_cell_and_the_others_are_measured(monkeypatch):
    """One GEMM variant this torch or GPU lacks (rowwise scaling before sm_89, say) must not lose the table."""
    check = script_module("gpu_check")
    real = torch._scaled_mm

    def scaled_mm(a, b, sa, sb, **kw):
        if sa.dim() == 2:
            raise RuntimeError("Rowwise scaling is not currently supported on your device")
        return real(a, b, sa, sb, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    (row,) = check.gemm_table("cpu", shapes=((32, 64, 48),), timer=_wall)["shapes"]
    assert row["fp8_rowwise_error"] == "RuntimeError: Rowwise scaling is not currently supported on your device"
    assert "fp8_rowwise_fast_error" in row and "fp8_rowwise_tflops" not in row
    assert row["fp8_tensorwise_fast_tflops"] > 0 and row["fp8_tensorwise_speedup_vs_bf16"] > 0


def test_the_native_checks_skip_without_a_gpu_and_say_so():
    check = script_module("gpu_check")
    for kind in ("fp8", "fp8_rowwise", "nvfp4"):
        assert "skipped" in check.native_backend(kind)
