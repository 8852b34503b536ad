# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The training step (forward + backward) of one Hugging Face transformers
Qwen3-MoE decoder layer (transformers' own model class, random weights, no
download) with mok's experts against transformers' grouped_mm experts, in
the same run on the GPU. Shapes: Qwen3-30B-A3B's layer (hidden 2048, 32
heads of 128, 4 KV heads, 128 experts of 768, top 8) at --tokens tokens.

    python3 -m bench.hf_decoder [--tokens 8192] [--out DIR]

The step is one decoder layer of a model (embedding, the layer, the final
norm; a small vocabulary and no LM head, so the layer dominates). The
implementations are timed in alternating rounds (bench/moe_forward.py's
time_rounds); the JSON holds every round.
"""
import argparse
import copy
import datetime
import json
import os

import torch

from bench.hf_training import _commit
from bench.moe_forward import time_rounds


def build(implementation, tokens, seq):
    import mok.hf  # noqa: F401
    from transformers import Qwen3MoeConfig, Qwen3MoeModel
    cfg = Qwen3MoeConfig(vocab_size=1024, hidden_size=2048, intermediate_size=6144,
                         moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                         num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=max(seq, 4096), norm_topk_prob=True)
    torch.manual_seed(0)
    model = Qwen3MoeModel._from_config(copy.deepcopy(cfg), dtype=torch.bfloat16,
                                       experts_implementation=implementation).cuda()
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timing in all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    batch = max(1, args.tokens // args.seq)
    models = {name: build(name, args.tokens, args.seq) for name in ("mok", "grouped_mm")}
    models["mok"].load_state_dict(models["grouped_mm"].state_dict())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1024, (batch, args.seq), generator=g).cuda()

    def step(model):
        def run():
            model.zero_grad(set_to_none=True)
            h = model(input_ids=ids).last_hidden_state
            h.float().square().mean().backward()
        return run

    fns = [step(models["mok"]), step(models["grouped_mm"])]
    for fn in fns:  # compile, load, autotune
        fn()
    torch.cuda.synchronize()
    (mok_ms, mok_rounds, mok_n), (gmm_ms, gmm_rounds, gmm_n) = time_rounds(
        fns, args.budget, args.rounds)
    result = {"bench": "hf_decoder", "date": datetime.date.today().isoformat(),
              "commit": _commit(), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "tokens": batch * args.seq, "seq": args.seq,
              "shape": "qwen3-30b-a3b decoder layer", "mok_ms": mok_ms,
              "grouped_mm_ms": gmm_ms, "speedup": gmm_ms / mok_ms, "mok_rounds": mok_rounds,
              "grouped_mm_rounds": gmm_rounds, "iters": [mok_n, gmm_n]}
    import transformers
    result["transformers"] = transformers.__version__
    print(f"hf decoder layer step, {result['tokens']} tokens: mok {mok_ms:.3f} ms, "
          f"grouped_mm {gmm_ms:.3f} ms, {result['speedup']:.2f}x")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "hf_decoder.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
