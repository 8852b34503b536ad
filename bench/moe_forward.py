#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Forward MoE layer: mok against a plain-PyTorch layer, in one process, on
the same inputs, on one GPU.

For each shape: check mok's output against a float64 reference, then time
mok's forward and the PyTorch layer (routes sorted by expert, gather,
torch._grouped_mm for gate+up and down, clamped SwiGLU, weighted index_add_
combine, shared expert) with CUDA events (median after warm-up) in
--rounds alternating rounds (mok, PyTorch, mok, ...: the GPU's clock and
power state fall on both alike; each reported time is the median of the
rounds' medians, the rounds' values in the JSON), and an 8192^3 bf16
torch.matmul for the ceiling. FLOPs = 6 (T k + T_shared) H I.
When <artifacts>/<shape>-profile exists (bench.compile compiles it), also
a phase breakdown: the same layer compiled to record the global timer after
each grid barrier, median milliseconds per phase over the timed runs
(profiling adds one barrier; its total is close to, not equal to, mok ms).
An FP8 shape (<shape>-fp8, or -fp8w with the weights quantized beforehand,
untimed) is also compared with mok's bf16 layer of its shape timed in the
same run (speedup_vs_bf16); its TFLOP/s count the same FLOPs as bf16's,
and its error is against the bf16 reference.
Writes <out>/moe_forward.json and .png; prints the tables last.

    # on the GPU machine, from the repository root, after
    # scripts/gpu/run_h200.sh built build-gpu/
    PYTHONPATH=build-gpu/python python3 -m bench.moe_forward \\
        --artifacts bench-artifacts --out /tmp/bench
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import mok
from bench.shapes import FORWARD_SHAPES, SHAPES
from bench.torch_reference import forward as reference, make_inputs, quantized_weight_args
from bench.torch_reference import relative_error as rel_error


def swiglu(g, u, limit):
    g, u = g.float(), u.float()
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return (torch.nn.functional.silu(g) * u).to(torch.bfloat16)


