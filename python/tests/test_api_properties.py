# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Property tests of the Python API: generated wrong arguments — dtypes,
shapes, strides, alignment, devices, aliasing, types, out-of-range ints —
for mok.LayerSpec, mok.CompileOptions and mok.compile, the CPU layer,
mok.torch, GpuLayer's torch-level checks and the runtime extension's
checks (mok._runtime, no GPU). Each case must raise an exception whose
message names the argument, or, where the input is valid after all (a
read-only array, inputs sharing memory, a non-contiguous tensor mok.torch
copies), give exactly the result of the plain input: never a crash, never
a wrong result. Cases are seeded (properties.py: MOK_PROPERTY_SEED,
MOK_PROPERTY_CASES). Layers loaded on the stand-in driver are in
test_runtime_driver.py; the GPU's own cases in gpu/."""
import dataclasses
import json
import math

import numpy as np
import pytest

import mok
from mok import _runtime as rt
from mok._options import DISPATCH, GPU_TARGETS
from mok._spec import MAX_SIZE
from properties import (CASES, CPU, CUDA0, DTYPES, WRONG_TYPES, Producer, backing, dense,
                        expect, generator, misaligned, strided, succeed, where)

#===----------------------------------------------------------------------===#
# mok.LayerSpec
#===----------------------------------------------------------------------===#

SPEC_FIELDS = [f.name for f in dataclasses.fields(mok.LayerSpec)]
_INT_POOL = [1, 2, 3, 4, 8, 16, 64, 0, -1, -(2**40), MAX_SIZE, MAX_SIZE + 1, 2**62,
             10**30, True, False, 2.0, 2.5, float("nan"), float("inf"), "8", None, [8],
             np.int64(8), np.float32(2.0)]
_LIMIT_POOL = [0.5, 7.0, 1, 1e300, 10**400, -1.0, 0, 0.0, float("nan"), float("inf"),
               -float("inf"), True, "1.0", None, np.float32(0.5)]
_DTYPE_POOL = ["int32", "int64", "int8", "INT32", None, 32, np.int32]
_PRECISION_POOL = ["bf16", "mxfp8", "fp8", "fp4", "MXFP8", None, 8, b"fp8"]


def _is_int(v, low, high):
    return type(v) is int and low <= v <= high


def _positive_finite(v):
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(float(v)) and float(v) > 0
    except OverflowError:
        return False


def _spec_valid(kw):
    """LayerSpec's rules, restated independently of its code."""
    sizes = ("hidden", "intermediate", "experts", "top_k", "padding", "ep")
    if not all(_is_int(kw[n], 1, MAX_SIZE) for n in sizes):
        return False
    if kw["shared_intermediate"] is not None and not _is_int(kw["shared_intermediate"], 1,
                                                             MAX_SIZE):
        return False
    if kw["tokens"] is not None and not _is_int(kw["tokens"], 0, MAX_SIZE):
        return False
    if kw["top_k"] > kw["experts"] or kw["experts"] % kw["ep"]:
        return False
    if kw["padding"] & (kw["padding"] - 1):
        return False
    if kw["max_tokens"] is not None and (not _is_int(kw["max_tokens"], 1, MAX_SIZE)
                                         or kw["tokens"] is not None):
        return False
    t = kw["tokens"] or kw["max_tokens"] or 0
    if t * kw["top_k"] > MAX_SIZE:
        return False
    if t * kw["top_k"] + kw["experts"] // kw["ep"] * (kw["padding"] - 1) > MAX_SIZE:
        return False
    if kw["swiglu_limit"] is not None and not _positive_finite(kw["swiglu_limit"]):
        return False
    if kw["recv_capacity"] is not None and (
            not _is_int(kw["recv_capacity"], 1, MAX_SIZE) or kw["ep"] == 1
            or kw["recv_capacity"] + kw["experts"] // kw["ep"] * (kw["padding"] - 1)
            > MAX_SIZE):
        return False
    precision = kw["precision"]
    if type(precision) is not str or precision not in ("bf16", "mxfp8", "fp8"):
        return False
    if precision != "bf16":
        block = 32 if precision == "mxfp8" else 128
        if kw["hidden"] % block or kw["intermediate"] % block or kw["padding"] % block:
            return False
    return kw["expert_id_dtype"] in ("int32", "int64") and type(kw["expert_id_dtype"]) is str


def _spec_kwargs(g):
    kw = dict(hidden=g.choice([16, 64, 256]), intermediate=g.choice([8, 32, 128]),
              experts=g.choice([4, 8, 16]), top_k=g.choice([1, 2, 4]),
              tokens=g.choice([None, 1, 6, 300]), shared_intermediate=g.choice([None, 8]),
              swiglu_limit=g.choice([None, 1.0]), padding=g.choice([1, 8, 64, 128]),
              ep=g.choice([1, 1, 2]), expert_id_dtype=g.choice(["int32", "int64"]),
              max_tokens=g.choice([None, None, 8, 300]),
              recv_capacity=g.choice([None, None, 64]),
              precision=g.choice(["bf16", "bf16", "mxfp8", "fp8"]))
    for name in g.sample(SPEC_FIELDS, g.randint(1, 3)):
        pool = (_LIMIT_POOL if name == "swiglu_limit" else
                _DTYPE_POOL if name == "expert_id_dtype" else
                _PRECISION_POOL if name == "precision" else _INT_POOL)
        kw[name] = g.choice(pool)
    return kw


def test_layer_spec_accepts_exactly_the_valid_fields():
    g = generator("spec")
    for case in range(CASES):
        kw = _spec_kwargs(g)
        label = f"{where('spec', case)} LayerSpec(**{kw!r})"
        if _spec_valid(kw):
            spec = succeed(label, lambda: mok.LayerSpec(**kw))
            assert dataclasses.asdict(spec) == kw, label
        else:
            expect(label, lambda: mok.LayerSpec(**kw),
                   [f"LayerSpec.{n}:" for n in SPEC_FIELDS])


