#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiled variants of mok's layers against each other and PyTorch, on the
GPU machine, in rounds (so that the board's clock and power state fall on
all of them alike). A variant is NAME=DIR, DIR a folder of compiled layers
(`python3 -m bench.compile shapes DIR [--training] SHAPE...`, or another
compiler build's).

Training steps (the default): in one process, for each shape, rounds of
the PyTorch layer and then every variant (the variants rotate by one a
round, so that no variant always comes right after PyTorch's cooler
step), each timed as bench/moe_training.py times a step (forward then
backward, CUDA events around each, median); DIR holds <shape>-train, and
with <shape>-train-profile its phases too (and, compiled since the kernels
record %clock64, each phase's cycles and mean SM clock). No gradient
check: bench.moe_training does that for the recorded run.

--forward: the forward layers (DIR/<shape>, and <shape>-profile for the
phases): each round runs bench.moe_forward once per variant, the variants
rotated by one a round (round r starts at the r-th), each with the PyTorch
baseline and the matmul ceiling, its JSON in <out>/ab/NAME-ROUND (--out,
default $OUT or /tmp); prints each run's table rows.

    PYTHONPATH=build-gpu/python python3 -m bench.ab \\
        old=bench-artifacts new=/tmp/new --rounds 3 --shapes dsv3-shard qwen3-30b
    PYTHONPATH=build-gpu/python python3 -m bench.ab --forward --rounds 2 \\
        old=/tmp/old new=/tmp/new
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.shapes import SHAPES

PROG = "python3 -m bench.ab"


def parse_variants(specs):
    """[(NAME, DIR)] of the NAME=DIR arguments; exits naming a malformed
    one, a name given twice or 'torch' (the baseline's), or a DIR that is
    not a folder."""
    variants = []
    for v in specs:
        name, eq, d = v.partition("=")
        if not eq or not name or not d:
            sys.exit(f"{PROG}: variant '{v}' is not NAME=DIR")
        if name == "torch" or name in dict(variants):
            sys.exit(f"{PROG}: variant name '{name}' is taken (torch, or given twice)")
        if not os.path.isdir(d):
            sys.exit(f"{PROG}: variant {name}: {d} is not a folder")
        variants.append((name, d))
    return variants


def rotation(names, r):
    """The variants' order in round r (0-based): rotated by r."""
    k = r % len(names)
    return names[k:] + names[:k]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG)
    ap.add_argument("variants", nargs="+", help="NAME=DIR")
    ap.add_argument("--forward", action="store_true",
                    help="the forward layers (bench.moe_forward per variant and round) "
                         "instead of training steps")
    ap.add_argument("--shapes", nargs="*", default=["dsv3-shard", "qwen3-30b"],
                    choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float,
                    help="seconds per timing (default 1.0; --forward: 1.5, a layer's "
                         "timing over bench.moe_forward's rounds)")
    ap.add_argument("--data", choices=["random", "zeros"],
                    help="zeros: x, every weight and d_out all zero (the router weights "
                         "stay random), to see how much the step's time depends on the "
                         "values the tensor cores multiply (power at the cap); training "
                         "steps only")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"),
                    help="--forward: the JSON goes to <out>/ab/NAME-ROUND")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget: expected seconds above 0, got {args.budget}")
    if args.forward and args.data:
        ap.error("--data: training steps only, not with --forward")
    if not args.shapes:
        ap.error("--shapes: expected at least one shape")
    args.budget = args.budget or (1.5 if args.forward else 1.0)
    args.data = args.data or "random"
    args.variant_dirs = parse_variants(args.variants)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.forward:
        forward_ab(args)
    else:
        training_ab(args)