def torch_layer(a, limit=None):
    """What a user would write in plain PyTorch (bf16 GEMMs, fp32 combine)."""
    x, top, w = a["x"], a["top_experts"], a["router_weights"]
    T, k = top.shape
    E = a["gate_weights"].shape[0]
    flat = top.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    token = order // k
    counts = torch.bincount(expert, minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xs = x[token]
    g = torch._grouped_mm(xs, a["gate_weights"].transpose(1, 2), offs=offs)
    u = torch._grouped_mm(xs, a["up_weights"].transpose(1, 2), offs=offs)
    y = torch._grouped_mm(swiglu(g, u, limit), a["down_weights"].transpose(1, 2), offs=offs)
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    out.index_add_(0, token, y.float() * w.reshape(-1)[order].unsqueeze(1))
    if "shared_gate_weights" in a:
        hs = swiglu(x @ a["shared_gate_weights"].T, x @ a["shared_up_weights"].T, limit)
        out += (hs @ a["shared_down_weights"].T).float()
    return out.to(torch.bfloat16)


def median_event_ms(fn, iters, sync_each=False):
    """Median milliseconds of `fn` over `iters` calls, CUDA events around
    each call; the calls enqueued back to back with one synchronization at
    the end, or (sync_each) a synchronization after every call."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for a, b in events:
        a.record()
        fn()
        b.record()
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def time_ms(fn, budget_s, min_iters=3, max_iters=50):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    iters = max(min_iters, min(max_iters, int(budget_s / max(one, 1e-6))))
    # Events around each call, the calls enqueued back to back and one
    # synchronization at the end (as triton.testing.do_bench): the GPU time
    # of a layer in a running model, where the host is ahead of the GPU.
    # (Synchronizing after every call also timed the host's Python work
    # before the first kernel reached the idle GPU.)
    return median_event_ms(fn, iters), iters


def time_rounds(fns, budget_s, rounds):
    """Times each of `fns` (time_ms, budget_s / rounds each) in turn, for
    `rounds` rounds. Per fn: (median over the rounds of the per-round
    medians, the per-round medians, iterations per round)."""
    per = [[] for _ in fns]
    iters = [0] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            ms, iters[i] = time_ms(fn, budget_s / rounds)
            per[i].append(ms)
    return [(statistics.median(p), p, n) for p, n in zip(per, iters)]


def phase_breakdown(path, a, iters):
    """Median ms per phase of the profiling kernel at `path` on inputs `a`."""
    layer = mok.GpuArtifact.from_files(path).load()
    for _ in range(3):
        layer(**a)
    samples = []
    for _ in range(iters):
        layer(**a)
        samples.append(layer.phase_times())
    return median_phases(samples)


def median_phases(samples):
    """{phase: median ms} of `samples`, each a phase_times() list."""
    names = [n for n, _ in samples[0]]
    return {n: statistics.median(s[i][1] for s in samples) for i, n in enumerate(names)}


def sleep_cycles_per_ms():
    """Cycles of torch.cuda._sleep per millisecond on this GPU, measured."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    torch.cuda.synchronize()
    return 10_000_000 / e0.elapsed_time(e1)


def timing_row(name, shape, flops, mok, torch_, **extra):
    """A result row: the shape's sizes, and mok's and the baseline's
    time_rounds results (median ms, per-round ms, iterations) with TFLOP/s
    for `flops` a call; `extra` fields appended."""
    (ms_mok, mok_rounds, n_mok), (ms_torch, torch_rounds, n_torch) = mok, torch_
    return dict(shape=name, **{k: shape[k] for k in ("tokens", "hidden", "intermediate",
                                                     "experts", "top_k", "routing")},
                shared=shape.get("shared_intermediate") or 0,
                mok_ms=ms_mok, torch_ms=ms_torch, mok_iters=n_mok,
                torch_iters=n_torch, mok_ms_rounds=mok_rounds,
                torch_ms_rounds=torch_rounds,
                mok_tflops=flops / (ms_mok * 1e-3) / 1e12,
                torch_tflops=flops / (ms_torch * 1e-3) / 1e12,
                speedup=ms_torch / ms_mok, **extra)


def against_bf16(rows):
    """Gives each FP8 shape's row ("<shape>-fp8...") mok's bf16 time of its
    shape from the same run (`bf16_ms`) and the speedup over it."""
    by_shape = {r["shape"]: r for r in rows}
    for r in rows:
        base = by_shape.get(r["shape"].split("-fp8")[0])
        if "-fp8" in r["shape"] and base:
            r["bf16_ms"] = base["mok_ms"]
            r["speedup_vs_bf16"] = base["mok_ms"] / r["mok_ms"]


def print_against_bf16(rows, what):
    """Prints the FP8 rows' times against mok's bf16 `what` (against_bf16)."""
    fp8 = [r for r in rows if "speedup_vs_bf16" in r]
    if fp8:
        print(f"\nFP8 against mok's bf16 {what}")
        for r in fp8:
            print(f"{r['shape']:18s} {r['mok_ms']:9.3f} ms against {r['bf16_ms']:9.3f}: "
                  f"{r['speedup_vs_bf16']:.3f}x, {r['mok_tflops']:.0f} TFLOP/s")


def layer_and_inputs(script, seed):
    """For the one-shape tools (`SCRIPT ARTIFACTS SHAPE`): ARTIFACTS, SHAPE,
    SHAPE's layer loaded from ARTIFACTS and its inputs (seeded), or the
    usage message."""
    if len(sys.argv) != 3 or sys.argv[2] not in SHAPES:
        sys.exit(f"usage: {script} ARTIFACTS SHAPE (one of {', '.join(SHAPES)})")
    artifacts, name = sys.argv[1], sys.argv[2]
    a = make_inputs(SHAPES[name], torch.Generator().manual_seed(seed))
    # (-fp8w: the layer takes the routed weights quantized.)
    if SHAPES[name].get("fp8_quantized_weights"):
        a = quantized_weight_args(a)
    layer = mok.GpuArtifact.from_files(os.path.join(artifacts, name, "moe_layer")).load()
    return artifacts, name, layer, a


def write_result(out, stem, result, baseline, ylabel, title):
    """Writes `result` (gpu, date, matmul_8192_tflops and rows with shape,
    mok_tflops and torch_tflops) to <out>/<stem>.json and, with
    matplotlib, its bar chart (the baseline labelled `baseline`, mok, and
    the matmul ceiling) to <out>/<stem>.png."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["torch_tflops"] for r in rows], 0.4, label=baseline)
    ax.bar([x + 0.2 for x in xs], [r["mok_tflops"] for r in rows], 0.4, label="mok")
    ax.axhline(result["matmul_8192_tflops"], color="gray", linestyle="--",
               label="8192^3 matmul")
    ax.set_xticks(list(xs), [r["shape"] for r in rows])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, stem + ".png"), dpi=120)
    plt.close(fig)


def matmul_ceiling():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms, _ = time_ms(lambda: a @ b, 2.0, min_iters=10, max_iters=30)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="bench-artifacts")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--budget", type=float, default=4.0,
                    help="seconds per timing of a layer, over all its rounds")
    ap.add_argument("--rounds", type=int, default=5,
                    help="alternating rounds of mok and PyTorch timings (median reported)")
    ap.add_argument("--shapes", nargs="*", default=list(FORWARD_SHAPES), choices=list(SHAPES))
    ap.add_argument("--commit", default=os.environ.get("MOK_COMMIT", "unknown"),
                    help="the commit the kernels were compiled from (recorded)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    torch.backends.cuda.matmul.allow_tf32 = False
    ceiling = matmul_ceiling()
    rows = []
    for name in args.shapes:
        s = SHAPES[name]
        layer = mok.GpuArtifact.from_files(os.path.join(args.artifacts, name, "moe_layer")).load()
        gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        a = make_inputs(s, gen)
        ref = reference(a, s["experts"])
        # (-fp8w: the layer takes the routed weights quantized, made here
        # once and not timed, as a trainer does once per optimizer step.)
        call = quantized_weight_args(a) if s.get("fp8_quantized_weights") else a
        # Checked on an output poisoned (NaN) first; timed as a user calls
        # it (the output allocated, not filled).
        poisoned = torch.full(layer.output["shape"], float("nan"), dtype=torch.bfloat16,
                              device="cuda")
        err_mok = rel_error(layer(**call, out=poisoned), ref)
        del poisoned
        err_torch = rel_error(torch_layer(a), ref)
        del ref
        timed_mok, timed_torch = time_rounds(
            [lambda layer=layer, call=call: layer(**call), lambda a=a: torch_layer(a)],
            args.budget, args.rounds)
        prof = os.path.join(args.artifacts, name + "-profile", "moe_layer")
        phases = phase_breakdown(prof, call, 20) if os.path.exists(prof + ".json") else None
        t_shared = s["tokens"] if s.get("shared_intermediate") else 0
        flops = 6 * (s["tokens"] * s["top_k"] + t_shared) * s["hidden"] * s["intermediate"]
        rows.append(timing_row(name, s, flops, timed_mok, timed_torch,
                               mok_rel_err=err_mok, torch_rel_err=err_torch,
                               phases_ms=phases))
        del a, call, layer
        torch.cuda.empty_cache()
    against_bf16(rows)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  commit=args.commit,
                  date=time.strftime("%Y-%m-%d"), matmul_8192_tflops=ceiling, rows=rows)
    write_result(args.out, "moe_forward", result, "PyTorch", "TFLOP/s",
                 f"MoE forward, {result['gpu']}, {result['date']}")
    with_phases = [r for r in rows if r["phases_ms"]]
    if with_phases:
        # Every phase any kernel has, in order ("-": a kernel without it,
        # e.g. no dispatch with fuse_dispatch).
        names = []
        for r in with_phases:
            names += [n for n in r["phases_ms"] if n not in names]
        print("\nmok phases (ms, median; profiling kernel)")
        print(f"{'shape':18s} " + " ".join(f"{n[:12]:>12s}" for n in names) + f" {'sum':>8s}")
        for r in with_phases:
            ph = r["phases_ms"]
            print(f"{r['shape']:18s} "
                  + " ".join(f"{ph[n]:12.3f}" if n in ph else f"{'-':>12s}" for n in names)
                  + f" {sum(ph.values()):8.3f}")
    print(f"\n{result['gpu']}  torch {result['torch']}  8192^3 bf16 matmul: {ceiling:.0f} TFLOP/s")
    print(f"{'shape':18s} {'T':>5s} {'mok ms':>9s} {'torch ms':>9s} {'mok TF/s':>9s} "
          f"{'torch TF/s':>10s} {'%ceil':>6s} {'speedup':>8s} {'mok err':>8s} {'torch err':>9s}")
    for r in rows:
        print(f"{r['shape']:18s} {r['tokens']:5d} {r['mok_ms']:9.3f} {r['torch_ms']:9.3f} "
              f"{r['mok_tflops']:9.1f} {r['torch_tflops']:10.1f} "
              f"{100 * r['mok_tflops'] / ceiling:6.1f} {r['speedup']:8.3f} "
              f"{r['mok_rel_err']:8.1e} {r['torch_rel_err']:9.1e}")
    print_against_bf16(rows, "layer (TFLOP/s counted as bf16's; the error is against the "
                       "bf16 float64 reference)")


if __name__ == "__main__":
    main()
