#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok beside the open-source MoE training kernels ("peers") and the
plain-PyTorch layer, forward and forward + backward, in one process on one
GPU, on the same tensors.

The peers and their harness are not part of mok: peer_bench.py (given by
--peer-bench; its folder, with the peers' wheels, is carried to the GPU
machine as .peers/ and the wheels installed on PYTHONPATH) is used as a
library: its inputs (x [T, H] bf16, logits ~ N(0, 1), top-k, softmax router
weights; W13 = [W_gate; W_up] as one [E, 2I, H] tensor, W_down [E, H, I];
d_out), its peer adapters (liger-kernel's fused MoE, ScatterMoE, moe-ops,
transformers' grouped_mm experts, SonicMoE when installed), its PyTorch
reference layer (`torch_ref`: argsort, torch._grouped_mm, fp32 SwiGLU,
index_add) and fp32 one (`gold`), its error metrics and verdict, and its
timer (CUDA events around each call, synchronized, after warm-up; median of
--iters calls).

mok runs its training layer compiled for the shape (<artifacts>/<shape>-train,
routed experts only: `python3 -m bench.compile shapes DIR --training
--plain-only dsv3-routed qwen3-30b`) with gate and up bound to the halves
of the same W13 (GpuTrainingLayer.bind_fc1, no copy) and W_down, x and the
router weights passed as they are; the expert ids converted to the
layer's integer type inside the timed call (as the peers that need int32
do). Forward = the training forward (which saves the backward's context,
as a peer's forward under autograd saves its activations); forward +
backward = that and the backward kernel (gradients of x, the router
weights and every weight). Every contestant's output and gradients are
checked against torch_ref and gold first (mok's computed into outputs
poisoned with NaN); a contestant that fails the check gets no ratio.

The timings go in --rounds rounds, the contestants rotated by one a round
(the board's clock and power state fall on all alike); each reported time
is the median of the rounds' medians. FLOPs: forward 6 T k H I, forward +
backward 3 x that. Per shape and for both: every contestant's ms and
TFLOP/s, the best peer (the fastest that passed its check) and mok's
ratios to it and to torch_ref (TFLOP/s over TFLOP/s: above 1, mok is
faster). Writes <out>/peers_bench.json and, with matplotlib,
<out>/peers_bench.png; prints the tables last. Exits 1 when mok did not
run or failed its check on a shape (a peer's failure is recorded, not the
run's).

    # on the GPU machine, from the repository root (scripts/gpu/run_h200.sh
    # --bench-peers does all of it):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers/whl/*.whl
    PYTHONPATH=build-gpu/python:/tmp/site python3 -m bench.peers \\
        --artifacts bench-artifacts --peer-bench .peers/peer_bench.py --out /tmp/bench
"""
import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import sys
import time

from bench.shapes import PEER_SHAPES, SHAPES

PROG = "python3 -m bench.peers"
# The strongest peers on the H200 (peer_bench's README), timed by default;
# SonicMoE too when it is installed (its pack is optional).
DEFAULT_PEERS = ("moe_ops", "scattermoe", "liger_fused_moe", "hf_grouped_mm")
OPTIONAL_PEERS = ("sonicmoe",)
# What this tool takes from peer_bench.py.
PEER_BENCH_API = ("PEER_CLASSES", "make_inputs", "run_once", "torch_ref_fwd", "gold_fwd",
                  "compare", "worst", "verdict", "time_fn", "matmul_ceiling", "pkg_version",
                  "gpu_info")
MODES = (("forward", "fwd_ms", 1), ("forward_backward", "fwdbwd_ms", 3))


def load_peer_bench(path):
    """peer_bench.py at `path`, imported as a module (module name
    `peer_bench`). Raises ValueError naming --peer-bench if it is missing
    or lacks what this tool uses."""
    if not os.path.isfile(path):
        raise ValueError(f"--peer-bench: {path} is not a file (copy the peers folder to "
                         ".peers/ and carry it)")
    spec = importlib.util.spec_from_file_location("peer_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [n for n in PEER_BENCH_API if not hasattr(module, n)]
    if missing:
        raise ValueError(f"--peer-bench: {path} has no {', '.join(missing)} (expected the "
                         "peers' peer_bench.py)")
    return module


def default_peers(find_spec=importlib.util.find_spec):
    """DEFAULT_PEERS, and each optional peer whose package is installed."""
    def installed(name):
        try:
            return find_spec(name) is not None
        except (ImportError, ValueError):
            return False
    return list(DEFAULT_PEERS) + [p for p in OPTIONAL_PEERS if installed(p)]


def expected_inputs(s):
    """{name: shape} of the training layer's inputs for shape `s`."""
    T, H, I, E, k = (s[n] for n in ("tokens", "hidden", "intermediate", "experts", "top_k"))
    return {"x": [T, H], "top_experts": [T, k], "router_weights": [T, k],
            "gate_weights": [E, I, H], "up_weights": [E, I, H], "down_weights": [E, H, I]}


def check_artifact(artifacts, name):
    """Checks <artifacts>/<name>-train (metadata only, no GPU): a training
    layer of shape `name` whose inputs are the peers' (routed experts only)
    and whose gate and up weights take views (bind_fc1). Returns its path;
    raises ValueError naming the problem."""
    path = os.path.join(artifacts, name + "-train")
    fix = (f"compile it: python3 -m bench.compile shapes {artifacts} --training "
           f"--plain-only {name}")
    files = [os.path.join(path, f"moe_layer_{k}.{e}") for k in ("forward", "backward")
             for e in ("ptx", "json")]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ValueError(f"--artifacts: no training layer of {name} at {path} (missing "
                         f"{', '.join(os.path.basename(f) for f in missing)}); {fix}")
    with open(files[1]) as f:
        params = json.load(f)["params"]
    inputs = {p["name"]: p for p in params if p["role"] == "input"}
    want = expected_inputs(SHAPES[name])
    got = {n: p["shape"] for n, p in inputs.items()}
    if got != want:
        raise ValueError(f"--artifacts: {path} takes {got}, the peers' {name} is {want}; {fix}")
    views = [n for n in ("gate_weights", "up_weights")
             if inputs[n].get("access") != "tensor_maps"]
    if views:
        raise ValueError(f"--artifacts: {path} reads {', '.join(views)} by pointer, not "
                         "through tensor maps: it cannot take the fused W13 as a view "
                         "(a tensor-core layer for sm_90a can)")
    if inputs["top_experts"]["dtype"] not in ("i32", "i64"):
        raise ValueError(f"--artifacts: {path}: top_experts is {inputs['top_experts']['dtype']}, "
                         "expected i32 or i64")
    return path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", default="bench-artifacts",
                    help="the folder of mok's <shape>-train layers")
    ap.add_argument("--peer-bench", default=".peers/peer_bench.py",
                    help="the peers' peer_bench.py (used as a library)")
    ap.add_argument("--shapes", nargs="+", default=list(PEER_SHAPES),
                    help=f"bench/shapes.py's routed-only shapes (default {' '.join(PEER_SHAPES)})")
    ap.add_argument("--peers", help="comma-separated peer names (default "
                    f"{','.join(DEFAULT_PEERS)}, and {','.join(OPTIONAL_PEERS)} when installed)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls a timing (at least 20)")
    ap.add_argument("--warmup", type=int, default=5, help="calls before a timing")
    ap.add_argument("--rounds", type=int, default=3, help="rotating rounds of timings")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="no peer's first call (compile, autotune) starts after this many "
                         "seconds; it is then reported as skipped")
    ap.add_argument("--liger-tune", default="small", choices=["small", "full", "off"])
    ap.add_argument("--sonic-tune", default="off", choices=["full", "off"],
                    help="full: QuACK's autotune, minutes a shape")
    ap.add_argument("--no-gold", action="store_true",
                    help="skip the fp32 reference (checks against torch_ref only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--commit", default=os.environ.get("MOK_COMMIT", "unknown"),
                    help="the commit mok's kernels were compiled from (recorded)")
    args = ap.parse_args(argv)
    if args.iters < 20:
        ap.error(f"--iters: expected at least 20 (a median of 20 calls), got {args.iters}")
    if args.warmup < 1:
        ap.error(f"--warmup: expected at least 1, got {args.warmup}")
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    if args.budget_s <= 0:
        ap.error(f"--budget-s: expected seconds above 0, got {args.budget_s}")
    for name in args.shapes:
        if name not in SHAPES:
            ap.error(f"--shapes: unknown shape {name!r}; the peers' are {', '.join(PEER_SHAPES)}")
        s = SHAPES[name]
        why = [w for w, bad in (("a shared expert", s.get("shared_intermediate")),
                                ("a SwiGLU clamp", s.get("swiglu_limit") is not None),
                                (f"{s.get('routing')} routing", s.get("routing", "uniform")
                                 != "uniform")) if bad]
        if why:
            ap.error(f"--shapes: {name} has {' and '.join(why)}; the peers compute routed "
                     f"experts only with uniform routing and no clamp (e.g. "
                     f"{', '.join(PEER_SHAPES)})")
    if len(set(args.shapes)) != len(args.shapes):
        ap.error(f"--shapes: a shape given twice: {' '.join(args.shapes)}")
    if args.peers is None:
        args.peer_list = default_peers()
    else:
        args.peer_list = [p.strip() for p in args.peers.split(",")]
        if not all(args.peer_list):
            ap.error(f"--peers: expected comma-separated peer names, got {args.peers!r}")
        taken = [p for p in args.peer_list if p in ("mok", "torch_ref")]
        if taken:
            ap.error(f"--peers: {', '.join(taken)} always run (mok, and torch_ref as PyTorch); "
                     "name only peers")
        if len(set(args.peer_list)) != len(args.peer_list):
            ap.error(f"--peers: a peer given twice: {args.peers}")
    try:
        args.layer_paths = {n: check_artifact(args.artifacts, n) for n in args.shapes}
    except ValueError as e:
        ap.error(str(e))
    return args


def check_peer_names(pb, names):
    """Raises ValueError naming --peers if a name is not one of pb's peers."""
    known = [n for n in pb.PEER_CLASSES if n != "torch_ref"]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--peers: unknown peer(s) {', '.join(unknown)}; "
                         f"{getattr(pb, '__file__', 'peer_bench')} has {', '.join(known)}")


