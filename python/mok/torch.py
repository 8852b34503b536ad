# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.torch: a compiled MoE layer as a PyTorch autograd function and module.

    import mok, mok.torch
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=8, top_k=2)
    moe = mok.torch.MoELayer(spec)          # gate/up/down weights as parameters
    out = moe(x, top_experts, router_weights)
    out.float().sum().backward()            # grads for x, router_weights, weights

The layer runs on the CPU target (the executable reference, CPU tensors)
or on a GPU target (``target="sm_90a"``: CUDA tensors, the training
forward and backward kernels of docs/Backward.md; for every token count
up to ``spec.max_tokens`` with ``spec.tokens=None``, 8192 by default, or
for the one ``spec.tokens``). bf16 activations and weights, f32
router weights. A call with T = 0 tokens returns an empty output (and
empty or zero gradients) without calling the layer; T above the layer's
capacity (a loaded layer's ``max_tokens``; a GPU layer compiled for one T
takes that T) is a ValueError naming x, T and the capacity.

torch.compile: under it MoELayer runs custom operators,
``torch.ops.mok.moe_forward``, ``moe_backward``, ``moe_backward_into``
(the backward adding into main_grads) and ``moe_infer``, with fake
implementations (the output's and the saved context's shapes as
functions of T) and the autograd formula registered, so a model holding
MoELayer modules compiles with ``fullgraph=True``, forward and backward,
and one graph serves every T once T is dynamic (docs/Python.md). In
eager mode it runs the autograd functions below, which take less than
half the operators' host time a call; both run the same calls of the
layer.

The backward context crosses autograd as plain tensors: forward hands the
inputs and the context's saved tensors to ``ctx.save_for_backward``, so
saved-tensor hooks and activation checkpointing see (and may offload or
drop) every one of them, and backward rebuilds the context from them
(``CompiledLayer.context_from_tensors``). With ``recompute=True`` there are
no saved tensors beyond the inputs: backward recomputes gate/up.

Megatron-Core's gradient accumulation: with ``accumulate_main_grad=True`` on
the module, every weight parameter must carry an fp32 ``main_grad`` of its
shape; backward adds the weight's gradient into it (``main_grad += dW``: the
backward kernel's unrounded fp32 dW, added in place, by default on sm_90a
and with ``fuse_main_grad=True`` on sm_100a; otherwise the layer's bf16 dW
widened to fp32 and added after the kernel), returns a zero
gradient for the weight (as
Megatron-Core's fused accumulation does with ``zero_out_wgrad``, so that
gradient hooks still fire) and sets ``param.grad_added_to_main_grad = True``.

Double backward is not supported (the backward is one compiled function):
``create_graph=True`` through the layer raises.

torch is needed here only: ``import mok`` works without it.
"""
import hashlib
import itertools
import json
import math
import weakref

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from ._comm import Communicator
from ._compile import compile as _compile
from ._gpu import GpuArtifact
from ._gpu_train import Fp8WeightsTrainingLayer, GpuTrainingArtifact, GpuTrainingLayer
from ._layer import CompiledLayer
from ._options import GPU_TARGETS
from ._spec import LayerSpec

__all__ = ["GpuMoEFunction", "MoEFunction", "MoELayer"]

_TORCH_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32,
                 "i64": torch.int64}


def _to_numpy(name, t, expected=None):
    """A CPU tensor as the NumPy array the CPU layer takes (bf16 as uint16
    bit patterns), without a copy when it is contiguous. `expected`: the
    layer's signature entry (a mok TensorInfo), whose dtype it must have
    (the layer checks the shape)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if expected is not None and t.dtype != _TORCH_DTYPES[expected.dtype]:
        dims = ", ".join("T" if d < 0 else str(d) for d in expected.shape)
        raise TypeError(f"{name}: expected a {_TORCH_DTYPES[expected.dtype]} tensor of shape "
                        f"[{dims}], got {t.dtype} of shape {list(t.shape)}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: the CPU target takes CPU tensors; got a tensor on "
                         f"{t.device} (compile the layer for a GPU target for CUDA tensors)")
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float32, torch.int32, torch.int64):
        return t.numpy()
    raise TypeError(f"{name}: expected a bfloat16, float32, int32 or int64 tensor, "
                    f"got {t.dtype}")


def _arrays(layer, fn, values):
    """The layer's arguments (x, top_experts, router_weights, weights) as
    its function `fn` takes them, by name, dtypes checked against `fn`."""
    names = list(layer.arg_names)
    if len(values) != len(names):
        raise TypeError(f"expected {len(names)} tensors ({', '.join(names)}), "
                        f"got {len(values)}")
    return {n: _to_numpy(n, v, info) for n, v, info in zip(names, values, fn.args)}


def _from_numpy(a):
    """The CPU layer's array as a tensor (uint16 bit patterns as bfloat16)."""
    if a.dtype == np.uint16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


# Loaded GPU layers by (kernels, device): what MoELayer modules of one spec
# share (share_layer=True). Weak values: a layer goes when its last module does.
_LOADED = weakref.WeakValueDictionary()


