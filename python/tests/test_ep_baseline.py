# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""bench/ep_multi_gpu.py's PyTorch expert-parallel baseline
(`torch_ep_forward`) on the CPU: groups of 2 and 4 ranks, one process each
(torch.multiprocessing, gloo on 127.0.0.1), each rank's output against the
float64 ep = 1 reference of its tokens with all E experts, computed in the
rank's process (`reference_forward`, itself checked against
bench/torch_reference.py's `forward`). The GPU run checks the same baseline
on NCCL with bf16 CUDA tensors; this checks its exchange: routes counted
and sent to the right ranks and local experts, results back in the right
rows, combined with their router weights, the shared expert.

float64 and float32 are checked tightly against the reference without the
bf16 rounding of gate and up (the baseline computes in the inputs' dtype);
bf16 against the reference with it, within the house bound (1e-2).

The 2-rank group also runs the script's main() with --cpu (gloo, the
baseline alone): its per-rank lines, summary, exit codes and JSON. One
spawned group a size serves every test of it (spawning is most of the
time).
"""
import contextlib
import datetime
import io
import json
import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench import ep_multi_gpu as ep  # noqa: E402
from cpu_results import seed_for  # noqa: E402

TIMEOUT_S = 60
REL_BOUND = 1e-2
# Against the unrounded reference: float64 is exact but for the order of
# the sums; float32 within its rounding over sums of at most 32 terms.
TIGHT = {"float64": 1e-12, "float32": 1e-5}


def _shape(n, experts_per_rank=4, shared=True):
    return dict(tokens=0, hidden=32, intermediate=16, experts=experts_per_rank * n,
                top_k=3, shared_intermediate=8 if shared else None, padding=1)


# name: sizes, each rank's T, routing, drop share, dtype, the local experts'
# implementation, a SwiGLU clamp, and `idle`: routes to the last rank's
# experts made -1 (that rank receives nothing).
CASES = {
    2: [dict(name="f64_uniform_loop", T=[13, 9], routing="uniform", drop=0.0,
             dtype="float64", impl="loop"),
        dict(name="f32_skewed_drop_grouped", T=[17, 11], routing="skewed", drop=0.2,
             dtype="float32", impl="grouped_mm"),
        dict(name="bf16_uniform_grouped", T=[24, 24], routing="uniform", drop=0.0,
             dtype="bfloat16", impl="grouped_mm"),
        dict(name="bf16_skewed_loop_clamp_no_shared", T=[10, 20], routing="skewed",
             drop=0.1, dtype="bfloat16", impl="loop", limit=0.5, shared=False)],
    4: [dict(name="f64_uneven_T0_drop", T=[7, 0, 12, 5], routing="uniform", drop=0.3,
             dtype="float64", impl="loop"),
        dict(name="f32_skewed_idle_rank", T=[9, 6, 13, 5], routing="skewed", drop=0.0,
             dtype="float32", impl="auto", idle=True, limit=1.0),
        dict(name="bf16_one_expert_a_rank_top4", T=[8, 8, 8, 8], routing="uniform",
             drop=0.0, dtype="bfloat16", impl="auto", experts_per_rank=1, top_k=4)],
}


def _case_shape(c, n):
    s = _shape(n, c.get("experts_per_rank", 4), c.get("shared", True))
    if "top_k" in c:
        s["top_k"] = c["top_k"]
    return s


def _rank_inputs(c, n, rank, seed):
    """Rank `rank`'s tokens and the group's weights of case `c` (every
    process rebuilds the same from `seed`)."""
    dtype = getattr(torch, c["dtype"])
    shape = _case_shape(c, n)
    weights = ep.make_weights(shape, seed, "cpu", dtype)
    a = ep.make_tokens(shape, rank, c["routing"], c["drop"], seed, "cpu", dtype,
                       tokens=c["T"][rank])
    if c.get("idle"):
        L = shape["experts"] // n
        a["top_experts"][a["top_experts"] >= (n - 1) * L] = -1
    return shape, weights, a


def _baseline_cases(n, rank, seed):
    """Each case of CASES[n] on this rank: its output's shape and dtype, its
    relative error against the reference, its routes and the routes its
    experts received."""
    results = []
    for c in CASES[n]:
        shape, weights, a = _rank_inputs(c, n, rank, seed)
        local = ep.local_weights(weights, rank, n)
        got = ep.torch_ep_forward(**a, **local, swiglu_limit=c.get("limit"),
                                  experts_impl=c["impl"])
        rounded = c["dtype"] == "bfloat16"
        ref = ep.reference_forward(**a, **weights, swiglu_limit=c.get("limit"),
                                   round_gate_up=rounded)
        L = shape["experts"] // n
        results.append(dict(case=c["name"], shape=list(got.shape),
                            dtype=str(got.dtype).replace("torch.", ""),
                            rel=ep.relative_error(got, ref),
                            routes=int((a["top_experts"] >= 0).sum()),
                            received=ep.routes_received(a["top_experts"], L)))
    return results


def _main_runs(n, rank, ports, out_dir):
    """The script's main() on the CPU (--cpu: gloo, the baseline alone) as
    torchrun would start it: once through checks and benchmark, once with
    the bound made impossible (every check fails). Its return code and what
    it printed, a run."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(n))
    common = ["--cpu", "--shape", "small", "--tokens", "16", "--rounds", "2", "--iters", "2",
              "--warmup", "1", "--out", out_dir, "--commit", "test"]
    runs = []
    for port, extra in zip(ports, (["--routing", "skewed", "--drop", "0.2"],
                                   ["--check-only"])):
        os.environ["MASTER_PORT"] = str(port)
        if extra == ["--check-only"]:
            ep.REL_BOUND = -1.0
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            rc = ep.main(common + extra)
        runs.append(dict(rc=rc, stdout=text.getvalue()))
    return runs