def rotation(names, r):
    """The contestants' order in round r (0-based): rotated by r."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def summarize(results, flops_fwd):
    """Adds TFLOP/s to every timed result of `results` ({name: result},
    with "mok" and "torch_ref" among them; a result timed when its status is
    "ok": fwd_ms, fwdbwd_ms) and returns, for "forward" and
    "forward_backward": mok's, torch_ref's and the best peer's ms and
    TFLOP/s, and mok's ratios to the best peer and to torch_ref (its
    TFLOP/s over theirs; None where a side has no time). The best peer is
    the fastest peer that passed its check; mok gets ratios only when it
    passed its own."""
    for r in results.values():
        if r.get("status") == "ok":
            r["fwd_tflops"] = flops_fwd / r["fwd_ms"] / 1e9
            r["fwdbwd_tflops"] = 3 * flops_fwd / r["fwdbwd_ms"] / 1e9

    def timed(name, key):
        r = results.get(name, {})
        return r[key] if r.get("status") == "ok" and r.get("check") == "ok" else None

    summary = {}
    for mode, key, factor in MODES:
        peers = {n: timed(n, key) for n in results if n not in ("mok", "torch_ref")}
        peers = {n: ms for n, ms in peers.items() if ms is not None}
        best = min(peers, key=peers.get) if peers else None
        mok_ms, torch_ms = timed("mok", key), timed("torch_ref", key)
        best_ms = peers.get(best)

        def tflops(ms):
            return None if ms is None else factor * flops_fwd / ms / 1e9

        def ratio(ms):
            return None if ms is None or mok_ms is None else ms / mok_ms
        summary[mode] = dict(
            mok_ms=mok_ms, mok_tflops=tflops(mok_ms), torch_ms=torch_ms,
            torch_tflops=tflops(torch_ms), best_peer=best, best_peer_ms=best_ms,
            best_peer_tflops=tflops(best_ms), mok_over_best_peer=ratio(best_ms),
            mok_over_torch=ratio(torch_ms), mok_check=results.get("mok", {}).get("check"))
    return summary


def shape_entry(name, flops_fwd, results, **extra):
    """One shape's record of the JSON: its sizes, FLOPs, every contestant's
    result and summarize()'s two summaries."""
    s = SHAPES[name]
    entry = dict(shape=name, T=s["tokens"], H=s["hidden"], I=s["intermediate"],
                 E=s["experts"], k=s["top_k"], flops_fwd=flops_fwd, **extra)
    entry.update(summarize(results, flops_fwd))
    entry["results"] = results
    return entry


