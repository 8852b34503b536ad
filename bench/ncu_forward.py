#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Runs one benchmark shape's compiled layer a few times, for a profiler
(Nsight Compute) to catch one launch. Compares designs kernel against
kernel (e.g. dsv3-shard against dsv3-shard-ws):

    PYTHONPATH=build-gpu/python python3 bench/prepare.py /tmp/b
    ncu --kernel-name regex:'_forward$' --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight \\
        --section WarpStateStats --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis --csv --page details \\
        python3 bench/ncu_forward.py /tmp/b dsv3-shard > dsv3.csv

(`bash bench/ncu.sh /tmp/b dsv3-shard dsv3-shard-ws` does this for each
shape.) --kernel-name keeps ncu to the mok kernel (`<function>_forward`),
whose third launch it profiles.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu"))
import mok  # noqa: E402
from shapes import SHAPES  # noqa: E402
from torch_reference import make_inputs  # noqa: E402


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in SHAPES:
        sys.exit(f"usage: ncu_forward.py ARTIFACTS SHAPE (one of {', '.join(SHAPES)})")
    artifacts, name = sys.argv[1], sys.argv[2]
    layer = mok.GpuArtifact.from_files(os.path.join(artifacts, name, "moe_layer")).load()
    a = make_inputs(SHAPES[name], torch.Generator().manual_seed(1))
    torch.cuda.synchronize()
    for _ in range(4):
        layer(**a)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
