"""The explore copy on torch's scaled matmul (backend "torch", solbench.quant.native) and how
``quant.backend`` is resolved (solbench.quant.backends).

What runs here, on CPU: the sync-free activation quantizers against solbench's quantizer (codes and
scale bytes bit for bit; the FP8 one through its compiled two-pass kernel), one quantizer pass for an
input that three layers read inside a compiled forward, the fast-accumulation option reaching the GEMM, the
E5M2 recipes' reason instead of a KeyError, the swizzled scale layout against torchao's, the FP8 layer end to end
(torch has a CPU ``_scaled_mm``) against the emulated layer, the NVFP4 layer's operands decoded
against the emulated numbers, and the backend choice. The GPU kernels themselves are checked by
scripts/gpu_check.py (FP8 on Hopper, NVFP4 on Blackwell).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solbench import quant
from solbench.errors import ConfigError
from solbench.quant import formats, fused
from solbench.quant.backends import choose_backend
from solbench.quant.native import (NativeLinear, _unswizzle, native_unavailable_reason, quantize_fp8_rows,
                                   quantize_nvfp4_rows, set_fast_accum)

GOLDEN = [0.1, -0.3, 0.9, 1.3, -2.2, 2.9, 3.6, 5.2, 7.0, -0.0, 0.0, 1e-9, -4.4, 0.74, 0.76, 2.6]


def _inputs(dtype):
    torch.manual_seed(0)
    yield torch.randn(48, 64, dtype=dtype)
    outlier = torch.randn(16, 32, dtype=dtype)
    outlier[3, 5] = 1e4  # one huge value: most blocks get tiny (subnormal E4M3) scales
    yield outlier
    yield torch.zeros(16, 32, dtype=dtype)  # all-zero tensor: unit global scale
    tiny = torch.randn(16, 32, dtype=dtype) * 1e-30 if dtype == torch.float32 else torch.randn(16, 32, dtype=dtype) * 1e-20
    yield tiny
    yield torch.tensor([GOLDEN, GOLDEN], dtype=dtype)  # two rows: no size-1 dimension (one compile for every shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_activation_quantizer_matches_solbench_quantize_bit_for_bit(dtype):
    """Catches a native input quantizer that rounds differently from the emulated path (e.g. x / amax * 448
    instead of TE's x * (448 / amax), or the compiled kernel's `448 / amax` becoming a reciprocal and a
    product): the two backends would then explore with different numbers. Runs through the compiled
    two-pass kernel (fused.native_kernel), the path the GPU takes, and checks that it did."""
    assert fused.enabled(), "SOLBENCH_QUANT_COMPILE=0: this test checks the compiled kernel"
    for x in _inputs(dtype):
        codes, decode = quantize_fp8_rows(x)
        ref = formats.quantize(x, "fp8")
        assert torch.equal(codes.view(torch.uint8), ref.codes.view(torch.uint8))
        assert torch.equal(decode, ref.scales)
    assert fused.enabled() and "native:fp8_tensor_rows" in fused._COMPILED, fused._STATE["reason"]


def test_layers_reading_one_tensor_share_one_quantizer_pass_in_a_compiled_forward():
    """q, k and v read the same activation: compiled together (as in a compiled block), the three FP8
    quantizations become one generated kernel that reads the input once, computes its amax and scale once
    and writes each layer's E4M3 codes, and the three GEMMs stay torch's scaled matmul; the results equal
    the eager layers'. Catches a quantizer the compiler cannot fuse (hidden behind a graph break or an
    opaque call: three kernels, three reads of the input) or one that changes the numbers when compiled."""
    import re

    from torch._inductor.utils import run_and_get_code

    recipe = quant.get_recipe("fp8_w8a8")
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(NativeLinear(64, 64, False, recipe, name=n, dtype=torch.float32) for n in "qkv")
    for layer in layers:
        layer.load_weight(torch.randn(64, 64))

    def qkv(x):
        return [layer(x) for layer in layers]

    x = torch.randn(32, 64)
    with torch.no_grad():
        got, (code, *_) = run_and_get_code(torch.compile(qkv, fullgraph=True), x)
        want = qkv(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    kernels = re.findall(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\((\[[^\]]*\])", code)
    quantizers = [(name, args) for name, args in kernels if "amax" in name]
    assert len(quantizers) == 1, kernels
    assert quantizers[0][1].count("Float8_e4m3fn*") == 3  # one pass writes the three layers' codes
    assert code.count("extern_kernels._scaled_mm(") == 3


def test_fast_accum_reaches_the_fp8_gemm(monkeypatch):
    """quant.fast_accum: set_fast_accum turns on use_fast_accum in every FP8 layer's scaled GEMM (and only
    there). Catches the option being accepted but never passed to torch._scaled_mm."""
    seen = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: seen.append(k.get("use_fast_accum")) or real(*a, **k))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32))
    copy = quant.quantized_copy(model, quant.get_recipe("fp8_w8a8"), backend="torch")
    x = torch.randn(16, 64)
    with torch.no_grad():
        plain = copy(x)
        assert set_fast_accum(copy, True) == 2
        fast = copy(x)
    assert seen == [False, False, True, True]
    torch.testing.assert_close(fast, plain)  # torch's CPU kernel has one accumulation mode; gpu_check measures the GPU's


def test_fast_accum_with_a_backend_without_it_is_a_clear_error():
    """Catches quant.fast_accum silently doing nothing on a backend that has no such option."""
    from solbench.config import QuantConfig
    from solbench.train.setup import quant_explore_fns

    factory, _ = quant_explore_fns(QuantConfig(recipe="fp8_w8a8", backend="emulated", fast_accum=True))
    with pytest.raises(ConfigError, match="quant.fast_accum applies to backend torch"):
        factory(torch.nn.Sequential(torch.nn.Linear(32, 32)))


def test_e5m2_recipes_have_no_scaled_matmul_path_and_say_so():
    """The public code's recipes (fp8_e5m2) under backend torch/auto: a reason naming E5M2, not a KeyError
    from the capability table; auto then emulates (with the fallback) or fails naming every reason."""
    recipe = quant.get_recipe("te_delayed_e2m1_flux")
    assert recipe.format == "fp8_e5m2"
    for capability in ((9, 0), (10, 0)):
        reason = native_unavailable_reason(recipe, capability=capability)
        assert "E5M2" in reason
        with pytest.raises(quant.BackendUnavailableError, match="torch: torch's scaled matmul has no FP8 E5M2"):
            choose_backend(recipe, "auto", capability=capability)
        assert choose_backend(recipe, "auto", capability=capability, allow_emulated_fallback=True).backend == "emulated"
    assert "E5M2" in native_unavailable_reason(recipe, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_activation_quantizer_matches_solbench_quantize_bit_for_bit(dtype):
    """The sync-free NVFP4 (1x16) quantizer gives formats.quantize's codes, E4M3 scale bytes and S_dec,
    including zero blocks, subnormal block scales and the golden row of shared/reference/nvfp4.md."""
    for x in _inputs(dtype):
        codes, scales, decode = quantize_nvfp4_rows(x)
        ref = formats.quantize(x, "nvfp4", (1, 16))
        assert torch.equal(scales.view(torch.uint8), ref.scales.view(torch.uint8))
        assert torch.equal(codes, ref.codes)
        assert float(decode) == formats._nvfp4_global_scales(float(ref.global_amax))[1]
        torch.testing.assert_close(_decode(codes, scales, decode), ref.dequantize(torch.float32), rtol=0, atol=0)


def _decode(codes, scales, decode):
    table = formats.E2M1_VALUES
    values = torch.stack([table[(codes & 15).long()], table[(codes >> 4).long()]], dim=-1).view(codes.shape[0], -1)
    factor = formats._e4m3_to_float(scales.reshape(-1)).view(scales.shape) * decode
    return (values.view(codes.shape[0], -1, 16) * factor[..., None]).view(codes.shape[0], -1)


def test_swizzled_scale_layout_matches_torchao_and_unswizzles():
    """The 128x4 scale layout torch's FP4 GEMM reads: solbench's swizzle equals torchao's to_blocked
    (an independent implementation of cuBLAS's layout), for shapes that need padding, and inverts."""
    from torchao.prototype.mx_formats.utils import to_blocked

    torch.manual_seed(0)
    for rows, cols in ((128, 4), (130, 7), (16, 192), (300, 24)):
        scales = (torch.rand(rows, cols) * 400).to(torch.float8_e4m3fn)
        ours = formats.swizzle_scales_128x4(scales)
        assert torch.equal(ours.view(torch.uint8), to_blocked(scales.view(torch.uint8)))
        assert torch.equal(_unswizzle(ours, rows, cols).view(torch.uint8), scales.view(torch.uint8))


def _linear(n_in=64, n_out=48, dtype=torch.float32):
    torch.manual_seed(1)
    return torch.nn.Linear(n_in, n_out).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_fp8_layer_computes_the_emulated_layers_numbers(dtype):
    """The FP8 layer on torch's scaled matmul (CPU kernel here) multiplies exactly the emulated layer's
    operands: its decoded weight equals QuantLinear's weight, and its output equals F.linear of the
    fake-quantized input with that weight up to the GEMM's accumulation order and output rounding."""
    linear = _linear(dtype=dtype)
    recipe = quant.get_recipe("fp8_w8a8")
    native = NativeLinear(64, 48, True, recipe, name="l", dtype=dtype)
    native.load_weight(linear.weight, linear.bias)
    emulated = quant.QuantLinear.from_linear(linear, recipe, name="l")
    assert native.codes.dtype == torch.float8_e4m3fn and native.codes.shape == (48, 64)
    torch.testing.assert_close(native.dequantized_weight(dtype), emulated.weight, rtol=0, atol=0)
    x = torch.randn(5, 7, 64, dtype=dtype)  # 35 rows: padded to 48 inside, dropped after
    with torch.no_grad():
        out = native(x)
        ref = F.linear(formats.fake_quantize(x.float(), "fp8"), native.dequantized_weight(), linear.bias.float())
    assert out.shape == (5, 7, 48) and out.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)  # one bf16 rounding
    torch.testing.assert_close(out.float(), ref, **tol)


