#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The board's GEMM ceilings at its power cap: cuBLAS (through torch) on
GEMMs of random data, held for --seconds after a warm-up that lets the
clock settle, with the SM clock and the board's power sampled by
`nvidia-smi` every 100 ms meanwhile (medians). Rows: bf16
`torch.matmul`; E4M3 `torch._scaled_mm` with one scale a tensor, with
DeepSeek-V3's 1 x 128 (A) and 128 x 128 (B) block scales, and with one
scale a tensor on all-zero operands (the same MMAs at less power). What
mok's FP8 GEMMs compare with (docs/performance.md, FP8).

The GEMM is N x N x N (--n), or M x N x K (--mnk); with --groups G a
call is G GEMMs of one A and G distinct B operands (an expert's rows
against each of G experts' weights, as a grouped GEMM moves them),
replayed from a CUDA graph.

    python3 -m bench.gemm_ceiling [--n 8192 | --mnk M N K] [--groups 1] [--seconds 2]
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
    ap.add_argument("--mnk", type=int, nargs=3, metavar=("M", "N", "K"))
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    m, n, k = args.mnk or (args.n, args.n, args.n)
    for name, v in zip(("M ", "N ", "K "), (m, n, k)):
        if v <= 0 or v % 128:
            flag, name = ("--mnk", name) if args.mnk else ("--n", "")
            ap.error(f"{flag}: expected {name}a positive multiple of 128 (the block scales), "
                     f"got {v}")
    if args.groups < 1:
        ap.error(f"--groups: expected at least 1, got {args.groups}")
    g = args.groups
    e4m3 = torch.float8_e4m3fn

    def grouped(one_gemm):
        """fn() running one_gemm(i) for the G groups; from a CUDA graph
        when G > 1, so that launches do not count."""
        if g == 1:
            return lambda: one_gemm(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(g):
                one_gemm(i)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(g):
                one_gemm(i)
        return graph.replay

    def row(name, one_gemm):
        ms, mhz, watts = sustained(grouped(one_gemm), args.seconds)
        print(f"{name:58s} {2 * m * n * k * g / ms / 1e9:7.0f} TFLOP/s  {mhz:5.0f} MHz  "
              f"{watts:4.0f} W", flush=True)

    shape = f"{m} x {n} x {k}" + (f", {g} B operands" if g > 1 else "")
    print(f"{torch.cuda.get_device_name()}, {shape}, held {args.seconds} s")
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16)
    row("bf16 torch.matmul", lambda i: a @ b[i])
    del b
    # _scaled_mm wants B column-major.
    a8 = torch.randn(m, k, device="cuda").to(e4m3)
    b8 = torch.randn(g, n, k, device="cuda").to(e4m3).transpose(1, 2)
    one = torch.tensor(1.0, device="cuda")
    row("E4M3 _scaled_mm, one scale a tensor",
        lambda i: torch._scaled_mm(a8, b8[i], scale_a=one, scale_b=one,
                                   out_dtype=torch.bfloat16))
    # Block scales: A's (m, k/128) and B's (k/128, n/128), both column-major.
    sa = torch.ones(k // 128, m, device="cuda").t()
    sb = torch.ones(n // 128, k // 128, device="cuda").t()
    row("E4M3 _scaled_mm, 1 x 128 and 128 x 128 block scales",
        lambda i: torch._scaled_mm(a8, b8[i], scale_a=sa, scale_b=sb,
                                   out_dtype=torch.bfloat16))
    del b8
    z8 = torch.zeros(m, k, device="cuda").to(e4m3)
    zt = torch.zeros(g, n, k, device="cuda").to(e4m3).transpose(1, 2)
    row("E4M3 _scaled_mm, one scale a tensor, all-zero operands",
        lambda i: torch._scaled_mm(z8, zt[i], scale_a=one, scale_b=one,
                                   out_dtype=torch.bfloat16))


if __name__ == "__main__":
    main()
