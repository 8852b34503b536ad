#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiles every GPU test case for a target into a folder to carry to the
GPU machine: <out>/<case>/moe_layer.{ptx,json} (training cases:
moe_layer_forward and moe_layer_backward). The cases compile in parallel,
one process each at a time ($MOK_PREPARE_JOBS, default the CPU count: the
GPU machine compiles them in its share of the device time).

    PYTHONPATH=build/python python3 scripts/gpu/prepare_artifacts.py gpu-artifacts [target]
"""
import concurrent.futures
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mok  # noqa: E402
from cases import CASES, TRAIN_CASES, compile_kwargs, spec_kwargs  # noqa: E402


def compile_case(out, target, name, case):
    """Compiles `case` into <out>/<name>; returns the saved base path. Each
    case has its own cache folder, so concurrent compiles never write the
    same files."""
    art = mok.compile(mok.LayerSpec(**spec_kwargs(case)), target=target,
                      cache_dir=os.path.join(out, ".cache", name), **compile_kwargs(case))
    return art.save(os.path.join(out, name))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu-artifacts"
    target = sys.argv[2] if len(sys.argv) > 2 else "sm_90a"
    jobs = int(os.environ.get("MOK_PREPARE_JOBS") or os.cpu_count() or 1)
    cases = list(CASES.items()) + list(TRAIN_CASES.items())
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compile_case, out, target, name, case) for name, case in cases]
        # In the cases' order; the first failure stops the script.
        for (name, _), future in zip(cases, futures):
            print(f"{name}: {future.result()}", flush=True)


if __name__ == "__main__":
    main()
