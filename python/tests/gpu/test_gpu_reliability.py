# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Reliability on the GPU: no leak under a repeated load/unload loop
(MOK_RELIABILITY_CYCLES, default 1,000, of load + forward + drop of a small
test layer; device memory and host RSS measured before and after and
printed), and no mok._runtime instance alive when a process that loaded,
ran, trained and dropped layers exits (nanobind's "leaked instances"
report, with a diagnosis of what still holds a layer if one is). Uses the
layers of bench/cases.py (python3 -m bench.compile tests)."""
import gc
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
CYCLES = int(os.environ.get("MOK_RELIABILITY_CYCLES", "1000"))
# What may differ after the loop: the driver's and torch's own bookkeeping,
# not a layer's workspace (one_token_top8's is a few hundred KB, short_k's a
# few MB: a leak of one a cycle is hundreds of MB to GBs over the loop).
DEVICE_SLACK = 16 << 20
HOST_SLACK = 32 << 20


def _artifact(name):
    path = os.path.join(ARTIFACTS, name, "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    return mok.GpuArtifact.from_files(path)


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _device_used():
    """Bytes in use on the current device, by anyone (cuMemGetInfo), after
    torch's cache is emptied."""
    import torch
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return total - free


@pytest.mark.parametrize("name", ["one_token_top8", "short_k"])
def test_load_forward_drop_loop_leaks_nothing(name):
    """one_token_top8: scalar GEMMs; short_k: tensor-core GEMMs with tensor
    maps and a shared expert."""
    import torch
    artifact = _artifact(name)
    args = torch_reference.make_inputs(CASES[name], torch.Generator().manual_seed(5))
    reference = artifact.load()(**args)
    torch.cuda.synchronize()

    def cycle():
        layer = artifact.load()
        out = layer(**args)
        # The forward runs asynchronously: finish it before the layer (its
        # workspace, its module) goes.
        torch.cuda.current_stream().synchronize()
        return out

    for _ in range(10):  # warm: the JIT cache, torch's allocator, the context
        cycle()
    device_before, host_before = _device_used(), _rss()
    start = time.perf_counter()
    for i in range(CYCLES):
        out = cycle()
        if i == 0:
            assert torch.equal(out, reference), f"{name}: another result after reloading"
    seconds = time.perf_counter() - start
    del out
    device_after, host_after = _device_used(), _rss()
    print(f"\n{name}: {CYCLES} load + forward + drop cycles in {seconds:.1f} s "
          f"({1e3 * seconds / CYCLES:.2f} ms a cycle); device memory in use "
          f"{device_before / 2**20:.1f} -> {device_after / 2**20:.1f} MiB; host RSS "
          f"{host_before / 2**20:.1f} -> {host_after / 2**20:.1f} MiB")
    assert device_after - device_before <= DEVICE_SLACK, (device_before, device_after)
    assert host_after - host_before <= HOST_SLACK, (host_before, host_after)


# What a training script does with layers, then the exit with every one
# dropped; an atexit hook (before the interpreter clears anything) names
# whatever still holds a layer, for the case nanobind reports a leak.
_EXIT_SCRIPT = textwrap.dedent('''
    import atexit, gc, os, sys
    import torch
    import mok, mok.torch
    from bench import torch_reference
    from bench.cases import CASES, TRAIN_CASES, MAIN_GRAD_CASES, spec_kwargs

    A = os.environ["MOK_GPU_ARTIFACTS"]

    def main():
        gen = torch.Generator().manual_seed(3)
        # An inference forward, its argument errors, a CUDA graph.
        c = CASES["top1_clamp"]
        layer = mok.GpuArtifact.from_files(os.path.join(A, "top1_clamp", "moe_layer")).load(
            poison_outputs=True)
        args = torch_reference.make_inputs(c, gen)
        layer(**args)
        for bad in (dict(args, x=args["x"].float()), dict(args, x=args["x"].cpu())):
            try:
                layer(**bad)
            except (TypeError, ValueError) as e:
                kept = e  # noqa: F841 (an error holding this frame)
        try:
            layer(**args, out=args["x"])
        except (TypeError, ValueError):
            pass
        fc1 = torch.cat([args["gate_weights"], args["up_weights"]], dim=1)
        layer.bind_fc1(fc1)
        rest = {k: v for k, v in args.items() if k not in ("gate_weights", "up_weights")}
        layer(**rest)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(**rest)
        graph.replay()
        # A training forward and backward, as scripts/gpu/sanitize_run.py does.
        t = TRAIN_CASES["train_top2_no_route"]
        training = mok.GpuTrainingArtifact.from_files(
            os.path.join(A, "train_top2_no_route")).load(poison_outputs=True)
        targs = torch_reference.make_inputs(t, gen)
        tout, ctx = training.forward(**targs)
        grads = training.backward(ctx, torch.randn_like(tout.float()).to(torch.bfloat16))
        # mok.torch modules: a training step through autograd, with main_grad.
        for name in ("train_shared_tall", "maingrad_shared_tall"):
            c = {**TRAIN_CASES, **MAIN_GRAD_CASES}[name]
            art = mok.GpuTrainingArtifact.from_files(os.path.join(A, name))
            moe = mok.torch.MoELayer(mok.LayerSpec(**spec_kwargs(c)), target="sm_90a",
                                     artifact=art, recompute=art.recompute,
                                     accumulate_main_grad=art.main_grads)
            margs = torch_reference.make_inputs(c, gen)
            if art.main_grads:
                for p in moe.parameters():
                    p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            x = margs["x"].clone().requires_grad_(True)
            y = moe(x, margs["top_experts"], margs["router_weights"])
            y.float().sum().backward()
            with torch.no_grad():
                moe(margs["x"], margs["top_experts"], margs["router_weights"])
        torch.cuda.synchronize()

    def diagnose():
        gc.collect()
        kinds = (mok.GpuLayer, mok.GpuTrainingLayer, mok.torch.MoELayer)
        alive = [o for o in gc.get_objects() if isinstance(o, kinds)]
        for o in alive:
            print(f"mok-leak-diagnosis: {type(o).__name__} still alive at exit, held by:",
                  file=sys.stderr)
            for r in gc.get_referrers(o):
                if r is alive:
                    continue
                what = (list(r)[:8] if isinstance(r, dict) else
                        getattr(r, "f_code", None) or type(r).__name__)
                print(f"mok-leak-diagnosis:   {type(r).__name__}: {what}", file=sys.stderr)

    main()
    atexit.register(diagnose)
    print("ok")
''')


def test_no_layer_outlives_the_interpreter():
    env = dict(os.environ, MOK_GPU_ARTIFACTS=os.path.abspath(ARTIFACTS),
               PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True,
                          text=True, env=env, timeout=400)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-6000:]
    print(proc.stderr[-6000:] if proc.stderr.strip() else "\n(nothing on stderr at the exit)")
    assert "mok-leak-diagnosis" not in proc.stderr, proc.stderr[-6000:]
    assert "leaked" not in proc.stderr, proc.stderr[-6000:]
