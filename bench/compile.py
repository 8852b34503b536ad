#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiles the layers the GPU machine runs, for a target, into a folder to
carry there (needs the compiler: the mok._mok extension, or the static
mok-compile named by $MOK_COMPILER). Two sets:

    PYTHONPATH=build/python python3 -m bench.compile tests gpu-artifacts
    PYTHONPATH=build/python python3 -m bench.compile shapes bench-artifacts \\
        [--training] [--plain-only] [SHAPE...]

`tests`: every GPU test case of bench/cases.py, <out>/<case>/moe_layer.{ptx,json}
(training cases: moe_layer_forward and moe_layer_backward), and
<out>/<case>-profile for the cases test_gpu_profile.py profiles.

`shapes`: the benchmark shapes of bench/shapes.py (the forward ones unless
some are named): <out>/<shape> and its profiling twin <out>/<shape>-profile
(bench.moe_forward's phase breakdown). With --training, the training layers
instead: <shape>-train (bench.moe_training, bench.peers),
<shape>-train-profile (their phases) and <shape>-train-maingrad, whose
backward adds the weights' gradients into fp32 main_grads (bench.main_grad).
--plain-only leaves out the twins (-profile; -train-profile and
-train-maingrad).

Options: --target (default sm_90a); --jobs, the layers compiled at once,
one process each (default $MOK_PREPARE_JOBS, else the CPU count: the GPU
machine compiles them in its share of the device time). Each layer has its
own cache folder (<out>/.cache/<name>), so concurrent compiles never write
the same files. Prints "<name>: <path>" per layer, in order; the first
failure stops it.
"""
import argparse
import concurrent.futures
import os

from bench.cases import (ANY_TOKENS_CASES, CASES, EP_CASES, EP_TRAIN_CASES, FP8_CASES,
                         FP8_TRAIN_CASES, MAIN_GRAD_CASES, MX_CASES, TRAIN_CASES, compile_kwargs,
                         ep1_twin, ep_train_twin, spec_kwargs)
from bench.shapes import FORWARD_SHAPES, SHAPES

# The cases python/tests/gpu/test_gpu_profile.py compiles with profile=True
# (its CASE), prepared as <case>-profile.
PROFILED = ("top1_clamp",)

# The twins of a training shape: (suffix, profile, main_grads).
TRAINING_FORMS = (("-train", False, False), ("-train-profile", True, False),
                  ("-train-maingrad", False, True))


def test_layers():
    """(name, spec fields, mok.compile options) of every GPU test layer."""
    layers = [(name, spec_kwargs(case), compile_kwargs(case))
              for table in (CASES, TRAIN_CASES, MAIN_GRAD_CASES, ANY_TOKENS_CASES, FP8_CASES,
                            FP8_TRAIN_CASES, MX_CASES)
              for name, case in table.items()]
    layers += [(name + "-profile", spec_kwargs(CASES[name]),
                dict(compile_kwargs(CASES[name]), profile=True)) for name in PROFILED]
    for name, case in EP_CASES.items():
        layers.append((name, spec_kwargs(case), compile_kwargs(case)))
        layers.append((name + "-ep1", ep1_twin(case), compile_kwargs(case)))
    for name, case in EP_TRAIN_CASES.items():
        layers.append((name, spec_kwargs(case), compile_kwargs(case)))
        layers.append((name + "-ep1", ep_train_twin(case), compile_kwargs(case)))
    # The "-ep1" twins of one forward and one training case compiled with
    # self_exchange: run through a one-rank NCCL communicator
    # (test_gpu_comm.py).
    layers.append(("ep4_shared-self", ep1_twin(EP_CASES["ep4_shared"]),
                   dict(compile_kwargs(EP_CASES["ep4_shared"]), self_exchange=True)))
    layers.append(("train_ep4_shared-self", ep_train_twin(EP_TRAIN_CASES["train_ep4_shared"]),
                   dict(compile_kwargs(EP_TRAIN_CASES["train_ep4_shared"]),
                        self_exchange=True)))
    return layers


def shape_layers(names, training, plain_only):
    """(name, spec fields, mok.compile options) of the benchmark shapes
    `names`: each forward layer and its profiling twin, or (`training`)
    each training layer and its twins; `plain_only`: without the twins."""
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise ValueError(f"SHAPE: unknown shape(s) {', '.join(unknown)}; known: "
                         f"{', '.join(SHAPES)}")
    layers = []
    for name in names:
        shape = SHAPES[name]
        spec = spec_kwargs(shape)
        if training:
            # The forward-only options (dispatch, multicast) do not apply:
            # the training layers take the target's defaults; warp roles
            # go to the training forward. Given quantized weights, both
            # kernels take both layouts.
            taken = {k: True for k in ("fp8_quantized_weights", "warp_specialize")
                     if shape.get(k)}
            for suffix, profile, main_grads in TRAINING_FORMS:
                if plain_only and suffix != "-train":
                    continue
                layers.append((name + suffix, spec,
                               dict(training=True, profile=profile, main_grads=main_grads,
                                    **taken)))
            continue
        options = {"warp_specialize": shape.get("warp_specialize", False),
                   "fuse_dispatch": shape.get("fuse_dispatch"),
                   "multicast": shape.get("multicast", False),
                   "fp8_quantized_weights": shape.get("fp8_quantized_weights", False)}
        layers.append((name, spec, options))
        if not plain_only:
            layers.append((name + "-profile", spec, dict(options, profile=True)))
    return layers


def compile_layer(out, target, name, spec, options):
    """Compiles one layer into <out>/<name>; returns the saved path."""
    import mok
    art = mok.compile(mok.LayerSpec(**spec), target=target,
                      cache_dir=os.path.join(out, ".cache", name), **options)
    return art.save(os.path.join(out, name))


def compile_all(out, target, layers, jobs, compile_one=compile_layer):
    """Compiles `layers` (test_layers() or shape_layers()) into `out`,
    `jobs` at a time, printing "<name>: <path>" in their order; the first
    failure raises."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compile_one, out, target, name, spec, options)
                   for name, spec, options in layers]
        for (name, _, _), future in zip(layers, futures):
            print(f"{name}: {future.result()}", flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m bench.compile",
        description="Compiles the GPU test layers or the benchmark shapes for a target.")
    ap.add_argument("set", choices=["tests", "shapes"],
                    help="tests: bench/cases.py's layers; shapes: bench/shapes.py's")
    ap.add_argument("out", help="the folder to write the layers into")
    ap.add_argument("names", nargs="*", metavar="SHAPE",
                    help="shapes: the shapes to compile (default: the forward shapes)")
    ap.add_argument("--target", default="sm_90a", choices=["sm_90a", "sm_100a"])
    ap.add_argument("--training", action="store_true",
                    help="shapes: the training layers (<shape>-train and twins)")
    ap.add_argument("--plain-only", action="store_true",
                    help="shapes: without the -profile / -train-profile / -train-maingrad twins")
    ap.add_argument("--jobs", type=int,
                    default=int(os.environ.get("MOK_PREPARE_JOBS") or os.cpu_count() or 1),
                    help="layers compiled at once (default $MOK_PREPARE_JOBS or the CPU count)")
    args = ap.parse_intermixed_args(argv)  # SHAPE... may follow the options
    if args.jobs < 1:
        ap.error(f"--jobs: expected at least 1, got {args.jobs}")
    if args.set == "tests":
        given = [f for f, v in (("SHAPE", args.names), ("--training", args.training),
                                ("--plain-only", args.plain_only)) if v]
        if given:
            ap.error(f"{', '.join(given)}: only for the benchmark shapes (set 'shapes'); "
                     "'tests' compiles every test case")
        args.layers = test_layers()
    else:
        try:
            default = list(FORWARD_SHAPES)
            args.layers = shape_layers(args.names or default, args.training,
                                       args.plain_only)
        except ValueError as e:
            ap.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    compile_all(args.out, args.target, args.layers, args.jobs)


if __name__ == "__main__":
    main()
