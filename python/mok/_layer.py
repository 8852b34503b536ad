# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The CPU target: a layer compiled for the host, called on NumPy arrays
with every argument checked; and the Context and Gradients that every
target's training layers share."""
import json
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
    # Whether the layer is one rank of an expert-parallel group (ep > 1):
    # CompiledGroupLayer.
    _expert_parallel = False

    def __init__(self, module, stages, name, options=None):
        self.options = options if options is not None else CompileOptions()
        infos = {f.name: f for f in module.functions()}
        for fn in (name, f"{name}_forward", f"{name}_backward"):
            if fn not in infos:
                raise ValueError(f"the module has no function @{fn}")
        self._infer = infos[name]
        self._forward = infos[f"{name}_forward"]
        self._backward = infos[f"{name}_backward"]
        # The routed experts' arithmetic: "bf16", "mxfp8" or "fp8".
        self.precision = self._infer.precision
        if not self._infer.has_plan:
            raise ValueError(f"@{name} holds no MoE layer")
        if (self._infer.ep != 1) != self._expert_parallel:
            raise ValueError(f"@{name} is compiled for ep = {self._infer.ep}: "
                             + ("a CompiledGroupLayer runs it" if self._infer.ep != 1
                                else "a CompiledLayer runs it"))
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
        recv_capacity = None
        if os.path.exists(base + ".group.json"):  # an expert-parallel layer's
            with open(base + ".group.json") as f:
                recv_capacity = json.load(f)["recv_capacity"]
        return compile_cpu(source, base + ".mlir", os.path.basename(base),
                           (options or CompileOptions()).for_target("cpu"), recv_capacity)

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


# -- expert parallelism: a group of ranks in one process -----------------------

_WEIGHT_NAMES = ("gate_weights", "up_weights", "down_weights")


@dataclass(frozen=True)
class Exchange:
    """What crossed between the ranks in one exchange of a group call
    (docs/ExpertParallel.md): `rows[s, d]`, the token rows rank s sent to
    rank d (each token once per destination rank, however many of its
    routes go there); `routes[s, d]`, the routes those rows carry.
    `received_routes[d]` = routes[:, d].sum(), what recv_capacity bounds."""
    rows: np.ndarray
    routes: np.ndarray

    @property
    def received_routes(self):
        return self.routes.sum(axis=0)


class _RankErrors:
    """Re-raises a TypeError or ValueError about one rank's argument with
    the rank in front: "ranks[2].x: ..." (or "ranks[2]: ..." for what is
    not about one argument)."""

    def __init__(self, where, index, names):
        self.prefix = f"{where}[{index}]"
        self.names = names

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind not in (TypeError, ValueError):
            return False
        message = str(error)
        head = message.split(":", 1)[0].split("[", 1)[0]
        sep = "." if head in self.names else ": "
        raise kind(f"{self.prefix}{sep}{message}") from None


def _poisoned(shape, dtype):
    """A buffer filled with what no stage writes: NaN for floats, -2 for
    the integer buffers (whose "none" is -1)."""
    if dtype == "bf16":
        return np.full(shape, _POISON["bf16"], dtype=np.uint16)
    if dtype == "f32":
        return np.full(shape, np.float32("nan"), dtype=np.float32)
    return np.full(shape, -2, dtype=_NUMPY_DTYPES[dtype])


