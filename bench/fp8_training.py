# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A tiny MoE language model trained from one initialization on one data
stream three ways: mok's bf16 layers and mok's FP8 layers ("mxfp8" and
"fp8", LayerSpec.precision, docs/FP8.md), all mok.torch.MoELayer on the
CPU target (the executable definition of the formats, forward and
backward). The loss curves measure what FP8's quantization does to
training: the relative difference to the bf16 curve at every step. With
`--target sm_90a` the layers are the GPU kernels (bf16 and "fp8"; MXFP8
runs on the CPU target only), on the GPU machine.

    python3 -m bench.fp8_training [--steps 200] [--out DIR] [--target sm_90a]

The model and the data are examples/train_tiny_moe.py's: embedding, two
blocks of (RMSNorm, a top-2 router over 8 experts, a MoE layer with a
shared expert, residual), RMSNorm, head; a fixed random Markov chain.
H = I = 128 so both FP8 precisions' blocks fit (the "fp8" blocks are 128
wide).
"""
import argparse
import datetime
import importlib.util
import json
import os
import sys
import time

import torch

import mok
import mok.torch
from bench.hf_training import _commit

# The model and the data are examples/train_tiny_moe.py's (its vocabulary,
# experts, top-k, blocks, sequences and batch), at H = I = 128.
_EXAMPLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                             "train_tiny_moe.py")
_spec = importlib.util.spec_from_file_location("train_tiny_moe", _EXAMPLE_PATH)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
HIDDEN = INTER = 128
EXPERTS, TOP_K = example.EXPERTS, example.TOP_K


def _data(seed, steps):
    """The example's Markov chain and batches, both drawn from one
    generator."""
    gen = torch.Generator().manual_seed(seed)
    return example.batches(example.markov_chain(gen), gen, steps)


def train(precision, steps, seed, lr, target="cpu"):
    # (A GPU kernel is compiled for one token count: a batch's.)
    gpu = target != "cpu"
    spec = mok.LayerSpec(hidden=HIDDEN, intermediate=INTER, experts=EXPERTS, top_k=TOP_K,
                         shared_intermediate=INTER, padding=128, precision=precision,
                         tokens=example.BATCH * example.SEQ if gpu else None)
    torch.manual_seed(seed)
    device = "cuda" if gpu else "cpu"
    model = example.TinyLM(lambda: mok.torch.MoELayer(spec, target=target),
                           hidden=HIDDEN).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in _data(seed + 1, steps):
        inputs, targets = inputs.to(device), targets.to(device)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--target", choices=("cpu", "sm_90a"), default="cpu",
                    help="mok's layers: the CPU target, or the GPU kernels (bf16, fp8)")
    args = ap.parse_args(argv)
    gpu = args.target != "cpu"
    fp8s = ("fp8",) if gpu else ("mxfp8", "fp8")
    curves = {}
    for precision in ("bf16",) + fp8s:
        t0 = time.perf_counter()
        curves[precision] = train(precision, args.steps, args.seed, args.lr, args.target)
        c = curves[precision]
        print(f"{precision:6s} {args.steps} steps in {time.perf_counter() - t0:.0f} s: "
              f"loss {c[0]:.3f} -> {c[-1]:.3f}", flush=True)
    rel = {p: [abs(a - b) / b for a, b in zip(curves[p], curves["bf16"])] for p in fp8s}
    device = (f"{torch.cuda.get_device_name()} (mok's {args.target} kernels)" if gpu
              else "CPU (mok's CPU target)")
    result = dict(bench="fp8_training", date=datetime.date.today().isoformat(),
                  commit=_commit(), device=device, target=args.target, steps=args.steps,
                  lr=args.lr, seed=args.seed, losses=curves,
                  max_rel_diff={p: max(r) for p, r in rel.items()},
                  mean_rel_diff={p: sum(r) / len(r) for p, r in rel.items()})
    for p in rel:
        print(f"{p}: loss against bf16 at every step: max {result['max_rel_diff'][p]:.2%}, "
              f"mean {result['mean_rel_diff'][p]:.2%}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fp8_training.json"), "w") as f:
            json.dump(result, f, indent=1)
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(6.4, 3.8))
            for p, style in (("bf16", "-"), ("mxfp8", "--"), ("fp8", ":")):
                if p in curves:
                    ax.plot(curves[p], style, label=f"mok {p}")
            ax.set_xlabel("step")
            ax.set_ylabel("cross-entropy")
            where = "GPU kernels" if gpu else "CPU target"
            ax.set_title(f"tiny MoE LM, {where} ({result['date']}, {result['commit']})",
                         fontsize=9)
            ax.legend()
            fig.tight_layout()
            fig.savefig(os.path.join(args.out, "fp8_training.png"), dpi=110)
        except ImportError:
            print("fp8_training: no matplotlib, no chart", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
