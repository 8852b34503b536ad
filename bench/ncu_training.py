#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Runs one benchmark shape's compiled training layer (forward, then
backward) a few times, for Nsight Compute to catch one launch of its
backward (or forward) kernel:

    PYTHONPATH=build/python python3 -m bench.compile shapes /tmp/b --training qwen3-30b
    PYTHONPATH=build-gpu/python ncu --kernel-name regex:'_backward$' \\
        --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats \\
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \\
        --csv --page details \\
        python3 -m bench.ncu_training /tmp/b qwen3-30b > qwen3-backward.csv

(`_forward$` for the training forward.) The kernel mixes phases (plan,
memory-bound steps, GEMMs); its counters are the sum over all of them.
"""
import os
import sys

import torch

import mok
from bench.moe_training import training_inputs
from bench.shapes import SHAPES
from bench.torch_reference import quantized_weight_args


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ncu_training.py ARTIFACTS SHAPE")
    artifacts, shape = sys.argv[1:]
    if shape not in SHAPES:
        sys.exit(f"ncu_training.py: unknown shape {shape}; known: {', '.join(SHAPES)}")
    path = os.path.join(artifacts, shape + "-train")
    if not os.path.isdir(path):
        sys.exit(f"ncu_training.py: no training layer at {path} (python3 -m bench.compile shapes ... --training)")
    s = SHAPES[shape]
    layer = mok.GpuTrainingArtifact.from_files(path).load()
    a, d_out = training_inputs(s, torch.Generator().manual_seed(1))
    if s.get("fp8_quantized_weights"):  # ("-fp8w": the routed weights quantized)
        a = quantized_weight_args(a, training=True, precision=s["precision"])
    for _ in range(4):
        _, ctx = layer.forward(**a)
        layer.backward(ctx, d_out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
