#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Train a tiny MoE language model twice from one initialization: with mok's
layers (mok.torch.MoELayer) and with a plain-PyTorch MoE layer of the same
math; the two loss curves should agree within bf16 noise.

    PYTHONPATH=build/python python3 examples/train_tiny_moe.py [--steps 200] [--out DIR]
        [--device cuda]

The model: token embedding, two blocks of (RMSNorm, a torch router picking
the top-k experts, the MoE layer with a shared expert, residual), RMSNorm,
output head. The data: sequences from a fixed random Markov chain over a
small vocabulary, so there is something to learn (the loss floor is the
chain's entropy, printed). A third run, the plain-PyTorch layer with f32
intermediates, measures how far bf16 rounding alone moves the curve (the
noise the two should agree within); and the first step's gradients of every
parameter are compared between mok and PyTorch. The models run on the CPU
(mok's CPU target), or with `--device cuda` on the GPU (mok's sm_90a
training kernels, docs/Backward.md; the compiler must be at hand: the
mok._mok extension, or the mok-compile binary as $MOK_COMPILER). Writes
DIR/train_tiny_moe.json (the curves and differences) and, with matplotlib,
the plot DIR/train_tiny_moe.png.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

import mok
import mok.torch

VOCAB, HIDDEN, INTER, SHARED, EXPERTS, TOP_K, BLOCKS = 64, 64, 32, 32, 8, 2, 2
SEQ, BATCH = 32, 8


def swiglu_moe(x, top, rw, wg, wu, wd, sg, su, sd, rounded=True):
    """The MoE layer in plain PyTorch with mok's roundings: gate/up, the
    activation and each expert's output rounded to bf16, f32 sums, the
    output rounded to bf16 (moe.layer's numerics). `rounded=False` keeps
    the intermediates in f32 (the noise baseline: how far rounding alone
    moves a training run)."""
    r = (lambda t: t.bfloat16().float()) if rounded else (lambda t: t)

    def mlp(a, g_w, u_w, d_w):
        g = r(a @ g_w.float().T)
        u = r(a @ u_w.float().T)
        h = r(g * torch.sigmoid(g) * u)
        return r(h @ d_w.float().T)
    xf = x.float()
    out = mlp(xf, sg, su, sd)
    for e in range(wg.shape[0]):
        rows, slots = torch.nonzero(top == e, as_tuple=True)
        if rows.numel():
            y = mlp(xf[rows], wg[e], wu[e], wd[e])
            out = out.index_add(0, rows, rw[rows, slots, None] * y)
    return out.bfloat16()


class TorchMoE(torch.nn.Module):
    """The parameters of mok.torch.MoELayer (same names and shapes, so state
    dicts move between them), computed by swiglu_moe."""

    def __init__(self, spec, rounded=True):
        super().__init__()
        self.rounded = rounded
        e, i, h, s = spec.experts, spec.intermediate, spec.hidden, spec.shared_intermediate
        shapes = dict(gate_weights=(e, i, h), up_weights=(e, i, h), down_weights=(e, h, i),
                      shared_gate_weights=(s, h), shared_up_weights=(s, h),
                      shared_down_weights=(h, s))
        for name, shape in shapes.items():
            self.register_parameter(
                name, torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)))

    def forward(self, x, top, rw):
        return swiglu_moe(x, top.long(), rw, self.gate_weights, self.up_weights,
                          self.down_weights, self.shared_gate_weights,
                          self.shared_up_weights, self.shared_down_weights, self.rounded)


class Block(torch.nn.Module):
    def __init__(self, moe, hidden=HIDDEN):
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden)
        self.router = torch.nn.Linear(hidden, EXPERTS, bias=False)
        self.moe = moe

    def forward(self, h):
        a = self.norm(h.float()).bfloat16()
        logits = self.router(a.float())
        top_logits, top = logits.topk(TOP_K, dim=-1)
        rw = torch.softmax(top_logits, dim=-1)
        return h + self.moe(a, top.int(), rw).float()


class TinyLM(torch.nn.Module):
    """`make_moe()` makes each block's MoE layer, of hidden size `hidden`
    (bench/fp8_training.py uses this model with other sizes)."""

    def __init__(self, make_moe, hidden=HIDDEN):
        super().__init__()
        self.hidden = hidden
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.blocks = torch.nn.ModuleList([Block(make_moe(), hidden) for _ in range(BLOCKS)])
        self.norm = torch.nn.RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens).reshape(-1, self.hidden)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def markov_chain(gen):
    """A sparse random transition matrix: each token has 4 likely successors."""
    p = torch.full((VOCAB, VOCAB), 1e-3)
    for t in range(VOCAB):
        p[t, torch.randperm(VOCAB, generator=gen)[:4]] += torch.rand(4, generator=gen) + 0.5
    return p / p.sum(1, keepdim=True)


