"""The compiled (fused) quantizer kernels give the eager path's bits, and fall back cleanly.

Each check compares `quantize` / `dequantize` / `fake_quantize` with the fused kernels forced on
(every size) against the eager path (kernels off), bit for bit, on inputs built to hit the
rounding's edge cases. The eager path is the one the oracle tests pin to TE's arithmetic.
"""

import warnings

import pytest
import torch

from solbench.quant import fake_quantize, fused, quantize

pytestmark = pytest.mark.skipif(not fused.enabled(), reason="SOLBENCH_QUANT_COMPILE=0")


def _edge_input(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 3, cols).pow(torch.rand(cols, generator=g))
    flat = x.view(-1)
    flat[:16] = 0.0  # an all-zero block (scale 0)
    flat[16:32] = -0.0  # negative zeros keep code 8
    flat[32:48] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * 6 / 6  # ties to even
    flat[48:64] = 1e-42  # subnormal inputs: coarse scales, saturation clamp needed
    flat[64] = 3e4  # one huge value per tensor: most blocks get small scales
    return x.to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point and a.element_size() in (2, 4):
        view = torch.int16 if a.element_size() == 2 else torch.int32
        return a.shape == b.shape and torch.equal(a.view(view), b.view(view))
    if a.dtype == torch.float8_e4m3fn:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def _run_both(monkeypatch, fn):
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    fused_result = fn()
    assert fused.enabled(), f"compilation failed: {fused._STATE['reason']}"
    monkeypatch.setattr(fused, "_STATE", {"disabled": True, "reason": "test"})
    eager_result = fn()
    return fused_result, eager_result


