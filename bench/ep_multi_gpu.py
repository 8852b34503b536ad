#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Expert parallelism on several GPUs of one host: mok's ep = N forward
against a plain-PyTorch expert-parallel layer, N ranks started by torchrun,
one GPU each (docs/ExpertParallel.md, "Expert parallelism on several GPUs").

    # from the repository root, PYTHONPATH reaching the mok package (with
    # the runtime extension) and this package:
    PYTHONPATH=build/python:. torchrun --nproc-per-node 8 -m bench.ep_multi_gpu \\
        [--shape dsv3-shard|qwen3-30b|small] [--routing uniform|skewed] \\
        [--drop FRACTION] [--out DIR] [--check-only]

The problem. Every rank builds the same global problem from --seed: the E
routed experts' weights (each expert's from a generator seeded by the seed
and the expert id, on the rank's GPU; a fingerprint of them is compared
across ranks) and any rank's tokens (x, top-k expert ids, router weights;
from a CPU generator seeded by the seed, the rank, the routing and the
drop share), so a
rank slices its own local experts [r E/N, (r+1) E/N) and can rebuild any
rank's tokens. Routing "uniform": each token's k experts a uniform random
k-subset of the E; "skewed": drawn without replacement with probability
proportional to 1 / (expert + 1)^1.2 (Zipf-like, the Gumbel top-k draw),
so rank 0's experts receive the most; --drop: that share of the routes
becomes -1 (no route). Weights scaled by H^-0.5 (gate, up) and I^-0.5
(down), bf16.

The checks (every run; --check-only stops after them). For uniform and
skewed routing, each without and with -1 routes (--drop, or 0.1 when
--drop is 0): each rank's mok output (computed twice into outputs
poisoned with NaN first) against the float64 reference of the ep = 1
layer on the rank's tokens with all E experts (`reference_forward`: the
semantics of bench/torch_reference.py's `forward`, gate and up rounded to
bf16, each expert's weights converted to float64 in turn), the house's
relative error sum|got - ref| / sum|ref| (bench.torch_reference's
`relative_error`) within 1e-2 (python/tests/gpu/test_gpu_forward.py's
bound), no NaN, and the two outputs bitwise equal; and the PyTorch
baseline's output against the same reference and bound. With --vs-ep1
also against mok's ep = 1 layer with all E experts on the rank's tokens,
bit for bit (what docs/ExpertParallel.md promises; it compiles a second
kernel). Rank 0 prints one line a rank and `N passed, M failed`; every
rank exits 1 when a check failed (no benchmark then).

The PyTorch baseline (`torch_ep_forward`): what a user writes with
torch.distributed. Count the routes per destination rank,
all_to_all_single of the counts (then read on the host: the split sizes
of the next exchanges), all_to_all_single of the routed rows, **one row
per route** (not once per destination rank as mok sends them) with the
local expert id of each, the local experts as a grouped GEMM
(torch._grouped_mm over the received rows sorted by local expert, bf16 on
the GPU; a loop of one torch.matmul an expert where _grouped_mm lacks the
dtype, e.g. float64 on the CPU), SwiGLU in fp32 rounded to bf16, the down
projection, all_to_all_single of the results back (one row a route), and
on the source rank the fp32 combine of the routes weighted by their
router weights (index_add_) plus the shared expert on the rank's own
tokens. It runs on NCCL with CUDA tensors here and on gloo with CPU
tensors in python/tests/test_ep_baseline.py. Its collectives run on the
default group (WORLD); mok's communicator is adopted from a second group,
so the two share no NCCL communicator.

