#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Host cost of mok's training calls, and whether a call waits for the GPU.

For each shape's training layer (<artifacts>/<shape>-train): the host time
of GpuTrainingLayer.forward and .backward (time.perf_counter around the
call, no synchronization inside the measurement) in two states: the GPU
idle, and the GPU busy with a ~`--busy-ms` sleep kernel queued first. A
call that returns in about the busy time waited for the GPU (a
synchronization inside it); one that returns in about its idle time did
not. Also the tensor-map slots of each kernel (descriptors rebuilt and
uploaded when a mapped buffer moves). Prints a table.

    PYTHONPATH=build-gpu/python python3 bench/host_overhead.py \\
        --artifacts bench-artifacts --shapes dsv3-shard qwen3-30b
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu"))
import mok  # noqa: E402
from shapes import SHAPES  # noqa: E402
from torch_reference import make_inputs  # noqa: E402


def slots(meta):
    return sum(m.get("experts", 1) for m in meta.get("tensor_maps", []))


def sleep_ms(ms, cycles_per_ms):
    torch.cuda._sleep(int(ms * cycles_per_ms))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="bench-artifacts")
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"])
    ap.add_argument("--busy-ms", type=float, default=50.0)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    # Sleep-kernel cycles per millisecond, measured.
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    torch.cuda.synchronize()
    cycles_per_ms = 10_000_000 / e0.elapsed_time(e1)
    print(f"sleep kernel: {cycles_per_ms / 1e3:.0f} kcycles/ms; busy = {args.busy_ms} ms")
    print(f"{'shape':12s} {'call':9s} {'slots':>6s} {'idle host ms':>13s} {'busy host ms':>13s}")
    for name in args.shapes:
        s = SHAPES[name]
        layer = mok.GpuTrainingArtifact.from_files(
            os.path.join(args.artifacts, name + "-train")).load()
        a = make_inputs(s, torch.Generator().manual_seed(1))
        d_out = torch.randn(s["tokens"], s["hidden"]).to(torch.bfloat16).cuda()
        calls = {
            "forward": lambda: layer.forward(**a),
            "backward": lambda: layer.backward(ctx, d_out),
        }
        _, ctx = layer.forward(**a)
        layer.backward(ctx, d_out)
        torch.cuda.synchronize()
        for call, fn in calls.items():
            idle, busy = [], []
            for _ in range(args.iters):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                r = fn()
                idle.append((time.perf_counter() - t0) * 1e3)
                if call == "forward":
                    ctx = r[1]
                torch.cuda.synchronize()
                sleep_ms(args.busy_ms, cycles_per_ms)
                t0 = time.perf_counter()
                r = fn()
                busy.append((time.perf_counter() - t0) * 1e3)
                if call == "forward":
                    ctx = r[1]
                torch.cuda.synchronize()
            meta = (layer._forward if call == "forward" else layer._backward).meta
            print(f"{name:12s} {call:9s} {slots(meta):6d} {statistics.median(idle):13.3f} "
                  f"{statistics.median(busy):13.3f}")
        del layer, a, ctx
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
