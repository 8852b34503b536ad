# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""GPU layers compiled for any token count (LayerSpec(tokens=None,
max_tokens=C)): every case of bench/cases.py again as one layer run at
several T (1, 67, the case's own T and the capacity C), forward and training,
against float64 on fresh random inputs with every output poisoned (NaN)
first; T past the capacity refused by name, T = 0 answered without a launch,
and a CUDA graph captured for one T. The cases are bench/cases.py's
ANY_TOKENS_CASES, compiled by `python3 -m bench.compile tests`.
"""

import pytest

from bench import torch_reference
from bench.cases import ANY_TOKENS_CASES, call_tokens
from gpu_layers import forward_layer, fresh_seed, training_layer
from gpu_results import BACKWARD_RESULTS, RESULTS

REL_BOUND = 1e-2
# d_router_weights of at most this many routes is measured against the
# size of its terms (router_weights_grad_terms), not its own size.
SMALL_ROUTES = 16

FORWARD = [n for n, c in ANY_TOKENS_CASES.items() if not c.get("training")]
TRAINING = [n for n, c in ANY_TOKENS_CASES.items() if c.get("training")]




def _check_out(name, c, tokens, out, ref):
    import torch
    assert list(out.shape) == [tokens, c["hidden"]]
    assert not torch.isnan(out).any(), f"{name} T={tokens}: NaN in the output (unwritten?)"
    rel = torch_reference.relative_error(out, ref)
    RESULTS.append(dict(case=f"{name}@{tokens}", T=tokens, H=c["hidden"],
                        I=c["intermediate"], E=c["experts"], k=c["top_k"], rel=rel,
                        max=(out.double() - ref).abs().max().item(), ms=0.0))
    assert rel <= REL_BOUND, f"{name} T={tokens}: relative error {rel:.3e} > {REL_BOUND}"


@pytest.mark.parametrize("name", FORWARD)
def test_forward_at_every_token_count(name):
    import torch
    c = ANY_TOKENS_CASES[name]
    layer = forward_layer(name)
    assert layer.any_tokens and layer.max_tokens == c["max_tokens"]
    gen = torch.Generator().manual_seed(fresh_seed())
    # Largest first, then smaller: rows a larger call left in the workspace
    # must not leak into a smaller one.
    for tokens in reversed(call_tokens(c)):
        args = torch_reference.make_inputs(c, gen, tokens=tokens)
        out = layer(**args)
        torch.cuda.synchronize()
        _check_out(name, c, tokens, out,
                   torch_reference.forward(args, c["experts"], c.get("swiglu_limit")))


@pytest.mark.parametrize("name", TRAINING)
def test_training_at_every_token_count(name):
    import torch
    c = ANY_TOKENS_CASES[name]
    layer = training_layer(name)
    assert layer.any_tokens and layer.max_tokens == c["max_tokens"]
    gen = torch.Generator().manual_seed(fresh_seed())
    for tokens in reversed(call_tokens(c)):
        args = torch_reference.make_inputs(c, gen, tokens=tokens)
        d_out = torch.randn(tokens, c["hidden"], generator=gen).to(torch.bfloat16).cuda()
        main_grads = None
        if c.get("main_grads"):
            main_grads = {n: torch.randn(args[n].shape, generator=gen).cuda()
                          for n in args if n.endswith("_weights") and n != "router_weights"}
            before = {n: g.clone() for n, g in main_grads.items()}
        out, ctx = layer.forward(**args)
        grads = layer.backward(ctx, d_out, main_grads=main_grads)
        torch.cuda.synchronize()
        _check_out(name, c, tokens, out,
                   torch_reference.forward(args, c["experts"], c.get("swiglu_limit")))
        ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
        if main_grads is not None:  # main_grad += dW: compare the increments
            for n in main_grads:
                grads[n] = main_grads[n] - before[n]
        for arg, r in ref.items():
            g = grads[arg]
            assert not torch.isnan(g).any(), f"{name} T={tokens}: NaN in d_{arg}"
            rel = torch_reference.relative_error(g, r)
            if arg == "router_weights" and tokens * c["top_k"] <= SMALL_ROUTES:
                # A few dot products, each free to cancel: against the
                # size of their terms (torch_reference says why).
                terms = torch_reference.router_weights_grad_terms(
                    args, d_out, c["experts"], c.get("swiglu_limit"))
                rel = ((g.double() - r).abs().sum().item() / terms) if terms else rel
            BACKWARD_RESULTS.append(dict(case=f"{name}@{tokens}", grad=arg, rel=rel,
                                         max=(g.double() - r).abs().max().item(), ms=0.0))
            assert rel <= REL_BOUND, (f"{name} T={tokens}: d_{arg}: relative error "
                                      f"{rel:.3e} > {REL_BOUND}")


@pytest.mark.parametrize("name", ["anyt_small_shared", "anyt_qwen3_ragged"])
def test_tokens_past_the_capacity_are_refused(name):
    import torch
    c = ANY_TOKENS_CASES[name]
    layer = forward_layer(name)
    args = torch_reference.make_inputs(c, torch.Generator().manual_seed(1),
                                       tokens=c["max_tokens"] + 1)
    with pytest.raises(ValueError, match=rf"x: {c['max_tokens'] + 1} tokens, more than "
                                         rf"this layer's capacity max_tokens = "
                                         rf"{c['max_tokens']}"):
        layer(**args)


@pytest.mark.parametrize("name", ["anyt_small_shared", "anyt_train_shared_tall"])
def test_zero_tokens_launch_nothing(name):
    import torch
    c = ANY_TOKENS_CASES[name]
    args = torch_reference.make_inputs(c, torch.Generator().manual_seed(2), tokens=0)
    if c.get("training"):
        layer = training_layer(name)
        out, ctx = layer.forward(**args)
        grads = layer.backward(ctx, torch.empty(0, c["hidden"], dtype=torch.bfloat16,
                                                device="cuda"))
        assert list(grads["x"].shape) == [0, c["hidden"]]
        for n, g in grads.items():
            if n.endswith("_weights") and n != "router_weights":
                assert torch.count_nonzero(g) == 0, f"d_{n}: a gradient of no tokens is 0"
    else:
        layer = forward_layer(name)
        out = layer(**args)
    assert list(out.shape) == [0, c["hidden"]]


def test_cuda_graph_of_one_token_count():
    import torch
    name = "anyt_top1_clamp"
    c = ANY_TOKENS_CASES[name]
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args = torch_reference.make_inputs(c, gen, tokens=67)
    static = {n: t.clone() for n, t in args.items()}
    out = torch.empty(67, c["hidden"], dtype=torch.bfloat16, device="cuda")
    layer(**static, out=out)  # load, maps for T = 67
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(**static, out=out)
    # Another T between captures and replays: the replay keeps its own.
    layer(**torch_reference.make_inputs(c, gen, tokens=c["max_tokens"]))
    for _ in range(2):
        fresh = torch_reference.make_inputs(c, gen, tokens=67)
        for n in static:
            static[n].copy_(fresh[n])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_out(name, c, 67, out,
                   torch_reference.forward(static, c["experts"], c.get("swiglu_limit")))
