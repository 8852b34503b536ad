# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Training on the GPU: the training forward and the backward kernels of a
layer (docs/Backward.md), with the CPU layer's forward/backward contract
(a Context of plain tensors, Gradients by argument name), on torch tensors.
"""
import os
from dataclasses import dataclass

from ._gpu import GpuArtifact, GpuLayer
from ._layer import Context, Gradients, bind_arguments


@dataclass
class GpuTrainingArtifact:
    """The two kernels of a training layer: `forward` (saves the backward
    context as extra outputs, unless `recompute`) and `backward`."""
    forward: GpuArtifact
    backward: GpuArtifact
    recompute: bool = False

    def save(self, directory):
        """Writes both kernels (<function>_forward / _backward .ptx/.json);
        returns the directory."""
        self.forward.save(directory)
        self.backward.save(directory)
        return directory

    @staticmethod
    def from_files(directory, function="moe_layer"):
        """Reads what save() wrote for `function`."""
        fwd = GpuArtifact.from_files(os.path.join(directory, f"{function}_forward"))
        bwd = GpuArtifact.from_files(os.path.join(directory, f"{function}_backward"))
        saved = [p for p in fwd.metadata["params"] if p["role"] == "output"][1:]
        return GpuTrainingArtifact(fwd, bwd, recompute=not saved)

    def load(self, device=None, poison_outputs=False):
        """A GpuTrainingLayer on CUDA `device` (None: torch's current
        device); `poison_outputs`: fill what it allocates with NaN before
        each launch (see GpuLayer)."""
        return GpuTrainingLayer(self, device, poison_outputs)


class GpuTrainingLayer:
    """forward(...) -> (out, Context) and backward(ctx, d_out) -> Gradients
    on one CUDA device, as CompiledLayer's (the CPU target) but on torch
    tensors. The context holds the inputs and (unless the layer recomputes)
    the saved tensors `routed_x`, `gate`, `up`, `hidden` and the shared
    expert's: plain tensors, so `ctx.tensors()` can go through
    `save_for_backward`, and `context_from_tensors` rebuilds it.

    Gradients are returned for x, router_weights and every weight, by
    argument name; weight gradients are bitwise reproducible (every element
    is one fixed-order sum)."""

    def __init__(self, artifact, device=None, poison_outputs=False):
        self.artifact = artifact
        self._forward = GpuLayer(artifact.forward, device, poison_outputs=poison_outputs)
        self._backward = GpuLayer(artifact.backward, device, poison_outputs=poison_outputs)
        self.device = self._forward.device
        self.arg_names = [p["name"] for p in self._forward.inputs]
        self.saved_names = list(self._forward.extra_outputs)
        self.output_names = [p["name"] for p in self._backward.outputs]
        self.torch = self._forward.torch

    @property
    def recomputes(self):
        return self.artifact.recompute

    def _bind(self, args, kwargs):
        return bind_arguments(self.arg_names, args, kwargs)

    def __call__(self, *args, **kwargs):
        """Inference through the training forward: the output alone."""
        out, _ = self.forward(*args, **kwargs)
        return out

    def forward(self, *args, **kwargs):
        """Training forward: returns (output, Context)."""
        inputs = self._bind(args, kwargs)
        result = self._forward(**inputs)
        if not self.saved_names:
            return result, Context(dict(inputs), {}, self._tokens())
        out = result[self._forward.output["name"]]
        saved = {n: result[n] for n in self.saved_names}
        return out, Context(dict(inputs), saved, self._tokens())

    def _tokens(self):
        return self._forward.output["shape"][0]

    def context_from_tensors(self, tensors):
        """Rebuilds a Context from Context.tensors() (inputs, then the saved
        tensors, in order)."""
        names = self.arg_names + self.saved_names
        tensors = list(tensors)
        if len(tensors) != len(names):
            raise ValueError(f"tensors: expected {len(names)} tensors ({', '.join(names)}), "
                             f"got {len(tensors)}")
        n = len(self.arg_names)
        return Context(dict(zip(self.arg_names, tensors[:n])),
                       dict(zip(self.saved_names, tensors[n:])), self._tokens())

    def backward(self, ctx, d_out, outputs=None):
        """Gradients of every floating-point argument, by name (x,
        router_weights, gate_weights, ...). `outputs`: tensors to write them
        into, by gradient name (`d_x`, `d_router_weights`, ...; see
        `output_names`), the others allocated."""
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
        args = dict(ctx.inputs)
        args.update(ctx.saved)
        args["d_out"] = d_out
        outs = self._backward(**args, outputs=outputs)
        grads = Gradients()
        for name, t in outs.items():
            grads[name[len("d_"):]] = t
        return grads