def test_valid_specs_of_any_size_parse():
    """Every spec LayerSpec accepts, up to its largest sizes, is IR the
    compiler parses (no crash, no overflowed type)."""
    compiler = pytest.importorskip("mok._mok")
    g = generator("spec-parse")
    for case in range(CASES // 5):
        kw = dict(hidden=g.choice([1, 7, 4096, MAX_SIZE]),
                  intermediate=g.choice([1, 3, 2048, MAX_SIZE]),
                  experts=g.choice([1, 2, 256, 4096]), top_k=1,
                  tokens=g.choice([None, 0, 1, MAX_SIZE]), padding=1,
                  shared_intermediate=g.choice([None, 1, MAX_SIZE]),
                  swiglu_limit=g.choice([None, 1e-30, 3.4e38, 1e300]))
        spec = mok.LayerSpec(**kw)
        label = f"{where('spec-parse', case)} {spec}"
        module = succeed(label, lambda: compiler.Module.parse(spec.to_mlir(), "<spec>"))
        (fn,) = [f for f in module.functions() if f.name == "moe_layer"]
        assert fn.experts == spec.experts and fn.top_k == spec.top_k, label


#===----------------------------------------------------------------------===#
# mok.CompileOptions and mok.compile's arguments
#===----------------------------------------------------------------------===#

OPTION_FIELDS = {f.name: f for f in dataclasses.fields(mok.CompileOptions)}
_BOOL_POOL = [True, False, True, False, 1, 0, None, "yes", np.bool_(True)]
_DISPATCH_POOL = ["auto", "fused", "copy", "auto", "FUSED", "", None, 1, True]
_TOOLKIT_POOL = [None, None, "/usr/local/cuda", "", 5, b"/usr/local/cuda", ["/x"]]
_TIMEOUT_POOL = [0, 0, 250, 3600000, 3600001, -1, None, True, 2.5, "250", 2**40]


def _options_valid(kw):
    merged = {n: f.default for n, f in OPTION_FIELDS.items()}
    merged.update(kw)
    if any(type(merged[n]) is not bool for n, f in OPTION_FIELDS.items() if f.type is bool):
        return False
    if type(merged["dispatch"]) is not str or merged["dispatch"] not in DISPATCH:
        return False
    toolkit = merged["toolkit"]
    if toolkit is not None and (type(toolkit) is not str or not toolkit):
        return False
    timeout = merged["barrier_timeout_ms"]
    if type(timeout) is not int or not 0 <= timeout <= 3600000:
        return False
    if merged["multicast"] and merged["warp_specialize"]:
        return False
    gemm = merged["warp_specialize"] or merged["dispatch"] == "fused" or merged["multicast"]
    return not (gemm and (not merged["tensor_cores"] or merged["training"]))


def _option_kwargs(g):
    kw = {}
    for name in g.sample(list(OPTION_FIELDS), g.randint(1, 4)):
        kw[name] = g.choice(_DISPATCH_POOL if name == "dispatch" else
                            _TOOLKIT_POOL if name == "toolkit" else
                            _TIMEOUT_POOL if name == "barrier_timeout_ms" else _BOOL_POOL)
    return kw


def test_compile_options_accept_exactly_the_valid_fields():
    g = generator("options")
    for case in range(CASES):
        kw = _option_kwargs(g)
        label = f"{where('options', case)} CompileOptions(**{kw!r})"
        if not _options_valid(kw):
            expect(label, lambda: mok.CompileOptions(**kw),
                   [f"CompileOptions.{n}:" for n in OPTION_FIELDS])
            continue
        options = succeed(label, lambda: mok.CompileOptions(**kw))
        target = g.choice(["cpu", "sm_90a", "sm_100a", "sm_80", "", None, 90, "SM_90A"])
        if target in ("cpu",) + GPU_TARGETS:
            try:
                options.for_target(target)
            except ValueError as e:  # a refusal names the option (recompute and
                # main_grads imply training on GPU targets, which the GEMM
                # options are refused with)
                assert str(e).startswith("CompileOptions."), f"{label}: {e}"
        else:
            expect(f"{label}.for_target({target!r})", lambda: options.for_target(target),
                   ["target: expected"])


_SPEC = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, tokens=6)


def test_compile_refuses_bad_arguments_by_name_before_compiling():
    """Each call has at least one bad argument: it must be refused, by name,
    before anything is compiled (the calls are instant)."""
    g = generator("compile")
    bad = [
        # (a str is IR text: valid, as a type)
        (lambda: dict(layer=g.choice([v for v in WRONG_TYPES if not isinstance(v, str)]
                                     + [np.zeros(3)])), ["layer:"]),
        (lambda: dict(target=g.choice(["sm_80", "cuda", "", None, 90, ["cpu"]])),
         ["target:"]),
        (lambda: dict(options=g.choice(WRONG_TYPES[1:] + [{"training": True}])),
         ["options:"]),
        (lambda: dict(function=g.choice(["", None, 3, b"f", ["moe_layer"]])), ["function:"]),
        (lambda: {g.choice(["trainng", "tensor_core", "chip", "cache", "opt"]): True},
         ["unknown compile option"]),
        (lambda: dict(fuse_dispatch=g.choice([1, "yes", 0.0])), ["fuse_dispatch:"]),
        (lambda: dict(fuse_dispatch=True, dispatch="fused"), ["fuse_dispatch:"]),
        (lambda: {g.choice(list(OPTION_FIELDS)): object()}, ["CompileOptions."]),
        (lambda: dict(layer=mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2,
                                          tokens=0), target=g.choice(GPU_TARGETS)),
         ["LayerSpec.tokens = 0"]),
    ]
    for case in range(CASES):
        make, names = g.choice(bad)
        kw = dict(layer=_SPEC, target=g.choice(["cpu", "sm_90a"]), cache_dir="/nonexistent")
        kw.update(make())
        layer = kw.pop("layer")
        label = f"{where('compile', case)} mok.compile({layer!r}, **{kw!r})"
        expect(label, lambda: mok.compile(layer, **kw), names)


#===----------------------------------------------------------------------===#
# The CPU layer
#===----------------------------------------------------------------------===#

CPU_SPECS = {
    "fixed": mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, tokens=6,
                           shared_intermediate=8),
    "dynamic": mok.LayerSpec(hidden=16, intermediate=8, experts=5, top_k=3, padding=4,
                             swiglu_limit=1.0, expert_id_dtype="int64"),
}


@pytest.fixture(scope="module")
def cpu_layers():
    return {name: mok.compile(spec) for name, spec in CPU_SPECS.items()}


