#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Loads every compiled layer under the given folders once, several at a
time in separate processes, so that the CUDA driver's JIT cache holds their
kernels' machine code before the tests and benchmarks load them one at a
time.

The artifacts are PTX: the driver compiles each kernel when it loads it
(as ptxas would: seconds for a megakernel), and a fresh GPU machine has an
empty cache, so each GPU test pays that compile in series. Run this first,
in the same call and with the same CUDA_CACHE_PATH / CUDA_CACHE_MAXSIZE as
the tests; it prints each layer's load time (the compile, on a cold cache).

    export CUDA_CACHE_MAXSIZE=4294967296
    PYTHONPATH=build-gpu/python python3 scripts/gpu/warm_jit.py gpu-artifacts bench-artifacts
"""
import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import time


def layers_under(roots):
    """(kind, path) of every compiled layer under `roots`: ("inference",
    <dir>/moe_layer) for a folder with moe_layer.ptx, ("training", <dir>) for
    one with moe_layer_forward.ptx and moe_layer_backward.ptx."""
    found = []
    for root in roots:
        if not os.path.isdir(root):
            sys.exit(f"warm_jit.py: {root} is not a folder")
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x != ".cache")
            if "moe_layer.ptx" in files and "moe_layer.json" in files:
                found.append(("inference", os.path.join(d, "moe_layer")))
            if {"moe_layer_forward.ptx", "moe_layer_backward.ptx"} <= set(files):
                found.append(("training", d))
    return found


def load(kind, path):
    """Loads the layer (its module, compiled by the driver unless cached)
    and frees it again; returns the seconds the load took."""
    import mok
    start = time.perf_counter()
    if kind == "training":
        layer = mok.GpuTrainingArtifact.from_files(path).load()
    else:
        layer = mok.GpuArtifact.from_files(path).load()
    seconds = time.perf_counter() - start
    del layer
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("roots", nargs="+", help="folders of compiled layers")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                    help="processes loading at once (each holds a CUDA context and "
                         "its layer's workspace while it loads)")
    args = ap.parse_args()
    layers = layers_under(args.roots)
    if not layers:
        sys.exit(f"warm_jit.py: no compiled layers under {' '.join(args.roots)}")
    if "CUDA_CACHE_MAXSIZE" not in os.environ:
        print("warm_jit.py: CUDA_CACHE_MAXSIZE is not set: the driver's default "
              "cache size may not hold every kernel", file=sys.stderr)
    start = time.perf_counter()
    # spawn: a CUDA context does not survive fork.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        futures = [pool.submit(load, kind, path) for kind, path in layers]
        times = []
        for (kind, path), future in zip(layers, futures):
            seconds = future.result()  # a failed load stops the script
            times.append(seconds)
            print(f"{path}: {seconds:.1f} s", flush=True)
    print(f"warm_jit.py: {len(layers)} layers, {sum(times):.0f} s of loads in "
          f"{time.perf_counter() - start:.0f} s with {args.jobs} processes")


if __name__ == "__main__":
    main()