def _kernels_key(artifact):
    """A digest of `artifact`'s kernels (a GpuArtifact or a
    GpuTrainingArtifact): their PTX and metadata."""
    h = hashlib.sha256()
    parts = ([artifact.forward, artifact.backward]
             if isinstance(artifact, GpuTrainingArtifact) else [artifact])
    for a in parts:
        h.update(a.ptx.encode())
        h.update(json.dumps(a.metadata, sort_keys=True).encode())
    return h.hexdigest()


def _cuda_index(device):
    """The CUDA device index `device` (None: torch's current one) names."""
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device!r}")
    return torch.cuda.current_device() if d.index is None else d.index


def _shared(key, load):
    """The loaded layer cached under `key`, or load() cached there."""
    layer = _LOADED.get(key)
    if layer is None:
        layer = load()
        _LOADED[key] = layer
    return layer


def _load(artifact, device, share, comm=None):
    """artifact.load(device); with `share`, the layer already loaded from the
    same kernels on the same device if a module still holds one; bound to
    `comm` (a mok.Communicator; never shared: each layer has its own
    exchange buffers) when given."""
    if comm is not None:
        return artifact.load(device, comm=comm)
    if not share:
        return artifact.load(device)
    index = _cuda_index(device)
    return _shared((_kernels_key(artifact), index), lambda: artifact.load(index))


def _check_inference_artifact(inference, training):
    """`inference` (MoELayer's inference_artifact) must be a GpuArtifact
    whose inputs and output are `training`'s forward's."""
    if not isinstance(inference, GpuArtifact):
        raise TypeError(f"inference_artifact: expected a mok.GpuArtifact (mok.compile(spec, "
                        f"target=...) without training), got {type(inference).__name__}")

    def interface(meta, what):
        try:
            params = meta.get("params", [])
            inputs = [(p["name"], p["dtype"], list(p["shape"]))
                      for p in params if p["role"] == "input"]
            outputs = [(p["name"], p["dtype"], list(p["shape"]))
                       for p in params if p["role"] == "output"]
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{what}: its metadata's params are malformed ({error!r}); "
                             "expected {name, role, dtype, shape} each") from None
        return inputs, outputs[:1]

    chip, trained = inference.metadata.get("chip"), training.forward.metadata.get("chip")
    if chip != trained:
        raise ValueError(f"inference_artifact: compiled for {chip}, the training layer for "
                         f"{trained}")
    mine = interface(inference.metadata, "inference_artifact")
    theirs = interface(training.forward.metadata, "artifact")
    if mine != theirs:
        raise ValueError(f"inference_artifact: its inputs and output {mine} are not the "
                         f"training layer's {theirs} (another spec?)")


def _gradients(ctx, names, tensors, grads, main_grads):
    """The autograd functions' backward result: None for the layer,
    main_grads and top_experts; for a weight in `main_grads` (its gradient
    added there already) a zero placeholder; else the gradient (torch
    tensors by name in `grads`) where an input needs one."""
    result = [None, None]  # layer, main_grads
    for i, name in enumerate(names):
        needed = ctx.needs_input_grad[2 + i]
        if name == "top_experts":
            result.append(None)
        elif name in main_grads:
            result.append(torch.zeros_like(tensors[i]) if needed else None)
        else:
            result.append(grads[name] if needed else None)
    return tuple(result)


# -- the layers' calls on torch tensors (the custom ops and the autograd
# functions below both run these) ------------------------------------------

def _capacity(layer):
    """The most tokens `layer` takes in one call: its `max_tokens`; for a
    GPU layer without one (compiled for one T) that T; None where any T
    goes (the CPU target) or where the layer does not say."""
    capacity = getattr(layer, "max_tokens", None)
    if capacity is not None:
        return capacity
    if isinstance(layer, CompiledLayer):  # a capacity its function may carry
        return getattr(layer._forward, "max_tokens", 0) or None
    kernel = getattr(layer, "_forward", layer)  # a GpuTrainingLayer's forward kernel
    output = getattr(kernel, "output", None)
    return output["shape"][0] if isinstance(output, dict) else None


def _tokens(layer, x):
    """x's token count T, refused above the layer's capacity; None when x
    is not a 2-D tensor (the layer's own checks then name what is wrong)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return None
    tokens, capacity = x.shape[0], _capacity(layer)
    if capacity is not None and tokens > capacity:
        raise ValueError(f"x: {tokens} tokens (x of shape {list(x.shape)}) exceed the layer's "
                         f"capacity of {capacity} tokens (max_tokens); compile it for more "
                         "tokens, or split the batch")
    return tokens


def _kernel_inputs(layer):
    """The metadata params of a GPU layer's inputs (a GpuTrainingLayer's
    forward kernel's; the bf16 weights' of an Fp8WeightsTrainingLayer), or
    None for a layer that has none."""
    if isinstance(layer, Fp8WeightsTrainingLayer):
        return layer.input_params
    inputs = getattr(getattr(layer, "_forward", layer), "inputs", None)
    return inputs if isinstance(inputs, list) else None


def _ep_of(layer):
    """The expert-parallel size a GPU layer's kernels were compiled for."""
    for kernel in (layer, getattr(layer, "_forward", None)):
        meta = getattr(kernel, "meta", None)
        if isinstance(meta, dict):
            return meta.get("ep", 1)
    return 1


