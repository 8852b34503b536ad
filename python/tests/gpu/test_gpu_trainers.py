# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok inside real trainers on the GPU, with the trainers' own released
code (wheels from PyPI carried to the GPU machine): the checks of
bench/trainer_checks.py with CUDA tensors, so mok runs its GPU kernels
(mok.functional compiles and loads them for the device's chip). The
float64 reference and the bound are the CPU tests' (python/tests/
test_trainers.py)."""
import pytest

from bench import trainer_checks as checks

REL = checks.REL_BOUND


def _need(module):
    pytest.importorskip(module, reason=f"needs {module} (a wheel carried to the GPU machine)")


def test_functional_import_leaves_cuda_alone():
    import subprocess
    import sys
    code = ("import ctypes, torch, mok.functional, mok.ops\n"
            "assert not torch.cuda.is_initialized()\n"
            "cu = ctypes.CDLL('libcuda.so.1')\n"
            "assert cu.cuInit(0) == 0\n"
            "flags, active = ctypes.c_uint(), ctypes.c_int()\n"
            "assert cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), "
            "ctypes.byref(active)) == 0\n"
            "print(active.value)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0", "importing mok.functional made a CUDA context"


def test_automodel_init_parity_on_gpu():
    _need("nemo_automodel.components.moe.mok_experts")
    native_keys, mok_keys, same = checks.automodel_init_parity(device="cuda")
    assert native_keys == mok_keys and same


@pytest.mark.parametrize("kw", [
    dict(tokens=512, dim=1024, inter=512, experts=16, topk=4),
    dict(tokens=333, dim=512, inter=256, experts=8, topk=2, swiglu_limit=0.75, drop=0.2),
    dict(tokens=1, dim=256, inter=256, experts=8, topk=2),
], ids=["t512-h1024-e16-k4", "t333-clamped-dropped", "t1"])
def test_automodel_experts_on_gpu(kw):
    _need("nemo_automodel.components.moe.mok_experts")
    result = checks.automodel_experts_check(device="cuda", **kw)
    for name, (mine, native) in result.items():
        print(f"automodel {kw.get('tokens')} {name}: mok {mine:.2e} native {native:.2e}")
        assert mine <= REL, f"{name}: mok {mine:.2e} (native {native:.2e})"


def test_automodel_moe_block_on_gpu():
    _need("nemo_automodel.components.moe.mok_experts")
    result = checks.automodel_moe_check(device="cuda", tokens=1024, dim=1024, inter=512,
                                        experts=16, topk=4)
    for name, rel in result.items():
        assert rel <= 2 * REL, f"{name}: {rel:.2e}"


def test_hf_experts_on_gpu():
    _need("transformers.integrations.moe")
    result = checks.hf_experts_check(device="cuda", tokens=777, hidden=512, moe_inter=256,
                                     experts=16, topk=4)
    for name, (mine, native) in result.items():
        print(f"hf experts {name}: mok {mine:.2e} grouped_mm {native:.2e}")
        assert mine <= REL, f"{name}: mok {mine:.2e} (grouped_mm {native:.2e})"


def test_hf_qwen3_model_on_gpu():
    _need("transformers.integrations.moe")
    result = checks.hf_qwen3_check(device="cuda", batch=2, seq=24, hidden=256, moe_inter=128,
                                   experts=16, topk=4)
    result.pop("redraws")
    for name, (mine, native) in result.items():
        assert mine <= 2 * native + 1e-3, f"{name}: mok {mine:.2e}, grouped_mm {native:.2e}"


def test_hf_training_on_gpu():
    _need("transformers.integrations.moe")
    curves = checks.hf_qwen3_training(device="cuda")
    for step, a, b in zip(curves["step"], curves["mok"], curves["grouped_mm"]):
        assert abs(a - b) <= 0.01 * b, f"step {step}: mok {a:.4f}, grouped_mm {b:.4f}"


@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_megatron_backend_on_gpu(main_grad):
    _need("megatron.core.transformer.moe.experts")
    result, _, _ = checks.megatron_check(device="cuda", tokens=700, hidden=512, inter=256,
                                         shared_inter=512, experts=16, topk=4,
                                         main_grad=main_grad)
    for name, (mine, native) in result.items():
        print(f"megatron {name}: mok {mine:.2e} native {native:.2e}")
        assert mine <= REL, f"{name}: mok {mine:.2e} (native {native:.2e})"


def test_megatron_moe_layer_with_mok_on_gpu():
    """Megatron-Core's own MoELayer (router, dispatcher, experts) against a
    copy running mok through use_mok: its router needs CUDA, so this runs
    on the GPU only."""
    _need("megatron.core.transformer.moe.moe_layer")
    result = checks.megatron_moe_layer_check(device="cuda")
    for name, rel in result.items():
        print(f"megatron MoELayer {name}: {rel:.2e}")
        assert rel <= 2 * REL, f"{name}: {rel:.2e}"


def test_mxfp8_quantize_on_gpu_is_the_cpus():
    """mok.ops.mxfp8_quantize on CUDA tensors: bitwise the CPU result (which
    the CPU tests hold bit-exact to moe.quantize), both layouts, with zero
    and non-finite blocks; mxfp8_dequantize likewise."""
    import torch
    import mok.ops
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(4, 256, 512, generator=g)
         * torch.exp2(torch.randint(-40, 40, (4, 256, 16, 1), generator=g).float())
         .expand(4, 256, 16, 32).reshape(4, 256, 512)).to(torch.bfloat16)
    w[0, 0, :32] = 0
    w[1, 1, 7] = float("nan")
    w[2, 2, 100] = float("inf")
    cpu = mok.ops.mxfp8_quantize(w, True, True)
    gpu = mok.ops.mxfp8_quantize(w.cuda(), True, True)
    for a, b in zip(cpu, gpu):
        assert b.is_cuda and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8))
    for v, s in ((cpu[0], cpu[1]), (cpu[2], cpu[3])):
        back = mok.ops.mxfp8_dequantize(v.cuda(), s.cuda())
        assert torch.equal(back.cpu().view(torch.int16),
                           mok.ops.mxfp8_dequantize(v, s).view(torch.int16))


def test_functional_takes_mxfp8_tuples_on_the_gpu():
    """AutoModel's MXFP8 path on the GPU: mok.functional's forward and
    backward with the routed weights as mok.ops.mxfp8_quantize tuples run
    the GPU's mxfp8 layer (scalar GEMMs on sm_90a): the output and every
    gradient against the float64 definition of the mxfp8 layer
    (python/tests/fp8_reference.py) on the weights the tuples hold, within
    the FP8 GPU tests' bound; fresh inputs each run."""
    import os
    import sys

    import numpy as np
    import torch

    import mok.functional as F
    import mok.ops
    from gpu_layers import fresh_seed
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import fp8_reference as ref

    g = torch.Generator().manual_seed(fresh_seed())
    T, H, I, E, k = 24, 512, 256, 4, 2
    gate, up = (torch.randn(E, I, H, generator=g).to(torch.bfloat16) * 0.05 for _ in range(2))
    down = torch.randn(E, H, I, generator=g).to(torch.bfloat16) * 0.05
    q = [mok.ops.mxfp8_quantize(w.cuda(), True, True) for w in (gate, up, down)]
    top = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    rw = torch.rand(T, k, generator=g)
    d_out = torch.randn(T, H, generator=g).to(torch.bfloat16)
    config = F.MoKConfig()
    ws = F.get_workspace(config, None, device="cuda", num_local_tokens=T, hidden_size=H,
                         topk=k)
    sched = F.build_schedule(ws, config, top.cuda(), num_local_experts=E)
    args = (x.cuda(), rw.cuda(), None, None, None)
    out, ctx = F.forward(config, ws, sched, *args, q[0][:2], q[1][:2], q[2][:2])
    grads = F.backward(config, ws, sched, ctx, d_out.cuda(), *args, q[0], q[1], q[2][2:])
    got = dict(zip(["out", "x", "router_weights", "gate_weights", "up_weights",
                    "down_weights"], [out, *grads[:5]]))

    def f64(t):
        return t.detach().double().cpu().numpy()
    # The weights the tuples hold (the layer quantizes them back to the
    # same values and scales).
    w = [f64(mok.ops.mxfp8_dequantize(v[0], v[1])) for v in q]
    want = dict(ref.layer_backward(f64(x), top.numpy(), f64(rw), *w, f64(d_out),
                                   precision="mxfp8", padding=128),
                out=ref.layer_forward(f64(x), top.numpy(), f64(rw), *w, precision="mxfp8"))
    for name, value in got.items():
        assert value.is_cuda, name
        a, b = f64(value), want[name]
        rel = float(np.abs(a - b).sum() / np.abs(b).sum())
        print(f"functional mxfp8 {name}: against the float64 definition {rel:.2e}")
        assert np.isfinite(a).all() and rel <= REL, f"{name}: {rel:.2e}"


def test_mxfp8_refresh_replays_in_a_cuda_graph():
    """The in-place refresh (mxfp8_quantize(..., out=)) captured into a CUDA
    graph: after the weights change in place, a replay writes what a new
    call computes, into the same tensors."""
    import torch
    import mok.ops
    g = torch.Generator().manual_seed(11)
    w = torch.randn(4, 256, 512, generator=g).to(torch.bfloat16).cuda()
    q = mok.ops.mxfp8_quantize(w, True, True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        mok.ops.mxfp8_quantize(w, True, True, out=q)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mok.ops.mxfp8_quantize(w, True, True, out=q)
    for step in range(3):
        w.mul_(1.5).add_(torch.randn(w.shape, generator=g).to(torch.bfloat16).cuda())
        graph.replay()
        torch.cuda.synchronize()
        fresh = mok.ops.mxfp8_quantize(w, True, True)
        for a, b in zip(q, fresh):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), step
