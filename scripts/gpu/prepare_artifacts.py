#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiles every GPU test case for a target into a folder to carry to the
GPU machine: <out>/<case>/moe_layer.{ptx,json} (training cases:
moe_layer_forward and moe_layer_backward).

    PYTHONPATH=build/python python3 scripts/gpu/prepare_artifacts.py gpu-artifacts
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mok  # noqa: E402
from cases import CASES, TRAIN_CASES, compile_kwargs, spec_kwargs  # noqa: E402


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu-artifacts"
    target = sys.argv[2] if len(sys.argv) > 2 else "sm_90a"
    for name, case in list(CASES.items()) + list(TRAIN_CASES.items()):
        art = mok.compile(mok.LayerSpec(**spec_kwargs(case)), target=target,
                          cache_dir=os.path.join(out, ".cache"), **compile_kwargs(case))
        base = art.save(os.path.join(out, name))
        print(f"{name}: {base}")


if __name__ == "__main__":
    main()