def _check_empty(layer, fn, names, values):
    """The checks a call with T = 0 gets instead of the layer's (it is not
    called): the count, dtypes and devices of the tensors, and every size
    but T. `fn`: the CPU layer's function of the call. An expert-parallel
    rank cannot skip its call (the other ranks' kernels wait for it)."""
    ep = _ep_of(layer)
    if ep > 1:
        raise ValueError(f"x: 0 tokens, but this layer is one rank of an expert-parallel "
                         f"group (ep = {ep}), whose kernels wait for each other: pass one "
                         "token row whose routes are all -1 instead")
    if len(values) != len(names):
        raise TypeError(f"expected {len(names)} tensors ({', '.join(names)}), "
                        f"got {len(values)}")
    if isinstance(layer, CompiledLayer):
        layer._check_inputs(fn, list(_arrays(layer, fn, values).values()))
        return
    params = _kernel_inputs(layer)
    if params is None:
        return
    device = getattr(layer, "device", None)
    for i, (name, t, p) in enumerate(zip(names, values, params)):
        shape = [0 if i < 3 and j == 0 else d for j, d in enumerate(p["shape"])]
        dtype = _TORCH_DTYPES[p["dtype"]]
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or list(t.shape) != shape \
                or (device is not None and t.device != device):
            got = (f"{t.dtype} of shape {list(t.shape)} on {t.device}"
                   if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ValueError(f"{name}: expected a {dtype} tensor of shape {shape} on "
                             f"{device}, got {got}")


def _saved_specs(layer, tokens):
    """[(shape, dtype)] of the context tensors the training forward of
    `layer` saves for `tokens` tokens (a SymInt while torch.compile traces),
    in the layer's order: what the forward op returns after `out`. A GPU
    kernel's params say it: rows that follow T have `call_rows` = [scale,
    offset] (a layer for any T), the others their shape."""
    if isinstance(layer, CompiledLayer):
        fn = layer._forward
        return [(layer._shape(fn, r, tokens), _TORCH_DTYPES[r.dtype])
                for r in fn.results if r.role.startswith("saved:")]
    specs = []
    for p in layer._forward.outputs[1:]:
        rows = p.get("call_rows")
        shape = [rows[0] * tokens + rows[1], *p["shape"][1:]] if rows else list(p["shape"])
        specs.append((shape, _TORCH_DTYPES[p["dtype"]]))
    return specs


def _run_forward(layer, names, values):
    """[out, *saved]: the training forward of `layer` (a CompiledLayer or a
    GpuTrainingLayer) on torch tensors `values` (x, top_experts,
    router_weights, *weights, in `names`' order): its output and its
    context's saved tensors. T = 0 calls no layer (empty output, saved
    tensors of their shapes at T = 0, unwritten)."""
    tokens = _tokens(layer, values[0])
    if tokens == 0:
        _check_empty(layer, getattr(layer, "_forward", None), names, values)
        x = values[0]
        return [x.new_empty(x.shape, dtype=torch.bfloat16)] + [
            x.new_empty(shape, dtype=dtype) for shape, dtype in _saved_specs(layer, 0)]
    if isinstance(layer, CompiledLayer):
        out, context = layer.forward(**_arrays(layer, layer._forward, values))
        return [_from_numpy(out)] + [_from_numpy(a) for a in context.saved.values()]
    if len(values) != len(names):
        raise TypeError(f"expected {len(names)} tensors ({', '.join(names)}), "
                        f"got {len(values)}")
    detached = [v.detach() if isinstance(v, torch.Tensor) else v for v in values]
    out, context = layer.forward(**dict(zip(names, detached)))
    return [out, *context.saved.values()]


def _run_backward(layer, names, d_out, tensors, main_grads):
    """The layer's gradients by argument name, from `tensors` (what
    _run_forward's caller saved: the inputs, then the saved context) and
    the output's gradient `d_out`; the gradient of each weight in
    `main_grads` ({name: fp32 tensor}) is added there (main_grad += dW: by
    the backward kernel of a GPU layer compiled with main_grads=True, else
    the bf16 dW after it) and not returned. T = 0 calls no layer: empty
    gradients for x and router_weights, zero ones for the weights."""
    tensors = list(tensors)
    x = tensors[0]
    if _tokens(layer, x) == 0:
        grads = {"x": x.new_empty(x.shape), "router_weights": tensors[2].new_empty(
            tensors[2].shape)}
        grads.update((n, torch.zeros_like(w)) for n, w in zip(names[3:], tensors[3:len(names)])
                     if n not in main_grads)
        return grads
    if isinstance(layer, CompiledLayer):
        context = layer.context_from_tensors(
            [_to_numpy(f"saved tensor {i}", t) for i, t in enumerate(tensors)])
        grads = {n: _from_numpy(g)
                 for n, g in layer.backward(context, _to_numpy("d_out", d_out)).items()}
        fused = False
    else:
        context = layer.context_from_tensors([t.detach() for t in tensors])
        fused = layer.main_grads  # the kernel adds into them
        grads = layer.backward(context, d_out.contiguous(),
                               main_grads=dict(main_grads) if fused else None)
    if not fused:
        for name, grad in main_grads.items():
            grad.add_(grads[name])  # fp32 += bf16, no fp32 copy
    return {n: g for n, g in grads.items() if n not in main_grads}


def _run_inference(layer, names, values):
    """The output of `layer`'s inference function (a CompiledLayer's, a
    GPU layer's, or any callable taking the tensors by name) on torch
    tensors `values`. T = 0 calls no layer."""
    tokens = _tokens(layer, values[0])
    if tokens == 0:
        _check_empty(layer, getattr(layer, "_infer", None), names, values)
        return values[0].new_empty(values[0].shape, dtype=torch.bfloat16)
    if isinstance(layer, CompiledLayer):
        return _from_numpy(layer(**_arrays(layer, layer._infer, values)))
    return layer(**dict(zip(names, values)))


# -- custom operators: what torch.compile traces -----------------------------
#
# A layer is no tensor, so the operators take it as an `int` (not SymInt)
# argument: the id under which MoELayer registered it here. torch.compile
# bakes it into the graph as a constant (guarded like the module's other
# int attributes), so the fake implementations can look the layer up while
# tracing, for the shapes of its saved context. Ids are never reused: a
# graph compiled for a module that is gone raises by name, and never runs
# another layer. torch 2.11's opaque objects (torch._library.opaque_object)
# are the alternative, but a private API: the layer classes would have to
# derive from torch's OpaqueBase, and a reference-type object is a graph
# input that the fake implementations cannot read. The registry holds the
# layers weakly: a layer goes with its last module.

_LAYERS = {}  # id -> (weak reference to the layer, its argument names)
_NEXT_ID = itertools.count(1)


def _register(layer, names):
    """A new id for `layer` (anything _run_forward, _run_backward or
    _run_inference takes), whose arguments are `names`."""
    lid = next(_NEXT_ID)
    _LAYERS[lid] = (weakref.ref(layer), tuple(names))
    weakref.finalize(layer, _LAYERS.pop, lid, None)
    return lid


def _registered(lid):
    """(layer, argument names) registered as `lid`."""
    if isinstance(lid, torch.SymInt):
        raise TypeError("layer: the layer id must be a constant int while torch.compile "
                        "traces (it was made symbolic; mark it static)")
    entry = _LAYERS.get(lid)
    layer = entry[0]() if entry is not None else None
    if layer is None:
        raise ValueError(f"layer: no mok layer is registered as {lid!r} (the module that "
                         "registered it is gone)")
    return layer, list(entry[1])


@torch.library.custom_op(
    "mok::moe_forward", mutates_args=(),
    schema="(int layer, Tensor x, Tensor top_experts, Tensor router_weights, Tensor[] weights, "
           "Tensor[] main_grads) -> Tensor[]")
def _moe_forward(layer, x, top_experts, router_weights, weights, main_grads):
    """The training forward of registered layer `layer`: [out, *saved
    context]. `main_grads` (empty, or one fp32 tensor per weight) is not
    read here: autograd hands it to the backward, which adds into it."""
    obj, names = _registered(layer)
    return _run_forward(obj, names, [x, top_experts, router_weights, *weights])


@_moe_forward.register_fake
def _moe_forward_fake(layer, x, top_experts, router_weights, weights, main_grads):
    obj, _ = _registered(layer)
    return [x.new_empty(x.shape, dtype=torch.bfloat16)] + [
        x.new_empty(shape, dtype=dtype) for shape, dtype in _saved_specs(obj, x.shape[0])]


@torch.library.custom_op(
    "mok::moe_backward", mutates_args=(),
    schema="(int layer, Tensor d_out, Tensor[] tensors) -> Tensor[]")
def _moe_backward(layer, d_out, tensors):
    """The backward of registered layer `layer` from `tensors` (the
    forward's inputs, then its saved context): [d_x, d_router_weights,
    *d_weights]."""
    obj, names = _registered(layer)
    grads = _run_backward(obj, names, d_out, tensors, {})
    return [grads[n] for n in names if n != "top_experts"]


@_moe_backward.register_fake
def _moe_backward_fake(layer, d_out, tensors):
    _, names = _registered(layer)
    return [t.new_empty(t.shape) for n, t in zip(names, tensors) if n != "top_experts"]


@torch.library.custom_op(
    "mok::moe_backward_into", mutates_args=("main_grads",),
    schema="(int layer, Tensor d_out, Tensor[] tensors, Tensor(a!)[] main_grads) "
           "-> (Tensor, Tensor)")
def _moe_backward_into(layer, d_out, tensors, main_grads):
    """mok::moe_backward adding each weight's gradient into its fp32
    main_grad (one for each weight, in order: main_grad += dW, by the
    backward kernel of a GPU layer compiled with main_grads=True, else the
    bf16 dW added after it): (d_x, d_router_weights)."""
    obj, names = _registered(layer)
    weights = names[3:]
    if len(main_grads) != len(weights):
        raise ValueError(f"main_grads: expected one for each of {', '.join(weights)}, "
                         f"got {len(main_grads)}")
    grads = _run_backward(obj, names, d_out, tensors, dict(zip(weights, main_grads)))
    return grads["x"], grads["router_weights"]


@_moe_backward_into.register_fake
def _moe_backward_into_fake(layer, d_out, tensors, main_grads):
    _registered(layer)
    return tensors[0].new_empty(tensors[0].shape), tensors[2].new_empty(tensors[2].shape)


@torch.library.custom_op(
    "mok::moe_infer", mutates_args=(),
    schema="(int layer, Tensor x, Tensor top_experts, Tensor router_weights, Tensor[] weights) "
           "-> Tensor")
def _moe_infer(layer, x, top_experts, router_weights, weights):
    """The inference function of registered layer `layer`: the output."""
    obj, names = _registered(layer)
    return _run_inference(obj, names, [x, top_experts, router_weights, *weights])


@_moe_infer.register_fake
def _moe_infer_fake(layer, x, top_experts, router_weights, weights):
    _registered(layer)
    return x.new_empty(x.shape, dtype=torch.bfloat16)


def _forward_context(ctx, inputs, output):
    _, x, top_experts, router_weights, weights, main_grads = inputs
    ctx.layer = inputs[0]
    ctx.main_grads = main_grads  # added into by backward: not saved (no hook copies them)
    # The inputs as given (no copies) and the context's tensors: all of them
    # through save_for_backward, where hooks and checkpointing see them.
    ctx.save_for_backward(x, top_experts, router_weights, *weights, *output[1:])
    ctx.inputs = 3 + len(weights)


def _forward_backward(ctx, grads):
    d_out = grads[0]  # (the saved context's outputs get no gradient)
    # needs_input_grad: (layer, x, top_experts, router_weights, [weights], [main_grads])
    needs = ctx.needs_input_grad
    tensors = ctx.saved_tensors
    weights = tensors[3:ctx.inputs]
    main_grads = ctx.main_grads
    if d_out is None:
        return None, None, None, None, [None] * len(weights), [None] * len(main_grads)
    with torch.no_grad():
        if main_grads:
            result = _moe_backward_into(ctx.layer, d_out, list(tensors), main_grads)
        else:
            result = _moe_backward(ctx.layer, d_out, list(tensors))
        if main_grads:  # added there; a zero placeholder for gradient hooks
            d_weights = [torch.zeros_like(w) if need else None
                         for w, need in zip(weights, needs[4])]
        else:
            d_weights = [g if need else None for g, need in zip(result[2:], needs[4])]
    d_x = result[0] if needs[1] else None
    d_router_weights = result[1] if needs[3] else None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (d_out, *tensors)):
        # create_graph=True: gradients whose own backward raises.
        d_x, d_router_weights, *d_weights = _differentiated_once(
            [d_x, d_router_weights, *d_weights])
    return None, d_x, None, d_router_weights, d_weights, [None] * len(main_grads)


