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
from moe_forward import layer_and_inputs  # noqa: E402


def main():
    _, _, layer, a = layer_and_inputs("ncu_forward.py", 1)
    torch.cuda.synchronize()
    for _ in range(4):
        layer(**a)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
