#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiles the benchmark shapes for a GPU target (needs the compiler), each
also as a profiling kernel (<name>-profile) that times its phases:

    PYTHONPATH=build/python python3 bench/prepare.py bench-artifacts [sm_90a [--training] [SHAPE...]]

(all shapes of bench/shapes.py unless some are named). With --training, the
training layers instead (<name>-train and <name>-train-profile: forward and
backward kernels, for bench/moe_training.py; and <name>-train-maingrad, whose
backward adds the weights' gradients into fp32 main_grads, for
bench/main_grad.py).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mok  # noqa: E402
from shapes import SHAPES  # noqa: E402

FIELDS = ("tokens", "hidden", "intermediate", "experts", "top_k", "padding",
          "shared_intermediate", "swiglu_limit")

out = sys.argv[1] if len(sys.argv) > 1 else "bench-artifacts"
target = sys.argv[2] if len(sys.argv) > 2 else "sm_90a"
rest = sys.argv[3:]
training = "--training" in rest
names = [n for n in rest if n != "--training"] or list(SHAPES)
unknown = [n for n in names if n not in SHAPES]
if unknown:
    sys.exit(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
for name in names:
    shape = SHAPES[name]
    spec = mok.LayerSpec(**{k: v for k, v in shape.items() if k in FIELDS})
    options = {"warp_specialize": shape.get("warp_specialize", False),
               "fuse_dispatch": shape.get("fuse_dispatch"),
               "multicast": shape.get("multicast", False)}
    if training:
        for suffix, profile, main_grads in (("-train", False, False),
                                            ("-train-profile", True, False),
                                            ("-train-maingrad", False, True)):
            art = mok.compile(spec, target=target, cache_dir=os.path.join(out, ".cache"),
                              training=True, profile=profile, main_grads=main_grads)
            print(name + suffix, art.save(os.path.join(out, name + suffix)))
        continue
    art = mok.compile(spec, target=target, cache_dir=os.path.join(out, ".cache"), **options)
    print(name, art.save(os.path.join(out, name)))
    # The same layer timing its phases (moe_forward.py's phase breakdown).
    prof = mok.compile(spec, target=target, cache_dir=os.path.join(out, ".cache"),
                       profile=True, **options)
    print(name + "-profile", prof.save(os.path.join(out, name + "-profile")))
