# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The GPU training forward and backward against float64 autograd, on fresh
random inputs, with every output poisoned (NaN) before each launch; their
determinism, recompute against the saved context, and CUDA-graph capture of
forward + backward. Needs what test_gpu_forward.py needs; the training
cases are bench/cases.py's TRAIN_CASES (compiled by
`python3 -m bench.compile tests`).
"""
import os

import pytest

import mok
from bench import torch_reference
from bench.cases import MAIN_GRAD_CASES, TRAIN_CASES
from gpu_results import BACKWARD_RESULTS

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
REL_BOUND = 1e-2


def _layer(name, poison=True):
    directory = os.path.join(ARTIFACTS, name)
    if not os.path.exists(os.path.join(directory, "moe_layer_backward.ptx")):
        pytest.fail(f"{directory}/moe_layer_backward.ptx is missing: run "
                    "python3 -m bench.compile tests")
    return mok.GpuTrainingArtifact.from_files(directory).load(poison_outputs=poison)


def _problem(c, seed):
    import torch
    gen = torch.Generator().manual_seed(seed)
    args = torch_reference.make_inputs(c, gen)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    return args, d_out


def _fresh_seed():
    return int.from_bytes(os.urandom(4), "little")


def _rel(got, ref):
    return torch_reference.relative_error(got, ref)


def _check_grads(name, c, grads, ref, ms=0.0):
    import torch
    worst = 0.0
    for arg, r in ref.items():
        g = grads[arg]
        assert not torch.isnan(g).any(), f"{name}: NaN in the gradient of {arg} (unwritten?)"
        rel = _rel(g, r)
        worst = max(worst, rel)
        BACKWARD_RESULTS.append(dict(case=name, grad=arg, rel=rel,
                                     max=(g.double() - r).abs().max().item(), ms=ms))
        assert rel <= REL_BOUND, f"{name}: d_{arg}: relative error {rel:.3e} > {REL_BOUND}"
    return worst


@pytest.mark.parametrize("name", list(TRAIN_CASES))
def test_gradients_match_float64_autograd(name):
    import torch
    c = TRAIN_CASES[name]
    layer = _layer(name)
    assert layer.recomputes == bool(c.get("recompute"))
    args, d_out = _problem(c, _fresh_seed())
    out, ctx = layer.forward(**args)
    assert set(ctx.saved) == set(layer.saved_names)
    assert bool(ctx.saved) != layer.recomputes
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    grads = layer.backward(ctx, d_out)
    end.record()
    torch.cuda.synchronize()
    # The training forward's output, too.
    ref_out = torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))
    assert _rel(out, ref_out) <= REL_BOUND
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    assert set(grads) == set(ref)
    _check_grads(name, c, grads, ref, start.elapsed_time(end))


@pytest.mark.parametrize("name", ["train_top2_no_route", "train_shared_clamp_i64",
                                  "train_shared_tall", "train_qwen3_ragged"])
def test_gradients_are_bitwise_reproducible(name):
    """Two forwards and backwards on the same inputs give the same bits (no
    atomics: every element is one fixed-order sum)."""
    import torch
    c = TRAIN_CASES[name]
    layer = _layer(name)
    args, d_out = _problem(c, 7)
    first = layer.backward(layer.forward(**args)[1], d_out)
    first = {n: t.clone() for n, t in first.items()}
    second = layer.backward(layer.forward(**args)[1], d_out)
    torch.cuda.synchronize()
    for n in first:
        assert torch.equal(first[n], second[n]), f"{name}: d_{n} differs between runs"


@pytest.mark.parametrize("case", ["top2_no_route", "shared_clamp_i64", "qwen3_top2_clamp"])
def test_recompute_and_saved_context_agree_bitwise(case):
    """Recompute replays the training forward's gate/up GEMMs exactly: the
    gradients are the same bits as from the saved context."""
    import torch
    saved, recompute = _layer("train_" + case), _layer("recompute_" + case)
    assert not saved.recomputes and recompute.recomputes
    c = TRAIN_CASES["train_" + case]
    args, d_out = _problem(c, 11)
    g_saved = saved.backward(saved.forward(**args)[1], d_out)
    g_rec = recompute.backward(recompute.forward(**args)[1], d_out)
    torch.cuda.synchronize()
    for n in g_saved:
        assert torch.equal(g_saved[n], g_rec[n]), f"{case}: d_{n} differs"


@pytest.mark.parametrize("name", ["train_shared_clamp_i64", "train_shared_tall"])
def test_context_round_trips_through_tensors(name):
    """ctx.tensors() -> context_from_tensors: the same gradients (what
    save_for_backward and activation checkpointing do with it)."""
    import torch
    layer = _layer(name)
    args, d_out = _problem(TRAIN_CASES[name], 3)
    _, ctx = layer.forward(**args)
    rebuilt = layer.context_from_tensors([t.clone() for t in ctx.tensors()])
    a, b = layer.backward(ctx, d_out), layer.backward(rebuilt, d_out)
    for n in a:
        assert torch.equal(a[n], b[n])


@pytest.mark.parametrize("name", ["train_shared_tall", "train_qwen3_ragged",
                                  "recompute_qwen3_top2_clamp"])
def test_weight_views_give_the_dense_bits(name):
    """The routed weights bound as views (GpuTrainingLayer.bind_fc1: the
    gate and up halves of one fused FC1 [E, 2I, H] tensor; down_weights a
    view with a padded row stride, or one tensor per expert) in both
    kernels: the output, the context and every gradient are the bits of
    the same layer called with dense weights."""
    import torch
    c = TRAIN_CASES[name]
    dense, views = _layer(name), _layer(name)
    args, d_out = _problem(c, 5)
    out, ctx = dense.forward(**args)
    grads = dense.backward(ctx, d_out)
    gate, up, down = (args.pop(n) for n in ("gate_weights", "up_weights", "down_weights"))
    views.bind_fc1(torch.cat([gate, up], dim=1))
    if name == "train_qwen3_ragged":
        views.bind_weights("down_weights", [d.clone() for d in down])
    else:
        padded = torch.zeros(*down.shape[:2], down.shape[2] + 64, dtype=down.dtype,
                             device=down.device)
        padded[:, :, :down.shape[2]] = down
        views.bind_weights("down_weights", padded[:, :, :down.shape[2]])
    v_out, v_ctx = views.forward(**args)
    assert v_ctx.views == ("gate_weights", "up_weights", "down_weights")
    v_grads = views.backward(v_ctx, d_out)
    torch.cuda.synchronize()

    def bits(t):  # (the context's padding rows are unwritten: NaN, the poison)
        return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)

    assert torch.equal(bits(out), bits(v_out)), f"{name}: the output differs with views"
    for n in ctx.saved:
        assert torch.equal(bits(ctx.saved[n]), bits(v_ctx.saved[n])), f"{name}: saved {n} differs"
    assert set(grads) == set(v_grads)
    for n in grads:
        assert not torch.isnan(v_grads[n]).any(), f"{name}: NaN in d_{n} with views"
        assert torch.equal(bits(grads[n]), bits(v_grads[n])), f"{name}: d_{n} differs with views"


def test_weight_views_refused_by_scalar_training_kernels():
    import torch
    c = TRAIN_CASES["train_top2_no_route"]
    layer = _layer("train_top2_no_route")
    shape = (c["experts"], c["intermediate"], c["hidden"])
    with pytest.raises(mok.MokRuntimeError, match="'gate_weights'.*scalar GEMM path"):
        layer.bind_weights("gate_weights", torch.zeros(shape, dtype=torch.bfloat16,
                                                       device=layer.device))
    assert layer.bound_weights == ()


@pytest.mark.parametrize("name", list(MAIN_GRAD_CASES))
def test_main_grads_accumulate_the_weight_gradients(name):
    """main_grads=True: the backward kernel adds each weight's unrounded
    fp32 gradient into the main_grad passed (main_grad += dW, Megatron's
    gradient accumulation): main_grad - its old value is float64 autograd's
    dW within 1e-2; the same call from the same main_grads gives the same
    bits; x's and router_weights' gradients are returned as before."""
    import torch
    c = MAIN_GRAD_CASES[name]
    layer = _layer(name)
    assert layer.main_grads
    args, d_out = _problem(c, _fresh_seed())
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    weights = [n for n in ref if n.endswith("_weights") and n != "router_weights"]
    gen = torch.Generator().manual_seed(9)
    before = {n: (torch.randn(ref[n].shape, generator=gen) * ref[n].abs().mean().item())
              .float().cuda() for n in weights}
    results = []
    for _ in range(2):
        main = {n: t.clone() for n, t in before.items()}
        out, ctx = layer.forward(**args)
        grads = layer.backward(ctx, d_out, main_grads=main)
        torch.cuda.synchronize()
        results.append((main, grads))
        assert set(grads) == {"x", "router_weights"}
    (main, grads), (again, grads2) = results
    for n in weights:
        assert not torch.isnan(main[n]).any(), f"{name}: NaN in main_grad of {n}"
        dw = main[n].double() - before[n].double()
        rel = _rel(dw, ref[n])
        BACKWARD_RESULTS.append(dict(case=name, grad=n + " (main_grad)", rel=rel,
                                     max=(dw - ref[n]).abs().max().item(), ms=0.0))
        assert rel <= REL_BOUND, f"{name}: main_grad of {n}: relative error {rel:.3e}"
        assert torch.equal(main[n], again[n]), f"{name}: main_grad of {n} differs between runs"
    _check_grads(name, c, grads, {n: ref[n] for n in ("x", "router_weights")})
    for n in grads:
        assert torch.equal(grads[n], grads2[n])
    with pytest.raises(TypeError, match="main_grads: this layer adds the weights' gradients"):
        layer.backward(ctx, d_out)


def _capture_step(layer, static, d_out):
    """A CUDA graph of one training step on `static` and `d_out`, after an
    eager warm-up step (module loads): (graph, out, gradients), the last two
    the graph's own buffers."""
    import torch
    layer.backward(layer.forward(**static)[1], d_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, ctx = layer.forward(**static)
        grads = layer.backward(ctx, d_out)
    return graph, out, grads


def _poisoned_replay(graph, out, grads):
    """NaN into the graph's outputs, then a replay."""
    import torch
    for t in list(grads.values()) + [out]:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()


def test_cuda_graph_capture_of_forward_and_backward():
    """One graph holds forward + backward; replayed on new inputs copied into
    the captured buffers, its gradients match the reference."""
    name = "train_top1_clamp"
    c = TRAIN_CASES[name]
    layer = _layer(name)
    static, d_out = _problem(c, 1)
    graph, out, grads = _capture_step(layer, static, d_out)
    for seed in (2, 3):
        fresh, fresh_d = _problem(c, seed)
        for k, v in fresh.items():
            static[k].copy_(v)
        d_out.copy_(fresh_d)
        _poisoned_replay(graph, out, grads)
        ref = torch_reference.backward(static, d_out, c["experts"], c.get("swiglu_limit"))
        _check_grads(f"graph_{name}_{seed}", c, grads, ref)


def test_cuda_graph_replay_after_eager_calls_on_other_buffers():
    """The tensor-core kernels read their operands through tensor maps
    rebuilt when the buffers change: an eager step on new buffers between
    the capture and the replay must not change what the graph computes."""
    import torch
    name = "train_top1_clamp"
    c = TRAIN_CASES[name]
    layer = _layer(name)
    static, d_out = _problem(c, 21)
    graph, out, grads = _capture_step(layer, static, d_out)
    other, other_d = _problem(c, 22)  # new buffers: new maps
    eager = layer.backward(layer.forward(**other)[1], other_d)
    _poisoned_replay(graph, out, grads)
    ref = torch_reference.backward(static, d_out, c["experts"], c.get("swiglu_limit"))
    _check_grads(f"graph_after_eager_{name}", c, grads, ref)
    # And the eager layer still computes its own inputs' gradients.
    eager_again = layer.backward(layer.forward(**other)[1], other_d)
    torch.cuda.synchronize()
    for n in eager:
        assert torch.equal(eager[n], eager_again[n]), n


def test_backward_argument_errors():
    name = "train_top2_no_route"
    layer = _layer(name)
    args, d_out = _problem(TRAIN_CASES[name], 5)
    out, ctx = layer.forward(**args)
    with pytest.raises(TypeError, match="ctx: expected a mok.Context"):
        layer.backward(ctx.tensors(), d_out)
    with pytest.raises(TypeError, match="d_out: expected dtype torch.bfloat16"):
        layer.backward(ctx, d_out.float())
    with pytest.raises(ValueError, match=r"d_out: expected shape \[200, 512\]"):
        layer.backward(ctx, d_out[:10])
    broken = mok.Context(ctx.inputs, {k: v for k, v in ctx.saved.items() if k != "gate"},
                         ctx.tokens)
    with pytest.raises(ValueError, match="the saved tensor.*'gate'.*missing"):
        layer.backward(broken, d_out)
    bad = mok.Context(ctx.inputs, dict(ctx.saved, hidden=ctx.saved["hidden"][:5]), ctx.tokens)
    with pytest.raises(ValueError, match="hidden: expected shape"):
        layer.backward(bad, d_out)
    with pytest.raises(ValueError, match="tensors: expected"):
        layer.context_from_tensors(ctx.tensors()[:3])
    with pytest.raises(ValueError, match="d_x: overlaps the input d_out"):
        layer.backward(ctx, d_out, outputs={"d_x": d_out})


def test_main_grads_off_8_byte_boundaries_add_the_same_bits():
    """main_grads that are views 4 bytes off an 8-byte boundary (a flat fp32
    buffer at odd element offsets, as a flat gradient buffer may hold them)
    take the kernel's two 4-byte reductions a pair instead of one 8-byte
    one: the sums are the aligned call's bit for bit, and the element
    before the views is left alone."""
    import torch
    name = "maingrad_qwen3_ragged"
    c = MAIN_GRAD_CASES[name]
    layer = _layer(name)
    args, d_out = _problem(c, _fresh_seed())
    ref = torch_reference.backward(args, d_out, c["experts"], c.get("swiglu_limit"))
    weights = [n for n in ref if n.endswith("_weights") and n != "router_weights"]
    gen = torch.Generator().manual_seed(11)
    before = {n: torch.randn(ref[n].shape, generator=gen).float().cuda() for n in weights}
    aligned = {n: t.clone() for n, t in before.items()}
    flat = torch.full((1 + sum(t.numel() for t in before.values()),), float("nan"),
                      device="cuda")
    views, at = {}, 1
    for n, t in before.items():
        views[n] = flat[at:at + t.numel()].view(t.shape)
        views[n].copy_(t)
        at += t.numel()
    assert all(v.data_ptr() % 8 == 4 for v in views.values())
    for main in (aligned, views):
        _, ctx = layer.forward(**args)
        layer.backward(ctx, d_out, main_grads=main)
    torch.cuda.synchronize()
    assert torch.isnan(flat[0])
    for n in weights:
        assert not torch.equal(aligned[n], before[n]), f"{name}: main_grad of {n} unchanged"
        assert torch.equal(views[n], aligned[n]), f"{name}: main_grad of {n} differs"
