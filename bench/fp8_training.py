# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A tiny MoE language model trained from one initialization on one data
stream three ways: mok's bf16 layers and mok's FP8 layers ("mxfp8" and
"fp8", LayerSpec.precision, docs/FP8.md), all mok.torch.MoELayer on the
CPU target (the executable definition of the formats, forward and
backward). The loss curves measure what FP8's quantization does to
training: the relative difference to the bf16 curve at every step.

    python3 -m bench.fp8_training [--steps 200] [--out DIR]

The model: embedding, two blocks of (RMSNorm, a top-2 router over 8
experts, a MoE layer with a shared expert, residual), RMSNorm, head; the
data: a fixed random Markov chain (examples/train_tiny_moe.py's). H = I =
128 so both FP8 precisions' blocks fit (the "fp8" blocks are 128 wide).
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch

import mok
import mok.torch
from bench.hf_training import _commit

VOCAB, HIDDEN, INTER, EXPERTS, TOP_K, BLOCKS, SEQ, BATCH = 64, 128, 128, 8, 2, 2, 32, 8


class Block(torch.nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.norm = torch.nn.RMSNorm(HIDDEN)
        self.router = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.moe = moe

    def forward(self, h):
        a = self.norm(h.float()).bfloat16()
        top_logits, top = self.router(a.float()).topk(TOP_K, dim=-1)
        return h + self.moe(a, top.int(), torch.softmax(top_logits, dim=-1)).float()


class TinyLM(torch.nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList([Block(mok.torch.MoELayer(spec))
                                           for _ in range(BLOCKS)])
        self.norm = torch.nn.RMSNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens).reshape(-1, HIDDEN)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def _data(seed, steps):
    gen = torch.Generator().manual_seed(seed)
    p = torch.full((VOCAB, VOCAB), 1e-3)
    for t in range(VOCAB):
        p[t, torch.randperm(VOCAB, generator=gen)[:4]] += torch.rand(4, generator=gen) + 0.5
    chain = p / p.sum(1, keepdim=True)
    for _ in range(steps):
        seq = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(VOCAB, (BATCH,), generator=gen)
        for i in range(SEQ):
            seq[:, i + 1] = torch.multinomial(chain[seq[:, i]], 1, generator=gen)[:, 0]
        yield seq[:, :-1], seq[:, 1:]


def train(precision, steps, seed, lr):
    spec = mok.LayerSpec(hidden=HIDDEN, intermediate=INTER, experts=EXPERTS, top_k=TOP_K,
                         shared_intermediate=INTER, padding=128, precision=precision)
    torch.manual_seed(seed)
    model = TinyLM(spec)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in _data(seed + 1, steps):
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
    args = ap.parse_args(argv)
    curves = {}
    for precision in ("bf16", "mxfp8", "fp8"):
        t0 = time.perf_counter()
        curves[precision] = train(precision, args.steps, args.seed, args.lr)
        c = curves[precision]
        print(f"{precision:6s} {args.steps} steps in {time.perf_counter() - t0:.0f} s: "
              f"loss {c[0]:.3f} -> {c[-1]:.3f}", flush=True)
    rel = {p: [abs(a - b) / b for a, b in zip(curves[p], curves["bf16"])]
           for p in ("mxfp8", "fp8")}
    result = dict(bench="fp8_training", date=datetime.date.today().isoformat(),
                  commit=_commit(), device="CPU (mok's CPU target)", steps=args.steps,
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
                ax.plot(curves[p], style, label=f"mok {p}")
            ax.set_xlabel("step")
            ax.set_ylabel("cross-entropy")
            ax.set_title(f"tiny MoE LM, CPU target ({result['date']}, {result['commit']})",
                         fontsize=9)
            ax.legend()
            fig.tight_layout()
            fig.savefig(os.path.join(args.out, "fp8_training.png"), dpi=110)
        except ImportError:
            print("fp8_training: no matplotlib, no chart", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
