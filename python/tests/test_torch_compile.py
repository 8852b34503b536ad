# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.torch under torch.compile (CPU target): MoELayer's custom ops
(mok::moe_forward, moe_backward, moe_backward_into, moe_infer) traced with
fullgraph=True (no graph break), outputs and gradients bitwise the eager
module's at every token count (0 and 1 included), one compile for every T
once T is dynamic, the ops through torch.library.opcheck, T = 0 without a
layer call and T above a layer's capacity refused by name. The GPU
branch of the ops runs here over a stand-in for a loaded GPU training
layer (the CPU layer's arithmetic behind GpuTrainingLayer's torch API);
python/tests/gpu/test_gpu_torch_compile.py runs the real one. Skipped
where torch is not installed."""
import dataclasses
import gc
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch._dynamo  # noqa: E402
from torch._dynamo.decorators import mark_unbacked  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import mok  # noqa: E402
import mok.torch  # noqa: E402
from cpu_results import seed_for  # noqa: E402

SPEC = mok.LayerSpec(hidden=32, intermediate=16, experts=6, top_k=3, shared_intermediate=8,
                     swiglu_limit=1.0, padding=8)
WEIGHTS = ("gate_weights", "up_weights", "down_weights", "shared_gate_weights",
           "shared_up_weights", "shared_down_weights")
# 0 and 1 among them: torch specializes sizes 0 and 1 unless T is unbacked.
TOKEN_COUNTS = (29, 1, 0, 7, 64, 13)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from nothing, and its compiled graphs (which hold
    the modules) are dropped after it."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()


class Block(torch.nn.Module):
    """A model around the MoE layer: a bf16 projection, a float32 top-k
    router whose small weights become -1 routes, the layer, a residual."""

    def __init__(self, moe):
        super().__init__()
        torch.manual_seed(seed_for("compile-block"))
        h, e = moe.spec.hidden, moe.spec.experts
        self.proj = torch.nn.Linear(h, h, dtype=torch.bfloat16, device=moe.gate_weights.device)
        self.router = torch.nn.Linear(h, e, device=moe.gate_weights.device)
        self.moe = moe

    def forward(self, x):
        h = self.proj(x)
        weights, top = torch.topk(torch.softmax(self.router(h.float()), -1), self.moe.spec.top_k)
        top = torch.where(weights < 0.15, -1, top).to(torch.int32)
        return self.moe(h, top, weights) + h


def _module(seed_name="compile-weights", **kw):
    torch.manual_seed(seed_for(seed_name))
    return mok.torch.MoELayer(SPEC, **kw)


def _x(tokens, seed_name="compile-x", device="cpu"):
    g = torch.Generator().manual_seed(seed_for(f"{seed_name}-{tokens}"))
    return torch.randn(tokens, SPEC.hidden, generator=g).bfloat16().to(device)


def _step(model, x, unbacked=False):
    """Forward and backward of `model` on a fresh leaf copy of x (its
    token count marked unbacked for torch.compile if `unbacked`), every
    main_grad set to 0.25 first: (out, {name: gradient} of x and every
    parameter, {name: main_grad} of the weights that have one)."""
    params = dict(getattr(model, "_orig_mod", model).named_parameters())  # (compiled or not)
    model.zero_grad(set_to_none=True)
    main_grads = {n: p.main_grad for n, p in params.items() if hasattr(p, "main_grad")}
    for grad in main_grads.values():
        grad.fill_(0.25)
    x = x.clone().requires_grad_()
    if unbacked:
        mark_unbacked(x, 0)
    out = model(x)
    d_out = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype)
    out.backward(d_out)
    grads = {"x": x.grad}
    grads.update((n, p.grad) for n, p in params.items())
    return out.detach(), grads, {n: g.clone() for n, g in main_grads.items()}


def _assert_equal(got, want, what):
    out_g, grads_g, added_g = got
    out_w, grads_w, added_w = want
    assert torch.equal(out_g, out_w), f"{what}: outputs differ"
    assert set(grads_g) == set(grads_w) and set(added_g) == set(added_w)
    for name, w in grads_w.items():
        g = grads_g[name]
        assert (g is None) == (w is None), f"{what}: d_{name} is {g} against {w}"
        assert g is None or torch.equal(g, w), f"{what}: d_{name} differs"
    for name, w in added_w.items():
        assert torch.equal(added_g[name], w), f"{what}: main_grad of {name} differs"


def _with_main_grads(model):
    for name in WEIGHTS:
        p = getattr(model.moe, name)
        p.main_grad = torch.full(p.shape, 0.25, dtype=torch.float32, device=p.device)


@pytest.mark.parametrize("variant", ["plain", "recompute", "main_grad"])
def test_compiled_model_is_eager_bitwise_at_every_token_count(variant):
    """fullgraph=True (a graph break raises), T unbacked from the first
    call: one compile serves every T, 0 and 1 included, with the eager
    module's outputs, gradients and main_grad sums, bit for bit."""
    moe = _module(recompute=variant == "recompute",
                  accumulate_main_grad=variant == "main_grad")
    model = Block(moe)
    if variant == "main_grad":
        _with_main_grads(model)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for i, tokens in enumerate(TOKEN_COUNTS):
        x = _x(tokens)
        eager = _step(model, x)
        got = _step(compiled, x, unbacked=i == 0)
        _assert_equal(got, eager, f"T = {tokens}")
        assert got[0].shape == (tokens, SPEC.hidden)
        if variant == "main_grad":
            for name in WEIGHTS:
                p = getattr(moe, name)
                assert p.grad_added_to_main_grad and not p.grad.any(), name
                assert tokens == 0 or (got[2][f"moe.{name}"] != 0.25).any(), name
    assert counter.frame_count == 1, f"{counter.frame_count} compiles for {TOKEN_COUNTS}"


