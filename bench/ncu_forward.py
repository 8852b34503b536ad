#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Runs one benchmark shape's compiled layer a few times, for a profiler
(Nsight Compute) to catch one launch. Compares designs kernel against
kernel (e.g. dsv3-shard against dsv3-shard-ws):

    PYTHONPATH=build/python python3 -m bench.compile shapes /tmp/b
    ncu --kernel-name regex:'_forward$' --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight \\
        --section WarpStateStats --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis --csv --page details \\
        python3 -m bench.ncu_forward /tmp/b dsv3-shard > dsv3.csv

(`bash bench/ncu.sh /tmp/b dsv3-shard dsv3-shard-ws` does this for each
shape.) --kernel-name keeps ncu to the mok kernel (`<function>_forward`),
whose third launch it profiles.
"""
import torch

from bench.moe_forward import layer_and_inputs


def main():
    _, _, layer, a = layer_and_inputs("python3 -m bench.ncu_forward", 1)
    torch.cuda.synchronize()
    for _ in range(4):
        layer(**a)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
