#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Forward + backward of a MoE layer: mok's training kernels against the
plain-PyTorch layer under autograd, in one process, on the same inputs, on
one GPU.

For each shape: check mok's gradients (every one) against float64 torch
autograd, then time one training step of the layer, forward then backward
(mok: GpuTrainingLayer.forward + .backward; PyTorch: moe_forward.py's
torch_layer with x, router_weights and the weights requiring grad, then
out.backward(d_out), the gradients set to None each step), with CUDA events
(median after warm-up) in --rounds alternating rounds (as moe_forward.py).
FLOPs = 3 x the forward's, 18 (T k + T_shared) H I. Also the forward and
the backward alone (one call at a time), and with
<artifacts>/<shape>-train-profile, both kernels' phases. A shape that
takes its weights quantized ("-fp8w", fp8_quantized_weights) runs on
mok.ops.fp8_kernel_weights' copies made once, as a trainer refreshes them once
per optimizer step; that refresh is timed apart (weights_quantize_ms).
Writes <out>/moe_training.json and .png; prints the tables last.

    # compiled beforehand (needs the compiler):
    PYTHONPATH=build/python python3 -m bench.compile shapes bench-artifacts --training SHAPE...
    # on the GPU machine (from the repository root, as every bench tool):
    PYTHONPATH=build-gpu/python python3 -m bench.moe_training \\
        --artifacts bench-artifacts --out /tmp/bench --shapes dsv3-shard qwen3-30b
