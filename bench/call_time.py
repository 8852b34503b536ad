#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Where a layer call's time goes, for one benchmark shape (compiled by
bench.compile, with its -profile twin):

    PYTHONPATH=build-gpu/python python3 -m bench.call_time ARTIFACTS SHAPE

Prints median milliseconds (CUDA events) of: the call as moe_forward.py
times it (back to back); the same with a synchronization after each call;
the kernel launch alone (the runtime's forward into a preallocated
output, back to back); the NaN fill of the output alone; and the profiling
kernel's own span (its first to last %globaltimer stamp), after calls
back to back and after an idle GPU. A gap between the kernel launch and
the span is time the kernel spends outside its phases or the GPU spends
between kernels; a gap between back-to-back and synchronized calls points
at clocks (power) rather than at the kernel.
"""
import os
import statistics
import time

import torch

import mok
from bench.moe_forward import layer_and_inputs, median_event_ms as events


def main():
    artifacts, name, layer, a = layer_and_inputs("python3 -m bench.call_time", 7)
    for _ in range(3):
        layer(**a)
    rows = [("call, back to back", events(lambda: layer(**a), 40, False)),
            ("call, synchronized", events(lambda: layer(**a), 20, True))]
    out = torch.empty(layer.output["shape"], dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows.append(("kernel launch alone", events(
        lambda: layer._layer.forward(a, out=out, stream=stream), 40, False)))
    rows.append(("NaN fill of the output", events(
        lambda: torch.full(layer.output["shape"], float("nan"), dtype=torch.bfloat16,
                           device="cuda"), 40, False)))
    prof_path = os.path.join(artifacts, name + "-profile", "moe_layer")
    if os.path.exists(prof_path + ".json"):
        prof = mok.GpuArtifact.from_files(prof_path).load()
        for _ in range(3):
            prof(**a)
        rows.append(("profiling kernel call, back to back",
                     events(lambda: prof(**a), 40, False)))
        spans = []
        for _ in range(10):
            for _ in range(5):
                prof(**a)
            spans.append(sum(ms for _, ms in prof.phase_times()))  # the 5th's
        rows.append(("profiling kernel span after 5 back to back", statistics.median(spans)))
        idle = []
        for _ in range(10):
            torch.cuda.synchronize()
            time.sleep(0.05)  # an idle GPU
            prof(**a)
            idle.append(sum(ms for _, ms in prof.phase_times()))
        rows.append(("profiling kernel span, one call after a pause", statistics.median(idle)))
    print(f"\n{name}: median ms")
    for label, ms in rows:
        print(f"  {label:48s} {ms:8.3f}")


if __name__ == "__main__":
    main()
