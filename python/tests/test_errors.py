# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Every bad input is an exception naming the argument and what was expected."""
import subprocess
import sys

import numpy as np
import pytest

import mok

SPEC = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, tokens=6,
                     shared_intermediate=8)


@pytest.fixture(scope="module")
def layer():
    return mok.compile(SPEC)


def good_args():
    rng = np.random.default_rng(0)
    bf = lambda *s: mok.to_bf16(rng.standard_normal(s) * 0.2)
    return dict(x=bf(6, 16), top_experts=np.array([[0, 1]] * 6, np.int32),
                router_weights=np.full((6, 2), 0.5, np.float32),
                gate_weights=bf(4, 8, 16), up_weights=bf(4, 8, 16),
                down_weights=bf(4, 16, 8), shared_gate_weights=bf(8, 16),
                shared_up_weights=bf(8, 16), shared_down_weights=bf(16, 8))


def test_good_arguments_run(layer):
    assert layer(**good_args()).shape == (6, 16)


@pytest.mark.parametrize("name,value,exc,message", [
    ("x", np.zeros((6, 16), np.float32), TypeError,
     "x: expected dtype bf16 (bf16 travels as uint16 bit patterns; see mok.to_bf16), got float32"),
    ("x", np.zeros((5, 16), np.uint16), ValueError, "x: expected shape [6, 16], got [5, 16]"),
    ("x", [[0] * 16] * 6, TypeError, "x: expected a numpy.ndarray (bf16 [6, 16]), got list"),
    ("top_experts", np.zeros((6, 2), np.float32), TypeError,
     "top_experts: expected dtype i32, got float32"),
    ("top_experts", np.array([[0, 1]] * 5 + [[1, 4]], np.int32), ValueError,
     "top_experts: expert id 4 at [5, 1] is outside [-1, 4) (-1 means no route)"),
    ("top_experts", np.array([[0, -2]] + [[0, 1]] * 5, np.int32), ValueError,
     "top_experts: expert id -2 at [0, 1] is outside [-1, 4)"),
    ("router_weights", np.zeros((6, 2), np.float64), TypeError,
     "router_weights: expected dtype f32, got float64"),
    ("router_weights", np.zeros((6, 3), np.float32), ValueError,
     "router_weights: expected shape [6, 2], got [6, 3]"),
    ("down_weights", np.zeros((4, 8, 16), np.uint16), ValueError,
     "down_weights: expected shape [4, 16, 8], got [4, 8, 16]"),
    ("shared_down_weights", np.zeros((16, 16), np.uint16)[:, ::2], ValueError,
     "shared_down_weights: expected a C-contiguous array"),
])
def test_bad_argument(layer, name, value, exc, message):
    args = good_args()
    args[name] = value
    with pytest.raises(exc) as info:
        layer(**args)
    assert message in str(info.value)


def test_argument_binding(layer):
    args = good_args()
    with pytest.raises(TypeError, match="missing argument\\(s\\): shared_down_weights"):
        layer(**{k: v for k, v in args.items() if k != "shared_down_weights"})
    with pytest.raises(TypeError, match="unexpected argument 'weights'"):
        layer(weights=1, **args)
    with pytest.raises(TypeError, match="argument 'x' given twice"):
        layer(args["x"], **args)


def test_backward_checks(layer):
    _, ctx = layer.forward(**good_args())
    with pytest.raises(TypeError, match="ctx: expected a mok.Context"):
        layer.backward({"x": 1}, np.zeros((6, 16), np.uint16))
    with pytest.raises(ValueError, match="d_out: expected shape \\[6, 16\\], got \\[6, 8\\]"):
        layer.backward(ctx, np.zeros((6, 8), np.uint16))
    broken = mok.Context(ctx.inputs, {k: v for k, v in ctx.saved.items() if k != "gate"},
                         ctx.tokens)
    with pytest.raises(ValueError, match="the saved tensor 'gate' is missing"):
        layer.backward(broken, np.zeros((6, 16), np.uint16))
    with pytest.raises(ValueError, match="tensors: expected 16 arrays"):
        layer.context_from_tensors(ctx.tensors()[:3])


