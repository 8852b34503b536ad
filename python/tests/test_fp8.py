# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""moe.quantize / moe.dequantize on the CPU target (mok.fp8) against a
float64 NumPy model of the formats (fp8_reference.py), bit for bit: the
E4M3 codes, the E8M0 and f32 scales, on fresh random data over a wide
range of magnitudes, every E4M3 value, every bf16 value, the ties,
saturation, zeros, -0, NaN and infinities."""
import numpy as np
import pytest

import fp8_reference as ref
import mok
import mok.fp8
from cpu_results import SEED


def _random(shape, rng, spread=40):
    """Values of every magnitude: per row a random power of two in
    [2^-spread, 2^spread], so blocks range from subnormal to huge."""
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-spread, spread, (*shape[:-1], 1)))
    return x.astype(np.float32)


def _same_scales(a, b):
    if a.dtype == np.uint8:
        return np.array_equal(a, b)
    return np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(
        np.nan_to_num(a, nan=0).view(np.uint32), np.nan_to_num(b, nan=0).view(np.uint32))


@pytest.mark.parametrize("scale,block,dtype", [
    ("e8m0", (1, 32), "bf16"), ("e8m0", (1, 32), "f32"), ("e8m0", (4, 8), "bf16"),
    ("f32", (1, 128), "bf16"), ("f32", (1, 128), "f32"), ("f32", (16, 16), "f32")])
def test_quantize_matches_the_model_bit_for_bit(scale, block, dtype):
    rng = np.random.default_rng(SEED)
    x = _random((3, 32, 256), rng)
    x[0, 0, 7] = np.nan            # a NaN block
    x[1, 5, 100] = -np.inf         # an infinite block
    x[2, 3, :128] = 0.0            # zero blocks
    x[2, 3, 5] = -0.0
    x[0, 9, 64:96] *= 1e-38        # subnormal f32 / bf16 values
    if dtype == "bf16":
        given = mok.to_bf16(x)
        exact = mok.bf16_to_float32(given)
    else:
        given = exact = x
    codes, scales = mok.fp8.quantize(given, block, scale)
    want_codes, want_scales = ref.quantize(exact, block, scale)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert _same_scales(scales, want_scales)
    bad = np.argwhere(codes != want_codes)
    assert len(bad) == 0, (f"{len(bad)} codes differ, first at {bad[0].tolist()}: "
                           f"x = {exact[tuple(bad[0])]!r}, got {codes[tuple(bad[0])]:#x}, "
                           f"want {want_codes[tuple(bad[0])]:#x}")


@pytest.mark.parametrize("scale,block", [("e8m0", (1, 32)), ("f32", (128, 128)),
                                         ("f32", (16, 64))])
def test_transposed_quantize_is_the_transpose_quantized(scale, block):
    """moe.quantize {transpose} (the CPU target) against the float64 model
    of the swapped array, bit for bit: the blocks are the transposed data's
    (non-square ones too), NaN, infinite and zero blocks among them."""
    rng = np.random.default_rng(SEED)
    x = _random((2, 256, 384), rng)
    x[0, 3, 7] = np.nan
    x[1, 200, 300] = np.inf
    x[1, :128, :128] = 0.0
    given = mok.to_bf16(x)
    swapped = np.swapaxes(mok.bf16_to_float32(given), -1, -2)
    codes, scales = mok.fp8.quantize(given, block, scale, transpose=True)
    want_codes, want_scales = ref.quantize(np.ascontiguousarray(swapped), block, scale)
    assert codes.shape == (2, 384, 256)
    assert _same_scales(scales, want_scales)
    assert np.array_equal(codes, want_codes), int((codes != want_codes).sum())


def test_every_e4m3_value_and_every_bf16_value():
    """Blocks [448, v]: the scale is 1 (f32) or 2^0 (E8M0), so each v is
    encoded as itself: every E4M3 value maps to its own code, and every
    bf16 bit pattern to the model's code."""
    codes = np.arange(256, dtype=np.uint8)
    values = np.array([ref.e4m3_value(c) for c in range(256)], np.float32)
    x = np.stack([np.full(256, 448.0, np.float32), values], axis=1)[None]  # [1, 256, 2]
    for scale in ("f32", "e8m0"):
        got, _ = mok.fp8.quantize(x, (1, 2), scale)
        finite = ~np.isnan(values)
        assert np.array_equal(got[0, finite, 1], codes[finite])
        assert np.all(got[0, ~finite, 1] & 0x7F == 0x7F)
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    allbf = mok.bf16_to_float32(bits)
    finite = np.isfinite(allbf) & (np.abs(allbf) <= 448)
    v = allbf[finite]
    x = np.stack([np.full(v.shape, 448.0, np.float32), v], axis=1)[None]
    got, _ = mok.fp8.quantize(mok.to_bf16(x), (1, 2), "f32")
    assert np.array_equal(got[0, :, 1], ref.e4m3_codes(v.astype(np.float64)))