def test_automatic_dynamic_shapes_compile_twice_then_never():
    """Without marks, torch compiles for the first T, then once more with
    T dynamic at the second; no further T recompiles. (Sizes 0 and 1 are
    specialized by torch when T is backed: mark_unbacked avoids that.)"""
    model = Block(_module())
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    counts = []
    for tokens in (29, 7, 64, 13, 40):
        x = _x(tokens)
        _assert_equal(_step(compiled, x), _step(model, x), f"T = {tokens}")
        counts.append(counter.frame_count)
    assert counts == [1, 2, 2, 2, 2]
    with torch._dynamo.config.patch(error_on_recompile=True):
        x = _x(100)
        _assert_equal(_step(compiled, x), _step(model, x), "T = 100")


class Residual(torch.nn.Module):
    """The layer and a residual (one bf16 add, rounded alike by every
    backend), routed by its inputs."""

    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def forward(self, x, top_experts, router_weights):
        return self.moe(x, top_experts, router_weights) + x


def test_inductor_compiles_the_ops_in():
    """The default backend, Inductor, with the ops in its graph as extern
    kernels: one compile for every T (0 and 1 included), and the eager
    module's output and every gradient bit for bit."""
    model = Residual(_module())
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for i, tokens in enumerate((29, 1, 0, 13)):
        results = []
        for run in (model, compiled):
            x, top, rw, _ = _op_args(model.moe, tokens, f"compile-inductor-{tokens}")
            if run is compiled and i == 0:
                for t in (x, top, rw):
                    mark_unbacked(t, 0)
            out = run(x, top, rw)
            out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).bfloat16())
            results.append([out.detach(), x.grad, rw.grad] +
                           [getattr(model.moe, n).grad for n in WEIGHTS])
            model.zero_grad(set_to_none=True)
        for name, want, got in zip(["out", "x", "router_weights", *WEIGHTS], *results):
            assert torch.equal(got, want), f"T = {tokens}: {name} differs"
    assert counter.frame_count == 1


def test_no_graph_break_in_training_or_inference():
    """torch._dynamo.explain: one graph, no break, for a training forward
    and for one under no_grad (which runs mok::moe_infer)."""
    model = Block(_module())
    x = _x(29)
    explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        explained.break_reasons
    ops = " ".join(str(n.target) for g in explained.graphs for n in g.graph.nodes)
    assert "mok.moe_forward" in ops and "mok.moe_infer" not in ops, ops
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        explained.break_reasons
    ops = " ".join(str(n.target) for g in explained.graphs for n in g.graph.nodes)
    assert "mok.moe_infer" in ops and "mok.moe_forward" not in ops, ops


