# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.torch under torch.compile on the GPU: MoELayer(target="sm_90a")
modules over the training artifacts of bench/cases.py (compiled by
`python3 -m bench.compile tests`, as test_gpu_torch.py uses them) in a
model compiled with fullgraph=True (a graph break raises), by aot_eager
and by Inductor: outputs, gradients and main_grad sums bit for bit the
eager module's, one compile for every T (T unbacked), T = 0 without a
launch, T above the layer's capacity refused by name, and
torch.library.opcheck on the ops over the GPU layer.

CASES lists the layers and the token counts each runs: a layer compiled
for one T runs that T and 0; a layer for any T (a case whose `tokens` is
None, the layer's `max_tokens` its capacity) runs its capacity, 64, 7, 1
and 0 through one compile."""
import os

import pytest

import mok
from bench import cases as bench_cases
from bench import torch_reference
from bench.cases import MAIN_GRAD_CASES, TRAIN_CASES, spec_kwargs

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
# A shared expert with a clamp and int64 ids; recompute with -1 routes;
# 128-row tiles with the backward kernel adding into main_grad. Each also
# as a layer for any T where bench/cases.py has one ("anyt_" + name in
# ANY_TOKENS_CASES).
FIXED = ["train_shared_clamp_i64", "recompute_top2_no_route", "maingrad_shared_tall"]
ANY_TOKENS = getattr(bench_cases, "ANY_TOKENS_CASES", {})
CASES = FIXED + [f"anyt_{n}" for n in FIXED if f"anyt_{n}" in ANY_TOKENS]
BACKENDS = ["aot_eager", "inductor"]


def _case(name):
    for table in (TRAIN_CASES, MAIN_GRAD_CASES, ANY_TOKENS):
        if name in table:
            return table[name]
    raise KeyError(name)


def _module(name):
    import mok.torch
    c = _case(name)
    art = mok.GpuTrainingArtifact.from_files(os.path.join(ARTIFACTS, name))
    moe = mok.torch.MoELayer(mok.LayerSpec(**spec_kwargs(c)), target="sm_90a", artifact=art,
                             recompute=art.recompute, accumulate_main_grad=art.main_grads,
                             share_layer=False)
    return c, moe


def _token_counts(c, moe):
    """The T a case runs, the first (the largest) compiled unbacked: its
    one T (and 0); for a layer for any T its capacity, the T of the case
    it comes from, 64, 7, 1 and 0."""
    if c.get("tokens") is not None:
        return [c["tokens"], 0]
    capacity = moe.layer.max_tokens
    some = {t for t in (c.get("fixed_tokens"), 64, 7, 1) if t is not None and t < capacity}
    return sorted({capacity} | some, reverse=True) + [0]


def _capacity(c, moe):
    return c["tokens"] if c.get("tokens") is not None else moe.layer.max_tokens


def _inputs(c, tokens, seed):
    """(x, top_experts, router_weights, weights by name, d_out) on the GPU."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    if tokens:
        args = torch_reference.make_inputs(c, gen, tokens=tokens)
    else:
        args = torch_reference.make_inputs(c, gen, tokens=1)
        ids = torch.int64 if c.get("expert_id_dtype") == "int64" else torch.int32
        args.update(x=args["x"][:0].clone(), router_weights=args["router_weights"][:0].clone(),
                    top_experts=torch.zeros(0, c["top_k"], dtype=ids, device="cuda"))
    d_out = torch.randn(tokens, c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    return args, d_out


def _residual(moe):
    """The model torch.compile gets: the layer and a residual."""
    import torch

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = moe

        def forward(self, x, top_experts, router_weights):
            return self.moe(x, top_experts, router_weights) + x

    return Residual()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from nothing; its graphs (which hold the modules
    and their loaded layers) go after it."""
    import gc
    import torch._dynamo
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()


def _step(run, moe, args, d_out, unbacked=False):
    """Forward and backward: [out, d_x, d_router_weights, each weight's
    .grad, each main_grad (set to 0.5 first)]."""
    from torch._dynamo.decorators import mark_unbacked
    x = args["x"].clone().requires_grad_(True)
    rw = args["router_weights"].clone().requires_grad_(True)
    top = args["top_experts"]
    if unbacked:
        for t in (x, top, rw):
            mark_unbacked(t, 0)
    params = list(moe.parameters())
    for p in params:
        p.grad = None
        if hasattr(p, "main_grad"):
            p.main_grad.fill_(0.5)
    out = run(x, top, rw)
    out.backward(d_out)
    return ([out.detach(), x.grad, rw.grad] + [p.grad for p in params]
            + [p.main_grad.clone() for p in params if hasattr(p, "main_grad")])


def _launches(moe):
    return moe.layer._forward._forwards, moe.layer._backward._forwards


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_compiled_module_is_eager_bitwise(name, backend):
    import torch
    from torch._dynamo.decorators import mark_unbacked
    from torch._dynamo.testing import CompileCounterWithBackend
    c, moe = _module(name)
    if moe.accumulate_main_grad:
        for p in moe.parameters():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
    model = _residual(moe)
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for i, tokens in enumerate(_token_counts(c, moe)):
        args, d_out = _inputs(c, tokens, 100 + tokens)
        if i == 0:
            with torch.no_grad():
                for n, p in moe.named_parameters():
                    p.copy_(args[n])
        before = _launches(moe)
        want = _step(model, moe, args, d_out)
        got = _step(compiled, moe, args, d_out, unbacked=i == 0)
        torch.cuda.synchronize()
        launched = tuple(b - a for a, b in zip(before, _launches(moe)))
        assert launched == ((0, 0) if tokens == 0 else (2, 2)), (tokens, launched)
        assert len(got) == len(want)
        for j, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape and not torch.isnan(g).any(), (tokens, j)
            assert torch.equal(g, w), f"T = {tokens}: result {j} differs from eager"
        inputs = [args["x"], args["top_experts"], args["router_weights"]]
        with torch.no_grad():
            want = model(*inputs)
            if i == 0:
                for t in inputs:
                    mark_unbacked(t, 0)
            got = compiled(*inputs)
        assert torch.equal(got, want), f"T = {tokens}: no_grad output differs"
    # One compile for training and one for no_grad, whatever T.
    assert counter.frame_count == 2, counter.frame_count
    capacity = _capacity(c, moe)
    args, _ = _inputs(c, capacity + 1, 7)
    for run in (model, compiled):
        with pytest.raises(ValueError, match=rf"x: {capacity + 1} tokens \(x of shape "
                                             rf"\[{capacity + 1}, {c['hidden']}\]\) exceed "
                                             rf"the layer's capacity of {capacity} tokens"):
            run(args["x"], args["top_experts"], args["router_weights"])


@pytest.mark.parametrize("name", CASES)
def test_opcheck(name):
    """torch.library.opcheck on the ops over the GPU layer: schema, autograd
    registration, the fake implementations against the kernels (the saved
    context included) and AOT dispatch with dynamic shapes."""
    import torch
    c, moe = _module(name)
    args, d_out = _inputs(c, _token_counts(c, moe)[0], 11)
    with torch.no_grad():
        for n, p in moe.named_parameters():
            p.copy_(args[n])
    lid = moe._layer_id
    x = args["x"].clone().requires_grad_(True)
    rw = args["router_weights"].clone().requires_grad_(True)
    top = args["top_experts"]
    weights = list(moe.parameters())
    main_grads = ([torch.zeros(w.shape, dtype=torch.float32, device=w.device) for w in weights]
                  if moe.accumulate_main_grad else [])
    # moe_forward's saved context holds rows no kernel writes (routed rows
    # past the experts' padded counts; never read by the backward), so two
    # calls differ there and AOT dispatch's eager-vs-traced comparison of
    # every output cannot hold: its outputs and gradients are compared bit
    # for bit under torch.compile by test_compiled_module_is_eager_bitwise.
    result = torch.library.opcheck(torch.ops.mok.moe_forward.default,
                                   (lid, x, top, rw, weights, main_grads),
                                   test_utils=("test_schema", "test_autograd_registration",
                                               "test_faketensor"))
    assert set(result.values()) == {"SUCCESS"}, result
    detached = [w.detach() for w in weights]
    outs = torch.ops.mok.moe_forward(lid, x.detach(), top, rw.detach(), detached, [])
    assert len(outs) == 1 + len(moe.layer.saved_names)
    tensors = [x.detach(), top, rw.detach(), *detached, *outs[1:]]
    if main_grads:
        backward = (torch.ops.mok.moe_backward_into.default, (lid, d_out, tensors, main_grads))
    else:
        backward = (torch.ops.mok.moe_backward.default, (lid, d_out, tensors))
    for op, op_args in (backward, (torch.ops.mok.moe_infer.default,
                                   (lid, x.detach(), top, rw.detach(), detached))):
        result = torch.library.opcheck(op, op_args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
