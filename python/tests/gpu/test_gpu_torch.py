# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.torch on the GPU: the module's gradients through torch autograd
against float64 autograd, Megatron's main_grad accumulation, the context
through save_for_backward, recompute. Uses the training artifacts of
bench/cases.py (compiled by `python3 -m bench.compile tests`), so it needs no
compiler here."""
import os

import pytest

import mok
from bench import torch_reference
from bench.cases import MAIN_GRAD_CASES, TRAIN_CASES, spec_kwargs

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
REL_BOUND = 1e-2


def _module(name, **kwargs):
    import mok.torch
    c = TRAIN_CASES[name] if name in TRAIN_CASES else MAIN_GRAD_CASES[name]
    art = mok.GpuTrainingArtifact.from_files(os.path.join(ARTIFACTS, name))
    return c, mok.torch.MoELayer(mok.LayerSpec(**spec_kwargs(c)), target="sm_90a",
                                 artifact=art, recompute=art.recompute, **kwargs)


def _problem(c, moe, seed):
    import torch
    gen = torch.Generator().manual_seed(seed)
    args = torch_reference.make_inputs(c, gen)
    with torch.no_grad():
        for n, p in moe.named_parameters():
            p.copy_(args[n])
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    return args, d_out


def _run(moe, args, d_out):
    x = args["x"].clone().requires_grad_(True)
    rw = args["router_weights"].clone().requires_grad_(True)
    out = moe(x, args["top_experts"], rw)
    out.backward(d_out)
    return out, x.grad, rw.grad


@pytest.mark.parametrize("name", ["train_shared_clamp_i64", "recompute_top2_no_route",
                                  "train_shared_tall"])
def test_module_gradients_match_float64_autograd(name):
    import torch
    c, moe = _module(name)
    args, d_out = _problem(c, moe, int.from_bytes(os.urandom(4), "little"))
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        out, dx, drw = _run(moe, args, d_out)
    torch.cuda.synchronize()
    # Every context tensor went through save_for_backward.
    assert len(seen) == len(moe.layer.arg_names) + len(moe.layer.saved_names)
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    got = dict(x=dx, router_weights=drw)
    got.update((n, p.grad) for n, p in moe.named_parameters())
    assert set(got) == set(ref)
    for n, r in ref.items():
        rel = torch_reference.relative_error(got[n], r)
        assert rel <= REL_BOUND, f"{name}: d_{n}: relative error {rel:.3e}"
    with torch.no_grad():
        inference = moe(args["x"], args["top_experts"], args["router_weights"])
    assert torch_reference.relative_error(
        inference, torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))) <= REL_BOUND


def test_main_grad_accumulates_exactly():
    """main_grad += dW (fp32) over two micro-batches; the weights' .grad is
    zero; the sums are those of the plain module's bf16 gradients."""
    import torch
    name = "train_top2_no_route"
    c, plain = _module(name)
    _, acc = _module(name, accumulate_main_grad=True)
    args, d_out = _problem(c, plain, 4)
    _problem(c, acc, 4)
    for p in acc.parameters():
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
    _run(plain, args, d_out)
    expected = {n: p.grad.float() for n, p in plain.named_parameters()}
    _run(acc, args, d_out)
    _run(acc, args, d_out)
    torch.cuda.synchronize()
    for n, p in acc.named_parameters():
        assert torch.equal(p.main_grad, expected[n] + expected[n]), n
        assert p.grad_added_to_main_grad and not p.grad.any()


def test_modules_sharing_a_layer_interleave_exactly():
    """Two modules of one spec share one loaded layer (and its workspace):
    both forwards, then one backward through both (autograd runs the second
    module's backward first), give the bits of two modules with layers of
    their own; the contexts stay each module's."""
    import torch
    name = "train_shared_tall"
    (c, a), (_, b) = _module(name), _module(name)
    (_, a_own), (_, b_own) = (_module(name, share_layer=False) for _ in range(2))
    assert a.layer is b.layer and a_own.layer is not a.layer and b_own.layer is not a_own.layer
    args_a, d_a = _problem(c, a, 21)
    args_b, d_b = _problem(c, b, 22)
    _problem(c, a_own, 21)
    _problem(c, b_own, 22)

    def step(first, second):
        xa = args_a["x"].clone().requires_grad_(True)
        xb = args_b["x"].clone().requires_grad_(True)
        out_a = first(xa, args_a["top_experts"], args_a["router_weights"])
        out_b = second(xb, args_b["top_experts"], args_b["router_weights"])
        torch.autograd.backward([out_a, out_b], [d_a, d_b])
        grads = [xa.grad, xb.grad] + [p.grad for m in (first, second) for p in m.parameters()]
        return [out_a, out_b] + grads

    shared, own = step(a, b), step(a_own, b_own)
    torch.cuda.synchronize()
    assert len(shared) == len(own)
    for i, (s, o) in enumerate(zip(shared, own)):
        assert not torch.isnan(s).any(), f"NaN in result {i}"
        assert torch.equal(s, o), f"result {i} differs between shared and own layers"


def test_main_grad_added_by_the_kernel():
    """A module over a main_grads=True layer: the backward kernel adds the
    unrounded fp32 dW into every weight's main_grad (float64 autograd's dW
    within 1e-2 of what was added), the weights' .grad is a zero
    placeholder, and x's gradient is as without main_grad."""
    import torch
    name = "maingrad_shared_tall"
    c, moe = _module(name, accumulate_main_grad=True)
    assert moe.layer.main_grads
    args, d_out = _problem(c, moe, 6)
    for p in moe.parameters():
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
    _, dx, _ = _run(moe, args, d_out)
    torch.cuda.synchronize()
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    for n, p in moe.named_parameters():
        rel = torch_reference.relative_error(p.main_grad, ref[n])
        assert rel <= REL_BOUND, f"main_grad of {n}: relative error {rel:.3e}"
        assert p.grad is not None and not p.grad.any()
        assert p.grad_added_to_main_grad
    assert torch_reference.relative_error(dx, ref["x"]) <= REL_BOUND
    with pytest.raises(ValueError, match="needs accumulate_main_grad=True"):
        _module(name)


def test_no_grad_runs_the_inference_artifact():
    """With inference_artifact, a forward under torch.no_grad() runs that
    kernel (the float64 reference within 1e-2, no NaN: the output is
    poisoned first); with gradients on, the training forward; both agree."""
    import torch
    name = "train_top2_no_route"
    c = TRAIN_CASES[name]
    inference = mok.GpuArtifact.from_files(os.path.join(ARTIFACTS, name[len("train_"):],
                                                        "moe_layer"))
    c, moe = _module(name, inference_artifact=inference)
    assert moe._infer is not None and moe._infer is not moe.layer
    args, d_out = _problem(c, moe, int.from_bytes(os.urandom(4), "little"))
    ran, infer = [], moe._infer
    out = torch.full((c["tokens"], c["hidden"]), float("nan"), dtype=torch.bfloat16,
                     device="cuda")

    def counting(**kw):
        ran.append(1)
        return infer(**kw, out=out)

    moe._infer = counting
    with torch.no_grad():
        got = moe(args["x"], args["top_experts"], args["router_weights"])
    torch.cuda.synchronize()
    assert ran == [1] and got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any()
    ref = torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))
    rel = torch_reference.relative_error(got, ref)
    assert rel <= REL_BOUND, f"inference output: relative error {rel:.3e}"
    trained = moe(args["x"], args["top_experts"], args["router_weights"])
    assert ran == [1]
    assert torch_reference.relative_error(trained.detach(), ref) <= REL_BOUND