def test_native_nvfp4_layer_operands_are_the_emulated_numbers():
    """NVFP4: the layer keeps packed E2M1 codes, swizzled E4M3 scales of 16x16 tiles and S_dec, which
    decode to the emulated layer's weight bit for bit; the GEMM itself needs sm_100 (scripts/gpu_check.py)."""
    linear = _linear(64, 256)
    recipe = quant.get_recipe("nvfp4_w4a4")
    native = NativeLinear(64, 256, True, recipe, name="l", dtype=torch.float32)
    native.load_weight(linear.weight, linear.bias)
    emulated = quant.QuantLinear.from_linear(linear, recipe, name="l")
    assert native.codes.dtype == torch.uint8 and native.codes.shape == (256, 32)
    assert native.scales.dtype == torch.float8_e4m3fn and native.scales.numel() == 256 * 4
    assert torch.equal(native.dequantized_weight(), emulated.weight)
    reason = native_unavailable_reason(recipe, "cpu")
    assert "CUDA GPU (sm_100+)" in reason


def test_quantized_copy_on_torch_backend_holds_one_fp8_copy_and_syncs():
    """A bf16 model's FP8 copy on backend torch holds its quantized weights as 1-byte codes (no bf16
    shadow), computes like the emulated copy, and sync_weights refreshes it to a fresh copy's state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).to(torch.bfloat16)
    recipe = quant.get_recipe("fp8_w8a8")
    copy = quant.quantized_copy(model, recipe, backend="torch")
    layers = [m for m in copy.modules() if isinstance(m, NativeLinear)]
    assert len(layers) == 2 and not list(copy.parameters())  # everything quantized: no bf16 weights left
    held = sum(b.numel() * b.element_size() for b in copy.buffers())
    assert held == 64 * 128 + 128 * 32 + 2 * (4 + 4) + (128 + 32) * 2  # codes, two fp32 scales each, bf16 biases
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    emulated = quant.quantized_copy(model, recipe, backend="emulated")
    with torch.no_grad():
        torch.testing.assert_close(copy(x).float(), emulated(x).float(), rtol=2e-2, atol=2e-2)
        model[0].weight.mul_(-0.5)
        quant.sync_weights(copy, model)
        fresh = quant.quantized_copy(model, recipe, backend="torch")
        assert torch.equal(copy(x), fresh(x))


# --- choosing the backend ---------------------------------------------------------------------------


def _no_te(monkeypatch):
    real = quant.layers.te_unavailable_reason
    monkeypatch.setattr(quant.layers, "te_unavailable_reason",
                        lambda recipe: real(recipe) or "transformer_engine is not installed (simulated by the test)")


def _no_bf16_units(monkeypatch):
    from solbench.machine import cpu

    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: False)


def test_auto_takes_te_then_scaled_matmul_then_emulation_and_says_why(monkeypatch):
    """backend auto without TransformerEngine: FP8 on a Hopper GPU (sm_90) goes to torch's scaled matmul,
    NVFP4 there has no native path and fails naming both reasons, or emulates with the fallback allowed;
    NVFP4 on Blackwell (sm_100) takes the scaled matmul too. Catches auto falling straight to emulation
    (an H100/H200 without TE then explored slower than BF16)."""
    _no_te(monkeypatch)
    _no_bf16_units(monkeypatch)  # a CPU with them takes cpu_bf16 (tests/test_quant_cpu_bf16.py)
    fp8 = quant.get_recipe("fp8_w8a8")
    nvfp4 = quant.get_recipe("nvfp4_flux")
    hopper = choose_backend(fp8, "auto", capability=(9, 0))
    assert hopper.backend == "torch" and set(hopper.passed_over) == {"te"}
    assert hopper.record() == {"recipe": "fp8_w8a8", "backend_requested": "auto", "backend": "torch",
                               "passed_over": {"te": hopper.passed_over["te"]}}
    hopper_nvfp4 = r"te: .*; torch: the GPU is sm_90; nvfp4 tensor cores need sm_100"
    with pytest.raises(quant.BackendUnavailableError, match=hopper_nvfp4):
        choose_backend(nvfp4, "auto", capability=(9, 0))
    fallback = choose_backend(nvfp4, "auto", capability=(9, 0), allow_emulated_fallback=True)
    assert fallback.backend == "emulated" and set(fallback.passed_over) == {"te", "torch", "cpu_bf16"}
    assert choose_backend(nvfp4, "auto", capability=(10, 0)).backend == "torch"
    # on a CPU, auto never picks the scaled matmul (a reference kernel, not a speed-up); explicit torch may
    cpu = choose_backend(fp8, "auto", device="cpu", allow_emulated_fallback=True)
    assert cpu.backend == "emulated" and "CUDA GPUs only" in cpu.passed_over["torch"]
    assert choose_backend(fp8, "torch", device="cpu").backend == "torch"
    assert "weight-only" in choose_backend(quant.get_recipe("nvfp4_w4a16"), "torch", device="cpu",
                                           allow_emulated_fallback=True).passed_over["torch"]


def test_the_trainer_records_the_backend_it_took(tmp_path, monkeypatch):
    """The run folder says which backend explored (explore.json), so results never hide an emulated run."""
    import json

    from solbench.config import RunConfig
    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    _no_te(monkeypatch)
    _no_bf16_units(monkeypatch)
    cfg = RunConfig(method="naive_fp4", method_config={"n": 4, "k": 2}, prompts_per_iter=1, iterations=1,
                    device="cpu")
    cfg.model.path = "random"
    cfg.quant.backend, cfg.quant.allow_emulated_fallback = "auto", True
    store = RunStore(tmp_path / cfg.run_id, cfg.run_id)
    Trainer(cfg, store)
    record = json.loads((tmp_path / cfg.run_id / "explore.json").read_text())
    assert record["backend_requested"] == "auto" and record["backend"] == "emulated"
    assert set(record["passed_over"]) == {"te", "torch", "cpu_bf16"} and record["recipe"] == "nvfp4_tiny_flux"  # the default recipe
