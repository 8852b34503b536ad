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

    PYTHONPATH=build-gpu/python python3 -m bench.host_overhead \\
        --artifacts bench-artifacts --shapes dsv3-shard qwen3-30b
"""
import argparse
import os
import statistics
import time

import torch

import mok
from bench.moe_forward import sleep_cycles_per_ms
from bench.shapes import SHAPES
from bench.torch_reference import make_inputs


def slots(meta):
    return sum(m.get("experts", 1) for m in meta.get("tensor_maps", []))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="bench-artifacts")
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"])
    ap.add_argument("--busy-ms", type=float, default=50.0)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    cycles_per_ms = sleep_cycles_per_ms()
    print(f"sleep kernel: {cycles_per_ms / 1e3:.0f} kcycles/ms; busy = {args.busy_ms} ms")
    print(f"{'shape':12s} {'call':9s} {'slots':>6s} {'idle host ms':>13s} {'busy host ms':>13s}")
    for name in args.shapes:
        s = SHAPES[name]
        layer = mok.GpuTrainingArtifact.from_files(
            os.path.join(args.artifacts, name + "-train")).load()
        a = make_inputs(s, torch.Generator().manual_seed(1))
        d_out = torch.randn(s["tokens"], s["hidden"]).to(torch.bfloat16).cuda()
        _, ctx = layer.forward(**a)
        layer.backward(ctx, d_out)
        torch.cuda.synchronize()

        def host_ms(fn, busy_ms):
            """Host ms of fn(), the GPU idle or busy for busy_ms first."""
            torch.cuda.synchronize()
            if busy_ms:
                torch.cuda._sleep(int(busy_ms * cycles_per_ms))
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
            torch.cuda.synchronize()
            return ms

        # The backward always takes the context of the forward before the
        # loop (the kernels' results are not looked at).
        calls = {"forward": lambda layer=layer, a=a: layer.forward(**a),
                 "backward": lambda layer=layer, ctx=ctx, d_out=d_out:
                     layer.backward(ctx, d_out)}
        for call, fn in calls.items():
            idle = [host_ms(fn, 0) for _ in range(args.iters)]
            busy = [host_ms(fn, args.busy_ms) for _ in range(args.iters)]
            meta = (layer._forward if call == "forward" else layer._backward).meta
            print(f"{name:12s} {call:9s} {slots(meta):6d} {statistics.median(idle):13.3f} "
                  f"{statistics.median(busy):13.3f}")
        del layer, a, ctx
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
