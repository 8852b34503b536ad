#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""How long mok.compile takes, cold and cached, and where the time goes
(needs the compiler: the mok._mok extension, or the mok-compile binary
named by $MOK_COMPILER; no GPU):

    PYTHONPATH=build/python python3 -m bench.compile_time [--runs=3] \\
        [--targets sm_90a sm_100a] [--forms forward training] \\
        [--json compile-time.json] [SHAPE...]

SHAPE: benchmark shapes of bench/shapes.py or "tiny" (a test-sized layer,
hidden 128); default dsv3-shard, qwen3-30b, small-top2 and tiny. Forms:
"forward" (the inference kernel) and "training" (training=True: the
training forward and the backward).

Every run is a fresh Python process, which imports mok, loads the compiler
(mok._mok: LLVM and MLIR; "load"), compiles the layer into an empty cache
folder ("cold": the mok.compile call) and compiles it again ("cached, in
process"); a second fresh process then imports mok and compiles it once
more, from that cache ("cached, new process": the mok.compile call, its
first in the process; "import mok" beside it). The runs go round after
round over the layers; the times are medians over the runs. The breakdown is the run's with the median cold compile: parse,
each step (training, mk, gpu, llvm, ptx), the PTX step's parts summed
over the kernels, which are emitted in parallel (ptx.translate, ptx.link,
ptx.optimize, ptx.codegen), the printing of the stages (print) and the
rest (python: the cache key, the options, writing the cache).

Prints a table; --json writes the results with the machine's load average
before and after (other work on the machine slows a compile).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_SHAPES = ("dsv3-shard", "qwen3-30b", "small-top2", "tiny")
# A layer of the size the tests compile, with tensor-core GEMMs.
TINY = dict(hidden=128, intermediate=128, experts=4, top_k=2, tokens=64, padding=128)
# The parts of the breakdown that are wall time of the compile's steps; the
# "ptx." parts are summed over kernels compiled in parallel, so only these
# add up to the compile.
STEPS = ("parse", "training", "mk", "gpu", "llvm", "ptx", "print")
# The breakdown's columns, in pipeline order.
ORDER = ("parse", "training", "mk", "gpu", "llvm", "ptx", "ptx.translate", "ptx.link",
         "ptx.optimize", "ptx.codegen", "print", "python")


def layer(shape, form):
    """(LayerSpec fields, mok.compile options) of `shape` in `form`."""
    if shape == "tiny":
        spec, options = dict(TINY), {}
    else:
        from bench.compile import shape_layers
        [(_, spec, options)] = shape_layers([shape], form == "training", True)
    if form == "training":
        options = dict(options, training=True)
    return spec, options


def worker(args):
    """One run, in this (fresh) process: a JSON line on stdout."""
    start = time.perf_counter()
    import mok
    from mok import _compile, _extensions
    imported = time.perf_counter()
    try:
        _extensions.compiler()
    except ImportError:
        pass  # compiled by mok-compile instead
    loaded = time.perf_counter()
    spec, options = layer(args.shape, args.form)
    spec = mok.LayerSpec(**spec)
    t0 = time.perf_counter()
    mok.compile(spec, target=args.target, cache_dir=args.cache_dir, **options)
    cold = time.perf_counter() - t0
    parts = dict(getattr(_compile, "_last_times", []))  # a mok without it: no parts
    t0 = time.perf_counter()
    mok.compile(spec, target=args.target, cache_dir=args.cache_dir, **options)
    cached = time.perf_counter() - t0
    steps = sum(parts.get(s, 0.0) for s in STEPS)
    parts["python"] = max(cold - steps, 0.0)
    print(json.dumps({"import_mok": imported - start, "load": loaded - imported,
                      "cold": cold, "cached_in_process": cached, "parts": parts}))


def cached_worker(args):
    """A fresh process compiling from the cache: a JSON line on stdout."""
    start = time.perf_counter()
    import mok
    imported = time.perf_counter()
    spec, options = layer(args.shape, args.form)
    t0 = time.perf_counter()
    mok.compile(mok.LayerSpec(**spec), target=args.target, cache_dir=args.cache_dir,
                **options)
    print(json.dumps({"import_mok": imported - start, "cached": time.perf_counter() - t0}))


def run_worker(mode, shape, target, form, cache_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compile_time", "--worker", mode, "--target", target,
         "--form", form, "--cache-dir", cache_dir, shape],
        capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{shape} {target} {form}: {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sample(shape, target, form):
    """One run of a layer: (the cold process's report, the cached one's)."""
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = run_worker("cold", shape, target, form, cache_dir)
        return cold, run_worker("cached", shape, target, form, cache_dir)


def summary(shape, target, form, runs):
    """Medians over the runs `runs` ([(cold, cached)]) of one layer."""
    samples, cached = [r[0] for r in runs], [r[1] for r in runs]
    med = lambda values: statistics.median(values)  # noqa: E731
    # The breakdown is the median run's (the lower middle one of an even
    # number), so that its parts add up to its cold time.
    middle = sorted(samples, key=lambda s: s["cold"])[(len(runs) - 1) // 2]
    return {"shape": shape, "target": target, "form": form, "runs": len(runs),
            "cold_s": med([s["cold"] for s in samples]),
            "cold_runs_s": [s["cold"] for s in samples],
            "breakdown_run_cold_s": middle["cold"],
            "load_s": med([s["load"] for s in samples]),
            "cached_in_process_s": med([s["cached_in_process"] for s in samples]),
            "cached_new_process_s": med([c["cached"] for c in cached]),
            "import_mok_s": med([c["import_mok"] for c in cached]),
            "breakdown_s": middle["parts"]}


def table(results):
    """The printed table: one row a layer, then the cold breakdowns."""
    lines = [f"{'shape':<12} {'target':<8} {'form':<9} {'cold s':>7} {'+load s':>7} "
             f"{'cached ms':>9} {'new proc ms':>11} {'import mok ms':>13}"]
    for r in results:
        lines.append(f"{r['shape']:<12} {r['target']:<8} {r['form']:<9} {r['cold_s']:7.3f} "
                     f"{r['load_s']:7.3f} {r['cached_in_process_s'] * 1e3:9.1f} "
                     f"{r['cached_new_process_s'] * 1e3:11.1f} {r['import_mok_s'] * 1e3:13.1f}")
    seen = {n for r in results for n in r["breakdown_s"]}
    names = [n for n in ORDER if n in seen] + sorted(seen - set(ORDER))
    lines.append("")
    lines.append("cold compile by part, seconds (ptx.*: summed over kernels emitted in "
                 "parallel)")
    lines.append(f"{'shape':<12} {'target':<8} {'form':<9} " +
                 " ".join(f"{n:>13}" for n in names))
    for r in results:
        lines.append(f"{r['shape']:<12} {r['target']:<8} {r['form']:<9} " + " ".join(
            f"{r['breakdown_s'].get(n, 0.0):13.3f}" for n in names))
    return "\n".join(lines)


def cpu_model():
    """The processor's name (/proc/cpuinfo), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m bench.compile_time",
                                 description="mok.compile's cold and cached times.")
    ap.add_argument("shapes", nargs="*", metavar="SHAPE",
                    help=f"shapes (default {' '.join(DEFAULT_SHAPES)})")
    ap.add_argument("--targets", nargs="+", default=["sm_90a", "sm_100a"],
                    choices=["sm_90a", "sm_100a"])
    ap.add_argument("--forms", nargs="+", default=["forward", "training"],
                    choices=["forward", "training"])
    ap.add_argument("--runs", type=int, default=3, help="fresh processes a layer (median)")
    ap.add_argument("--json", help="write the results here")
    # A run's own process (internal).
    ap.add_argument("--worker", choices=["cold", "cached"], help=argparse.SUPPRESS)
    ap.add_argument("--target", default="sm_90a", help=argparse.SUPPRESS)
    ap.add_argument("--form", default="forward", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = ap.parse_intermixed_args(argv)
    if args.runs < 1:
        ap.error(f"--runs: expected at least 1, got {args.runs}")
    from bench.shapes import SHAPES
    unknown = [s for s in args.shapes if s != "tiny" and s not in SHAPES]
    if unknown:
        ap.error(f"SHAPE: unknown shape(s) {', '.join(unknown)}; known: tiny, "
                 f"{', '.join(SHAPES)}")
    args.shapes = args.shapes or list(DEFAULT_SHAPES)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        args.shape = args.shapes[0]
        return (worker if args.worker == "cold" else cached_worker)(args)
    before = os.getloadavg()
    layers = [(shape, target, form) for shape in args.shapes for target in args.targets
              for form in args.forms]
    # Round after round over every layer, so that a stretch of other work on
    # the machine spreads over the layers instead of spoiling one.
    runs = {layer: [] for layer in layers}
    for round_ in range(args.runs):
        for layer in layers:
            runs[layer].append(sample(*layer))
            print(f"round {round_ + 1}: {' '.join(layer)}: cold "
                  f"{runs[layer][-1][0]['cold']:.3f} s", file=sys.stderr, flush=True)
    results = [summary(*layer, runs[layer]) for layer in layers]
    after = os.getloadavg()
    print(table(results))
    print(f"\nload average (1, 5, 15 min): before {before[0]:.2f} {before[1]:.2f} "
          f"{before[2]:.2f}, after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(__file__)).stdout.strip()
        meta = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "runs": args.runs,
                "cpus": os.cpu_count(), "cpu": cpu_model(), "loadavg_before": before,
                "loadavg_after": after, "python": sys.version.split()[0]}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