def _differentiated_once(grads):
    """`grads` (tensors or None) as tensors that require grad through a node
    that raises when backward reaches it: the layer's backward is one
    compiled function, with no backward of its own."""
    err = torch._C._functions.DelayedError(
        b"mok: a mok layer is differentiated once only; double backward "
        b"(create_graph=True through the layer) is not supported", len(grads))

    def requiring(g):
        if g is not None:
            g = g.detach()
            g.requires_grad = True
        return g

    out = err(*[requiring(g) for g in grads])
    return list(out) if isinstance(out, tuple) else [out]


_moe_forward.register_autograd(_forward_backward, setup_context=_forward_context)


class MoEFunction(torch.autograd.Function):
    """``MoEFunction.apply(layer, main_grads, x, top_experts, router_weights,
    *weights)`` with `layer` a ``mok.CompiledLayer`` (CPU target) and the
    weights in its argument order (gate, up, down, then the shared expert's).
    `main_grads`: {weight name: fp32 tensor} to accumulate weight gradients
    into instead of returning them (may be empty). Gradients: `x`,
    `router_weights` and every weight not in `main_grads`. (MoELayer runs
    the same calls through the custom ops instead, which torch.compile
    traces.)"""

    @staticmethod
    def forward(ctx, layer, main_grads, x, top_experts, router_weights, *weights):
        if not isinstance(layer, CompiledLayer):
            raise TypeError(f"layer: expected a mok.CompiledLayer (the CPU target), got "
                            f"{type(layer).__name__}")
        return _function_forward(ctx, layer, main_grads,
                                 [x, top_experts, router_weights, *weights])

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        return _function_backward(ctx, d_out)


