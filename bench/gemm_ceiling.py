#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The board's GEMM ceilings at its power cap: cuBLAS (through torch) on
an N x N x N GEMM of random data, held for --seconds after a warm-up
that lets the clock settle, with the SM clock and the board's power
sampled by `nvidia-smi` every 100 ms meanwhile (medians). Rows: bf16
`torch.matmul`; E4M3 `torch._scaled_mm` with one scale a tensor, with
DeepSeek-V3's 1 x 128 (A) and 128 x 128 (B) block scales, and with one
scale a tensor on all-zero operands (the same MMAs at less power). What
mok's FP8 GEMMs compare with (docs/performance.md, FP8).

    python3 -m bench.gemm_ceiling [--n 8192] [--seconds 2]
"""
import argparse
import subprocess
import time

import torch


def sustained(fn, seconds):
    """(ms a call, median SM MHz, median W) of fn() held for `seconds`."""
    fn()
    torch.cuda.synchronize()
    t = time.time()
    while time.time() - t < 0.7:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    calls, t = 0, time.time()
    while time.time() - t < seconds:
        for _ in range(5):
            fn()
        calls += 5
        torch.cuda.synchronize()
    stop.record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = [line.split(",") for line in smi.communicate()[0].splitlines() if "," in line]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
    return (start.elapsed_time(stop) / calls, med([float(c) for c, _ in samples]),
            med([float(w) for _, w in samples]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    n = args.n
    if n % 128:
        ap.error(f"--n: expected a multiple of 128 (the block scales), got {n}")
    e4m3 = torch.float8_e4m3fn

    def row(name, fn):
        ms, mhz, watts = sustained(fn, args.seconds)
        print(f"{name:58s} {2 * n ** 3 / ms / 1e9:7.0f} TFLOP/s  {mhz:5.0f} MHz  {watts:4.0f} W",
              flush=True)

    print(f"{torch.cuda.get_device_name()}, {n}^3, held {args.seconds} s")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    row("bf16 torch.matmul", lambda: a @ b)
    # _scaled_mm wants B column-major.
    a8 = torch.randn(n, n, device="cuda").to(e4m3)
    b8 = torch.randn(n, n, device="cuda").to(e4m3).t()
    one = torch.tensor(1.0, device="cuda")
    row("E4M3 _scaled_mm, one scale a tensor",
        lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    # Block scales: A's (n, n/128) and B's (n/128, n/128), both column-major.
    sa = torch.ones(n // 128, n, device="cuda").t()
    sb = torch.ones(n // 128, n // 128, device="cuda").t()
    row("E4M3 _scaled_mm, 1 x 128 and 128 x 128 block scales",
        lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    z8 = torch.zeros(n, n, device="cuda").to(e4m3)
    zt = torch.zeros(n, n, device="cuda").to(e4m3).t()
    row("E4M3 _scaled_mm, one scale a tensor, all-zero operands",
        lambda: torch._scaled_mm(z8, zt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


if __name__ == "__main__":
    main()
