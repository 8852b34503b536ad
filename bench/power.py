#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Power, SM clock and energy of a training step, mok's and PyTorch's, on
random and on all-zero data: what sets the step's time at the board's
power cap.

For each shape and each data kind (random: bench/moe_training.py's inputs;
zeros: x, every weight and d_out zero, the router weights random), each
step (PyTorch autograd, then every mok variant) runs back to back for
--seconds while `nvidia-smi` samples the board every 100 ms. Printed per
step: ms a step (the burst's wall time over its steps, the queue drained
at the end), the median power and SM clock over the burst's second half
(the first half lets the clock settle at the cap), the share of those
samples throttled by the software power cap, the energy a step (median
power x ms) and per TFLOP (a step counted as 3 x the forward's FLOPs, as
bench/moe_training.py counts it). With --matmul, also an 8192^3 bf16
torch.matmul (cuBLAS) burst on the same data kind: the energy per TFLOP
of a plain GEMM at the same power, the floor for the layer's GEMMs. A step whose time follows its energy over the cap's
power is power-bound: only less work (energy) shortens it, not fewer
stalls.

    PYTHONPATH=build-gpu/python python3 -m bench.power mok=bench-artifacts \\
        [other=DIR ...] --shapes dsv3-shard qwen3-30b --seconds 4
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

import mok
from bench.moe_training import (FLOAT_ARGS, mok_step, torch_leaves, torch_step,
                                training_inputs)
from bench.shapes import SHAPES

SW_POWER_CAP = 0x4  # nvidia-smi clocks_throttle_reasons.active bit


class Sampler:
    """nvidia-smi's samples every 100 ms, each stamped with the host's
    time.monotonic() when read: (t, sm MHz, W, throttle reasons)."""

    def __init__(self):
        self.samples = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
             "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.monotonic(), float(parts[0]), float(parts[1]),
                                     int(parts[2], 16)))
            except (ValueError, IndexError):
                continue

    def window(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def step_tflop(s):
    """A training step's TFLOP: 3 x the forward's, 18 (T k + T_shared) H I."""
    t_shared = s["tokens"] if s.get("shared_intermediate") else 0
    return 18 * (s["tokens"] * s["top_k"] + t_shared) * s["hidden"] * s["intermediate"] / 1e12


def burst(step, seconds):
    """Runs `step` back to back for about `seconds`; returns (ms a step,
    start, end) in time.monotonic()."""
    step()
    torch.cuda.synchronize()
    n = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(4):
            step()
        n += 4
        torch.cuda.synchronize()
    t1 = time.monotonic()
    return (t1 - t0) * 1e3 / n, t0, t1


def report(name, ms, t0, t1, sampler, tflop):
    w = sampler.window(t0 + (t1 - t0) / 2, t1)
    if not w:
        print(f"  {name:8s} {ms:8.3f} ms  (no nvidia-smi samples)")
        return
    watts = statistics.median(x[2] for x in w)
    mhz = statistics.median(x[1] for x in w)
    capped = sum(1 for x in w if x[3] & SW_POWER_CAP) / len(w)
    joules = watts * ms * 1e-3
    print(f"  {name:8s} {ms:8.3f} ms  {tflop / ms * 1e3:6.1f} TFLOP/s  {watts:6.1f} W  "
          f"{mhz:6.0f} MHz  power-capped {100 * capped:3.0f} %  {joules:6.2f} J  "
          f"{joules / tflop:5.3f} J/TFLOP  ({len(w)} samples)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME=DIR (folders of compiled training layers)")
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"],
                    choices=list(SHAPES))
    ap.add_argument("--data", nargs="*", default=["random", "zeros"], choices=["random", "zeros"])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each burst")
    ap.add_argument("--matmul", action="store_true",
                    help="also an 8192^3 bf16 torch.matmul burst per data kind")
    args = ap.parse_args()
    variants = []
    for v in args.variants:
        name, eq, d = v.partition("=")
        if not eq or not name or not d or name == "torch":
            sys.exit(f"power.py: variant '{v}' is not NAME=DIR (NAME not 'torch')")
        if not os.path.isdir(d):
            sys.exit(f"power.py: variant {name}: {d} is not a folder")
        variants.append((name, d))
    torch.backends.cuda.matmul.allow_tf32 = False
    sampler = Sampler()
    try:
        for shape in args.shapes:
            s = SHAPES[shape]
            layers = {n: mok.GpuTrainingArtifact.from_files(os.path.join(d, shape + "-train")).load()
                      for n, d in variants}
            for data in args.data:
                a, d_out = training_inputs(s, torch.Generator().manual_seed(7))
                if data == "zeros":
                    for n in FLOAT_ARGS:
                        if n in a and n != "router_weights":
                            a[n].zero_()
                    d_out.zero_()
                leaves = torch_leaves(a)
                steps = [("torch", lambda a=a, d_out=d_out, leaves=leaves: torch_step(a, d_out, leaves))]
                steps += [(n, lambda layer=layer, a=a, d_out=d_out: mok_step(layer, a, d_out))
                          for n, layer in layers.items()]
                print(f"\n{shape}, {data} data:")
                tflop = step_tflop(s)
                for name, step in steps:
                    ms, t0, t1 = burst(step, args.seconds)
                    # Idle a moment between bursts so that each starts from
                    # a similar board state.
                    time.sleep(1.0)
                    report(name, ms, t0, t1, sampler, tflop)
                del a, d_out, leaves, steps
            del layers
            torch.cuda.empty_cache()
        if args.matmul:
            n = 8192
            for data in args.data:
                if data == "zeros":
                    a = torch.zeros(n, n, device="cuda", dtype=torch.bfloat16)
                    b = torch.zeros(n, n, device="cuda", dtype=torch.bfloat16)
                else:
                    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
                print(f"\n8192^3 bf16 matmul, {data} data:")
                ms, t0, t1 = burst(lambda a=a, b=b: a @ b, args.seconds)
                time.sleep(1.0)
                report("matmul", ms, t0, t1, sampler, 2 * n ** 3 / 1e12)
                del a, b
    finally:
        sampler.stop()


if __name__ == "__main__":
    main()
