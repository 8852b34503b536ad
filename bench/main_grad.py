#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A training step with Megatron-Core's gradient accumulation (every
weight's fp32 main_grad += dW), three ways, in one process on one GPU:

- `fused`: mok's layer compiled with main_grads=True
  (<artifacts>/<shape>-train-maingrad): the backward kernel adds its fp32
  dW into the main_grads in place;
- `add`: mok's layer returning bf16 dW (<shape>-train), then
  main_grad.add_(dW) per weight (Megatron's path without gradient
  accumulation fusion, and what mok.torch does on the CPU target);
- `torch`: the plain-PyTorch layer under autograd (bench/moe_training.py's
  baseline), then main_grad.add_(weight.grad).

Each step is forward then backward; CUDA events, median of --rounds
alternating rounds (as moe_training.py). Also each way's peak memory
allocated during a step above what was allocated before it, and the
main_grads after one step from zeros: `fused` against `add` (relative
difference: bf16 rounding of dW in `add`) and against float64 autograd.
Writes <out>/main_grad.json; prints a table.

    PYTHONPATH=build/python python3 -m bench.compile shapes bench-artifacts --training SHAPE...
    PYTHONPATH=build-gpu/python python3 -m bench.main_grad --artifacts bench-artifacts \\
        --out /tmp/bench --shapes qwen3-30b dsv3-shard
"""
import argparse
import json
import os
import sys
import time

import torch

import mok
from bench.moe_forward import time_rounds, torch_layer
from bench.moe_training import torch_leaves, training_inputs
from bench.shapes import SHAPES
from bench.torch_reference import backward as reference_grads
from bench.torch_reference import relative_error


def peak_extra_mb(fn):
    """MB allocated at the peak of fn() above what was allocated before."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="bench-artifacts")
    ap.add_argument("--out", default="/tmp/bench")
    ap.add_argument("--shapes", nargs="*", default=["qwen3-30b", "dsv3-shard"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--commit", default=os.environ.get("MOK_COMMIT", "unknown"))
    args = ap.parse_args()
    rows = []
    for name in args.shapes:
        s = SHAPES[name]
        base = os.path.join(args.artifacts, name)
        fused = mok.GpuTrainingArtifact.from_files(base + "-train-maingrad").load()
        plain = mok.GpuTrainingArtifact.from_files(base + "-train").load()
        if not fused.main_grads or plain.main_grads:
            sys.exit(f"{base}-train-maingrad must be compiled with main_grads=True and "
                     f"{base}-train without (python3 -m bench.compile shapes ... --training)")
        a, d_out = training_inputs(s, torch.Generator().manual_seed(1))
        weights = [n for n in fused.arg_names if n.endswith("_weights") and n != "router_weights"]
        main = {w: {n: torch.zeros(a[n].shape, dtype=torch.float32, device=a[n].device)
                    for n in weights} for w in ("fused", "add", "torch")}
        leaves = torch_leaves(a)

        def fused_step():
            _, ctx = fused.forward(**a)
            fused.backward(ctx, d_out, main_grads=main["fused"])

        def add_step():
            _, ctx = plain.forward(**a)
            g = plain.backward(ctx, d_out)
            for n in weights:
                main["add"][n].add_(g[n])

        def torch_step():
            for t in leaves.values():
                t.grad = None
            torch_layer(dict(a, **leaves)).backward(d_out)
            for n in weights:
                main["torch"][n].add_(leaves[n].grad)

        # One step from zeros each: the main_grads against each other and
        # against float64 autograd.
        for way, step in (("fused", fused_step), ("add", add_step), ("torch", torch_step)):
            for t in main[way].values():
                t.zero_()
            step()
        torch.cuda.synchronize()
        ref = reference_grads(a, d_out, s["experts"])
        err = {way: max(relative_error(main[way][n], ref[n]) for n in weights)
               for way in main}
        fused_vs_add = max(relative_error(main["fused"][n], main["add"][n].double())
                           for n in weights)
        del ref
        peaks = {way: peak_extra_mb(step) for way, step in
                 (("fused", fused_step), ("add", add_step), ("torch", torch_step))}
        (f_ms, f_r, _), (a_ms, a_r, _), (t_ms, t_r, _) = time_rounds(
            [fused_step, add_step, torch_step], args.budget, args.rounds)
        row = dict(shape=name, fused_ms=f_ms, add_ms=a_ms, torch_ms=t_ms,
                   fused_rounds=f_r, add_rounds=a_r, torch_rounds=t_r,
                   peak_extra_mb=peaks, main_grad_rel_err=err,
                   fused_vs_add_rel=fused_vs_add)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del fused, plain, main, leaves, a, d_out
        torch.cuda.empty_cache()
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  commit=args.commit, date=time.strftime("%Y-%m-%d"), rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "main_grad.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"\n{'shape':12s} {'fused ms':>9s} {'add ms':>9s} {'torch ms':>9s} "
          f"{'fused/add':>9s} {'peak MB fused/add/torch':>24s} {'err fused/add/torch':>24s}")
    for r in rows:
        p, e = r["peak_extra_mb"], r["main_grad_rel_err"]
        print(f"{r['shape']:12s} {r['fused_ms']:9.3f} {r['add_ms']:9.3f} {r['torch_ms']:9.3f} "
              f"{r['add_ms'] / r['fused_ms']:8.3f}x "
              f"{p['fused']:8.0f}/{p['add']:.0f}/{p['torch']:.0f} "
              f"{e['fused']:.1e}/{e['add']:.1e}/{e['torch']:.1e}")


if __name__ == "__main__":
    main()
