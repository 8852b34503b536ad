# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The float64 reference of the forward layer in torch (on the GPU, so large
shapes stay quick), shared by the GPU tests and the benchmark.

Exact float64 math on the bf16 inputs, except that gate and up are rounded
to bf16 before the activation, as the semantics store them (the clamp
decides on the stored value); see python/tests/reference.py for the NumPy
version the CPU tests use.

torch is imported by the functions, so that test collection works on
machines without it.
"""


def forward(a, experts, swiglu_limit=None):
    """a: the layer's inputs by name (x, top_experts, router_weights,
    gate/up/down_weights, optional shared_*_weights)."""
    import torch
    f = {n: v.double() for n, v in a.items() if n != "top_experts"}
    L = swiglu_limit

    def mlp(x, wg, wu, wd):
        g = (x @ wg.T).float().to(torch.bfloat16).double()
        u = (x @ wu.T).float().to(torch.bfloat16).double()
        if L is not None:
            g, u = g.clamp(max=L), u.clamp(-L, L)
        return (g * torch.sigmoid(g) * u) @ wd.T

    out = torch.zeros_like(f["x"])
    if "shared_gate_weights" in f:
        out += mlp(f["x"], f["shared_gate_weights"], f["shared_up_weights"],
                   f["shared_down_weights"])
    top = a["top_experts"].long()
    for e in range(experts):
        t, j = (top == e).nonzero(as_tuple=True)
        if len(t):
            y = mlp(f["x"][t], f["gate_weights"][e], f["up_weights"][e], f["down_weights"][e])
            out.index_add_(0, t, f["router_weights"][t, j].unsqueeze(1) * y)
    return out


def relative_error(got, ref):
    """sum|got - ref| / sum|ref|, NaN if `got` holds a NaN."""
    import torch
    got = got.double()
    if torch.isnan(got).any():
        return float("nan")
    return ((got - ref).abs().sum() / ref.abs().sum()).item()
