"""Bit-exactness of solbench.quant's NVFP4 / MXFP4 / FP8 quantizers against independent oracles.

Oracles: ml_dtypes casts (E2M1 codes, E4M3 and E8M0 scale bytes) inside references written here
with numpy, following TransformerEngine's recipe step by step (reference/nvfp4.md), and torchao
0.18's NVFP4 / MX reference functions where their arithmetic agrees with TE's. Nothing in this
file calls solbench's helpers to compute an expected value.
"""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ml_dtypes
import numpy as np
import pytest
import torch
from torchao.prototype.mx_formats.mx_tensor import to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
from torchao.prototype.mx_formats.utils import to_blocked

from solbench.quant import NonFiniteError, QuantizedTensor, fake_quantize, quantize

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max

# --------------------------------------------------------------------------------------------
# Independent references (numpy + ml_dtypes)
# --------------------------------------------------------------------------------------------


def e2m1_codes(y: np.ndarray) -> np.ndarray:
    """ml_dtypes' E2M1 cast (RNE, saturating), one code per byte: bit 3 = sign."""
    return np.asarray(y, F32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)


def _as_2d_padded(x: np.ndarray, block: int) -> np.ndarray:
    x2 = np.asarray(x, F32).reshape(-1, x.shape[-1])
    pad = (-x2.shape[1]) % block
    return np.pad(x2, ((0, 0), (0, pad))) if pad else x2


