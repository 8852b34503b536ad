# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A float64 NumPy reference of the MoE layer, forward and backward.

Exact float64 math on the (bf16-valued) inputs: the higher-precision answer
mok's bf16 pipeline is measured against. One rounding of the semantics is
kept, by default: the gate and up projections are rounded to bf16 before the
activation, because the SwiGLU clamp decides on the *stored* values (a value
within a rounding of the limit is clamped or not depending on it, and one
such flip changes a whole row of a weight gradient). With `bf16_gate_up=False`
the reference is exact and smooth, for finite differences. Shapes as in the
moe dialect: x [T,H], top [T,k] (-1 = no route), rw [T,k], gate/up
[E,I,H], down [E,H,I], shared gate/up [Is,H], shared down [H,Is].
"""
import numpy as np

BF16_GATE_UP = True


def _bf16(a):
    """Rounds float64 values to bf16 (nearest, ties to even), as float64."""
    f = np.asarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _act(g, u, limit):
    if limit is not None:
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
    s = 1.0 / (1.0 + np.exp(-g))
    return g * s * u


def _gate_up(x, wg, wu):
    g, u = x @ wg.T, x @ wu.T
    if BF16_GATE_UP:
        g, u = _bf16(g), _bf16(u)
    return g, u


def _mlp(x, wg, wu, wd, limit):
    g, u = _gate_up(x, wg, wu)
    h = _act(g, u, limit)
    return g, u, h, h @ wd.T


def forward(x, top, rw, wg, wu, wd, shared=None, limit=None):
    T, k = top.shape
    out = np.zeros_like(x)
    if shared is not None:
        out += _mlp(x, *shared, limit)[3]
    for t in range(T):
        for j in range(k):
            e = top[t, j]
            if e < 0:
                continue
            out[t] += rw[t, j] * _mlp(x[t:t + 1], wg[e], wu[e], wd[e], limit)[3][0]
    return out


def _mlp_backward(x, wg, wu, wd, dy, limit):
    """Gradients of sum(dy * mlp(x)) for rows x [n,H], dy [n,H]."""
    g, u, h, y = _mlp(x, wg, wu, wd, limit)
    gc = g if limit is None else np.minimum(g, limit)
    uc = u if limit is None else np.clip(u, -limit, limit)
    s = 1.0 / (1.0 + np.exp(-gc))
    silu = gc * s
    dh = dy @ wd
    dg = dh * uc * (s + silu * (1.0 - s))
    du = dh * silu
    if limit is not None:
        dg = dg * (g <= limit)
        du = du * ((u >= -limit) & (u <= limit))
    return dict(x=dg @ wg + du @ wu, wg=dg.T @ x, wu=du.T @ x, wd=dy.T @ h, y=y)


def backward(x, top, rw, wg, wu, wd, d_out, shared=None, limit=None):
    """Returns the gradients of sum(d_out * forward(...)) by argument name."""
    T, k = top.shape
    grads = dict(x=np.zeros_like(x), router_weights=np.zeros_like(rw),
                 gate_weights=np.zeros_like(wg), up_weights=np.zeros_like(wu),
                 down_weights=np.zeros_like(wd))
    for t in range(T):
        for j in range(k):
            e = top[t, j]
            if e < 0:
                continue
            w = rw[t, j]
            b = _mlp_backward(x[t:t + 1], wg[e], wu[e], wd[e], w * d_out[t:t + 1], limit)
            grads["x"][t] += b["x"][0]
            grads["gate_weights"][e] += b["wg"]
            grads["up_weights"][e] += b["wu"]
            grads["down_weights"][e] += b["wd"]
            grads["router_weights"][t, j] = d_out[t] @ (b["y"][0])
    if shared is not None:
        b = _mlp_backward(x, *shared, d_out, limit)
        grads["x"] += b["x"]
        grads["shared_gate_weights"] = b["wg"]
        grads["shared_up_weights"] = b["wu"]
        grads["shared_down_weights"] = b["wd"]
    return grads