"""
import argparse
import os
import statistics
import time

import torch

import mok
from bench.moe_forward import (against_bf16, matmul_ceiling, median_phases,
                               print_against_bf16, sleep_cycles_per_ms, time_rounds,
                               timing_row, torch_layer, write_result)
from bench.shapes import SHAPES
from bench.torch_reference import backward as reference_grads
from bench.torch_reference import make_inputs, quantized_weight_args, relative_error

FLOAT_ARGS = ("x", "router_weights", "gate_weights", "up_weights", "down_weights",
              "shared_gate_weights", "shared_up_weights", "shared_down_weights")


def training_inputs(s, gen):
    """The layer's inputs for shape `s` (torch_reference.make_inputs) and a
    bf16 d_out, both from generator `gen`."""
    a = make_inputs(s, gen)
    d_out = torch.randn(s["tokens"], s["hidden"], generator=gen).to(torch.bfloat16).cuda()
    return a, d_out


def torch_leaves(a):
    """The float inputs of `a` as fresh leaves requiring grad (the PyTorch
    layer's parameters and inputs in torch_step)."""
    return {n: a[n].detach().clone().requires_grad_(True) for n in FLOAT_ARGS if n in a}


def torch_step(a, d_out, leaves):
    """One training step of the PyTorch layer: forward, backward (the
    gradients land in leaves' .grad, reset first)."""
    for t in leaves.values():
        t.grad = None
    args = dict(a, **leaves)
    out = torch_layer(args)
    out.backward(d_out)


def weight_quantization_ms(a, call, precision, iters=5):
    """Median ms of refreshing the quantized routed weights of `call` (both
    layouts, in place) from the bf16 ones of `a` with
    mok.ops.fp8_kernel_weights: what a trainer does once per optimizer step
    for a layer compiled with fp8_quantized_weights (not part of the timed
    step)."""
    import mok.ops
    times = []
    for _ in range(iters + 1):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        e[0].record()
        for w in ("gate", "up", "down"):
            mok.ops.fp8_kernel_weights(a[w + "_weights"], precision, normal=True,
                                       transposed=True,
                                       out=tuple(call[w + k] for k in ("_q", "_scale", "_qt",
                                                                       "_scale_t")))
        e[1].record()
        torch.cuda.synchronize()
        times.append(e[0].elapsed_time(e[1]))
    return statistics.median(times[1:])


def mok_step(layer, a, d_out):
    out, ctx = layer.forward(**a)
    return layer.backward(ctx, d_out)


def kernel_phases(path, a, d_out, iters, cycles=False):
    """Median ms per phase of the profiling training layer at `path`:
    ({phase: ms} of its forward kernel, {phase: ms} of its backward). With
    `cycles`, each phase's (median ms, median SM clock cycles) instead (the
    profiling kernel's phase_cycles, the first SM's %clock64): a phase's
    cycles, unlike its milliseconds, do not move with the clock the board's
    power cap sets (but for the time spent waiting on memory); cycles / ms
    is the phase's mean clock."""
    layer = mok.GpuTrainingArtifact.from_files(path).load()
    for _ in range(3):
        _, ctx = layer.forward(**a)
        layer.backward(ctx, d_out)
    kernels = {"forward": layer._forward, "backward": layer._backward}
    times = {k: [] for k in kernels}
    counts = {k: [] for k in kernels}

    def record(kernel):
        times[kernel].append(kernels[kernel].phase_times())
        if cycles:
            counts[kernel].append(kernels[kernel].phase_cycles())
    for _ in range(iters):
        _, ctx = layer.forward(**a)
        record("forward")
        layer.backward(ctx, d_out)
        record("backward")

    def medians(kernel):
        ms = median_phases(times[kernel])
        if not cycles:
            return ms
        return {n: (ms[n], statistics.median(s[i][1] for s in counts[kernel]))
                for i, n in enumerate(ms)}
    return medians("forward"), medians("backward")


# Dense bf16 FLOPs a clock of one sm_90 SM's tensor cores (989.4 TFLOP/s
# = 132 SMs x 1.83 GHz x 4096 on the H100 SXM; the H200 has the same SMs);
# E4M3's are twice that.
SM90_FLOPS_PER_CLOCK = 4096
SM90_FP8_FLOPS_PER_CLOCK = 2 * SM90_FLOPS_PER_CLOCK


def phase_flops(s, part=None):
    """The FLOPs of a training step's GEMM phases, by the profiling kernels'
    phase names (routed rows T k without their padding, and the shared
    expert's T rows): {"forward": {phase: FLOPs}, "backward": {...}}.
    They add up to the step's 18 (T k + T_shared) H I. `part`: "routed"
    or "shared" for that part's FLOPs alone."""
    routed = s["tokens"] * s["top_k"] * s["intermediate"]
    shared = s["tokens"] * s.get("shared_intermediate", 0)
    rows_i = {None: routed + shared, "routed": routed, "shared": shared}[part]
    ri = rows_i * s["hidden"]  # sum of rows x I x H
    return {"forward": {"gate/up + SwiGLU": 4 * ri, "down": 2 * ri},
            "backward": {"down dgrad + wgrad": 4 * ri, "gate/up dgrad + wgrads": 8 * ri}}


def phase_peak_cycles(s, sms):
    """The cycles each GEMM phase's FLOPs need at the tensor cores' full
    rate on `sms` sm_90 SMs (phase_flops' keys): the routed experts' at
    E4M3's rate for an "fp8" shape (its routed GEMMs run in E4M3 forward
    and backward), bf16's otherwise; the shared expert's at bf16's."""
    routed_rate = (SM90_FP8_FLOPS_PER_CLOCK if s.get("precision") == "fp8"
                   else SM90_FLOPS_PER_CLOCK)
    routed, shared = phase_flops(s, "routed"), phase_flops(s, "shared")
    return {kernel: {k: (routed[kernel][k] / routed_rate
                         + shared[kernel][k] / SM90_FLOPS_PER_CLOCK) / sms
                     for k in routed[kernel]}
            for kernel in routed}


def split_times(layer, a, d_out, iters):
    """Median ms of mok's training forward alone and of its backward alone
    (CUDA events around each kernel call, one step at a time). A ~1 ms
    sleep kernel goes first, so that the forward call's host work (about
    0.2-0.3 ms, bench/host_overhead.py) overlaps it instead of being timed
    with the kernel; the backward call's overlaps the forward kernel."""
    cycles = int(sleep_cycles_per_ms())
    fwd, bwd = [], []
    for i in range(iters + 3):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        torch.cuda._sleep(cycles)
        e[0].record()
        _, ctx = layer.forward(**a)
        e[1].record()
        layer.backward(ctx, d_out)
        e[2].record()
        torch.cuda.synchronize()
        if i >= 3:
            fwd.append(e[0].elapsed_time(e[1]))
            bwd.append(e[1].elapsed_time(e[2]))
    return statistics.median(fwd), statistics.median(bwd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="bench-artifacts")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--budget", type=float, default=4.0,
                    help="seconds per timing of a layer, over all its rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"])
    ap.add_argument("--commit", default=os.environ.get("MOK_COMMIT", "unknown"))
    ap.add_argument("--no-check", action="store_true",
                    help="skip the float64 gradient check (it needs memory and time)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    ceiling = matmul_ceiling()
    rows = []
    for name in args.shapes:
        s = SHAPES[name]
        path = os.path.join(args.artifacts, name + "-train")
        layer = mok.GpuTrainingArtifact.from_files(path).load()
        gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        a, d_out = training_inputs(s, gen)
        # mok's arguments: given quantized weights ("-fp8w"), mok.ops's
        # both layouts, made once (a trainer's refresh a step is timed
        # apart).
        call, extra = a, {}
        if s.get("fp8_quantized_weights"):
            call = quantized_weight_args(a, training=True, precision=s["precision"])
            extra["weights_quantize_ms"] = weight_quantization_ms(a, call, s["precision"])
        errors = {}
        if not args.no_check:
            # mok's gradients from poisoned outputs, against float64 autograd.
            checked = mok.GpuTrainingArtifact.from_files(path).load(poison_outputs=True)
            grads = mok_step(checked, call, d_out)
            ref = reference_grads(a, d_out, s["experts"])
            errors = {n: relative_error(grads[n], ref[n]) for n in ref}
            del grads, ref, checked
            torch.cuda.empty_cache()
        leaves = torch_leaves(a)
        timed_mok, timed_torch = time_rounds(
            [lambda layer=layer, call=call, d_out=d_out: mok_step(layer, call, d_out),
             lambda a=a, d_out=d_out, leaves=leaves: torch_step(a, d_out, leaves)],
            args.budget, args.rounds)
        fwd_ms, bwd_ms = split_times(layer, call, d_out, 20)
        prof = os.path.join(args.artifacts, name + "-train-profile")
        fwd_phases, phases = (
            kernel_phases(prof, call, d_out, 10)
            if os.path.exists(os.path.join(prof, "moe_layer_backward.json")) else (None, None))
        t_shared = s["tokens"] if s.get("shared_intermediate") else 0
        flops = 18 * (s["tokens"] * s["top_k"] + t_shared) * s["hidden"] * s["intermediate"]
        rows.append(timing_row(name, s, flops, timed_mok, timed_torch, grad_rel_err=errors,
                               mok_forward_ms=fwd_ms, mok_backward_ms=bwd_ms,
                               forward_phases_ms=fwd_phases, backward_phases_ms=phases,
                               **extra))
        del a, call, layer, leaves
        torch.cuda.empty_cache()
    against_bf16(rows)  # FP8 shapes: against mok's bf16 step, this run
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  commit=args.commit, date=time.strftime("%Y-%m-%d"),
                  matmul_8192_tflops=ceiling, rows=rows)
    write_result(args.out, "moe_training", result, "PyTorch autograd",
                 "TFLOP/s (3 x forward FLOPs)",
                 f"MoE forward + backward, {result['gpu']}, {result['date']}")
    for r in rows:
        print(f"\n{r['shape']}: mok forward alone {r['mok_forward_ms']:.3f} ms, "
              f"backward alone {r['mok_backward_ms']:.3f} ms (median, one call at a time)")
        if "weights_quantize_ms" in r:
            print(f"{r['shape']}: the routed weights quantized (both layouts, "
                  f"mok.ops.fp8_kernel_weights, once per optimizer step, not in the step): "
                  f"{r['weights_quantize_ms']:.3f} ms")
        for kind in ("forward", "backward"):
            ph = r[kind + "_phases_ms"]
            if not ph:
                continue
            print(f"{r['shape']}: {kind} phases (ms, median; profiling kernel)")
            for n, ms in ph.items():
                print(f"  {n:28s} {ms:8.3f}")
            print(f"  {'sum':28s} {sum(ph.values()):8.3f}")
    print(f"\n{result['gpu']}  torch {result['torch']}  8192^3 bf16 matmul: {ceiling:.0f} TFLOP/s")
    print(f"{'shape':18s} {'mok ms':>9s} {'torch ms':>9s} {'mok TF/s':>9s} {'torch TF/s':>10s} "
          f"{'speedup':>8s} {'worst grad err':>15s}")
    for r in rows:
        worst = max(r["grad_rel_err"].items(), key=lambda kv: kv[1]) if r["grad_rel_err"] \
            else ("-", float("nan"))
        print(f"{r['shape']:18s} {r['mok_ms']:9.3f} {r['torch_ms']:9.3f} {r['mok_tflops']:9.1f} "
              f"{r['torch_tflops']:10.1f} {r['speedup']:8.3f} {worst[1]:9.1e} ({worst[0]})")
    print_against_bf16(rows, "training step (TFLOP/s counted as bf16's; the gradient "
                       "errors are against the bf16 float64 reference)")


if __name__ == "__main__":
    main()