def _good_cpu_args(layer, spec, rng, tokens):
    """Valid arguments of `layer` with random values (some -1 routes)."""
    args = {}
    for name, info in zip(layer.arg_names, layer._infer.args):
        shape = [tokens if d < 0 else d for d in info.shape]
        if name == "top_experts":
            ids = np.stack([rng.permutation(spec.experts)[:spec.top_k] for _ in range(tokens)]) \
                if tokens else np.zeros((0, spec.top_k))
            ids[rng.random(ids.shape) < 0.1] = -1
            args[name] = ids.astype(np.int32 if info.dtype == "i32" else np.int64)
        elif info.dtype == "f32":
            args[name] = rng.random(shape).astype(np.float32)
        else:
            args[name] = mok.to_bf16(rng.standard_normal(shape) * 0.3)
    return args


_WRONG_DTYPES = [np.float64, np.float16, np.int8, np.int16, np.uint16, np.int32, np.int64,
                 np.uint32, np.bool_, np.complex64, np.float32, object]


def _mutate_cpu_argument(g, rng, layer, spec, args):
    """(kind, name, args', names the error must contain or None if the
    arguments are still valid). Mutates one argument, or the call."""
    names = list(layer.arg_names)
    name = g.choice(names)
    a = args[name]
    out = dict(args)
    kind = g.choice(["dtype", "shape", "rank", "strided", "fortran", "misaligned",
                     "type", "byteorder", "ids", "readonly", "alias", "view", "missing",
                     "unknown", "twice", "positional"])
    bf16 = a.dtype == np.uint16
    if kind == "dtype":
        dtype = g.choice([d for d in _WRONG_DTYPES if np.dtype(d) != a.dtype
                          and not (bf16 and np.dtype(d) == np.uint16)])
        out[name] = np.zeros(a.shape, dtype)
        return kind, name, out, [f"{name}:"]
    if kind == "shape":
        shape = list(a.shape)
        d = g.randrange(len(shape))
        if d == 0 and spec.tokens is None and name in ("x", "top_experts", "router_weights"):
            d = len(shape) - 1  # T is free for a dynamic layer: a fixed dimension
        shape[d] = shape[d] + g.choice([-1, 1, 2, 7]) if shape[d] > 1 else shape[d] + 1
        out[name] = np.zeros(shape, a.dtype)
        return kind, name, out, [f"{name}: expected shape"]
    if kind == "rank":
        out[name] = a.reshape(-1) if a.ndim > 1 else a.reshape(1, -1)
        if g.random() < 0.3:
            out[name] = np.array(a.flat[0] if a.size else 0, a.dtype)  # 0-d
        return kind, name, out, [f"{name}:"]
    if kind == "strided":
        if a.size < 2 or a.shape[-1] < 2:
            return kind, name, out, None  # every step of size-1 dims is contiguous
        out[name] = strided(a, g.choice([2, 3]))
        return kind, name, out, [f"{name}: expected a C-contiguous array"]
    if kind == "fortran":
        f = np.asfortranarray(a)
        if f.flags.c_contiguous:
            return kind, name, out, None
        out[name] = f
        return kind, name, out, [f"{name}: expected a C-contiguous array"]
    if kind == "misaligned":
        # (an array without elements is aligned whatever its address)
        out[name] = misaligned(a, g.choice(range(1, a.itemsize))) if a.itemsize > 1 else a
        return kind, name, out, ([f"{name}: expected an array aligned"]
                                 if a.itemsize > 1 and a.size else None)
    if kind == "type":
        value = g.choice(WRONG_TYPES + [a.tolist(), memoryview(a.tobytes())])
        out[name] = value
        return kind, name, out, [f"{name}:"]
    if kind == "byteorder":
        out[name] = a.astype(a.dtype.newbyteorder())
        return kind, name, out, [f"{name}: expected dtype"]
    if kind == "ids":
        if not args["top_experts"].size:
            return kind, name, out, None
        ids = args["top_experts"].copy()
        bad = g.choice([spec.experts, spec.experts + g.randint(1, 2**20), -2,
                        -g.randint(3, 2**20)])
        ids.flat[g.randrange(ids.size)] = bad
        out["top_experts"] = ids
        return kind, "top_experts", out, [f"top_experts: expert id {bad}"]
    if kind == "readonly":
        r = a.copy()
        r.flags.writeable = False
        out[name] = r
        return kind, name, out, None
    if kind == "alias":
        # Two inputs of one dtype and shape given the same array: they are
        # only read; the result must be that of two equal copies.
        same = [n for n in names if n != name and args[n].shape == a.shape
                and args[n].dtype == a.dtype]
        if same:
            out[g.choice(same)] = a
        return kind, name, out, None
    if kind == "view":
        # Rows of a larger array: contiguous and aligned, not its own memory.
        big = np.concatenate([a, a, a]) if a.ndim else a
        out[name] = big[len(a):2 * len(a)] if a.ndim else a
        return kind, name, out, None
    if kind == "missing":
        del out[name]
        return kind, name, out, ["missing argument", name]
    if kind == "unknown":
        out[g.choice(["X", "weights", "gate", "top_expert", "out"])] = a
        return kind, name, out, ["unexpected argument"]
    if kind == "twice":
        return kind, name, out, ["given twice"]
    return kind, name, out, ["expected at most"]  # positional


def _call_cpu(layer, entry, args, kind, name):
    if kind == "twice":
        i = list(layer.arg_names).index(name)
        positional = [args[n] for n in layer.arg_names[:i + 1]]
        return entry(*positional, **args)
    if kind == "positional":
        return entry(*[args[n] for n in layer.arg_names], args["x"])
    return entry(**args)


def _copies(args):
    return {n: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
            for n, v in args.items()}


def test_cpu_layer_arguments(cpu_layers):
    g = generator("cpu")
    rng = np.random.default_rng(g.getrandbits(32))
    for case in range(CASES):
        which = g.choice(list(CPU_SPECS))
        layer, spec = cpu_layers[which], CPU_SPECS[which]
        tokens = spec.tokens if spec.tokens is not None else g.choice([0, 1, 7])
        args = _good_cpu_args(layer, spec, rng, tokens)
        kind, name, mutated, names = _mutate_cpu_argument(g, rng, layer, spec, args)
        entry_name = g.choice(["__call__", "forward"])
        entry = getattr(layer, entry_name)
        label = f"{where('cpu', case)} {which}.{entry_name}: {kind} of {name}"
        if names is None:
            # Still valid: exactly the result of plain copies.
            got = succeed(label, lambda: _call_cpu(layer, entry, mutated, kind, name))
            want = entry(**_copies(mutated))
            got, want = (got[0], want[0]) if entry_name == "forward" else (got, want)
            assert np.array_equal(got, want), f"{label}: a different result"
        else:
            expect(label, lambda: _call_cpu(layer, entry, mutated, kind, name), names)


