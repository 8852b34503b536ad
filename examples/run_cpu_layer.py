#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compile a small DeepSeek-V3-shaped MoE layer (shared expert, top-8) for the
CPU, run forward and backward on random inputs, and print what came out.

    PYTHONPATH=build/python python3 examples/run_cpu_layer.py
"""
import numpy as np

import mok

spec = mok.LayerSpec(hidden=64, intermediate=32, experts=16, top_k=8, tokens=24,
                     shared_intermediate=32, padding=8)
layer = mok.compile(spec, target="cpu")

rng = np.random.default_rng(0)
T, H, I, E, k = spec.tokens, spec.hidden, spec.intermediate, spec.experts, spec.top_k
bf16 = lambda *shape, scale=1.0: mok.to_bf16(rng.standard_normal(shape) * scale)
logits = rng.standard_normal((T, k))
args = dict(
    x=bf16(T, H),
    top_experts=np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32),
    router_weights=(np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32),
    gate_weights=bf16(E, I, H, scale=H ** -0.5), up_weights=bf16(E, I, H, scale=H ** -0.5),
    down_weights=bf16(E, H, I, scale=I ** -0.5),
    shared_gate_weights=bf16(I, H, scale=H ** -0.5),
    shared_up_weights=bf16(I, H, scale=H ** -0.5),
    shared_down_weights=bf16(H, I, scale=I ** -0.5))

out, ctx = layer.forward(**args)
grads = layer.backward(ctx, bf16(T, H))
print(f"forward: out {out.shape}, first values "
      f"{np.round(mok.bf16_to_float32(out)[0, :4].astype(float), 4).tolist()}")
print("saved for backward:", {n: list(a.shape) for n, a in ctx.saved.items()})
print("gradients:", {n: list(g.shape) for n, g in grads.items()})
print("stages:", ", ".join(f"{name} ({len(ir.splitlines())} lines)"
                           for name, ir in layer.stages.items()))