def test_compiled_inference_is_eager_bitwise():
    model = Block(_module())
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        for i, tokens in enumerate(TOKEN_COUNTS):
            x = _x(tokens)
            want = model(x)
            if i == 0:
                mark_unbacked(x, 0)
            got = compiled(x)
            assert got.grad_fn is None and torch.equal(got, want), f"T = {tokens}"
    assert counter.frame_count == 1


def _op_args(moe, tokens=9, seed_name="compile-opcheck"):
    """x, top_experts (a -1 route among them), router_weights, the weights."""
    g = torch.Generator().manual_seed(seed_for(seed_name))
    x = torch.randn(tokens, SPEC.hidden, generator=g).bfloat16().requires_grad_()
    top = torch.stack([torch.randperm(SPEC.experts, generator=g)[:SPEC.top_k]
                       for _ in range(tokens)]).int() if tokens \
        else torch.zeros(0, SPEC.top_k, dtype=torch.int32)
    top[:1, :1] = -1
    rw = torch.softmax(torch.randn(tokens, SPEC.top_k, generator=g), 1).requires_grad_()
    return x, top, rw, [getattr(moe, n) for n in WEIGHTS]


@pytest.mark.parametrize("recompute", [False, True])
def test_opcheck(recompute):
    """torch.library.opcheck on every op: schema (mutations declared: only
    moe_backward_into's main_grads), autograd registration, the fake
    implementations against the real ones, and AOT dispatch with dynamic
    shapes. The forward's AOT check compares its saved context, whose
    routed rows past the routes are NaN (the CPU layer poisons what it does
    not write): that check runs on the recompute layer, which saves none."""
    moe = _module(recompute=recompute)
    lid = moe._layer_id
    x, top, rw, weights = _op_args(moe)
    forward_tests = ("test_schema", "test_autograd_registration", "test_faketensor") + (
        ("test_aot_dispatch_dynamic",) if recompute else ())
    main_grads = [torch.zeros(w.shape) for w in weights]
    for grads in ([], main_grads):
        result = torch.library.opcheck(torch.ops.mok.moe_forward.default,
                                       (lid, x, top, rw, weights, grads),
                                       test_utils=forward_tests)
        assert set(result.values()) == {"SUCCESS"}, result
    detached = [w.detach() for w in weights]
    outs = torch.ops.mok.moe_forward(lid, x.detach(), top, rw.detach(), detached, [])
    assert len(outs) == 1 + (0 if recompute else 7)
    tensors = [x.detach(), top, rw.detach(), *detached, *outs[1:]]
    d_out = torch.randn(x.shape).bfloat16()
    for op, args in ((torch.ops.mok.moe_backward.default, (lid, d_out, tensors)),
                     (torch.ops.mok.moe_backward_into.default,
                      (lid, d_out, tensors, main_grads)),
                     (torch.ops.mok.moe_infer.default,
                      (lid, x.detach(), top, rw.detach(), detached))):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    # moe_backward_into: moe_backward's x and router_weights gradients, the
    # weights' added into the main_grads.
    grads = torch.ops.mok.moe_backward(lid, d_out, tensors)
    main_grads = [torch.full(w.shape, 0.5) for w in weights]
    into = torch.ops.mok.moe_backward_into(lid, d_out, tensors, main_grads)
    assert len(into) == 2 and torch.equal(into[0], grads[0]) and torch.equal(into[1], grads[1])
    for name, added, grad in zip(WEIGHTS, main_grads, grads[2:]):
        assert torch.equal(added, 0.5 + grad.float()), name