@pytest.mark.parametrize("kwargs,message", [
    (dict(top_k=5), "LayerSpec.top_k: expected at most experts = 4, got 5"),
    (dict(padding=96), "LayerSpec.padding: expected a power of two, got 96"),
    (dict(swiglu_limit=-1.0),
     "LayerSpec.swiglu_limit: expected None or a positive finite number, got -1.0"),
    (dict(swiglu_limit=float("inf")),
     "LayerSpec.swiglu_limit: expected None or a positive finite number, got inf"),
    (dict(hidden=0), "LayerSpec.hidden: expected a positive int up to 2147483647, got 0"),
    (dict(intermediate=2**31), "LayerSpec.intermediate: expected a positive int up to "
     "2147483647, got 2147483648"),
    (dict(ep=3), "LayerSpec.ep: experts = 4 must be divisible by ep, got 3"),
    (dict(tokens=-1), "LayerSpec.tokens: expected None or an int from 0 to 2147483647, got -1"),
    # The routed rows the compiler indexes: wrapped past 2^31 - 1 before.
    (dict(tokens=2**30), "LayerSpec.tokens: tokens*top_k = 1073741824*2 routes exceed "
     "2147483647"),
    (dict(padding=2**30), "LayerSpec.padding: the routed rows, tokens*top_k + "
     "(experts/ep)*(padding - 1) = 4294967292, exceed 2147483647"),
    (dict(expert_id_dtype="int8"), "LayerSpec.expert_id_dtype: expected 'int32' or 'int64'"),
])
def test_bad_spec(kwargs, message):
    base = dict(hidden=16, intermediate=8, experts=4, top_k=2)
    with pytest.raises(ValueError) as info:
        mok.LayerSpec(**{**base, **kwargs})
    assert message in str(info.value)


def test_unsupported_target_and_ep(tmp_path):
    with pytest.raises(ValueError, match="target: expected 'cpu', 'sm_90a' or 'sm_100a', got 'sm_80'"):
        mok.compile(SPEC, target="sm_80")
    with pytest.raises(ValueError, match="training: the CPU target always compiles forward"):
        mok.compile(SPEC, training=True)
    with pytest.raises(TypeError, match="training: expected True or False"):
        mok.compile(SPEC, target="sm_90a", training=1)
    with pytest.raises(ValueError, match=r"warp_specialize: not implemented with "
                                         r"recompute"):
        mok.compile(mok.LayerSpec(tokens=8, hidden=64, intermediate=128, experts=4, top_k=2,
                                  padding=64), target="sm_90a", training=True,
                    recompute=True, warp_specialize=True, cache_dir=str(tmp_path))
    # A dynamic token count compiles with the default capacity; IR without
    # one is refused by name.
    dynamic = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2)
    assert mok.compile(dynamic, target="sm_90a",
                       cache_dir=str(tmp_path)).metadata["max_tokens"] == 8192
    with pytest.raises(ValueError, match="a dynamic token count needs a capacity, the "
                                         "plan's max_tokens"):
        mok.compile(dynamic.to_mlir(), target="sm_90a", cache_dir=str(tmp_path))
    # Expert parallelism: the CPU target runs the group
    # (test_expert_parallel.py); the GPU targets compile a rank's kernels and
    # refuse a recomputing backward by name.
    spec = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, ep=2)
    assert isinstance(mok.compile(spec), mok.CompiledGroupLayer)
    assert mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path)).metadata["ep"] == 2
    with pytest.raises(ValueError, match=r"a backward that recomputes the forward is not "
                                         r"implemented with expert parallelism \(ep = 2\)"):
        mok.compile(spec, target="sm_90a", training=True, recompute=True,
                    cache_dir=str(tmp_path))


def test_bad_ir_reports_location():
    with pytest.raises(ValueError, match="<ir>:1:"):
        mok.compile("func.func @moe_layer(%x: tensor<4xbf16>) {")
    bad_plan = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2).to_mlir()
    bad_plan = bad_plan.replace("padding = 1", "padding = 3")
    with pytest.raises(ValueError, match="padding must be a power of two, got 3"):
        mok.compile(bad_plan)
    with pytest.raises(TypeError, match="layer: expected a mok.LayerSpec or moe IR text"):
        mok.compile(42)


def test_imports_without_torch():
    code = ("import sys; import mok; assert 'torch' not in sys.modules; "
            "print(mok.LayerSpec(hidden=8, intermediate=8, experts=2, top_k=1))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
