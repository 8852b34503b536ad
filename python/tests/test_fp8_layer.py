# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""FP8 layers (LayerSpec.precision, moe.layer's and moe.layer_grad's
`precision`) on the CPU target, forward and backward, against a float64
reference that quantizes the same operands with the NumPy model of the
formats (fp8_reference.layer_forward / layer_backward), and the refusals
of what is not built yet (the GPU targets, ep > 1, recompute)."""
import dataclasses

import numpy as np
import pytest

import fp8_reference as ref
import mok
import reference
from cpu_results import SEED

REL = 1e-2


def _inputs(spec, T, rng):
    H, I, E, k = spec.hidden, spec.intermediate, spec.experts, spec.top_k
    bf = mok.to_bf16
    x = bf(rng.standard_normal((T, H)))
    top = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    top[1, 0] = -1  # a dropped route
    rw = rng.random((T, k)).astype(np.float32)
    w = dict(gate_weights=bf(rng.standard_normal((E, I, H)) * H ** -0.5),
             up_weights=bf(rng.standard_normal((E, I, H)) * H ** -0.5),
             down_weights=bf(rng.standard_normal((E, H, I)) * I ** -0.5))
    if spec.shared_intermediate:
        s = spec.shared_intermediate
        w.update(shared_gate_weights=bf(rng.standard_normal((s, H)) * H ** -0.5),
                 shared_up_weights=bf(rng.standard_normal((s, H)) * H ** -0.5),
                 shared_down_weights=bf(rng.standard_normal((H, s)) * s ** -0.5))
    return dict(x=x, top_experts=top, router_weights=rw, **w)


def _rel(got, want):
    return float(np.abs(got - want).sum() / np.abs(want).sum())


CASES = [("mxfp8", 64, 32, None, None, 32), ("mxfp8", 96, 64, 32, 0.75, 64),
         ("fp8", 256, 128, None, None, 128), ("fp8", 128, 256, 128, 1.5, 128)]


def _floats(a, spec):
    f = {n: mok.bf16_to_float32(v).astype(np.float64) for n, v in a.items()
         if n not in ("top_experts", "router_weights")}
    sh = ((f["shared_gate_weights"], f["shared_up_weights"], f["shared_down_weights"])
          if spec.shared_intermediate else None)
    args = (f["x"], a["top_experts"], a["router_weights"].astype(np.float64),
            f["gate_weights"], f["up_weights"], f["down_weights"])
    return args, sh


@pytest.mark.parametrize("precision,H,I,shared,limit,padding", CASES)
def test_fp8_layer_matches_its_float64_definition(precision, H, I, shared, limit, padding):
    spec = mok.LayerSpec(hidden=H, intermediate=I, experts=4, top_k=2, padding=padding,
                         shared_intermediate=shared, swiglu_limit=limit, precision=precision)
    layer = mok.compile(spec, target="cpu")
    rng = np.random.default_rng(SEED)
    a = _inputs(spec, 13, rng)
    args, sh = _floats(a, spec)
    out, ctx = layer.forward(**a)
    assert np.array_equal(out, layer(**a))  # the training forward is the inference one
    out = mok.bf16_to_float32(out).astype(np.float64)
    want = ref.layer_forward(*args, sh, limit, precision)
    bf16_want = reference.forward(*args, sh, limit)
    err, err_bf16 = _rel(out, want), _rel(out, bf16_want)
    print(f"{precision} H={H} I={I}: output against its definition {err:.2e}, "
          f"against the bf16 layer {err_bf16:.2e}")
    assert err <= REL
    # The quantization is there: the FP8 layer is much further from the
    # bf16 layer than from its own definition.
    assert err_bf16 > 2 * err

    d_out = mok.to_bf16(rng.standard_normal(out.shape))
    grads = layer.backward(ctx, d_out)
    d = mok.bf16_to_float32(d_out).astype(np.float64)
    want = ref.layer_backward(*args, d, sh, limit, precision, padding)
    bf16_want = reference.backward(*args, d, sh, limit)
    for name, w in want.items():
        got = grads[name]
        got = (got.astype(np.float64) if got.dtype == np.float32
               else mok.bf16_to_float32(got).astype(np.float64))
        err, err_bf16 = _rel(got, w), _rel(got, bf16_want[name])
        print(f"  d_{name}: against its definition {err:.2e}, against bf16 {err_bf16:.2e}")
        assert err <= REL, name
        if not name.startswith("shared"):  # (the shared expert is bf16)
            assert err_bf16 > 2 * err, name


def test_fp8_refusals_name_what_is_missing():
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, padding=32,
                         precision="mxfp8")
    with pytest.raises(ValueError, match="LayerSpec.hidden = 64: MXFP8 layers on sm_90a need "
                                         "a multiple of 128"):
        mok.compile(spec, target="sm_90a", tensor_cores=False)
    mx = dataclasses.replace(spec, hidden=128, intermediate=128, padding=128)
    with pytest.raises(ValueError, match="LayerSpec.precision = 'mxfp8' on sm_90a runs scalar "
                                         "GEMMs only: pass tensor_cores=False"):
        mok.compile(mx, target="sm_90a")
    with pytest.raises(ValueError, match="LayerSpec.padding = 32: MXFP8 on sm_100a's tensor "
                                         "cores needs a multiple of 128"):
        mok.compile(dataclasses.replace(mx, padding=32), target="sm_100a")
    with pytest.raises(ValueError, match="CompileOptions.fp8_quantized_weights: for FP8 layers "
                                         r"\(LayerSpec.precision = 'fp8' or 'mxfp8'\), got "
                                         "precision 'bf16'"):
        mok.compile(dataclasses.replace(mx, precision="bf16"), target="sm_100a",
                    fp8_quantized_weights=True)
    fp8 = mok.LayerSpec(hidden=128, intermediate=128, experts=4, top_k=2, padding=128,
                        precision="fp8")
    with pytest.raises(ValueError, match=r"LayerSpec.precision = 'fp8' on sm_100a runs scalar "
                                         r"GEMMs only: pass tensor_cores=False \(tcgen05 runs "
                                         r"MXFP8's block-scaled MMA"):
        mok.compile(fp8, target="sm_100a")
    # (warp_specialize runs the FP8 forward's GEMMs with a producer; the
    # other GEMM options are refused.)
    with pytest.raises(ValueError, match=r"CompileOptions.multicast: not implemented for "
                                         r"FP8 layers"):
        mok.compile(fp8, target="sm_90a", multicast=True)
    with pytest.raises(Exception, match="recompute is not supported for an FP8 layer"):
        mok.compile(spec, target="cpu", recompute=True)
    with pytest.raises(ValueError, match="LayerSpec.precision: expected 'bf16', 'mxfp8' or "
                                         "'fp8', got 'fp4'"):
        mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, precision="fp4")
    with pytest.raises(ValueError, match="LayerSpec.intermediate: precision 'fp8' needs a "
                                         "multiple of its block size 128, got 32"):
        mok.LayerSpec(hidden=128, intermediate=32, experts=4, top_k=2, padding=128,
                      precision="fp8")
    with pytest.raises(ValueError, match="LayerSpec.padding: precision 'mxfp8' trains with "
                                         "blocks of 32 routed rows"):
        mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, precision="mxfp8")
    with pytest.raises(ValueError, match="expert-parallel FP8 layer"):
        mok.compile(mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, ep=2,
                                  padding=32, precision="mxfp8"), target="cpu")
