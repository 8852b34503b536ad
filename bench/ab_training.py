#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Training-step variants against each other and PyTorch autograd, in one
process on the GPU machine: for each shape, rounds of the PyTorch layer
and then every variant (so that the board's clock and power state fall on
all of them alike; the variants rotate by one a round, so that no variant
always comes right after PyTorch's cooler step), each timed as
bench/moe_training.py times a step
(forward then backward, CUDA events around each, median). A variant is a
folder of compiled training layers (bench/prepare.py ... --training, or
another compiler build's); with <dir>/<shape>-train-profile its phases too
(and, compiled since the kernels record %clock64, each phase's cycles and
mean SM clock).
No gradient check: bench/moe_training.py does that for the recorded run.

    PYTHONPATH=build-gpu/python python3 bench/ab_training.py \\
        old=bench-artifacts new=/tmp/new --rounds 3 --shapes dsv3-shard qwen3-30b
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu"))
import mok  # noqa: E402
from moe_forward import time_ms  # noqa: E402
from moe_training import (FLOAT_ARGS, SM90_FLOPS_PER_CLOCK, kernel_phases,  # noqa: E402
                          mok_step, phase_flops, torch_leaves, torch_step, training_inputs)
from shapes import SHAPES  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME=DIR")
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"],
                    choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per timing")
    ap.add_argument("--data", choices=["random", "zeros"], default="random",
                    help="zeros: x, every weight and d_out all zero (the router weights "
                         "stay random), to see how much the step's time depends on the "
                         "values the tensor cores multiply (power at the cap)")
    args = ap.parse_args()
    variants = []
    for v in args.variants:
        name, eq, d = v.partition("=")
        if not eq or not name or not d:
            sys.exit(f"ab_training.py: variant '{v}' is not NAME=DIR")
        if name == "torch" or name in dict(variants):
            sys.exit(f"ab_training.py: variant name '{name}' is taken (torch, or given twice)")
        if not os.path.isdir(d):
            sys.exit(f"ab_training.py: variant {name}: {d} is not a folder")
        variants.append((name, d))
    torch.backends.cuda.matmul.allow_tf32 = False
    for shape in args.shapes:
        s = SHAPES[shape]
        a, d_out = training_inputs(s, torch.Generator().manual_seed(7))
        if args.data == "zeros":
            for n in FLOAT_ARGS:
                if n in a and n != "router_weights":
                    a[n].zero_()
            d_out.zero_()
        leaves = torch_leaves(a)
        layers = {n: mok.GpuTrainingArtifact.from_files(os.path.join(d, shape + "-train")).load()
                  for n, d in variants}
        times = {n: [] for n in list(layers) + ["torch"]}
        steps = {n: (lambda layer=layer, a=a, d_out=d_out: mok_step(layer, a, d_out))
                 for n, layer in layers.items()}
        steps["torch"] = lambda a=a, d_out=d_out, leaves=leaves: torch_step(a, d_out, leaves)
        names = list(layers)
        for r in range(args.rounds):
            # PyTorch's step first, then the variants rotated by one a round:
            # the variant timed right after PyTorch's (cooler) step changes.
            k = r % len(names)
            for n in ["torch"] + names[k:] + names[:k]:
                times[n].append(time_ms(steps[n], args.budget)[0])
        t_torch = statistics.median(times["torch"])
        print(f"\n{shape} ({args.data} data): torch {t_torch:.3f} ms (rounds {' '.join(f'{t:.3f}' for t in times['torch'])})")
        for n in layers:
            t = statistics.median(times[n])
            print(f"{shape}: {n:12s} {t:.3f} ms  {t_torch / t:.3f}x  "
                  f"(rounds {' '.join(f'{x:.3f}' for x in times[n])})")
        del layers, steps
        for n, d in variants:
            prof = os.path.join(d, shape + "-train-profile")
            meta = os.path.join(prof, "moe_layer_backward.json")
            if not os.path.exists(meta):
                continue
            with open(meta) as f:
                records_cycles = any(p["name"] == "phase_cycles"
                                     for p in json.load(f)["params"])
            fwd, bwd = kernel_phases(prof, a, d_out, 10, cycles=records_cycles)
            if records_cycles:
                # Each phase's ms, cycles and mean clock; for the GEMM
                # phases also the tensor cores' share of those cycles that
                # the phase's FLOPs need (work a clock).
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                flops = phase_flops(SHAPES[shape])
                for kernel, phases in (("forward", fwd), ("backward", bwd)):
                    def row(k, ms, c):
                        text = f"{k} {ms:.3f} {c / 1e6:.3f} {c / (ms * 1e3):.0f}"
                        if k in flops[kernel] and c > 0:
                            busy = flops[kernel][k] / (c * sms * SM90_FLOPS_PER_CLOCK)
                            text += f" ({100 * busy:.0f} %)"
                        return text
                    print(f"{shape}: {n} {kernel} phases (ms, Mcycles, MHz (tensor "
                          f"cores busy)): " + ", ".join(
                              row(k, ms, c) for k, (ms, c) in phases.items()
                              if not k.startswith("plan") and ms > 0))
                fwd = {k: ms for k, (ms, _) in fwd.items()}
                bwd = {k: ms for k, (ms, _) in bwd.items()}
            shown = {k: v for k, v in bwd.items() if not k.startswith("plan")}
            totals = (f"sum {sum(shown.values()):.3f}, "
                      f"plan {sum(bwd.values()) - sum(shown.values()):.3f}")
            if records_cycles:  # each phase's ms is in the lines above
                print(f"{shape}: {n} backward phases: {totals}")
                continue
            print(f"{shape}: {n} phases: forward " +
                  ", ".join(f"{k} {v:.3f}" for k, v in fwd.items() if not k.startswith("plan")))
            print(f"{shape}: {n} phases: backward " +
                  ", ".join(f"{k} {v:.3f}" for k, v in shown.items()) + f" ({totals})")
        del a, d_out, leaves
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