def batches(chain, gen, steps):
    for _ in range(steps):
        seq = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(VOCAB, (BATCH,), generator=gen)
        for i in range(SEQ):
            seq[:, i + 1] = torch.multinomial(chain[seq[:, i]], 1, generator=gen)[:, 0]
        yield seq[:, :-1], seq[:, 1:]


def train(model, chain, steps, seed, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    device = next(model.parameters()).device
    for inputs, targets in batches(chain, torch.Generator().manual_seed(seed), steps):
        inputs, targets = inputs.to(device), targets.to(device)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=".")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error(f"--steps: expected at least 1, got {args.steps}")

    gpu = args.device == "cuda"
    # A GPU kernel is compiled for one token count: a batch's.
    spec = mok.LayerSpec(hidden=HIDDEN, intermediate=INTER, experts=EXPERTS, top_k=TOP_K,
                         shared_intermediate=SHARED, tokens=BATCH * SEQ if gpu else None)
    torch.manual_seed(args.seed)
    target = "sm_90a" if gpu else "cpu"
    mok_model = TinyLM(lambda: mok.torch.MoELayer(spec, target=target)).to(args.device)
    # The same initialization, with plain-PyTorch MoE layers; and once more
    # with f32 intermediates (the noise baseline).
    torch_model = TinyLM(lambda: TorchMoE(spec)).to(args.device)
    torch_model.load_state_dict(mok_model.state_dict())
    f32_model = TinyLM(lambda: TorchMoE(spec, rounded=False)).to(args.device)
    f32_model.load_state_dict(mok_model.state_dict())

    chain = markov_chain(torch.Generator().manual_seed(args.seed + 1))
    entropy = -(chain * chain.log()).sum(1).mean().item()
    # The first step's gradients of every parameter, mok against PyTorch.
    inputs, targets = next(batches(chain, torch.Generator().manual_seed(args.seed + 2), 1))
    first = {}
    inputs, targets = inputs.to(args.device), targets.to(args.device)
    for name, model in (("mok", mok_model), ("pytorch", torch_model)):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets.reshape(-1)).backward()
        first[name] = {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
    grad_rel = {n: ((first["mok"][n] - g).abs().sum() / g.abs().sum()).item()
                for n, g in first["pytorch"].items()}
    curves = {}
    for name, model in (("mok", mok_model), ("pytorch", torch_model),
                        ("pytorch_f32", f32_model)):
        t0 = time.perf_counter()
        curves[name] = train(model, chain, args.steps, args.seed + 2, args.lr)
        print(f"{name:8s} {args.steps} steps in {time.perf_counter() - t0:.1f} s: "
              f"loss {curves[name][0]:.3f} -> {curves[name][-1]:.3f}")
    a, b, c = curves["mok"], curves["pytorch"], curves["pytorch_f32"]
    diff = [abs(x - y) for x, y in zip(a, b)]
    noise = [abs(x - y) for x, y in zip(b, c)]
    tail = max(1, len(a) // 10)
    result = dict(steps=args.steps, lr=args.lr, seed=args.seed, device=args.device,
                  chain_entropy=entropy,
                  losses=curves, max_abs_diff=max(diff),
                  mean_abs_diff=sum(diff) / len(diff),
                  noise_max_abs_diff=max(noise), noise_mean_abs_diff=sum(noise) / len(noise),
                  first_step_grad_rel_err=grad_rel,
                  final_mok=sum(a[-tail:]) / tail, final_pytorch=sum(b[-tail:]) / tail)
    print(f"first step, gradients of every parameter, mok against PyTorch: relative error "
          f"at most {max(grad_rel.values()):.2e} ({max(grad_rel, key=grad_rel.get)})")
    print(f"loss floor (the chain's entropy) {entropy:.3f}; |mok - pytorch| per step: "
          f"mean {result['mean_abs_diff']:.4f}, max {result['max_abs_diff']:.4f}; "
          f"rounding noise |pytorch - pytorch_f32|: mean {result['noise_mean_abs_diff']:.4f}, "
          f"max {result['noise_max_abs_diff']:.4f}; last {tail} steps mean: "
          f"mok {result['final_mok']:.4f}, pytorch {result['final_pytorch']:.4f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train_tiny_moe.json"), "w") as f:
        json.dump(result, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(a, label="mok layers (mok.torch, "
                + ("sm_90a kernels on the GPU)" if gpu else "CPU target)"))
        ax.plot(b, label="plain-PyTorch MoE layers", linestyle="--")
        ax.plot(c, label="plain-PyTorch, f32 intermediates", linestyle=":", linewidth=0.9)
        ax.axhline(entropy, color="gray", linewidth=0.8, label="loss floor (chain entropy)")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title("tiny MoE LM, same initialization and data")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "train_tiny_moe.png"), dpi=110)
    except ImportError:
        print("(matplotlib not installed: no plot, the curves are in the JSON)")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