def test_ties_go_to_the_even_code_and_saturation_is_finite():
    # Midpoints between neighbouring E4M3 values (exact in bf16), scale 1.
    vals = [ref.e4m3_value(c) for c in range(0x7F)]
    mids = np.array([(a + b) / 2 for a, b in zip(vals, vals[1:])], np.float32)
    x = np.stack([np.full(mids.shape, 448.0, np.float32), mids], 1)[None]
    got, _ = mok.fp8.quantize(x, (1, 2), "e8m0")
    assert np.all(got[0, :, 1] % 2 == 0)  # the even one of each pair
    # f32 scales: x / s may land a rounding above 448; it saturates to 448.
    rng = np.random.default_rng(SEED + 1)
    x = _random((64, 128), rng, spread=20)
    codes, scales = mok.fp8.quantize(x, (1, 128), "f32")
    peak = np.abs(x).argmax(axis=1)
    assert np.all(codes[np.arange(64), peak] & 0x7F == 0x7E)  # ±448, never NaN


def test_dequantize_matches_the_model():
    rng = np.random.default_rng(SEED + 2)
    x = _random((2, 16, 64), rng)
    x[1, 2, 3] = np.nan
    for scale, block in (("e8m0", (1, 32)), ("f32", (2, 32))):
        codes, scales = mok.fp8.quantize(mok.to_bf16(x), block, scale)
        got = mok.fp8.dequantize(codes, scales, block)
        want = ref.dequantize(codes, scales, block)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
        # The round trip's error: half a step of E4M3, at most 2^-4 of the
        # value for normals, 2^-10 of the scale (< amax / 224) below them.
        exact = mok.bf16_to_float32(mok.to_bf16(x)).astype(np.float64)
        br, bc = block
        blocks = np.abs(exact).reshape(2, 16 // br, br, 64 // bc, bc)
        amax = blocks.max(axis=(2, 4)).repeat(br, axis=1).repeat(bc, axis=2)
        err = np.abs(got - exact)
        finite = np.isfinite(amax)
        assert np.all(err[finite] <= np.abs(exact[finite]) * 2.0 ** -4
                      + amax[finite] / 224 * 2.0 ** -10)
        bf = mok.fp8.dequantize(codes, scales, block, dtype="bf16")
        assert np.array_equal(bf[ok], mok.to_bf16(got)[ok])


def test_errors_name_the_argument():
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(ValueError, match=r"block: expected two positive ints"):
        mok.fp8.quantize(x, (0, 32))
    with pytest.raises(ValueError, match=r"x: dimension 1 \(64\) is not a multiple of the "
                                         r"block's 48"):
        mok.fp8.quantize(x, (1, 48))
    with pytest.raises(ValueError, match=r"x: expected an array of rank >= 2"):
        mok.fp8.quantize(np.zeros(64, np.float32))
    with pytest.raises(TypeError, match="x: expected float32 or bf16"):
        mok.fp8.quantize(x.astype(np.float64))
    with pytest.raises(ValueError, match="scale: expected 'e8m0'"):
        mok.fp8.quantize(x, scale="e4m3")
    q, s = mok.fp8.quantize(x)
    with pytest.raises(ValueError, match=r"scales: expected shape \[4, 2\]"):
        mok.fp8.dequantize(q, s[:2])
    with pytest.raises(TypeError, match="values: expected uint8"):
        mok.fp8.dequantize(q.astype(np.int32), s)
    with pytest.raises(TypeError, match="scales: expected uint8 E8M0 bytes or float32"):
        mok.fp8.dequantize(q, s.astype(np.float64))
