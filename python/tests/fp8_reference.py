# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A float64 NumPy model of block-scaled E4M3, written from the formats'
definitions independently of the compiler's integer arithmetic: the E4M3
value of v is found by search among the 256 codes (nearest, ties to the
even code), the MX exponent by the inequality that defines it."""
import math

import numpy as np

E4M3_MAX = 448.0


def e4m3_value(code):
    """The float64 value of f8E4M3FN code (0..255); NaN for 0x7F / 0xFF."""
    sign = -1.0 if code & 0x80 else 1.0
    mag = code & 0x7F
    if mag == 0x7F:
        return math.nan
    exponent, mantissa = mag >> 3, mag & 7
    if exponent == 0:
        return sign * mantissa * 2.0 ** -9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


_VALUES = np.array([e4m3_value(c) for c in range(0x7F)])  # codes 0..126: 0 .. 448


def e4m3_codes(v):
    """E4M3(v) of float64 array `v`: the nearest code, ties to the even
    code, sign kept (-0 too), |v| >= 448 saturated, NaN to 0x7F with v's
    sign bit."""
    v = np.asarray(v, np.float64)
    sign = np.where(np.signbit(v), 0x80, 0)
    a = np.minimum(np.abs(np.nan_to_num(v, nan=0.0)), E4M3_MAX)
    hi = np.clip(np.searchsorted(_VALUES, a), 1, len(_VALUES) - 1)
    lo = hi - 1  # _VALUES[lo] <= a <= _VALUES[hi]
    d_lo, d_hi = a - _VALUES[lo], _VALUES[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(np.isnan(v), 0x7F, code)
    return (code | sign).astype(np.uint8)


def e4m3_code(v):
    """e4m3_codes of one value."""
    return int(e4m3_codes(np.array([v]))[0])


def mx_exponent(amax):
    """The smallest integer e with amax <= 448 * 2^e, clamped to
    [-127, 127]; -127 for amax = 0."""
    if amax == 0:
        return -127
    e = math.ceil(math.log2(amax / E4M3_MAX))
    while amax > E4M3_MAX * 2.0 ** e:  # (log2 rounding either way)
        e += 1
    while e > -127 and amax <= E4M3_MAX * 2.0 ** (e - 1):
        e -= 1
    return max(-127, min(127, e))


def quantize(x, block, scale):
    """(codes uint8, scales) of float64 array `x` (bf16 or f32 values),
    blocks over its last two dimensions; scale "e8m0" or "f32"."""
    x = np.asarray(x, np.float64)
    br, bc = block
    lead = x.shape[:-2]
    rows, cols = x.shape[-2] // br, x.shape[-1] // bc
    codes = np.zeros(x.shape, np.uint8)
    scales = np.zeros((*lead, rows, cols), np.uint8 if scale == "e8m0" else np.float32)
    for idx in np.ndindex(*lead, rows, cols):
        *b, r, c = idx
        sl = (*b, slice(r * br, (r + 1) * br), slice(c * bc, (c + 1) * bc))
        blk = x[sl]
        out = np.zeros(blk.shape, np.uint8)
        if not np.isfinite(blk).all():
            scales[idx] = 0xFF if scale == "e8m0" else np.float32("nan")
            out[...] = 0x7F | np.where(np.signbit(blk), 0x80, 0)
        else:
            amax = float(np.abs(blk).max())
            if scale == "e8m0":
                e = mx_exponent(amax)
                scales[idx] = e + 127
                out[...] = e4m3_codes(blk * 2.0 ** -e)  # exact in float64
            else:
                s = np.float32(1.0) if amax == 0 else np.float32(amax) / np.float32(448.0)
                scales[idx] = s
                out[...] = e4m3_codes(blk.astype(np.float32) / s)  # f32 division
        codes[sl] = out
    return codes, scales


def dequantize(codes, scales, block):
    """float32 values: f32(E4M3) * scale of the block, multiplied in f32."""
    br, bc = block
    out = np.zeros(codes.shape, np.float32)
    for idx in np.ndindex(*codes.shape):
        *b, r, c = idx
        s = scales[(*b, r // br, c // bc)]
        if scales.dtype == np.uint8:
            s = np.float32("nan") if s == 0xFF else np.float32(2.0 ** (int(s) - 127))
        with np.errstate(over="ignore", invalid="ignore"):
            out[idx] = np.float32(e4m3_value(int(codes[idx]))) * np.float32(s)
    return out


def fake_quantize(x, block, scale):
    """The float64 values moe.quantize then moe.dequantize give x (its
    E4M3 values times their block's scale, exactly)."""
    codes, scales = quantize(x, block, scale)
    values = np.vectorize(e4m3_value, otypes=[np.float64])(codes)
    br, bc = block
    s = scales.astype(np.float64)
    if scales.dtype == np.uint8:
        s = np.where(scales == 0xFF, np.nan, np.exp2(scales.astype(np.float64) - 127))
    s = s.repeat(br, axis=-2).repeat(bc, axis=-1)
    return values * s


def layer_forward(x, top, rw, wg, wu, wd, shared=None, limit=None, precision="mxfp8"):
    """moe.layer's forward with precision "mxfp8" or "fp8" in float64: the
    routed GEMMs on the quantized x rows and weights, gate/up and the
    hidden activation rounded to bf16 as stored, the hidden quantized per
    row; the shared expert in bf16 semantics (python/tests/reference.py)."""
    import reference
    mx = precision == "mxfp8"
    act, wblock, kind = ((1, 32), (1, 32), "e8m0") if mx else ((1, 128), (128, 128), "f32")
    xq = fake_quantize(x, act, kind)
    wgq, wuq, wdq = (fake_quantize(w, wblock, kind) for w in (wg, wu, wd))
    out = np.zeros_like(x)
    if shared is not None:
        out += reference._mlp(x, *shared, limit)[3]
    T, k = top.shape
    for t in range(T):
        for j in range(k):
            e = top[t, j]
            if e < 0:
                continue
            g = reference._bf16(xq[t] @ wgq[e].T)
            u = reference._bf16(xq[t] @ wuq[e].T)
            h = reference._bf16(reference._act(g, u, limit))
            hq = fake_quantize(h[None], act, kind)[0]
            out[t] += rw[t, j] * (hq @ wdq[e].T)
    return out


def _blocks(precision):
    """(act, weight, weight along rows, routed-row blocks, scale kind)."""
    if precision == "mxfp8":
        return (1, 32), (1, 32), (32, 1), (32, 1), "e8m0"
    return (1, 128), (128, 128), (128, 128), (128, 1), "f32"


def _segments(top, experts, padding):
    """Each expert's routed rows in the plan's order (token, then k) as
    (t, j) pairs, and its segment length (padded to `padding`)."""
    rows = {e: [(t, j) for t in range(top.shape[0]) for j in range(top.shape[1])
                if top[t, j] == e] for e in range(experts)}
    return rows, {e: -(-len(r) // padding) * padding for e, r in rows.items()}


def layer_backward(x, top, rw, wg, wu, wd, d_out, shared=None, limit=None,
                   precision="mxfp8", padding=32):
    """moe.layer_grad's gradients with `precision` in float64: every routed
    GEMM on operands quantized along its reduction dimension (per row for
    activations and d_out, along the reduced dimension for weights, in
    blocks of routed rows of an expert's segment for the weight
    gradients), the rest as the bf16 layer defines it."""
    import reference
    bf = reference._bf16
    act, wblock, wblock_t, rblock, kind = _blocks(precision)
    E, T, k = wg.shape[0], top.shape[0], top.shape[1]
    xq = fake_quantize(x, act, kind)
    wgq, wuq = fake_quantize(wg, wblock, kind), fake_quantize(wu, wblock, kind)
    wgt, wut, wdt = (fake_quantize(w, wblock_t, kind) for w in (wg, wu, wd))
    dq = fake_quantize(d_out, act, kind)
    grads = dict(x=np.zeros_like(x), router_weights=np.zeros_like(rw),
                 gate_weights=np.zeros_like(wg), up_weights=np.zeros_like(wu),
                 down_weights=np.zeros_like(wd))
    rows, lengths = _segments(top, E, padding)
    for e in range(E):
        n, length = len(rows[e]), lengths[e]
        if not n:
            continue
        H, I = x.shape[1], wg.shape[1]
        X, DY, HID = (np.zeros((length, H)), np.zeros((length, H)), np.zeros((length, I)))
        DG, DU = np.zeros((length, I)), np.zeros((length, I))
        for r, (t, j) in enumerate(rows[e]):
            w = rw[t, j]
            g, u = bf(xq[t] @ wgq[e].T), bf(xq[t] @ wuq[e].T)
            gc = g if limit is None else np.minimum(g, limit)
            uc = u if limit is None else np.clip(u, -limit, limit)
            s = 1.0 / (1.0 + np.exp(-gc))
            silu = gc * s
            h = bf(silu * uc)
            dhu = dq[t] @ wdt[e]
            grads["router_weights"][t, j] = dhu @ h
            dh = bf(w * dhu)
            dg = dh * uc * (s + silu * (1.0 - s))
            du = dh * silu
            if limit is not None:
                dg, du = dg * (g <= limit), du * ((u >= -limit) & (u <= limit))
            dg, du = bf(dg), bf(du)
            dgq = fake_quantize(dg[None], act, kind)[0]
            duq = fake_quantize(du[None], act, kind)[0]
            grads["x"][t] += bf(dgq @ wgt[e] + duq @ wut[e])
            X[r], DY[r], HID[r], DG[r], DU[r] = x[t], bf(w * d_out[t]), h, dg, du
        Xq, DYq, HIDq, DGq, DUq = (fake_quantize(m, rblock, kind) for m in (X, DY, HID, DG, DU))
        grads["down_weights"][e] = DYq.T @ HIDq
        grads["gate_weights"][e] = DGq.T @ Xq
        grads["up_weights"][e] = DUq.T @ Xq
    if shared is not None:
        b = reference._mlp_backward(x, *shared, d_out, limit)
        grads["x"] += b["x"]
        grads.update(shared_gate_weights=b["wg"], shared_up_weights=b["wu"],
                     shared_down_weights=b["wd"])
    return grads
