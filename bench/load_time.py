#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""How long loading a compiled layer takes in a fresh process, by where its
machine code comes from (docs/Runtime.md, "Loading: cubins and the driver's
JIT cache"), for the layers under an artifacts folder (python3 -m
bench.compile shapes bench-artifacts [--training]):

    PYTHONPATH=build-gpu/python python3 -m bench.load_time \\
        --artifacts bench-artifacts --out $OUT

Each measurement is one fresh process that creates the CUDA context, then
times `load()` (the module and the workspace; the context not included).
Modes:

- `shipped`: a cubin beside the PTX (save(..., cubin=True): ptxas, whose
  own time is reported as the ahead-of-time cost), the driver's JIT cache
  off (CUDA_CACHE_DISABLE=1, so that a refused cubin shows the JIT's time);
- `driver-cold`: the PTX, the driver's JIT cache in an empty folder of the
  sample's own (CUDA_CACHE_PATH, CUDA_CACHE_MAXSIZE 4 GiB): the driver
  compiles the PTX and stores the machine code there;
- `driver-warm`: the same folder, filled by `driver-cold`: the driver finds
  the machine code in its JIT cache.

Writes <out>/load_time.json (every sample) and prints the median seconds
per layer and mode. --modes, --repeat, --layers and --with-profile choose
what runs; layers ending in -profile are left out unless asked.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("shipped", "driver-cold", "driver-warm")
DRIVER_CACHE_BYTES = 4 << 30


def layers_under(root, with_profile=False):
    """(name, kind, path) of every compiled layer under `root`, sorted by
    name: "inference" for a folder with moe_layer.ptx/.json (path: its
    moe_layer base), "training" for one with moe_layer_forward and
    moe_layer_backward (path: the folder). The compile cache (.cache) and,
    unless `with_profile`, the -profile twins are left out."""
    if not os.path.isdir(root):
        raise SystemExit(f"bench.load_time: --artifacts {root} is not a folder (make it "
                         f"with python3 -m bench.compile shapes {root})")
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".cache")
        name = os.path.relpath(d, root)
        if not with_profile and name.endswith("-profile"):
            continue
        if {"moe_layer.ptx", "moe_layer.json"} <= set(files):
            found.append((name, "inference", os.path.join(d, "moe_layer")))
        if {"moe_layer_forward.ptx", "moe_layer_backward.ptx"} <= set(files):
            found.append((name, "training", d))
    return sorted(found)


def jit_seconds(detail):
    """The driver's compile time a load's detail states, or None."""
    m = re.search(r"compiled by the driver(?: \(or taken from its JIT cache\))? in ([0-9.]+) s",
                  detail)
    return float(m.group(1)) if m else None


def child(kind, path):
    """In the fresh process: the context, then the timed load; one JSON
    line: seconds, and per kernel its load source and detail."""
    import torch

    import mok
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    if kind == "training":
        layer = mok.GpuTrainingArtifact.from_files(path).load()
        kernels = {"forward": layer._forward, "backward": layer._backward}
    else:
        layer = mok.GpuArtifact.from_files(path).load()
        kernels = {"forward": layer}
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds,
                      "sources": {k: v.load_source for k, v in kernels.items()},
                      "details": {k: v.load_detail for k, v in kernels.items()}}))