def test_cpu_backward_arguments(cpu_layers):
    g = generator("cpu-backward")
    rng = np.random.default_rng(g.getrandbits(32))
    contexts = {}
    for which, layer in cpu_layers.items():
        spec = CPU_SPECS[which]
        args = _good_cpu_args(layer, spec, rng, spec.tokens or 5)
        out, ctx = layer.forward(**args)
        contexts[which] = (ctx, mok.to_bf16(rng.standard_normal(out.shape)),
                           layer.backward(ctx, mok.to_bf16(np.zeros(out.shape))))
    for case in range(CASES):
        which = g.choice(list(cpu_layers))
        layer = cpu_layers[which]
        ctx, d_out, _ = contexts[which]
        saved = dict(ctx.saved)
        kind = g.choice(["saved-dtype", "saved-shape", "saved-strided", "saved-missing",
                         "saved-type", "d_out", "ctx-type", "tensors", "aligned-saved",
                         "readonly"])
        label = f"{where('cpu-backward', case)} {which}: {kind}"
        victim = g.choice(sorted(saved))
        if kind == "readonly":
            ro = {n: v.copy() for n, v in saved.items()}
            for v in ro.values():
                v.flags.writeable = False
            d = d_out.copy()
            d.flags.writeable = False
            got = succeed(label, lambda: layer.backward(
                mok.Context(ctx.inputs, ro, ctx.tokens), d))
            want = layer.backward(ctx, d_out)
            assert all(np.array_equal(got[n], want[n]) for n in want), label
            continue
        if kind == "d_out":
            bad = g.choice([d_out.astype(np.float32), d_out[:-1], strided(d_out),
                            d_out.tolist(), None, misaligned(d_out)])
            expect(label, lambda: layer.backward(ctx, bad), ["d_out:"])
            continue
        if kind == "ctx-type":
            bad = g.choice([None, dict(ctx.inputs), ctx.tensors(), "ctx"])
            expect(label, lambda: layer.backward(bad, d_out), ["ctx:"])
            continue
        if kind == "tensors":
            tensors = ctx.tensors()
            bad = g.choice([tensors[:-1], tensors + [tensors[0]], []])
            expect(label, lambda: layer.context_from_tensors(bad), ["tensors:"])
            continue
        v = saved[victim]
        if kind == "saved-dtype":
            saved[victim] = v.astype(np.float32)
        elif kind == "saved-shape":
            saved[victim] = np.zeros((v.shape[0] + 1,) + v.shape[1:], v.dtype)
        elif kind == "saved-strided":
            saved[victim] = strided(v) if v.shape[-1] > 1 else v.reshape(-1)
        elif kind == "saved-type":
            saved[victim] = g.choice([None, v.tolist(), 3])
        elif kind == "aligned-saved":
            saved[victim] = misaligned(v)
        else:
            del saved[victim]
        broken = mok.Context(ctx.inputs, saved, ctx.tokens)
        expect(label, lambda: layer.backward(broken, d_out), [repr(victim), "ctx"])


#===----------------------------------------------------------------------===#
# mok.torch on the CPU target
#===----------------------------------------------------------------------===#