def test_ops_are_the_eager_layer():
    """The ops' results are the CPU layer's own, bit for bit: they add no
    arithmetic."""
    moe = _module()
    lid = moe._layer_id
    x, top, rw, weights = _op_args(moe)
    out, *saved = torch.ops.mok.moe_forward(lid, x.detach(), top, rw.detach(),
                                             [w.detach() for w in weights], [])
    np16 = lambda t: t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)  # noqa
    args = dict(x=np16(x), top_experts=top.numpy(), router_weights=rw.detach().numpy())
    args.update((n, np16(w)) for n, w in zip(WEIGHTS, weights))
    ref_out, ctx = moe.layer.forward(**args)
    assert np.array_equal(np16(out), ref_out)
    assert len(saved) == len(ctx.saved)
    for got, want in zip(saved, ctx.saved.values()):
        assert np.array_equal(np16(got), want)  # (bit patterns: the NaN padding too)
    d_out = torch.randn(x.shape).bfloat16()
    grads = torch.ops.mok.moe_backward(lid, d_out, [x.detach(), top, rw.detach(),
                                                    *[w.detach() for w in weights], *saved])
    ref = moe.layer.backward(ctx, np16(d_out))
    names = ["x", "router_weights", *WEIGHTS]
    assert len(grads) == len(names)
    for name, got in zip(names, grads):
        got = np16(got) if got.dtype == torch.bfloat16 else got.numpy()
        assert np.array_equal(got, ref[name]), name