def forward_ab(args):
    """Rounds of bench.moe_forward, one run per variant, in the rotated order."""
    names = [n for n, _ in args.variant_dirs]
    dirs = {n: os.path.abspath(d) for n, d in args.variant_dirs}
    out = os.path.abspath(args.out)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    keep = ("shape ",) + tuple(s + " " for s in args.shapes)
    failed = []
    for r in range(args.rounds):
        for name in rotation(names, r):
            print(f"== round {r + 1}: {name} ({dirs[name]})", flush=True)
            run = subprocess.run(
                [sys.executable, "-m", "bench.moe_forward", "--artifacts", dirs[name],
                 "--shapes", *args.shapes, "--out",
                 os.path.join(out, "ab", f"{name}-{r + 1}"), "--commit", name,
                 "--budget", str(args.budget)],
                cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in run.stdout.splitlines():
                if line.startswith(keep):
                    print(line, flush=True)
            if run.returncode != 0:
                # The other variants still run; the exit status says it.
                failed.append(f"{name} (round {r + 1})")
                print(f"{PROG}: bench.moe_forward failed on {name} (rc {run.returncode}):",
                      *run.stdout.splitlines()[-10:], sep="\n", flush=True)
    if failed:
        sys.exit(f"{PROG}: bench.moe_forward failed on {', '.join(failed)}")


def training_ab(args):
    """Training steps of every variant and PyTorch's, in one process."""
    import torch

    import mok
    from bench.moe_forward import time_ms
    from bench.moe_training import (FLOAT_ARGS, kernel_phases,
                                    mok_step, phase_peak_cycles, torch_leaves, torch_step,
                                    training_inputs)
    from bench.torch_reference import quantized_weight_args
    variants = args.variant_dirs
    torch.backends.cuda.matmul.allow_tf32 = False
    for shape in args.shapes:
        s = SHAPES[shape]
        a, d_out = training_inputs(s, torch.Generator().manual_seed(7))
        if args.data == "zeros":
            for n in FLOAT_ARGS:
                if n in a and n != "router_weights":
                    a[n].zero_()
            d_out.zero_()
        leaves = torch_leaves(a)
        # ("-fp8w": mok's layers take the routed weights quantized.)
        call = (quantized_weight_args(a, training=True, precision=s["precision"])
                if s.get("fp8_quantized_weights") else a)
        layers = {n: mok.GpuTrainingArtifact.from_files(os.path.join(d, shape + "-train")).load()
                  for n, d in variants}
        times = {n: [] for n in list(layers) + ["torch"]}
        steps = {n: (lambda layer=layer, call=call, d_out=d_out: mok_step(layer, call, d_out))
                 for n, layer in layers.items()}
        steps["torch"] = lambda a=a, d_out=d_out, leaves=leaves: torch_step(a, d_out, leaves)
        names = list(layers)
        for r in range(args.rounds):
            # PyTorch's step first, then the variants rotated by one a round:
            # the variant timed right after PyTorch's (cooler) step changes.
            for n in ["torch"] + rotation(names, r):
                times[n].append(time_ms(steps[n], args.budget)[0])
        t_torch = statistics.median(times["torch"])
        print(f"\n{shape} ({args.data} data): torch {t_torch:.3f} ms (rounds {' '.join(f'{t:.3f}' for t in times['torch'])})")
        for n in layers:
            t = statistics.median(times[n])
            print(f"{shape}: {n:12s} {t:.3f} ms  {t_torch / t:.3f}x  "
                  f"(rounds {' '.join(f'{x:.3f}' for x in times[n])})")
        del layers, steps
        for n, d in variants:
            prof = os.path.join(d, shape + "-train-profile")
            meta = os.path.join(prof, "moe_layer_backward.json")
            if not os.path.exists(meta):
                continue
            with open(meta) as f:
                records_cycles = any(p["name"] == "phase_cycles"
                                     for p in json.load(f)["params"])
            fwd, bwd = kernel_phases(prof, call, d_out, 10, cycles=records_cycles)
            if records_cycles:
                # Each phase's ms, cycles and mean clock; for the GEMM
                # phases also the share of those cycles that the phase's
                # FLOPs need at the tensor cores' full rate (E4M3's for
                # FP8's routed GEMMs, bf16's for the rest).
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                peak = phase_peak_cycles(SHAPES[shape], sms)
                for kernel, phases in (("forward", fwd), ("backward", bwd)):
                    def row(k, ms, c):
                        text = f"{k} {ms:.3f} {c / 1e6:.3f} {c / (ms * 1e3):.0f}"
                        if k in peak[kernel] and c > 0:
                            text += f" ({100 * peak[kernel][k] / c:.0f} %)"
                        return text
                    print(f"{shape}: {n} {kernel} phases (ms, Mcycles, MHz (share of "
                          f"the peak a cycle)): " + ", ".join(
                              row(k, ms, c) for k, (ms, c) in phases.items()
                              if not k.startswith("plan") and ms > 0))
                fwd = {k: ms for k, (ms, _) in fwd.items()}
                bwd = {k: ms for k, (ms, _) in bwd.items()}
            shown = {k: v for k, v in bwd.items() if not k.startswith("plan")}
            totals = (f"sum {sum(shown.values()):.3f}, "
                      f"plan {sum(bwd.values()) - sum(shown.values()):.3f}")
            if records_cycles:  # each phase's ms is in the lines above
                print(f"{shape}: {n} backward phases: {totals}")
                continue
            print(f"{shape}: {n} phases: forward " +
                  ", ".join(f"{k} {v:.3f}" for k, v in fwd.items() if not k.startswith("plan")))
            print(f"{shape}: {n} phases: backward " +
                  ", ".join(f"{k} {v:.3f}" for k, v in shown.items()) + f" ({totals})")
        del a, d_out, leaves
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
