# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The CPU target: a layer compiled for the host, called on NumPy arrays
with every argument checked; and the Context and Gradients that every
target's training layers share."""
import os
from dataclasses import dataclass, field
import numpy as np

from . import _extensions
from ._artifact import Artifact, Stages, read_options, write_options
from ._bf16 import is_bf16
from ._options import CompileOptions

_NUMPY_DTYPES = {"f32": np.dtype(np.float32), "i32": np.dtype(np.int32),
                 "i64": np.dtype(np.int64)}
_POISON = {"bf16": np.uint16(0x7FC0), "f32": np.float32("nan")}
# Context tensors whose rows are routed rows (the rest have one row a token).
_ROUTED_CONTEXT = ("routed_x", "gate", "up", "hidden")


def _describe(info):
    dims = ", ".join("T" if d < 0 else str(d) for d in info.shape)
    return f"{info.dtype} [{dims}]"


def bind_arguments(names, args, kwargs):
    """{name: value} for a layer's arguments given by position (in `names`'
    order) and by name; TypeError naming what is unexpected, repeated or
    missing."""
    if len(args) > len(names):
        raise TypeError(f"expected at most {len(names)} arguments ({', '.join(names)}), "
                        f"got {len(args)}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"unexpected argument {k!r}; expected {', '.join(names)}")
        if k in bound:
            raise TypeError(f"argument {k!r} given twice")
        bound[k] = v
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"missing argument(s): {', '.join(missing)}")
    return bound


@dataclass
class Context:
    """What a training forward leaves for backward: the inputs, and the
    saved tensors unless the layer recomputes them. `tensors()` flattens it
    to plain arrays (for checkpointing); `CompiledLayer.context_from_tensors`
    rebuilds it. `views`: the weight operands a GPU training layer had
    bound to weight views when it made the context (they are not among
    `inputs`; GpuTrainingLayer.bind_weights)."""
    inputs: dict
    saved: dict = field(default_factory=dict)
    tokens: int = 0
    views: tuple = ()

    def tensors(self):
        return list(self.inputs.values()) + list(self.saved.values())