def _function_forward(ctx, layer, main_grads, values):
    """MoEFunction's and GpuMoEFunction's forward once `layer` is checked:
    the arguments checked against its argument names, the forward run, the
    inputs as given (no copies) and the context's tensors saved, all of
    them through save_for_backward, where checkpointing sees them."""
    names = list(layer.arg_names)
    if len(values) != len(names):
        raise TypeError(f"expected {len(names)} tensors ({', '.join(names)}), "
                        f"got {len(values)}")
    _check_main_grads(main_grads, names, values)
    _check_fused_main_grads(layer, main_grads, names)
    out, *saved = _run_forward(layer, names, values)
    ctx.save_for_backward(*values, *saved)
    ctx.layer = layer
    ctx.main_grads = main_grads
    return out


def _function_backward(ctx, d_out):
    """The backward of _function_forward's call."""
    names = list(ctx.layer.arg_names)
    tensors = ctx.saved_tensors
    grads = _run_backward(ctx.layer, names, d_out, tensors, ctx.main_grads)
    return _gradients(ctx, names, tensors, grads, ctx.main_grads)


def _check_main_grads(main_grads, names, values):
    for name, grad in main_grads.items():
        if name not in names[3:]:
            raise ValueError(f"main_grads: '{name}' is not a weight of the layer "
                             f"({', '.join(names[3:])})")
        weight = values[names.index(name)]
        if not isinstance(grad, torch.Tensor) or grad.dtype != torch.float32 \
                or tuple(grad.shape) != tuple(weight.shape) \
                or grad.device != weight.device:
            got = (f"{grad.dtype} of shape {list(grad.shape)} on {grad.device}"
                   if isinstance(grad, torch.Tensor) else type(grad).__name__)
            raise ValueError(f"main_grads['{name}']: expected a float32 tensor of shape "
                             f"{list(weight.shape)} on {weight.device}, got {got}")


