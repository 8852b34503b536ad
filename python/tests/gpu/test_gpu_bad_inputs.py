# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Bad routing and bad values on the GPU: what each does, checked against
the float64 reference on fresh random inputs, outputs poisoned (NaN) before
every launch (docs/Reliability.md lists the behaviours).

- Expert ids outside [-1, E) (E + 7, -5, INT_MAX, INT_MIN): the kernels drop
  those routes (as if -1: no expert output, a zero router-weight gradient)
  and report them; the call, or check_errors(), raises MokRuntimeError with
  status MOK_ERROR_BAD_ROUTING naming the route.
- NaN or Inf in x or in the router weights: they reach the outputs of their
  own token only (and the weight gradients of the experts it was routed
  to), as in the reference; every other token's output is exact.
- Every route to one expert, every route -1, one route an expert and the
  rest on one: exact.
compute-sanitizer's memcheck runs the bad ids too (scripts/gpu/sanitize.sh,
its bad_routing: layers): no access outside the tensors.
"""

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES, TRAIN_CASES
from gpu_layers import forward_layer, fresh_seed, training_layer

REL_BOUND = 1e-2

# The SIMT plan, the wgmma plan (fused dispatch), a shared expert with int64
# ids, warp roles with the dispatch fused, clusters.
FORWARD = ["top2_no_route", "top1_clamp", "shared_clamp_i64", "wsf_short_k", "mc_top1_clamp"]
TRAINING = ["train_small_shared", "train_top1_clamp", "train_shared_tall"]


@pytest.fixture(autouse=True)
def _checks_restored():
    previous = mok.set_error_checks("deferred")
    yield
    mok.set_error_checks(previous)




def _bad_ids(c, args, gen):
    """args with ids outside [-1, E) at a few routes, and the same args with
    -1 there (what the kernels compute)."""
    import torch
    top = args["top_experts"].clone()
    T, k = top.shape
    E = c["experts"]
    wide = top.dtype == torch.int64
    bad = [E, E + 7, -5, -2, 2**31 - 1, -2**31] + ([2**40, -2**40] if wide else [])
    routes = torch.randperm(T * k, generator=gen)[:len(bad)].tolist()
    for q, v in zip(routes, bad):
        top[q // k, q % k] = v
    dropped = top.clone()
    dropped[(dropped < -1) | (dropped >= E)] = -1
    return dict(args, top_experts=top), dict(args, top_experts=dropped), routes


def _rel(got, ref):
    return torch_reference.relative_error(got, ref)


@pytest.mark.parametrize("name", FORWARD)
def test_out_of_range_expert_ids_are_dropped_and_reported(name):
    import torch
    c = CASES[name]
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args = torch_reference.make_inputs(c, gen)
    bad, dropped, routes = _bad_ids(c, args, gen)
    mok.set_error_checks("off")
    out = layer(**bad)
    with pytest.raises(mok.MokRuntimeError, match=r"top_experts: an expert id outside "
                       r"\[-1, E\) was routed \(id -?\d+ at route \d+: token \d+, slot \d+\)"
                       ) as info:
        layer.check_errors()
    assert info.value.status == "MOK_ERROR_BAD_ROUTING"
    torch.cuda.synchronize()
    ref = torch_reference.forward(dropped, c["experts"], c.get("swiglu_limit"))
    assert not torch.isnan(out).any(), f"{name}: NaN in the output (unwritten?)"
    assert _rel(out, ref) <= REL_BOUND
    # Taken: a second check finds nothing; good ids report nothing.
    layer.check_errors()
    layer(**args)
    layer.check_errors()
    # "sync" raises at the call itself, naming one of the bad routes.
    mok.set_error_checks("sync")
    with pytest.raises(mok.MokRuntimeError, match="MOK_ERROR_BAD_ROUTING|top_experts") as info:
        layer(**bad)
    assert info.value.status == "MOK_ERROR_BAD_ROUTING"
    assert any(f"at route {q}:" in str(info.value) for q in routes), str(info.value)
    # "deferred": the call, or the next one once the kernel has finished,
    # raises what it reported (the check does not wait for the GPU).
    mok.set_error_checks("deferred")
    with pytest.raises(mok.MokRuntimeError, match="an expert id outside"):
        layer(**bad)
        torch.cuda.synchronize()
        layer(**args)
    layer.check_errors()


@pytest.mark.parametrize("name", TRAINING)
def test_out_of_range_expert_ids_in_training(name):
    import torch
    c = TRAIN_CASES[name]
    layer = training_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args = torch_reference.make_inputs(c, gen)
    bad, dropped, _ = _bad_ids(c, args, gen)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    mok.set_error_checks("off")
    out, ctx = layer.forward(**bad)
    grads = layer.backward(ctx, d_out)
    with pytest.raises(mok.MokRuntimeError, match="an expert id outside") as info:
        layer.check_errors()
    assert info.value.status == "MOK_ERROR_BAD_ROUTING"
    torch.cuda.synchronize()
    swiglu_limit = c.get("swiglu_limit")
    assert _rel(out, torch_reference.forward(dropped, c["experts"], swiglu_limit)) <= REL_BOUND
    ref = torch_reference.backward(dropped, d_out, c["experts"], swiglu_limit)
    for n, r in ref.items():
        assert not torch.isnan(grads[n]).any(), f"{name}: NaN in d_{n}"
        assert _rel(grads[n], r) <= REL_BOUND, f"{name}: d_{n}"


def _nonfinite(c, args, gen):
    """args with NaN and Inf in x's rows and the router weights of a few
    tokens; those tokens."""
    import torch
    x = args["x"].clone()
    w = args["router_weights"].clone()
    T = x.shape[0]
    tokens = torch.randperm(T, generator=gen)[:min(4, T)].tolist()
    x[tokens[0], 3] = float("nan")
    if len(tokens) > 1:
        x[tokens[1], :] = float("inf")
    if len(tokens) > 2:
        w[tokens[2], 0] = float("nan")
    if len(tokens) > 3:
        w[tokens[3], -1] = float("-inf")
    return dict(args, x=x, router_weights=w), tokens


@pytest.mark.parametrize("name", ["top2_no_route", "top1_clamp", "shared_clamp_i64",
                                  "wsf_short_k"])
def test_nan_and_inf_stay_in_their_tokens(name):
    import torch
    c = CASES[name]
    if c["tokens"] < 8:
        pytest.skip("needs a few clean tokens")
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args, tokens = _nonfinite(c, torch_reference.make_inputs(c, gen), gen)
    out = layer(**args).double()
    layer.check_errors()  # NaN is not a routing error
    torch.cuda.synchronize()
    ref = torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))
    clean = torch.ones(c["tokens"], dtype=torch.bool)
    clean[tokens] = False
    # Rows of tokens without a non-finite value: exact, and finite.
    assert torch.isfinite(out[clean.cuda()]).all(), f"{name}: a clean token's row is not finite"
    assert _rel(out[clean.cuda()], ref[clean.cuda()]) <= REL_BOUND
    # A token whose x row is NaN gives NaN where the reference does.
    assert torch.equal(torch.isnan(out[tokens[0]]), torch.isnan(ref[tokens[0]]))


def test_nan_in_training_stays_in_its_token_for_d_x():
    import torch
    name = "train_small_shared"
    c = TRAIN_CASES[name]
    layer = training_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args, tokens = _nonfinite(c, torch_reference.make_inputs(c, gen), gen)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    out, ctx = layer.forward(**args)
    grads = layer.backward(ctx, d_out)
    layer.check_errors()
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    clean = torch.ones(c["tokens"], dtype=torch.bool, device="cuda")
    clean[tokens] = False
    # d_x of a clean token reads the weights and its own rows only.
    assert torch.isfinite(grads["x"][clean]).all()
    assert _rel(grads["x"][clean], ref["x"][clean]) <= REL_BOUND


def _routing(c, pattern, gen):
    import torch
    T, k, E = c["tokens"], c["top_k"], c["experts"]
    if pattern == "all_to_one":
        top = torch.stack([torch.arange(k) for _ in range(T)])  # experts 0..k-1
        if k == 1:
            top[:] = E - 1
    elif pattern == "all_dropped":
        top = torch.full((T, k), -1)
    else:  # "one_each": the first tokens take every expert once, the rest 0..k-1
        top = torch.stack([torch.arange(k) for _ in range(T)])
        for t in range(min(T, (E + k - 1) // k)):
            top[t] = torch.tensor([(t * k + j) % E for j in range(k)])
    return top


@pytest.mark.parametrize("pattern", ["all_to_one", "all_dropped", "one_each"])
@pytest.mark.parametrize("name", ["top2_no_route", "top1_clamp", "shared_clamp_i64",
                                  "wsf_qwen3_top2_clamp"])
def test_extreme_routings_match_the_reference(name, pattern):
    import torch
    c = CASES[name]
    layer = forward_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args = torch_reference.make_inputs(c, gen)
    top = _routing(c, pattern, gen)
    args["top_experts"] = top.to(args["top_experts"].dtype).cuda()
    out = layer(**args)
    layer.check_errors()
    torch.cuda.synchronize()
    ref = torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))
    assert not torch.isnan(out).any()
    if pattern == "all_dropped" and not c.get("shared_intermediate"):
        assert not out.any(), "every route -1 without a shared expert: zeros"
    else:
        assert _rel(out, ref) <= REL_BOUND


@pytest.mark.parametrize("pattern", ["all_to_one", "all_dropped"])
def test_extreme_routings_in_training(pattern):
    import torch
    name = "train_shared_tall"
    c = TRAIN_CASES[name]
    layer = training_layer(name)
    gen = torch.Generator().manual_seed(fresh_seed())
    args = torch_reference.make_inputs(c, gen)
    args["top_experts"] = _routing(c, pattern, gen).to(args["top_experts"].dtype).cuda()
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    out, ctx = layer.forward(**args)
    grads = layer.backward(ctx, d_out)
    layer.check_errors()
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    for n, r in ref.items():
        assert not torch.isnan(grads[n]).any(), f"{pattern}: NaN in d_{n}"
        if r is None or r.abs().sum() == 0:  # no route: no gradient path
            assert not grads[n].any(), f"{pattern}: d_{n} should be zero"
        else:
            assert _rel(grads[n], r) <= REL_BOUND, f"{pattern}: d_{n}"