CASES = [
    ("nvfp4", None), ("nvfp4", (16, 16)), ("mxfp4", None), ("fp8", None), ("fp8", "channel"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,block", CASES)
def test_fused_kernels_match_eager_bit_for_bit(monkeypatch, fmt, block, dtype):
    """Catches: an inductor rewrite (fast-math flags, signed zeros, fused multiply-add, a
    reordered product) changing a code, a scale or a decoded value."""
    x = _edge_input(40, 200, dtype)  # 200 is not a multiple of 16/32: padded blocks too

    def run():
        q = quantize(x, fmt, block)
        return q.codes, q.scales, q.global_amax, q.dequantize(), q.dequantize(torch.float32), fake_quantize(x, fmt, block)

    got, want = _run_both(monkeypatch, run)
    for name, a, b in zip(("codes", "scales", "global_amax", "dequantize", "dequantize fp32", "fake_quantize"), got, want):
        assert _same_bits(a, b), f"{fmt} {block} {dtype}: {name} differs between fused and eager"


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "fp8"])
def test_fused_kernels_keep_nan_blocks_under_propagate(monkeypatch, fmt):
    """Catches: the fused path losing the NaN marking of blocks that held NaN/inf."""
    x = _edge_input(8, 64, torch.float32, seed=1)
    x[2, 5] = float("nan")
    x[5, 40] = float("inf")

    def run():
        q = quantize(x, fmt, nonfinite="propagate")
        return q.codes, q.scales, q.dequantize(), fake_quantize(x, fmt, nonfinite="propagate")

    got, want = _run_both(monkeypatch, run)
    for a, b in zip(got, want):
        assert _same_bits(a, b)


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    """Catches: a machine without a working C++ compiler (or an inductor error) breaking
    quantization instead of running the eager path."""
    x = _edge_input(16, 64, torch.float32)
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fused, "_STATE", {"disabled": False, "reason": None})
    monkeypatch.setattr(fused, "_COMPILED", {})

    def broken_compile(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fake_quantize(x, "nvfp4")
        again = fake_quantize(x, "nvfp4")
    assert not fused.enabled()
    assert sum("eager path" in str(w.message) for w in caught) == 1
    monkeypatch.setattr(fused, "_STATE", {"disabled": True, "reason": "test"})
    assert _same_bits(out, fake_quantize(x, "nvfp4")) and _same_bits(again, out)


def test_views_of_many_layouts_do_not_exhaust_the_recompile_limit(monkeypatch):
    """Catches: dynamo guarding on a view's base tensor, so that each new weight or activation
    shape recompiled the kernel until torch's recompile limit (8) failed the call and switched the
    whole process to the slow eager path (seen in CI after a few dozen quantized layers)."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fused, "_STATE", {"disabled": False, "reason": None})
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (1, 3, 16):
            for cols in (16, 32, 48, 64):
                base = torch.randn(rows, cols + 16, generator=g)
                # a slice, a fresh tensor, a transposed view: the layouts layers hand the quantizer
                for x in (base[:, :cols], base[:, :cols].contiguous(), torch.randn(cols, rows, generator=g).t()):
                    for fmt in ("nvfp4", "mxfp4"):
                        fake_quantize(x, fmt)
    assert fused.enabled(), fused._STATE["reason"]
    assert not [w for w in caught if "eager path" in str(w.message)]


def test_small_eager_calls_restore_the_thread_count():
    """Catches: the one-thread guard for small tensors leaking a thread count of 1 into the
    rest of the process (every later GEMM single-threaded), including when the call raises."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fake_quantize(torch.randn(4, 32), "nvfp4")
        assert torch.get_num_threads() == 2
        with pytest.raises(Exception):
            fake_quantize(torch.tensor([[float("nan")] * 16]), "nvfp4")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_autograd_inputs_keep_the_eager_path(monkeypatch):
    """Catches: the fused path silently detaching (or compiling a backward for) an input that
    autograd records; such calls keep the eager behaviour."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    x = torch.randn(4, 32, requires_grad=True)
    assert fused.kernel("fake_e2m1", x) is None
    with torch.no_grad():
        assert fused.kernel("fake_e2m1", x) is not None or not fused.enabled()


def test_concurrent_small_calls_restore_the_thread_count():
    """Catches: two Python threads quantizing at once leaving the process on one intra-op thread
    (the second guard saving the 1 the first one set, and restoring it last)."""
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(64, 64)
        errors = []

        def work():
            try:
                for _ in range(50):
                    fake_quantize(x, "nvfp4")
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_pass_activation_kernel_matches_eager_over_scales(monkeypatch, dtype):
    """Catches: the one-pass NVFP4 activation kernel computing the global scales differently from
    formats._nvfp4_global_scales (torch's `c / g` is reciprocal(g) * c, a second rounding that moved
    every decoded value by an ulp), or mishandling an all-zero tensor or a global amax so small that
    6 * 448 / g overflows to FLT_MAX."""
    g = torch.Generator().manual_seed(3)
    inputs = []
    for seed, magnitude in enumerate((1e-40, 1e-20, 1e-3, 1.0, 7.0, 1e3, 1e20)):
        x = torch.randn(24, 48, generator=g) * magnitude
        x[seed % 24, :16] = 0.0
        inputs.append(x)
    inputs.append(torch.zeros(8, 32))
    inputs.append(torch.randn(5, 7, 64, generator=g) * torch.logspace(-6, 6, 64))  # 3-D, wide range
    calls = []
    real_kernel = fused.kernel
    monkeypatch.setattr(fused, "kernel", lambda name, x: calls.append(name) or real_kernel(name, x))
    for x in inputs:
        x = x.to(dtype)
        if not torch.isfinite(x).all():  # float16 overflows 1e20: not this test's subject
            continue
        calls.clear()
        got, want = _run_both(monkeypatch, lambda: fake_quantize(x, "nvfp4"))
        assert calls[0] == "fake_nvfp4_rows", calls
        assert _same_bits(got, want), f"{dtype} max |x| {float(x.abs().max()):.3g}: one-pass kernel differs from eager"
        monkeypatch.setattr(fused, "_STATE", {"disabled": False, "reason": None})


def test_activation_fake_quantize_is_one_compiled_call(monkeypatch):
    """Catches: the activation path (1x16 blocks) falling back to the three-kernel route, which
    costs a tiny-model forward its 15 activations x 3 compiled calls plus their eager glue."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    used = []
    real_kernel = fused.kernel

    def spy(name, x):
        fn = real_kernel(name, x)
        if fn is None:
            return None
        return lambda *a, **k: used.append(name) or fn(*a, **k)

    monkeypatch.setattr(fused, "kernel", spy)
    fake_quantize(torch.randn(64, 128), "nvfp4")
    assert used == ["fake_nvfp4_rows"]
    used.clear()
    fake_quantize(torch.randn(64, 128), "nvfp4", (16, 16))  # weights' 16x16 tiles keep the general route
    assert "fake_nvfp4_rows" not in used and used
