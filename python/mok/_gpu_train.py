# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Training on the GPU: the training forward and the backward kernels of a
layer (docs/Backward.md), with the CPU layer's forward/backward contract
(a Context of plain tensors, Gradients by argument name), on torch tensors.
"""
import os
from dataclasses import dataclass

from ._artifact import Artifact
from ._gpu import GpuArtifact, GpuLayer
from ._layer import Context, Gradients, bind_arguments


def _listed(names):
    return ", ".join(names) if names else "no operand"


@dataclass
class GpuTrainingArtifact(Artifact):
    """The two kernels of a training layer: `forward` (saves the backward
    context as extra outputs, unless `recompute`) and `backward`; a
    mok.Artifact whose target and options are its kernels'. Its "ptx"
    stage holds both kernels' PTX, the forward's first."""
    forward: GpuArtifact
    backward: GpuArtifact
    recompute: bool = False

    @property
    def target(self):
        return self.forward.target

    @property
    def options(self):
        return self.forward.options

    @property
    def main_grads(self):
        """Whether the backward adds the weights' gradients into fp32
        main_grads (mok.compile(..., main_grads=True))."""
        return any(p.get("accumulate") for p in self.backward.metadata.get("params", []))

    def save(self, directory, cubin=None):
        """Writes both kernels (<function>_forward / _backward .ptx/.json,
        and their options; their cubins as GpuArtifact.save's `cubin`
        says); returns the directory, which from_files reads."""
        self.forward.save(directory, cubin)
        self.backward.save(directory, cubin)
        return directory

    @staticmethod
    def from_files(directory, function="moe_layer"):
        """Reads what save() wrote for `function` (no IR stages)."""
        fwd = GpuArtifact.from_files(os.path.join(directory, f"{function}_forward"))
        bwd = GpuArtifact.from_files(os.path.join(directory, f"{function}_backward"))
        saved = [p for p in fwd.metadata["params"] if p["role"] == "output"][1:]
        return GpuTrainingArtifact(fwd, bwd, recompute=not saved)

    def load(self, device=None, poison_outputs=False, comm=None):
        """A GpuTrainingLayer on CUDA `device` (None: torch's current
        device, or `comm`'s); `poison_outputs`: fill what it allocates with
        NaN before each launch (see GpuLayer); `comm`: the mok.Communicator
        of N ranks a layer compiled for ep = N > 1 runs on (both kernels are
        bound to it, each with its own exchange buffer: every rank loads its
        layers in the same order)."""
        return GpuTrainingLayer(self, device, poison_outputs, comm=comm)


class GpuTrainingLayer:
    """forward(...) -> (out, Context) and backward(ctx, d_out) -> Gradients
    on one CUDA device, as CompiledLayer's (the CPU target) but on torch
    tensors. The context holds the inputs and (unless the layer recomputes)
    the saved tensors `routed_x`, `gate`, `up`, `hidden` and the shared
    expert's: plain tensors, so `ctx.tensors()` can go through
    `save_for_backward`, and `context_from_tensors` rebuilds it.

    Gradients are returned for x, router_weights and every weight, by
    argument name; weight gradients are bitwise reproducible (every element
    is one fixed-order sum).

    Routed weights can be bound to trainer-owned storage without a copy
    (bind_weights, bind_fc1: the views GpuLayer takes), for both kernels at
    once; forward then takes them from the views, not as arguments, and
    their gradients are still returned as dense tensors. Only tensor-core
    layers (both kernels' weights with metadata "access": "tensor_maps")
    accept views. The backward reads the weights bound when it runs: keep
    the bound storage unchanged between a forward and its backward, as
    autograd would for saved weights."""

    def __init__(self, artifact, device=None, poison_outputs=False, comm=None):
        self._init(artifact,
                   GpuLayer(artifact.forward, device, poison_outputs=poison_outputs,
                            comm=comm),
                   GpuLayer(artifact.backward, device, poison_outputs=poison_outputs,
                            comm=comm))

    def _init(self, artifact, forward, backward):
        self.artifact = artifact
        self._forward = forward
        self._backward = backward
        self.device = self._forward.device
        self.arg_names = [p["name"] for p in self._forward.inputs]
        self.saved_names = list(self._forward.extra_outputs)
        self.output_names = [p["name"] for p in self._backward.outputs]
        # The outputs the backward adds into (main_grads=True): d_<weight>.
        self._accumulated = [p["name"] for p in self._backward.outputs
                             if p.get("accumulate")]
        self.torch = self._forward.torch

    @property
    def load_sources(self):
        """How each kernel was loaded (GpuLayer.load_source): {"forward":
        ..., "backward": ...}, each "cubin" or "ptx"."""
        return {"forward": self._forward.load_source,
                "backward": self._backward.load_source}

    @property
    def recomputes(self):
        return self.artifact.recompute

    def _bind(self, args, kwargs):
        views = self.bound_weights
        for k in kwargs:
            if k in views:
                raise TypeError(f"{k}: is bound to a weight view (bind_weights); do not "
                                f"pass it too, or unbind_weights({k!r}) first")
        return bind_arguments(self._input_names(), args, kwargs)

    def _input_names(self):
        """The forward's arguments: the inputs not bound to weight views."""
        views = self.bound_weights
        return [n for n in self.arg_names if n not in views]

    @property
    def bound_weights(self):
        """The names of the operands bound to weight views (in both kernels)."""
        return self._forward.bound_weights

    def bind_weights(self, name, weights):
        """Binds routed weight operand `name` (gate_weights, up_weights or
        down_weights) in both kernels to `weights`, without a copy: what
        GpuLayer.bind_weights takes (a [E, rows, cols] tensor with any
        16-byte-multiple row and expert strides, a list of E [rows, cols]
        tensors, or a mok._runtime.WeightView). A refused binding (by
        either kernel) leaves both kernels' previous one."""
        self._bind_both([name], lambda layer: layer.bind_weights(name, weights))

    def bind_fc1(self, fc1):
        """Binds gate_weights and up_weights in both kernels to the halves of
        a fused FC1 tensor [E, 2I, H] (gate: rows [0, I) of each expert,
        up: rows [I, 2I)), without a copy."""
        self._bind_both(["gate_weights", "up_weights"], lambda layer: layer.bind_fc1(fc1))

    def bind_comm(self, comm):
        """Binds both kernels to `comm` (a mok.Communicator of the layer's
        ep ranks; each kernel its own exchange buffer, allocated here), or
        unbinds both (None), e.g. before comm.destroy(). Collective for an
        NCCL communicator, like GpuLayer.bind_comm: every rank binds its
        layers in the same order. A refused binding of the backward undoes
        the forward's."""
        previous = self._forward.comm
        self._forward.bind_comm(comm)
        try:
            self._backward.bind_comm(comm)
        except Exception:
            self._forward.bind_comm(previous)
            raise

    @property
    def comm(self):
        """The bound mok.Communicator (both kernels'), or None."""
        return self._forward.comm

    def unbind_weights(self, name=None):
        """Unbinds `name` (every bound operand if None) in both kernels;
        forward takes it as an argument again."""
        for layer in (self._forward, self._backward):
            layer.unbind_weights(name)

    def _bind_both(self, names, bind):
        # The forward first (its refusals name the argument), then the
        # backward; if the backward refuses, the forward gets back what it had.
        previous = {n: self._forward._layer.bound_weights.get(n) for n in names}
        bind(self._forward)
        try:
            bind(self._backward)
        except BaseException:
            for n, view in previous.items():
                self._forward._layer.bind_weights(n, view)  # None unbinds
            raise

    def __call__(self, *args, **kwargs):
        """Inference through the training forward: the output alone."""
        out, _ = self.forward(*args, **kwargs)
        return out

    def forward(self, *args, **kwargs):
        """Training forward: returns (output, Context)."""
        inputs = self._bind(args, kwargs)
        # In the layer's input order, whatever the keywords' order:
        # Context.tensors() and context_from_tensors rely on it.
        inputs = {n: inputs[n] for n in self._input_names() if n in inputs}
        result = self._forward(**inputs)
        views = self.bound_weights
        if not self.saved_names:
            return result, Context(dict(inputs), {}, self._tokens(), views)
        out = result[self._forward.output["name"]]
        saved = {n: result[n] for n in self.saved_names}
        return out, Context(dict(inputs), saved, self._tokens(), views)

    def _tokens(self):
        """The token count of the last forward (the one T of a layer for one
        T)."""
        return self._forward._call_tokens

    @property
    def max_tokens(self):
        """The largest token count a call may have (the one T of a layer
        for one T)."""
        return self._forward.max_tokens

    @property
    def any_tokens(self):
        """Whether the layer serves every T from 1 to max_tokens."""
        return self._forward.any_tokens

    def context_from_tensors(self, tensors):
        """Rebuilds a Context from Context.tensors() (inputs, then the saved
        tensors, in order; the inputs without the operands bound to weight
        views, which must be bound as they were when the context was made)."""
        inputs = self._input_names()
        names = inputs + self.saved_names
        tensors = list(tensors)
        if len(tensors) != len(names):
            raise ValueError(f"tensors: expected {len(names)} tensors ({', '.join(names)}), "
                             f"got {len(tensors)}")
        n = len(inputs)
        given = dict(zip(inputs, tensors[:n]))
        # The context's T: its x's rows (a layer for any T), not the last
        # forward's.
        x = given.get("x")
        tokens = int(x.shape[0]) if getattr(x, "shape", None) else self._tokens()
        return Context(given, dict(zip(self.saved_names, tensors[n:])), tokens,
                       self.bound_weights)

    @property
    def main_grads(self):
        """Whether the backward adds the weights' gradients into fp32
        main_grads (compiled with main_grads=True)."""
        return bool(self._accumulated)

    def check_errors(self):
        """The forward's and the backward's GpuLayer.check_errors()."""
        self._forward.check_errors()
        self._backward.check_errors()

    def set_grid(self, ctas):
        """GpuLayer.set_grid for both kernels (each refuses a grid that
        cannot be resident at once)."""
        self._forward.set_grid(ctas)
        self._backward.set_grid(ctas)

    def backward(self, ctx, d_out, outputs=None, main_grads=None):
        """Gradients of every floating-point argument, by name (x,
        router_weights, gate_weights, ...). `outputs`: tensors to write them
        into, by gradient name (`d_x`, `d_router_weights`, ...; see
        `output_names`), the others allocated.

        A layer compiled with main_grads=True takes `main_grads`, one fp32
        tensor per weight by the weight's name, each of the weight's shape:
        the kernel adds the weight's gradient into it in place (unrounded
        fp32 sums, main_grad += dW), and the weights' gradients are then not
        returned (only x's and router_weights')."""
        accumulated = self._accumulated
        if accumulated:
            weights = [n[len("d_"):] for n in accumulated]
            if not isinstance(main_grads, dict):
                raise TypeError(f"main_grads: this layer adds the weights' gradients into "
                                f"fp32 main_grads; expected a dict of tensors by weight name "
                                f"({', '.join(weights)}), got {type(main_grads).__name__}")
            unknown = [n for n in main_grads if n not in weights]
            missing = [n for n in weights if n not in main_grads]
            if unknown or missing:
                raise ValueError(f"main_grads: expected one tensor for each of "
                                 f"{', '.join(weights)}"
                                 + (f"; unknown {', '.join(map(repr, unknown))}" if unknown
                                    else "")
                                 + (f"; missing {', '.join(missing)}" if missing else ""))
            clash = [f"d_{n}" for n in weights if outputs and f"d_{n}" in outputs]
            if clash:
                raise TypeError(f"outputs: {', '.join(clash)} are the main_grads; pass them "
                                "as main_grads= only")
            outputs = dict(outputs or {}, **{f"d_{n}": main_grads[n] for n in weights})
        elif main_grads is not None:
            raise ValueError("main_grads: this layer returns the weights' gradients; "
                             "compile it with main_grads=True to add them into main_grads "
                             "in the kernel")
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a mok.Context from forward(), got "
                            f"{type(ctx).__name__}")
        extra = [n for n in ctx.saved if n not in self.saved_names]
        if extra:
            raise ValueError(f"ctx: holds saved tensor(s) {', '.join(map(repr, extra))} "
                             f"this layer does not take (it "
                             f"{'recomputes its context' if self.recomputes else 'saves ' + ', '.join(self.saved_names)}); "
                             "was the context made by another layer's forward?")
        missing = [n for n in self.saved_names if n not in ctx.saved]
        if missing:
            raise ValueError(f"ctx: the saved tensor(s) {', '.join(map(repr, missing))} "
                             "are missing (was the context made by this layer's forward?)")
        views = self.bound_weights
        if tuple(ctx.views) != views:
            raise ValueError(f"ctx: made with {_listed(ctx.views)} bound to weight views, "
                             f"but this layer now binds {_listed(views)}; backward reads "
                             "the weights bound when it runs: bind them as for the forward")
        args = dict(ctx.inputs)
        args.update(ctx.saved)
        args["d_out"] = d_out
        outs = self._backward(**args, outputs=outputs)
        grads = Gradients()
        for name, t in outs.items():
            if name not in accumulated:
                grads[name[len("d_"):]] = t
        return grads


_ROUTED = ("gate", "up", "down")
_QUANTIZED = tuple(w + s for w in _ROUTED for s in ("_q", "_scale", "_qt", "_scale_t"))


class Fp8WeightsTrainingLayer(GpuTrainingLayer):
    """A GpuTrainingLayer compiled with fp8_quantized_weights, called with
    the bf16 routed weights like any other (its `arg_names` name
    gate_weights, up_weights and down_weights, not their quantized forms):
    it quantizes each in both layouts (mok.ops.fp8_quantize; MXFP8:
    mok.ops.mxfp8_quantize, the scales in tcgen05's atoms by
    mok.ops.mxfp8_scale_atoms) into copies it
    keeps, refreshed in place (the same addresses) when the weight has
    changed since (its version counter, as an optimizer's in-place update
    bumps it) and made anew for another storage. A write the version
    counter does not see (through `param.data`, as mixed-precision
    optimizers copy their fp32 master weights back; a CUDA graph replaying
    the forward) needs `refresh_weights()` after it. The forward's context
    holds the bf16 weights; the backward reads the copies of the weights as
    they are when it runs (unchanged since the forward under autograd: the
    copies of the forward, not made again). The copies are made outside
    inference mode, so that a first call under torch.inference_mode() does
    not leave copies that cannot be refreshed. mok.torch.MoELayer runs a
    layer compiled with fp8_quantized_weights through this."""

    def __init__(self, layer):
        self._init(layer.artifact, layer._forward, layer._backward)
        kernel = list(self.arg_names)
        if "gate_q" not in kernel:
            raise ValueError("layer: its kernels take the bf16 routed weights (compiled "
                             "without fp8_quantized_weights)")
        self.kernel_arg_names = kernel
        self.arg_names = [n[:-len("_q")] + "_weights" if n in ("gate_q", "up_q", "down_q")
                          else n for n in kernel if n not in _QUANTIZED or n.endswith("_q")]
        self._copies = {}
        by_name = {p["name"]: p for p in self._forward.inputs}
        self._mx = by_name["gate_scale"]["dtype"] != "f32"
        # The inputs' params as the bf16 names take them (T = 0's checks).
        self.input_params = [
            dict(by_name[n[:-len("_weights")] + "_q"], name=n, dtype="bf16")
            if n[:-len("_weights")] in _ROUTED and n.endswith("_weights") else by_name[n]
            for n in self.arg_names]

    def refresh_weights(self):
        """Makes the next forward quantize every routed weight again (in
        place, the copies keeping their addresses), whatever its version
        counter says: after writes it does not see (through `.data`)."""
        for entry in self._copies.values():
            entry[1] = None

    def bind_weights(self, name, weights):
        raise TypeError(f"{name}: this layer takes its routed weights quantized "
                        "(compiled with fp8_quantized_weights) and quantizes the bf16 "
                        "ones it is called with; it binds no weight views")

    def bind_fc1(self, fc1):
        self.bind_weights("gate_weights, up_weights", fc1)

    def quantized(self, name, weight):
        """The copies (values, scales, values_t, scales_t) of routed weight
        `name` (e.g. "gate_weights") for the bf16 tensor `weight`: made,
        refreshed in place, or as they were."""
        import mok.ops
        torch = self.torch
        want = next(p for p in self.input_params if p["name"] == name)
        if (not isinstance(weight, torch.Tensor) or weight.dtype != torch.bfloat16
                or list(weight.shape) != want["shape"] or weight.device != self.device):
            got = (f"{weight.dtype} of shape {list(weight.shape)} on {weight.device}"
                   if isinstance(weight, torch.Tensor) else type(weight).__name__)
            raise ValueError(f"{name}: expected a torch.bfloat16 tensor of shape "
                             f"{want['shape']} on {self.device}, got {got}")
        where = (weight.data_ptr(), tuple(weight.shape), weight.device)
        entry = self._copies.get(name)
        precision = "mxfp8" if self._mx else "fp8"
        with torch.inference_mode(False):
            if entry is None or entry[0] != where:
                copies = mok.ops.fp8_kernel_weights(weight, precision, True, True)
                self._copies[name] = [where, weight._version, copies]
            elif entry[1] != weight._version:
                mok.ops.fp8_kernel_weights(weight, precision, True, True, out=entry[2])
                entry[1] = weight._version
        return self._copies[name][2]

    def _kernel_args(self, inputs):
        args = {}
        for n, v in inputs.items():
            w = n[:-len("_weights")] if n.endswith("_weights") else None
            if w in _ROUTED:
                q, s, qt, st = self.quantized(n, v)
                args.update({w + "_q": q, w + "_scale": s, w + "_qt": qt,
                             w + "_scale_t": st})
            else:
                args[n] = v
        return args

    def forward(self, *args, **kwargs):
        """Training forward: returns (output, Context), the context holding
        the bf16 weights."""
        inputs = self._bind(args, kwargs)
        inputs = {n: inputs[n] for n in self._input_names() if n in inputs}
        result = self._forward(**self._kernel_args(inputs))
        out = result[self._forward.output["name"]]
        saved = {n: result[n] for n in self.saved_names}
        return out, Context(dict(inputs), saved, self._tokens(), self.bound_weights)

    def backward(self, ctx, d_out, outputs=None, main_grads=None):
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a mok.Context from forward(), got "
                            f"{type(ctx).__name__}")
        kernel_ctx = Context(self._kernel_args(ctx.inputs), ctx.saved, ctx.tokens, ctx.views)
        return GpuTrainingLayer.backward(self, kernel_ctx, d_out, outputs, main_grads)