def measure(kind, path, env):
    """One fresh process's load of the layer: the child's report, with the
    process's own wall time (interpreter, imports, context) added."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.load_time", "--child", kind, path],
                          capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"bench.load_time: loading {path} failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["process_seconds"] = wall
    jit = [jit_seconds(d) for d in report["details"].values()]
    report["jit_seconds"] = sum(j for j in jit if j is not None) if any(
        j is not None for j in jit) else None
    return report


def environment(base, mode, driver_cache):
    """The environment of a `mode` measurement: the driver's JIT cache off
    (shipped) or in `driver_cache` (driver-*)."""
    env = dict(base)
    for k in ("CUDA_CACHE_DISABLE", "CUDA_CACHE_PATH", "CUDA_CACHE_MAXSIZE"):
        env.pop(k, None)
    if mode.startswith("driver-"):
        env.update(CUDA_CACHE_PATH=driver_cache, CUDA_CACHE_MAXSIZE=str(DRIVER_CACHE_BYTES))
    else:
        env["CUDA_CACHE_DISABLE"] = "1"
    return env


def ship(name, kind, path, into):
    """A copy of the layer saved with cubins (ptxas) under `into`: (its
    path, ptxas's seconds)."""
    import mok
    start = time.perf_counter()
    if kind == "training":
        art = mok.GpuTrainingArtifact.from_files(path)
        shipped = art.save(os.path.join(into, name), cubin=True)
    else:
        art = mok.GpuArtifact.from_files(path)
        shipped = art.save(os.path.join(into, name), cubin=True)
    return shipped, time.perf_counter() - start


def run(layers, modes, repeat, work, measure=measure, base_env=None, progress=print):
    """Every sample: {layer: {"kind", "ptxas_seconds", mode: [report, ...]}}.
    Each driver-cold sample starts from an empty JIT cache of its own; each
    driver-warm sample reads the cache its driver-cold twin filled (made
    first when driver-cold is not among `modes`)."""
    base_env = dict(os.environ if base_env is None else base_env)
    results = {}
    for name, kind, path in layers:
        r = results[name] = {"kind": kind, "ptxas_seconds": None}
        shipped = None
        if "shipped" in modes:
            try:
                shipped, r["ptxas_seconds"] = ship(name, kind, path, os.path.join(work, "shipped"))
            except (FileNotFoundError, RuntimeError) as e:
                progress(f"{name}: no shipped cubin ({e})")
        for i in range(repeat):
            driver_cache = os.path.join(work, f"{name}.{i}".replace(os.sep, "_") + ".driver")
            for mode in modes:
                if mode == "shipped" and shipped is None:
                    continue
                if mode == "driver-warm" and "driver-cold" not in modes:
                    measure(kind, path, environment(base_env, "driver-cold", driver_cache))
                target = shipped if mode == "shipped" else path
                report = measure(kind, target, environment(base_env, mode, driver_cache))
                r.setdefault(mode, []).append(report)
                progress(f"{name} {mode} #{i + 1}: {report['seconds']:.3f} s "
                         f"({'+'.join(sorted(set(report['sources'].values())))})")
            shutil.rmtree(driver_cache, ignore_errors=True)
    return results


def summary(results, modes):
    """Per layer: the median load seconds of each mode (None: not run),
    the median JIT seconds of driver-cold, ptxas's seconds, the sources
    seen."""
    rows = []
    for name, r in results.items():
        row = {"layer": name, "kind": r["kind"], "ptxas_seconds": r["ptxas_seconds"]}
        for mode in modes:
            samples = r.get(mode, [])
            row[mode] = statistics.median(s["seconds"] for s in samples) if samples else None
            row[mode + "_sources"] = sorted({v for s in samples for v in s["sources"].values()})
        jit = [s["jit_seconds"] for s in r.get("driver-cold", [])
               if s["jit_seconds"] is not None]
        row["driver_cold_jit_seconds"] = statistics.median(jit) if jit else None
        rows.append(row)
    return rows


def table(rows, modes):
    """The summary as text: median seconds, a column per mode."""
    cols = list(modes) + ["ptxas (AOT)"]

    def cell(v):
        return f"{v:.3f}" if v is not None else "-"
    lines = [f"{'layer':28s} " + " ".join(f"{c:>12s}" for c in cols)]
    for row in rows:
        values = [row[m] for m in modes] + [row["ptxas_seconds"]]
        lines.append(f"{row['layer']:28s} " + " ".join(f"{cell(v):>12s}" for v in values))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m bench.load_time")
    ap.add_argument("--artifacts", default="bench-artifacts")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench"))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--repeat", type=int, default=2,
                    help="samples per layer and mode, each in a fresh process (the median "
                         "is reported)")
    ap.add_argument("--layers", nargs="*", default=None,
                    help="only these layers (folder names under --artifacts)")
    ap.add_argument("--with-profile", action="store_true",
                    help="also the -profile twins")
    ap.add_argument("--commit", default=os.environ.get("MOK_COMMIT", "unknown"),
                    help="the commit the kernels were compiled from (recorded)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.repeat < 1:
        ap.error(f"--repeat: expected at least 1, got {args.repeat}")
    layers = layers_under(args.artifacts, args.with_profile)
    if args.layers is not None:
        unknown = sorted(set(args.layers) - {n for n, _, _ in layers})
        if unknown:
            ap.error(f"--layers: no layer {', '.join(unknown)} under {args.artifacts}; "
                     f"found {', '.join(n for n, _, _ in layers) or 'none'}")
        layers = [entry for entry in layers if entry[0] in args.layers]
    if not layers:
        ap.error(f"--artifacts: no compiled layer under {args.artifacts}")
    modes = [m for m in MODES if m in args.modes]
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mok-load-time-") as work:
        results = run(layers, modes, args.repeat, work)
    rows = summary(results, modes)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True)
    doc = {"gpu": gpu.stdout.strip().splitlines()[0] if gpu.returncode == 0 else "unknown",
           "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "repeat": args.repeat,
           "modes": modes, "rows": rows, "samples": results}
    path = os.path.join(args.out, "load_time.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"\nload time, median seconds of {args.repeat} fresh processes each "
          f"({doc['gpu']}; the CUDA context not included)")
    print(table(rows, modes))
    print(f"\n{path}")


if __name__ == "__main__":
    main()