def test_torch_module_arguments():
    torch = pytest.importorskip("torch")
    import mok.torch
    g = generator("torch")
    spec = mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, padding=4)
    moe = mok.torch.MoELayer(spec)
    gen = torch.Generator().manual_seed(g.getrandbits(32))

    def inputs(tokens):
        x = torch.randn(tokens, spec.hidden, generator=gen).to(torch.bfloat16)
        top = torch.stack([torch.randperm(spec.experts, generator=gen)[:spec.top_k]
                           for _ in range(tokens)]).int()
        rw = torch.rand(tokens, spec.top_k, generator=gen)
        return dict(x=x, top_experts=top, router_weights=rw)

    for case in range(CASES // 2):
        args = inputs(g.choice([1, 5, 9]))
        name = g.choice(list(args))
        t = args[name]
        kind = g.choice(["dtype", "shape", "meta", "numpy", "type", "noncontiguous",
                         "ids", "requires_grad", "expanded"])
        label = f"{where('torch', case)} {kind} of {name}"
        bad = dict(args)
        if kind == "noncontiguous":
            # mok.torch copies: the same result and gradients as contiguous.
            bad[name] = t.t().contiguous().t() if t.shape[0] > 1 and t.shape[1] > 1 else t
            x = bad["x"].detach().requires_grad_(True)
            bad["x"] = x
            out = succeed(label, lambda: moe(**bad))
            out.float().sum().backward()
            x2 = args["x"].detach().clone().requires_grad_(True)
            ref = moe(**dict(args, x=x2))
            ref.float().sum().backward()
            assert torch.equal(out, ref) and torch.equal(x.grad, x2.grad), label
            continue
        if kind == "requires_grad":
            if not t.is_floating_point():
                continue
            bad[name] = t.clone().requires_grad_(True)
            out = succeed(label, lambda: moe(**bad))
            assert torch.equal(out, moe(**args)), label
            continue
        names = [f"{name}:"]
        if kind == "dtype":
            bad[name] = t.to(g.choice([d for d in (torch.float64, torch.float16, torch.int64,
                                                   torch.int32, torch.bfloat16, torch.uint8,
                                                   torch.bool) if d != t.dtype]))
        elif kind == "shape":
            bad[name] = torch.zeros(t.shape[0], t.shape[1] + 1, dtype=t.dtype)
        elif kind == "meta":
            bad[name] = t.to("meta")
        elif kind == "numpy":
            bad[name] = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        elif kind == "type":
            bad[name] = g.choice(WRONG_TYPES)
        elif kind == "expanded":
            # One more token than the other arguments: the first argument
            # that disagrees is named.
            bad[name] = t[:1].expand(t.shape[0] + 1, -1)
            names = [f"{n}: expected shape" for n in args]
        else:
            ids = args["top_experts"].clone()
            ids.view(-1)[g.randrange(ids.numel())] = g.choice([spec.experts, -2, 2**30])
            bad["top_experts"], names = ids, ["top_experts: expert id"]
        expect(label, lambda: moe(**bad), names)


def test_torch_function_refuses_other_layers():
    torch = pytest.importorskip("torch")
    import mok.torch
    x = torch.zeros(2, 16, dtype=torch.bfloat16)
    for layer in WRONG_TYPES + [torch.nn.Linear(2, 2)]:
        expect(f"MoEFunction.apply({type(layer).__name__})",
               lambda: mok.torch.MoEFunction.apply(layer, {}, x, x, x), ["layer:"])
        expect(f"GpuMoEFunction.apply({type(layer).__name__})",
               lambda: mok.torch.GpuMoEFunction.apply(layer, {}, x, x, x), ["layer:"])
    for kw in [dict(spec="spec"), dict(spec=_SPEC, target="cuda"), dict(spec=_SPEC, target=None),
               dict(spec=mok.LayerSpec(hidden=16, intermediate=8, experts=4, top_k=2, ep=2))]:
        expect(f"MoELayer(**{kw})", lambda: mok.torch.MoELayer(**kw), ["spec", "target"])


#===----------------------------------------------------------------------===#
# GpuLayer's own checks (torch tensors on the CPU, the runtime's checks, no
# launch: test_runtime_ext.py's stand-in for a loaded layer)
#===----------------------------------------------------------------------===#

def test_gpu_layer_arguments(monkeypatch):
    torch = pytest.importorskip("torch")
    from test_runtime_ext import MULTI, _cpu_gpu_layer
    g = generator("gpu-layer")
    layer, torch = _cpu_gpu_layer(MULTI, monkeypatch)
    params = {p["name"]: p for p in MULTI["params"]}
    torch_dtypes = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32}

    def good():
        return {p["name"]: torch.zeros(p["shape"], dtype=torch_dtypes[p["dtype"]])
                for p in layer.inputs}

    for case in range(CASES):
        args = good()
        name = g.choice(list(args))
        p, t = params[name], args[name]
        kind = g.choice(["dtype", "shape", "meta", "numpy", "numpy-object", "type",
                         "noncontiguous", "expanded", "out-alias", "outputs-alias",
                         "out-requires-grad", "out-strided", "unknown-output", "positional"])
        label = f"{where('gpu-layer', case)} {kind} of {name}"
        calls = len(layer._layer.calls)
        call = lambda: layer(**args)  # noqa: E731
        names = [f"{name}:"]
        if kind == "dtype":
            args[name] = t.to(torch.float64)
        elif kind == "shape":
            args[name] = torch.zeros([d + 1 for d in t.shape], dtype=t.dtype)
        elif kind == "meta":
            args[name] = t.to("meta")
        elif kind == "numpy":
            args[name] = np.zeros(p["shape"], np.float64)
        elif kind == "numpy-object":
            args[name] = np.zeros(p["shape"], object)
        elif kind == "type":
            args[name] = g.choice(WRONG_TYPES)
            names = [f"{name}:", "unexpected or repeated", "expected at most"]
        elif kind == "noncontiguous":
            args[name] = torch.zeros([t.shape[0], 2 * t.shape[1]], dtype=t.dtype)[:, ::2]
        elif kind == "expanded":
            args[name] = t[:1].expand(*t.shape)
        elif kind == "out-alias":
            x = torch.zeros(4, 64, dtype=torch.bfloat16)
            args["x"] = x
            call = lambda: layer(**args, out=x)  # noqa: E731
            names = ["out: overlaps the input x"]
        elif kind == "outputs-alias":
            gate = torch.zeros(8, 16, dtype=torch.bfloat16)
            call = lambda: layer(**args, outputs={  # noqa: E731
                "gate": gate, "d_router_weights": gate.view(torch.float32).view(-1)[:8]
                .view(4, 2)})
            names = ["d_router_weights: overlaps the output gate"]
        elif kind == "out-requires-grad":
            call = lambda: layer(**args, out=torch.zeros(  # noqa: E731
                4, 64, dtype=torch.bfloat16, requires_grad=True))
            names = ["out: must not require grad"]
        elif kind == "out-strided":
            call = lambda: layer(**args, out=torch.zeros(  # noqa: E731
                64, 4, dtype=torch.bfloat16).t())
            names = ["out: expected a contiguous tensor"]
        elif kind == "unknown-output":
            call = lambda: layer(**args, outputs={"hidden": t})  # noqa: E731
            names = ["outputs: unknown output 'hidden'"]
        else:
            call = lambda: layer(*args.values(), t)  # noqa: E731
            names = ["expected at most 3 arguments"]
        expect(label, call, names, (TypeError, ValueError, mok.MokRuntimeError))
        assert len(layer._layer.calls) == calls, f"{label}: launched"


#===----------------------------------------------------------------------===#
# The runtime extension's checks (mok._runtime, no driver)
#===----------------------------------------------------------------------===#

def _param(name, role, dtype, shape):
    return {"name": name, "role": role, "dtype": dtype, "shape": shape}


# A kernel with extra outputs, a workspace, and its input x read through a
# tensor map (TMA's 16-byte rules): hand-written, as the compiler writes it.
RT_META = {"mok_metadata_version": 3, "function": "moe_layer", "kernel": "k", "block": 256,
           "cooperative": True, "dynamic_shared_memory": 0, "params": [
               _param("x", "input", "bf16", [4, 64]),
               _param("top_experts", "input", "i32", [4, 2]),
               _param("router_weights", "input", "f32", [4, 2]),
               _param("out", "output", "bf16", [4, 64]),
               _param("gate", "output", "bf16", [8, 16]),
               _param("grid_barrier", "workspace", "i32", [2]),
               _param("d_router_weights", "output", "f32", [4, 2]),
               _param("tensor_maps", "tensor_maps", "i64", [16])],
           "tensor_maps": [{"buffer": "x", "rows": 4, "cols": 64, "row_stride": 64,
                            "box_rows": 4, "box_cols": 64}]}