class CompiledGroupLayer(CompiledLayer):
    """A MoE layer compiled for the host as one rank of an expert-parallel
    group of `ep` ranks, run as the whole group in one process
    (docs/ExpertParallel.md): each rank holds its tokens and its E/ep local
    experts; rank r owns experts [r*E/ep, (r+1)*E/ep).

    Every rank's functions are the compiled layer's stage functions
    (convert-moe-to-cpu: send, experts, combine, forward and backward); the
    layer moves their buffers between the ranks in memory, in between.

        outs = layer.run_group(ranks)                  # inference
        outs, ctxs = layer.forward_group(ranks)        # training
        grads = layer.backward_group(ctxs, d_outs)     # a mok.Gradients a rank

    `ranks` lists every rank's arguments, each a dict by name or a list in
    the argument order (as CompiledLayer takes them); each rank has its
    own token count T unless the layer fixes it. The results are lists, one
    entry per rank. A rank's outputs and gradients are the EP = 1 layer's
    for its tokens with all E experts; its weight gradients are those of its
    local experts, over every rank's tokens routed to them.
    """

    _expert_parallel = True

    def __init__(self, module, stages, name, options=None, recv_capacity=None):
        super().__init__(module, stages, name, options)
        fn = self._infer
        self.ep = fn.ep
        self.local_experts = fn.experts // fn.ep
        bound = fn.tokens if fn.tokens >= 0 else (fn.max_tokens or None)
        if recv_capacity is None and getattr(fn, "recv_capacity", 0):
            recv_capacity = fn.recv_capacity  # the IR's plan says it
        if recv_capacity is None and bound is not None:
            recv_capacity = self.ep * bound * min(fn.top_k, self.local_experts)
        if recv_capacity is not None and (not isinstance(recv_capacity, int)
                                          or isinstance(recv_capacity, bool)
                                          or recv_capacity < 1):
            raise ValueError(f"recv_capacity: expected None or a positive int, got "
                             f"{recv_capacity!r}")
        self.recv_capacity = recv_capacity
        self.last_exchange = None

    # -- what the EP = 1 layer has, refused by name ---------------------------

    def _not_alone(self, what):
        return TypeError(f"{what}: this layer is one rank of an expert-parallel group "
                         f"(ep = {self.ep}); run the group with run_group(ranks), "
                         "forward_group(ranks) and backward_group(ctxs, d_outs)")

    def __call__(self, *args, **kwargs):
        raise self._not_alone("layer(...)")

    def forward(self, *args, **kwargs):
        raise self._not_alone("forward")

    def backward(self, ctx, d_out):
        raise self._not_alone("backward")

    def save(self, directory):
        """As CompiledLayer.save, and the receive capacity beside it
        (<function>.group.json), which from_files reads back."""
        base = super().save(directory)
        with open(base + ".group.json", "w") as f:
            json.dump({"ep": self.ep, "recv_capacity": self.recv_capacity}, f)
        return base

    # -- arguments -------------------------------------------------------------

    def _rank_list(self, what, values, kind):
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"{what}: expected a list of the {self.ep} ranks' {kind} "
                            f"(ep = {self.ep}), got {type(values).__name__}")
        if len(values) != self.ep:
            raise ValueError(f"{what}: expected the {kind} of {self.ep} ranks (ep = "
                             f"{self.ep}), got {len(values)}")
        return list(values)

    def _check_local_weights(self, bound):
        local = self.local_experts
        for name in _WEIGHT_NAMES:
            w = bound[name]
            if isinstance(w, np.ndarray) and w.ndim == 3 and w.shape[0] != local:
                raise ValueError(
                    f"{name}: expected the rank's {local} local experts (experts/ep = "
                    f"{self._infer.experts}/{self.ep}; rank r holds experts "
                    f"[r*{local}, (r+1)*{local})) as the first dimension, got shape "
                    f"{list(w.shape)}")

    def _bind_ranks(self, fn, ranks, where="ranks"):
        """[(values in argument order, T)] of every rank, each checked;
        errors name the rank as `where`[r]."""
        bound_ranks = []
        for r, args in enumerate(self._rank_list(where, ranks, "arguments")):
            with _RankErrors(where, r, self.arg_names):
                if isinstance(args, dict):
                    bound = bind_arguments(self.arg_names, (), args)
                elif isinstance(args, (list, tuple)):
                    bound = bind_arguments(self.arg_names, args, {})
                else:
                    raise TypeError(f"expected the rank's arguments as a dict by name or a "
                                    f"list in argument order ({', '.join(self.arg_names)}), "
                                    f"got {type(args).__name__}")
                self._check_local_weights(bound)
                values = [bound[n] for n in self.arg_names]
                tokens = self._check_inputs(fn, values)
            bound_ranks.append((values, tokens))
        return bound_ranks

    def _invoke(self, function, inputs, outputs):
        def plain(arrays):
            return [a.view(np.uint16) if a.dtype.name == "bfloat16" else a for a in arrays]
        self._exe.invoke(function, plain(inputs), plain(outputs))

    # -- the exchange ----------------------------------------------------------

    def _send(self, fn, top, inputs, payloads):
        """Runs `fn`'s send stage on one rank: {name: array} of its outputs,
        the packed rows cut to the rows sent. `payloads`: (name, columns,
        dtype) of the packed row buffers after token and expert_ids."""
        n, k = self.ep, self._infer.top_k
        most = top.shape[0] * min(k, n)  # each token once per destination rank
        names = ["send_rows", "send_routes", "token", "expert_ids"]
        outputs = [np.full(n, -1, np.int64), np.full(n, -1, np.int64),
                   _poisoned((most,), "i32"), _poisoned((most, k), "i32")]
        for name, cols, dtype in payloads:
            names.append(name)
            outputs.append(_poisoned((most, cols), dtype))
        self._invoke(f"{fn.name}__ep_send", inputs, outputs)
        out = dict(zip(names, outputs))
        sent = int(out["send_rows"].sum())
        if not 0 <= sent <= most:
            raise RuntimeError(f"{fn.name}__ep_send reported {sent} rows for at most {most}")
        for name in names[2:]:
            out[name] = out[name][:sent]
        return out

    def _exchange(self, sends, names):
        """Moves every source rank's packed rows to their destination ranks:
        [per destination rank {"recv_rows": rows from each source, "routes":
        routes received, name: the rows of every source, in rank order}].
        Checks the receive capacity first, from the counts alone."""
        n = self.ep
        rows = np.stack([s["send_rows"] for s in sends])
        routes = np.stack([s["send_routes"] for s in sends])
        self.last_exchange = Exchange(rows=rows, routes=routes)
        received = routes.sum(axis=0)
        if self.recv_capacity is not None:
            for d in range(n):
                if received[d] > self.recv_capacity:
                    per_source = ", ".join(str(int(v)) for v in routes[:, d])
                    raise ValueError(
                        f"top_experts: the group routes {int(received[d])} routes to rank "
                        f"{d}'s experts (from ranks 0..{n - 1}: {per_source}), more than "
                        f"the receive capacity recv_capacity = {self.recv_capacity} "
                        "(LayerSpec.recv_capacity)")
        starts = np.zeros((n, n + 1), np.int64)
        starts[:, 1:] = np.cumsum(rows, axis=1)
        received_rows = []
        for d in range(n):
            r = {"recv_rows": rows[:, d].copy(), "routes": int(received[d])}
            for name in names:
                r[name] = np.ascontiguousarray(np.concatenate(
                    [sends[s][name][starts[s, d]:starts[s, d + 1]] for s in range(n)]))
            received_rows.append(r)
        return received_rows

    def _routed_rows(self, routes):
        """The routed rows of an expert rank that received `routes` routes:
        the EP = 1 bound T*top_k + local*(padding - 1), with T*top_k the
        routes."""
        return routes + self.local_experts * (self._infer.padding - 1)

    def _return(self, results, tokens, payloads):
        """Moves every routed row's results back to its source rank, to
        row token*top_k + k of a [T*top_k, ...] buffer: [per source rank
        {name: buffer}]. `payloads`: (name, trailing shape, dtype)."""
        k = self._infer.top_k
        back = [{name: _poisoned((t * k,) + tail, dtype) for name, tail, dtype in payloads}
                for t in tokens]
        for d, res in enumerate(results):
            rank, row = res["dest_rank"], res["dest_row"]
            for s, t in enumerate(tokens):
                mine = rank == s
                if mine.any() and (row[mine].min() < 0 or row[mine].max() >= t * k):
                    raise RuntimeError(f"rank {d}'s experts stage sent a row outside "
                                       f"rank {s}'s {t * k} routes")
                for name, _, _ in payloads:
                    back[s][name][row[mine]] = res[name][mine]
        return back

    # -- entry points ------------------------------------------------------------

    def _forward_group(self, fn, ranks):
        """(outputs, contexts' saved tensors, inputs) of `fn` on every rank."""
        bound = self._bind_ranks(fn, ranks)
        info = self._infer
        names = self.arg_names
        hidden = info.args[names.index("x")].shape[1]
        inter = info.args[names.index("gate_weights")].shape[1]
        saves = any(r.role.startswith("saved:") for r in fn.results)
        shared = "shared_gate_weights" in names

        sends = []
        for values, _ in bound:
            args = dict(zip(names, values))
            sends.append(self._send(fn, args["top_experts"],
                                    [args["top_experts"], args["x"]],
                                    [("x_rows", hidden, "bf16")]))
        received = self._exchange(sends, ["token", "expert_ids", "x_rows"])

        results, saved = [], []
        for (values, _), recv in zip(bound, received):
            args = dict(zip(names, values))
            rows = self._routed_rows(recv["routes"])
            out_names = ["routed_y", "dest_rank", "dest_row"]
            outputs = [_poisoned((rows, hidden), "bf16"), _poisoned((rows,), "i32"),
                       _poisoned((rows,), "i32")]
            if saves:
                out_names += ["routed_x", "gate", "up", "hidden"]
                outputs += [_poisoned((rows, hidden), "bf16")] + \
                    [_poisoned((rows, inter), "bf16") for _ in range(3)]
            self._invoke(f"{fn.name}__ep_experts",
                         [recv["recv_rows"], recv["token"], recv["expert_ids"], recv["x_rows"]]
                         + [args[w] for w in _WEIGHT_NAMES], outputs)
            res = dict(zip(out_names, outputs))
            results.append(res)
            saved.append({n: res[n] for n in out_names[3:]})
        back = self._return(results, [t for _, t in bound],
                            [("routed_y", (hidden,), "bf16")])

        outs = []
        for (values, tokens), ret, ctx in zip(bound, back, saved):
            args = dict(zip(names, values))
            inputs = [args["x"], args["top_experts"], args["router_weights"]]
            if shared:
                inputs += [args[f"shared_{w}"] for w in _WEIGHT_NAMES]
            inputs.append(ret["routed_y"])
            out = _poisoned((tokens, hidden), "bf16")
            outputs = [out]
            if saves and shared:
                s_inter = args["shared_gate_weights"].shape[0]
                context = [_poisoned((tokens, s_inter), "bf16") for _ in range(3)]
                outputs += context
                ctx.update(zip(("shared_gate", "shared_up", "shared_hidden"), context))
            self._invoke(f"{fn.name}__ep_combine", inputs, outputs)
            outs.append(out)
        return outs, saved, bound

    def run_group(self, ranks):
        """Inference on every rank: the list of the ranks' outputs, bf16
        [T_r, H] as uint16."""
        outs, _, _ = self._forward_group(self._infer, ranks)
        return outs

    def forward_group(self, ranks):
        """Training forward on every rank: (outputs, contexts), one each a
        rank. A rank's Context holds its inputs, its shared expert's saved
        tensors and the routed tensors of the rows its experts received
        (routed_x, gate, up, hidden: R + (E/ep)*(padding - 1) rows for the R
        routes received)."""
        outs, saved, bound = self._forward_group(self._forward, ranks)
        ctxs = [Context(dict(zip(self.arg_names, values)), s, tokens)
                for (values, tokens), s in zip(bound, saved)]
        return outs, ctxs

    def backward_group(self, ctxs, d_outs):
        """The gradients of every rank, from the contexts of forward_group
        and each rank's d_out [T_r, H]: a list of mok.Gradients (x,
        router_weights, the rank's local experts' gate, up and down weights,
        and the shared expert's)."""
        fn, names = self._backward, self.arg_names
        ctxs = self._rank_list("ctxs", ctxs, "contexts")
        d_outs = self._rank_list("d_outs", d_outs, "output gradients")
        for r, ctx in enumerate(ctxs):
            if not isinstance(ctx, Context):
                raise TypeError(f"ctxs[{r}]: expected a mok.Context from forward_group(), "
                                f"got {type(ctx).__name__}")
        bound = self._bind_ranks(fn, [[c.inputs.get(n) for n in names] for c in ctxs],
                                 "ctxs")
        info = self._infer
        hidden = info.args[names.index("x")].shape[1]
        inter = info.args[names.index("gate_weights")].shape[1]
        recomputes = self.recomputes
        shared = "shared_gate_weights" in names
        cotangent = next(a for a in fn.args if a.role == "cotangent")
        for r, ((_, tokens), d_out) in enumerate(zip(bound, d_outs)):
            self._check(f"d_outs[{r}]", d_out, cotangent, tokens)

        sends = []
        for (values, _), d_out in zip(bound, d_outs):
            args = dict(zip(names, values))
            inputs = [args["top_experts"], d_out, args["router_weights"]]
            payloads = [("d_out_rows", hidden, "bf16"), ("weights", info.top_k, "f32")]
            if recomputes:
                inputs.append(args["x"])
                payloads.append(("x_rows", hidden, "bf16"))
            sends.append(self._send(fn, args["top_experts"], inputs, payloads))
        moved = ["token", "expert_ids", "d_out_rows", "weights"] + \
            (["x_rows"] if recomputes else [])
        received = self._exchange(sends, moved)

        results, weight_grads = [], []
        for d, ((values, _), recv, ctx) in enumerate(zip(bound, received, ctxs)):
            args = dict(zip(names, values))
            rows = self._routed_rows(recv["routes"])
            inputs = [recv[n] for n in ["recv_rows"] + moved]
            inputs += [args[w] for w in _WEIGHT_NAMES]
            if not recomputes:
                for name, cols in [("routed_x", hidden), ("gate", inter), ("up", inter),
                                   ("hidden", inter)]:
                    inputs.append(self._saved_rows(ctx, d, name, [rows, cols]))
            grads = [_poisoned(args[w].shape, "bf16") for w in _WEIGHT_NAMES]
            outputs = [_poisoned((rows, hidden), "bf16"), _poisoned((rows,), "f32"),
                       _poisoned((rows,), "i32"), _poisoned((rows,), "i32")] + grads
            self._invoke(f"{fn.name}__ep_experts", inputs, outputs)
            results.append(dict(zip(["d_routed_x", "d_route_weights", "dest_rank",
                                     "dest_row"], outputs)))
            weight_grads.append(dict(zip(_WEIGHT_NAMES, grads)))
        back = self._return(results, [t for _, t in bound],
                            [("d_routed_x", (hidden,), "bf16"),
                             ("d_route_weights", (), "f32")])

        all_grads = []
        for r, ((values, tokens), ret, ctx, d_out) in enumerate(
                zip(bound, back, ctxs, d_outs)):
            args = dict(zip(names, values))
            inputs = [args["x"], args["top_experts"]]
            shared_grads = []
            if shared:
                inputs += [args[f"shared_{w}"] for w in _WEIGHT_NAMES]
                if not recomputes:
                    s_inter = args["shared_gate_weights"].shape[0]
                    inputs += [self._saved_rows(ctx, r, n, [tokens, s_inter])
                               for n in ("shared_gate", "shared_up", "shared_hidden")]
                shared_grads = [_poisoned(args[f"shared_{w}"].shape, "bf16")
                                for w in _WEIGHT_NAMES]
            inputs += [d_out, ret["d_routed_x"], ret["d_route_weights"]]
            d_x = _poisoned((tokens, hidden), "bf16")
            d_rw = _poisoned((tokens, info.top_k), "f32")
            self._invoke(f"{fn.name}__ep_combine", inputs, [d_x, d_rw] + shared_grads)
            grads = Gradients(x=d_x, router_weights=d_rw, **weight_grads[r])
            for w, g in zip(_WEIGHT_NAMES, shared_grads):
                grads[f"shared_{w}"] = g
            all_grads.append(grads)
        return all_grads

    @staticmethod
    def _saved_rows(ctx, rank, name, shape):
        """A saved tensor of rank `rank`'s context, checked against `shape`."""
        if name not in ctx.saved:
            raise ValueError(f"ctxs[{rank}]: the saved tensor {name!r} is missing (was "
                             "the context made by this layer's forward_group?)")
        value = ctx.saved[name]
        if not isinstance(value, np.ndarray) or not is_bf16(value.dtype) \
                or list(value.shape) != list(shape) or not value.flags.c_contiguous \
                or not value.flags.aligned:
            raise ValueError(f"ctxs[{rank}].saved[{name!r}]: expected a C-contiguous, "
                             f"aligned bf16 array of shape {list(shape)} (the rows this "
                             "rank's experts received in the group's forward)")
        return value