class Gradients(dict):
    """Gradients by argument name (``grads["x"]`` or ``grads.x``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class CompiledLayer(Artifact):
    """A MoE layer compiled for the host CPU (the executable reference); a
    mok.Artifact of target "cpu" that is its own loaded layer.

    Call it for inference, or use forward/backward for training. Arguments are
    passed by position (the function's argument order) or by name: x,
    top_experts, router_weights, gate_weights, up_weights, down_weights and,
    with a shared expert, shared_gate_weights, shared_up_weights,
    shared_down_weights.

    `stages`: "moe" (the input), "training" (fused, with forward and
    backward functions), "llvm" (what was JIT-compiled).
    """

    target = "cpu"

    def __init__(self, module, stages, name, options=None):
        self.options = options if options is not None else CompileOptions()
        infos = {f.name: f for f in module.functions()}
        for fn in (name, f"{name}_forward", f"{name}_backward"):
            if fn not in infos:
                raise ValueError(f"the module has no function @{fn}")
        self._infer = infos[name]
        self._forward = infos[f"{name}_forward"]
        self._backward = infos[f"{name}_backward"]
        if not self._infer.has_plan:
            raise ValueError(f"@{name} holds no MoE layer")
        if self._infer.ep != 1:
            raise ValueError(f"expert parallelism (ep = {self._infer.ep}) is not "
                             "supported by the CPU target; use ep = 1")
        self._exe = _extensions.compiler().HostExecutable.compile(module)
        texts = dict(stages, llvm=self._exe.lowered_ir)
        self._stages = Stages([n for n in ("moe", "training", "llvm") if n in texts], texts)
        self.name = name
        self.arg_names = [a.name or f"argument #{i}" for i, a in enumerate(self._infer.args)]

    def save(self, directory):
        """Writes <directory>/<function>.mlir (the "moe" stage) and its
        options (<function>.options.json); returns that base path, which
        from_files compiles again (the JIT-compiled code is not saved)."""
        os.makedirs(directory, exist_ok=True)
        base = os.path.join(directory, self.name)
        with open(base + ".mlir", "w") as f:
            f.write(self.stages["moe"])
        write_options(base, self.target, self.options)
        return base

    @staticmethod
    def from_files(base):
        """Compiles again what save() wrote at `base` (needs the compiler
        extension)."""
        with open(base + ".mlir") as f:
            source = f.read()
        target, options = read_options(base)
        if target not in (None, "cpu"):
            raise ValueError(f"{base}: saved for target {target!r}, not 'cpu'")
        return compile_cpu(source, base + ".mlir", os.path.basename(base),
                           (options or CompileOptions()).for_target("cpu"))

    def load(self, device=None):
        """The layer itself: it runs on the host (`device` None or "cpu")."""
        if device not in (None, "cpu"):
            raise ValueError(f"device: a CPU-target layer runs on the host; expected None "
                             f"or 'cpu', got {device!r}")
        return self

    @property
    def recomputes(self):
        return not any(r.role.startswith("saved:") for r in self._forward.results)

    # -- argument checking ---------------------------------------------------

    def _bind(self, args, kwargs):
        bound = bind_arguments(self.arg_names, args, kwargs)
        return [bound[n] for n in self.arg_names]

    def _check(self, name, value, info, tokens):
        """Checks one array against its signature entry; returns T when this
        argument carries the (dynamic) token count."""
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray ({_describe(info)}), "
                            f"got {type(value).__name__}")
        if info.dtype == "bf16":
            ok = is_bf16(value.dtype)
        else:
            ok = value.dtype == _NUMPY_DTYPES[info.dtype]
        if not ok:
            hint = " (bf16 travels as uint16 bit patterns; see mok.to_bf16)" \
                if info.dtype == "bf16" else ""
            raise TypeError(f"{name}: expected dtype {info.dtype}{hint}, got {value.dtype} "
                            f"of shape {list(value.shape)}")
        expected = [tokens if d < 0 else d for d in info.shape]
        if value.ndim != len(expected) or any(
                e is not None and e != s for e, s in zip(expected, value.shape)):
            want = ", ".join("T" if e is None else str(e) for e in expected)
            raise ValueError(f"{name}: expected shape [{want}], got {list(value.shape)}")
        if not value.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous array "
                             "(numpy.ascontiguousarray makes one)")
        if not value.flags.aligned:
            # The compiled code loads whole elements: an address that is not
            # a multiple of the element size is undefined behaviour there.
            raise ValueError(f"{name}: expected an array aligned to its {value.itemsize}-byte "
                             f"elements, got address {value.ctypes.data:#x} (a copy, "
                             "value.copy(), is aligned)")
        if info.shape and info.shape[0] < 0 and tokens is None:
            return value.shape[0]
        return tokens

    def _check_inputs(self, fn, values, tokens=None):
        infos = fn.args
        fixed = fn.tokens if fn.tokens >= 0 else None
        tokens = fixed if fixed is not None else tokens
        for name, value, info in zip(self.arg_names, values, infos):
            tokens = self._check(name, value, info, tokens)
        capacity = getattr(fn, "max_tokens", 0)
        if fixed is None and capacity and tokens is not None and tokens > capacity:
            raise ValueError(f"{self.arg_names[0]}: {tokens} tokens, more than this layer's "
                             f"capacity max_tokens = {capacity}")
        ids = values[self.arg_names.index("top_experts")]
        bad = (ids < -1) | (ids >= fn.experts)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"top_experts: expert id {int(ids[where])} at {list(where)} is "
                             f"outside [-1, {fn.experts}) (-1 means no route)")
        return tokens if tokens is not None else 0

    def _routed_capacity(self, fn, tokens):
        local = fn.experts // fn.ep
        return tokens * fn.top_k + local * (fn.padding - 1)

    def _shape(self, fn, info, tokens):
        """The concrete shape of a signature entry: T for the token count,
        the worst-case routed row count for routed context tensors."""
        routed = info.role.startswith("saved:") and info.role[6:] in _ROUTED_CONTEXT
        rows = self._routed_capacity(fn, tokens) if routed else tokens
        return [d if d >= 0 else (rows if i == 0 else tokens)
                for i, d in enumerate(info.shape)]

    def _outputs(self, fn, tokens):
        """Output buffers, poisoned (NaN) so that anything left unwritten shows."""
        outs = []
        for r in fn.results:
            dtype = np.uint16 if r.dtype == "bf16" else _NUMPY_DTYPES[r.dtype]
            outs.append(np.full(self._shape(fn, r, tokens), _POISON.get(r.dtype, 0),
                                dtype=dtype))
        return outs

    def _call(self, fn, inputs, outputs):
        def plain(arrays):
            return [a.view(np.uint16) if a.dtype.name == "bfloat16" else a for a in arrays]
        self._exe.invoke(fn.name, plain(inputs), plain(outputs))

    # -- entry points ---------------------------------------------------------

    def __call__(self, *args, **kwargs):
        """Inference: returns the layer's output, bf16 [T, H] as uint16."""
        values = self._bind(args, kwargs)
        tokens = self._check_inputs(self._infer, values)
        (out,) = outputs = self._outputs(self._infer, tokens)
        self._call(self._infer, values, outputs)
        return out

    def forward(self, *args, **kwargs):
        """Training forward: returns (output, Context)."""
        values = self._bind(args, kwargs)
        tokens = self._check_inputs(self._forward, values)
        outputs = self._outputs(self._forward, tokens)
        self._call(self._forward, values, outputs)
        saved = {r.role[len("saved:"):]: o
                 for r, o in zip(self._forward.results, outputs)
                 if r.role.startswith("saved:")}
        return outputs[0], Context(dict(zip(self.arg_names, values)), saved, tokens)

    def context_from_tensors(self, tensors):
        """Rebuilds a Context from Context.tensors()."""
        names = list(self.arg_names)
        saved_names = [r.role[len("saved:"):] for r in self._forward.results
                       if r.role.startswith("saved:")]
        if len(tensors) != len(names) + len(saved_names):
            raise ValueError(f"tensors: expected {len(names) + len(saved_names)} arrays "
                             f"({', '.join(names + saved_names)}), got {len(tensors)}")
        inputs = dict(zip(names, tensors[:len(names)]))
        tokens = self._check_inputs(self._forward, list(inputs.values()))
        return Context(inputs, dict(zip(saved_names, tensors[len(names):])), tokens)

    def backward(self, ctx, d_out):
        """Gradients of every floating-point argument, by name."""
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a mok.Context from forward(), got "
                            f"{type(ctx).__name__}")
        fn = self._backward
        values = [ctx.inputs[n] for n in self.arg_names]
        tokens = self._check_inputs(fn, values)
        for arg in fn.args[len(values):]:
            if arg.role.startswith("saved:"):
                name = arg.role[len("saved:"):]
                if name not in ctx.saved:
                    raise ValueError(f"ctx: the saved tensor {name!r} is missing "
                                     "(was the context made by this layer's forward?)")
                value = ctx.saved[name]
                shape = self._shape(fn, arg, tokens)
                if not isinstance(value, np.ndarray) or not is_bf16(value.dtype) \
                        or list(value.shape) != shape or not value.flags.c_contiguous \
                        or not value.flags.aligned:
                    raise ValueError(f"ctx.saved[{name!r}]: expected a C-contiguous, aligned "
                                     f"bf16 array of shape {shape}")
                values.append(value)
            elif arg.role == "cotangent":
                self._check("d_out", d_out, arg, tokens)
                values.append(d_out)
        outputs = self._outputs(fn, tokens)
        self._call(fn, values, outputs)
        grads = Gradients()
        for r, o in zip(fn.results, outputs):
            index = int(r.role[len("gradient_of:"):])
            grads[self.arg_names[index]] = o
        return grads


def compile_cpu(source, name, function, options):
    """The CompiledLayer of `function` in moe IR `source` (`name` for
    diagnostics), with `options` as the CPU target takes them."""
    module = _extensions.compiler().Module.parse(source, name)
    stages = {"moe": str(module)}
    module.run_pipeline("moe-generate-backward{recompute=true}" if options.recompute
                        else "moe-generate-backward")
    stages["training"] = str(module)
    return CompiledLayer(module, stages, function, options)