RT_INPUTS = ["x", "top_experts", "router_weights"]
RT_EXTRA = ["gate", "d_router_weights"]
_RT_PARAMS = {p["name"]: p for p in RT_META["params"]}
# DLPack dtypes the runtime refuses (code, bits, lanes), and wrong ones it takes.
# (uint8, (1, 8, 1), is a runtime dtype: MXFP8's scale bytes.)
_BAD_DLPACK = [(0, 8, 1), (1, 16, 1), (2, 16, 1), (2, 64, 1), (5, 64, 1),
               (6, 8, 1), (4, 16, 2), (2, 32, 4), (0, 16, 1), (1, 32, 1), (9, 32, 1)]


def _rt_good(device=CPU):
    args = {n: dense(_RT_PARAMS[n]["shape"], _RT_PARAMS[n]["dtype"], device)
            for n in RT_INPUTS + RT_EXTRA}
    return args, dense(_RT_PARAMS["out"]["shape"], "bf16", device)


class _Misbehaving:
    """__dlpack_device__ returns (or raises) `device`; __dlpack__ returns
    (or raises) `export`."""

    def __init__(self, device, export):
        self.device, self.export = device, export

    def __dlpack_device__(self):
        if isinstance(self.device, Exception):
            raise self.device
        return self.device

    def __dlpack__(self, stream=None, **kwargs):
        if isinstance(self.export, Exception):
            raise self.export
        return self.export


def _rt_mutation(g, args, out):
    """Mutates one operand or the call: (kind, names the error must contain,
    or None for a still valid call, call(layer))."""
    names_all = RT_INPUTS + RT_EXTRA + ["out"]
    name = g.choice(names_all)
    t = out if name == "out" else args[name]
    p = _RT_PARAMS[name]
    code, bits = DTYPES[p["dtype"]]
    size = bits // 8
    tma = name == "x"

    def with_(value):
        if name == "out":
            return lambda layer: layer.check(args, out=value)
        return lambda layer: layer.check(dict(args, **{name: value}), out=out)

    kind = g.choice(["dtype", "other-runtime-dtype", "shape", "rank", "inner-stride",
                     "outer-gap", "zero-stride", "negative-stride", "offset-element",
                     "offset-byte", "type", "device", "big-rank", "missing", "unknown",
                     "first-output-named", "twice", "key-type", "alias-input",
                     "alias-output", "adjacent", "inputs-share", "huge-dim", "producer"])
    shape = list(p["shape"])
    if kind == "dtype":
        # (nanobind may refuse a type code it does not know as no array)
        return kind, [f"{name}: unsupported dtype", f"{name}: expected a DLPack array"], \
            with_(Producer(
            backing(t.memory.nbytes * 2), shape, g.choice(_BAD_DLPACK)))
    if kind == "other-runtime-dtype":
        other = g.choice([d for d in DTYPES if d != p["dtype"]])
        return kind, [f"{name}: expected dtype {p['dtype']}"], with_(dense(shape, other))
    if kind == "shape":
        d = g.randrange(len(shape))
        shape[d] += g.choice([-1, 1, 3])
        return kind, [f"{name}: expected shape"], with_(dense(shape, p["dtype"]))
    if kind == "rank":
        new = g.choice([shape[:1], shape + [1], [int(np.prod(shape))]])
        return kind, [f"{name}: expected rank"], with_(dense(new, p["dtype"]))
    if kind == "big-rank":
        return kind, [f"{name}: rank 5"], with_(dense(shape + [1, 1, 1], p["dtype"]))
    if kind == "huge-dim":
        return kind, [f"{name}: expected shape"], with_(Producer(
            backing(64), [2**62] + shape[1:], (code, bits, 1)))
    if kind == "inner-stride":
        step = g.choice([2, 3, 8])
        return kind, [f"{name}: the innermost dimension must be contiguous"], with_(
            Producer(backing(t.memory.nbytes * step), shape, (code, bits, 1),
                     [shape[1] * step, step]))
    if kind == "outer-gap":
        gap = g.choice([8, 16, 64])
        messages = [f"{name}: expected a dense row-major tensor"]
        if tma and (gap * size) % 16:
            messages = [f"{name}: the stride of dimension 0 must be a multiple of 16 bytes"]
        return kind, messages, with_(Producer(backing((shape[0] + 1) * (shape[1] + gap) * size),
                                              shape, (code, bits, 1), [shape[1] + gap, 1]))
    if kind == "zero-stride":
        return kind, [f"{name}: expected a dense row-major tensor"], with_(
            Producer(backing(t.memory.nbytes), shape, (code, bits, 1), [0, 1]))
    if kind == "negative-stride":
        mem = backing(t.memory.nbytes * 2)
        return kind, [f"{name}: expected a dense row-major tensor"], with_(
            Producer(mem, shape, (code, bits, 1), [-shape[1], 1],
                     offset=(shape[0] - 1) * shape[1] * size))
    if kind == "offset-element":
        # Aligned to the element, not to 16 bytes: only TMA minds.
        mem = backing(t.memory.nbytes + 64)
        value = Producer(mem, shape, (code, bits, 1), offset=size if size < 16 else 0)
        return kind, ([f"{name}: data must be 16-byte aligned"] if tma and size < 16
                      else None), with_(value)
    if kind == "offset-byte":
        mem = backing(t.memory.nbytes + 64)
        value = Producer(mem, shape, (code, bits, 1), offset=1)
        return kind, [f"{name}: data must be"], with_(value)
    if kind == "type":
        # (bytes and NumPy scalars export buffers: uint8 or 0-d arrays)
        return kind, [f"{name}: expected a DLPack array", f"{name}: unsupported dtype",
                      f"{name}: expected rank", f"{name}: expected dtype"], \
            with_(g.choice(WRONG_TYPES + [np.float32(1)]))
    if kind == "device":
        # Before loading, check() takes arrays on any device.
        return kind, None, with_(Producer(t.memory, shape, t.dtype,
                                          device=g.choice([CUDA0, (2, 3), (3, 0), (13, 0),
                                                           (10, 0)])))
    if kind == "producer":
        # A DLPack producer that misbehaves: a malformed device, or an
        # export that raises (torch refusing a tensor that requires grad).
        device = g.choice([(2,), None, ("a", "b"), [2, 0], (2.5, 0), (2**70, 0),
                           ValueError("device"), CUDA0, CPU])
        export = g.choice([RuntimeError("export"), None, 5])
        return kind, [f"{name}: __dlpack_device__() returned", f"{name}: its __dlpack",
                      f"{name}: expected a DLPack array"], with_(_Misbehaving(device, export))
    if kind == "missing":
        if name == "out":
            return kind, ["out: expected a DLPack array"], lambda layer: layer.check(args,
                                                                                      out=None)
        rest = {n: v for n, v in args.items() if n != name}
        return kind, [f"'{name}' is missing"], lambda layer: layer.check(rest, out=out)
    if kind == "unknown":
        bad = g.choice(["y", "gate_weights", "grid_barrier", "tensor_maps", ""])
        return kind, [f"unknown input or output '{bad}'"], lambda layer: layer.check(
            dict(args, **{bad: t}), out=out)
    if kind == "first-output-named":
        return kind, ["'out' is the layer's first output"], lambda layer: layer.check(
            dict(args, out=out), out=out)
    if kind == "twice":
        other = g.choice(RT_INPUTS + RT_EXTRA)
        return kind, [f"{other}: given twice"], lambda layer: layer.check(
            args, out=out, **{other: args[other]})
    if kind == "key-type":
        return kind, ["inputs: keys are operand names (str)"], lambda layer: layer.check(
            dict(args, **{}) | {g.choice([1, None, b"x"]): t}, out=out)
    if kind == "alias-input":
        # An output over an input's bytes.
        victim = g.choice(RT_EXTRA + ["out"])
        vp = _RT_PARAMS[victim]
        source = args[g.choice(RT_INPUTS)]
        alias = Producer(source.memory, vp["shape"], (*DTYPES[vp["dtype"]], 1))
        if victim == "out":
            return kind, [f"out: '{victim}'", "overlaps the input"], lambda layer: layer.check(
                args, out=alias)
        return kind, [f"outputs: '{victim}'", "overlaps the input"], lambda layer: layer.check(
            dict(args, **{victim: alias}), out=out)
    if kind == "alias-output":
        alias = Producer(args["gate"].memory, [4, 2], (*DTYPES["f32"], 1),
                         offset=g.choice([0, 16, 128]))
        return kind, ["outputs: 'd_router_weights'", "overlaps the output 'gate'"], \
            lambda layer: layer.check(dict(args, d_router_weights=alias), out=out)
    if kind == "adjacent":
        # gate right after out in one allocation: touching, not overlapping.
        mem = backing(512 + 256)
        o = Producer(mem, [4, 64], (4, 16, 1))
        gate = Producer(mem, [8, 16], (4, 16, 1), offset=512)
        return kind, None, lambda layer: layer.check(dict(args, gate=gate), out=o)
    # inputs-share: inputs may overlap each other (they are only read)
    ids = args["top_experts"]
    rw = Producer(ids.memory, [4, 2], (*DTYPES["f32"], 1))
    return kind, None, lambda layer: layer.check(dict(args, router_weights=rw), out=out)