The benchmark (unless --check-only): for the --routing and --drop given,
mok's forward and the baseline's, in --rounds alternating rounds; each
round --warmup calls, then --iters calls with CUDA events around each
(enqueued back to back; the baseline synchronizes on its counts inside),
dist.barrier before and after each timed region; a rank's time is the
median over the rounds of its per-round medians. FLOPs of a rank: 6 H I
per route of its tokens (-1 routes excluded) plus 6 H Is per token with a
shared expert; per-rank TFLOP/s = those / its time, and the group's
TFLOP/s per GPU = the sum over ranks / (N x the slowest rank's time).
speedup = the baseline's time / mok's (the slowest rank's of each). Rank 0
writes <out>/ep_multi_gpu-<shape>-ep<N>-<routing>[-drop<d>]-<date>-<commit>.json
(the docs/perf naming) and prints the table.

--baseline-only runs the checks and the benchmark of the baseline alone
(no mok layer: e.g. before the GPU target compiles ep > 1); --cpu runs the
whole script on the CPU with gloo, the baseline alone (the timings are the
host's clock; python/tests/test_ep_baseline.py runs it so). When the mok
layer cannot be compiled or loaded on a rank, every rank says why, the
baseline is still checked, and the run fails; an error raised by a mok
call is reported as that scenario's failure. One raised on one rank alone
may leave the other ranks waiting for it in their kernels or in the next
collective: such a run has to be ended by hand.

NCCL_NVLS_ENABLE=0 is set before NCCL starts (no NVLink multicast).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib

import torch
import torch.distributed as dist

PROG = "torchrun --nproc-per-node N -m bench.ep_multi_gpu"
REL_BOUND = 1e-2
ZIPF_EXPONENT = 1.2
DEFAULT_CHECK_DROP = 0.1
SHARED = ("shared_gate_weights", "shared_up_weights", "shared_down_weights")


# --- shapes -------------------------------------------------------------

def ep_shape(name, n):
    """The layer of `name` at ep = n: a dict of LayerSpec's fields (tokens
    a rank) and routing-free. dsv3-shard: bench/shapes.py's DeepSeek-V3
    shard (32 experts) as each rank's part, E = 32 n; qwen3-30b:
    bench/shapes.py's Qwen3-30B-A3B with T = 4096 a rank, its E = 128 split
    over the ranks (16 n where n does not divide 128); small: a quick one
    for smoke tests (a shared expert, 8 experts a rank)."""
    from bench.shapes import SHAPES
    fields = ("tokens", "hidden", "intermediate", "experts", "top_k",
              "shared_intermediate", "padding")
    if name == "dsv3-shard":
        s = {f: SHAPES["dsv3-shard"][f] for f in fields}
        s.update(experts=32 * n)
    elif name == "qwen3-30b":
        s = {f: SHAPES["qwen3-30b"].get(f) for f in fields}
        s.update(tokens=4096, experts=128 if 128 % n == 0 else 16 * n)
    elif name == "small":
        s = dict(tokens=512, hidden=1024, intermediate=512, experts=8 * n, top_k=4,
                 shared_intermediate=512, padding=128)
    else:
        raise ValueError(f"unknown shape {name!r}; expected one of {', '.join(EP_SHAPES)}")
    return s


EP_SHAPES = ("dsv3-shard", "qwen3-30b", "small")


def flops_of(shape, top):
    """The FLOPs of a rank's tokens: 6 H I a route (-1 routes excluded) and
    6 H Is a token with a shared expert."""
    H, I = shape["hidden"], shape["intermediate"]
    routes = int((top >= 0).sum())
    shared = top.shape[0] * 6 * H * shape["shared_intermediate"] \
        if shape.get("shared_intermediate") else 0
    return 6 * H * I * routes + shared


# --- the problem --------------------------------------------------------

def _seed(*parts):
    """A 63-bit seed from `parts` (stable across processes and hosts)."""
    text = "/".join(str(p) for p in parts).encode()
    return (zlib.crc32(text) << 31 | zlib.crc32(text[::-1])) & (2**63 - 1)


def make_weights(shape, seed, device, dtype=torch.bfloat16):
    """The group's weights, all E experts: gate_weights, up_weights [E, I, H],
    down_weights [E, H, I] and, with a shared expert, shared_gate_weights,
    shared_up_weights [Is, H], shared_down_weights [H, Is]; in `dtype` on
    `device`. Each expert's (and each shared tensor) from a generator on
    `device` seeded by `seed` and its name: the same on every rank (of one
    device type)."""
    E, H, I = shape["experts"], shape["hidden"], shape["intermediate"]

    def draw(name, rows, cols, scale):
        g = torch.Generator(device=device).manual_seed(_seed(seed, name))
        return (torch.randn(rows, cols, generator=g, device=device) * scale).to(dtype)

    def experts(name, rows, cols, scale):
        t = torch.empty(E, rows, cols, dtype=dtype, device=device)
        for e in range(E):
            t[e] = draw(f"{name}/{e}", rows, cols, scale)
        return t

    w = dict(gate_weights=experts("gate", I, H, H ** -0.5),
             up_weights=experts("up", I, H, H ** -0.5),
             down_weights=experts("down", H, I, I ** -0.5))
    s = shape.get("shared_intermediate")
    if s:
        w.update(shared_gate_weights=draw("shared_gate", s, H, H ** -0.5),
                 shared_up_weights=draw("shared_up", s, H, H ** -0.5),
                 shared_down_weights=draw("shared_down", H, s, s ** -0.5))
    return w


def local_weights(weights, rank, n):
    """Rank `rank`'s part of the group's weights: its experts
    [rank E/n, (rank+1) E/n) (views, contiguous), and the shared expert."""
    L = weights["gate_weights"].shape[0] // n
    local = {k: v[rank * L:(rank + 1) * L] for k, v in weights.items()
             if k not in SHARED}
    local.update((k, v) for k, v in weights.items() if k in SHARED)
    return local


def make_routing(T, E, k, routing, drop, gen):
    """top_experts [T, k] int64 (CPU) from `gen`: "uniform" (a uniform random
    k-subset of the E experts a token) or "skewed" (k drawn without
    replacement, probability proportional to 1 / (e + 1)^ZIPF_EXPONENT: the
    Gumbel top-k draw); then a share `drop` of the routes set to -1."""
    if routing == "uniform":
        top = torch.rand(T, E, generator=gen, dtype=torch.float64).topk(k, dim=1).indices
    elif routing == "skewed":
        logp = -ZIPF_EXPONENT * torch.log(torch.arange(1, E + 1, dtype=torch.float64))
        u = torch.rand(T, E, generator=gen, dtype=torch.float64).clamp_min(1e-300)
        top = (logp - torch.log(-torch.log(u))).topk(k, dim=1).indices
    else:
        raise ValueError(f"routing: expected 'uniform' or 'skewed', got {routing!r}")
    if drop:
        top[torch.rand(T, k, generator=gen) < drop] = -1
    return top


def make_tokens(shape, rank, routing, drop, seed, device, dtype=torch.bfloat16,
                tokens=None):
    """Rank `rank`'s inputs: x [T, H] (`dtype`), top_experts [T, k] int32
    (global ids, -1 = no route), router_weights [T, k] float32 (softmax of
    normal logits), on `device`; drawn on the CPU from a generator seeded by
    `seed`, the rank, the routing and the drop share, so any rank can
    rebuild any other's. T: `tokens`, else the shape's."""
    T = shape["tokens"] if tokens is None else tokens
    H, E, k = shape["hidden"], shape["experts"], shape["top_k"]
    gen = torch.Generator().manual_seed(_seed(seed, "tokens", rank, routing, drop))
    top = make_routing(T, E, k, routing, drop, gen)
    w = torch.softmax(torch.randn(T, k, generator=gen), dim=1)
    x = torch.randn(T, H, generator=gen).to(dtype)
    return dict(x=x.to(device), top_experts=top.to(torch.int32).to(device),
                router_weights=w.to(device))


def fingerprint(weights):
    """A float64 per weight tensor (a strided sample's sum): equal on every
    rank when the ranks built the same weights."""
    out = []
    for name in sorted(weights):
        flat = weights[name].reshape(-1)
        step = max(1, flat.numel() // 65_521)
        out.append(flat[::step].double().sum().item())
    return out


# --- the float64 reference ----------------------------------------------

def reference_forward(x, top_experts, router_weights, gate_weights, up_weights,
                      down_weights, shared_gate_weights=None, shared_up_weights=None,
                      shared_down_weights=None, swiglu_limit=None, round_gate_up=True):
    """The ep = 1 layer over all E experts in float64, for x's tokens: the
    semantics of bench/torch_reference.py's `forward` (gate and up rounded
    to bf16 when `round_gate_up`, as the layer stores them; the rest exact),
    each expert's weights converted to float64 in turn (all E at once would
    be 4x the bf16 weights). On x's device."""
    xd = x.double()
    limit = swiglu_limit

    def mlp(xs, wg, wu, wd):
        g = xs @ wg.double().T
        u = xs @ wu.double().T
        if round_gate_up:
            g = g.float().to(torch.bfloat16).double()
            u = u.float().to(torch.bfloat16).double()
        if limit is not None:
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
        return (g * torch.sigmoid(g) * u) @ wd.double().T

    out = torch.zeros_like(xd)
    if shared_gate_weights is not None:
        out += mlp(xd, shared_gate_weights, shared_up_weights, shared_down_weights)
    top = top_experts.long()
    w = router_weights.double()
    for e in range(gate_weights.shape[0]):
        t, j = (top == e).nonzero(as_tuple=True)
        if len(t):
            y = mlp(xd[t], gate_weights[e], up_weights[e], down_weights[e])
            out.index_add_(0, t, w[t, j].unsqueeze(1) * y)
    return out


def relative_error(got, ref):
    """The house's metric: sum|got - ref| / sum|ref| (NaN if got holds one);
    bench.torch_reference.relative_error."""
    from bench.torch_reference import relative_error as rel
    return rel(got, ref)


# --- the PyTorch expert-parallel baseline -------------------------------

def _accumulator(dtype):
    """The dtype of the SwiGLU and the combine: fp32 for 16-bit inputs,
    else the inputs' own (float32, float64 on the CPU tests)."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _swiglu(g, u, limit, dtype):
    acc = _accumulator(dtype)
    g, u = g.to(acc), u.to(acc)
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return (torch.nn.functional.silu(g) * u).to(dtype)


def experts_impl_for(x):
    """"grouped_mm" where torch._grouped_mm takes x's dtype on its device
    (bf16 on a CUDA GPU; float32, bf16, fp16 on the CPU), else "loop" (one
    torch.matmul an expert)."""
    if not hasattr(torch, "_grouped_mm"):
        return "loop"
    if x.is_cuda:
        return "grouped_mm" if x.dtype == torch.bfloat16 else "loop"
    return "grouped_mm" if x.dtype in (torch.float32, torch.bfloat16, torch.float16) \
        else "loop"


def local_experts_forward(xr, er, gate, up, down, limit=None, impl="auto"):
    """The local experts on received rows: xr [R, H], er [R] the local expert
    id of each (in [0, L)); gate, up [L, I, H], down [L, H, I]. y [R, H] in
    xr's order. The rows are sorted by expert (stable) for the GEMMs: one
    torch._grouped_mm each for gate, up and down (impl "grouped_mm") or one
    torch.matmul an expert (impl "loop"); "auto": experts_impl_for(xr)."""
    L, H = gate.shape[0], down.shape[1]
    if impl == "auto":
        impl = experts_impl_for(xr)
    if xr.shape[0] == 0:
        return xr.new_empty(0, H)
    order = torch.argsort(er, stable=True)
    xs = xr[order]
    counts = torch.bincount(er, minlength=L)
    if impl == "grouped_mm":
        offs = torch.cumsum(counts, 0).to(torch.int32)
        g = torch._grouped_mm(xs, gate.transpose(1, 2), offs=offs)
        u = torch._grouped_mm(xs, up.transpose(1, 2), offs=offs)
        ys = torch._grouped_mm(_swiglu(g, u, limit, xr.dtype), down.transpose(1, 2),
                               offs=offs)
    elif impl == "loop":
        ys = xr.new_empty(xs.shape[0], H)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                a = xs[start:start + n]
                h = _swiglu(a @ gate[e].T, a @ up[e].T, limit, xr.dtype)
                ys[start:start + n] = h @ down[e].T
                start += n
    else:
        raise ValueError(f"impl: expected 'auto', 'grouped_mm' or 'loop', got {impl!r}")
    y = torch.empty_like(ys)
    y[order] = ys
    return y


def torch_ep_forward(x, top_experts, router_weights, gate_weights, up_weights,
                     down_weights, shared_gate_weights=None, shared_up_weights=None,
                     shared_down_weights=None, group=None, swiglu_limit=None,
                     experts_impl="auto"):
    """This rank's output [T, H] (x's dtype) of the expert-parallel layer, in
    plain PyTorch over `group` (a torch.distributed process group: NCCL with
    CUDA tensors, gloo with CPU ones; None: the default group). Arguments as
    mok's: global expert ids in top_experts (-1: no route), this rank's
    L = E / N local experts' weights [L, ...], the shared expert's (or None).

    One row a route crosses each way (a token with two routes to a rank is
    sent twice; mok sends it once), sorted by destination rank, then token,
    then k. The counts go first (all_to_all_single of one int a rank) and
    are read on the host: they are the split sizes of the row exchanges."""
    n = dist.get_world_size(group)
    L = gate_weights.shape[0]
    T, k = top_experts.shape
    H = x.shape[1]
    acc = _accumulator(x.dtype)
    flat = top_experts.reshape(-1).long()
    valid = (flat >= 0).nonzero().squeeze(1)  # route ids t * k + j
    dest = flat[valid] // L
    order = torch.argsort(dest, stable=True)
    routes = valid[order]  # by destination rank, then token, then j
    send_counts = torch.bincount(dest, minlength=n)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    received = sum(recv_splits)
    token = routes // k
    send_x = x[token]
    send_e = flat[routes] % L  # the local expert id on the destination
    recv_x = x.new_empty(received, H)
    recv_e = send_e.new_empty(received)
    dist.all_to_all_single(recv_x, send_x, recv_splits, send_splits, group=group)
    dist.all_to_all_single(recv_e, send_e, recv_splits, send_splits, group=group)
    y = local_experts_forward(recv_x, recv_e, gate_weights, up_weights, down_weights,
                              swiglu_limit, experts_impl)
    back = x.new_empty(routes.shape[0], H)
    dist.all_to_all_single(back, y, send_splits, recv_splits, group=group)
    out = torch.zeros(T, H, dtype=acc, device=x.device)
    weight = router_weights.reshape(-1)[routes].to(acc).unsqueeze(1)
    out.index_add_(0, token, back.to(acc) * weight)
    if shared_gate_weights is not None:
        h = _swiglu(x @ shared_gate_weights.T, x @ shared_up_weights.T, swiglu_limit,
                    x.dtype)
        out += (h @ shared_down_weights.T).to(acc)
    return out.to(x.dtype)


def routes_received(top_experts, L, group=None):
    """The routes this rank's experts receive from every rank (an int)."""
    n = dist.get_world_size(group)
    flat = top_experts.reshape(-1).long()
    dest = flat[flat >= 0] // L
    send = torch.bincount(dest, minlength=n)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return int(recv.sum())


# --- the run on the GPUs ------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="dsv3-shard", choices=EP_SHAPES)
    ap.add_argument("--routing", default="uniform", choices=("uniform", "skewed"),
                    help="the benchmark's routing (the checks run both)")
    ap.add_argument("--drop", type=float, default=0.0,
                    help="fraction of routes set to -1 in the benchmark; the checks use "
                         f"both none and this fraction ({DEFAULT_CHECK_DROP} when it is 0)")
    ap.add_argument("--out", default="docs/perf", help="folder of the JSON (rank 0)")
    ap.add_argument("--check-only", action="store_true", help="the checks, no benchmark")
    ap.add_argument("--baseline-only", action="store_true",
                    help="the PyTorch baseline alone (no mok layer compiled)")
    ap.add_argument("--vs-ep1", action="store_true",
                    help="also check mok's output against its ep = 1 layer with all E "
                         "experts, bit for bit (compiles a second kernel)")
    ap.add_argument("--tokens", type=int, default=None, help="T a rank (default: the shape's)")
    ap.add_argument("--recv-capacity", type=int, default=None,
                    help="LayerSpec.recv_capacity (default: what can be sent)")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true",
                    help="the whole run on the CPU with gloo, the baseline alone "
                         "(python/tests/test_ep_baseline.py)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds of mok and baseline timings")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20, help="timed calls a round")
    ap.add_argument("--commit", default=os.environ.get("MOK_COMMIT"),
                    help="the commit (recorded, and in the file name; default "
                         "$MOK_COMMIT, else git's HEAD)")
    args = ap.parse_args(argv)
    if not 0 <= args.drop < 1:
        ap.error(f"--drop: expected a fraction in [0, 1), got {args.drop}")
    for name in ("rounds", "iters"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: expected at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup: expected at least 0, got {args.warmup}")
    if args.tokens is not None and args.tokens < 1:
        ap.error(f"--tokens: expected at least 1, got {args.tokens}")
    return args


def check_scenarios(drop):
    """(routing, drop) of the checks: uniform and skewed, each without and
    with -1 routes (`drop`, or DEFAULT_CHECK_DROP when it is 0)."""
    d = drop if drop > 0 else DEFAULT_CHECK_DROP
    return [(r, p) for r in ("uniform", "skewed") for p in (0.0, d)]


def scenario_name(routing, drop):
    return routing if not drop else f"{routing}+drop{drop:g}"


def commit_of(given):
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def result_stem(shape_name, n, routing, drop, date, commit):
    """The JSON's file name without .json: docs/perf's <benchmark>-<variant>-
    <date>-<commit>."""
    variant = f"{shape_name}-ep{n}-{routing}" + (f"-drop{drop:g}" if drop else "")
    return f"ep_multi_gpu-{variant}-{date}-{commit}"


def _gather(obj):
    """Every rank's `obj`, in rank order (on every rank)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class _Mok:
    """mok's ep = N layer of this rank (compiled here, bound to `comm`), and
    optionally its ep = 1 layer over all E experts (--vs-ep1)."""

    def __init__(self, shape, n, args, comm, device):
        import mok
        spec = mok.LayerSpec(tokens=shape["tokens"], hidden=shape["hidden"],
                             intermediate=shape["intermediate"], experts=shape["experts"],
                             top_k=shape["top_k"], ep=n, padding=shape["padding"],
                             shared_intermediate=shape.get("shared_intermediate"),
                             recv_capacity=args.recv_capacity)
        t0 = time.perf_counter()
        art = mok.compile(spec, target=args.target)
        self.compile_s = time.perf_counter() - t0
        self.layer = art.load(comm=comm)
        self.ep1 = None
        if args.vs_ep1:
            one = mok.LayerSpec(tokens=shape["tokens"], hidden=shape["hidden"],
                                intermediate=shape["intermediate"],
                                experts=shape["experts"], top_k=shape["top_k"],
                                padding=shape["padding"],
                                shared_intermediate=shape.get("shared_intermediate"))
            self.ep1 = mok.compile(one, target=args.target).load(device=device)

    def __call__(self, inputs, local, out=None):
        return self.layer(**inputs, **local, out=out)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _poisoned(T, H, device):
    return torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=device)


def run_checks(shape, args, rank, n, device, weights, local, layer, baseline_group):
    """This rank's checks over check_scenarios(): a dict with `ok`, `lines`
    (one short phrase a scenario) and `scenarios` (the numbers)."""
    T, H = shape["tokens"], shape["hidden"]
    ok, phrases, records = True, [], []
    for routing, drop in check_scenarios(args.drop):
        name = scenario_name(routing, drop)
        a = make_tokens(shape, rank, routing, drop, args.seed, device)
        ref = reference_forward(**a, **weights)
        rec = dict(scenario=name, routes=int((a["top_experts"] >= 0).sum()))
        problems, first, second = [], None, None
        base = torch_ep_forward(**a, **local, group=baseline_group)
        _sync(device)
        rec["torch_rel_err"] = relative_error(base, ref)
        if not rec["torch_rel_err"] <= REL_BOUND:  # (NaN fails too)
            problems.append(f"baseline rel {rec['torch_rel_err']:.2e}")
        if layer is not None:
            try:
                first = layer(a, local, out=_poisoned(T, H, device))
                second = layer(a, local, out=_poisoned(T, H, device))
                _sync(device)
            except Exception as e:  # e.g. past the receive capacity: on every rank
                rec["mok_error"] = f"{type(e).__name__}: {e}"
                problems.append(f"mok raised {rec['mok_error']}")
                first = second = None
        if first is not None:
            rec["mok_rel_err"] = relative_error(first, ref)
            rec["mok_nan"] = bool(torch.isnan(first).any())
            rec["mok_repeatable"] = bool(torch.equal(first, second))
            if not rec["mok_rel_err"] <= REL_BOUND:
                problems.append(f"mok rel {rec['mok_rel_err']:.2e}"
                                + (" (NaN: unwritten rows?)" if rec["mok_nan"] else ""))
            if not rec["mok_repeatable"]:
                problems.append("mok not bitwise repeatable")
            if layer.ep1 is not None:
                one = layer.ep1(**a, **weights, out=_poisoned(T, H, device))
                _sync(device)
                rec["mok_equals_ep1"] = bool(torch.equal(first, one))
                if not rec["mok_equals_ep1"]:
                    problems.append("mok differs from its ep = 1 layer")
        rec["problems"] = problems
        ok = ok and not problems
        errs = f"torch {rec['torch_rel_err']:.2e}"
        if "mok_rel_err" in rec:
            errs = f"mok {rec['mok_rel_err']:.2e} {errs}"
        phrases.append(f"{name}: {errs}" + (f" FAIL ({'; '.join(problems)})"
                                           if problems else ""))
        records.append(rec)
        del a, ref, base, first, second
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return dict(ok=ok, lines=phrases, scenarios=records)


def time_calls(fn, warmup, iters, barrier, device):
    """Median ms of `fn` over `iters` calls (CUDA events around each, the
    calls enqueued back to back; on the CPU the host's clock), after
    `warmup` calls; barrier() before and after the timed region."""
    for _ in range(warmup):
        fn()
    _sync(device)
    barrier()
    if device.type != "cuda":
        ms = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
        barrier()
        return statistics.median(ms)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    barrier()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def run_benchmark(contestants, args, barrier, device):
    """{name: (median over the rounds of each round's median ms, the
    rounds' ms)} for `contestants` ({name: fn}), timed in alternating
    rounds."""
    per = {name: [] for name in contestants}
    for _ in range(args.rounds):
        for name, fn in contestants.items():
            per[name].append(time_calls(fn, args.warmup, args.iters, barrier, device))
    return {name: (statistics.median(ms), ms) for name, ms in per.items()}


def summarize(ranks, names, n):
    """The group's numbers from every rank's record: per contestant the
    slowest rank's ms and the group's TFLOP/s per GPU; speedup = the
    baseline's slowest / mok's slowest."""
    flops = sum(r["flops"] for r in ranks)
    out = {}
    for name in names:
        slowest = max(r[f"{name}_ms"] for r in ranks)
        out[f"{name}_ms_max"] = slowest
        out[f"{name}_group_tflops_per_gpu"] = flops / n / (slowest * 1e-3) / 1e12
    if "mok" in names and "torch" in names:
        out["speedup"] = out["torch_ms_max"] / out["mok_ms_max"]
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.cpu:
        args.baseline_only = True
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast (before NCCL starts)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
        torch.backends.cuda.matmul.allow_tf32 = False
    rank, n = dist.get_rank(), dist.get_world_size()

    def barrier():
        if device.type == "cuda":
            dist.barrier(device_ids=[local_rank])
        else:
            dist.barrier()

    def say(text):
        if rank == 0:
            print(text, flush=True)

    shape = ep_shape(args.shape, n)
    if args.tokens is not None:
        shape["tokens"] = args.tokens
    if shape["experts"] % n:
        sys.exit(f"{PROG}: {args.shape} has {shape['experts']} experts, not a multiple of "
                 f"{n} ranks")
    say(f"{args.shape} at ep = {n}: T = {shape['tokens']} a rank, H = {shape['hidden']}, "
        f"I = {shape['intermediate']}, E = {shape['experts']} "
        f"({shape['experts'] // n} a rank), k = {shape['top_k']}, shared "
        f"{shape.get('shared_intermediate') or 'none'}, padding {shape['padding']}")

    weights = make_weights(shape, args.seed, device)
    prints = _gather(fingerprint(weights))
    if any(p != prints[0] for p in prints):
        sys.exit(f"{PROG}: rank {rank}: the ranks built different weights from one seed "
                 f"(fingerprints {prints}); are the GPUs of one kind?")
    local = local_weights(weights, rank, n)

    # mok gets a process group (an NCCL communicator) of its own; the
    # baseline's collectives run on WORLD.
    layer, mok_error, versions = None, None, {}
    if not args.baseline_only:
        mok_group = dist.new_group(list(range(n)))
        try:
            import mok
            comm = mok.Communicator.adopt(mok_group)
            layer = _Mok(shape, n, args, comm, local_rank)
            versions["mok_nccl"] = list(mok.load_nccl())
        except Exception as e:  # reported by every rank, below
            mok_error = f"{type(e).__name__}: {e}"
        errors = _gather(mok_error)
        if any(errors):
            layer = None  # every rank runs the baseline alone, then fails
            mok_error = mok_error or "another rank's mok layer failed"

    checks = run_checks(shape, args, rank, n, device, weights, local, layer, None)
    if mok_error:
        checks["ok"] = False
        checks["lines"].insert(0, f"mok layer: {mok_error}")
    everyone = _gather(checks)
    for r, c in enumerate(everyone):
        say(f"rank {r}: {'PASS' if c['ok'] else 'FAIL'}  " + "; ".join(c["lines"]))
    passed = sum(c["ok"] for c in everyone)
    say(f"{passed} passed, {n - passed} failed")
    if passed != n or args.check_only:
        dist.destroy_process_group()
        return 0 if passed == n else 1

    # The benchmark, on the routing asked for.
    a = make_tokens(shape, rank, args.routing, args.drop, args.seed, device)
    contestants = {}
    if layer is not None:
        contestants["mok"] = lambda: layer(a, local)
    contestants["torch"] = lambda: torch_ep_forward(**a, **local)
    timed = run_benchmark(contestants, args, barrier, device)
    flops = flops_of(shape, a["top_experts"])
    mine = dict(rank=rank, flops=flops, routes=int((a["top_experts"] >= 0).sum()),
                routes_received=routes_received(a["top_experts"], shape["experts"] // n),
                experts_impl=experts_impl_for(a["x"]))
    for name, (ms, rounds) in timed.items():
        mine.update({f"{name}_ms": ms, f"{name}_ms_rounds": rounds,
                     f"{name}_tflops": flops / (ms * 1e-3) / 1e12})
    ranks = _gather(mine)
    if rank == 0:
        summary = summarize(ranks, list(contestants), n)
        date = time.strftime("%Y-%m-%d")
        commit = commit_of(args.commit)
        doc = dict(benchmark="bench.ep_multi_gpu", date=date, commit=commit,
                   gpu=torch.cuda.get_device_name(device) if device.type == "cuda"
                   else "cpu", torch=torch.__version__,
                   nccl=".".join(map(str, torch.cuda.nccl.version()))
                   if device.type == "cuda" else None, **versions,
                   target=args.target, ep=n, shape=args.shape, **shape,
                   routing=args.routing, drop=args.drop, seed=args.seed,
                   recv_capacity=args.recv_capacity, rounds=args.rounds,
                   warmup=args.warmup, iters=args.iters,
                   compile_s=layer.compile_s if layer is not None else None,
                   method=("median over rounds of per-round medians of CUDA-event times; "
                           "FLOPs 6 H I a route + 6 H Is a token (shared); baseline: one "
                           "row a route each way, all_to_all_single, "
                           f"{mine['experts_impl']} local experts"),
                   checks=[dict(rank=r, **c) for r, c in enumerate(everyone)],
                   ranks=ranks, **summary)
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, result_stem(args.shape, n, args.routing, args.drop,
                                                  date, commit) + ".json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        names = list(contestants)
        print(f"\n{doc['gpu']} x {n}  torch {doc['torch']}  NCCL {doc['nccl']}  "
              f"{args.shape} {scenario_name(args.routing, args.drop)}")
        print(f"{'rank':>4s} {'routes':>8s} {'received':>9s} "
              + " ".join(f"{nm + ' ms':>10s} {nm + ' TF/s':>11s}" for nm in names))
        for r in ranks:
            print(f"{r['rank']:4d} {r['routes']:8d} {r['routes_received']:9d} "
                  + " ".join(f"{r[nm + '_ms']:10.3f} {r[nm + '_tflops']:11.1f}"
                             for nm in names))
        print("slowest rank: " + ", ".join(
            f"{nm} {summary[nm + '_ms_max']:.3f} ms "
            f"({summary[nm + '_group_tflops_per_gpu']:.1f} TFLOP/s a GPU)" for nm in names)
            + (f", speedup {summary['speedup']:.3f}" if "speedup" in summary else ""))
        print(f"wrote {path}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
