#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiles every GPU test case for a target into a folder to carry to the
GPU machine: <out>/<case>/moe_layer.{ptx,json} (training cases:
moe_layer_forward and moe_layer_backward), and <out>/<case>-profile for
the cases test_gpu_profile.py profiles. The cases compile in parallel,
one process each at a time ($MOK_PREPARE_JOBS, default the CPU count: the
GPU machine compiles them in its share of the device time).

    PYTHONPATH=build/python python3 scripts/gpu/prepare_artifacts.py gpu-artifacts [target]
"""
import concurrent.futures
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mok  # noqa: E402
from cases import CASES, MAIN_GRAD_CASES, TRAIN_CASES, compile_kwargs, spec_kwargs  # noqa: E402


# The cases python/tests/gpu/test_gpu_profile.py compiles with profile=True
# (its CASE), prepared as <case>-profile.
PROFILED = ("top1_clamp",)


def compile_case(out, target, name, case, profile=False):
    """Compiles `case` into <out>/<name> (with `profile`, the phase-timing
    kernel); returns the saved base path. Each case has its own cache
    folder, so concurrent compiles never write the same files."""
    kwargs = dict(compile_kwargs(case))
    if profile:
        kwargs["profile"] = True
    art = mok.compile(mok.LayerSpec(**spec_kwargs(case)), target=target,
                      cache_dir=os.path.join(out, ".cache", name), **kwargs)
    return art.save(os.path.join(out, name))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu-artifacts"
    target = sys.argv[2] if len(sys.argv) > 2 else "sm_90a"
    jobs = int(os.environ.get("MOK_PREPARE_JOBS") or os.cpu_count() or 1)
    cases = ([(name, case, False) for name, case in CASES.items()] +
             [(name, case, False) for name, case in TRAIN_CASES.items()] +
             [(name, case, False) for name, case in MAIN_GRAD_CASES.items()] +
             [(name + "-profile", CASES[name], True) for name in PROFILED])
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compile_case, out, target, name, case, profile)
                   for name, case, profile in cases]
        # In the cases' order; the first failure stops the script.
        for (name, _, _), future in zip(cases, futures):
            print(f"{name}: {future.result()}", flush=True)


if __name__ == "__main__":
    main()