def test_runtime_check_arguments():
    g = generator("runtime-check")
    layer = rt.Layer(json.dumps(RT_META))
    for case in range(CASES):
        args, out = _rt_good()
        kind, names, call = _rt_mutation(g, args, out)
        label = f"{where('runtime-check', case)} {kind}"
        if names is None:
            assert succeed(label, lambda: call(layer)) is None, label
        else:
            expect(label, lambda: call(layer), names, (TypeError, mok.MokRuntimeError))
        assert layer.check(*_rt_good()[:1], out=_rt_good()[1]) is None, label


def test_runtime_forward_before_load_and_devices():
    """forward takes CUDA arrays only (named by device), and refuses an
    unloaded layer by name after the arrays' checks."""
    g = generator("runtime-forward")
    layer = rt.Layer(json.dumps(RT_META))
    devices = [CPU, (3, 0), (13, 0), (10, 0), (7, 0), (2, 1), CUDA0]
    for case in range(CASES // 3):
        device = g.choice(devices)
        args, out = _rt_good(CUDA0)
        name = g.choice(RT_INPUTS + RT_EXTRA + ["out"])
        moved = Producer((out if name == "out" else args[name]).memory,
                         _RT_PARAMS[name]["shape"],
                         (*DTYPES[_RT_PARAMS[name]["dtype"]], 1), device=device)
        if name == "out":
            out = moved
        else:
            args[name] = moved
        stream = g.choice([0, 1, 0x7F0000001000, 2**64 - 1, -1, 2**64, "s", None, 1.5])
        label = f"{where('runtime-forward', case)} {name} on {device}, stream {stream!r}"
        bad_stream = not isinstance(stream, int) or not 0 <= stream < 2**64
        names = (["stream:"] if bad_stream else
                 [f"{name}: expected a CUDA array"] if device[0] != 2 else
                 ["layer: not loaded"])
        expect(label, lambda: layer.forward(args, out=out, stream=stream), names,
               (TypeError, mok.MokRuntimeError))


def test_runtime_scalar_arguments_are_named():
    """Every non-array argument of the extension: a wrong type or an int out
    of the C type's range is named, never nanobind's anonymous "incompatible
    function arguments"."""
    g = generator("runtime-scalars")
    layer = rt.Layer(json.dumps(RT_META))
    view = rt.weights_from_tensor(np.zeros((2, 4, 8), np.float32), "w")
    ints = [-1, 0, 2**31, 2**63, -(2**63) - 1, 2**64, True, 1.0, "0", None, [0]]
    calls = [
        (lambda v: layer.load(v, ".version 8.0"), "device:"),
        (lambda v: layer.load(0, v), "ptx:"),
        (lambda v: layer.set_ep_group(v, 0, 0), "size:"),
        (lambda v: layer.set_ep_group(1, v, 0), "rank:"),
        (lambda v: layer.set_ep_group(1, 0, v), "nccl_comm:"),
        (lambda v: layer.read_workspace(v), "name:"),
        (lambda v: layer.workspace_size(v), "name:"),
        (lambda v: layer.bind_weights(v, None), "name:"),
        (lambda v: layer.unbind_weights(v), "name:"),
        (lambda v: rt.device_sm_count(v), "device:"),
        (lambda v: rt.Layer(v), "metadata_json:"),
        (lambda v: view.element_address(v, 0, 0), "expert:"),
        (lambda v: view.element_address(0, 0, v), "col:"),
        (lambda v: rt.weights_from_tensor(np.zeros((2, 4, 8), np.float32), v), "name:"),
        (lambda v: rt.weights_per_expert([np.zeros((4, 8), np.float32)], v), "name:"),
    ]
    strs = [None, 0, b"x", ["x"], 1.5]
    for case in range(CASES // 3):
        call, name = g.choice(calls)
        textual = name in ("ptx:", "name:", "metadata_json:")
        value = g.choice(strs if textual else ints)
        label = f"{where('runtime-scalars', case)} {name} {value!r}"
        try:
            call(value)
        except (TypeError, mok.MokRuntimeError) as e:
            # A wrong type names the argument; an int out of the C type's
            # range too; an in-range value may get the runtime's own error
            # (no driver, a bad rank, an element outside the view).
            assert "incompatible function arguments" not in str(e), f"{label}: {e}"
            if isinstance(e, TypeError) or "expected an int from" in str(e) \
                    or "expected an address" in str(e):
                assert str(e).startswith(name), f"{label}: {e}"


def test_runtime_metadata_never_crashes():
    """Metadata mutated at random: parsed and checked, or refused by a
    MokRuntimeError saying "metadata" (or naming the argument's type)."""
    g = generator("metadata")
    text = json.dumps(RT_META)
    values = [None, True, -1, 0, 1, 2**31, 2**53, 2**64, 1e300, -1e300, 0.5, "", "x",
              [], {}, [1, [2]], {"a": None}]
    for case in range(CASES):
        meta = json.loads(text)
        for _ in range(g.randint(1, 3)):
            entries = [e for key in ("params", "tensor_maps")
                       if isinstance(meta.get(key), list) for e in meta[key]
                       if isinstance(e, dict)]
            target = g.choice(entries) if entries and g.random() < 0.6 else meta
            key = g.choice(list(target) + ["ep", "cluster", "experts", "access",
                                           "zero_before_first_launch"])
            if g.random() < 0.2:
                target.pop(key, None)
            else:
                target[key] = g.choice(values + [v for v in target.values()
                                                 if isinstance(v, (str, int))])
        raw = json.dumps(meta)
        if g.random() < 0.2:  # broken text
            cut = g.randrange(len(raw))
            raw = raw[:cut] + g.choice(["", "\x00", "}", "\"", "\\u12"]) + raw[cut + 1:]
        label = f"{where('metadata', case)} {raw[:200]}"
        try:
            layer = rt.Layer(raw)
        except mok.MokRuntimeError as e:
            assert "metadata" in str(e) and e.status == "MOK_ERROR_INVALID_ARGUMENT", \
                f"{label}: {e}"
            continue
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{label}: {type(e).__name__}: {e}") from e
        # Accepted: every operand list is readable, and a check names things.
        assert layer.output_names, label
        try:
            layer.check({}, out=None)
        except (TypeError, mok.MokRuntimeError) as e:
            assert ":" in str(e), label


def test_weight_views_arguments():
    g = generator("views")
    for case in range(CASES):
        e, rows, cols = g.randint(1, 4), g.randint(1, 9), g.choice([4, 8, 12, 16])
        base = np.zeros((e, rows, cols), np.float32)
        kind = g.choice(["ok", "rank", "inner", "odd-fc1", "type", "per-expert-shape",
                         "per-expert-dtype", "per-expert-empty", "per-expert-type",
                         "address", "row-stride"])
        label = f"{where('views', case)} {kind} [{e}, {rows}, {cols}]"
        if kind == "ok":
            v = succeed(label, lambda: rt.weights_from_tensor(base, "w"))
            i, r, c = g.randrange(e), g.randrange(rows), g.randrange(cols)
            assert v.element_address(i, r, c) == base[i, r, c:].ctypes.data, label
        elif kind == "rank":
            expect(label, lambda: rt.weights_from_tensor(base[0], "w"),
                   ["w: expected rank 3"], (mok.MokRuntimeError,))
        elif kind == "inner":
            s = strided(base) if cols > 1 else base[:, :, ::2]
            if cols > 1:
                expect(label, lambda: rt.weights_from_tensor(s, "w"),
                       ["w: the innermost dimension"], (mok.MokRuntimeError,))
        elif kind == "odd-fc1":
            odd = np.zeros((e, 2 * rows + 1, cols), np.float32)
            expect(label, lambda: rt.weights_split_fc1(odd, "fc1"),
                   ["fc1: a fused FC1"], (mok.MokRuntimeError,))
        elif kind == "type":
            # (bytes export a uint8 buffer of rank 1)
            expect(label, lambda: rt.weights_from_tensor(g.choice(WRONG_TYPES), "w"),
                   ["w: expected a DLPack array", "w: unsupported dtype", "w: expected rank"],
                   (TypeError, mok.MokRuntimeError))
        elif kind == "per-expert-shape":
            arrays = [np.zeros((rows, cols), np.float32) for _ in range(e)]
            arrays.append(np.zeros((rows + 1, cols), np.float32))
            expect(label, lambda: rt.weights_per_expert(arrays, "w"),
                   [f"w[{e}]: expected [rows, cols]"], (mok.MokRuntimeError,))
        elif kind == "per-expert-dtype":
            arrays = [np.zeros((rows, cols), np.float32) for _ in range(e)]
            arrays.append(np.zeros((rows, cols), np.int32))
            expect(label, lambda: rt.weights_per_expert(arrays, "w"),
                   [f"w[{e}]: dtype i32"], (mok.MokRuntimeError,))
        elif kind == "per-expert-empty":
            expect(label, lambda: rt.weights_per_expert(g.choice([[], ()]), "w"),
                   ["w: expected one [rows, cols] array per expert"], (mok.MokRuntimeError,))
        elif kind == "per-expert-type":
            expect(label, lambda: rt.weights_per_expert(g.choice([base, "w", 3, None]), "w"),
                   ["w: expected a list"], (TypeError,))
        elif kind == "address":
            v = rt.weights_from_tensor(base, "w")
            i = g.choice([-1, e, 2**62, -(2**63)])
            expect(label, lambda: v.element_address(i, 0, 0), ["is outside"],
                   (mok.MokRuntimeError,))
        else:
            bad = np.zeros((rows, cols + 1), np.float32)[:, :cols]  # row stride cols + 1
            if (cols + 1) * 4 % 16:
                expect(label, lambda: rt.weights_per_expert([bad], "w"),
                       ["w: row_stride must be a multiple of 16 bytes"], (mok.MokRuntimeError,))
