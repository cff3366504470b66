"""FP8 with rowwise scales (issue 46) on torch's scaled matmul and emulated, and the scaled-matmul copy's layers
sharing one quantized input.

``fp8_rowwise_flux``: a scale per token for activations, per output channel for weights (torchao's float8 rowwise).
On CPU torch's ``_scaled_mm`` takes rowwise scales too, so the native layer runs here end to end; the GPU's kernel is
checked by scripts/gpu_check.py (``native_fp8_rowwise``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solbench import quant
from solbench.quant import formats
from solbench.quant.native import NativeLinear, native_unavailable_reason, quantize_fp8_rows, quantize_fp8_rowwise

from test_quant_native import _inputs

ROWWISE = quant.get_recipe("fp8_rowwise_flux").replace(skip=(), min_dim=0)


def test_the_rowwise_recipe_is_registered_and_checked():
    """fp8_rowwise_flux keeps nvfp4_flux's layers with per-channel weights and per-row activations; rowwise on a
    format without it, and a native recipe mixing per-tensor and per-row operands, are refused with a reason
    (torch's scaled matmul scales both operands one way)."""
    recipe, flux = quant.get_recipe("fp8_rowwise_flux"), quant.get_recipe("nvfp4_flux")
    assert (recipe.format, recipe.weight_block, recipe.activation_block) == ("fp8", "channel", "channel")
    assert (recipe.skip, recipe.min_dim) == (flux.skip, flux.min_dim)
    assert recipe.label == "fp8 W8A8 (weights channel, activations per row)"
    assert quant.get_recipe("fp8_w8a8").activation_block is None  # per-tensor as before
    with pytest.raises(ValueError, match="rowwise .* fp8 only"):
        flux.replace(rowwise=True)
    assert native_unavailable_reason(ROWWISE, "cpu") is None
    mixed = quant.get_recipe("fp8_w8a8").replace(weight_block="channel")
    assert "per-tensor activations need per-tensor weights" in native_unavailable_reason(mixed, "cpu")
    assert "per-tensor activations" in native_unavailable_reason(mixed, capability=(9, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rowwise_input_quantizer_matches_solbench_quantize_bit_for_bit(dtype):
    """Catches a native per-row quantizer that rounds differently from formats.quantize(x, "fp8", "channel") (the
    emulated twin's): codes and each row's decode scale must be the same bits, zero rows and outliers included."""
    for x in _inputs(dtype):
        codes, decode = quantize_fp8_rowwise(x)
        ref = formats.quantize(x, "fp8", "channel")
        assert decode.shape == (x.shape[0], 1)
        assert torch.equal(codes.view(torch.uint8), ref.codes.view(torch.uint8))
        assert torch.equal(decode, ref.scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rowwise_layer_multiplies_the_emulated_twins_operands(dtype, monkeypatch):
    """The native rowwise layer against the emulated layer of the same recipe: its weight codes and per-channel
    scales decode to the emulated weight bit for bit, its input operands (codes and per-row scales, padding rows
    dropped) decode to the emulated layer's quantized input bit for bit, its GEMM gets scale_a [M, 1] and
    scale_b [1, N] (bf16: the scales in the epilogue; fp32: unit scales, then the two vectors), and its output is
    F.linear of those operands up to accumulation order and one rounding."""
    torch.manual_seed(2)
    linear = torch.nn.Linear(64, 48).to(dtype)
    native = NativeLinear(64, 48, True, ROWWISE, name="l", dtype=dtype)
    native.load_weight(linear.weight, linear.bias)
    emulated = quant.QuantLinear.from_linear(linear, ROWWISE, name="l")
    ref_w = formats.quantize(linear.weight.detach(), "fp8", "channel")
    assert torch.equal(native.codes.view(torch.uint8), ref_w.codes.view(torch.uint8))
    assert torch.equal(native.scales, ref_w.scales) and native.scales.shape == (48, 1)
    assert torch.equal(native.dequantized_weight(dtype), emulated.weight)
    x = torch.randn(5, 7, 64, dtype=dtype) * torch.logspace(-2, 2, 7, dtype=dtype)[:, None]  # rows of unlike size
    codes, decode = native.input_operands(x)
    assert codes.shape == (48, 64) and decode.shape == (48, 1)  # 35 rows padded to 48
    decoded = (codes[:35].float() * decode[:35]).to(dtype).view(5, 7, 64)
    assert torch.equal(decoded, emulated.quantize_input(x))
    seen = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, b, sa, sb, **k: seen.append((sa.shape, sb.shape)) or real(a, b, sa, sb, **k))
    with torch.no_grad():
        out = native(x)
        ref = F.linear(emulated.quantize_input(x).float(), emulated.weight.float(), linear.bias.float())
    assert seen == ([((48, 1), (1, 48))] if dtype == torch.bfloat16 else [((), ())])
    assert out.shape == (5, 7, 48) and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-3)
    else:  # one bf16 rounding of outputs up to ~4000 (rows of unlike size): relative error, as gpu_check measures it
        assert float((out.float() - ref).norm() / ref.norm()) < 3e-3


class _Attention(torch.nn.Module):
    """q, k and v read one tensor (as diffusers' attention does), then an output projection."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(width, width) for _ in range(3))
        self.to_out = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.to_out(self.to_q(x) * self.to_k(x) + self.to_v(x))


@pytest.mark.parametrize("recipe", ["fp8_w8a8", "rowwise"])
def test_scaled_matmul_layers_reading_one_tensor_quantize_it_once(recipe, monkeypatch):
    """Eager forwards of the scaled-matmul copy: q/k/v quantize their shared input once (one quantizer call
    for the three, one for the output projection), with the same output as layers that each quantize it.
    Catches the native backend quantizing one activation three times (three amax passes on a GPU), and a
    cache that hands a layer another tensor's codes (the output projection's input is a different tensor)."""
    from solbench.quant import native

    recipe = quant.get_recipe(recipe) if recipe != "rowwise" else ROWWISE
    torch.manual_seed(0)
    model = _Attention().to(torch.bfloat16)
    separate = quant.quantized_copy(model, recipe, backend="torch", share_input_quantization=False)
    shared = quant.quantized_copy(model, recipe, backend="torch")
    layers = [m for m in shared.modules() if isinstance(m, native.NativeLinear)]
    assert len(layers) == 4 and len({id(m.shared_inputs) for m in layers}) == 1 and layers[0].shared_inputs is not None
    name = "quantize_fp8_rowwise" if recipe.rowwise else "quantize_fp8_rows"
    calls = []
    original = getattr(native, name)
    monkeypatch.setattr(native, name, lambda x2d: calls.append(x2d.shape) or original(x2d))
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = separate(x)
        assert len(calls) == 4
        got = shared(x)
    assert len(calls) == 4 + 2
    assert torch.equal(got, want)


def test_measured_explore_copy_threads_fast_accumulation_and_sharing(monkeypatch):
    """solbench doctor --measure and scripts/rollout_speed.py build the explore copy through
    measure.iteration._explore_fns: on backend torch its FP8 layers get fast accumulation when asked (the run's
    quant.fast_accum by default, or the speed script's arm) and share their inputs; where the copy is not on
    backend torch the request is dropped with a note. Catches the explore arm being measured without the fast
    accumulation the trainer would run it with (issue 46: only trainer_setup set it)."""
    from solbench.config import QuantConfig, RunConfig
    from solbench.measure import iteration
    from solbench.quant import backends

    cfg = RunConfig(quant=QuantConfig(recipe="fp8_w8a8", backend="te"))
    model = _Attention().to(torch.bfloat16)
    notes: list[str] = []
    factory, _, chosen, backend = iteration._explore_fns(cfg, torch.device("cpu"), notes, fast_accum=True)
    assert backend != "torch" and not factory.fast_accum and "fast accumulation not applied" in notes[-1]

    real = backends.choose_backend
    monkeypatch.setattr(backends, "choose_backend", lambda recipe, requested, **kw: real(recipe, "torch", **kw))
    for fast in (True, False):
        factory, _, chosen, backend = iteration._explore_fns(cfg, torch.device("cpu"), [], fast_accum=fast,
                                                             recipe="fp8_rowwise_flux")
        copy = factory(model)
        layers = [m for m in copy.modules() if isinstance(m, NativeLinear)]
        assert backend == "torch" and chosen.rowwise and chosen.name == "fp8_rowwise_flux"
        assert not layers  # fp8_rowwise_flux keeps FLUX's layers: min_dim 1000 leaves these 64-wide ones in BF16
        factory, _, chosen, _ = iteration._explore_fns(cfg, torch.device("cpu"), [], fast_accum=fast)
        layers = [m for m in factory(model).modules() if isinstance(m, NativeLinear)]
        assert len(layers) == 4 and {m.fast_accum for m in layers} == {fast}
        assert len({id(m.shared_inputs) for m in layers}) == 1 and layers[0].shared_inputs is not None
    cfg = RunConfig(quant=QuantConfig(recipe="fp8_w8a8", backend="te", fast_accum=True))
    assert iteration._explore_fns(cfg, torch.device("cpu"), [])[0].fast_accum  # the run's own setting by default


def test_quantize_fp8_rows_is_still_per_tensor():
    """The per-tensor quantizer is untouched by the rowwise one (one 0-dim scale)."""
    codes, decode = quantize_fp8_rows(torch.randn(16, 32))
    assert decode.shape == () and codes.dtype == torch.float8_e4m3fn


def test_shared_scaled_matmul_layers_compile_to_the_eager_bits():
    """Inside a compiled forward the shared-input cache is bypassed (dynamo cannot trace its identity check;
    inductor fuses the siblings' quantizers itself): q/k/v of a sharing copy compile without a graph break
    (fullgraph) and give the eager layers' bits, per-tensor and rowwise. Catches the cache breaking compiled
    sampling of the explore copy."""
    for recipe in (quant.get_recipe("fp8_w8a8"), ROWWISE):
        copy = quant.quantized_copy(_Attention().to(torch.bfloat16), recipe, backend="torch")  # shares inputs

        def qkv(x):
            return [copy.to_q(x), copy.to_k(x), copy.to_v(x)]

        x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            want, got = qkv(x), torch.compile(qkv, fullgraph=True)(x)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), recipe.name
