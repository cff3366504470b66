"""Property-based tests (hypothesis) of solbench.quant's quantizers.

- Rounding: every decoded element is a nearest point of its block's grid (so within half a grid
  step of the input, or saturated at the block's largest magnitude).
- Ranges: element codes, scale bytes and fp8 codes stay inside the format for finite inputs.
- Idempotence: quantizing a dequantized tensor gives it back.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from solbench.quant import fake_quantize, quantize

E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def arrays(min_value=-1e6, max_value=1e6, max_rows=4, max_cols=70):
    """float32 arrays [rows, cols] with hypothesis' full float mix (zeros, tiny, huge, -0.0)."""
    shapes = st.tuples(st.integers(1, max_rows), st.integers(1, max_cols))
    bounds = [float(np.float32(v)) for v in (min_value, max_value)]
    elements = st.floats(*bounds, allow_nan=False, allow_infinity=False, width=32)
    return shapes.flatmap(lambda shape: hnp.arrays(np.float32, shape, elements=elements))


def bounded_range_arrays():
    """Values m * 2**e with m in [0.5, 1] or 0 and |e| <= 6: every block's amax is within 2**-13
    of the tensor's, so all NVFP4 block scales are normal E4M3 numbers."""
    shapes = st.tuples(st.integers(1, 4), st.integers(1, 64))

    def build(shape):
        n = shape[0] * shape[1]
        mantissas = hnp.arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(0.5, 1.0)))
        exponents = hnp.arrays(np.int64, n, elements=st.integers(-6, 6))
        signs = hnp.arrays(np.bool_, n)
        return st.tuples(mantissas, exponents, signs).map(
            lambda t: (np.where(t[2], -1.0, 1.0) * np.ldexp(t[0], t[1])).astype(np.float32).reshape(shape)
        )

    return shapes.flatmap(build).map(lambda a: np.asarray(a, np.float32))


def block_decode_factors(q, x_shape):
    """Per-element decode factor d (grid = E2M1 values * d) from the stored scales, recomputed in
    numpy (nvfp4: s_b * S_dec with S_dec = 1 / min(2688 / g, FLT_MAX); mxfp4: 2**(byte - 127))."""
    rows, k = int(np.prod(x_shape[:-1])), x_shape[-1]
    if q.fmt == "nvfp4":
        g = np.float32(q.global_amax)
        with np.errstate(divide="ignore", over="ignore"):  # 2688 / a subnormal amax overflows: capped below
            s_enc = np.float32(1) if g == 0 else min(np.float32(2688) / g, np.finfo(np.float32).max)
        d = q.scales.float().numpy().reshape(rows, -1).astype(np.float64) * float(np.float32(1) / s_enc)
        block = 16
    else:
        d = np.ldexp(1.0, q.scales.numpy().reshape(rows, -1).astype(np.int64) - 127)
        block = 32
    return np.repeat(d, block, axis=1)[:, :k]


