#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Runs one benchmark shape's compiled training layer (forward, then
backward) a few times, for Nsight Compute to catch one launch of its
backward (or forward) kernel:

    PYTHONPATH=build/python python3 bench/prepare.py /tmp/b sm_90a --training qwen3-30b
    PYTHONPATH=build-gpu/python ncu --kernel-name regex:'_backward$' \\
        --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats \\
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \\
        --csv --page details \\
        python3 bench/ncu_training.py /tmp/b qwen3-30b > qwen3-backward.csv

(`_forward$` for the training forward.) The kernel mixes phases (plan,
memory-bound steps, GEMMs); its counters are the sum over all of them.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu"))
import mok  # noqa: E402
from shapes import SHAPES  # noqa: E402
from moe_training import training_inputs  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ncu_training.py ARTIFACTS SHAPE")
    artifacts, shape = sys.argv[1:]
    if shape not in SHAPES:
        sys.exit(f"ncu_training.py: unknown shape {shape}; known: {', '.join(SHAPES)}")
    path = os.path.join(artifacts, shape + "-train")
    if not os.path.isdir(path):
        sys.exit(f"ncu_training.py: no training layer at {path} (bench/prepare.py ... --training)")
    s = SHAPES[shape]
    layer = mok.GpuTrainingArtifact.from_files(path).load()
    a, d_out = training_inputs(s, torch.Generator().manual_seed(1))
    for _ in range(4):
        _, ctx = layer.forward(**a)
        layer.backward(ctx, d_out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
