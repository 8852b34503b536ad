# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok inside real trainers, on the CPU target, with the trainers' own
released code (NeMo AutoModel, Hugging Face transformers, Megatron-Core
from PyPI; scripts/setup.sh installs them with MOK_WITH_TORCH=1): each
trainer's module with mok against the same module with its native experts
and against float64 (bench/trainer_checks.py). Also mok.functional's and
mok.ops' error paths, which need torch only. The GPU versions are
python/tests/gpu/test_gpu_trainers.py."""
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mok.functional as F  # noqa: E402
import mok.fp8  # noqa: E402
import mok.ops  # noqa: E402
from bench import trainer_checks as checks  # noqa: E402
from cpu_results import SEED  # noqa: E402

REL = checks.REL_BOUND


# -- mok.functional: the calls, their checks and errors ----------------------

def _inputs(T=8, H=64, I=32, E=4, k=2, Is=32, seed=0, ids=torch.int64):
    g = torch.Generator().manual_seed(SEED + seed)  # fresh each run (MOK_TEST_SEED)
    bf = torch.bfloat16
    x = torch.randn(T, H, generator=g).to(bf)
    top = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)] or
                      [torch.empty(0, k, dtype=torch.int64)]).reshape(T, k).to(ids)
    rw = torch.rand(T, k, generator=g)
    weights = [(torch.randn(E, I, H, generator=g) * H ** -0.5).to(bf),
               (torch.randn(E, I, H, generator=g) * H ** -0.5).to(bf),
               (torch.randn(E, H, I, generator=g) * I ** -0.5).to(bf)]
    shared = [(torch.randn(Is, H, generator=g) * H ** -0.5).to(bf),
              (torch.randn(Is, H, generator=g) * H ** -0.5).to(bf),
              (torch.randn(H, Is, generator=g) * Is ** -0.5).to(bf)]
    return x, top, rw, shared, weights


def _run(x, top, rw, shared, routed, limit=None, config=None):
    config = config or F.MoKConfig()
    T, H = x.shape
    ws = F.get_workspace(config, None, device=x.device, num_local_tokens=T, hidden_size=H,
                         topk=top.shape[1])
    sched = F.build_schedule(ws, config, top, num_local_experts=routed[0].shape[0])
    out, ctx = F.forward(config, ws, sched, x, rw, *shared, *routed, limit)
    return config, ws, sched, out, ctx


@pytest.mark.parametrize("limit,shared,ids", [(None, True, torch.int64),
                                              (0.25, True, torch.int32),
                                              (None, False, torch.int64)])
def test_functional_matches_float64(limit, shared, ids):
    x, top, rw, sh, routed = _inputs(T=13, ids=ids)
    top[3, 1] = -1  # a dropped route
    if not shared:
        sh = [None, None, None]
    config, ws, sched, out, ctx = _run(x, top, rw, sh, routed, limit)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    grads = F.backward(config, ws, sched, ctx, d_out, x, rw, *sh, *routed, limit)
    assert len(grads) == 8
    a = {"x": x, "top_experts": top, "router_weights": rw, "gate_weights": routed[0],
         "up_weights": routed[1], "down_weights": routed[2]}
    if shared:
        a.update(shared_gate_weights=sh[0], shared_up_weights=sh[1], shared_down_weights=sh[2])
    from bench import torch_reference as ref
    want = ref.forward(a, routed[0].shape[0], limit)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert ref.relative_error(out, want) <= REL
    wgrads = ref.backward(a, d_out, routed[0].shape[0], limit)
    names = ["x", "router_weights", "gate_weights", "up_weights", "down_weights",
             "shared_gate_weights", "shared_up_weights", "shared_down_weights"]
    for name, got in zip(names, grads):
        if name.startswith("shared") and not shared:
            assert got is None
            continue
        want = wgrads[name]
        assert got.shape == want.shape, name
        assert got.dtype == (torch.float32 if name == "router_weights" else torch.bfloat16)
        assert ref.relative_error(got, want) <= REL, name


def test_schedule_and_context_are_tensor_dataclasses():
    """AutoModel flattens both into save_for_backward and rebuilds them with
    type(obj)(**fields): every field a tensor or a non-empty tuple of them."""
    x, top, rw, sh, routed = _inputs()
    config, ws, sched, out, ctx = _run(x, top, rw, sh, routed)
    for obj in (sched, ctx):
        assert dataclasses.is_dataclass(obj)
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            assert isinstance(v, torch.Tensor) or (
                isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v))
    rebuilt = type(ctx)(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)})
    d_out = torch.ones_like(out)
    a = F.backward(config, ws, sched, ctx, d_out, x, rw, *sh, *routed)
    b = F.backward(config, ws, sched, rebuilt, d_out, x, rw, *sh, *routed)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def test_workspace_cache_and_any_token_count():
    config = F.MoKConfig()
    a = F.get_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=64, topk=2)
    b = F.get_workspace(config, None, device=torch.device("cpu"), num_local_tokens=8,
                        hidden_size=64, topk=2)
    c = F.get_workspace(config, None, device="cpu", num_local_tokens=9, hidden_size=64, topk=2)
    assert a is b and a is not c
    assert F.create_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=64,
                              topk=2) is not a
    # Every T runs through one compiled layer, T = 0 included.
    for T in (1, 7, 0):
        x, top, rw, sh, routed = _inputs(T=T)
        _, _, _, out, ctx = _run(x, top, rw, sh, routed)
        assert out.shape == (T, 64)
    assert len({k[0] for k in F._LAYERS if k[1] == "cpu"}) >= 1


@pytest.mark.parametrize("field,value,match", [
    ("fwd_num_comm_sms", 3, "positive even"), ("bwd_num_comm_sms", 0, "positive even"),
    ("minibatch_size", 100, "multiple of 256"),
    ("macrobatch_size", 4096 + 256, "multiple of minibatch_size"),
    ("schedule_capacity_multiplier", float("inf"), "positive finite"),
    ("schedule_capacity_multiplier", 0, "positive finite"),
    ("all_gather_top_experts_chunk_bytes", 10, "multiple of 16"),
    ("fwd_num_comm_sms", True, "positive even")])
def test_config_refuses_what_automodel_refuses(field, value, match):
    with pytest.raises(ValueError, match=f"MoKConfig.{field}: .*{match}"):
        F.MoKConfig(**{field: value})


def test_errors_name_the_argument():
    x, top, rw, sh, routed = _inputs()
    config = F.MoKConfig()
    ws = F.get_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=64, topk=2)
    sched = F.build_schedule(ws, config, top, num_local_experts=4)
    with pytest.raises(TypeError, match="config: expected a mok.functional.MoKConfig"):
        F.get_workspace(object(), None, device="cpu", num_local_tokens=8, hidden_size=64,
                        topk=2)
    with pytest.raises(ValueError, match="num_local_tokens: expected an int >= 0"):
        F.get_workspace(config, None, device="cpu", num_local_tokens=-1, hidden_size=64, topk=2)
    with pytest.raises(ValueError, match="topk: expected at most 255"):
        F.get_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=64,
                        topk=256)
    with pytest.raises(TypeError, match="ep_group: expected None or a torch.distributed"):
        F.get_workspace(config, "group", device="cpu", num_local_tokens=8, hidden_size=64,
                        topk=2)
    with pytest.raises(ValueError, match=r"top_experts: expected a int32 or int64 tensor of "
                                         r"shape \[8, 2\], got float32"):
        F.build_schedule(ws, config, rw, num_local_experts=4)
    with pytest.raises(ValueError, match=r"top_experts: .* shape \[8, 2\], got int64 of "
                                         r"shape \[7, 2\]"):
        F.build_schedule(ws, config, top[:7], num_local_experts=4)
    with pytest.raises(ValueError, match="num_local_experts: 1 on 1 rank.* fewer experts "
                                         "than topk = 2"):
        F.build_schedule(ws, config, top, num_local_experts=1)
    with pytest.raises(ValueError, match=r"x: expected a bfloat16 tensor of shape \[8, 64\], "
                                         r"got float32"):
        F.forward(config, ws, sched, x.float(), rw, *sh, *routed)
    with pytest.raises(ValueError, match=r"router_weights: expected a float32 tensor of shape "
                                         r"\[8, 2\], got bfloat16"):
        F.forward(config, ws, sched, x, rw.bfloat16(), *sh, *routed)
    with pytest.raises(ValueError, match=r"routed_down_weights: expected a bfloat16 tensor "
                                         r"of shape \[4, 64, 32\], got bfloat16 of shape "
                                         r"\[4, 32, 64\]"):
        F.forward(config, ws, sched, x, rw, *sh, routed[0], routed[1], routed[0])
    with pytest.raises(ValueError, match=r"shared_down_weights: expected a bfloat16 tensor "
                                         r"of shape \[64, 32\]"):
        F.forward(config, ws, sched, x, rw, sh[0], sh[1], sh[0], *routed)
    with pytest.raises(TypeError, match="routed_up_weights, routed_down_weights: expected "
                                        "MXFP8 tuples like the other routed weights"):
        F.forward(config, ws, sched, x, rw, *sh, (routed[0], routed[0]), *routed[1:])
    with pytest.raises(TypeError, match=r"shared_gate_weights: got a tuple \(MXFP8 weights, "
                                        r"precision='mxfp8'\), which only the routed weights"):
        F.forward(config, ws, sched, x, rw, (sh[0], sh[0]), sh[1], sh[2], *routed)
    with pytest.raises(ValueError, match="swiglu_limit: expected None .* positive finite"):
        F.forward(config, ws, sched, x, rw, *sh, *routed, -1.0)
    with pytest.raises(ValueError, match="config: not the config the workspace was made "
                                         "with"):
        F.forward(F.MoKConfig(minibatch_size=512), ws, sched, x, rw, *sh, *routed)
    with pytest.raises(TypeError, match="schedule: expected a MoKSchedule"):
        F.forward(config, ws, top, x, rw, *sh, *routed)
    out, ctx = F.forward(config, ws, sched, x, rw, *sh, *routed)
    with pytest.raises(TypeError, match="forward_context: expected a MoKForwardContext"):
        F.backward(config, ws, sched, (), out, x, rw, *sh, *routed)
    with pytest.raises(ValueError, match=r"grad_output: expected a bfloat16 tensor of shape "
                                         r"\[8, 64\], got float32"):
        F.backward(config, ws, sched, ctx, out.float(), x, rw, *sh, *routed)


def test_cpu_refuses_expert_parallel_across_processes(monkeypatch):
    import torch.distributed as dist
    with checks.one_rank_group():
        ws = F.create_workspace(F.MoKConfig(), dist.group.WORLD, device="cpu",
                                num_local_tokens=4, hidden_size=64, topk=2)
        assert (ws.ep, ws.rank) == (1, 0)
        # A group of 2 (its size as torch.distributed reports it).
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        with pytest.raises(ValueError, match="ep_group: 2 ranks on the CPU; expert "
                                             "parallelism across processes runs on the GPU"):
            F.create_workspace(F.MoKConfig(), dist.group.WORLD, device="cpu",
                               num_local_tokens=4, hidden_size=64, topk=2)


def _bf16_bits(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_mxfp8_quantize_is_bit_exact():
    """mok.ops.mxfp8_quantize (torch operations) against mok.fp8.quantize
    (moe.quantize on the CPU target), both layouts, on values spread over
    bf16's exponent range with zero, subnormal, NaN and infinite blocks,
    a block just above 448 and a negative zero; mxfp8_dequantize against
    mok.fp8.dequantize."""
    g = torch.Generator().manual_seed(SEED)
    E, R, C = 3, 64, 96
    w = (torch.randn(E, R, C // 32, 32, generator=g)
         * torch.exp2(torch.randint(-140, 120, (E, R, C // 32, 1), generator=g).float()))
    w = w.reshape(E, R, C).to(torch.bfloat16)
    w[0, 0, :32] = 0
    w[0, 1, 3] = float("nan")
    w[0, 2, 5] = float("-inf")
    w[1, 3, 40] = -0.0
    w[1, 4, :32] = 448.0 * 1.01
    w[2, 5, 64:] = 1e-40
    v, s, vt, st = mok.ops.mxfp8_quantize(w, True, True)
    assert v.dtype == vt.dtype == torch.float8_e4m3fn and s.dtype == st.dtype == torch.uint8
    assert list(v.shape) == [E, R, C] and list(s.shape) == [E, R, C // 32]
    assert list(vt.shape) == [E, C, R] and list(st.shape) == [E, C, R // 32]
    for values, scales, source in ((v, s, w), (vt, st, w.transpose(1, 2))):
        want_v, want_s = mok.fp8.quantize(_bf16_bits(source), block=(1, 32), scale="e8m0")
        assert np.array_equal(values.view(torch.uint8).numpy(), want_v)
        assert np.array_equal(scales.numpy(), want_s)
        back = mok.ops.mxfp8_dequantize(values, scales)
        assert np.array_equal(_bf16_bits(back), mok.fp8.dequantize(
            want_v, want_s, block=(1, 32), dtype="bf16"))
    assert int(s[1, 4, 0]) == 128  # amax 452.5 > 448: e = 1
    assert int(s[0, 0, 0]) == 0 and int(s[0, 1, 0]) == 0xFF
    assert mok.ops.mxfp8_quantize(w, False, True)[:2] == (None, None)
    assert mok.ops.mxfp8_quantize(w)[2:] == (None, None)


def test_mxfp8_scale_atoms_is_tcgen05s_layout():
    """mok.ops.mxfp8_scale_atoms: row r's scale of 32-block j of atom
    column cb at byte (r % 32) * 16 + (r % 128) // 32 * 4 + j of atom
    [r // 128, cb] (the layout mk.quantize_weights writes), in place with
    out=; bad scales named."""
    g = torch.Generator().manual_seed(SEED)
    E, R, C = 2, 256, 384
    scales = torch.randint(0, 256, (E, R, C // 32), generator=g, dtype=torch.uint8)
    atoms = mok.ops.mxfp8_scale_atoms(scales)
    assert atoms.dtype == torch.uint8 and list(atoms.shape) == [E, R // 128, C // 128, 512]
    s, a = scales.numpy(), atoms.numpy()
    for e in range(E):
        for r in range(R):
            for blk in range(C // 32):
                cb, j = divmod(blk, 4)
                byte = (r % 32) * 16 + (r % 128) // 32 * 4 + j
                assert a[e, r // 128, cb, byte] == s[e, r, blk]
    out = torch.empty_like(atoms)
    assert mok.ops.mxfp8_scale_atoms(scales, out=out) is out and torch.equal(out, atoms)
    with pytest.raises(ValueError, match=r"scales: expected MXFP8 scales uint8 \[E, rows, "
                                         r"cols / 32\] with rows and cols multiples of 128, "
                                         r"got torch.uint8 of shape \[2, 96, 12\]"):
        mok.ops.mxfp8_scale_atoms(scales[:, :96])
    with pytest.raises(ValueError, match=r"out: expected a uint8 tensor of shape \[2, 2, 3, 512\]"):
        mok.ops.mxfp8_scale_atoms(scales, out=out[:1])


def test_fp8_kernel_weights_are_the_kernels_layouts():
    """mok.ops.fp8_kernel_weights: fp8_quantize's tuple for "fp8";
    mxfp8_quantize's with the scales in atoms for "mxfp8"; refreshed in
    place with out=; a bad precision or out named."""
    def _bytes(t):
        return t.reshape(-1).view(torch.uint8)
    g = torch.Generator().manual_seed(SEED)
    w = torch.randn(2, 128, 256, generator=g).to(torch.bfloat16)
    for got, want in zip(mok.ops.fp8_kernel_weights(w, "fp8", True, True),
                         mok.ops.fp8_quantize(w, True, True)):
        assert torch.equal(_bytes(got), _bytes(want))
    v, s, vt, st = mok.ops.mxfp8_quantize(w, True, True)
    mx = mok.ops.fp8_kernel_weights(w, "mxfp8", True, True)
    for got, want in zip(mx, (v, mok.ops.mxfp8_scale_atoms(s), vt,
                              mok.ops.mxfp8_scale_atoms(st))):
        assert torch.equal(_bytes(got), _bytes(want))
    assert mok.ops.fp8_kernel_weights(w, "mxfp8")[2:] == (None, None)
    out = tuple(torch.zeros_like(t) for t in mx)
    ptrs = [t.data_ptr() for t in out]
    mok.ops.fp8_kernel_weights(w, "mxfp8", True, True, out=out)
    assert [t.data_ptr() for t in out] == ptrs
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(out, mx))
    q8 = mok.ops.fp8_kernel_weights(w, "fp8", True, True)
    out8 = tuple(torch.empty_like(t) for t in q8)
    mok.ops.fp8_kernel_weights(w, "fp8", True, True, out=out8)
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(out8, q8))
    with pytest.raises(ValueError, match="precision: expected 'fp8' or 'mxfp8', got 'bf16'"):
        mok.ops.fp8_kernel_weights(w, "bf16")
    with pytest.raises(ValueError, match=r"out: element 1: expected a torch.uint8 tensor of "
                                         r"shape \[2, 1, 2, 512\]"):
        mok.ops.fp8_kernel_weights(w, "mxfp8", True, True, out=(out[0], out[3], out[2], out[1]))


def test_fp8_quantizer_ir_is_fp8_quantize():
    """mok.ops.fp8_quantizer_ir, the IR of the compiled quantizer a CUDA
    weight runs: on the CPU target its results are bitwise the torch
    quantizer's (both layouts, and one alone); for both GPU targets it
    compiles to one kernel whose outputs are named and shaped as the
    runtime binds them."""
    from mok import _extensions
    g = torch.Generator().manual_seed(SEED)
    w = (torch.randn(2, 128, 384, generator=g) * 1e3).to(torch.bfloat16)
    w[1, 0, 0] = float("nan")
    want = mok.ops.fp8_quantize(w, True, True)
    c = _extensions.compiler()
    for normal, transposed in ((True, True), (True, False), (False, True)):
        ir = mok.ops.fp8_quantizer_ir((2, 128, 384), normal, transposed)
        exe = c.HostExecutable.compile(c.Module.parse(ir, "<fp8_quantizer_ir>"))
        outs = [t.numpy().copy() if t.dtype != torch.float8_e4m3fn
                else t.view(torch.uint8).numpy().copy()
                for t, asked in zip(want, (normal, normal, transposed, transposed)) if asked]
        expect = [o.copy() for o in outs]
        for o in outs:
            o.view(np.uint8).fill(0x7F)
        exe.invoke("fp8_quantize", [w.view(torch.int16).numpy().view(np.uint16)], outs)
        for got, exp in zip(outs, expect):
            assert np.array_equal(got.view(np.uint8), exp.view(np.uint8))
    ir = mok.ops.fp8_quantizer_ir((2, 128, 384), True, True)
    for chip in ("sm_90a", "sm_100a"):
        art = mok.compile(ir, target=chip, function="fp8_quantize")
        params = {p["name"]: (p["role"], p["dtype"], p["shape"]) for p in art.metadata["params"]}
        assert art.metadata["kernel"] == "fp8_quantize_quantize"
        assert params == {"weight": ("input", "bf16", [2, 128, 384]),
                          "values": ("output", "f8e4m3", [2, 128, 384]),
                          "scales": ("output", "f32", [2, 1, 3]),
                          "values_t": ("output", "f8e4m3", [2, 384, 128]),
                          "scales_t": ("output", "f32", [2, 3, 1]),
                          "grid_barrier": ("workspace", "i32", [2])}
        assert "cvt.rn.satfinite.e4m3x2.f32" in art.ptx


def test_fp8_quantizer_ir_errors_are_named():
    with pytest.raises(ValueError, match=r"shape: expected \[E, rows, cols\], three positive "
                                         r"ints, got \(128, 256\)"):
        mok.ops.fp8_quantizer_ir((128, 256))
    with pytest.raises(ValueError, match="shape: cols = 200 is not a multiple of 128"):
        mok.ops.fp8_quantizer_ir((2, 128, 200))
    with pytest.raises(ValueError, match="normal, transposed: both False"):
        mok.ops.fp8_quantizer_ir((2, 128, 256), False, False)
    with pytest.raises(TypeError, match="transposed: expected True or False, got 1"):
        mok.ops.fp8_quantizer_ir((2, 128, 256), True, 1)
    with pytest.raises(ValueError, match="function: expected a function name"):
        mok.ops.fp8_quantizer_ir((2, 128, 256), function="no name")


def test_mxfp8_quantize_errors_are_named():
    w = torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"weight: expected a bf16 tensor \[E, rows, cols\], "
                                         r"got float32 of shape \[2, 64, 64\]"):
        mok.ops.mxfp8_quantize(w.float())
    with pytest.raises(ValueError, match="weight: rows = 48 is not a multiple of 32"):
        mok.ops.mxfp8_quantize(torch.zeros(2, 48, 64, dtype=torch.bfloat16), True, True)
    with pytest.raises(TypeError, match="transposed: expected True or False, got 1"):
        mok.ops.mxfp8_quantize(w, True, 1)
    with pytest.raises(ValueError, match="normal, transposed: both False"):
        mok.ops.mxfp8_quantize(w, False, False)
    v, s, _, _ = mok.ops.mxfp8_quantize(w)
    with pytest.raises(ValueError, match=r"gate: expected MXFP8 scales uint8 \[2, 64, 2\]"):
        mok.ops.mxfp8_dequantize(v, s[:, :32], "gate")
    with pytest.raises(TypeError, match="gate: expected MXFP8 values"):
        mok.ops.mxfp8_dequantize(w, s, "gate")


def test_fp8_quantize_is_bit_exact():
    """mok.ops.fp8_quantize (torch operations; mok's "fp8" weights: 128 x
    128 blocks, f32 scales) against mok.fp8.quantize (moe.quantize on the
    CPU target), both layouts, each block at its own magnitude over bf16's
    exponent range, with zero, subnormal, NaN and infinite blocks, a block
    whose largest value is exactly 448 times a power of two, and a
    negative zero; the in-place refresh keeps the tensors."""
    g = torch.Generator().manual_seed(SEED)
    E, R, C = 2, 256, 384
    scale = torch.exp2(torch.randint(-130, 110, (E, R // 128, 1, C // 128, 1),
                                     generator=g).float())
    w = (torch.randn(E, R // 128, 128, C // 128, 128, generator=g) * scale)
    w = w.reshape(E, R, C).to(torch.bfloat16)
    w[0, :128, :128] = 0
    w[0, 3, 200] = float("nan")
    w[1, 130, 5] = float("-inf")
    w[1, 0, 300] = -0.0
    w[1, :128, 128:256] = torch.linspace(-448.0, 448.0, 128 * 128).reshape(128, 128) * 2 ** -20
    w[0, 128:, 256:] = 1e-40
    v, s, vt, st = mok.ops.fp8_quantize(w, True, True)
    assert v.dtype == vt.dtype == torch.float8_e4m3fn and s.dtype == st.dtype == torch.float32
    assert list(s.shape) == [E, R // 128, C // 128] and list(st.shape) == [E, C // 128, R // 128]
    for values, scales, source in ((v, s, w), (vt, st, w.transpose(1, 2))):
        want_v, want_s = mok.fp8.quantize(_bf16_bits(source), block=(128, 128), scale="f32")
        assert np.array_equal(values.view(torch.uint8).numpy(), want_v)
        assert np.array_equal(scales.numpy().view(np.uint32), want_s.view(np.uint32))
    assert float(s[0, 0, 0]) == 1.0 and np.isnan(float(s[0, 0, 1]))
    out = tuple(torch.empty_like(t) for t in (v, s, vt, st))
    ptrs = [t.data_ptr() for t in out]
    assert mok.ops.fp8_quantize(w, True, True, out=out) is not None
    assert [t.data_ptr() for t in out] == ptrs
    for got, want in zip(out, (v, s, vt, st)):
        assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn
                           else got.view(torch.int32),
                           want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn
                           else want.view(torch.int32))
    assert mok.ops.fp8_quantize(w)[2:] == (None, None)
    with pytest.raises(ValueError, match="weight: cols = 96 is not a multiple of 128"):
        mok.ops.fp8_quantize(torch.zeros(2, 128, 96, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out: scales: expected a contiguous float32 tensor "
                                         r"of shape \[2, 2, 3\]"):
        mok.ops.fp8_quantize(w, out=(out[0], out[1][:, :1], None, None))


def test_automodel_mxfp8_runs_the_mxfp8_layer():
    """AutoModel's GroupedExpertsMoK with precision: mxfp8 (its own weight
    cache of mok.ops.mxfp8_quantize's tuples) on the CPU target: output
    and every gradient bitwise equal to mok's precision="mxfp8" layer run
    on the bf16 weights; its bf16 path differs (the quantization is
    there)."""
    _need_automodel()
    result = checks.automodel_mxfp8_check()
    for name, (got, want) in result.items():
        if name.startswith("bf16:"):
            continue
        assert np.array_equal(got, want, equal_nan=True), name
    for name in ("output", "x", "gate_weights", "down_weights"):
        got, want = result["bf16:" + name]
        rel = np.abs(got - want).sum() / np.abs(want).sum()
        assert rel > 1e-2, f"{name}: the bf16 path is {rel:.1e} from the mxfp8 layer"


def test_mxfp8_tuples_are_checked_by_name(monkeypatch):
    config = F.MoKConfig()
    ws = F.create_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=64,
                            topk=2)
    g = torch.Generator().manual_seed(SEED)
    top = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(8)])
    sched = F.build_schedule(ws, config, top, num_local_experts=4)
    x = torch.randn(8, 64, generator=g).to(torch.bfloat16)
    rw = torch.rand(8, 2, generator=g)
    routed = [torch.randn(shape, generator=g).to(torch.bfloat16)
              for shape in ((4, 32, 64), (4, 32, 64), (4, 64, 32))]
    q = [mok.ops.mxfp8_quantize(w, True, True) for w in routed]
    fwd = [t[:2] for t in q]
    out, ctx = F.forward(config, ws, sched, x, rw, None, None, None, *fwd)
    with pytest.raises(ValueError, match=r"routed_down_weights: expected an MXFP8 tuple of 2 "
                                         r"tensors \(values_T, scales_T\) in backward, got 4"):
        F.backward(config, ws, sched, ctx, out, x, rw, None, None, None, *q)
    with pytest.raises(ValueError, match=r"routed_gate_weights: expected an MXFP8 tuple of 4 "
                                         r"tensors \(values, scales, values_T, scales_T\) in "
                                         r"backward, got 2"):
        F.backward(config, ws, sched, ctx, out, x, rw, None, None, None, *fwd)
    grads = F.backward(config, ws, sched, ctx, out, x, rw, None, None, None, q[0], q[1],
                       q[2][2:])
    assert [list(t.shape) for t in grads[2:5]] == [[4, 32, 64], [4, 32, 64], [4, 64, 32]]
    # On a GPU target the tuples run the mxfp8 layer too, compiled for
    # scalar GEMMs on sm_90a (no block-scaled MMA there): its spec and
    # options compile here (tests/gpu/test_gpu_trainers.py runs it).
    monkeypatch.setattr(ws, "target", "sm_90a")
    spec = F._spec(ws, 4, 32, None, None, top.dtype, "mxfp8")
    assert spec.precision == "mxfp8" and spec.tokens is None and spec.padding == 128
    assert F._gpu_options("sm_90a", spec) == {"tensor_cores": False}
    assert F._gpu_options("sm_100a", spec) == {}
    # (These sizes are too small for the GPU's MXFP8 layer: it says so.)
    with pytest.raises(ValueError, match="LayerSpec.hidden = 64: MXFP8 layers on sm_90a need "
                                         "a multiple of 128"):
        mok.compile(spec, target="sm_90a", training=True, **F._gpu_options("sm_90a", spec))
    wide = F.create_workspace(config, None, device="cpu", num_local_tokens=8,
                              hidden_size=128, topk=2)
    monkeypatch.setattr(wide, "target", "sm_90a")
    spec = F._spec(wide, 4, 128, None, None, top.dtype, "mxfp8")
    art = mok.compile(spec, target="sm_90a", training=True, **F._gpu_options("sm_90a", spec))
    assert "mk.quantize_weights" in art.forward.stages["mk"]


def test_import_starts_no_cuda():
    """Importing mok.functional and mok.ops initializes no CUDA (AutoModel
    imports them before torchrun workers select their devices)."""
    code = ("import torch, mok.functional, mok.ops; "
            "assert not torch.cuda.is_initialized(); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# -- NeMo AutoModel (its wheel's own modules) --------------------------------

def _need_automodel():
    pytest.importorskip("nemo_automodel.components.moe.mok_experts",
                        reason="needs nemo_automodel (scripts/setup.sh, MOK_WITH_TORCH=1)")


def test_automodel_init_parity_and_state_dict_keys():
    _need_automodel()
    native_keys, mok_keys, same = checks.automodel_init_parity(seed=SEED)
    assert native_keys == mok_keys == ["down_projs", "gate_and_up_projs"]
    assert same


@pytest.mark.parametrize("kw", [dict(), dict(swiglu_limit=0.5, tokens=37, topk=3, drop=0.3,
                                             seed=3)], ids=["plain", "clamped-top3-dropped"])
def test_automodel_experts_vs_native_and_float64(kw):
    _need_automodel()
    result = checks.automodel_experts_check(**dict(kw, seed=SEED + kw.get("seed", 0)))
    for name, (mine, native) in result.items():
        assert mine <= REL, f"{name}: mok {mine:.2e} (native {native:.2e})"
        assert mine <= 2 * native + 1e-3, f"{name}: mok {mine:.2e}, native {native:.2e}"


def test_automodel_moe_block_vs_native():
    _need_automodel()
    result = checks.automodel_moe_check(seed=SEED)
    assert set(result) >= {"output", "x", "gate.weight", "experts.gate_and_up_projs",
                           "experts.down_projs", "shared_experts.gate_proj.weight"}
    for name, rel in result.items():
        assert rel <= 2 * REL, f"{name}: {rel:.2e}"


# -- Hugging Face transformers (its own Qwen3-MoE classes) -------------------

def _need_transformers():
    pytest.importorskip("transformers.integrations.moe",
                        reason="needs transformers 5 (scripts/setup.sh, MOK_WITH_TORCH=1)")


def test_hf_experts_vs_grouped_mm_and_float64():
    _need_transformers()
    for name, (mine, native) in checks.hf_experts_check(seed=SEED).items():
        assert mine <= REL, f"{name}: mok {mine:.2e} (grouped_mm {native:.2e})"


def test_hf_qwen3_logits_and_every_gradient():
    """The whole model: mok's error against float64 is grouped_mm's
    (the model's other bf16 layers dominate both)."""
    _need_transformers()
    result = checks.hf_qwen3_check(seed=SEED)
    assert len(result) > 20
    result.pop("redraws")
    for name, (mine, native) in result.items():
        assert mine <= 2 * native + 1e-3, f"{name}: mok {mine:.2e}, grouped_mm {native:.2e}"


def test_hf_training_matches_grouped_mm():
    """50 AdamW steps on the toy corpus: the loss within 1 % of the
    grouped_mm model's at every logged step, and learning."""
    _need_transformers()
    curves = checks.hf_qwen3_training(seed=SEED % 1000)
    for step, a, b in zip(curves["step"], curves["mok"], curves["grouped_mm"]):
        assert abs(a - b) <= 0.01 * b, f"step {step}: mok {a:.4f}, grouped_mm {b:.4f}"
    assert curves["mok"][-1] < 0.5 * curves["mok"][0]


def test_hf_any_token_count_and_registration():
    _need_transformers()
    import mok.hf
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    assert ALL_EXPERTS_FUNCTIONS["mok"] is mok.hf.experts_forward
    _, model = checks.qwen3_moe_pair(seed=SEED)
    experts = model.model.layers[0].mlp.experts
    h = experts.gate_up_proj.shape[2]
    for tokens in (1, 5, 0):
        x = torch.randn(tokens, h).to(torch.bfloat16).requires_grad_(True)
        top = torch.zeros(tokens, 2, dtype=torch.int64)
        top[:, 1] = 1
        out = experts(x, top, torch.full((tokens, 2), 0.5, dtype=torch.bfloat16))
        assert out.shape == (tokens, h)
        out.float().sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("change,match", [
    (lambda m: setattr(m, "has_bias", True), "has_bias = True: .* bias-free"),
    (lambda m: setattr(m, "is_transposed", True), "is_transposed = True"),
    (lambda m: setattr(m, "is_concatenated", False), "is_concatenated = False"),
    (lambda m: setattr(m, "_is_expert_parallel", True),
     "_is_expert_parallel: transformers' expert parallelism is not supported"),
    (lambda m: setattr(m.config, "hidden_act", "gelu"), "config.hidden_act = 'gelu'"),
    (lambda m: m.float(), r"gate_up_proj: mok runs bf16 experts; got torch.float32"),
])
def test_hf_refuses_what_mok_cannot_run(change, match):
    _need_transformers()
    _, model = checks.qwen3_moe_pair(seed=SEED)
    experts = model.model.layers[0].mlp.experts
    change(experts)
    h = experts.gate_up_proj.shape[2]
    with pytest.raises(ValueError, match=match):
        experts(torch.zeros(3, h, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.int64),
                torch.ones(3, 2, dtype=torch.bfloat16))


def test_hf_refuses_bad_activations():
    _need_transformers()
    _, model = checks.qwen3_moe_pair(seed=SEED)
    experts = model.model.layers[0].mlp.experts
    h = experts.gate_up_proj.shape[2]
    with pytest.raises(ValueError, match=r"hidden_states: expected a bfloat16 tensor of shape "
                                         rf"\[S, {h}\], got torch.float32"):
        experts(torch.zeros(3, h), torch.zeros(3, 2, dtype=torch.int64), torch.ones(3, 2))
    with pytest.raises(ValueError, match="top_k_index: expected an int64 tensor"):
        experts(torch.zeros(3, h, dtype=torch.bfloat16), torch.zeros(3, 2),
                torch.ones(3, 2))


# -- Megatron-Core (its own SequentialMLP, SharedExpertMLP, moe_utils) -------

def _need_megatron():
    pytest.importorskip("megatron.core.transformer.moe.experts",
                        reason="needs megatron-core (scripts/setup.sh, MOK_WITH_TORCH=1)")


@pytest.mark.parametrize("main_grad", [False, True, "bf16"],
                         ids=["grad", "main_grad", "bf16-main_grad"])
def test_megatron_backend_vs_native_and_float64(main_grad):
    _need_megatron()
    result, backend, routed = checks.megatron_check(seed=SEED, main_grad=main_grad)
    for name, (mine, native) in result.items():
        assert mine <= REL, f"{name}: mok {mine:.2e} (native {native:.2e})"
    # No aliases: the native modules own every parameter and checkpoint shard.
    assert len(backend.state_dict()) == 0 and backend.sharded_state_dict() == {}
    assert list(backend.parameters()) == []
    assert len(backend.autograd_routed_parameters) == 2 * backend.num_local_experts
    if main_grad:
        for p in routed.parameters():
            assert p.grad_added_to_main_grad and not p.grad.any()


def test_megatron_routes_from_routing_map():
    from mok.megatron import routes_from_routing_map
    rm = torch.tensor([[False, True, False, True], [False] * 4, [True, False, False, False]])
    probs = torch.tensor([[0, .25, 0, .75], [0] * 4, [1., 0, 0, 0]], requires_grad=True)
    top, w = routes_from_routing_map(probs, rm, 2)
    assert top.tolist() == [[1, 3], [-1, -1], [0, -1]]
    assert w.tolist() == [[.25, .75], [0, 0], [1, 0]]
    w.sum().backward()
    assert probs.grad.tolist() == rm.float().tolist()
    with pytest.raises(ValueError, match=r"routing_map: expected a bool tensor \[T, E\]"):
        routes_from_routing_map(probs, rm.float(), 2)


def test_megatron_refuses_what_mok_cannot_run():
    _need_megatron()
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig
    from mok.megatron import MoKMegakernel
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                            num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32,
                            gated_linear_unit=False, activation_func=F.gelu,
                            add_bias_linear=True, bf16=True, params_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="config: mok cannot run this MoE layer: "
                                         r"gated_linear_unit=False .*activation_func=gelu.*"
                                         r"add_bias_linear=True"):
        MoKMegakernel(cfg, None, torch.nn.Module(), None, 8)


def test_hf_deepseek_v3_with_fused_shared_experts():
    """DeepSeek-V3 (transformers' class) with its shared experts fused into
    mok's layers: logits and every gradient (the shared experts' included)
    as grouped_mm's against float64."""
    _need_transformers()
    result = checks.hf_deepseek_v3_check(seed=SEED)
    assert any("shared_experts" in n for n in result)
    result.pop("redraws")
    for name, (mine, native) in result.items():
        assert mine <= 2 * native + 1e-3, f"{name}: mok {mine:.2e}, grouped_mm {native:.2e}"


def test_hf_fused_shared_experts_guard_and_unfuse():
    _need_transformers()
    import mok.hf
    native, mine = checks.deepseek_v3_pair(seed=SEED)
    assert sorted(mine.state_dict()) == sorted(native.state_dict())  # no aliases
    ids = torch.randint(0, 128, (1, 8))
    mine.set_experts_implementation("grouped_mm")
    with pytest.raises(RuntimeError, match="fused into mok's layer by "
                                           "mok.hf.fuse_shared_experts.*unfuse_shared_experts"):
        mine(input_ids=ids)
    assert mok.hf.unfuse_shared_experts(mine) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert torch.equal(mine(input_ids=ids).logits, native(input_ids=ids).logits)


def test_hf_gated_shared_expert_is_not_fused():
    """Qwen2-MoE's shared expert has a sigmoid output gate mok's layer does
    not have: fuse_shared_experts leaves it to the model."""
    _need_transformers()
    import mok.hf
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig
    cfg = Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         moe_intermediate_size=16, shared_expert_intermediate_size=32,
                         num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="mok",
                                             dtype=torch.bfloat16)
    assert mok.hf.fuse_shared_experts(model) == []