def compile_cpu(source, name, function, options, recv_capacity=None):
    """The CompiledLayer of `function` in moe IR `source` (`name` for
    diagnostics), with `options` as the CPU target takes them; for ep > 1 a
    CompiledGroupLayer with the receive capacity `recv_capacity`."""
    module = _extensions.compiler().Module.parse(source, name)
    stages = {"moe": str(module)}
    infos = {f.name: f for f in module.functions()}
    if function in infos and infos[function].precision != "bf16" and infos[function].ep != 1:
        raise ValueError(f"@{function}: an expert-parallel FP8 layer (precision="
                         f"{infos[function].precision!r}) is not supported yet")
    module.run_pipeline("moe-generate-backward{recompute=true}" if options.recompute
                        else "moe-generate-backward")
    infos = {f.name: f for f in module.functions()}
    forward = infos.get(f"{function}_forward")
    expert_parallel = forward is not None and forward.ep > 1
    if recv_capacity is not None and not expert_parallel:
        raise ValueError(f"recv_capacity: the receive capacity of an expert-parallel "
                         f"layer (ep > 1); @{function} is not one")
    if expert_parallel:
        # The layer runs as the stages of one fused layer op (an unfused
        # chain computes the same, bit for bit).
        module.run_pipeline("moe-fuse-layer")
    stages["training"] = str(module)
    if expert_parallel:
        return CompiledGroupLayer(module, stages, function, options, recv_capacity)
    return CompiledLayer(module, stages, function, options)