def _check_tensors(named):
    """TypeError naming the first of (name, value) pairs that is no tensor."""
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")


def _check_fused_main_grads(layer, main_grads, names):
    """A GPU layer compiled with main_grads=True adds every weight's
    gradient: each must have its main_grad."""
    if getattr(layer, "main_grads", False):
        missing = [n for n in names[3:] if n not in main_grads]
        if missing:
            raise ValueError(f"main_grads: the layer adds every weight's gradient "
                             f"into its main_grad (compiled with main_grads=True); "
                             f"missing {', '.join(missing)}")


class GpuMoEFunction(torch.autograd.Function):
    """``GpuMoEFunction.apply(layer, main_grads, x, top_experts,
    router_weights, *weights)`` as MoEFunction, with `layer` a
    ``mok.GpuTrainingLayer`` and CUDA tensors on its device: the training
    forward kernel, its context through ``save_for_backward``, the backward
    kernel. `main_grads`: {weight name: fp32 tensor} (``main_grad += dW``
    on the GPU, the weight's gradient then a zero tensor): every weight's,
    added by the backward kernel itself, for a layer compiled with
    ``main_grads=True``; else any of them, added after the kernel."""

    @staticmethod
    def forward(ctx, layer, main_grads, x, top_experts, router_weights, *weights):
        if not isinstance(layer, GpuTrainingLayer):
            raise TypeError(f"layer: expected a mok.GpuTrainingLayer (a GPU target), got "
                            f"{type(layer).__name__}")
        return _function_forward(ctx, layer, main_grads,
                                 [x, top_experts, router_weights, *weights])

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        return _function_backward(ctx, d_out)


