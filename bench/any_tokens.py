# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Layers for any token count against layers for one T, and against
PyTorch, in one run.

For each shape (default dsv3-shard and qwen3-30b): the layer compiled for
the shape's T and the layer compiled for any T up to that T
(LayerSpec(tokens=None, max_tokens=T)), both forward and training step
(forward + backward), timed at the shape's T in alternating rounds; then the
any-T layer and the PyTorch layer (bench.moe_forward.torch_layer, autograd
for the step) at smaller T (1, 7, 64, 300, 1024). JSON and a chart (time
against T) in --out.

    # where the compiler is:
    python3 -m bench.any_tokens compile bench-artifacts
    # on the GPU machine (the runtime extension built, bench-artifacts/):
    python3 -m bench.any_tokens run --artifacts bench-artifacts --out $OUT
    # the chart again, from a run's JSON:
    python3 -m bench.any_tokens chart any_tokens.json any_tokens.png
"""
import argparse
import json
import os
import sys

SHAPE_NAMES = ("dsv3-shard", "qwen3-30b")
SMALL_TOKENS = (1, 7, 64, 300, 1024)


def layers_to_compile(names):
    """(name, spec fields, options): per shape the fixed-T and the any-T
    layer, forward and training."""
    from bench.cases import spec_kwargs
    from bench.shapes import SHAPES
    layers = []
    for name in names:
        spec = spec_kwargs(SHAPES[name])
        anyt = dict(spec, tokens=None, max_tokens=spec["tokens"])
        layers += [(name, spec, {}), (name + "-anyt", anyt, {}),
                   (name + "-train", spec, dict(training=True)),
                   (name + "-anyt-train", anyt, dict(training=True))]
    return layers


def compile_main(args):
    from bench.compile import compile_all
    compile_all(args.out, args.target, layers_to_compile(args.shapes), args.jobs)
    return 0


def run_main(args):
    import torch

    import mok
    from bench.moe_forward import time_rounds, time_ms, torch_layer
    from bench.moe_training import mok_step, torch_leaves, torch_step
    from bench.shapes import SHAPES
    from bench.torch_reference import make_inputs

    def forward_layer(name):
        return mok.GpuArtifact.from_files(
            os.path.join(args.artifacts, name, "moe_layer")).load()

    def training_layer(name):
        return mok.GpuTrainingArtifact.from_files(
            os.path.join(args.artifacts, name)).load()

    gen = torch.Generator().manual_seed(0)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  commit=args.commit, rounds=args.rounds, shapes=[])
    for name in args.shapes:
        s = SHAPES[name]
        T = s["tokens"]
        fixed, anyt = forward_layer(name), forward_layer(name + "-anyt")
        fixed_t, anyt_t = training_layer(name + "-train"), training_layer(name + "-anyt-train")
        a = make_inputs(s, gen)
        d_out = torch.randn(T, s["hidden"], generator=gen).to(torch.bfloat16).cuda()
        # The same bits at the shape's T (the same plan, sums in the same
        # order), said in the result rather than asserted.
        same_forward = torch.equal(fixed(**a), anyt(**a))
        (fwd_fixed, fr, _), (fwd_any, ar, _) = time_rounds(
            [lambda: fixed(**a), lambda: anyt(**a)], args.budget, args.rounds)
        (step_fixed, sfr, _), (step_any, sar, _) = time_rounds(
            [lambda: mok_step(fixed_t, a, d_out), lambda: mok_step(anyt_t, a, d_out)],
            args.budget, args.rounds)
        row = dict(shape=name, tokens=T, forward_fixed_ms=fwd_fixed, forward_any_ms=fwd_any,
                   forward_ratio=fwd_any / fwd_fixed, step_fixed_ms=step_fixed,
                   step_any_ms=step_any, step_ratio=step_any / step_fixed,
                   rounds=dict(forward_fixed=fr, forward_any=ar, step_fixed=sfr,
                               step_any=sar),
                   same_forward_bits=same_forward, by_tokens=[])
        print(f"{name} T={T}: forward fixed {fwd_fixed:.3f} ms, any-T {fwd_any:.3f} ms "
              f"({fwd_any / fwd_fixed:.3f}x); step fixed {step_fixed:.3f} ms, any-T "
              f"{step_any:.3f} ms ({step_any / step_fixed:.3f}x); same forward bits: "
              f"{same_forward}", flush=True)
        for tokens in [t for t in SMALL_TOKENS if t < T] + [T]:
            b = make_inputs(s, gen, tokens=tokens)
            d = torch.randn(tokens, s["hidden"], generator=gen).to(torch.bfloat16).cuda()
            leaves = torch_leaves(b)
            budget = args.budget / 4
            entry = dict(tokens=tokens,
                         mok_forward_ms=time_ms(lambda: anyt(**b), budget)[0],
                         torch_forward_ms=time_ms(lambda: torch_layer(b), budget)[0],
                         mok_step_ms=time_ms(lambda: mok_step(anyt_t, b, d), budget)[0],
                         torch_step_ms=time_ms(lambda: torch_step(b, d, leaves), budget)[0])
            row["by_tokens"].append(entry)
            print(f"  T={tokens:5d}: forward mok {entry['mok_forward_ms']:.3f} / torch "
                  f"{entry['torch_forward_ms']:.3f} ms; step mok {entry['mok_step_ms']:.3f}"
                  f" / torch {entry['torch_step_ms']:.3f} ms", flush=True)
        result["shapes"].append(row)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "any_tokens.json"), "w") as f:
            json.dump(result, f, indent=1)
    try:
        _chart(result, os.path.join(args.out, "any_tokens.png"))
    except ImportError:
        print("any_tokens: no matplotlib, no chart", file=sys.stderr)
    return 0


def _chart(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(result["shapes"]), figsize=(6 * len(result["shapes"]), 4))
    axes = axes if len(result["shapes"]) > 1 else [axes]
    for ax, row in zip(axes, result["shapes"]):
        ts = [e["tokens"] for e in row["by_tokens"]]
        for key, label in (("mok_forward_ms", "mok forward (any T)"),
                           ("torch_forward_ms", "PyTorch forward"),
                           ("mok_step_ms", "mok step (any T)"),
                           ("torch_step_ms", "PyTorch step")):
            ax.plot(ts, [e[key] for e in row["by_tokens"]], marker="o", label=label)
        # The layers compiled for the shape's own T, timed there beside the
        # any-T layer (the last points of the lines above).
        ax.plot([row["tokens"]], [row["forward_fixed_ms"]], marker="x", markersize=10,
                linestyle="none", color="black", label=f"mok forward (fixed T = {row['tokens']})")
        ax.plot([row["tokens"]], [row["step_fixed_ms"]], marker="+", markersize=12,
                linestyle="none", color="black", label=f"mok step (fixed T = {row['tokens']})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("ms")
        ax.set_title(f"{row['shape']}, {result['gpu']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench.any_tokens")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile the fixed-T and any-T layers")
    c.add_argument("out")
    c.add_argument("--target", default="sm_90a")
    c.add_argument("--jobs", type=int, default=2)
    c.add_argument("--shapes", nargs="+", default=list(SHAPE_NAMES))
    r = sub.add_parser("run", help="time them on the GPU")
    r.add_argument("--artifacts", default="bench-artifacts")
    r.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench"))
    r.add_argument("--shapes", nargs="+", default=list(SHAPE_NAMES))
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--budget", type=float, default=2.0, help="seconds per layer and shape")
    r.add_argument("--commit", default="unknown")
    ch = sub.add_parser("chart", help="draw the chart of a run's JSON again")
    ch.add_argument("json")
    ch.add_argument("png")
    args = parser.parse_args(argv)
    if args.command == "chart":
        with open(args.json) as f:
            _chart(json.load(f), args.png)
        return 0
    return compile_main(args) if args.command == "compile" else run_main(args)


if __name__ == "__main__":
    sys.exit(main())
