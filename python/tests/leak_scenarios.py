# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""What a process does with mok's layers before it exits, for test_leaks.py
(each scenario in a process of its own: nanobind reports the instances of
mok._runtime's types still alive when the interpreter has finished, on
stderr, "nanobind: leaked N instances!"):

    python3 leak_scenarios.py SCENARIO

"api" creates, checks, binds and drops runtime layers and views, keeps
some (and errors, whose tracebacks hold their frames) in globals until the
exit, and runs the torch-level layers (GpuLayer and GpuTrainingLayer with
torch autograd, over the runtime's checks; mok.torch's CPU module) when
torch is there. "cycle" builds, on purpose, the one cycle the garbage
collector cannot see: a layer bound to a weight view whose array refers
back to the layer's owner (through DLPack's hidden references), so the
test knows that a leak would be reported."""
import gc
import json
import os
import sys
import types

import numpy as np

import mok
from mok import _runtime as rt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from properties import Producer, dense  # noqa: E402

# A kernel that reads its routed weights through one tensor map per expert
# (what takes weight views), hand-written as the compiler emits it.
VIEWS = {"mok_metadata_version": 3, "kernel": "k", "block": 256, "cooperative": True,
         "dynamic_shared_memory": 0, "params": [
             {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
             {"name": "gate_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64],
              "access": "tensor_maps"},
             {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
             {"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},
             {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [32]}],
         "tensor_maps": [{"buffer": "gate_weights", "rows": 8, "cols": 64, "row_stride": 64,
                          "box_rows": 8, "box_cols": 64, "experts": 2}]}

KEPT = []  # what the process holds until it exits


def _runtime_layers():
    text = json.dumps(VIEWS)
    for i in range(20):
        layer = rt.Layer(text)
        args = {"x": dense([4, 64], "bf16"), "gate_weights": dense([2, 8, 64], "bf16")}
        layer.check(args, out=dense([4, 64], "bf16"))
        view = rt.weights_from_tensor(dense([2, 8, 64], "bf16"), "gate_weights")
        layer.bind_weights("gate_weights", view)
        try:
            layer.check(args, out=dense([4, 64], "bf16"))  # bound: refused
        except mok.MokRuntimeError as e:
            if i % 5 == 0:
                KEPT.append(e)  # its traceback holds this frame, and the layer
        try:
            layer.forward({"x": None}, out=None)
        except TypeError as e:
            if i % 7 == 0:
                KEPT.append(e)
        try:
            layer.read_workspace("grid_barrier")
        except mok.MokRuntimeError:
            pass
        if i % 3 == 0:
            KEPT.append(layer)  # alive until the exit
        elif i % 3 == 1:
            layer.unbind_weights("gate_weights")
    gc.collect()


def _torch_layers():
    """GpuLayer and GpuTrainingLayer over the runtime's checks, on CPU
    tensors (test_runtime_ext.py's stand-in for a loaded layer), and through
    torch autograd; mok.torch's CPU module."""
    try:
        import torch
    except ImportError:
        return
    import mok.torch
    from test_runtime_ext import MULTI, _CheckingLayer
    torch.cuda.current_stream = lambda device: types.SimpleNamespace(cuda_stream=0)

    def gpu_layer(meta):
        layer = object.__new__(mok.GpuLayer)
        layer.torch, layer.meta, layer.poison_outputs = torch, meta, False
        layer.device = torch.device("cpu")
        layer._layer = _CheckingLayer(meta)
        layer._export = lambda t: t
        layer.inputs = [p for p in meta["params"] if p["role"] == "input"]
        layer.outputs = [p for p in meta["params"] if p["role"] == "output"]
        layer.output, layer._forwards = layer.outputs[0], 0
        layer._init_tokens()
        return layer

    args = dict(x=torch.zeros(4, 64, dtype=torch.bfloat16),
                top_experts=torch.zeros(4, 2, dtype=torch.int32),
                router_weights=torch.zeros(4, 2))
    for i in range(10):
        layer = gpu_layer(MULTI)
        layer(**args)
        try:
            layer(**dict(args, x=args["x"].float()))
        except TypeError as e:
            KEPT.append(e)
    # A training layer through autograd: its context (and the layer, as
    # ctx.layer) lives in the graph until the graph goes.
    backward_meta = dict(MULTI, params=[p for p in MULTI["params"]
                                        if p["name"] not in ("gate", "d_router_weights")])
    training = object.__new__(mok.GpuTrainingLayer)
    artifact = types.SimpleNamespace(recompute=False, main_grads=False)
    training._init(artifact, gpu_layer(MULTI), gpu_layer(backward_meta))
    x = args["x"].clone().requires_grad_(True)
    out, ctx = training.forward(**dict(args, x=x))
    KEPT.append((out, ctx))
    # mok.torch on the CPU target, a training step.
    spec = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2)
    moe = mok.torch.MoELayer(spec)
    x = torch.randn(3, 16).to(torch.bfloat16).requires_grad_(True)
    y = moe(x, torch.tensor([[0, 1], [2, 3], [1, -1]], dtype=torch.int32), torch.rand(3, 2))
    y.float().sum().backward()
    KEPT.append((moe, y))  # the graph (and its ctx.layer) kept too
    gc.collect()


def api():
    _runtime_layers()
    _torch_layers()
    print(json.dumps({"kept": len(KEPT)}))


def cycle():
    """An uncollectable cycle on purpose: owner -> layer -> view -> (the
    view's array, held by nanobind's DLPack import) -> NumPy array ->
    ctypes buffer -> owner."""
    import ctypes

    class Owner:
        pass

    class Buffer(ctypes.Structure):
        _fields_ = [("data", ctypes.c_uint16 * (2 * 8 * 64))]

    owner = Owner()
    owner.layer = rt.Layer(json.dumps(VIEWS))
    buffer = Buffer()
    buffer.owner = owner
    array = np.frombuffer(buffer, np.uint16).reshape(2, 8, 64)
    producer = Producer(array, [2, 8, 64])
    producer.array = array  # the producer keeps its array, as a tensor would
    owner.layer.bind_weights("gate_weights",
                             rt.weights_from_tensor(producer, "gate_weights"))
    print(json.dumps({"kept": 0}))


if __name__ == "__main__":
    {"api": api, "cycle": cycle}[sys.argv[1]]()