class MoELayer(torch.nn.Module):
    """A MoE layer with its weights as parameters (bf16): `gate_weights`,
    `up_weights` [E, I, H], `down_weights` [E, H, I] and, with a shared
    expert, `shared_gate_weights`, `shared_up_weights` [Is, H],
    `shared_down_weights` [H, Is]. ``forward(x, top_experts,
    router_weights)``: x bf16 [T, H], top_experts [T, k] (spec's
    expert_id_dtype; -1 = no route), router_weights f32 [T, k]; returns bf16
    [T, H]. `spec.tokens` None (the default) compiles for any T.
    `recompute`: save only the inputs; backward recomputes gate/up.
    `accumulate_main_grad`: see the module docstring. Under
    ``torch.no_grad()`` the layer's inference function runs (no context).

    `target`: "cpu" (the default) or a GPU target ("sm_90a", "sm_100a"):
    the layer then runs on CUDA `device` (None: torch's current one), with
    its parameters there, for any T up to `spec.max_tokens` (tokens=None)
    or for `spec.tokens` tokens (and T = 0, which calls no kernel). torch.compile traces the module without graph breaks (the
    module docstring). `artifact`: a
    ``mok.GpuTrainingArtifact`` compiled beforehand for `spec` (e.g. on a
    machine with the compiler) instead of compiling here. Compiling here,
    an ``"fp8"`` spec on sm_90a gets its fastest form: the training layer
    with ``fp8_quantized_weights=True`` (the module quantizes its routed
    weights, both layouts, and refreshes them after each optimizer step)
    and ``warp_specialize=True``; its no_grad forwards run the training
    forward.

    `share_layer` (GPU targets): modules whose kernels are the same (one
    spec, one compile) on one device share one loaded layer, so its
    workspace (the backward's alone is about 1.2 GB on Qwen3-30B-A3B
    shapes) and its driver JIT compile are paid once, not per module. Their
    forwards and backwards must then run in one stream's order (as a
    model's layers do): calls of sharing modules on unordered streams would
    race on the workspace. ``share_layer=False`` loads a layer of its own.

    `fuse_main_grad` (GPU targets, with `accumulate_main_grad`): whether
    the backward kernel adds its unrounded fp32 dW into the main_grads in
    place (the layer compiled with main_grads=True), or returns bf16 dW
    that is added after it. By default (None) the kernel adds on sm_90a:
    no bf16 dW tensors and a faster step (on the H200, bench/main_grad.py:
    5.49 against 6.46 ms a qwen3-30b step, 20.34 against 22.86 ms on
    dsv3-shard; a step's peak memory 744 against 1896 MB on qwen3-30b
    shapes; docs/performance.md). On sm_100a, whose
    kernels have never run (no such GPU here), or with an `artifact`
    compiled without main_grads, dW is added after the kernel unless True
    asks for the kernel; False keeps the add after it. An `artifact`
    compiled with main_grads=True always adds in the kernel.

    `inference_artifact` (with `artifact`): the layer's inference kernel,
    ``mok.compile(spec, target=...)`` without training, for forwards under
    ``torch.no_grad()``; its chip, inputs and output must be the training
    forward's. Without it such forwards run the training forward (which
    also writes the context) and drop the context. A module that compiles
    its own kernels (no `artifact`) compiles the inference kernel too, but
    with `recompute`, whose training forward saves nothing and is already
    the inference computation.

    `process_group` (GPU targets): for `spec.ep` = N > 1, the NCCL
    process group of the N ranks (or a mok.Communicator of them), one GPU
    each: the module is this rank's part of the expert-parallel layer
    (docs/ExpertParallel.md). Its routed parameters are the rank's E/N local
    experts ([E/N, I, H], [E/N, H, I]: rank r holds experts [r*E/N,
    (r+1)*E/N)), its shared expert's are the rank's copy; forward takes the
    rank's tokens and returns their output; backward gives their d_x and
    router weights' gradients and the local experts' weight gradients over
    every rank's tokens (into main_grad with `accumulate_main_grad`). Every
    rank calls every step (a T = 0 call is refused: pass one row whose
    routes are all -1); the layer's kernels are its own (no
    `share_layer`)."""

    def __init__(self, spec, recompute=False, cache_dir=None, accumulate_main_grad=False,
                 target="cpu", device=None, artifact=None, share_layer=True,
                 fuse_main_grad=None, inference_artifact=None, process_group=None):
        super().__init__()
        if not isinstance(spec, LayerSpec):
            raise TypeError(f"spec: expected a mok.LayerSpec, got {type(spec).__name__}")
        if target != "cpu" and target not in GPU_TARGETS:
            raise ValueError(f"target: expected 'cpu', 'sm_90a' or 'sm_100a', got {target!r}")
        comm = None
        if process_group is not None:
            if target == "cpu":
                raise ValueError("process_group: expert parallelism across processes runs on "
                                 "the GPU targets; on target 'cpu', mok.compile(spec) runs "
                                 "the whole group in one process (a CompiledGroupLayer)")
            comm = (process_group if isinstance(process_group, Communicator)
                    else Communicator.adopt(process_group, device))
            if comm.size != spec.ep:
                raise ValueError(f"process_group: {comm.size} rank(s), but spec.ep = {spec.ep}: "
                                 "the group's size must be the layer's expert-parallel size")
        elif spec.ep != 1:
            raise ValueError(f"spec.ep: {spec.ep} > 1 needs the process_group of its "
                             f"{spec.ep} ranks (one GPU each; NCCL), or a mok.Communicator")
        if fuse_main_grad and not accumulate_main_grad:
            raise ValueError("fuse_main_grad: needs accumulate_main_grad=True")
        if fuse_main_grad and target == "cpu":
            raise ValueError("fuse_main_grad: the kernel adds into main_grad on GPU "
                             "targets only, not on target 'cpu'")
        if fuse_main_grad is False and getattr(artifact, "main_grads", False):
            raise ValueError("fuse_main_grad: False asks for bf16 dW added after the kernel, "
                             "but artifact was compiled with main_grads=True (its kernel "
                             "adds); pass one compiled without main_grads")
        if fuse_main_grad is None:  # in the kernel where it can be
            fuse_main_grad = (accumulate_main_grad and target == "sm_90a"
                              and (artifact is None
                                   or bool(getattr(artifact, "main_grads", False))))
        if inference_artifact is not None and (target == "cpu" or artifact is None):
            raise ValueError("inference_artifact: goes with a GPU target's artifact= (a "
                             "module that compiles its kernels compiles the inference "
                             "kernel itself)")
        self.spec = spec
        self.target = target
        infer = None
        if target == "cpu":
            if artifact is not None:
                raise ValueError("artifact: only GPU targets take a compiled artifact")
            self.layer = _compile(spec, target="cpu", recompute=recompute,
                                  cache_dir=cache_dir)
        else:
            if artifact is None:
                # "fp8" on sm_90a: its fastest form, the routed weights
                # quantized by the module (both layouts, refreshed after
                # each optimizer step by mok's compiled quantizer) and the
                # E4M3 GEMMs with a producer warpgroup; its no_grad
                # forwards run the training forward.
                fast_fp8 = spec.precision == "fp8" and target == "sm_90a" and not recompute
                extra = (dict(fp8_quantized_weights=True, warp_specialize=True) if fast_fp8
                         else {})
                artifact = _compile(spec, target=target, training=True, recompute=recompute,
                                    cache_dir=cache_dir, main_grads=bool(fuse_main_grad),
                                    **extra)
                if not recompute and not fast_fp8:  # the inference kernel for no_grad
                    infer = _load(_compile(spec, target=target, cache_dir=cache_dir),
                                  device, share_layer, comm)
            elif not isinstance(artifact, GpuTrainingArtifact):
                raise TypeError(f"artifact: expected a mok.GpuTrainingArtifact, got "
                                f"{type(artifact).__name__}")
            elif artifact.forward.metadata.get("chip", target) != target:
                raise ValueError(f"artifact: compiled for "
                                 f"{artifact.forward.metadata.get('chip')}, the module's "
                                 f"target is {target!r}")
            elif artifact.recompute != bool(recompute):
                raise ValueError(f"artifact: compiled with recompute={artifact.recompute}, "
                                 f"the module asks for recompute={bool(recompute)}")
            elif artifact.main_grads and not accumulate_main_grad:
                raise ValueError("artifact: compiled with main_grads=True (the backward "
                                 "adds into main_grad); the module needs "
                                 "accumulate_main_grad=True")
            elif fuse_main_grad and not artifact.main_grads:
                raise ValueError("artifact: compiled without main_grads; fuse_main_grad=True "
                                 "needs one compiled with main_grads=True")
            given = any(p.get("name") == "gate_q" and p.get("role") == "input"
                        for p in artifact.forward.metadata.get("params", ()))
            if given and inference_artifact is not None:
                raise ValueError("inference_artifact: not with an artifact compiled with "
                                 "fp8_quantized_weights=True (its no_grad forwards run the "
                                 "training forward)")
            if inference_artifact is not None:
                _check_inference_artifact(inference_artifact, artifact)
            self.layer = _load(artifact, device, share_layer, comm)
            if given:
                # (The bf16 parameters quantized by the layer's wrapper,
                # its copies refreshed after each optimizer step.)
                self.layer = Fp8WeightsTrainingLayer(self.layer)
            if inference_artifact is not None:
                infer = _load(inference_artifact, device, share_layer, comm)
        self._layer_id = _register(self.layer, self.layer.arg_names)
        self._infer = infer
        self.accumulate_main_grad = accumulate_main_grad
        e, i, h = spec.local_experts, spec.intermediate, spec.hidden
        shapes = {"gate_weights": (e, i, h), "up_weights": (e, i, h), "down_weights": (e, h, i)}
        if spec.shared_intermediate:
            s = spec.shared_intermediate
            shapes.update(shared_gate_weights=(s, h), shared_up_weights=(s, h),
                          shared_down_weights=(h, s))
        self._weight_names = [n for n in self.layer.arg_names if n in shapes]
        on = "cpu" if target == "cpu" else self.layer.device
        for name in self._weight_names:
            shape = shapes[name]
            param = torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16, device=on))
            self.register_parameter(name, param)
        self.reset_parameters()

    @property
    def _infer(self):
        """The inference kernel that forwards under no_grad run (a GPU
        target's), None for the layer's own."""
        return self._infer_layer

    @_infer.setter
    def _infer(self, layer):
        self._infer_layer = layer
        self._infer_id = None if layer is None else _register(layer, self.layer.arg_names)

    def reset_parameters(self):
        """Normal weights with std 1/sqrt(fan-in) (the last dimension)."""
        with torch.no_grad():
            for name in self._weight_names:
                p = getattr(self, name)
                p.copy_(torch.randn(p.shape, dtype=torch.float32) / math.sqrt(p.shape[-1]))
                # (drawn on the CPU: the same values on every target)

    def forward(self, x, top_experts, router_weights):
        weights = [getattr(self, n) for n in self._weight_names]
        inputs = (("x", x), ("top_experts", top_experts), ("router_weights", router_weights))
        # Under torch.compile the custom ops (what it traces); in eager mode
        # the autograd functions, which take less than half the ops' host
        # time (no dispatcher round trips, no pytree flattening of the
        # tensor lists). Both run the same calls underneath.
        compiling = torch.compiler.is_compiling()
        names = list(self.layer.arg_names)
        values = [x, top_experts, router_weights, *weights]
        if not torch.is_grad_enabled():
            # Inference: the layer's inference function, no context.
            if not compiling:  # (a GPU layer also takes DLPack arrays here)
                return _run_inference(self._infer or self.layer, names, values)
            _check_tensors(inputs)
            lid = self._layer_id if self._infer is None else self._infer_id
            return torch.ops.mok.moe_infer(lid, x, top_experts, router_weights, weights)
        _check_tensors(inputs)
        main_grads = {}
        if self.accumulate_main_grad:
            for name, p in zip(self._weight_names, weights):
                grad = getattr(p, "main_grad", None)
                if grad is None:
                    raise ValueError(f"{name}: accumulate_main_grad needs a float32 "
                                     f"'main_grad' attribute of shape {list(p.shape)} on "
                                     "every weight parameter")
                main_grads[name] = grad
                p.grad_added_to_main_grad = True
        if not compiling:
            function = MoEFunction if self.target == "cpu" else GpuMoEFunction
            return function.apply(self.layer, main_grads, *values)
        _check_main_grads(main_grads, names, values)
        return torch.ops.mok.moe_forward(self._layer_id, x, top_experts, router_weights,
                                         weights, list(main_grads.values()))[0]

    def refresh_quantized_weights(self):
        """A layer compiled with fp8_quantized_weights: quantize the routed
        weights again on the next forward (their copies keep their
        addresses). The copies follow each parameter's version counter,
        which an optimizer's in-place step bumps; call this after writes
        it does not see (through `param.data`, as a mixed-precision
        optimizer's copy of its fp32 master weights back into the bf16
        parameters). Other layers: nothing to do."""
        if isinstance(self.layer, Fp8WeightsTrainingLayer):
            self.layer.refresh_weights()

    def extra_repr(self):
        s = self.spec
        return (f"hidden={s.hidden}, intermediate={s.intermediate}, experts={s.experts}, "
                f"top_k={s.top_k}, shared_intermediate={s.shared_intermediate}, "
                f"swiglu_limit={s.swiglu_limit}, recompute={self.layer.recomputes}")
