# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""FP8 layers (LayerSpec.precision, moe.layer's `precision`) on the CPU
target against a float64 reference that quantizes the same operands with
the NumPy model of the formats (fp8_reference.layer_forward), and the
refusals of what is not built yet (training, the GPU targets, ep > 1)."""
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


@pytest.mark.parametrize("precision,H,I,shared,limit", [
    ("mxfp8", 64, 32, None, None), ("mxfp8", 96, 64, 32, 0.75),
    ("fp8", 256, 128, None, None), ("fp8", 128, 256, 128, 1.5)])
def test_fp8_layer_matches_its_float64_definition(precision, H, I, shared, limit):
    spec = mok.LayerSpec(hidden=H, intermediate=I, experts=4, top_k=2,
                         shared_intermediate=shared, swiglu_limit=limit, precision=precision)
    layer = mok.compile(spec, target="cpu")
    rng = np.random.default_rng(SEED)
    a = _inputs(spec, 13, rng)
    out = mok.bf16_to_float32(layer(**a)).astype(np.float64)
    f = {n: mok.bf16_to_float32(v).astype(np.float64) for n, v in a.items()
         if n not in ("top_experts", "router_weights")}
    sh = ((f["shared_gate_weights"], f["shared_up_weights"], f["shared_down_weights"])
          if shared else None)
    args = (f["x"], a["top_experts"], a["router_weights"].astype(np.float64),
            f["gate_weights"], f["up_weights"], f["down_weights"])
    want = ref.layer_forward(*args, sh, limit, precision)
    bf16_want = reference.forward(*args, sh, limit)
    err, err_bf16 = _rel(out, want), _rel(out, bf16_want)
    print(f"{precision} H={H} I={I}: against its definition {err:.2e}, "
          f"against the bf16 layer {err_bf16:.2e}")
    assert err <= REL
    # The quantization is there: the FP8 layer is much further from the
    # bf16 layer than from its own definition.
    assert err_bf16 > 2 * err


def test_fp8_refusals_name_what_is_missing():
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, precision="mxfp8")
    layer = mok.compile(spec, target="cpu")
    a = _inputs(spec, 4, np.random.default_rng(SEED))
    with pytest.raises(NotImplementedError, match=r"FP8 layer \(precision='mxfp8'\) runs "
                                                  "inference only"):
        layer.forward(**a)
    with pytest.raises(ValueError, match="LayerSpec.precision = 'mxfp8'; FP8 layers run on "
                                         "the CPU target for now, not on sm_90a"):
        mok.compile(spec, target="sm_90a")
    with pytest.raises(ValueError, match="LayerSpec.precision: expected 'bf16', 'mxfp8' or "
                                         "'fp8', got 'fp4'"):
        mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, precision="fp4")
    with pytest.raises(ValueError, match="LayerSpec.intermediate: precision 'fp8' needs a "
                                         "multiple of its block size 128, got 32"):
        mok.LayerSpec(hidden=128, intermediate=32, experts=4, top_k=2, precision="fp8")
    with pytest.raises(ValueError, match="expert-parallel FP8 layer"):
        mok.compile(mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, ep=2,
                                  precision="mxfp8"), target="cpu")
