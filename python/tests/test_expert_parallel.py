# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Expert parallelism on the CPU target: an N-rank group run in one process
(mok.CompiledGroupLayer, docs/ExpertParallel.md).

Each group is checked against
- the float64 reference (reference.py) with the bound of test_cpu_layer.py:
  a rank's output, d_x and d_router_weights against the layer over its
  tokens with all E experts; its local experts' weight gradients against
  the slice of the gradients over every rank's tokens; its shared expert's
  against the layer over its own tokens;
- the EP = 1 CPU layer, bit for bit: the same quantities from the EP = 1
  layer run on the concatenation of every rank's tokens (routed rows are in
  the same order: by expert, then source rank, then token, then k) and, for
  the shared expert's gradients, on the rank's own tokens.
"""
import numpy as np
import pytest

import mok
import reference
from cpu_results import MEASURED, seed_for

REL_BOUND = 1e-2
WEIGHTS = ("gate_weights", "up_weights", "down_weights")
SHARED = tuple(f"shared_{w}" for w in WEIGHTS)

# T: each rank's token count. route: "uniform", "skewed" (most routes to
# the first rank's experts), or a list of the experts used (the others'
# ranks receive nothing). drop: the share of -1 routes.
CASES = [
    dict(id="ep2_uniform", N=2, E=4, k=2, H=32, I=16, T=[11, 7]),
    dict(id="ep2_top1_any_T", N=2, E=2, k=1, H=16, I=8, T=[5, 9], tokens=None),
    dict(id="ep2_top8", N=2, E=16, k=8, H=16, I=8, T=[6, 6], padding=4),
    dict(id="ep4_skewed_shared_clamp", N=4, E=8, k=3, H=32, I=16, T=[9, 6, 13, 5],
         route="skewed", shared=8, limit=1.0, padding=4, drop=0.2),
    dict(id="ep4_T0_rank_-1_routes", N=4, E=8, k=2, H=16, I=8, T=[7, 0, 12, 4],
         drop=0.35, padding=2, ids="int64"),
    dict(id="ep8_idle_rank_shared", N=8, E=16, k=4, H=16, I=8,
         T=[6, 3, 0, 9, 5, 1, 7, 4], route=list(range(14)), shared=8, padding=8),
    dict(id="ep8_one_expert_a_rank_top8", N=8, E=8, k=8, H=16, I=8,
         T=[4, 2, 5, 3, 6, 1, 2, 3]),
]

CASE = {c["id"]: c for c in CASES}

def _route(c, rng, T):
    E, k = c["E"], c["k"]
    route = c.get("route", "uniform")
    if route == "skewed":
        # Rank 0's experts first in a random order, each token's top-k mostly
        # there.
        local = E // c["N"]
        p = np.full(E, 1.0)
        p[:local] = 12.0
        top = np.array([rng.choice(E, size=k, replace=False, p=p / p.sum())
                        for _ in range(T)], dtype=np.int64).reshape(T, k)
    else:
        used = np.arange(E) if route == "uniform" else np.array(route)
        top = np.array([rng.permutation(used)[:k] for _ in range(T)],
                       dtype=np.int64).reshape(T, k)
    if c.get("drop"):
        top[rng.random(top.shape) < c["drop"]] = -1
    return top.astype(np.int64 if c.get("ids") == "int64" else np.int32)


def _problem(c, name, T=None):
    """(the group's weights, every rank's arguments, every rank's d_out)."""
    rng = np.random.default_rng(seed_for(name))
    N, E, H, I, k = c["N"], c["E"], c["H"], c["I"], c["k"]
    bf = lambda *s, scale=1.0: mok.to_bf16(rng.standard_normal(s) * scale)  # noqa: E731
    full = dict(gate_weights=bf(E, I, H, scale=H ** -0.5),
                up_weights=bf(E, I, H, scale=H ** -0.5),
                down_weights=bf(E, H, I, scale=I ** -0.5))
    if c.get("shared"):
        s = c["shared"]
        full.update(shared_gate_weights=bf(s, H, scale=H ** -0.5),
                    shared_up_weights=bf(s, H, scale=H ** -0.5),
                    shared_down_weights=bf(H, s, scale=s ** -0.5))
    local = E // N
    ranks, d_outs = [], []
    for r, t in enumerate(T or c["T"]):
        logits = rng.standard_normal((t, k))
        rw = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        args = dict(x=bf(t, H), top_experts=_route(c, rng, t),
                    router_weights=rw.astype(np.float32))
        for w in WEIGHTS:
            args[w] = np.ascontiguousarray(full[w][r * local:(r + 1) * local])
        for w in SHARED:
            if w in full:
                args[w] = full[w]
        ranks.append(args)
        d_outs.append(bf(t, H))
    return full, ranks, d_outs


def _spec(c, ep=None, **changes):
    kw = dict(hidden=c["H"], intermediate=c["I"], experts=c["E"], top_k=c["k"],
              tokens=c.get("tokens", "fixed"), shared_intermediate=c.get("shared"),
              swiglu_limit=c.get("limit"), padding=c.get("padding", 1),
              ep=c["N"] if ep is None else ep, expert_id_dtype=c.get("ids", "int32"))
    if kw["tokens"] == "fixed":
        # One T for every rank needs equal T; the cases with different T
        # compile for any T.
        kw["tokens"] = c["T"][0] if len(set(c["T"])) == 1 else None
    kw.update(changes)
    return mok.LayerSpec(**kw)


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(c, ep=None, **changes):
        key = (c["id"], ep, tuple(sorted(changes.items())))
        if key not in cache:
            spec = _spec(c, ep, **changes)
            if spec.ep == 1 and spec.tokens is not None:
                spec = _spec(c, ep, tokens=None, **changes)  # EP = 1 over all tokens
            cache[key] = mok.compile(spec)
        return cache[key]
    return get


def _f64(a):
    return mok.bf16_to_float32(a).astype(np.float64) if a.dtype == np.uint16 \
        else a.astype(np.float64)


def _compare(case, what, got, ref):
    got = _f64(got)
    assert not np.isnan(got).any(), f"{what}: NaN in the output"
    diff = np.abs(got - ref)
    denom = np.abs(ref).sum()
    rel = diff.sum() / denom if denom > 0 else diff.sum()
    MEASURED.append((case, what, rel, diff.max() if diff.size else 0.0))
    assert rel <= REL_BOUND, f"{what}: relative error {rel:.3e} > {REL_BOUND}"


def _reference(c, full, args, d_out):
    """float64 forward and gradients of the layer with all E experts."""
    f = {n: _f64(v) for n, v in dict(args, **full).items() if n != "top_experts"}
    shared = [f[w] for w in SHARED] if c.get("shared") else None
    pos = (f["x"], args["top_experts"], f["router_weights"], f["gate_weights"],
           f["up_weights"], f["down_weights"])
    return (reference.forward(*pos, shared, c.get("limit")),
            reference.backward(*pos, _f64(d_out), shared, c.get("limit")))


def _concat(ranks, d_outs, full):
    args = {n: np.concatenate([r[n] for r in ranks])
            for n in ("x", "top_experts", "router_weights")}
    return dict(args, **full), np.concatenate(d_outs)


def _local(c, r):
    local = c["E"] // c["N"]
    return slice(r * local, (r + 1) * local)


@pytest.mark.parametrize("c", CASES, ids=[c["id"] for c in CASES])
def test_group_matches_ep1_bitwise_and_the_reference(c, compiled):
    full, ranks, d_outs = _problem(c, c["id"])
    group, single = compiled(c), compiled(c, ep=1)
    assert isinstance(group, mok.CompiledGroupLayer) and group.ep == c["N"]
    assert group.local_experts == c["E"] // c["N"]

    outs = group.run_group(ranks)
    outs_train, ctxs = group.forward_group(ranks)
    grads = group.backward_group(ctxs, d_outs)
    assert len(outs) == len(outs_train) == len(grads) == c["N"]

    # EP = 1 over every rank's tokens, with all E experts.
    everything, d_out_all = _concat(ranks, d_outs, full)
    ref_out, ctx = single.forward(**everything)
    ref_grads = single.backward(ctx, d_out_all)
    starts = np.cumsum([0] + c["T"])
    _, ref_all = _reference(c, full, everything, d_out_all)
    for r, args in enumerate(ranks):
        rows = slice(starts[r], starts[r + 1])
        label = f"rank {r}"
        assert np.array_equal(outs[r], outs_train[r]), f"{label}: training forward differs"
        assert np.array_equal(outs[r], ref_out[rows]), f"{label}: out differs from EP = 1"
        assert np.array_equal(grads[r]["x"], ref_grads["x"][rows]), f"{label}: d_x"
        assert np.array_equal(grads[r]["router_weights"], ref_grads["router_weights"][rows]), \
            f"{label}: d_router_weights"
        for w in WEIGHTS:
            assert grads[r][w].shape == args[w].shape
            assert np.array_equal(grads[r][w], ref_grads[w][_local(c, r)]), f"{label}: d_{w}"
        # -1 routes get no router-weight gradient.
        assert np.all(grads[r]["router_weights"][args["top_experts"] < 0] == 0)

        # The float64 reference: the rank's tokens with all E experts.
        ref_out_r, ref_grads_r = _reference(c, full, args, d_outs[r])
        case = f"{c['id']}/{r}"
        if c["T"][r]:
            _compare(case, "out", outs[r], ref_out_r)
            _compare(case, "d_x", grads[r]["x"], ref_grads_r["x"])
            _compare(case, "d_router_weights", grads[r]["router_weights"],
                     ref_grads_r["router_weights"])
        for w in WEIGHTS:
            ref = ref_all[w][_local(c, r)]
            if np.abs(ref).sum() > 0:
                _compare(case, f"d_{w}", grads[r][w], ref)
            else:  # a rank whose experts received nothing
                assert np.all(_f64(grads[r][w]) == 0), f"{label}: d_{w} of idle experts"
        for w in SHARED:
            if w not in args:
                assert w not in grads[r]
                continue
            if c["T"][r]:
                _compare(case, f"d_{w}", grads[r][w], ref_grads_r[w])
                own, own_ctx = single.forward(**dict(args, **full))
                own_grads = single.backward(own_ctx, d_outs[r])
                assert np.array_equal(grads[r][w], own_grads[w]), f"{label}: d_{w}"
            else:
                assert np.all(_f64(grads[r][w]) == 0), f"{label}: d_{w} without tokens"


@pytest.mark.parametrize("c", CASES, ids=[c["id"] for c in CASES])
def test_each_token_crosses_once_per_destination_rank(c, compiled):
    """The exchange moves a token once to each rank that owns one of its
    experts, carrying all its routes there."""
    _, ranks, _ = _problem(c, "exchange" + c["id"])
    group = compiled(c)
    group.run_group(ranks)
    ex = group.last_exchange
    local = c["E"] // c["N"]
    rows = np.zeros((c["N"], c["N"]), np.int64)
    routes = np.zeros_like(rows)
    for s, args in enumerate(ranks):
        top = args["top_experts"]
        dest = np.where(top >= 0, top // local, -1)
        for d in range(c["N"]):
            rows[s, d] = (dest == d).any(axis=1).sum()
            routes[s, d] = (dest == d).sum()
    assert np.array_equal(ex.rows, rows)
    assert np.array_equal(ex.routes, routes)
    assert np.array_equal(ex.received_routes, routes.sum(axis=0))
    if c["id"] == "ep8_idle_rank_shared":
        assert ex.received_routes[7] == 0 and ex.rows[:, 7].sum() == 0
    if c["id"] == "ep4_T0_rank_-1_routes":
        assert ex.rows[1].sum() == 0  # the rank without tokens sends nothing
    if c["id"] in ("ep4_skewed_shared_clamp", "ep2_top8"):
        # Tokens with several routes to one rank: fewer rows than routes.
        assert ex.rows.sum() < ex.routes.sum()
    if c["id"] == "ep8_one_expert_a_rank_top8":
        # One expert a rank: every route is a row of its own.
        assert np.array_equal(ex.rows, ex.routes)


@pytest.mark.parametrize("c", [CASE["ep4_skewed_shared_clamp"], CASE["ep8_idle_rank_shared"]],
                         ids=["ep4_skewed_shared_clamp", "ep8_idle_rank_shared"])
def test_recompute_matches_the_saved_context_bitwise(c, compiled):
    _, ranks, d_outs = _problem(c, "recompute" + c["id"])
    saved, recompute = compiled(c), mok.compile(_spec(c), recompute=True)
    assert not saved.recomputes and recompute.recomputes
    out_s, ctx_s = saved.forward_group(ranks)
    out_r, ctx_r = recompute.forward_group(ranks)
    assert all(ctx.saved == {} for ctx in ctx_r)
    assert all({"routed_x", "gate", "up", "hidden"} <= set(ctx.saved) for ctx in ctx_s)
    g_s = saved.backward_group(ctx_s, d_outs)
    g_r = recompute.backward_group(ctx_r, d_outs)
    for r in range(c["N"]):
        assert np.array_equal(out_s[r], out_r[r])
        for name in g_s[r]:
            assert np.array_equal(g_s[r][name], g_r[r][name]), (r, name)


def test_any_token_count_and_contexts_from_tensors(compiled):
    """One layer for any T runs groups of other sizes; a context rebuilt from
    its tensors gives the same gradients."""
    c = CASE["ep4_T0_rank_-1_routes"]
    group = compiled(c)
    assert group._infer.tokens < 0
    for T in ([1, 2, 3, 0], [0, 0, 5, 0], [16, 1, 1, 1]):
        _, ranks, d_outs = _problem(c, f"anyT{T}", T=T)
        outs, ctxs = group.forward_group(ranks)
        assert [o.shape[0] for o in outs] == T
        grads = group.backward_group(ctxs, d_outs)
        again = [group.context_from_tensors(ctx.tensors()) for ctx in ctxs]
        grads_again = group.backward_group(again, d_outs)
        for g, h in zip(grads, grads_again):
            for name in g:
                assert np.array_equal(g[name], h[name]), name


def test_a_group_of_zero_tokens(compiled):
    """No rank has a token: empty outputs, zero weight gradients."""
    c = CASE["ep4_skewed_shared_clamp"]
    group = compiled(c)
    _, ranks, d_outs = _problem(c, "empty", T=[0, 0, 0, 0])
    outs, ctxs = group.forward_group(ranks)
    assert all(o.shape == (0, c["H"]) for o in outs)
    for g in group.backward_group(ctxs, d_outs):
        assert g["x"].shape == (0, c["H"]) and g["router_weights"].shape == (0, c["k"])
        for w in WEIGHTS + SHARED:
            assert np.all(_f64(g[w]) == 0), w


def test_results_are_deterministic(compiled):
    c = CASE["ep8_idle_rank_shared"]
    _, ranks, d_outs = _problem(c, "determinism")
    group = compiled(c)
    runs = []
    for _ in range(2):
        outs, ctxs = group.forward_group(ranks)
        runs.append((outs, group.backward_group(ctxs, d_outs)))
    for r in range(c["N"]):
        assert np.array_equal(runs[0][0][r], runs[1][0][r])
        for name in runs[0][1][r]:
            assert np.array_equal(runs[0][1][r][name], runs[1][1][r][name])


def test_arguments_by_position_and_read_only(compiled):
    c = CASE["ep2_uniform"]
    _, ranks, _ = _problem(c, "positional")
    group = compiled(c)
    by_name = group.run_group(ranks)
    frozen = []
    for args in ranks:
        values = [args[n] for n in group.arg_names]
        for v in values:
            v.flags.writeable = False
        frozen.append(values)
    by_position = group.run_group(tuple(frozen))
    for a, b in zip(by_name, by_position):
        assert np.array_equal(a, b)


#===----------------------------------------------------------------------===#
# The receive capacity
#===----------------------------------------------------------------------===#

def test_receive_capacity():
    c = dict(CASE["ep4_skewed_shared_clamp"], id="capacity")
    _, ranks, d_outs = _problem(c, "capacity")
    unbounded = mok.compile(_spec(c))
    assert unbounded.recv_capacity is None  # any T, no max_tokens: no bound
    unbounded.run_group(ranks)
    received = unbounded.last_exchange.received_routes
    busiest = int(received.max())
    rank = int(received.argmax())

    # Exactly enough: the same results.
    exact = mok.compile(_spec(c, recv_capacity=busiest))
    assert exact.recv_capacity == busiest
    for a, b in zip(exact.run_group(ranks), unbounded.run_group(ranks)):
        assert np.array_equal(a, b)

    # One route short: refused before any expert runs, naming the rank, the
    # routes and the capacity; the layer runs other routing after that.
    short = mok.compile(_spec(c, recv_capacity=busiest - 1))
    expect = (f"top_experts: the group routes {busiest} routes to rank {rank}'s experts "
              rf"\(from ranks 0..3: .*\), more than the receive capacity recv_capacity = "
              rf"{busiest - 1} \(LayerSpec.recv_capacity\)")
    with pytest.raises(ValueError, match=expect):
        short.run_group(ranks)
    with pytest.raises(ValueError, match=expect):
        short.forward_group(ranks)
    _, ctxs = exact.forward_group(ranks)
    with pytest.raises(ValueError, match=expect):
        short.backward_group(ctxs, d_outs)
    light = [dict(args, top_experts=np.full_like(args["top_experts"], -1)) for args in ranks]
    outs = short.run_group(light)
    assert all(not np.isnan(mok.bf16_to_float32(o)).any() for o in outs)

    # A fixed T or max_tokens bounds what can be sent: the default capacity
    # is that bound, ep * T * min(top_k, E / ep).
    fixed = mok.LayerSpec(hidden=16, intermediate=8, experts=8, top_k=3, ep=4, tokens=5)
    assert mok.compile(fixed).recv_capacity == 4 * 5 * 2
    capped = mok.LayerSpec(hidden=16, intermediate=8, experts=8, top_k=1, ep=4,
                           max_tokens=7)
    assert mok.compile(capped).recv_capacity == 4 * 7 * 1
    # IR whose plan gives recv_capacity: the group takes it, as the GPU
    # kernels do; the refusal then names it.
    ir = _spec(c, recv_capacity=busiest - 1).to_mlir()
    assert f"recv_capacity = {busiest - 1}" in ir
    from_ir = mok.compile(ir)
    assert from_ir.recv_capacity == busiest - 1
    with pytest.raises(ValueError, match=expect):
        from_ir.run_group(ranks)


def test_save_and_from_files_keep_the_group(tmp_path, compiled):
    c = CASE["ep2_uniform"]
    group = mok.compile(_spec(c, recv_capacity=40))
    base = group.save(str(tmp_path))
    again = mok.CompiledLayer.from_files(base)
    assert isinstance(again, mok.CompiledGroupLayer)
    assert again.ep == c["N"] and again.recv_capacity == 40
    _, ranks, _ = _problem(c, "save")
    for a, b in zip(group.run_group(ranks), again.run_group(ranks)):
        assert np.array_equal(a, b)
    assert "__ep_send" in group.stages["llvm"]


#===----------------------------------------------------------------------===#
# Errors: each names what is wrong
#===----------------------------------------------------------------------===#

def test_errors(compiled):
    c = CASE["ep4_T0_rank_-1_routes"]  # ep = 4, E = 8: 2 local experts a rank
    group = compiled(c)
    full, ranks, d_outs = _problem(c, "errors")

    def raises(kind, message, call):
        with pytest.raises(kind) as info:
            call()
        assert message in str(info.value), str(info.value)

    # The EP = 1 entry points.
    raises(TypeError, "this layer is one rank of an expert-parallel group (ep = 4); run the "
           "group with run_group(ranks)", lambda: group(**ranks[0]))
    raises(TypeError, "forward: this layer is one rank", lambda: group.forward(**ranks[0]))
    raises(TypeError, "backward: this layer is one rank", lambda: group.backward(None, None))

    # The ranks.
    raises(ValueError, "ranks: expected the arguments of 4 ranks (ep = 4), got 3",
           lambda: group.run_group(ranks[:3]))
    raises(TypeError, "ranks: expected a list of the 4 ranks' arguments (ep = 4), got dict",
           lambda: group.run_group(ranks[0]))
    raises(TypeError, "ranks[2]: expected the rank's arguments as a dict by name or a list",
           lambda: group.run_group(ranks[:2] + ["x"] + ranks[3:]))
    missing = dict(ranks[1])
    del missing["router_weights"]
    raises(TypeError, "ranks[1]: missing argument(s): router_weights",
           lambda: group.run_group([ranks[0], missing] + ranks[2:]))

    # A rank's arguments.
    def with_arg(r, **change):
        return [dict(a, **change) if i == r else a for i, a in enumerate(ranks)]
    raises(ValueError, "ranks[2].gate_weights: expected the rank's 2 local experts "
           "(experts/ep = 8/4; rank r holds experts [r*2, (r+1)*2)) as the first "
           "dimension, got shape [8, 8, 16]",
           lambda: group.run_group(with_arg(2, gate_weights=full["gate_weights"])))
    raises(ValueError, "ranks[0].down_weights: expected shape [2, 16, 8], got [2, 8, 16]",
           lambda: group.run_group(with_arg(0, down_weights=ranks[0]["gate_weights"])))
    raises(TypeError, "ranks[1].x: expected dtype bf16",
           lambda: group.run_group(with_arg(1, x=ranks[1]["x"].astype(np.float32))))
    bad = ranks[3]["top_experts"].copy()
    bad[1, 0] = 8
    raises(ValueError, "ranks[3].top_experts: expert id 8 at [1, 0] is outside [-1, 8)",
           lambda: group.run_group(with_arg(3, top_experts=bad)))
    raises(ValueError, "ranks[0].router_weights: expected shape [7, 2], got [7, 3]",
           lambda: group.run_group(with_arg(0, router_weights=np.zeros((7, 3), np.float32))))

    # A fixed T: every rank has it.
    fixed = mok.compile(mok.LayerSpec(hidden=16, intermediate=8, experts=8, top_k=2, ep=4,
                                      tokens=7, expert_id_dtype="int64"))
    raises(ValueError, "ranks[1].x: expected shape [7, 16], got [0, 16]",
           lambda: fixed.run_group(ranks))

    # backward_group's arguments.
    outs, ctxs = group.forward_group(ranks)
    raises(ValueError, "ctxs: expected the contexts of 4 ranks (ep = 4), got 2",
           lambda: group.backward_group(ctxs[:2], d_outs))
    raises(ValueError, "d_outs: expected the output gradients of 4 ranks (ep = 4), got 5",
           lambda: group.backward_group(ctxs, d_outs + d_outs[:1]))
    raises(TypeError, "ctxs[1]: expected a mok.Context from forward_group(), got dict",
           lambda: group.backward_group([ctxs[0], {}] + ctxs[2:], d_outs))
    raises(ValueError, "d_outs[2]: expected shape [12, 16], got [11, 16]",
           lambda: group.backward_group(ctxs, d_outs[:2] + [d_outs[2][:11]] + d_outs[3:]))
    short = mok.Context(dict(ctxs[2].inputs),
                        dict(ctxs[2].saved, routed_x=ctxs[2].saved["routed_x"][1:]),
                        ctxs[2].tokens)
    raises(ValueError, "ctxs[2].saved['routed_x']: expected a C-contiguous, aligned bf16 "
           "array of shape",
           lambda: group.backward_group(ctxs[:2] + [short] + ctxs[3:], d_outs))
    gone = mok.Context(dict(ctxs[0].inputs), {}, ctxs[0].tokens)
    raises(ValueError, "ctxs[0]: the saved tensor 'routed_x' is missing",
           lambda: group.backward_group([gone] + ctxs[1:], d_outs))
    no_x = mok.Context({k: v for k, v in ctxs[1].inputs.items() if k != "x"},
                       ctxs[1].saved, ctxs[1].tokens)
    raises(TypeError, "ctxs[1].x: expected a numpy.ndarray",
           lambda: group.backward_group([ctxs[0], no_x] + ctxs[2:], d_outs))


def test_spec_and_ir_errors():
    def raises(message, call):
        with pytest.raises(ValueError) as info:
            call()
        assert message in str(info.value), str(info.value)
    base = dict(hidden=16, intermediate=8, experts=8, top_k=2)
    raises("LayerSpec.ep: experts = 8 must be divisible by ep, got 3",
           lambda: mok.LayerSpec(**base, ep=3))
    raises("LayerSpec.recv_capacity: the receive capacity of an expert-parallel rank "
           "(ep > 1); ep = 1, got recv_capacity = 16",
           lambda: mok.LayerSpec(**base, recv_capacity=16))
    raises("LayerSpec.recv_capacity: expected a positive int up to 2147483647, got 0",
           lambda: mok.LayerSpec(**base, ep=2, recv_capacity=0))
    raises("LayerSpec.recv_capacity: the routed rows it allows, recv_capacity + "
           "(experts/ep)*(padding - 1) = 2147483648, exceed 2147483647",
           lambda: mok.LayerSpec(**base, ep=2, padding=2, recv_capacity=2**31 - 4))
    # IR whose experts do not divide among the ranks: the plan's verifier.
    ir = mok.LayerSpec(**base, ep=2).to_mlir().replace("ep = 2", "ep = 3")
    raises("moe.plan: experts (8) must be divisible by ep (3)", lambda: mok.compile(ir))
    # An unfused chain with ep > 1 is fused first, as for EP = 1.
    chain = """
!plan = !moe.plan<tokens = ?, top_k = 1, experts = 4, ep = 2, padding = 1>
func.func @moe_layer(%x: tensor<?x8xbf16>, %top: tensor<?x1xi32>, %rw: tensor<?x1xf32>,
                     %wg: tensor<2x4x8xbf16>, %wu: tensor<2x4x8xbf16>,
                     %wd: tensor<2x8x4xbf16>) -> tensor<?x8xbf16> {
  %p = moe.plan %top : tensor<?x1xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<?x8xbf16>, !plan -> tensor<?x8xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu
      : tensor<?x8xbf16>, !plan, tensor<2x4x8xbf16> -> tensor<?x4xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x4xbf16>, !plan, tensor<2x8x4xbf16> -> tensor<?x8xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x8xbf16>, !plan, tensor<?x1xf32> -> tensor<?x8xbf16>
  return %o : tensor<?x8xbf16>
}
"""
    assert isinstance(mok.compile(chain), mok.CompiledGroupLayer)
