# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The GPU forward layer against a float64 reference, on fresh random inputs,
with the output poisoned (NaN) before every launch. Needs a CUDA GPU, torch,
the runtime extension mok._runtime (build/python, or build-gpu/python from
python/runtime-ext) and the artifacts compiled by
python3 -m bench.compile tests (MOK_GPU_ARTIFACTS, default gpu-artifacts).
"""
import os

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES
from gpu_results import RESULTS

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
REL_BOUND = 1e-2


def layer_artifact(name):
    path = os.path.join(ARTIFACTS, name, "moe_layer")
    if not os.path.exists(path + ".ptx"):
        pytest.fail(f"{path}.ptx is missing: run python3 -m bench.compile tests")
    return mok.GpuArtifact.from_files(path)


def _layer(name):
    """The layer, every output it allocates poisoned (NaN) before the launch."""
    return layer_artifact(name).load(poison_outputs=True)


def _inputs(c, gen):
    return torch_reference.make_inputs(c, gen)


def _reference(c, a):
    return torch_reference.forward(a, c["experts"], c.get("swiglu_limit"))


def _compare(name, c, got, ref, ms):
    import torch
    got = got.double()
    assert not torch.isnan(got).any(), f"{name}: NaN in the output (unwritten?)"
    diff = (got - ref).abs()
    rel = (diff.sum() / ref.abs().sum()).item()
    RESULTS.append(dict(case=name, T=c["tokens"], H=c["hidden"], I=c["intermediate"],
                        E=c["experts"], k=c["top_k"], rel=rel, max=diff.max().item(), ms=ms))
    assert rel <= REL_BOUND, f"{name}: relative error {rel:.3e} > {REL_BOUND}"


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_reference(name):
    import torch
    c = CASES[name]
    layer = _layer(name)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    args = _inputs(c, gen)
    layer(**args)  # warm-up (module load, first launch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = layer(**args)
    end.record()
    torch.cuda.synchronize()
    _compare(name, c, out, _reference(c, args), start.elapsed_time(end))
    # A second call on the same workspace gives the same bits.
    assert torch.equal(layer(**args), out)


@pytest.mark.parametrize("name", ["shared_clamp_i64", "top1_clamp"])
def test_cuda_graph_capture_and_replay(name):
    """Capture one forward, then replay it on new inputs copied into the
    captured buffers (top1_clamp runs the TMA + wgmma phases, whose tensor
    maps stay valid because the buffers do not move)."""
    import torch
    c = CASES[name]
    layer = _layer(name)
    gen = torch.Generator().manual_seed(1)
    static = _inputs(c, gen)
    layer(**static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(**static)
    for seed in (2, 3):
        fresh = _inputs(c, torch.Generator().manual_seed(seed))
        for k, v in fresh.items():
            static[k].copy_(v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _compare(f"graph_{name}_{seed}", c, out, _reference(c, static), 0.0)


def test_argument_errors():
    import torch
    c = CASES["one_token_top8"]
    layer = _layer("one_token_top8")
    args = _inputs(c, torch.Generator().manual_seed(0))
    bad = dict(args, x=args["x"].float())
    with pytest.raises(TypeError, match="x: expected dtype torch.bfloat16, got torch.float32"):
        layer(**bad)
    bad = dict(args, router_weights=args["router_weights"].cpu())
    with pytest.raises(ValueError, match="router_weights: expected a tensor on cuda:0, got cpu"):
        layer(**bad)
    bad = dict(args, gate_weights=args["gate_weights"][:, :64])
    with pytest.raises(ValueError, match="gate_weights: expected shape"):
        layer(**bad)
    with pytest.raises(TypeError, match="missing argument"):
        layer(x=args["x"])
    shape = list(layer.output["shape"])
    with pytest.raises(TypeError, match="out: expected dtype torch.bfloat16, got torch.float32"):
        layer(**args, out=torch.empty(shape, device="cuda"))
    with pytest.raises(ValueError, match=r"out: expected shape \[1, 256\]"):
        layer(**args, out=torch.empty(2, 256, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="out: expected a tensor on cuda:0, got cpu"):
        layer(**args, out=torch.empty(shape, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out: expected a contiguous tensor"):
        layer(**args, out=torch.empty(256, 2, dtype=torch.bfloat16, device="cuda").t()[:1])
    with pytest.raises(ValueError, match="out: overlaps the input x in memory"):
        layer(**args, out=args["x"])
    with pytest.raises(ValueError, match="out: must not require grad"):
        layer(**args, out=torch.empty(shape, dtype=torch.bfloat16, device="cuda",
                                      requires_grad=True))
    with pytest.raises(TypeError, match="poison_outputs: expected a bool"):
        mok.GpuLayer(layer_artifact("one_token_top8"), poison_outputs=1)


def test_out_argument_and_unpoisoned_outputs():
    """out= is written in place (every element: it is poisoned first); a
    layer loaded without poison_outputs gives the same bits."""
    import torch
    name = "top1_clamp"
    c = CASES[name]
    poisoned = _layer(name)
    plain = layer_artifact(name).load()
    assert not plain.poison_outputs and poisoned.poison_outputs
    args = _inputs(c, torch.Generator().manual_seed(5))
    out = torch.full(list(plain.output["shape"]), float("nan"), dtype=torch.bfloat16,
                     device="cuda")
    assert plain(**args, out=out) is out
    torch.cuda.synchronize()
    _compare("out_" + name, c, out, _reference(c, args), 0.0)
    assert torch.equal(plain(**args), out)
    assert torch.equal(poisoned(**args), out)


def test_dlpack_arrays_are_taken_zero_copy():
    """Any DLPack GPU array works as an argument (CuPy here, for the int32
    and float32 operands; CuPy has no bf16)."""
    import torch
    cupy = pytest.importorskip("cupy")
    name = "top1_clamp"
    c = CASES[name]
    layer = _layer(name)
    args = _inputs(c, torch.Generator().manual_seed(4))
    ref = layer(**args)
    mixed = dict(args, top_experts=cupy.from_dlpack(args["top_experts"]),
                 router_weights=cupy.from_dlpack(args["router_weights"]))
    assert torch.equal(layer(**mixed), ref)
