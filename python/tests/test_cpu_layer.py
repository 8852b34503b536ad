# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The CPU-compiled layer against the float64 reference, forward and backward.

Bound (mok-brief §5, BF16): relative error sum|mok - ref| / sum|ref| <= 1e-2
for every output and gradient, and no NaN (outputs are poisoned with NaN
before each call, so an unwritten element fails too).
"""
import numpy as np
import pytest

import mok
import reference
from cpu_results import MEASURED, seed_for

REL_BOUND = 1e-2

CASES = [
    dict(id="top1", T=37, H=32, I=16, E=4, k=1),
    dict(id="top8", T=40, H=32, I=16, E=16, k=8, padding=4),
    dict(id="single_expert", T=33, H=16, I=8, E=1, k=1),
    dict(id="T_not_multiple_of_128", T=130, H=32, I=16, E=8, k=2, padding=128),
    dict(id="idle_experts", T=50, H=32, I=16, E=8, k=2, used=[1, 5, 6]),
    dict(id="no_route_-1", T=45, H=32, I=16, E=8, k=4, drop=0.3, padding=8),
    dict(id="zero_router_weights", T=45, H=32, I=16, E=8, k=2, zero=0.3),
    dict(id="swiglu_limit", T=40, H=32, I=16, E=4, k=2, limit=0.5),
    dict(id="shared_expert", T=40, H=32, I=16, E=4, k=2, shared=24),
    dict(id="shared_limit_int64", T=29, H=16, I=24, E=6, k=3, shared=8, limit=1.0,
         ids="int64", padding=16, drop=0.2),
]


def _inputs(c, rng, T=None):
    T = c["T"] if T is None else T
    H, I, E, k = c["H"], c["I"], c["E"], c["k"]
    used = c.get("used", list(range(E)))
    top = np.stack([rng.permutation(used)[:k] for _ in range(T)]) if T \
        else np.zeros((0, k), np.int64)
    if c.get("drop"):
        top[rng.random(top.shape) < c["drop"]] = -1
    logits = rng.standard_normal((T, k))
    rw = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    if c.get("zero"):
        rw[rng.random(rw.shape) < c["zero"]] = 0.0
    bf = lambda *s, scale=1.0: mok.to_bf16(rng.standard_normal(s) * scale)
    args = dict(x=bf(T, H),
                top_experts=top.astype(np.int64 if c.get("ids") == "int64" else np.int32),
                router_weights=rw.astype(np.float32),
                gate_weights=bf(E, I, H, scale=H ** -0.5),
                up_weights=bf(E, I, H, scale=H ** -0.5),
                down_weights=bf(E, H, I, scale=I ** -0.5))
    if c.get("shared"):
        s = c["shared"]
        args.update(shared_gate_weights=bf(s, H, scale=H ** -0.5),
                    shared_up_weights=bf(s, H, scale=H ** -0.5),
                    shared_down_weights=bf(H, s, scale=s ** -0.5))
    return args


def _problem(c, seed_name, T=None):
    """Fresh inputs and an output gradient for case `c`."""
    rng = np.random.default_rng(seed_for(seed_name))
    args = _inputs(c, rng, T=T)
    T = c["T"] if T is None else T
    return args, mok.to_bf16(rng.standard_normal((T, c["H"])))


def _spec(c, tokens="same"):
    return mok.LayerSpec(hidden=c["H"], intermediate=c["I"], experts=c["E"], top_k=c["k"],
                         tokens=c["T"] if tokens == "same" else tokens,
                         shared_intermediate=c.get("shared"),
                         swiglu_limit=c.get("limit"), padding=c.get("padding", 1),
                         expert_id_dtype=c.get("ids", "int32"))


def _f64(a):
    return mok.bf16_to_float32(a).astype(np.float64) if a.dtype == np.uint16 \
        else a.astype(np.float64)


def _reference(c, args, d_out):
    f = {n: _f64(v) for n, v in args.items() if n != "top_experts"}
    shared = None
    if c.get("shared"):
        shared = [f["shared_gate_weights"], f["shared_up_weights"], f["shared_down_weights"]]
    pos = (f["x"], args["top_experts"], f["router_weights"], f["gate_weights"],
           f["up_weights"], f["down_weights"])
    out = reference.forward(*pos, shared, c.get("limit"))
    grads = reference.backward(*pos, _f64(d_out), shared, c.get("limit"))
    return out, grads


def _compare(case, what, got, ref):
    got = _f64(got)
    assert not np.isnan(got).any(), f"{what}: NaN in the output"
    diff = np.abs(got - ref)
    denom = np.abs(ref).sum()
    rel = diff.sum() / denom if denom > 0 else diff.sum()
    MEASURED.append((case, what, rel, diff.max()))
    assert rel <= REL_BOUND, f"{what}: relative error {rel:.3e} > {REL_BOUND}"


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(c, recompute=False, tokens="same"):
        key = (c["id"], recompute, tokens)
        if key not in cache:
            cache[key] = mok.compile(_spec(c, tokens), recompute=recompute)
        return cache[key]
    return get


@pytest.mark.parametrize("c", CASES, ids=[c["id"] for c in CASES])
def test_forward_and_backward_match_reference(c, compiled):
    args, d_out = _problem(c, c["id"])
    layer = compiled(c)

    out = layer(**args)
    out_train, ctx = layer.forward(**args)
    grads = layer.backward(ctx, d_out)

    ref_out, ref_grads = _reference(c, args, d_out)
    _compare(c["id"], "out", out, ref_out)
    assert np.array_equal(out, out_train), "training forward differs from inference"
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        _compare(c["id"], f"d_{name}", grads[name], ref)

    # Routes without an expert get no router-weight gradient.
    assert np.all(grads["router_weights"][args["top_experts"] < 0] == 0)


@pytest.mark.parametrize("c", [CASES[5], CASES[9]], ids=["no_route_-1", "shared_limit_int64"])
def test_recompute_and_saved_context_agree_bitwise(c, compiled):
    args, d_out = _problem(c, "recompute" + c["id"])
    saved_layer, recompute_layer = compiled(c), compiled(c, recompute=True)
    assert not saved_layer.recomputes and recompute_layer.recomputes

    out_s, ctx_s = saved_layer.forward(**args)
    out_r, ctx_r = recompute_layer.forward(**args)
    assert ctx_r.saved == {} and set(ctx_s.saved) >= {"routed_x", "gate", "up", "hidden"}
    assert np.array_equal(out_s, out_r)
    g_s = saved_layer.backward(ctx_s, d_out)
    g_r = recompute_layer.backward(ctx_r, d_out)
    for name in g_s:
        assert np.array_equal(g_s[name], g_r[name]), name


def test_results_are_deterministic(compiled):
    c = CASES[1]
    args, d_out = _problem(c, "determinism")
    layer = compiled(c)
    runs = []
    for _ in range(2):
        out, ctx = layer.forward(**args)
        runs.append((out, layer.backward(ctx, d_out)))
    assert np.array_equal(runs[0][0], runs[1][0])
    for name in runs[0][1]:
        assert np.array_equal(runs[0][1][name], runs[1][1][name]), name


def test_dynamic_token_count(compiled):
    """tokens=None compiles once for any T."""
    c = CASES[8]
    layer = compiled(c, tokens=None)
    assert "tensor<?x32xbf16>" in layer.stages["moe"]
    for T in (1, 17, 64):
        args, d_out = _problem(c, f"dynamic{T}", T=T)
        out, ctx = layer.forward(**args)
        grads = layer.backward(ctx, d_out)
        ref_out, ref_grads = _reference(c, args, d_out)
        _compare(f"dynamic_T={T}", "out", out, ref_out)
        _compare(f"dynamic_T={T}", "d_x", grads["x"], ref_grads["x"])


def test_zero_tokens(compiled):
    """T = 0 (an empty micro-batch): empty output and input gradients, and
    weight gradients of exact zeros, written (outputs start as NaN)."""
    c = CASES[8]
    layer = compiled(c, tokens=None)
    args, d_out = _problem(c, "zero-tokens", T=0)
    assert args["x"].shape == (0, c["H"])
    assert layer(**args).shape == (0, c["H"])
    out, ctx = layer.forward(**args)
    grads = layer.backward(ctx, d_out)
    assert out.shape == (0, c["H"]) and grads["x"].shape == (0, c["H"])
    assert grads["router_weights"].shape == (0, c["k"])
    for name in ("gate_weights", "up_weights", "down_weights", "shared_gate_weights",
                 "shared_up_weights", "shared_down_weights"):
        g = mok.bf16_to_float32(grads[name])
        assert g.shape == args[name].shape and np.all(g == 0), name


def test_context_flattens_and_rebuilds(compiled):
    c = CASES[8]
    args, d_out = _problem(c, "flatten")
    layer = compiled(c)
    _, ctx = layer.forward(**args)
    tensors = ctx.tensors()
    assert all(isinstance(t, np.ndarray) for t in tensors)
    rebuilt = layer.context_from_tensors([t.copy() for t in tensors])
    a, b = layer.backward(ctx, d_out), layer.backward(rebuilt, d_out)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_compile_from_ir_text_matches_spec(compiled):
    """The same layer written as an unfused chain in IR gives the same bits."""
    c = CASES[7]
    ir = f"""
    !plan = !moe.plan<tokens = {c['T']}, top_k = 2, experts = 4, ep = 1, padding = 1>
    func.func @chain(%x: tensor<{c['T']}x32xbf16>, %top: tensor<{c['T']}x2xi32>,
                     %rw: tensor<{c['T']}x2xf32>, %wg: tensor<4x16x32xbf16>,
                     %wu: tensor<4x16x32xbf16>, %wd: tensor<4x32x16xbf16>)
        -> tensor<{c['T']}x32xbf16> {{
      %p = moe.plan %top : tensor<{c['T']}x2xi32> -> !plan
      %xr = moe.dispatch %x, %p : tensor<{c['T']}x32xbf16>, !plan -> tensor<?x32xbf16>
      %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu {{swiglu_limit = 0.5 : f32}}
          : tensor<?x32xbf16>, !plan, tensor<4x16x32xbf16> -> tensor<?x16xbf16>
      %y = moe.expert_down %h, %p, down %wd
          : tensor<?x16xbf16>, !plan, tensor<4x32x16xbf16> -> tensor<?x32xbf16>
      %o = moe.combine %y, %p, weights %rw
          : tensor<?x32xbf16>, !plan, tensor<{c['T']}x2xf32> -> tensor<{c['T']}x32xbf16>
      return %o : tensor<{c['T']}x32xbf16>
    }}"""
    from_ir = mok.compile(ir, function="chain")
    assert "moe.layer" in from_ir.stages["training"]
    rng = np.random.default_rng(seed_for("ir"))
    args = _inputs(c, rng)
    assert np.array_equal(from_ir(*args.values()), compiled(c)(**args))


def test_cpu_layer_is_an_artifact(tmp_path):
    """The CPU layer has the Artifact interface: target, options, stages,
    save() and from_files() (which compiles the saved moe stage again),
    load() (itself)."""
    spec = _spec(CASES[0], "same")
    layer = mok.compile(spec, recompute=True)
    assert isinstance(layer, mok.Artifact) and layer.target == "cpu"
    assert layer.options == mok.CompileOptions(recompute=True)
    assert list(layer.stages) == ["moe", "training", "llvm"]
    assert layer.load() is layer and layer.load("cpu") is layer
    with pytest.raises(ValueError, match="device: a CPU-target layer runs on the host"):
        layer.load("cuda:0")
    base = layer.save(str(tmp_path))
    assert open(base + ".mlir").read() == layer.stages["moe"]
    again = mok.CompiledLayer.from_files(base)
    assert again.options == layer.options and again.recomputes
    assert again.stages["training"] == layer.stages["training"]
    rng = np.random.default_rng(seed_for("artifact"))
    args = _inputs(CASES[0], rng)
    assert np.array_equal(again(**args), layer(**args))
