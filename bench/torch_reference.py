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


def make_inputs(c, gen, tokens=None):
    """Fresh random inputs of a layer described like bench/cases.py
    (routing "zipf" or uniform, optional -1 routes, zero weights, a subset
    of used experts), weights scaled by d^-0.5, on the GPU."""
    import torch
    dev = "cuda"
    T = c["tokens"] if tokens is None else tokens
    H, I, E, k = c["hidden"], c["intermediate"], c["experts"], c["top_k"]
    if T == 0:
        top = torch.empty(0, k, dtype=torch.int64)
    elif c.get("routing") == "zipf":
        p = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** 1.2
        top = torch.stack([torch.multinomial(p, k, replacement=False, generator=gen)
                           for _ in range(T)])
    else:
        used = torch.tensor(c.get("used", list(range(E))))
        top = torch.stack([used[torch.randperm(len(used), generator=gen)[:k]]
                           for _ in range(T)])
    if c.get("drop"):
        top[torch.rand(top.shape, generator=gen) < c["drop"]] = -1
    w = torch.softmax(torch.randn(T, k, generator=gen), dim=1)
    if c.get("zero"):
        w[torch.rand(w.shape, generator=gen) < c["zero"]] = 0.0
    def bf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(dev)
    ids = torch.int64 if c.get("expert_id_dtype") == "int64" else torch.int32
    args = dict(x=bf(T, H), top_experts=top.to(ids).to(dev),
                router_weights=w.to(torch.float32).to(dev),
                gate_weights=bf(E, I, H, scale=H ** -0.5), up_weights=bf(E, I, H, scale=H ** -0.5),
                down_weights=bf(E, H, I, scale=I ** -0.5))
    if c.get("shared_intermediate"):
        s = c["shared_intermediate"]
        args.update(shared_gate_weights=bf(s, H, scale=H ** -0.5),
                    shared_up_weights=bf(s, H, scale=H ** -0.5),
                    shared_down_weights=bf(H, s, scale=s ** -0.5))
    return args


def quantized_weight_args(a, training=False, precision="fp8"):
    """The arguments of an FP8 layer compiled with fp8_quantized_weights:
    the inputs `a` with the routed weights replaced by mok.ops.fp8_quantize's
    values and scales ("mxfp8": mok.ops.mxfp8_quantize's, the scales in
    tcgen05's atoms) in the normal layout, and a training layer's in the
    transposed one too."""
    import mok.ops
    routed = ("gate", "up", "down")
    args = {k: v for k, v in a.items() if k not in [w + "_weights" for w in routed]}
    for w in routed:
        v, s, vt, st = mok.ops.fp8_kernel_weights(a[w + "_weights"], precision, normal=True,
                                                  transposed=training)
        args[w + "_q"], args[w + "_scale"] = v, s
        if training:
            args[w + "_qt"], args[w + "_scale_t"] = vt, st
    return args


def forward(a, experts, swiglu_limit=None, route_outputs=None):
    """a: the layer's inputs by name (x, top_experts, router_weights,
    gate/up/down_weights, optional shared_*_weights). `route_outputs`: a
    list to which each expert's (token indices, slot indices, outputs y)
    is appended, unweighted."""
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
            if route_outputs is not None:
                route_outputs.append((t, j, y))
            out.index_add_(0, t, f["router_weights"][t, j].unsqueeze(1) * y)
    return out


def relative_error(got, ref):
    """sum|got - ref| / sum|ref|, NaN if `got` holds a NaN. Where `ref` is
    all zeros (e.g. one token whose routes are all dropped) the error is
    sum|got|: 0 for an exact zero, else at least that sum, never 0/0."""
    import torch
    got = got.double()
    if torch.isnan(got).any():
        return float("nan")
    scale = ref.abs().sum()
    diff = (got - ref).abs().sum()
    if scale == 0:
        return diff.item()
    return (diff / scale).item()


def router_weights_grad_terms(a, d_out, experts, swiglu_limit=None):
    """sum over routes (t, j) and h of |d_out[t, h] * y_j[t, h]|: the size
    of the terms whose sums are d_router_weights. Where few routes give
    few sums, each may cancel to far below its terms, and the relative
    error against sum|ref| measures the cancellation, not the kernel; the
    error against this sum is the bf16 rounding's (about 2^-9)."""
    import torch
    routes = []
    with torch.no_grad():
        forward(a, experts, swiglu_limit, route_outputs=routes)
        d = d_out.double()
        return sum((d[t] * y).abs().sum().item() for t, _, y in routes)


def backward(a, d_out, experts, swiglu_limit=None):
    """The float64 gradients of sum(d_out * forward(a)) by argument name
    (torch autograd through the same function, bf16 rounding of gate and up
    passed straight through, as moe.layer_grad defines it)."""
    import torch
    leaves = {n: v.double().requires_grad_(True) for n, v in a.items()
              if n != "top_experts"}
    args = dict(leaves, top_experts=a["top_experts"])
    with torch.enable_grad():
        out = forward(args, experts, swiglu_limit)
        (out * d_out.double()).sum().backward()
    return {n: v.grad for n, v in leaves.items()}