def assert_nearest_grid_point(x, x_hat, d):
    """Each x_hat is the point of its block's grid (E2M1 values x d) nearest to x.

    Except where TE's recipe caps the encode scale: e_b = min(1 / d, FLT_MAX) (nvfp4.md step 3).
    When d is so small that 1 / d overflows (tensor amax near FLT_MIN), elements are encoded as
    E2M1_RNE(x * FLT_MAX) instead, which the recipe defines and the property checks exactly.
    """
    f32_max = np.finfo(np.float32).max
    capped = 1.0 / np.maximum(d, 1e-300) > float(f32_max)
    x32 = x.astype(np.float32)
    x = x.astype(np.float64)
    x_hat = x_hat.astype(np.float64)
    grid = np.concatenate([-E2M1_GRID[::-1], E2M1_GRID])[None, None, :] * d[..., None]
    best = np.abs(x[..., None] - grid).min(axis=-1)
    with np.errstate(over="ignore"):
        capped_codes = np.clip(x32 * f32_max, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    best = np.where(capped, np.abs(x - capped_codes * d), best)
    err = np.abs(x - x_hat)
    # tolerance: a few fp32 ulps of the grid's largest value (the encode scale is a rounded 1/d)
    slack = 1e-6 * 6 * d + 1e-45
    assert (err <= best + slack).all(), f"not a nearest grid point: err {err[err > best + slack][:4]}, best {best[err > best + slack][:4]}"
    on_grid = np.abs(x_hat[..., None] - grid).min(axis=-1) <= 1e-6 * 6 * d + 1e-45
    assert on_grid.all()


def test_a_capped_encode_scale_follows_the_recipe_not_the_nearest_point():
    # amax = FLT_MIN: S_enc = FLT_MAX, block scale 0.6875, d = 0.6875 / FLT_MAX (subnormal) and
    # 1 / d overflows, so e_b = FLT_MAX and x * e_b = 4.0 -> code 4, not the nearest point 6 x d
    x = np.array([[np.finfo(np.float32).tiny]], dtype=np.float32)
    q = quantize(torch.from_numpy(x), "nvfp4", (1, 16))
    d = block_decode_factors(q, x.shape)
    assert float(q.dequantize()) == pytest.approx(4 * float(d[0, 0]), rel=1e-6)
    assert_nearest_grid_point(x, q.dequantize().numpy(), d)


@SETTINGS
@given(x=arrays(), block=st.sampled_from([(1, 16), (16, 16)]))
def test_nvfp4_rounds_to_a_nearest_point_of_the_block_grid(x, block):
    q = quantize(torch.from_numpy(x), "nvfp4", block)
    x_hat = q.dequantize().numpy()
    assert_nearest_grid_point(x, x_hat, block_decode_factors(q, x.shape))


@SETTINGS
@given(x=arrays(min_value=-1e30, max_value=1e30))
def test_mxfp4_rounds_to_a_nearest_point_of_the_block_grid(x):
    q = quantize(torch.from_numpy(x), "mxfp4")
    assert_nearest_grid_point(x, q.dequantize().numpy(), block_decode_factors(q, x.shape))


@SETTINGS
@given(x=arrays(), per_channel=st.booleans())
def test_fp8_within_half_an_e4m3_step(x, per_channel):
    q = quantize(torch.from_numpy(x), "fp8", "channel" if per_channel else None)
    decode = q.scales.numpy().astype(np.float64)
    decode = decode.reshape(-1, 1) if per_channel else decode
    scaled = x.astype(np.float64) / decode
    rounded = q.codes.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    # E4M3 spacing at |v|: 2**(floor(log2 |v|) - 3), subnormal spacing 2**-9
    magnitude = np.maximum(np.abs(rounded), 2.0**-6)
    half_step = 0.5 * np.exp2(np.floor(np.log2(magnitude)) - 3)
    assert (np.abs(scaled - rounded) <= half_step * (1 + 1e-6) + 1e-6).all()


@SETTINGS
@given(x=arrays(min_value=-3e38, max_value=3e38), fmt=st.sampled_from(["nvfp4", "mxfp4", "fp8"]))
def test_codes_and_scales_stay_in_range(x, fmt):
    q = quantize(torch.from_numpy(x), fmt)
    if fmt == "nvfp4":
        scale_bytes = q.scales.view(torch.uint8)
        assert (scale_bytes <= 0x7E).all()  # finite and <= 448; never the NaN pattern 0x7F
    elif fmt == "mxfp4":
        assert (q.scales <= 254).all()  # 0xFF is NaN
    else:
        assert not ((q.codes & 0x7F) == 0x7F).any()  # E4M3 NaN is S.1111.111
    out = q.dequantize()
    assert torch.isfinite(out).all()
    if fmt != "fp8":
        nibbles = torch.stack([q.codes & 15, q.codes >> 4])
        assert (nibbles <= 15).all()


@SETTINGS
@given(x=arrays(min_value=-1e30, max_value=1e30))
def test_mxfp4_is_idempotent(x):
    q = quantize(torch.from_numpy(x), "mxfp4")
    again = quantize(q.dequantize(), "mxfp4")
    assert torch.equal(again.scales, q.scales)
    assert torch.equal(again.dequantize(), q.dequantize())


@SETTINGS
@given(x=bounded_range_arrays(), block=st.sampled_from([(1, 16), (16, 16)]))
@example(x=np.array([[0.66796875], [0.5]], dtype=np.float32), block=(1, 16))  # the global scale moves by 1 ulp
def test_nvfp4_is_idempotent(x, block):
    q = quantize(torch.from_numpy(x), "nvfp4", block)
    again = quantize(q.dequantize(), "nvfp4", block)
    assert torch.equal(again.scales.view(torch.uint8), q.scales.view(torch.uint8))
    # codes compared by value: a zero may come back as +0 or -0
    first = torch.stack([q.codes & 15, q.codes >> 4]).clone()
    second = torch.stack([again.codes & 15, again.codes >> 4]).clone()
    first[first == 8] = 0
    second[second == 8] = 0
    assert torch.equal(first, second)
    x_hat, x_hat2 = q.dequantize().numpy(), again.dequantize().numpy()
    # Codes and block scales come back exactly (above). The values may move by a few ulps: the tensor's amax
    # is itself a decoded value (within 1 ulp of the input's), so the global scale S_dec can move by about one
    # part in 2^23, and each value is e2m1 x fp32(s_b x S_dec): a relative change of that size plus two
    # roundings. Bounded relative to the value, not in its own ulps: x = [[0.66796875], [0.5]] (hypothesis)
    # moves 0.47712055 by 3 of its ulps (its mantissa is small, so an ulp is a larger share of it).
    assert (np.abs(x_hat2 - x_hat) <= 4 * np.finfo(np.float32).eps * np.abs(x_hat)).all()


@SETTINGS
@given(x=arrays(), fmt=st.sampled_from(["nvfp4", "mxfp4", "fp8"]))
def test_fake_quantize_equals_dequantize(x, fmt):
    t = torch.from_numpy(x)
    assert torch.equal(fake_quantize(t, fmt), quantize(t, fmt).dequantize())
