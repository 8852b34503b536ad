# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Expert parallelism on the one GPU (docs/ExpertParallel.md): each case of
bench/cases.py's EP_CASES runs as N layer instances in one process, a local
group (mok.Communicator.local_group: each rank's symmetric buffer a device
allocation, its peer table filled from the others'), launched concurrently
on N streams with each grid 1/N of the multiprocessors so that every rank's
CTAs are resident at once. The kernels run the real in-kernel exchange
(counts, rows and results stored into each other's buffers, epoch flags);
only the source of the peer addresses differs from NCCL's.

Each rank's output is checked bitwise against the ep = 1 layer over all E
experts (the case's "-ep1" twin) on the rank's tokens, and against float64
(relative error <= 1e-2), every output poisoned (NaN) first, on fresh random
inputs; calls repeat (new epochs) with other inputs; a receive capacity
exceeded is refused by name on every rank."""

import pytest

from bench import torch_reference
from bench.cases import EP_CASES, EP_TRAIN_CASES
from gpu_layers import forward_artifact, fresh_seed, training_artifact
from gpu_results import RESULTS

import mok

REL_BOUND = 1e-2


def _rank_tokens(c):
    return c.get("rank_tokens") or [c["tokens"]] * c["ep"]


def _group_inputs(c, gen):
    """The whole group's problem: one set of E experts' weights and every
    rank's tokens (its x, top_experts, router_weights), as make_inputs
    draws them for all the tokens at once, split by rank."""
    tokens = _rank_tokens(c)
    everything = torch_reference.make_inputs(c, gen, tokens=sum(tokens))
    ranks, start = [], 0
    for t in tokens:
        ranks.append({n: v[start:start + t] for n, v in everything.items()
                      if n in ("x", "top_experts", "router_weights")})
        start += t
    weights = {n: v for n, v in everything.items() if n.endswith("_weights")
               and n != "router_weights"}
    return ranks, weights


def _rank_args(c, rank, tokens_of_rank, weights):
    local = c["experts"] // c["ep"]
    args = dict(tokens_of_rank)
    for n, w in weights.items():
        args[n] = w[rank * local:(rank + 1) * local] if not n.startswith("shared") else w
    return args


def _concurrently(layers, call):
    """call(rank, layer) for every rank, each on a stream of its own,
    launched before any is waited for; the results in rank order."""
    import torch
    streams = [torch.cuda.Stream() for _ in layers]
    torch.cuda.synchronize()
    results = []
    for r, (layer, s) in enumerate(zip(layers, streams)):
        with torch.cuda.stream(s):
            results.append(call(r, layer))
    torch.cuda.synchronize()
    for layer, s in zip(layers, streams):
        with torch.cuda.stream(s):
            layer.check_errors()
    return results


def _run_group(layers, args):
    """Launches every rank's layer on a stream of its own (concurrent),
    then waits; the outputs, and each rank's report checked."""
    return _concurrently(layers, lambda r, layer: layer(**args[r]))


def _load_group(name, n):
    import torch
    art = forward_artifact(name)
    comms = mok.Communicator.local_group(n)
    layers = [art.load(comm=comm, poison_outputs=True) for comm in comms]
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for layer in layers:
        layer.set_grid(sms // n)
    return layers, comms


CHECKED = [n for n, c in EP_CASES.items() if not c.get("recv_capacity")]


@pytest.mark.parametrize("name", CHECKED)
def test_group_matches_ep1_and_float64(name):
    import torch
    c = EP_CASES[name]
    n = c["ep"]
    layers, comms = _load_group(name, n)
    reference = forward_artifact(name + "-ep1").load(poison_outputs=True)
    gen = torch.Generator().manual_seed(fresh_seed())
    for call in range(3):  # new inputs and a new epoch each call
        ranks, weights = _group_inputs(c, gen)
        args = [_rank_args(c, r, ranks[r], weights) for r in range(n)]
        outs = _run_group(layers, args)
        for r in range(n):
            full = dict(ranks[r], **weights)
            tokens = full["x"].shape[0]
            out = outs[r]
            assert list(out.shape) == [tokens, c["hidden"]]
            assert not torch.isnan(out).any(), f"{name} rank {r}: NaN (unwritten rows?)"
            ref64 = torch_reference.forward(full, c["experts"], c.get("swiglu_limit"))
            rel = torch_reference.relative_error(out, ref64)
            RESULTS.append(dict(case=f"{name}[{r}]#{call}", T=tokens, H=c["hidden"],
                                I=c["intermediate"], E=c["experts"], k=c["top_k"], rel=rel,
                                max=(out.double() - ref64).abs().max().item(), ms=0.0))
            assert rel <= REL_BOUND, f"{name} rank {r}: relative error {rel:.3e}"
            ep1 = reference(**full)
            torch.cuda.synchronize()
            assert torch.equal(out, ep1), (
                f"{name} rank {r}: differs from the ep = 1 layer (max "
                f"{(out.float() - ep1.float()).abs().max().item():.3e})")
    for layer in layers:
        assert layer.epoch == 3


def test_capacity_exceeded_is_refused_on_every_rank():
    import torch
    name = "ep2_capacity"
    c = EP_CASES[name]
    layers, comms = _load_group(name, c["ep"])
    gen = torch.Generator().manual_seed(fresh_seed())
    ranks, weights = _group_inputs(c, gen)  # every route to rank 0's experts
    args = [_rank_args(c, r, ranks[r], weights) for r in range(c["ep"])]
    streams = [torch.cuda.Stream() for _ in layers]
    torch.cuda.synchronize()
    outs = []
    for layer, s, a in zip(layers, streams, args):
        with torch.cuda.stream(s):
            outs.append(layer(**a))
    torch.cuda.synchronize()
    # No row was exchanged: every output element is NaN, not a stale row.
    assert all(torch.isnan(o).all() for o in outs)
    for layer, s in zip(layers, streams):
        with torch.cuda.stream(s), pytest.raises(mok.MokRuntimeError) as e:
            layer.check_errors()
        assert ("exceed the receive capacity recv_capacity = 40" in str(e.value)
                and "rank 0's experts" in str(e.value)), str(e.value)
    # The group goes on: a call within the capacity (routes spread over
    # both ranks' experts) is correct afterwards.
    spread = dict(c, used=list(range(c["experts"])), tokens=8)
    ranks, weights = _group_inputs(spread, gen)
    args = [_rank_args(c, r, dict(ranks[r], **{}), weights) for r in range(c["ep"])]
    for r in range(c["ep"]):
        for n_ in ("x", "top_experts", "router_weights"):
            pad = torch.zeros((c["tokens"] - 8,) + tuple(args[r][n_].shape[1:]),
                              dtype=args[r][n_].dtype, device=args[r][n_].device)
            if n_ == "top_experts":
                pad -= 1
            args[r][n_] = torch.cat([args[r][n_], pad])
    outs = _run_group(layers, args)
    for r in range(c["ep"]):
        full = {n_: v for n_, v in args[r].items() if n_ in ("x", "top_experts", "router_weights")}
        full.update(weights)
        ref64 = torch_reference.forward(full, c["experts"], c.get("swiglu_limit"))
        assert torch_reference.relative_error(outs[r], ref64) <= REL_BOUND


def test_zero_tokens_is_refused_by_name():
    import torch
    name = "ep4_any_tokens"
    c = EP_CASES[name]
    art = forward_artifact(name)
    comms = mok.Communicator.local_group(c["ep"])
    layer = art.load(comm=comms[0])
    gen = torch.Generator().manual_seed(fresh_seed())
    ranks, weights = _group_inputs(dict(c, rank_tokens=[0, 1, 1, 1]), gen)
    with pytest.raises(ValueError, match="one rank of an expert-parallel group"):
        layer(**_rank_args(c, 0, ranks[0], weights))


# Training: EP_TRAIN_CASES, forward then backward on every rank of a local
# group, against the ep = 1 training layer over all the ranks' tokens.

@pytest.mark.parametrize("name", list(EP_TRAIN_CASES))
def test_group_training_matches_ep1_and_float64(name):
    import torch
    c = EP_TRAIN_CASES[name]
    n, t, local = c["ep"], c["tokens"], c["experts"] // c["ep"]
    comms = mok.Communicator.local_group(n)
    art = training_artifact(name)
    layers = [art.load(poison_outputs=True, comm=comm) for comm in comms]
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for layer in layers:
        layer.set_grid(sms // n)
    reference = training_artifact(name + "-ep1").load(poison_outputs=True)
    gen = torch.Generator().manual_seed(fresh_seed())
    ranks, weights = _group_inputs(c, gen)
    args = [_rank_args(c, r, ranks[r], weights) for r in range(n)]
    d_outs = [torch.randn(t, c["hidden"], generator=gen).to(torch.bfloat16).cuda()
              for _ in range(n)]
    routed = ("gate_weights", "up_weights", "down_weights")
    main_grads = None
    if c.get("main_grads"):
        main_grads = [{w: torch.randn(args[r][w].shape, generator=gen).cuda()
                       for w in args[r] if w.endswith("_weights") and w != "router_weights"}
                      for r in range(n)]
        before = [{w: g.clone() for w, g in m.items()} for m in main_grads]
    fwd = _concurrently(layers, lambda r, layer: layer.forward(**args[r]))
    grads = _concurrently(
        layers, lambda r, layer: layer.backward(fwd[r][1], d_outs[r],
                                                main_grads=main_grads and main_grads[r]))
    if main_grads is not None:
        for r in range(n):
            for w in main_grads[r]:
                grads[r][w] = main_grads[r][w] - before[r][w]
    # The ep = 1 layer over every rank's tokens, concatenated in rank order.
    full = {k: torch.cat([ranks[r][k] for r in range(n)]) for k in ranks[0]}
    full.update(weights)
    d_full = torch.cat(d_outs)
    ref_main = None
    if main_grads is not None:
        ref_main = {w: torch.zeros(v.shape, device="cuda") for w, v in weights.items()}
    out1, ctx1 = reference.forward(**full)
    grads1 = reference.backward(ctx1, d_full, main_grads=ref_main)
    if ref_main is not None:
        grads1.update(ref_main)
    ref64 = torch_reference.backward(full, d_full, c["experts"], c.get("swiglu_limit"))
    out64 = torch_reference.forward(full, c["experts"], c.get("swiglu_limit"))
    torch.cuda.synchronize()
    rows = lambda r: slice(r * t, (r + 1) * t)
    experts = lambda r: slice(r * local, (r + 1) * local)
    for r in range(n):
        out = fwd[r][0]
        assert not torch.isnan(out).any(), f"{name} rank {r}: NaN in out"
        assert torch.equal(out, out1[rows(r)]), f"{name} rank {r}: out differs from ep = 1"
        assert torch_reference.relative_error(out, out64[rows(r)]) <= REL_BOUND
        for g, sl in (("x", rows(r)), ("router_weights", rows(r))):
            got, want = grads[r][g], grads1[g][sl]
            assert not torch.isnan(got).any(), f"{name} rank {r}: NaN in d_{g}"
            if main_grads is None or g in ("x", "router_weights"):
                assert torch.equal(got, want), f"{name} rank {r}: d_{g} differs from ep = 1"
            rel = torch_reference.relative_error(got, ref64[g][sl])
            assert rel <= REL_BOUND, f"{name} rank {r}: d_{g} relative error {rel:.3e}"
        for w in routed:
            got, want = grads[r][w], grads1[w][experts(r)]
            assert not torch.isnan(got).any(), f"{name} rank {r}: NaN in d_{w}"
            if main_grads is None:
                assert torch.equal(got, want), f"{name} rank {r}: d_{w} differs from ep = 1"
            rel = torch_reference.relative_error(got, ref64[w][experts(r)])
            assert rel <= REL_BOUND, f"{name} rank {r}: d_{w} relative error {rel:.3e}"
        if c.get("shared_intermediate"):
            # The shared expert's gradients are over the rank's own tokens.
            own = dict(ranks[r], **weights)
            own64 = torch_reference.backward(own, d_outs[r], c["experts"],
                                             c.get("swiglu_limit"))
            for w in ("shared_gate_weights", "shared_up_weights", "shared_down_weights"):
                rel = torch_reference.relative_error(grads[r][w], own64[w])
                assert rel <= REL_BOUND, f"{name} rank {r}: d_{w} relative error {rel:.3e}"


def test_group_replays_cuda_graphs():
    """The kernels count their launches on the device (the epoch), so each
    rank's call captured into a CUDA graph replays as a new step: the
    graphs of all ranks replayed together, with new inputs copied into the
    captured tensors each time, match the ep = 1 layer."""
    import torch
    name = "ep4_shared"
    c = EP_CASES[name]
    n = c["ep"]
    layers, comms = _load_group(name, n)
    reference = forward_artifact(name + "-ep1").load()
    gen = torch.Generator().manual_seed(fresh_seed())
    ranks, weights = _group_inputs(c, gen)
    args = [_rank_args(c, r, ranks[r], weights) for r in range(n)]
    _run_group(layers, args)  # warm: maps built, kernels loaded
    streams = [torch.cuda.Stream() for _ in layers]
    graphs, outs = [], []
    torch.cuda.synchronize()
    for r, (layer, s) in enumerate(zip(layers, streams)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            outs.append(layer(**args[r]))
        graphs.append(g)
    for step in range(3):
        ranks, _ = _group_inputs(c, gen)
        for r in range(n):
            for k in ("x", "top_experts", "router_weights"):
                args[r][k].copy_(ranks[r][k])
        torch.cuda.synchronize()
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()
        torch.cuda.synchronize()
        for r in range(n):
            want = reference(**dict(ranks[r], **weights))
            torch.cuda.synchronize()
            assert torch.equal(outs[r], want), f"replay {step}, rank {r}: differs from ep = 1"