def test_megatron_use_mok_keeps_the_layer_and_refuses_by_name():
    """use_mok on Megatron-Core's own MoELayer (built from its local GPT
    layer spec): state-dict keys unchanged, the backend over the layer's
    experts; refusals by name. Its router needs CUDA, so the numbers are
    the GPU test's (test_gpu_trainers.py)."""
    _need_megatron()
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    from mok.megatron import use_mok
    with checks.megatron_one_rank() as pgc:
        def layer(**kw):
            cfg = TransformerConfig(
                num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                moe_ffn_hidden_size=32, num_moe_experts=8, moe_router_topk=2,
                moe_shared_expert_intermediate_size=48, gated_linear_unit=True,
                activation_func=F.silu, add_bias_linear=False, bf16=True,
                params_dtype=torch.bfloat16, moe_token_dispatcher_type="allgather",
                use_cpu_initialization=True, **kw)
            spec = get_gpt_layer_local_spec(num_experts=8, moe_grouped_gemm=False)
            return build_module(spec.submodules.mlp, config=cfg, pg_collection=pgc)
        moe = layer()
        keys = sorted(moe.state_dict())
        backend = use_mok(moe)
        assert sorted(moe.state_dict()) == keys
        assert backend.num_local_experts == 8 and backend.shared_inter == 48
        assert backend.routed_fc1_parameters[0] is moe.experts.local_experts[0].linear_fc1.weight
        with pytest.raises(ValueError, match="intermediate_tensors: a partial CUDA-graph"):
            moe(torch.zeros(2, 1, 64, dtype=torch.bfloat16), intermediate_tensors=(1, 2))
        with pytest.raises(ValueError, match="moe_shared_expert_gate=True"):
            use_mok(layer(moe_shared_expert_gate=True))


def test_mxfp8_quantize_refreshes_in_place():
    """out=: a refresh after an optimizer step writes the new values and
    scales into the tensors of the earlier call (their addresses kept),
    bitwise what a new call returns; out is checked by name."""
    g = torch.Generator().manual_seed(SEED)
    w = torch.randn(2, 64, 96, generator=g).to(torch.bfloat16)
    q = mok.ops.mxfp8_quantize(w, True, True)
    pointers = [t.data_ptr() for t in q]
    w.mul_(3).add_(1)
    again = mok.ops.mxfp8_quantize(w, True, True, out=q)
    assert again == q and [t.data_ptr() for t in q] == pointers
    fresh = mok.ops.mxfp8_quantize(w, True, True)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(q, fresh))
    with pytest.raises(ValueError, match=r"out: scales_T: expected a contiguous uint8 tensor "
                                         r"of shape \[2, 96, 2\], got uint8 of shape "
                                         r"\[2, 64, 3\]"):
        mok.ops.mxfp8_quantize(w, True, True, out=(q[0], q[1], q[2], q[1]))
    with pytest.raises(TypeError, match="out: expected a tuple of 4"):
        mok.ops.mxfp8_quantize(w, True, True, out=q[:2])
