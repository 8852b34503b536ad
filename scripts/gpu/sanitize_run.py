#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Runs each named test layer once on fresh random inputs, for
compute-sanitizer to watch (scripts/gpu/sanitize.sh): the forward of an
inference layer; the training forward and the backward of a training layer
(with fp32 main_grads when it adds into them). Every output is poisoned
before its launch. "bad_routing:<layer>" runs the layer with expert ids
outside [-1, E) (E, E + 7, -5, INT32_MAX, INT32_MIN), NaN and Inf in x and
the router weights, and expects the call to report the ids
(MOK_ERROR_BAD_ROUTING): memcheck then shows that they are never used as
indices. Prints one line a layer; exits non-zero if a call raised (or a
bad_routing call did not).

    PYTHONPATH=build-gpu/python python3 scripts/gpu/sanitize_run.py \
        --artifacts gpu-artifacts top1_clamp train_short_k
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def _bad(c, args, gen):
    import torch
    top = args["top_experts"].clone()
    T, k = top.shape
    E = c["experts"]
    for q, v in zip(torch.randperm(T * k, generator=gen).tolist(),
                    [E, E + 7, -5, 2**31 - 1, -2**31]):
        top[q // k, q % k] = v
    x, w = args["x"].clone(), args["router_weights"].clone()
    x[0, 0] = float("nan")
    x[T - 1, :] = float("inf")
    w[T // 2, 0] = float("nan")
    return dict(args, top_experts=top, x=x, router_weights=w)


def run(artifacts, name, seed):
    import torch

    import mok
    from bench import torch_reference
    from bench.cases import CASES, FP8_CASES, FP8_TRAIN_CASES, MAIN_GRAD_CASES, TRAIN_CASES

    bad = name.startswith("bad_routing:")
    name = name.split(":", 1)[-1]
    c = {**CASES, **TRAIN_CASES, **MAIN_GRAD_CASES, **FP8_CASES, **FP8_TRAIN_CASES}[name]
    gen = torch.Generator().manual_seed(seed)
    args = torch_reference.make_inputs(c, gen)
    mok.set_error_checks("off")
    if bad:
        args = _bad(c, args, gen)
        layer_run = _run_layer(mok, torch, artifacts, name, c, args, gen)
        try:
            layer_run.check_errors()
        except mok.MokRuntimeError as e:
            if e.status != "MOK_ERROR_BAD_ROUTING":
                raise
            return "bad routing reported (" + str(e).split(";")[0] + ")"
        raise RuntimeError("expert ids outside [-1, E) were not reported")
    _run_layer(mok, torch, artifacts, name, c, args, gen).check_errors()
    return "training forward + backward" if c.get("training") else "forward"


def _run_layer(mok, torch, artifacts, name, c, args, gen):
    directory = os.path.join(artifacts, name)
    if not c.get("training"):
        layer = mok.GpuArtifact.from_files(os.path.join(directory, "moe_layer")).load(
            poison_outputs=True)
        layer(**args)
        return layer
    layer = mok.GpuTrainingArtifact.from_files(directory).load(poison_outputs=True)
    d_out = torch.randn(c["tokens"], c["hidden"], generator=gen).to(torch.bfloat16).cuda()
    out, ctx = layer.forward(**args)
    main = None
    if layer.main_grads:
        # Copied from the host: initcheck tracks copies, but not the writes
        # of torch's own kernels, which --kernel-name leaves unwatched.
        main = {n: torch.zeros(t.shape, dtype=torch.float32).cuda()
                for n, t in args.items()
                if n.endswith("_weights") and n != "router_weights"}
    layer.backward(ctx, d_out, main_grads=main)
    return layer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", default=os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts"))
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    import torch
    failed = 0
    for name in a.cases:
        t = time.time()
        try:
            what = run(a.artifacts, name, a.seed)
            torch.cuda.synchronize()
            print(f"sanitize_run: {name}: {what} ok ({time.time() - t:.1f} s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
            failed += 1
            print(f"sanitize_run: {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
