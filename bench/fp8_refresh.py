# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The FP8 weights' refresh a trainer runs once per optimizer step for layers
compiled with fp8_quantized_weights: mok.ops.fp8_quantize(w, normal=True,
transposed=True, out=...) of the three routed weights of a shape, as mok's
compiled quantizer (a CUDA weight's path) against the same function as
torch operations (its CPU path, run on the GPU: the baseline), timed in the
same process, alternating, after checking that both give the same bytes.

    python3 -m bench.fp8_refresh [--shapes dsv3-shard ...] [--iters 10] [--out FILE.json]
        [--commit C]

Bytes moved: the bf16 weight read once and both E4M3 layouts written (4
bytes an element; the scales are 1/16384 of that), as the GB/s column counts
them.
"""
import argparse
import json
import statistics
import time

import torch

import mok.ops
from bench.shapes import SHAPES


def weights(s, gen):
    """gate and up [E, I, H], down [E, H, I], bf16 on the GPU, each 128 x 128
    block at its own magnitude."""
    e, h, i = s["experts"], s["hidden"], s["intermediate"]
    out = {}
    for name, rows, cols in (("gate", i, h), ("up", i, h), ("down", h, i)):
        mag = torch.exp2(torch.randint(-8, 8, (e, rows // 128, 1, cols // 128, 1),
                                       generator=gen).float())
        w = torch.randn(e, rows // 128, 128, cols // 128, 128, generator=gen) * mag
        out[name] = w.reshape(e, rows, cols).to(torch.bfloat16).cuda()
    return out


def refresh(fn, ws, outs):
    for n, w in ws.items():
        fn(w, True, True, outs[n])


def median_ms(fn, ws, outs, iters):
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        refresh(fn, ws, outs)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["dsv3-shard"])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--commit", default="", help="the commit measured, for the JSON")
    args = p.parse_args(argv)
    compiled = lambda w, n, t, out: mok.ops.fp8_quantize(w, n, t, out=out)  # noqa: E731
    baseline = lambda w, n, t, out: mok.ops._fp8_quantize_torch(w, n, t, out)  # noqa: E731
    gen = torch.Generator().manual_seed(int(time.time()))
    rows = []
    for name in args.shapes:
        s = SHAPES[name]
        ws = weights(s, gen)
        start = time.perf_counter()
        outs = {n: mok.ops.fp8_quantize(w, True, True) for n, w in ws.items()}
        torch.cuda.synchronize()
        first = time.perf_counter() - start  # the compile (or the cache's load) and a run
        check = {n: mok.ops._fp8_quantize_torch(w, True, True, None) for n, w in ws.items()}
        for n in ws:
            for a, b in zip(outs[n], check[n]):
                if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
                    raise SystemExit(f"{name}: {n}: the compiled quantizer's bytes differ from "
                                     "the torch quantizer's")
        del check
        elements = sum(w.numel() for w in ws.values())
        mine, base = [], []
        for _ in range(args.rounds):
            mine.append(median_ms(compiled, ws, outs, args.iters))
            base.append(median_ms(baseline, ws, outs, args.iters))
        m, b = statistics.median(mine), statistics.median(base)
        row = dict(shape=name, elements=elements, compiled_ms=m, torch_ms=b,
                   compiled_rounds=mine, torch_rounds=base, speedup=b / m,
                   compiled_gbs=4 * elements / m / 1e6, first_call_s=first)
        rows.append(row)
        print(f"{name}: {elements / 1e9:.2f} G elements, both layouts: compiled {m:.3f} ms "
              f"({row['compiled_gbs']:.0f} GB/s; rounds {' '.join(f'{x:.3f}' for x in mine)}), "
              f"torch {b:.3f} ms (rounds {' '.join(f'{x:.3f}' for x in base)}), "
              f"{b / m:.1f}x; first call {first:.1f} s")
        del ws, outs
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           commit=args.commit, date=time.strftime("%Y-%m-%d"), rows=rows),
                      f, indent=1)


if __name__ == "__main__":
    main()
