#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Training-step variants against each other and PyTorch autograd, in one
process on the GPU machine: for each shape, rounds of every variant in turn
and the PyTorch layer (so that the board's clock and power state fall on
all of them alike), each timed as bench/moe_training.py times a step
(forward then backward, CUDA events around each, median). A variant is a
folder of compiled training layers (bench/prepare.py ... --training, or
another compiler build's); with <dir>/<shape>-train-profile its phases too.
No gradient check: bench/moe_training.py does that for the recorded run.

    PYTHONPATH=build-gpu/python python3 bench/ab_training.py --rounds 3 \\
        --shapes dsv3-shard qwen3-30b old=bench-artifacts new=/tmp/new
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu"))
import mok  # noqa: E402
from moe_forward import time_ms  # noqa: E402
from moe_training import FLOAT_ARGS, kernel_phases, mok_step, torch_step  # noqa: E402
from shapes import SHAPES  # noqa: E402
from torch_reference import make_inputs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME=DIR")
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per timing")
    args = ap.parse_args()
    variants = [v.split("=", 1) for v in args.variants]
    for name, d in variants:
        if not os.path.isdir(d):
            sys.exit(f"ab_training.py: variant {name}: {d} is not a folder")
    torch.backends.cuda.matmul.allow_tf32 = False
    for shape in args.shapes:
        s = SHAPES[shape]
        a = make_inputs(s, torch.Generator().manual_seed(7))
        d_out = torch.randn(s["tokens"], s["hidden"]).to(torch.bfloat16).cuda()
        leaves = {n: a[n].detach().clone().requires_grad_(True) for n in FLOAT_ARGS if n in a}
        layers = {n: mok.GpuTrainingArtifact.from_files(os.path.join(d, shape + "-train")).load()
                  for n, d in variants}
        times = {n: [] for n in list(layers) + ["torch"]}
        steps = {n: (lambda layer=layer, a=a, d_out=d_out: mok_step(layer, a, d_out))
                 for n, layer in layers.items()}
        steps["torch"] = lambda a=a, d_out=d_out, leaves=leaves: torch_step(a, d_out, leaves)
        order = list(steps)
        for r in range(args.rounds):
            # Each round starts at another entry: a variant timed right
            # after the (cooler) PyTorch step is not always the same one.
            for n in order[r % len(order):] + order[:r % len(order)]:
                times[n].append(time_ms(steps[n], args.budget)[0])
        t_torch = statistics.median(times["torch"])
        print(f"\n{shape}: torch {t_torch:.3f} ms (rounds {' '.join(f'{t:.3f}' for t in times['torch'])})")
        for n in layers:
            t = statistics.median(times[n])
            print(f"{shape}: {n:12s} {t:.3f} ms  {t_torch / t:.3f}x  "
                  f"(rounds {' '.join(f'{x:.3f}' for x in times[n])})")
        del layers, steps
        for n, d in variants:
            prof = os.path.join(d, shape + "-train-profile")
            if os.path.isdir(prof):
                fwd, bwd = kernel_phases(prof, a, d_out, 10)
                print(f"{shape}: {n} phases: forward " +
                      ", ".join(f"{k} {v:.3f}" for k, v in fwd.items() if not k.startswith("plan")))
                print(f"{shape}: {n} phases: backward " +
                      ", ".join(f"{k} {v:.3f}" for k, v in bwd.items() if not k.startswith("plan")) +
                      f" (sum {sum(bwd.values()):.3f})")
        del a, d_out, leaves
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