def _worker(rank, n, ports, seed, out_dir):
    """Rank `rank` of n (spawned): the baseline's cases on a gloo group, and
    with 2 ranks the script's main (each its own group, on the next ports);
    writes <out_dir>/rank<rank>.json."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        result = dict(baseline=_baseline_cases(n, rank, seed))
    finally:
        dist.destroy_process_group()
    if n == 2:
        result["main"] = _main_runs(n, rank, ports[1:], out_dir)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _free_ports(count):
    """`count` distinct free TCP ports of 127.0.0.1."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _wait(ctx, n):
    """Joins the spawned ranks (a rank's exception is raised here), killing
    them past TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"the {n} ranks did not finish in {TIMEOUT_S} s")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """group(n): (seed, folder, every rank's results) of one spawned group of
    n ranks (_worker), run once a module."""
    cache = {}

    def run(n):
        if n not in cache:
            seed = seed_for(f"ep_baseline_{n}")
            out = tmp_path_factory.mktemp(f"ep{n}")
            ctx = mp.spawn(_worker, args=(n, _free_ports(3), seed, str(out)), nprocs=n,
                           join=False)
            _wait(ctx, n)
            ranks = []
            for r in range(n):
                with open(out / f"rank{r}.json") as f:
                    ranks.append(json.load(f))
            cache[n] = seed, out, ranks
        return cache[n]
    return run


@pytest.mark.parametrize("n", sorted(CASES))
def test_baseline_matches_ep1_reference(n, group):
    seed, _, ranks = group(n)
    for i, c in enumerate(CASES[n]):
        rows = [ranks[r]["baseline"][i] for r in range(n)]
        bound = REL_BOUND if c["dtype"] == "bfloat16" else TIGHT[c["dtype"]]
        for r, row in enumerate(rows):
            assert row["case"] == c["name"]
            assert row["shape"] == [c["T"][r], 32] and row["dtype"] == c["dtype"]
            assert row["rel"] <= bound, \
                f"{c['name']}, rank {r} of {n}: relative error {row['rel']:.3e} > {bound}"
        # The routes each rank's experts received: every rank's tokens
        # rebuilt here, counted by destination.
        L = _case_shape(c, n)["experts"] // n
        expected = [0] * n
        for r in range(n):
            top = _rank_inputs(c, n, r, seed)[2]["top_experts"]
            for d in (top[top >= 0] // L).tolist():
                expected[d] += 1
        assert [row["received"] for row in rows] == expected, c["name"]
        assert sum(expected) == sum(row["routes"] for row in rows)
        if c.get("idle"):
            assert expected[-1] == 0 and sum(expected) > 0


def test_script_runs_on_cpu_with_gloo(group):
    """bench/ep_multi_gpu.py's main() on 2 ranks with --cpu (gloo, the
    baseline alone): its checks' lines and summary, its exit code on every
    rank (0, and 1 when a check fails), its JSON."""
    _, tmp_path, ranks = group(2)
    runs = [r["main"] for r in ranks]
    ok, failing = runs[0]
    assert ok["rc"] == 0 and failing["rc"] == 1
    assert all(rr[0]["rc"] == 0 and rr[1]["rc"] == 1 for rr in runs)  # every rank exits so
    lines = ok["stdout"].splitlines()
    assert any(line.startswith("rank 0: PASS") for line in lines), ok["stdout"]
    assert any(line.startswith("rank 1: PASS") for line in lines), ok["stdout"]
    assert "2 passed, 0 failed" in lines
    assert "skewed+drop0.2" in ok["stdout"] and "uniform: torch" in ok["stdout"]
    assert "0 passed, 2 failed" in failing["stdout"].splitlines()
    assert "FAIL (baseline rel" in failing["stdout"]
    assert runs[1][0]["stdout"] == ""  # rank 0 prints
    (written,) = [p for p in os.listdir(tmp_path) if p.startswith("ep_multi_gpu-")]
    assert written.startswith("ep_multi_gpu-small-ep2-skewed-drop0.2-")
    assert written.endswith("-test.json")
    with open(tmp_path / written) as f:
        doc = json.load(f)
    assert (doc["ep"], doc["experts"], doc["tokens"], doc["routing"], doc["drop"]) == \
        (2, 16, 16, "skewed", 0.2)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert r["torch_ms"] > 0 and len(r["torch_ms_rounds"]) == 2
        assert r["experts_impl"] == "grouped_mm" and "mok_ms" not in r
    assert sum(r["routes"] for r in doc["ranks"]) == \
        sum(r["routes_received"] for r in doc["ranks"])
    assert doc["torch_ms_max"] == max(r["torch_ms"] for r in doc["ranks"])
    assert len(doc["checks"]) == 2 and all(c["ok"] for c in doc["checks"])


def test_reference_restates_torch_reference():
    """reference_forward (each expert's weights to float64 in turn) is
    bench/torch_reference.py's forward, on bf16 inputs with -1 routes, a
    shared expert and a clamp."""
    from bench import torch_reference
    shape = dict(tokens=23, hidden=32, intermediate=16, experts=6, top_k=2,
                 shared_intermediate=8, padding=1)
    seed = seed_for("ep_reference")
    a = ep.make_tokens(shape, 0, "skewed", 0.25, seed, "cpu")
    w = ep.make_weights(shape, seed, "cpu")
    assert (a["top_experts"] == -1).any()
    for limit in (None, 0.75):
        mine = ep.reference_forward(**a, **w, swiglu_limit=limit)
        theirs = torch_reference.forward(dict(a, **w), shape["experts"], limit)
        assert torch.allclose(mine, theirs, rtol=1e-13, atol=1e-15)


def test_problem_is_deterministic_and_routing_is_as_described():
    shape = dict(tokens=400, hidden=16, intermediate=8, experts=16, top_k=4,
                 shared_intermediate=None, padding=1)
    one = ep.make_tokens(shape, 1, "uniform", 0.0, 5, "cpu")
    again = ep.make_tokens(shape, 1, "uniform", 0.0, 5, "cpu")
    other = ep.make_tokens(shape, 2, "uniform", 0.0, 5, "cpu")
    assert all(torch.equal(one[k], again[k]) for k in one)
    assert not torch.equal(one["x"], other["x"])
    w1, w2 = ep.make_weights(shape, 5, "cpu"), ep.make_weights(shape, 5, "cpu")
    assert ep.fingerprint(w1) == ep.fingerprint(w2)
    for routing in ("uniform", "skewed"):
        top = ep.make_tokens(shape, 0, routing, 0.0, 5, "cpu")["top_experts"]
        assert top.dtype == torch.int32 and top.shape == (400, 4)
        assert ((top >= 0) & (top < 16)).all()
        assert all(len(set(row)) == 4 for row in top.tolist())  # distinct experts
        counts = torch.bincount(top.reshape(-1).long(), minlength=16)
        if routing == "skewed":  # the first experts the most used
            assert counts[:4].sum() > 2 * counts[-4:].sum()
        else:
            assert counts.min() > 0.5 * counts.float().mean()
    dropped = ep.make_tokens(shape, 0, "uniform", 0.3, 5, "cpu")["top_experts"]
    share = (dropped == -1).float().mean().item()
    assert 0.2 < share < 0.4
    # A rank's local experts: contiguous slices of the group's.
    local = ep.local_weights(w1, 3, 4)
    assert torch.equal(local["gate_weights"], w1["gate_weights"][12:16])
    assert local["gate_weights"].is_contiguous()


def test_shapes_and_arguments():
    s = ep.ep_shape("dsv3-shard", 8)
    assert (s["experts"], s["hidden"], s["intermediate"], s["top_k"], s["tokens"],
            s["shared_intermediate"], s["padding"]) == (256, 7168, 2048, 8, 4096, 2048, 128)
    q = ep.ep_shape("qwen3-30b", 8)
    assert (q["experts"], q["hidden"], q["intermediate"], q["tokens"],
            q["shared_intermediate"]) == (128, 2048, 768, 4096, None)
    assert ep.ep_shape("qwen3-30b", 3)["experts"] == 48
    assert ep.ep_shape("small", 2)["experts"] == 16
    top = torch.tensor([[0, 1], [2, -1]])
    assert ep.flops_of(s, top) == 6 * 7168 * 2048 * 3 + 2 * 6 * 7168 * 2048
    assert ep.check_scenarios(0.0) == [("uniform", 0.0), ("uniform", 0.1),
                                      ("skewed", 0.0), ("skewed", 0.1)]
    assert ep.result_stem("qwen3-30b", 8, "skewed", 0.1, "2026-12-04", "abc1234") == \
        "ep_multi_gpu-qwen3-30b-ep8-skewed-drop0.1-2026-12-04-abc1234"
    args = ep.parse_args(["--shape", "small", "--check-only"])
    assert args.check_only and args.out == "docs/perf" and args.shape == "small"
    for bad in (["--drop", "1"], ["--iters", "0"], ["--shape", "huge"]):
        with pytest.raises(SystemExit):
            ep.parse_args(bad)