def test_ops_run_eagerly_as_the_autograd_functions(monkeypatch):
    """The module's op path run eagerly (torch.compiler.is_compiling made
    true): the autograd functions' results bit for bit, the same tensors
    (the 9 inputs and 7 context tensors among them) through saved-tensor
    hooks, and double backward refused."""
    model = Block(_module())
    x = _x(29)
    want = _step(model, x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t,
                                                  lambda t: t):
        got = _step(model, x)
    _assert_equal(got, want, "the ops in eager mode")
    ops_packed = [tuple(t.shape) for t in packed]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    packed.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t,
                                                  lambda t: t):
        _step(model, x)
    assert [tuple(t.shape) for t in packed] == ops_packed
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    xg = x.clone().requires_grad_()
    top = torch.zeros(29, SPEC.top_k, dtype=torch.int32)
    out = model.moe(xg, top, torch.full((29, SPEC.top_k), 0.5))
    (gx,) = torch.autograd.grad(out, xg, torch.ones_like(out), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiated once only"):
        gx.float().sum().backward()


def test_zero_tokens_call_no_layer(monkeypatch):
    """T = 0: an empty output, empty gradients for x and router_weights,
    zero ones for the weights, main_grads unchanged, eager and compiled,
    and the CPU layer never called; its dtypes still checked by name."""
    moe = _module(accumulate_main_grad=True)
    model = Block(moe)
    _with_main_grads(model)

    def called(*args, **kwargs):
        raise AssertionError("the layer was called for T = 0")

    for method in ("forward", "backward", "__call__"):
        monkeypatch.setattr(mok.CompiledLayer, method, called)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for run in (model, compiled):
        out, grads, added = _step(run, _x(0))
        assert out.shape == (0, SPEC.hidden) and grads["x"].shape == (0, SPEC.hidden)
        for name in WEIGHTS:
            assert not grads[f"moe.{name}"].any() and (added[f"moe.{name}"] == 0.25).all()
        with torch.no_grad():
            assert run(_x(0)).shape == (0, SPEC.hidden)
    x = _x(0)
    top = torch.zeros(0, SPEC.top_k, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"router_weights: expected a torch.float32 tensor"):
        moe(x, top, torch.zeros(0, SPEC.top_k, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x: expected shape \[T, 32\], got \[0, 31\]"):
        moe(torch.zeros(0, 31, dtype=torch.bfloat16), top, torch.zeros(0, SPEC.top_k))


def test_bad_arguments_are_named():
    moe = _module()
    x, top, rw, _ = _op_args(moe)
    with pytest.raises(TypeError, match="top_experts: expected a torch.Tensor, got list"):
        moe(x, top.tolist(), rw)
    with pytest.raises(TypeError, match="router_weights: expected a torch.Tensor, got ndarray"):
        with torch.no_grad():
            moe(x, top, rw.detach().numpy())
    with pytest.raises(ValueError, match="layer: no mok layer is registered as 0"):
        torch.ops.mok.moe_infer(0, x, top, rw, [])
    # A layer that is gone: its id names no layer any more.
    lid = _module()._layer_id
    gc.collect()
    with pytest.raises(ValueError, match=f"layer: no mok layer is registered as {lid}"):
        torch.ops.mok.moe_infer(lid, x, top, rw, [])


# -- the ops' GPU branch, over a stand-in GPU training layer --------------------

def _np(t):
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 \
        else t.numpy()


def _torch(a):
    a = np.ascontiguousarray(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 \
        else torch.from_numpy(a)


# The saved context tensors whose rows are routed rows (T*top_k +
# local_experts*(padding - 1)); the others have a row a token.
ROUTED = ("saved:routed_x", "saved:gate", "saved:up", "saved:hidden")


class StandIn(mok.GpuTrainingLayer):
    """Stands for a loaded GpuTrainingLayer (no GPU here), on CPU tensors:
    its API as mok.torch uses it (arg_names, saved_names, device,
    main_grads, max_tokens, the forward kernel's params, forward,
    context_from_tensors, backward, __call__) over the CPU layer's
    arithmetic. `tokens`: the one T of a layer for one T (its params'
    shapes; others refused as the GPU layer refuses them); else a layer for
    any T up to `max_tokens`, whose params are sized for that capacity,
    rows that follow T marked with `call_rows` = [scale, offset] as in a
    GPU kernel's metadata. `main_grads`: its backward adds the weights'
    gradients itself (compiled with main_grads=True). `calls` lists the
    forward and backward launches with their T."""

    def __init__(self, cpu, tokens=None, max_tokens=None, main_grads=False):
        self.cpu = cpu
        self.arg_names = list(cpu.arg_names)
        fn = cpu._forward
        saved = [r for r in fn.results if r.role.startswith("saved:")]
        self.saved_names = [r.role[len("saved:"):] for r in saved]
        self.device = torch.device("cpu")
        self.artifact = SimpleNamespace(recompute=cpu.recomputes)
        # (main_grads: the weights' gradients the backward adds)
        self._accumulated = [f"d_{n}" for n in self.arg_names[3:]] if main_grads else []
        self.tokens = tokens
        self.calls = []
        routed = SPEC.local_experts * (SPEC.padding - 1)

        def param(name, info):
            p = {"name": name, "dtype": info.dtype,
                 "shape": cpu._shape(fn, info, tokens or max_tokens)}
            if tokens is None and info.shape and info.shape[0] < 0:  # rows that follow T
                p["call_rows"] = [SPEC.top_k, routed] if info.role in ROUTED else [1, 0]
            return p

        inputs = [param(n, a) for n, a in zip(self.arg_names, fn.args)]
        outputs = [param(n, r) for n, r in zip(["out"] + self.saved_names, fn.results)]
        self._forward = SimpleNamespace(inputs=inputs, outputs=outputs, output=outputs[0],
                                        bound_weights=(), max_tokens=tokens or max_tokens)

    @property
    def max_tokens(self):
        return self._forward.max_tokens

    def forward(self, **kw):
        tokens = kw["x"].shape[0]
        if self.tokens is not None and tokens != self.tokens:
            raise ValueError(f"x: expected shape [{self.tokens}, {SPEC.hidden}], got "
                             f"{list(kw['x'].shape)}")
        assert 1 <= tokens <= self.max_tokens
        self.calls.append(("forward", tokens))
        out, ctx = self.cpu.forward(**{n: _np(v) for n, v in kw.items()})
        return _torch(out), mok.Context(dict(kw), {n: _torch(a) for n, a in ctx.saved.items()},
                                        tokens)

    def __call__(self, **kw):
        return self.forward(**kw)[0]

    def context_from_tensors(self, tensors):
        n = len(self.arg_names)
        return mok.Context(dict(zip(self.arg_names, tensors[:n])),
                           dict(zip(self.saved_names, tensors[n:])), tensors[0].shape[0])

    def backward(self, ctx, d_out, main_grads=None):
        if self.main_grads != (main_grads is not None):
            raise TypeError(f"main_grads: {main_grads!r} to a layer with main_grads = "
                            f"{self.main_grads}")
        self.calls.append(("backward", ctx.tokens))
        cpu_ctx = self.cpu.context_from_tensors(
            [_np(t) for t in list(ctx.inputs.values()) + list(ctx.saved.values())])
        grads = {n: _torch(g) for n, g in self.cpu.backward(cpu_ctx, _np(d_out)).items()}
        for name, grad in (main_grads or {}).items():
            grad.add_(grads.pop(name))
        return grads


def _gpu_like(monkeypatch, stand_in, **kw):
    """A MoELayer(target="sm_90a") whose loaded layer is `stand_in`, with
    the weights of _module()."""
    main_grads = stand_in.main_grads
    params = [{"name": "d_gate_weights", "role": "output", "dtype": "f32",
               "accumulate": True}] if main_grads else []
    artifact = mok.GpuTrainingArtifact(
        mok.GpuArtifact("// forward", {"function": "f_forward"}),
        mok.GpuArtifact("// backward", {"function": "f_backward", "params": params}))
    monkeypatch.setattr(mok.GpuTrainingArtifact, "load",
                        lambda artifact, device=None, poison_outputs=False: stand_in)
    spec = dataclasses.replace(SPEC, tokens=stand_in.tokens or 8)
    moe = mok.torch.MoELayer(spec, target="sm_90a", device=0, artifact=artifact,
                             share_layer=False, accumulate_main_grad=main_grads, **kw)
    moe.load_state_dict(_module().state_dict())
    return moe


@pytest.mark.parametrize("main_grads", [False, True])
def test_gpu_branch_any_token_count(monkeypatch, main_grads):
    """The ops over a GPU layer for any T up to its capacity (the stand-in:
    max_tokens, call_rows): compiled once for every T, the CPU module's
    results bit for bit (main_grad sums too, added by the layer's own
    backward with main_grads); T = 0 launches nothing; T above the capacity
    is refused naming x, T and the capacity, eager and compiled."""
    stand_in = StandIn(_module().layer, max_tokens=64, main_grads=main_grads)
    moe = _gpu_like(monkeypatch, stand_in)
    cpu = Block(_module(accumulate_main_grad=main_grads))
    model = Block(moe)
    if main_grads:
        _with_main_grads(model)
        _with_main_grads(cpu)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for i, tokens in enumerate((29, 1, 0, 64, 7)):
        x = _x(tokens)
        calls = len(stand_in.calls)
        _assert_equal(_step(compiled, x, unbacked=i == 0), _step(cpu, x), f"T = {tokens}")
        assert stand_in.calls[calls:] == ([] if tokens == 0 else [("forward", tokens), ("backward", tokens)])
    assert counter.frame_count == 1
    for run in (model, compiled):
        with pytest.raises(ValueError, match=r"x: 65 tokens \(x of shape \[65, 32\]\) exceed "
                                             r"the layer's capacity of 64 tokens"):
            run(_x(65))
        with torch.no_grad(), pytest.raises(ValueError, match="capacity of 64 tokens"):
            run(_x(65))


def test_gpu_branch_fixed_token_count(monkeypatch):
    """The ops over a GPU layer compiled for one T (its saved context's
    shapes from the metadata): compiled with T dynamic, that T runs as the
    CPU module does; another T is the layer's error, a larger one refused
    by mok.torch with the fixed T as the capacity; T = 0 launches nothing."""
    stand_in = StandIn(_module().layer, tokens=29)
    moe = _gpu_like(monkeypatch, stand_in)
    cpu, model = Block(_module()), Block(moe)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    x = _x(29)
    _assert_equal(_step(compiled, x), _step(cpu, x), "T = 29")
    assert stand_in.calls == [("forward", 29), ("backward", 29)]
    with torch.no_grad():
        assert torch.equal(compiled(x), cpu(x))
    out, grads, _ = _step(compiled, _x(0))
    assert out.shape == (0, SPEC.hidden) and not grads["moe.gate_weights"].any()
    assert len(stand_in.calls) == 3
    with pytest.raises(ValueError, match=r"x: expected shape \[29, 32\], got \[7, 32\]"):
        compiled(_x(7))
    with pytest.raises(ValueError, match=r"x: 30 tokens .* capacity of 29 tokens"):
        compiled(_x(30))
    # At T = 0 the layer's dtypes and sizes are still checked, by name.
    with pytest.raises(ValueError, match=r"top_experts: expected a torch.int32 tensor of "
                                         r"shape \[0, 3\] on cpu, got torch.int64"):
        moe(_x(0), torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, 3))