def te_nvfp4_reference(x: np.ndarray, tile_rows: int = 1):
    """TransformerEngine's NVFP4 recipe in numpy fp32: (codes [R, Kp], scale bytes [R, Kp/16],
    global amax, decoded values [R, Kp] by (e2m1 * s_b) * S_dec)."""
    x2 = _as_2d_padded(x, 16)
    rows, k = x2.shape
    blocks = x2.reshape(rows, k // 16, 16)
    amax = np.abs(blocks).max(axis=-1) if blocks.size else np.zeros((rows, k // 16), F32)
    if tile_rows == 16:
        pad = (-rows) % 16
        tiles = np.pad(amax, ((0, pad), (0, 0))).reshape(-1, 16, k // 16).max(axis=1)
        amax = np.repeat(tiles, 16, axis=0)[:rows]
    g = F32(np.abs(x2).max()) if x2.size else F32(0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = F32(2688) / g if g != 0 else F32(1)
        s_enc = min(s_enc, FLT_MAX)
        if s_enc == 0:
            s_enc = F32(1)
        s_dec = F32(1) / s_enc
        multiplier = F32(s_enc * (F32(1) / F32(6)))
        scales = np.minimum(amax * multiplier, F32(448)).astype(ml_dtypes.float8_e4m3fn)
        encode = np.minimum(F32(1) / (scales.astype(F32) * s_dec), FLT_MAX)
        y = np.clip(blocks * encode[..., None], -6, 6).astype(F32)
    codes = e2m1_codes(y).reshape(rows, k)
    values = (e2m1_values(codes).reshape(rows, -1, 16) * scales.astype(F32)[..., None]) * s_dec
    return codes, scales.view(np.uint8), g, values.reshape(rows, k)


def mx_reference(x: np.ndarray):
    """OCP MX v1.0 MXFP4: (codes [R, Kp], E8M0 bytes [R, Kp/32], values [R, Kp])."""
    x2 = _as_2d_padded(x, 32)
    rows, k = x2.shape
    blocks = x2.reshape(rows, k // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    mantissa, exponent = np.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1)
    shared = np.where(amax == 0, -127, np.clip(exponent - 1 - 2, -127, 127)).astype(np.int64)
    scale = np.ldexp(np.ones_like(shared, dtype=np.float64), shared)
    scale_bytes = scale.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    y = (blocks.astype(np.float64) / scale[..., None]).astype(F32)  # exact, as x * 2**-e in fp32
    codes = e2m1_codes(np.clip(y, -6, 6)).reshape(rows, k)
    values = (e2m1_values(codes).reshape(rows, -1, 32).astype(np.float64) * scale[..., None]).astype(F32)
    return codes, scale_bytes, values.reshape(rows, k)


def fp8_reference(x: np.ndarray, per_channel: bool = False):
    """E4M3 with TE current scaling: (code bytes, decode scale(s), values)."""
    x2 = np.asarray(x, F32).reshape(-1, x.shape[-1])
    amax = np.abs(x2).max(axis=-1, keepdims=True) if per_channel else F32(np.abs(x2).max())
    with np.errstate(divide="ignore"):
        scale = np.where(amax == 0, F32(1), np.minimum(F32(448) / amax, FLT_MAX)).astype(F32)
    codes = np.clip(x2 * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)  # ml_dtypes doesn't saturate
    decode = (F32(1) / scale).astype(F32)
    return codes.view(np.uint8), decode, codes.astype(F32) * decode


def unpack(q: QuantizedTensor) -> np.ndarray:
    """Packed nibbles -> one code per element, [rows, K_padded] (element 2i = low nibble)."""
    packed = q.codes.reshape(-1, q.codes.shape[-1]).numpy()
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def assert_within_ulp(actual: np.ndarray, expected: np.ndarray, ulps: int = 2) -> None:
    actual, expected = np.asarray(actual, F32), np.asarray(expected, F32)
    both_nan = np.isnan(actual) & np.isnan(expected)
    with np.errstate(over="ignore"):  # the spacing at float32 max overflows to inf: fine
        ok = both_nan | (np.abs(actual - expected) <= ulps * np.spacing(np.abs(expected)))
    assert ok.all(), f"{(~ok).sum()} values differ by more than {ulps} ulp, e.g. {actual[~ok][:5]} vs {expected[~ok][:5]}"


def padded_dequantized(q: QuantizedTensor) -> np.ndarray:
    """Decoded values including the zero padding, as [rows, K_padded] float32."""
    out = q.dequantize(torch.float32).reshape(-1, q.shape[-1]).numpy()
    pad = q.padded_k - out.shape[1]
    return np.pad(out, ((0, 0), (0, pad))) if pad else out


def check_nvfp4_against_reference(x: torch.Tensor, block=(1, 16)):
    q = quantize(x, "nvfp4", block)
    codes, scales, g, values = te_nvfp4_reference(x.float().numpy(), tile_rows=block[0])
    np.testing.assert_array_equal(unpack(q), codes)
    np.testing.assert_array_equal(q.scales.view(torch.uint8).reshape(codes.shape[0], -1).numpy(), scales)
    assert float(q.global_amax) == float(g)
    assert_within_ulp(padded_dequantized(q), values)
    return q


def random_tensor(shape, dtype=torch.float32, seed=0, spread=2.0):
    """Gaussian values with block-to-block magnitude spread (log-normal row/column scales)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    x = x * torch.exp(spread * torch.randn(shape[-1], generator=gen))
    return x.to(dtype)


SHAPES = [(1, 16), (4, 64), (3, 20), (7, 33), (2, 5, 48), (33, 160), (1, 1), (20, 96)]

# --------------------------------------------------------------------------------------------
# NVFP4 vs the TE-recipe reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_nvfp4_matches_te_reference(shape, dtype):
    check_nvfp4_against_reference(random_tensor(shape, dtype, seed=sum(shape)))


@pytest.mark.parametrize("shape", [(16, 32), (20, 48), (5, 17), (2, 3, 40), (40, 160)])
def test_nvfp4_16x16_tiles_match_te_reference(shape):
    q = check_nvfp4_against_reference(random_tensor(shape, seed=len(shape)), block=(16, 16))
    # each tile's scale is repeated over its 16 rows
    scales = q.scales.view(torch.uint8).reshape(-1, q.scales.shape[-1])
    for start in range(0, scales.shape[0], 16):
        tile = scales[start : start + 16]
        assert (tile == tile[0]).all()


def test_nvfp4_golden_row():
    x = torch.tensor([0.1, -0.3, 0.9, 1.3, -2.2, 2.9, 3.6, 5.2, 7.0, -0.0, 0.0, 1e-9, -4.4, 0.74, 0.76, 2.6])
    q = quantize(x, "nvfp4")
    assert float(q.global_amax) == 7.0  # so S_enc = 2688 / 7 = 384 exactly
    assert q.scales.view(torch.uint8).tolist() == [0x7E]  # 448
    assert unpack(q).reshape(-1).tolist() == [0, 9, 2, 2, 12, 4, 5, 6, 7, 8, 0, 0, 14, 1, 1, 4]
    assert bytes(q.codes.tolist()) == bytes.fromhex("90224c6587001e41")
    expected = e2m1_values(np.array([0, 9, 2, 2, 12, 4, 5, 6, 7, 8, 0, 0, 14, 1, 1, 4])) * F32(448) / F32(384)
    assert_within_ulp(q.dequantize().numpy(), expected)


def test_nvfp4_exact_midpoints_round_half_to_even():
    # g = 2688 makes S_enc = 1; a block with amax 6 gets scale 1, so x * e_b = x exactly.
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    expected = [0, 2, 2, 4, 4, 6, 6, 7]  # <=0.25 -> 0, [0.75,1.25] -> 2, [1.75,2.5] -> 4, [3.5,5] -> 6
    for k in (0, -3, 5):
        big = 2688.0 * 2.0**k
        row = torch.tensor([big] + [0.0] * 15 + [m * 2.0**k for m in mids] + [-m * 2.0**k for m in mids])
        q = quantize(row, "nvfp4")
        codes = unpack(q).reshape(-1)
        assert codes[16:24].tolist() == expected
        assert codes[24:32].tolist() == [c | 8 for c in expected]
        check_nvfp4_against_reference(row)


@pytest.mark.parametrize("shape", [(48, 128), (1, 16), (3, 4, 64), (130, 256), (7, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_matches_torchao_when_global_scale_is_power_of_two(shape, dtype):
    # With g = 2688 * 2**k both TE's and torchao's global scales are exact powers of two, so
    # their arithmetic coincides except for torchao's lower clamp of block scales at 2**-6.
    for seed, k in [(0, 0), (1, -4), (2, 3), (3, -9)]:
        x = random_tensor(shape, torch.float32, seed=seed, spread=1.0)
        x = x / x.abs().max() * (2688.0 * 2.0**k) * 0.999
        x.view(-1)[seed % x.numel()] = -2688.0 * 2.0**k
        x = x.to(dtype)
        q = quantize(x, "nvfp4")
        scales_ao, packed_ao = nvfp4_quantize(x, 16, torch.tensor(2.0**k))
        ours_scales = q.scales.view(torch.uint8).reshape(-1)
        normal = (q.scales.float() >= 2.0**-6).reshape(-1)  # where torchao does not clamp
        assert normal.float().mean() > 0.5
        theirs_scales = scales_ao.view(torch.uint8).reshape(-1)
        np.testing.assert_array_equal(ours_scales[normal].numpy(), theirs_scales[normal].numpy())
        packed = packed_ao.reshape(-1).numpy()
        ao_codes = np.stack([packed & 15, packed >> 4], -1).reshape(-1)
        mask = np.repeat(normal.numpy(), 16)
        np.testing.assert_array_equal(unpack(q).reshape(-1)[mask], ao_codes[mask])


def test_swizzled_scales_match_formula_and_torchao():
    for rows, k in [(5, 64), (130, 96), (256, 512), (1, 16)]:
        q = quantize(random_tensor((rows, k), seed=rows), "nvfp4")
        swizzled = q.swizzled_scales().view(torch.uint8)
        raw = q.scales.view(torch.uint8)
        n_cols = k // 16
        n_col_blocks = -(-n_cols // 4)
        assert swizzled.numel() == (-(-rows // 128) * 128) * n_col_blocks * 4
        for r in range(rows):
            for c in range(n_cols):
                index = ((r // 128) * n_col_blocks + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
                assert swizzled[index] == raw[r, c]
        np.testing.assert_array_equal(swizzled.numpy(), to_blocked(raw).numpy())
    mx = quantize(random_tensor((40, 256)), "mxfp4")
    np.testing.assert_array_equal(mx.swizzled_scales().numpy(), to_blocked(mx.scales).numpy())


# --------------------------------------------------------------------------------------------
# NVFP4 edge cases (reference/nvfp4.md)
# --------------------------------------------------------------------------------------------


def test_all_zero_block_and_all_zero_tensor():
    x = random_tensor((2, 64))
    x[1, 16:32] = 0.0
    q = check_nvfp4_against_reference(x)
    assert q.scales.view(torch.uint8)[1, 1] == 0 and (q.dequantize()[1, 16:32] == 0).all()

    zeros = torch.zeros(3, 48)
    q = check_nvfp4_against_reference(zeros)  # torchao's two-level mode gives NaN here
    assert float(q.global_amax) == 0.0
    assert (q.codes == 0).all() and (q.scales.view(torch.uint8) == 0).all()
    out = q.dequantize()
    assert torch.isfinite(out).all() and (out == 0).all()
    assert (fake_quantize(zeros, "nvfp4") == 0).all()


def test_block_scale_underflow_saturates_codes_but_decodes_to_zero():
    x = torch.zeros(32)
    x[0] = 1e6  # g = 1e6: S_enc / 6 ~ 4.5e-4
    x[16:32] = torch.linspace(-1e-3, 1e-3, 16)  # block scale 1e-3 * 4.5e-4 underflows E4M3 to 0
    q = check_nvfp4_against_reference(x)
    assert q.scales.view(torch.uint8)[1] == 0
    codes = unpack(q)[0, 16:32]
    assert set(codes.tolist()) <= {7, 15, 0, 8}  # saturated (7 / 15), zero stays zero
    assert (q.dequantize()[16:32] == 0).all()


def test_subnormal_block_scales():
    x = torch.zeros(64)
    x[0] = 2688.0  # S_enc = 1: block scale = amax / 6
    x[16:32] = torch.linspace(-0.05, 0.05, 16)  # 0.05 / 6 = 0.0083: an E4M3 subnormal
    x[32:48] = torch.linspace(-0.02, 0.013, 16)
    x[48:64] = 0.008  # 0.0013: rounds to the smallest subnormal, 2**-9
    q = check_nvfp4_against_reference(x)
    scale_bytes = q.scales.view(torch.uint8)[1:]
    assert ((scale_bytes >> 3) == 0).all() and (scale_bytes > 0).all()  # exponent field 0: subnormal


def test_outlier_of_one_million():
    x = random_tensor((8, 64), seed=3)
    x[3, 10] = 1e6
    check_nvfp4_against_reference(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finfo_max_inputs(dtype):
    big = torch.finfo(dtype).max
    x = random_tensor((4, 32), dtype, seed=5)
    x[0, 0] = big
    x[2, 17] = -big
    q = check_nvfp4_against_reference(x)
    out = q.dequantize(torch.float32)
    assert torch.isfinite(out).all()
    assert out[0, 0] == pytest.approx(float(big), rel=1e-6)


def test_signed_zero_decodes_to_zero():
    x = torch.tensor([-0.0, 0.0, -1e-30, 1e-30] + [1.0] * 12)
    q = check_nvfp4_against_reference(x)
    codes = unpack(q)[0, :4]
    # TE's reference writes code 0 for -0.0, ml_dtypes/torchao code 8: both are zero.
    assert (e2m1_values(codes) == 0).all()
    assert (q.dequantize()[:4] == 0).all()


@pytest.mark.parametrize("shape", [(3, 20), (5, 1), (2, 33), (2, 3, 7)])
def test_k_not_multiple_of_block_pads_and_unpads(shape):
    x = random_tensor(shape, seed=11)
    for fmt in ("nvfp4", "mxfp4", "fp8"):
        q = quantize(x, fmt)
        assert q.dequantize().shape == x.shape
        assert fake_quantize(x, fmt).shape == x.shape
    q = check_nvfp4_against_reference(x)
    assert q.codes.shape[-1] == q.padded_k // 2 and q.padded_k % 16 == 0
    assert q.scales.shape == (*shape[:-1], q.padded_k // 16)


def test_empty_leading_dimension():
    x = torch.zeros(0, 32)
    for fmt in ("nvfp4", "mxfp4"):
        q = quantize(x, fmt)
        assert q.dequantize().shape == (0, 32)


# --------------------------------------------------------------------------------------------
# Non-finite policy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "fp8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_raises_by_default(fmt, bad):
    x = random_tensor((4, 64))
    x[2, 37] = bad
    with pytest.raises(NonFiniteError, match=r"first at index \(2, 37\)"):
        quantize(x, fmt)
    with pytest.raises(NonFiniteError):
        fake_quantize(x, fmt)
    x3 = random_tensor((2, 3, 40))
    x3[1, 2, 33] = bad
    with pytest.raises(NonFiniteError, match=r"shape \(2, 3, 40\) has 1 non-finite value\(s\).*first at index \(1, 2, 33\)"):
        quantize(x3, fmt)


@pytest.mark.parametrize("fmt,block_size", [("nvfp4", 16), ("mxfp4", 32)])
def test_nonfinite_propagate_poisons_only_its_block(fmt, block_size):
    x = random_tensor((4, 64))
    x[2, 37] = float("nan")
    x[0, 3] = float("inf")
    q = quantize(x, fmt, nonfinite="propagate")
    out = q.dequantize()
    nan_blocks = torch.isnan(out).reshape(4, -1, block_size)
    assert nan_blocks.all(-1)[2, 37 // block_size] and nan_blocks.all(-1)[0, 0]
    assert nan_blocks.any(-1).sum() == 2
    clean = x.clone()
    clean[~torch.isfinite(clean)] = 0.0
    reference = quantize(clean, fmt)
    finite = ~torch.isnan(out)
    assert torch.equal(out[finite], reference.dequantize()[finite])
    nan_byte = 0x7F if fmt == "nvfp4" else 0xFF
    assert q.scales.view(torch.uint8)[2, 37 // block_size] == nan_byte
    assert torch.equal(torch.isnan(fake_quantize(x, fmt, nonfinite="propagate")), torch.isnan(out))


def test_nonfinite_propagate_fp8_marks_elements():
    x = random_tensor((3, 16))
    x[1, 4] = float("nan")
    x[2, 5] = float("inf")
    out = quantize(x, "fp8", nonfinite="propagate").dequantize()
    assert torch.isnan(out[1, 4]) and torch.isnan(out[2, 5]) and torch.isnan(out).sum() == 2


def test_nvfp4_16x16_nonfinite_poisons_the_whole_tile():
    x = random_tensor((32, 32))
    x[3, 20] = float("nan")
    out = quantize(x, "nvfp4", (16, 16), nonfinite="propagate").dequantize()
    assert torch.isnan(out[:16, 16:32]).all() and not torch.isnan(out[16:]).any() and not torch.isnan(out[:, :16]).any()


def test_argument_errors_are_clear():
    with pytest.raises(ValueError, match="unknown quantization format 'int4'"):
        quantize(torch.ones(16), "int4")
    with pytest.raises(ValueError, match=r"nvfp4 supports block=\(1, 16\) or \(16, 16\)"):
        quantize(torch.ones(16), "nvfp4", (1, 32))
    with pytest.raises(TypeError, match="float32, bfloat16 and float16"):
        quantize(torch.ones(16, dtype=torch.int32), "nvfp4")
    with pytest.raises(ValueError, match="nonfinite must be"):
        quantize(torch.ones(16), "nvfp4", nonfinite="ignore")
    with pytest.raises(ValueError, match="at least one dimension"):
        quantize(torch.tensor(1.0), "fp8")


# --------------------------------------------------------------------------------------------
# MXFP4
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 64), (3, 40), (2, 3, 96), (1, 1)])
def test_mxfp4_matches_reference(shape, dtype):
    x = random_tensor(shape, dtype, seed=len(shape), spread=4.0)
    q = quantize(x, "mxfp4")
    codes, scale_bytes, values = mx_reference(x.float().numpy())
    np.testing.assert_array_equal(unpack(q), codes)
    np.testing.assert_array_equal(q.scales.reshape(codes.shape[0], -1).numpy(), scale_bytes)
    np.testing.assert_array_equal(padded_dequantized(q), values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 256), (1, 32), (3, 5, 96)])
def test_mxfp4_matches_torchao_except_smallest_scale(shape, dtype):
    x = random_tensor(shape, seed=7, spread=3.0)
    flat = x.view(-1, shape[-1])
    flat[0, :32] = 0.0
    if flat.shape[0] > 1:
        flat[1, :32] = 1e-39  # amax < 2**-124: scale byte 0, where torchao divides by 2**-126
    x = x.to(dtype)
    q = quantize(x, "mxfp4")
    scale_ao, packed_ao = to_mx(x, torch.float4_e2m1fn_x2, 32)
    np.testing.assert_array_equal(q.scales.reshape(-1).numpy(), scale_ao.view(torch.uint8).reshape(-1).numpy())
    ours = unpack(q).reshape(-1)
    packed = packed_ao.reshape(-1).numpy()
    theirs = np.stack([packed & 15, packed >> 4], -1).reshape(-1)
    regular = np.repeat(q.scales.reshape(-1).numpy() > 0, 32)
    np.testing.assert_array_equal(ours[regular], theirs[regular])
    codes, _, _ = mx_reference(x.float().numpy())  # our own oracle covers the tiny blocks too
    np.testing.assert_array_equal(unpack(q), codes)


# --------------------------------------------------------------------------------------------
# FP8
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_matches_reference(per_channel, dtype):
    x = random_tensor((6, 40), dtype, seed=9)
    x[2] = 0.0  # an all-zero channel keeps scale 1
    q = quantize(x, "fp8", "channel" if per_channel else None)
    codes, decode, values = fp8_reference(x.float().numpy(), per_channel)
    np.testing.assert_array_equal(q.codes.numpy(), codes)
    np.testing.assert_array_equal(q.scales.reshape(np.shape(decode)).numpy(), decode)
    np.testing.assert_array_equal(q.dequantize(torch.float32).numpy(), values)


# --------------------------------------------------------------------------------------------
# fake_quantize == quantize + dequantize
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,block", [("nvfp4", (1, 16)), ("nvfp4", (16, 16)), ("mxfp4", None), ("fp8", None), ("fp8", "channel")]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_equals_quantize_dequantize(fmt, block, dtype):
    x = random_tensor((37, 72), dtype, seed=13)
    x[4, 9] = -0.0
    expected = quantize(x, fmt, block).dequantize()
    actual = fake_quantize(x, fmt, block)
    assert actual.dtype == dtype and actual.shape == x.shape
    assert torch.equal(actual, expected)  # -0.0 == 0.0 as numbers


def test_chunked_processing_matches_single_pass(monkeypatch):
    import solbench.quant.formats as formats
    import solbench.quant.grid as grid

    x = random_tensor((70, 160), seed=17)
    whole = quantize(x, "nvfp4")
    monkeypatch.setattr(grid, "_CHUNK_ELEMENTS", 64)  # many chunks, ragged last one
    chunked = quantize(x, "nvfp4")
    assert torch.equal(whole.codes, chunked.codes)
    assert torch.equal(whole.dequantize(), chunked.dequantize())
    assert torch.equal(fake_quantize(x, "mxfp4"), quantize(x, "mxfp4").dequantize())
    assert torch.equal(quantize(x, "fp8").codes, formats.quantize(x, "fp8").codes)


def test_quantized_tensor_metadata():
    x = random_tensor((8, 50), torch.bfloat16)
    q = quantize(x, "nvfp4", (16, 16))
    assert q.fmt == "nvfp4" and q.block == (16, 16) and q.dtype == torch.bfloat16 and q.shape == x.shape
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (8, 32)
    assert q.scales.dtype == torch.float8_e4m3fn and q.scales.shape == (8, 4)
    assert q.global_amax.dtype == torch.float32 and q.global_amax.dim() == 0
    assert q.dequantize().dtype == torch.bfloat16
    assert q.nbytes == 8 * 32 + 8 * 4 + 4
    assert "nvfp4" in repr(q)
    with pytest.raises(ValueError, match="not fp8"):
        quantize(x, "fp8").swizzled_scales()
    assert math.isclose(float(q.global_amax), float(x.float().abs().max()))
