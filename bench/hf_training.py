# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A small Qwen3-MoE (transformers' own model, random-initialised, no
download) trained on a fixed toy corpus twice from one initialization:
with mok's experts and with transformers' grouped_mm experts
(bench/trainer_checks.py). Writes the loss curves as JSON and, with
matplotlib, a chart.

    python3 -m bench.hf_training --device cuda --steps 50 OUT_DIR
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

from bench import trainer_checks


def _commit():
    """$MOK_COMMIT (set where the tree is a copy, as on the GPU machine, whose
    git may not be this tree's), else the checkout's HEAD."""
    if os.environ.get("MOK_COMMIT"):
        return os.environ["MOK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _chart(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(result["step"], result["grouped_mm"], "o-", label="transformers grouped_mm")
    ax.plot(result["step"], result["mok"], "x--", label="mok")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"Qwen3-MoE toy LM, {result['device']} ({result['date']}, "
                 f"{result['commit']})", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    curves = trainer_checks.hf_qwen3_training(device=args.device, steps=args.steps,
                                             seed=args.seed)
    import torch
    import transformers
    device = (torch.cuda.get_device_name() if args.device.startswith("cuda")
              else "CPU (mok's CPU target)")
    result = dict(curves, device=device, date=datetime.date.today().isoformat(),
                  commit=_commit(), transformers=transformers.__version__,
                  torch=torch.__version__, seed=args.seed,
                  max_rel_diff=max(abs(a - b) / b for a, b in
                                   zip(curves["mok"], curves["grouped_mm"])))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hf_training.json"), "w") as f:
        json.dump(result, f, indent=1)
    for s, a, b in zip(curves["step"], curves["mok"], curves["grouped_mm"]):
        print(f"step {s:3d}  mok {a:.4f}  grouped_mm {b:.4f}  ({abs(a - b) / b:.2%})")
    try:
        _chart(result, os.path.join(args.out, "hf_training.png"))
    except ImportError:
        print("hf_training: no matplotlib, no chart", file=sys.stderr)


if __name__ == "__main__":
    main()