def document(env, method, peers, shapes):
    """The JSON document: run facts (date, commit, gpu, versions ... in
    `env`), the method, the peers' load status, the shapes' entries."""
    return dict(benchmark="bench.peers", date=time.strftime("%Y-%m-%d"), **env,
                method=method, peers=peers, shapes=shapes)


def write_outputs(out, doc):
    """<out>/peers_bench.json and, with matplotlib, <out>/peers_bench.png
    (TFLOP/s of every contestant per shape, forward and forward +
    backward). Returns the files written."""
    os.makedirs(out, exist_ok=True)
    written = [os.path.join(out, "peers_bench.json")]
    with open(written[0], "w") as f:
        json.dump(doc, f, indent=1, default=str)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    shapes = doc["shapes"]
    names = []
    for s in shapes:
        names += [n for n, r in s["results"].items()
                  if r.get("status") == "ok" and n not in names]
    if not shapes or not names:
        return written
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(names)
    for ax, (mode, _, _) in zip(axes, MODES):
        key = "fwd_tflops" if mode == "forward" else "fwdbwd_tflops"
        for i, n in enumerate(names):
            xs = [j - 0.4 + (i + 0.5) * width for j in range(len(shapes))]
            ys = [s["results"].get(n, {}).get(key) or 0 for s in shapes]
            failed = any(s["results"].get(n, {}).get("check") not in (None, "ok")
                         for s in shapes)
            ax.bar(xs, ys, width, label=n + (" (failed its check)" if failed else ""),
                   hatch="//" if failed else None)
        ax.set_xticks(range(len(shapes)), [s["shape"] for s in shapes])
        ax.set_ylabel("TFLOP/s (forward: 6 T k H I; + backward: 3 x)")
        ax.set_title("forward" if mode == "forward" else "forward + backward")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"MoE layer, mok beside peers: {doc.get('gpu')}, {doc['date']}")
    fig.tight_layout()
    written.append(os.path.join(out, "peers_bench.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def print_tables(doc):
    for s in doc["shapes"]:
        print(f"\n{s['shape']}: T={s['T']} H={s['H']} I={s['I']} E={s['E']} k={s['k']}")
        print(f"  {'':16s} {'fwd ms':>8s} {'fwd TF/s':>9s} {'f+b ms':>8s} {'f+b TF/s':>9s} "
              f"{'rel_l2 ref':>10s} {'rel_l2 gold':>11s}  check")
        for n, r in s["results"].items():
            if r.get("status") != "ok":
                print(f"  {n:16s} {str(r.get('error') or r.get('status'))[:90]}")
                continue
            wr, wg = r.get("worst_rel_l2_vs_ref"), r.get("worst_rel_l2_vs_gold")
            print(f"  {n:16s} {r['fwd_ms']:8.3f} {r['fwd_tflops']:9.1f} {r['fwdbwd_ms']:8.3f} "
                  f"{r['fwdbwd_tflops']:9.1f} {'-' if wr is None else f'{wr:.2e}':>10s} "
                  f"{'-' if wg is None else f'{wg:.2e}':>11s}  {r.get('check')}")
    print(f"\n{doc.get('gpu')}  {doc['date']}  commit {doc.get('commit')}: mok's TFLOP/s over "
          "the best peer's and over PyTorch's (above 1: mok is faster)")
    print(f"{'shape':12s} {'':17s} {'mok TF/s':>9s} {'best peer':>16s} {'TF/s':>7s} "
          f"{'mok/peer':>9s} {'torch TF/s':>10s} {'mok/torch':>9s}")
    for s in doc["shapes"]:
        for mode, _, _ in MODES:
            m = s[mode]

            def f(v, spec):
                return "-" if v is None else format(v, spec)
            print(f"{s['shape']:12s} {mode:17s} {f(m['mok_tflops'], '9.1f'):>9s} "
                  f"{m['best_peer'] or '-':>16s} {f(m['best_peer_tflops'], '7.1f'):>7s} "
                  f"{f(m['mok_over_best_peer'], '8.3f'):>8s}x "
                  f"{f(m['torch_tflops'], '10.1f'):>10s} {f(m['mok_over_torch'], '8.3f'):>8s}x"
                  + ("" if m["mok_check"] == "ok" else f"  (mok's check: {m['mok_check']})"))


def median_time(samples):
    """A timed result from per-round time_fn() results: the median of the
    rounds' medians, the rounds' values and the fastest call."""
    return (statistics.median(t["median_ms"] for t in samples),
            [t["median_ms"] for t in samples], min(t["min_ms"] for t in samples))


def time_contestants(pb, fns, names, results, args, dev):
    """Times `names` ({name: (forward, forward + backward)} in `fns`) in
    args.rounds rounds, rotated by one a round, with pb.time_fn (the
    forward + backward with half the warm-up calls, at least 2, as
    peer_bench times it); adds the medians to `results`. A contestant that
    raises is marked an error and leaves the rounds."""
    timings = {n: ([], []) for n in names}
    failed = set()
    for r in range(args.rounds):
        for n in rotation(names, r):
            if n in failed:
                continue
            fwd, fwd_bwd = fns[n]
            try:
                timings[n][0].append(pb.time_fn(fwd, dev, args.warmup, args.iters))
                timings[n][1].append(pb.time_fn(fwd_bwd, dev, max(2, args.warmup // 2),
                                                args.iters))
            except Exception as e:  # noqa: BLE001 (recorded; the others still run)
                results[n] = dict(results[n], status="error",
                                  error=f"timing: {type(e).__name__}: {e}")
                failed.add(n)
    for n in names:
        if n in failed:
            continue
        fwd_ms, fwd_rounds, fwd_min = median_time(timings[n][0])
        fb_ms, fb_rounds, fb_min = median_time(timings[n][1])
        results[n].update(fwd_ms=fwd_ms, fwd_ms_rounds=fwd_rounds, fwd_min_ms=fwd_min,
                          fwdbwd_ms=fb_ms, fwdbwd_ms_rounds=fb_rounds, fwdbwd_min_ms=fb_min,
                          iters=args.iters)


def run(args, pb, mok=None, dev=None):
    """Loads the peers, then per shape: inputs, references, every
    contestant's checked first call and the timing rounds. Returns the
    JSON document (also written after each shape). `mok` and `dev` (the
    mok package, CUDA) are replaced by the tests' stand-ins."""
    import torch
    if mok is None:
        import mok
    dev = dev or torch.device("cuda")
    cuda = dev.type == "cuda"

    def free():
        if cuda:
            torch.cuda.empty_cache()
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 gold
    torch.backends.cudnn.allow_tf32 = False
    pb_args = argparse.Namespace(liger_tune=args.liger_tune, sonic_tune=args.sonic_tune)
    peers, loaded = {}, {}
    for name in args.peer_list:
        p = pb.PEER_CLASSES[name]()
        try:
            p.load(pb_args, dev)
            loaded[name] = p
            peers[name] = {"status": "loaded", "variant": p.variant, "versions": p.versions()}
        except Exception as e:  # noqa: BLE001 (a missing package: the peer is left out)
            peers[name] = {"status": "unavailable", "error": f"{type(e).__name__}: {e}"}
        print(f"[{time.time() - t0:6.1f} s] peer {name}: {peers[name]['status']} "
              f"{peers[name].get('variant') or peers[name].get('error')}", flush=True)
    with open(args.peer_bench, "rb") as f:
        bench_sha = hashlib.sha256(f.read()).hexdigest()
    env = dict(commit=args.commit, gpu=torch.cuda.get_device_name(dev) if cuda else str(dev),
               torch=torch.__version__, cuda=torch.version.cuda,
               triton=pb.pkg_version("triton"), nvidia_smi=pb.gpu_info().get("nvidia_smi"),
               matmul_8192_tflops=pb.matmul_ceiling(dev) if cuda else None)
    method = dict(timing=f"CUDA events around each call, synchronized; {args.warmup} warm-up "
                         f"calls, median of {args.iters}; {args.rounds} rotating rounds, the "
                         "median of the rounds' medians",
                  flops="forward 6 T k H I; forward + backward 3 x forward",
                  routing="logits ~ N(0, 1), top-k, softmax of the top-k logits; routed "
                          "experts only",
                  iters=args.iters, warmup=args.warmup, rounds=args.rounds,
                  gold=not args.no_gold, liger_tune=args.liger_tune,
                  sonic_tune=args.sonic_tune, seed=args.seed,
                  peer_bench=os.path.abspath(args.peer_bench), peer_bench_sha256=bench_sha,
                  mok="training layer (forward saves the context; backward kernel), gate "
                      "and up bound to W13's halves")
    shapes = []
    for name in args.shapes:
        s = SHAPES[name]
        T, H, I, E, k = (s[n] for n in ("tokens", "hidden", "intermediate", "experts",
                                         "top_k"))
        flops = 6 * T * k * H * I
        print(f"[{time.time() - t0:6.1f} s] == {name}: T={T} H={H} I={I} E={E} k={k}",
              flush=True)
        x, w, idx, W13, Wd, go = pb.make_inputs(T, H, I, E, k, dev, args.seed)
        leaves = (x, w, W13, Wd)
        counts = torch.bincount(idx.reshape(-1), minlength=E)
        case = {"results": {}}
        results = case["results"]
        gold = None
        if not args.no_gold:
            fp32 = [t.detach().float().requires_grad_() for t in (x, w, W13, Wd)]
            gold = pb.run_once(pb.gold_fwd, fp32, idx, go.float())
            del fp32
            free()

        def checked(name, res):
            r = {"status": "ok"}
            r["err_vs_ref"] = pb.compare(res, ref)
            r["worst_rel_l2_vs_ref"] = pb.worst(r["err_vs_ref"])
            if gold is not None:
                r["err_vs_gold"] = pb.compare(res, gold)
                r["worst_rel_l2_vs_gold"] = pb.worst(r["err_vs_gold"])
            results[name] = r
            r["check"] = pb.verdict(r, case)
            return r

        ref = pb.run_once(pb.torch_ref_fwd, leaves, idx, go)
        checked("torch_ref", ref)

        def peer_fns(p):
            def fwd():
                return p.fwd(x, w, idx, W13, Wd)

            def fwd_bwd():
                return torch.autograd.grad(fwd(), (x, w, W13, Wd), go, allow_unused=True)
            return fwd, fwd_bwd
        fns = {"torch_ref": peer_fns(pb.PEER_CLASSES["torch_ref"]())}

        # mok: checked on outputs poisoned with NaN, then timed.
        path = args.layer_paths[name]
        params = mok.GpuTrainingArtifact.from_files(path).forward.metadata["params"]
        ids = {"i32": torch.int32, "i64": torch.int64}[
            next(q["dtype"] for q in params if q["name"] == "top_experts")]
        xd, wd, Wdd = x.detach(), w.detach(), Wd.detach()

        def mok_fns(layer):
            layer.bind_fc1(W13.detach())

            def fwd():
                return layer.forward(x=xd, top_experts=idx.to(ids), router_weights=wd,
                                     down_weights=Wdd)

            def fwd_bwd():
                _, ctx = fwd()
                return layer.backward(ctx, go)
            return fwd, fwd_bwd
        try:
            first = time.time()
            checking = mok.GpuTrainingArtifact.from_files(path).load(poison_outputs=True)
            out, ctx = mok_fns(checking)[0]()
            g = checking.backward(ctx, go)
            res = {"out": out, "dx": g["x"], "dw": g["router_weights"],
                   "dWd": g["down_weights"],
                   "dW13": torch.cat([g["gate_weights"], g["up_weights"]], dim=1)}
            checked("mok", res)["first_call_s"] = round(time.time() - first, 1)
            del checking, out, ctx, g, res
            free()
            layer = mok.GpuTrainingArtifact.from_files(path).load()
            fns["mok"] = mok_fns(layer)
        except Exception as e:  # noqa: BLE001 (recorded; the peers still run)
            results["mok"] = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        print(f"[{time.time() - t0:6.1f} s]   mok: "
              f"{results['mok'].get('check') or results['mok'].get('error')}", flush=True)
        for pname in args.peer_list:
            if pname not in loaded:
                results[pname] = {"status": peers[pname]["status"]}
                continue
            if time.time() - t0 > args.budget_s:
                results[pname] = {"status": "skipped: time budget"}
                continue
            try:
                first = time.time()
                res = pb.run_once(loaded[pname].fwd, leaves, idx, go)  # compile, autotune
                if cuda:
                    torch.cuda.synchronize()
                checked(pname, res)["first_call_s"] = round(time.time() - first, 1)
                del res
                fns[pname] = peer_fns(loaded[pname])
            except Exception as e:  # noqa: BLE001
                results[pname] = {"status": "error", "error": f"{type(e).__name__}: {e}"}
            free()
            r = results[pname]
            print(f"[{time.time() - t0:6.1f} s]   {pname}: {r.get('check') or r['status']} "
                  f"(first call {r.get('first_call_s', '-')} s)", flush=True)
        print(f"[{time.time() - t0:6.1f} s]   timing {args.rounds} rounds", flush=True)
        time_contestants(pb, fns, [n for n in ["mok", "torch_ref"] + args.peer_list if n in fns],
                         results, args, dev)
        ordered = {n: results[n] for n in ["mok", "torch_ref"] + args.peer_list if n in results}
        shapes.append(shape_entry(
            name, flops, ordered,
            tokens_per_expert={"min": int(counts.min()), "max": int(counts.max()),
                               "mean": float(counts.float().mean())}))
        del x, w, idx, W13, Wd, go, leaves, ref, gold, fns, xd, wd, Wdd
        layer = None
        free()
        write_outputs(args.out, document(env, method, peers, shapes))
    return document(env, method, peers, shapes)


def main(argv=None):
    args = parse_args(argv)
    try:
        pb = load_peer_bench(args.peer_bench)
        check_peer_names(pb, args.peer_list)
    except ValueError as e:
        sys.exit(f"{PROG}: {e}")
    doc = run(args, pb)
    written = write_outputs(args.out, doc)
    print_tables(doc)
    print("\nwrote " + ", ".join(written))
    failed = mok_failures(doc)
    if failed:
        sys.exit(f"{PROG}: mok failed on {'; '.join(failed)}")


def mok_failures(doc):
    """The shapes where mok did not run or failed its check, with why (a
    peer's failure is its own, recorded, not the run's)."""
    failed = []
    for s in doc["shapes"]:
        r = s["results"].get("mok", {})
        if r.get("status") != "ok" or r.get("check") != "ok":
            failed.append(f"{s['shape']} ({r.get('error') or r.get('check') or r.get('status')})")
    return failed


if __name__ == "__main__":
    main()
