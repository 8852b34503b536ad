# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok._runtime, the runtime extension, on machines without a GPU: the driver
probe, layers created from compiled metadata, every argument check (through
NumPy arrays, and DLPack producers that claim bf16 or a CUDA device over
NumPy memory — never read by a kernel), weight views and their addresses,
binding views to layers, a layer's expert-parallel group, layers with
several outputs (and GpuLayer's handling of them, on the CPU with torch). The
GPU runs are in gpu/test_gpu_views.py."""
import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import mok
from mok import _runtime as rt

# Scalar GEMMs: the kernel reads the weights by pointer.
SCALAR = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=40, padding=8)
# Shapes that fit the tensor-core tiles: TMA + wgmma GEMMs.
TENSOR_CORE = mok.LayerSpec(hidden=128, intermediate=128, experts=4, top_k=2, tokens=40,
                            padding=64)
ROUTED = ("gate_weights", "up_weights", "down_weights")
NO_GPU = not os.path.exists("/dev/nvidiactl")


def _compile(spec, tmp_path_factory):
    try:
        return mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path_factory.mktemp("c")))
    except ImportError as e:  # a GPU machine without the carried mok-compile
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def scalar(tmp_path_factory):
    return _compile(SCALAR, tmp_path_factory)


@pytest.fixture(scope="module")
def tensor_core(tmp_path_factory):
    return _compile(TENSOR_CORE, tmp_path_factory)


def with_weight_views(meta):
    """The metadata of a kernel that reads the routed weights only through
    per-expert tensor maps (params' "access": "tensor_maps", maps'
    "experts"), derived from a tensor-core layer's: what the compiler emits
    for such kernels (unchanged if it does already)."""
    m = json.loads(json.dumps(meta))
    shapes = {p["name"]: p["shape"] for p in m["params"]}
    for p in m["params"]:
        if p["name"] in ROUTED:
            p["access"] = "tensor_maps"
    for t in m["tensor_maps"]:
        if t["buffer"] in ROUTED:
            t["experts"], t["rows"] = shapes[t["buffer"]][:2]
    slots = sum(t.get("experts", 1) for t in m["tensor_maps"])
    for p in m["params"]:
        if p["role"] == "tensor_maps":
            p["shape"] = [16 * slots]  # one 128-byte CUtensorMap a slot
    return m


def layer_of(artifact, meta=None):
    return rt.Layer(json.dumps(meta or artifact.metadata))


# DLPack, as dlpack.h lays it out.
class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = ctypes.c_char_p(b"dltensor")
_KEEP = []  # exported tensors live for the session (views may hold them)
_CODES = {"bf16": (4, 16), "f32": (2, 32), "i32": (0, 32), "i64": (0, 64),
          "f8e4m3": (10, 8)}
CUDA0, CUDA_HOST = (2, 0), (3, 0)


class FakeArray:
    """A DLPack producer over a NumPy array's memory that says it holds
    another dtype (bf16, which NumPy lacks) or lives on another device (a GPU),
    for the checks; no kernel ever reads it. Records each export's stream."""

    def __init__(self, array, dtype="bf16", device=(1, 0)):
        self.array, self.device, self.streams = array, device, []
        self.code, self.bits = _CODES[dtype]
        assert array.itemsize * 8 == self.bits

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, **kwargs):
        self.streams.append(stream)
        a = self.array
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
        m = _Managed()
        m.dl_tensor = _DLTensor(a.ctypes.data, _Device(*self.device), a.ndim,
                                _DType(self.code, self.bits, 1), shape, strides, 0)
        _KEEP.append((a, shape, strides, m))
        return _capsule_new(ctypes.addressof(m), _CAPSULE_NAME, None)


def bf16(*shape, device=(1, 0)):
    return FakeArray(np.zeros(shape, np.uint16), "bf16", device)


def good_inputs(meta, device=(1, 0)):
    """Arrays of the right dtype and shape for every input."""
    out = {}
    for p in meta["params"]:
        if p["role"] == "input":
            dtype = {"bf16": np.uint16, "f32": np.float32, "i32": np.int32,
                     "i64": np.int64}[p["dtype"]]
            out[p["name"]] = FakeArray(np.zeros(p["shape"], dtype), p["dtype"], device)
    return out


def output_of(meta, device=(1, 0)):
    shape = next(p["shape"] for p in meta["params"] if p["role"] == "output")
    return bf16(*shape, device=device)


def raises(exc, message):
    """pytest.raises matching `message` literally (not as a regex)."""
    return pytest.raises(exc, match=re.escape(message))


#===----------------------------------------------------------------------===#
# Module, driver
#===----------------------------------------------------------------------===#

def test_extension_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import mok, mok._runtime as rt\n"
            "assert mok.MokRuntimeError is rt.MokRuntimeError\n"
            "assert issubclass(rt.MokRuntimeError, RuntimeError)\n"
            "print(rt.API_VERSION, rt.MAX_RANK)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "4"]


def test_driver_probe():
    available, count, reason = rt.driver_probe()
    if NO_GPU:
        assert (available, count) == (False, 0) and reason
    else:
        assert available and count >= 1 and reason == ""


def test_without_a_driver_the_probe_and_load_say_why(scalar):
    """$MOK_CUDA_DRIVER names a library that does not exist (in a fresh
    process: the runtime loads the driver once)."""
    missing = "/nonexistent/libcuda-mok-test.so.1"
    code = ("import json, mok._runtime as rt\n"
            "print(json.dumps(rt.driver_probe()))\n"
            "layer = rt.Layer(open(0).read())\n"
            "try:\n"
            "    layer.load(0, '.version 8.0')\n"
            "except rt.MokRuntimeError as e:\n"
            "    print(json.dumps([e.status, str(e), layer.device]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          input=json.dumps(scalar.metadata),
                          env=dict(os.environ, MOK_CUDA_DRIVER=missing))
    assert proc.returncode == 0, proc.stderr
    probe, load = [json.loads(line) for line in proc.stdout.splitlines()]
    assert probe[:2] == [False, 0] and missing in probe[2]
    assert load[0] == "MOK_ERROR_DRIVER_UNAVAILABLE" and missing in load[1]
    assert load[2] is None


#===----------------------------------------------------------------------===#
# Layers
#===----------------------------------------------------------------------===#

def test_layer_reports_its_inputs(scalar):
    layer = layer_of(scalar)
    assert layer.input_names == ["x", "top_experts", "router_weights", "gate_weights",
                                 "up_weights", "down_weights"]
    assert layer.input_names == [p["name"] for p in scalar.metadata["params"]
                                 if p["role"] == "input"]
    assert layer.device is None and layer.bound_weights == {}


def _meta_without_output(meta):
    return dict(meta, params=[p for p in meta["params"] if p["role"] != "output"])


def _meta_with_dtype(meta, index, dtype):
    params = [dict(p) for p in meta["params"]]
    params[index]["dtype"] = dtype
    return dict(meta, params=params)


@pytest.mark.parametrize("make,message", [
    (lambda m: "{not json", "metadata: not JSON"),
    (lambda m: "[1, 2]", "metadata: not a JSON object"),
    (lambda m: json.dumps(dict(m, mok_metadata_version=9)), "expected mok_metadata_version"),
    (lambda m: json.dumps(_meta_without_output(m)), "metadata: no parameter has role 'output'"),
    (lambda m: json.dumps(_meta_with_dtype(m, 3, "f16")),
     "metadata: params[3]: unknown dtype 'f16'"),
])
def test_bad_metadata(scalar, make, message):
    with raises(mok.MokRuntimeError, message) as info:
        rt.Layer(make(scalar.metadata))
    assert info.value.status == "MOK_ERROR_INVALID_ARGUMENT"
    assert isinstance(info.value, RuntimeError)


def test_check_accepts_matching_arrays(scalar):
    layer = layer_of(scalar)
    meta = scalar.metadata
    assert layer.check(good_inputs(meta), out=output_of(meta)) is None
    assert layer.check(out=output_of(meta), **good_inputs(meta)) is None
    # Until it is loaded, a layer checks descriptions only: any device.
    assert layer.check(good_inputs(meta, CUDA0), out=output_of(meta, CUDA0)) is None


@pytest.mark.parametrize("fixture", ["scalar", "tensor_core"])
def test_check_refuses_an_output_off_a_16_byte_boundary(fixture, request):
    """The compiled kernels write their outputs 16 bytes at a time, with no
    code for other addresses: the metadata says so ("align": 16) and the
    runtime refuses an output 2 bytes off, by name, before any launch."""
    compiled = request.getfixturevalue(fixture)
    meta = compiled.metadata
    out = next(p for p in meta["params"] if p["role"] == "output")
    assert out["align"] == 16 and meta["mok_metadata_version"] == 5
    memory = np.zeros(int(np.prod(out["shape"])) + 16, np.uint16)
    start = (-memory.ctypes.data % 16) // 2  # the first 16-byte boundary
    shifted = memory[start + 1:start + 1 + int(np.prod(out["shape"]))].reshape(out["shape"])
    layer = layer_of(compiled)
    with raises(mok.MokRuntimeError, "out: data must be 16-byte aligned (the kernel writes "
                "it 16 bytes at a time), got address"):
        layer.check(good_inputs(meta), out=FakeArray(shifted))
    aligned = memory[start:start + int(np.prod(out["shape"]))].reshape(out["shape"])
    assert layer.check(good_inputs(meta), out=FakeArray(aligned)) is None


def _check_case(meta, name, value):
    args = good_inputs(meta)
    args[name] = value
    return args


@pytest.mark.parametrize("name,value,exc,message", [
    ("x", np.zeros((40, 64), np.float32), mok.MokRuntimeError,
     "x: expected dtype bf16, got f32 [40, 64]"),
    ("x", np.zeros((40, 64), np.uint16), mok.MokRuntimeError,
     "x: unsupported dtype uint16 (the runtime takes bfloat16, float32, int32, int64, "
     "float8_e4m3fn and uint8)"),
    # FP8 (DLPack's float8_e4m3fn) is a runtime dtype, not this operand's.
    ("x", FakeArray(np.zeros((40, 64), np.uint8), "f8e4m3"), mok.MokRuntimeError,
     "x: expected dtype bf16, got f8e4m3 [40, 64]"),
    ("x", np.zeros((1,) * 5, np.float32), mok.MokRuntimeError,
     "x: rank 5; the runtime takes at most 4 dimensions"),
    ("x", [[0.0] * 64] * 40, TypeError, "x: expected a DLPack array"),
    ("top_experts", np.zeros((40, 3), np.int32), mok.MokRuntimeError,
     "top_experts: expected shape [40, 2], got [40, 3]"),
    ("top_experts", np.zeros((40, 2), np.int64), mok.MokRuntimeError,
     "top_experts: expected dtype i32, got i64 [40, 2]"),
    ("router_weights", np.zeros((40, 4), np.float32)[:, ::2], mok.MokRuntimeError,
     "router_weights: the innermost dimension must be contiguous (stride 1), got stride 2"),
    ("down_weights", bf16(4, 32, 64), mok.MokRuntimeError,
     "down_weights: expected shape [4, 64, 32], got [4, 32, 64]"),
])
def test_check_names_the_argument(scalar, name, value, exc, message):
    layer = layer_of(scalar)
    with raises(exc, message):
        layer.check(_check_case(scalar.metadata, name, value), out=output_of(scalar.metadata))


def test_check_names_missing_unknown_and_repeated_operands(scalar):
    layer = layer_of(scalar)
    meta = scalar.metadata
    args = good_inputs(meta)
    out = output_of(meta)
    with raises(mok.MokRuntimeError, "inputs: 'x' is missing"):
        layer.check({k: v for k, v in args.items() if k != "x"}, out=out)
    with raises(mok.MokRuntimeError, "inputs[0]: unknown input 'y'; expected x, top_experts"):
        layer.check({"y": args["x"]}, out=out)
    with raises(mok.MokRuntimeError, "x: given twice"):
        layer.check(args, out=out, x=args["x"])
    with raises(mok.MokRuntimeError, "out: expected dtype bf16, got f32"):
        layer.check(args, out=np.zeros((40, 64), np.float32))
    with raises(TypeError, "inputs: expected a dict of arrays by operand name, got list"):
        layer.check([args["x"]], out=out)


def test_forward_takes_cuda_arrays_only(scalar):
    layer = layer_of(scalar)
    meta = scalar.metadata
    with raises(mok.MokRuntimeError, "x: expected a CUDA array, got cpu"):
        layer.forward(good_inputs(meta), out=output_of(meta, CUDA0))
    cuda = good_inputs(meta, CUDA0)
    with raises(mok.MokRuntimeError, "router_weights: expected a CUDA array, got cuda_host"):
        layer.forward(dict(cuda, router_weights=FakeArray(
            np.zeros((40, 2), np.float32), "f32", CUDA_HOST)), out=output_of(meta, CUDA0))
    with raises(mok.MokRuntimeError, "out: expected a CUDA array, got cpu"):
        layer.forward(cuda, out=output_of(meta))
    with raises(mok.MokRuntimeError, "layer: not loaded (call load(device, ptx) first)"):
        layer.forward(cuda, out=output_of(meta, CUDA0))


def test_cuda_arrays_are_exported_on_the_launch_stream(scalar):
    """DLPack's consumer protocol: forward asks the producer to order its
    work before the launch stream (1 is the legacy default stream, as DLPack
    spells it); check and views ask for no synchronization (-1)."""
    layer = layer_of(scalar)
    meta = scalar.metadata
    args, out = good_inputs(meta, CUDA0), output_of(meta, CUDA0)
    for stream, expected in [(0, 1), (0x7f0012345600, 0x7f0012345600)]:
        with pytest.raises(mok.MokRuntimeError, match="not loaded"):
            layer.forward(args, out=out, stream=stream)
        assert args["x"].streams[-1] == expected and out.streams[-1] == expected
    layer.check(args, out=out)
    assert args["x"].streams[-1] == -1
    w = bf16(4, 32, 64, device=CUDA0)
    rt.weights_from_tensor(w)
    assert w.streams == [-1]


#===----------------------------------------------------------------------===#
# Several outputs
#===----------------------------------------------------------------------===#

def _param(name, role, dtype, shape):
    return {"name": name, "role": role, "dtype": dtype, "shape": shape}


# A kernel with extra outputs, hand-written (needs no compiler): the output
# first, then saved context ("gate") and an f32 output (a backward's
# d_router_weights).
MULTI = {"mok_metadata_version": 3, "function": "moe_layer", "kernel": "k", "block": 256,
         "cooperative": True, "dynamic_shared_memory": 0, "params": [
             _param("x", "input", "bf16", [4, 64]),
             _param("top_experts", "input", "i32", [4, 2]),
             _param("router_weights", "input", "f32", [4, 2]),
             _param("out", "output", "bf16", [4, 64]),
             _param("gate", "output", "bf16", [8, 16]),
             _param("grid_barrier", "workspace", "i32", [2]),
             _param("d_router_weights", "output", "f32", [4, 2])]}
SINGLE = dict(MULTI, params=[p for p in MULTI["params"]
                             if p["name"] not in ("gate", "d_router_weights")])
EXTRA = ("gate", "d_router_weights")


def extra_outputs_of(meta, device=(1, 0)):
    """Arrays of the right dtype and shape for every output but the first."""
    outputs = [p for p in meta["params"] if p["role"] == "output"][1:]
    return {p["name"]: FakeArray(np.zeros(p["shape"], {"bf16": np.uint16,
                                                       "f32": np.float32}[p["dtype"]]),
                                 p["dtype"], device)
            for p in outputs}


def test_layer_reports_its_outputs():
    layer = rt.Layer(json.dumps(MULTI))
    assert layer.input_names == ["x", "top_experts", "router_weights"]
    assert layer.output_names == ["out", "gate", "d_router_weights"]
    assert rt.Layer(json.dumps(SINGLE)).output_names == ["out"]


def test_check_takes_the_extra_outputs_by_name():
    layer = rt.Layer(json.dumps(MULTI))
    args, extra, out = good_inputs(MULTI), extra_outputs_of(MULTI), output_of(MULTI)
    assert layer.check(dict(args, **extra), out=out) is None
    assert layer.check(args, out=out, **extra) is None
    assert layer.check(out=out, **args, **extra) is None


@pytest.mark.parametrize("change,message", [
    (lambda a: a.pop("gate"),
     "outputs: 'gate' is missing (extra outputs are passed among the named tensors)"),
    (lambda a: a.pop("d_router_weights"), "outputs: 'd_router_weights' is missing"),
    (lambda a: a.update(hidden=bf16(8, 16)),
     "unknown input or output 'hidden'; expected the inputs x, top_experts, router_weights "
     "and the extra outputs gate, d_router_weights (the first output, 'out', is `out`)"),
    (lambda a: a.update(out=bf16(4, 64)),
     "'out' is the layer's first output: pass it as `out`, not among the named tensors"),
    (lambda a: a.update(d_router_weights=bf16(4, 2)),
     "d_router_weights: expected dtype f32, got bf16 [4, 2]"),
    (lambda a: a.update(gate=bf16(16, 8)), "gate: expected shape [8, 16], got [16, 8]"),
])
def test_check_names_the_wrong_extra_output(change, message):
    layer = rt.Layer(json.dumps(MULTI))
    args = dict(good_inputs(MULTI), **extra_outputs_of(MULTI))
    change(args)
    with raises(mok.MokRuntimeError, message) as info:
        layer.check(args, out=output_of(MULTI))
    assert info.value.status == "MOK_ERROR_INVALID_ARGUMENT"


def _bytes(array, begin, end):
    return f"[{array.ctypes.data + begin:#x}, {array.ctypes.data + end:#x})"


def test_check_refuses_outputs_that_overlap():
    """An output over an input, or over another output: the kernel would
    read what it writes, or write one over the other."""
    layer = rt.Layer(json.dumps(MULTI))
    args = dict(good_inputs(MULTI), **extra_outputs_of(MULTI))
    x, gate = np.zeros((4, 64), np.uint16), np.zeros((8, 16), np.uint16)
    with raises(mok.MokRuntimeError, f"outputs: 'gate' (bytes {_bytes(x, 128, 384)}) overlaps "
                f"the input 'x' ({_bytes(x, 0, 512)}); an output may share memory with "
                "neither an input nor another output") as info:
        layer.check(dict(args, x=FakeArray(x),
                         gate=FakeArray(x.reshape(-1)[64:192].reshape(8, 16))),
                    out=output_of(MULTI))
    assert info.value.status == "MOK_ERROR_INVALID_ARGUMENT"
    drw = gate.view(np.float32).reshape(-1)[4:12].reshape(4, 2)  # bytes 16 to 48
    with raises(mok.MokRuntimeError, f"outputs: 'd_router_weights' (bytes "
                f"{_bytes(gate, 16, 48)}) overlaps the output 'gate' ({_bytes(gate, 0, 256)})"):
        layer.check(dict(args, gate=FakeArray(gate), d_router_weights=FakeArray(drw, "f32")),
                    out=output_of(MULTI))
    # Adjacent is not overlapping.
    memory = np.zeros(384, np.uint16)
    assert layer.check(dict(args, gate=FakeArray(memory[256:].reshape(8, 16))),
                       out=FakeArray(memory[:256].reshape(4, 64))) is None


def test_check_refuses_an_output_over_an_input():
    """The first output too, in a layer with one output."""
    layer = rt.Layer(json.dumps(SINGLE))
    x = np.zeros((4, 64), np.uint16)
    args = dict(good_inputs(SINGLE), x=FakeArray(x))
    with raises(mok.MokRuntimeError, f"out: 'out' (bytes {_bytes(x, 0, 512)}) overlaps the "
                f"input 'x' ({_bytes(x, 0, 512)})"):
        layer.check(args, out=FakeArray(x))
    # Inputs may share memory (they are only read).
    ids = np.zeros((4, 2), np.int32)
    assert layer.check(dict(args, top_experts=FakeArray(ids, "i32"),
                            router_weights=FakeArray(ids.view(np.float32), "f32")),
                       out=output_of(SINGLE)) is None
    with raises(mok.MokRuntimeError, "gate: given twice (in `inputs` and as a keyword"):
        rt.Layer(json.dumps(MULTI)).check(dict(args, gate=bf16(8, 16)),
                                          out=output_of(MULTI), gate=bf16(8, 16))


def test_forward_exports_the_extra_outputs_on_the_launch_stream():
    layer = rt.Layer(json.dumps(MULTI))
    args, out = good_inputs(MULTI, CUDA0), output_of(MULTI, CUDA0)
    with raises(mok.MokRuntimeError, "gate: expected a CUDA array, got cpu"):
        layer.forward(dict(args, **extra_outputs_of(MULTI)), out=out)
    extra = extra_outputs_of(MULTI, CUDA0)
    with raises(mok.MokRuntimeError, "layer: not loaded (call load(device, ptx) first)"):
        layer.forward(dict(args, **extra), out=out, stream=0x7f0012345600)
    assert extra["gate"].streams == [0x7f0012345600]


class _CheckingLayer:
    """Stands for a loaded mok._runtime.Layer: forward checks its arguments
    as the runtime would (Layer.check: every named tensor and out, on any
    device) and records them instead of launching."""

    def __init__(self, meta):
        self.layer = rt.Layer(json.dumps(meta))
        self.calls = []
        self.reports = []  # take_report's `wait`, per call

    def take_report(self, stream, wait):
        self.reports.append(wait)

    @property
    def bound_weights(self):
        return self.layer.bound_weights

    def bind_weights(self, name, view):
        self.layer.bind_weights(name, view)

    def unbind_weights(self, name):
        self.layer.unbind_weights(name)

    def forward(self, named, out, stream):
        self.layer.check(named, out=out)
        self.calls.append((dict(named), out, stream))
        return out


def _cpu_gpu_layer(meta, monkeypatch, poison_outputs=False):
    """A GpuLayer over `meta` on the CPU (its checks compare devices, and it
    allocates there), launching through _CheckingLayer: GpuLayer's own
    handling of the arguments and outputs, without a GPU."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: types.SimpleNamespace(cuda_stream=0))
    layer = object.__new__(mok.GpuLayer)
    layer.torch, layer.meta, layer.poison_outputs = torch, meta, poison_outputs
    layer.device = torch.device("cpu")
    layer._layer = _CheckingLayer(meta)
    layer._export = lambda t: t  # torch tensors as they are, for the record
    layer.inputs = [p for p in meta["params"] if p["role"] == "input"]
    layer.outputs = [p for p in meta["params"] if p["role"] == "output"]
    layer.output = layer.outputs[0]
    layer._forwards = 0
    layer._init_tokens()
    return layer, torch


def _torch_inputs(torch):
    return dict(x=torch.zeros(4, 64, dtype=torch.bfloat16),
                top_experts=torch.zeros(4, 2, dtype=torch.int32),
                router_weights=torch.zeros(4, 2))


def test_gpu_layer_allocates_and_returns_every_output(monkeypatch):
    layer, torch = _cpu_gpu_layer(MULTI, monkeypatch)
    assert layer.extra_outputs == EXTRA
    args = _torch_inputs(torch)
    got = layer(**args)
    assert list(got) == ["out", "gate", "d_router_weights"]
    assert [(got[n].dtype, list(got[n].shape)) for n in got] == [
        (torch.bfloat16, [4, 64]), (torch.bfloat16, [8, 16]), (torch.float32, [4, 2])]
    (named, out, stream), = layer._layer.calls
    assert out is got["out"] and stream == 0
    assert list(named) == ["x", "top_experts", "router_weights", "gate", "d_router_weights"]
    assert named["gate"] is got["gate"] and named["d_router_weights"] is got["d_router_weights"]
    # Given outputs are written in place and returned as given; the returned
    # dict can be passed back (the first output in it, or as out=).
    gate = torch.empty(8, 16, dtype=torch.bfloat16)
    again = layer(**args, outputs={"gate": gate})
    assert again["gate"] is gate
    assert layer._layer.calls[-1][0]["gate"].data_ptr() == gate.data_ptr()
    assert again["out"] is not got["out"]
    reused = layer(**args, outputs=got)
    assert all(reused[n] is got[n] for n in got)
    out = torch.empty(4, 64, dtype=torch.bfloat16)
    assert layer(**args, out=out, outputs={"gate": gate})["out"] is out
    assert layer._layer.calls[-1][1].data_ptr() == out.data_ptr()
    assert layer._forwards == 4


def test_gpu_layer_takes_the_kernels_report_by_the_error_check_mode(monkeypatch):
    layer, torch = _cpu_gpu_layer(MULTI, monkeypatch)
    args = _torch_inputs(torch)
    previous = mok.set_error_checks("deferred")
    try:
        layer(**args)
        mok.set_error_checks("sync")
        layer(**args)
        mok.set_error_checks("off")
        layer(**args)
        assert layer._layer.reports == [False, True]
        with pytest.raises(ValueError, match="mode: expected one of 'deferred', 'sync', "
                                             "'off', got 'always'"):
            mok.set_error_checks("always")
    finally:
        mok.set_error_checks(previous)


def test_gpu_layer_poisons_the_outputs_it_allocates(monkeypatch):
    layer, torch = _cpu_gpu_layer(MULTI, monkeypatch, poison_outputs=True)
    gate = torch.zeros(8, 16, dtype=torch.bfloat16)
    got = layer(**_torch_inputs(torch), outputs={"gate": gate})
    assert torch.isnan(got["out"]).all() and torch.isnan(got["d_router_weights"]).all()
    assert not torch.isnan(gate).any()
    plain, _ = _cpu_gpu_layer(MULTI, monkeypatch)
    assert plain.poison_outputs is False


def test_gpu_layer_with_one_output_returns_it(monkeypatch):
    layer, torch = _cpu_gpu_layer(SINGLE, monkeypatch)
    assert layer.extra_outputs == ()
    args = _torch_inputs(torch)
    out = layer(**args)
    assert isinstance(out, torch.Tensor) and list(out.shape) == [4, 64]
    given = torch.empty(4, 64, dtype=torch.bfloat16)
    assert layer(**args, out=given) is given
    for outputs in ({"out": given}, {}):
        with raises(TypeError, "outputs: this layer has one output (out); pass it as out="):
            layer(**args, outputs=outputs)


def _wrong_outputs(torch, args):
    bf, f32 = torch.bfloat16, torch.float32
    gate = torch.empty(8, 16, dtype=bf)
    return [
        (dict(outputs=[gate]), TypeError,
         "outputs: expected a dict of tensors by output name (out, gate, d_router_weights), "
         "got list"),
        (dict(outputs={"hidden": gate}), TypeError,
         "outputs: unknown output 'hidden'; expected out, gate, d_router_weights"),
        (dict(out=torch.empty(4, 64, dtype=bf), outputs={"out": torch.empty(4, 64, dtype=bf)}),
         TypeError, "out: the first output out is given twice (as out= and in outputs=)"),
        (dict(outputs={"gate": torch.empty(8, 16)}), TypeError,
         "gate: expected dtype torch.bfloat16, got torch.float32"),
        (dict(outputs={"d_router_weights": torch.empty(4, 2, dtype=bf)}), TypeError,
         "d_router_weights: expected dtype torch.float32, got torch.bfloat16"),
        (dict(outputs={"gate": torch.empty(8, 8, dtype=bf)}), ValueError,
         "gate: expected shape [8, 16], got [8, 8]"),
        (dict(outputs={"gate": "gate"}), TypeError,
         "gate: expected a torch.Tensor (bf16 [8, 16]), got str"),
        (dict(outputs={"gate": torch.empty(8, 16, dtype=bf, device="meta")}), ValueError,
         "gate: expected a tensor on cpu, got meta"),
        (dict(outputs={"gate": torch.empty(16, 8, dtype=bf).t()}), ValueError,
         "gate: expected a contiguous tensor [8, 16], got strides [1, 8]"),
        (dict(outputs={"gate": torch.empty(8, 16, dtype=bf, requires_grad=True)}), ValueError,
         "gate: must not require grad"),
        (dict(outputs={"gate": args["x"].view(-1)[64:192].view(8, 16)}), ValueError,
         "gate: overlaps the input x in memory; pass a separate tensor"),
        (dict(outputs={"gate": gate,
                       "d_router_weights": gate.view(f32).view(-1)[4:12].view(4, 2)}),
         ValueError, "d_router_weights: overlaps the output gate in memory"),
    ]


def test_gpu_layer_checks_the_outputs_it_is_given(monkeypatch):
    layer, torch = _cpu_gpu_layer(MULTI, monkeypatch)
    args = _torch_inputs(torch)
    for kwargs, exc, message in _wrong_outputs(torch, args):
        calls = len(layer._layer.calls)
        with raises(exc, message):
            layer(**args, **kwargs)
        assert len(layer._layer.calls) == calls  # nothing launched
    # out= over a given extra output: the later one is named.
    out = torch.empty(4, 64, dtype=torch.bfloat16)
    with raises(ValueError, "gate: overlaps the output out in memory"):
        layer(**args, out=out, outputs={"gate": out.view(-1)[:128].view(8, 16)})


def test_tensors_without_elements_overlap_nothing():
    torch = pytest.importorskip("torch")
    from mok._gpu import _overlap
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    assert _overlap(x[1:], x[:2]) and _overlap(x, x[3:]) and not _overlap(x[:1], x[1:])
    assert not _overlap(x[2:2], x) and not _overlap(x, x[2:2])


#===----------------------------------------------------------------------===#
# Weight views
#===----------------------------------------------------------------------===#

def test_weight_views_address_the_arrays_without_copies():
    w = np.zeros((4, 32, 64), np.float32)
    v = rt.weights_from_tensor(w, "gate")
    assert (v.layout, v.dtype, v.experts, v.rows, v.cols) == ("strided", "f32", 4, 32, 64)
    assert (v.expert_stride, v.row_stride, v.device) == (32 * 64, 64, "cpu")
    base = w.ctypes.data
    assert v.element_address(0, 0, 0) == base
    assert v.element_address(3, 2, 1) == base + (3 * 32 * 64 + 2 * 64 + 1) * 4
    with raises(mok.MokRuntimeError, "element (4, 0, 0) is outside [4, 32, 64]"):
        v.element_address(4, 0, 0)

    fc1 = np.zeros((4, 64, 64), np.float32)
    gate, up = rt.weights_split_fc1(fc1)
    assert (gate.experts, gate.rows, gate.cols) == (up.experts, up.rows, up.cols) == (4, 32, 64)
    for e in range(4):
        assert gate.element_address(e, 5, 7) == fc1[e, 5, 7:].ctypes.data
        assert up.element_address(e, 5, 7) == fc1[e, 32 + 5, 7:].ctypes.data

    # One allocation per expert, rows padded to 80 elements.
    experts = [np.zeros((32, 80), np.float32)[:, :64] for _ in range(3)]
    p = rt.weights_per_expert(experts, "down")
    assert (p.layout, p.experts, p.rows, p.cols, p.row_stride) == ("per_expert", 3, 32, 64, 80)
    assert p.expert_stride is None
    for e, a in enumerate(experts):
        assert p.element_address(e, 0, 0) == a.ctypes.data
        assert p.element_address(e, 31, 63) == a.ctypes.data + (31 * 80 + 63) * 4
    assert repr(p) == "WeightView(per_expert f32 [3, 32, 64] on cpu)"


def test_weight_views_keep_their_arrays_alive():
    w = np.zeros((4, 32, 64), np.float32)
    experts = [np.zeros((32, 64), np.float32) for _ in range(2)]
    before = sys.getrefcount(w), [sys.getrefcount(a) for a in experts]
    views = rt.weights_from_tensor(w), rt.weights_split_fc1(w), rt.weights_per_expert(experts)
    assert sys.getrefcount(w) > before[0]
    assert all(sys.getrefcount(a) > n for a, n in zip(experts, before[1]))
    del views
    gc.collect()
    assert (sys.getrefcount(w), [sys.getrefcount(a) for a in experts]) == before


@pytest.mark.parametrize("make,exc,message", [
    (lambda: rt.weights_from_tensor(np.zeros((4, 64), np.float32), "gate"),
     mok.MokRuntimeError, "gate: expected rank 3"),
    (lambda: rt.weights_split_fc1(np.zeros((4, 63, 64), np.float32)),
     mok.MokRuntimeError, "fc1: a fused FC1 [E, 2*I, H] needs an even row count, got 63"),
    (lambda: rt.weights_per_expert([], "w"),
     mok.MokRuntimeError, "w: expected one [rows, cols] array per expert, got an empty list"),
    (lambda: rt.weights_per_expert(np.zeros((2, 32, 64), np.float32), "w"),
     TypeError, "w: expected a list of per-expert [rows, cols] arrays, got numpy.ndarray"),
    (lambda: rt.weights_per_expert([np.zeros((32, 64), np.float32)] * 2
                                   + [np.zeros((32, 48), np.float32)], "w"),
     mok.MokRuntimeError, "w[2]: expected [rows, cols] = [32, 64] as w[0], got [32, 48]"),
    (lambda: rt.weights_per_expert([np.zeros((32, 64), np.float32),
                                    np.zeros((32, 64), np.int32)], "w"),
     mok.MokRuntimeError, "w[1]: dtype i32, but w[0] is f32"),
    (lambda: rt.weights_per_expert([np.zeros((32, 128), np.float32)[:, ::2]], "w"),
     mok.MokRuntimeError, "w[0]: the innermost dimension must be contiguous (stride 1), got stride 2"),
    (lambda: rt.weights_per_expert([np.zeros((32, 64), np.float32),
                                    np.zeros((32, 80), np.float32)[:, :64]], "w"),
     mok.MokRuntimeError, "w[1]: row stride 80 differs from w[0]'s 64"),
    (lambda: rt.weights_per_expert([np.zeros((32, 6), np.float32)], "w"),
     mok.MokRuntimeError, "w: row_stride must be a multiple of 16 bytes, got 6 elements"),
    (lambda: rt.weights_per_expert([bf16(32, 64, device=CUDA0), bf16(32, 64)], "w"),
     mok.MokRuntimeError, "w[1]: on cpu, but w[0] is on cuda:0"),
    (lambda: rt.weights_per_expert([np.zeros((32, 64), np.float32), "no"], "w"),
     TypeError, "w[1]: expected a DLPack array"),
])
def test_weight_view_errors_name_the_argument(make, exc, message):
    with raises(exc, message):
        make()


#===----------------------------------------------------------------------===#
# Binding views to layers
#===----------------------------------------------------------------------===#

def test_binding_is_refused_when_the_kernel_reads_the_weights_by_pointer(scalar):
    layer = layer_of(scalar)
    view = rt.weights_from_tensor(bf16(4, 32, 64), "gate_weights")
    with pytest.raises(mok.MokRuntimeError) as info:
        layer.bind_weights("gate_weights", view)
    assert "'gate_weights'" in str(info.value) and "by pointer" in str(info.value)
    assert info.value.status == "MOK_ERROR_INVALID_ARGUMENT"
    assert layer.bound_weights == {}
    # The operand is still taken from the arguments.
    assert layer.check(good_inputs(scalar.metadata), out=output_of(scalar.metadata)) is None


def test_binding_views_to_a_tensor_map_kernel(tensor_core):
    meta = with_weight_views(tensor_core.metadata)
    layer = layer_of(tensor_core, meta)
    args, out = good_inputs(meta), output_of(meta)
    E, I, H = 4, 128, 128
    gate, up = rt.weights_split_fc1(bf16(E, 2 * I, H), "fc1")
    down = rt.weights_per_expert([bf16(H, I) for _ in range(E)], "down_weights")
    layer.bind_weights("gate_weights", gate)
    layer.bind_weights("up_weights", up)
    refs = sys.getrefcount(down)
    layer.bind_weights("down_weights", down)
    assert sys.getrefcount(down) == refs + 1  # the layer keeps the view alive
    assert layer.bound_weights == {"gate_weights": gate, "up_weights": up,
                                   "down_weights": down}
    rest = {k: v for k, v in args.items() if k not in ROUTED}
    assert layer.check(rest, out=out) is None
    with raises(mok.MokRuntimeError, "inputs: 'gate_weights' is bound as a weight view"):
        layer.check(dict(rest, gate_weights=args["gate_weights"]), out=out)

    # A refused view leaves the previous binding.
    with pytest.raises(mok.MokRuntimeError, match="'up_weights'"):
        layer.bind_weights("up_weights", rt.weights_from_tensor(bf16(E, I, H - 64)))
    with raises(mok.MokRuntimeError, "'up_weights': expected [E, rows, cols] = [4, 128, 128], "
                "got [3, 128, 128]"):
        layer.bind_weights("up_weights", rt.weights_per_expert([bf16(I, H)] * (E - 1)))
    assert layer.bound_weights["up_weights"] is up
    with pytest.raises(mok.MokRuntimeError, match="'x': not a routed expert weight operand"):
        layer.bind_weights("x", gate)
    with raises(mok.MokRuntimeError, "name: unknown input 'fc1'"):
        layer.bind_weights("fc1", gate)
    with raises(TypeError, "gate_weights: expected a WeightView"):
        layer.bind_weights("gate_weights", args["gate_weights"])

    layer.unbind_weights("gate_weights")
    layer.bind_weights("up_weights", None)  # None unbinds too
    assert list(layer.bound_weights) == ["down_weights"]
    assert sys.getrefcount(down) == refs + 1
    with raises(mok.MokRuntimeError, "inputs: 'gate_weights' is missing"):
        layer.check(rest, out=out)
    assert layer.check(dict(rest, gate_weights=args["gate_weights"],
                            up_weights=args["up_weights"]), out=out) is None
    del layer
    gc.collect()
    assert sys.getrefcount(down) == refs


#===----------------------------------------------------------------------===#
# Weight views in training (GpuTrainingLayer: both kernels at once)
#===----------------------------------------------------------------------===#

@pytest.fixture(scope="module")
def training_artifacts(tmp_path_factory):
    """Tensor-core and scalar-GEMM training layers (mok.compile(...,
    training=True)): both kernels' metadata as the compiler emits it."""
    try:
        return {name: mok.compile(spec, target="sm_90a", training=True,
                                  cache_dir=str(tmp_path_factory.mktemp("t")))
                for name, spec in (("tensor_core", TENSOR_CORE), ("scalar", SCALAR))}
    except ImportError as e:
        pytest.skip(str(e))


def _cpu_training_layer(art, monkeypatch, backward_meta=None):
    """A GpuTrainingLayer over `art` whose two kernels are _cpu_gpu_layer's
    (CPU tensors, the runtime's checks, no launch)."""
    forward, torch = _cpu_gpu_layer(art.forward.metadata, monkeypatch)
    backward, _ = _cpu_gpu_layer(backward_meta or art.backward.metadata, monkeypatch)
    layer = object.__new__(mok.GpuTrainingLayer)
    layer._init(art, forward, backward)
    return layer, torch


def _training_args(torch, spec):
    t, h, i, e, k = spec.tokens, spec.hidden, spec.intermediate, spec.experts, spec.top_k
    return dict(x=torch.zeros(t, h, dtype=torch.bfloat16),
                top_experts=torch.zeros(t, k, dtype=torch.int32),
                router_weights=torch.zeros(t, k),
                gate_weights=torch.zeros(e, i, h, dtype=torch.bfloat16),
                up_weights=torch.zeros(e, i, h, dtype=torch.bfloat16),
                down_weights=torch.zeros(e, h, i, dtype=torch.bfloat16))


def test_training_kernels_read_tensor_core_weights_through_their_maps(training_artifacts):
    access = {name: {p["name"]: p["access"] for p in meta["params"] if p["role"] == "input"}
              for name, art in training_artifacts.items()
              for meta in [art.backward.metadata]}
    assert [access["tensor_core"][n] for n in ROUTED] == ["tensor_maps"] * 3
    assert access["tensor_core"]["x"] == access["tensor_core"]["routed_x"] == "pointer"
    assert [access["scalar"][n] for n in ROUTED] == ["pointer"] * 3
    forward = training_artifacts["tensor_core"].forward.metadata
    assert all(p["access"] == "tensor_maps" for p in forward["params"] if p["name"] in ROUTED)


def test_training_layer_binds_views_in_both_kernels(training_artifacts, monkeypatch):
    art = training_artifacts["tensor_core"]
    layer, torch = _cpu_training_layer(art, monkeypatch)
    args = _training_args(torch, TENSOR_CORE)
    e, i, h = args["gate_weights"].shape
    layer.bind_fc1(torch.zeros(e, 2 * i, h, dtype=torch.bfloat16))
    # A strided down view: rows of I + 64 elements, the first I read.
    down = torch.zeros(e, h, i + 64, dtype=torch.bfloat16)[:, :, :i]
    layer.bind_weights("down_weights", down)
    assert layer.bound_weights == ROUTED
    assert layer._backward.bound_weights == ROUTED
    with raises(TypeError, "gate_weights: is bound to a weight view (bind_weights); do not "
                "pass it too, or unbind_weights('gate_weights') first"):
        layer.forward(**args)
    rest = {n: v for n, v in args.items() if n not in ROUTED}
    out, ctx = layer.forward(*rest.values())  # by position, without the bound ones
    assert ctx.views == ROUTED and list(ctx.inputs) == list(rest)
    (named, _, _), = layer._forward._layer.calls
    assert list(named)[:3] == list(rest) and not set(ROUTED) & set(named)
    d_out = torch.zeros_like(out)
    grads = layer.backward(ctx, d_out)
    (named, _, _), = layer._backward._layer.calls
    assert named["d_out"].data_ptr() == d_out.data_ptr() and not set(ROUTED) & set(named)
    # The weights' gradients are dense tensors all the same.
    assert [list(grads[n].shape) for n in ROUTED] == [[e, i, h], [e, i, h], [e, h, i]]
    again = layer.context_from_tensors(ctx.tensors())
    assert again.views == ROUTED and list(again.inputs) == list(rest)
    layer.backward(again, d_out)
    # A context made under other bindings is refused by name.
    layer.unbind_weights("down_weights")
    with raises(ValueError, "ctx: made with gate_weights, up_weights, down_weights bound to "
                "weight views, but this layer now binds gate_weights, up_weights"):
        layer.backward(ctx, d_out)
    layer.unbind_weights()
    assert layer.bound_weights == () and layer._backward.bound_weights == ()
    with raises(TypeError, "missing argument(s): gate_weights, up_weights, down_weights"):
        layer.forward(**rest)
    out, ctx = layer.forward(**args)
    assert ctx.views == ()
    with raises(ValueError, "ctx: made with no operand bound to weight views, but this layer "
                "now binds down_weights"):
        layer.bind_weights("down_weights", down)
        layer.backward(ctx, d_out)


def test_training_layer_refuses_views_of_scalar_kernels(training_artifacts, monkeypatch):
    layer, torch = _cpu_training_layer(training_artifacts["scalar"], monkeypatch)
    e, i, h = SCALAR.experts, SCALAR.intermediate, SCALAR.hidden
    with pytest.raises(mok.MokRuntimeError, match="'gate_weights'.*scalar GEMM path"):
        layer.bind_weights("gate_weights", torch.zeros(e, i, h, dtype=torch.bfloat16))
    assert layer.bound_weights == () and layer._backward.bound_weights == ()


def test_training_layer_binds_both_kernels_or_neither(training_artifacts, monkeypatch):
    # A backward that reads the weights by pointer (as compilers before
    # the backward's "tensor_maps" access emitted it) refuses the view: the
    # forward's binding is undone, an earlier one restored.
    art = training_artifacts["tensor_core"]
    meta = json.loads(json.dumps(art.backward.metadata))
    for p in meta["params"]:
        if p["name"] in ("up_weights", "down_weights"):
            p["access"] = "pointer"
    layer, torch = _cpu_training_layer(art, monkeypatch, backward_meta=meta)
    e, i, h = TENSOR_CORE.experts, TENSOR_CORE.intermediate, TENSOR_CORE.hidden
    layer.bind_weights("gate_weights", torch.zeros(e, i, h, dtype=torch.bfloat16))
    view = layer._forward._layer.bound_weights["gate_weights"]
    with pytest.raises(mok.MokRuntimeError, match="'up_weights'"):
        layer.bind_fc1(torch.zeros(e, 2 * i, h, dtype=torch.bfloat16))
    assert layer.bound_weights == ("gate_weights",)
    assert layer._forward._layer.bound_weights["gate_weights"] is view
    with pytest.raises(mok.MokRuntimeError, match="'down_weights'"):
        layer.bind_weights("down_weights", torch.zeros(e, h, i, dtype=torch.bfloat16))
    assert layer.bound_weights == ("gate_weights",)
    assert layer._backward.bound_weights == ("gate_weights",)


def test_main_grad_layers_take_main_grads_by_weight(training_artifacts, tmp_path, monkeypatch):
    """mok.compile(..., main_grads=True): the backward's weight gradients are
    fp32 outputs it adds into (metadata "accumulate"); backward takes them
    as main_grads by weight name, in place, and returns x's and
    router_weights' gradients only. Every misuse is named."""
    art = mok.compile(TENSOR_CORE, target="sm_90a", training=True, main_grads=True,
                      cache_dir=str(tmp_path))
    assert art.main_grads and not training_artifacts["tensor_core"].main_grads
    outs = {p["name"]: p for p in art.backward.metadata["params"] if p["role"] == "output"}
    assert [n for n, p in outs.items() if p.get("accumulate")] == [f"d_{n}" for n in ROUTED]
    assert all(outs[f"d_{n}"]["dtype"] == "f32" for n in ROUTED)
    layer, torch = _cpu_training_layer(art, monkeypatch)
    args = _training_args(torch, TENSOR_CORE)
    out, ctx = layer.forward(**args)
    d_out = torch.zeros_like(out)
    main = {n: torch.zeros(args[n].shape) for n in ROUTED}
    grads = layer.backward(ctx, d_out, main_grads=main)
    assert set(grads) == {"x", "router_weights"}
    (named, _, _), = layer._backward._layer.calls
    assert all(named[f"d_{n}"].data_ptr() == main[n].data_ptr() for n in ROUTED)
    with raises(TypeError, "main_grads: this layer adds the weights' gradients into fp32 "
                "main_grads; expected a dict of tensors by weight name (gate_weights, "
                "up_weights, down_weights), got NoneType"):
        layer.backward(ctx, d_out)
    with raises(ValueError, "main_grads: expected one tensor for each of gate_weights, "
                "up_weights, down_weights; unknown 'x'; missing down_weights"):
        layer.backward(ctx, d_out, main_grads=dict(gate_weights=main["gate_weights"],
                                                   up_weights=main["up_weights"],
                                                   x=main["up_weights"]))
    with raises(TypeError, "d_up_weights: expected dtype torch.float32, got torch.bfloat16"):
        layer.backward(ctx, d_out, main_grads=dict(main, up_weights=args["up_weights"]))
    with raises(TypeError, "outputs: d_gate_weights are the main_grads; pass them as "
                "main_grads= only"):
        layer.backward(ctx, d_out, outputs={"d_gate_weights": main["gate_weights"]},
                       main_grads=main)
    # Through GpuLayer directly, an accumulated output is never allocated.
    with raises(TypeError, "outputs: 'd_gate_weights' is accumulated into (the kernel adds "
                "to it: main_grad += dW); pass it in outputs=, a torch.float32 tensor of "
                "shape [4, 128, 128]"):
        layer._backward(**dict(ctx.inputs, **ctx.saved, d_out=d_out))
    # A layer without main_grads refuses them.
    plain, _ = _cpu_training_layer(training_artifacts["tensor_core"], monkeypatch)
    _, ctx = plain.forward(**args)
    with raises(ValueError, "main_grads: this layer returns the weights' gradients; "
                "compile it with main_grads=True"):
        plain.backward(ctx, d_out, main_grads=main)


#===----------------------------------------------------------------------===#
# Reading the workspace back (profiling)
#===----------------------------------------------------------------------===#

PHASES = ["route", "fc1", "fc2"]
NOT_PROFILED = "this layer was not compiled with profiling (mok.compile(..., profile=True))"


def with_profiling(meta, phases=PHASES, stamps=None, cycles=True, cycle_stamps=None):
    """The metadata of a profiling kernel as the compiler emits it:
    "phase_clock" and (`cycles`) "phase_cycles" workspace buffers of i64
    stamps and a top-level "phases" key (one name per interval)."""
    m = json.loads(json.dumps(meta))
    for name in ("phase_clock", "phase_cycles") if cycles else ("phase_clock",):
        count = stamps if name == "phase_clock" or cycle_stamps is None else cycle_stamps
        m["params"].append({"name": name, "role": "workspace", "dtype": "i64",
                            "shape": [len(phases) + 1 if count is None else count]})
    m["phases"] = list(phases)
    return m


def layer_meta_params(artifact, role):
    return [p for p in artifact.metadata["params"] if p["role"] == role]


def test_read_workspace_checks_the_name_before_the_loading(scalar):
    """The runtime ignores the top-level keys it does not know ("phases");
    names and sizes come from the metadata, so a wrong name is reported on a
    layer that is not loaded, before that it is not loaded."""
    layer = rt.Layer(json.dumps(with_profiling(scalar.metadata)))
    assert layer.input_names == [p["name"] for p in scalar.metadata["params"]
                                 if p["role"] == "input"]
    assert layer.workspace_size("phase_clock") == 8 * (len(PHASES) + 1)
    assert layer.workspace_size("phase_cycles") == 8 * (len(PHASES) + 1)
    assert layer.workspace_size("grid_barrier") == 4 * 2
    assert layer.workspace_size("routed_x") == 2 * 108 * 64
    workspace = ", ".join(p["name"] for p in layer_meta_params(scalar, "workspace")
                          + [{"name": "phase_clock"}, {"name": "phase_cycles"}])
    for name, message in [
            ("clock", f"name: unknown workspace buffer 'clock' (workspace buffers: "
                      f"{workspace})"),
            ("x", f"name: 'x' is an input, not a workspace buffer (workspace buffers: "
                  f"{workspace})"),
            ("out", "name: 'out' is the output, not a workspace buffer")]:
        for call in (layer.read_workspace, layer.workspace_size):
            with raises(mok.MokRuntimeError, message) as info:
                call(name)
            assert info.value.status == "MOK_ERROR_INVALID_ARGUMENT"
    with raises(mok.MokRuntimeError, "layer: not loaded (call load(device, ptx) first)"):
        layer.read_workspace("phase_clock")
    with pytest.raises(TypeError):
        layer.read_workspace(None)


def test_read_workspace_of_a_tensor_core_layer_refuses_the_tensor_maps(tensor_core):
    layer = layer_of(tensor_core)
    storage = layer_meta_params(tensor_core, "tensor_maps")[0]["name"]
    with raises(mok.MokRuntimeError, f"name: '{storage}' is the tensor-map storage "
                "(role tensor_maps), not a workspace buffer"):
        layer.read_workspace(storage)
    with raises(mok.MokRuntimeError, "name: unknown workspace buffer 'phase_clock'"):
        layer.read_workspace("phase_clock")


def _unloaded_gpu_layer(meta):
    """A GpuLayer over `meta` that was never loaded (no torch, no GPU): what
    phase_times checks before it reads anything."""
    layer = object.__new__(mok.GpuLayer)
    layer.meta = meta
    return layer


def test_phase_times_of_a_layer_compiled_without_profiling(scalar):
    with raises(ValueError, NOT_PROFILED):
        _unloaded_gpu_layer(scalar.metadata).phase_times()
    # Both the phases and the phase_clock buffer are needed.
    profiled = with_profiling(scalar.metadata)
    no_phases = {k: v for k, v in profiled.items() if k != "phases"}
    no_clock = dict(profiled, params=scalar.metadata["params"])
    for meta in (no_phases, no_clock):
        with raises(ValueError, NOT_PROFILED):
            _unloaded_gpu_layer(meta).phase_times()


def test_phase_times_checks_the_profiling_metadata(scalar):
    from mok._gpu import _profile_phases
    assert _profile_phases(with_profiling(scalar.metadata)) == PHASES
    with raises(ValueError, "metadata: 3 phases need 4 i64 phase_clock timestamps, "
                "the buffer is i64 [3]"):
        _profile_phases(with_profiling(scalar.metadata, stamps=3))
    # A layer that is profiled but never ran has no timestamps to read.
    with raises(ValueError, "phase_times: no forward has run on this layer yet"):
        _unloaded_gpu_layer(with_profiling(scalar.metadata)).phase_times()


def test_phase_cycles_checks_the_profiling_metadata(scalar):
    with raises(ValueError, NOT_PROFILED):
        _unloaded_gpu_layer(scalar.metadata).phase_cycles()
    # A profiling layer compiled before the kernels recorded cycles.
    with raises(ValueError, "phase_cycles: this layer's profiling kernel records no "
                "cycles (compiled before phase_cycles existed); compile it again"):
        _unloaded_gpu_layer(with_profiling(scalar.metadata, cycles=False)).phase_cycles()
    # One cycle count with each timestamp, or the phases would pair wrongly.
    with raises(ValueError, f"metadata: {len(PHASES)} phases need {len(PHASES) + 1} i64 "
                f"phase_cycles values, the buffer is i64 [{len(PHASES)}]"):
        _unloaded_gpu_layer(with_profiling(scalar.metadata,
                                           cycle_stamps=len(PHASES))).phase_cycles()
    with raises(ValueError, "phase_cycles: no forward has run on this layer yet"):
        _unloaded_gpu_layer(with_profiling(scalar.metadata)).phase_cycles()


#===----------------------------------------------------------------------===#
# Expert-parallel group
#===----------------------------------------------------------------------===#

COMM = 0x7F00DEAD0000  # stands for an ncclComm_t: never dereferenced


def test_ep_group_defaults_and_size_one(scalar):
    layer = layer_of(scalar)
    assert layer.ep_group == (1, 0, 0) and layer.ep_size == 1
    assert layer.set_ep_group() is None
    layer.set_ep_group(1, 0, COMM)  # size 1 with a communicator: kept
    assert layer.ep_group == (1, 0, COMM)
    assert layer.check(good_inputs(scalar.metadata), out=output_of(scalar.metadata)) is None
    layer.set_ep_group(size=1, rank=0)
    assert layer.ep_group == (1, 0, 0)


_JOIN = ("a layer joins an expert-parallel group through a communicator "
         "(mok_comm_create or mok_comm_adopt, then mok_layer_bind_comm); "
         "mok_layer_set_ep_group sets size 1 only")


@pytest.mark.parametrize("group,status,message", [
    ((2, 0, COMM), "MOK_ERROR_INVALID_ARGUMENT", "ep_group: size 2: " + _JOIN),
    ((8, 7, COMM), "MOK_ERROR_INVALID_ARGUMENT", "ep_group: size 8: a layer joins"),
    ((2, 0, 0), "MOK_ERROR_INVALID_ARGUMENT",
     "ep_group: expert parallelism (size 2) needs an NCCL communicator, got nccl_comm "
     "NULL"),
    ((2, 2, COMM), "MOK_ERROR_INVALID_ARGUMENT",
     "ep_group: expected 0 <= rank < size, got rank 2 of size 2"),
    ((1, -1, 0), "MOK_ERROR_INVALID_ARGUMENT",
     "ep_group: expected 0 <= rank < size, got rank -1 of size 1"),
    ((0, 0, 0), "MOK_ERROR_INVALID_ARGUMENT", "got rank 0 of size 0"),
])
def test_ep_group_refusals_name_it(scalar, group, status, message):
    layer = layer_of(scalar)
    layer.set_ep_group(1, 0, COMM)
    with raises(mok.MokRuntimeError, message) as info:
        layer.set_ep_group(*group)
    assert info.value.status == status
    assert layer.ep_group == (1, 0, COMM)  # a refused group leaves the previous one


def _expert_parallel(metadata, ep, symmetric_bytes=4096):
    """`metadata` as a kernel for ep (version 5: the exchange's buffer and
    its peers, rank and epoch params); hand-written, the compiler does not
    emit them yet."""
    params = metadata["params"] + [
        {"name": "peers", "role": "peers", "dtype": "i64", "shape": [ep]},
        {"name": "rank", "role": "rank", "dtype": "i32", "shape": []},
        {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": []},
        {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [symmetric_bytes]}]
    return dict(metadata, mok_metadata_version=5, ep=ep, symmetric_bytes=symmetric_bytes,
                params=params)


def test_ep_group_must_match_the_compiled_ep(scalar):
    """Hand-written metadata: a scalar layer given the exchange's roles."""
    assert layer_of(scalar, dict(scalar.metadata, ep=1)).ep_size == 1
    with raises(mok.MokRuntimeError, "metadata: 'ep' = 4 needs mok_metadata_version 5"):
        layer_of(scalar, dict(scalar.metadata, ep=4, mok_metadata_version=4))
    with raises(mok.MokRuntimeError, "metadata: a kernel for ep = 4 without "
                "'symmetric_bytes' (the exchange buffer a rank needs)"):
        layer_of(scalar, dict(scalar.metadata, ep=4))
    layer = layer_of(scalar, _expert_parallel(scalar.metadata, 4))
    assert layer.ep_size == 4 and layer.ep_group == (1, 0, 0)
    assert layer.symmetric_bytes == 4096 and layer.epoch == 0 and layer.comm is None
    with raises(mok.MokRuntimeError, "ep_group: size 1, but this layer was compiled for "
                "ep = 4 (the metadata's \"ep\"); the group's size must be the compiled "
                "one: bind a communicator of 4 ranks with mok_layer_bind_comm") as info:
        layer.set_ep_group()
    assert info.value.status == "MOK_ERROR_INVALID_ARGUMENT"
    with raises(mok.MokRuntimeError, "ep_group: size 4: " + _JOIN):
        layer.set_ep_group(4, 1, COMM)
    with raises(mok.MokRuntimeError, "layer: compiled for ep = 4 (expert parallelism), "
                "but no communicator is bound (bind one of 4 ranks with "
                "mok_layer_bind_comm)"):
        layer.check(good_inputs(scalar.metadata), out=output_of(scalar.metadata))
    for ep, message in [(0, "metadata: 'ep' must be an integer >= 1"),
                        ("4", "metadata: missing or mistyped 'ep'")]:
        with raises(mok.MokRuntimeError, message):
            layer_of(scalar, dict(scalar.metadata, ep=ep))


class _ProcessGroup:
    """What torch.distributed.ProcessGroup offers that GpuLayer reads."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def test_gpu_layer_ep_group_arguments(scalar):
    """GpuLayer/GpuArtifact.load(ep_group=...) as set_ep_group's arguments,
    without torch: None, a tuple, or a process group (no communicator)."""
    from mok._gpu import _ep_group_args
    assert _ep_group_args(None) == (1, 0, 0)
    assert _ep_group_args((1, 0, COMM)) == (1, 0, COMM)
    assert _ep_group_args((1, 0, None)) == (1, 0, 0)
    assert _ep_group_args(_ProcessGroup(1, 0)) == (1, 0, 0)
    assert _ep_group_args(_ProcessGroup(np.int32(8), np.int64(3))) == (8, 3, 0)
    for bad, message in [((1, 0), "ep_group: expected (size, rank, nccl_comm), got 2 values"),
                         ("ep", "ep_group: expected None, (size, rank, nccl_comm) or a "
                                "process group with size() and rank()"),
                         ((1.0, 0, 0), "ep_group: size must be an int, got float"),
                         ((1, True, 0), "ep_group: rank must be an int, got bool")]:
        with raises(TypeError, message):
            _ep_group_args(bad)
    layer = layer_of(scalar)
    layer.set_ep_group(*_ep_group_args(_ProcessGroup(1, 0)))
    assert layer.ep_group == (1, 0, 0)
    # A process group of 8: its communicator is not taken from here (a
    # layer joins one through mok.Communicator.adopt and bind_comm).
    with raises(mok.MokRuntimeError, "ep_group: expert parallelism (size 8) needs an "
                "NCCL communicator, got nccl_comm NULL"):
        layer.set_ep_group(*_ep_group_args(_ProcessGroup(8, 3)))
    with raises(mok.MokRuntimeError, "ep_group: size 8: a layer joins"):
        layer.set_ep_group(*_ep_group_args((8, 3, COMM)))
    assert layer.ep_group == (1, 0, 0)


def test_gpu_artifact_load_refuses_the_ep_group_before_loading(scalar, monkeypatch):
    """The group is set before torch.cuda or the driver is touched: a stub
    torch without `cuda` is enough to see the refusal."""
    import types
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    for group, message in [((2, 1, COMM), "ep_group: size 2: a layer joins"),
                           (_ProcessGroup(4, 0), "(size 4) needs an NCCL communicator")]:
        with raises(mok.MokRuntimeError, message):
            scalar.load(ep_group=group)
    # So is a communicator of the wrong type.
    with raises(TypeError, "comm: expected a mok.Communicator or None, got int"):
        scalar.load(comm=3)
    with raises(TypeError, "ep_group: expected (size, rank, nccl_comm)"):
        scalar.load(device=0, ep_group=(2, 1))
    # EP = 1 gets past the group, to torch.cuda (absent from the stub).
    with pytest.raises(AttributeError, match="cuda"):
        scalar.load(ep_group=(1, 0, 0))


# A layer for any token count (LayerSpec(tokens=None, max_tokens=...)): the
# runtime's checks at the call's T, and GpuLayer's T = 0 and capacity.
ANY_T = mok.LayerSpec(hidden=512, intermediate=256, experts=8, top_k=2, padding=128,
                      shared_intermediate=256, max_tokens=300)


@pytest.fixture(scope="module")
def any_t_forward():
    return mok.compile(ANY_T, target="sm_90a")


@pytest.fixture(scope="module")
def any_t_training():
    return mok.compile(ANY_T, target="sm_90a", training=True)


def _any_t_inputs(torch, tokens, spec=ANY_T):
    h, i, e, k, s = (spec.hidden, spec.intermediate, spec.experts, spec.top_k,
                     spec.shared_intermediate)
    bf = torch.bfloat16
    return dict(x=torch.zeros(tokens, h, dtype=bf),
                top_experts=torch.zeros(tokens, k, dtype=torch.int32),
                router_weights=torch.zeros(tokens, k),
                gate_weights=torch.zeros(e, i, h, dtype=bf),
                up_weights=torch.zeros(e, i, h, dtype=bf),
                down_weights=torch.zeros(e, h, i, dtype=bf),
                shared_gate_weights=torch.zeros(s, h, dtype=bf),
                shared_up_weights=torch.zeros(s, h, dtype=bf),
                shared_down_weights=torch.zeros(h, s, dtype=bf))


def test_any_t_metadata_says_which_rows_follow_t(any_t_forward):
    meta = any_t_forward.metadata
    assert meta["mok_metadata_version"] == 5  # 4's keys, and params' "align"
    assert meta["any_tokens"] is True and meta["max_tokens"] == 300
    params = {p["name"]: p for p in meta["params"]}
    # What the kernel writes whole is 16-byte aligned; inputs as they come.
    assert params["out"]["align"] == 16 and params["route_row"]["align"] == 16
    assert "align" not in params["x"] and "align" not in params["tokens"]
    assert params["tokens"]["role"] == "tokens" and params["tokens"]["shape"] == []
    assert params["x"]["shape"] == [300, 512] and params["x"]["call_rows"] == [1, 0]
    assert params["route_row"]["call_rows"] == [2, 0]
    assert params["row_route"]["call_rows"] == [2, 8 * 127]
    assert "call_rows" not in params["gate_weights"]
    rows = {m["buffer"]: m.get("call_rows") for m in meta["tensor_maps"]}
    assert rows["x"] == [1, 0] and rows["shared_gate_weights"] is None


def test_any_t_layer_checks_every_tensor_at_the_calls_t(any_t_forward, monkeypatch):
    layer, torch = _cpu_gpu_layer(any_t_forward.metadata, monkeypatch)
    assert layer.any_tokens and layer.max_tokens == 300
    for tokens in (300, 1, 67):
        out = layer(**_any_t_inputs(torch, tokens))
        assert list(out.shape) == [tokens, 512]
    assert len(layer._layer.calls) == 3
    # Past the capacity: refused by GpuLayer, and by the runtime itself.
    with raises(ValueError, "x: 301 tokens, more than this layer's capacity "
                            "max_tokens = 300"):
        layer(**_any_t_inputs(torch, 301))
    args = _any_t_inputs(torch, 301)
    with raises(mok.MokRuntimeError, "x: 301 tokens (rows); the layer takes 1 to "
                                     "max_tokens = 300"):
        layer._layer.layer.check(args, out=torch.empty(301, 512, dtype=torch.bfloat16))
    zero = _any_t_inputs(torch, 0)
    with raises(mok.MokRuntimeError, "x: 0 tokens (rows); the layer takes 1 to "
                                     "max_tokens = 300 (T = 0 has nothing to compute"):
        layer._layer.layer.check(zero, out=torch.empty(0, 512, dtype=torch.bfloat16))
    # Every other tensor at the call's T.
    args = _any_t_inputs(torch, 5)
    args["top_experts"] = torch.zeros(6, 2, dtype=torch.int32)
    with raises(ValueError, "top_experts: expected shape [5, 2], got [6, 2]"):
        layer(**args)
    args["top_experts"] = torch.zeros(5, 2, dtype=torch.int32)
    with raises(mok.MokRuntimeError, "out"):
        layer._layer.layer.check(args, out=torch.empty(6, 512, dtype=torch.bfloat16))
    # T = 0: an empty output, no launch.
    out = layer(**_any_t_inputs(torch, 0))
    assert list(out.shape) == [0, 512] and len(layer._layer.calls) == 3


def test_any_t_training_layer_sizes_its_context_for_the_call(any_t_training, monkeypatch):
    layer, torch = _cpu_training_layer(any_t_training, monkeypatch)
    assert layer.any_tokens and layer.max_tokens == 300
    for tokens in (7, 300):
        args = _any_t_inputs(torch, tokens)
        out, ctx = layer.forward(**args)
        assert list(out.shape) == [tokens, 512]
        routed = tokens * 2 + 8 * 127
        assert list(ctx.saved["routed_x"].shape) == [routed, 512]
        assert list(ctx.saved["shared_hidden"].shape) == [tokens, 256]
        d_out = torch.zeros(tokens, 512, dtype=torch.bfloat16)
        grads = layer.backward(ctx, d_out)  # the runtime's checks of every tensor
        assert list(grads["x"].shape) == [tokens, 512]
        assert list(grads["gate_weights"].shape) == [8, 256, 512]
    # T = 0: nothing launched, zero weight gradients.
    calls = len(layer._backward._layer.calls)
    out, ctx = layer.forward(**_any_t_inputs(torch, 0))
    grads = layer.backward(ctx, torch.zeros(0, 512, dtype=torch.bfloat16))
    assert len(layer._backward._layer.calls) == calls
    assert list(grads["x"].shape) == [0, 512]
    assert not grads["gate_weights"].any() and not grads["shared_down_weights"].any()


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_weights_training_layer_quantizes_and_refreshes(monkeypatch, tmp_path_factory,
                                                            precision):
    """Fp8WeightsTrainingLayer (mok.torch.MoELayer's wrapper of a training
    layer compiled with fp8_quantized_weights): called with the bf16 routed
    weights, both kernels get mok.ops.fp8_quantize's copies in both
    layouts; the copies are reused while a weight is unchanged, refreshed
    in place (same addresses, new values) after an in-place update, and
    the backward gets the forward's; T = 0's checks name the bf16 weights."""
    torch = pytest.importorskip("torch")
    import mok.ops
    from mok._gpu_train import Fp8WeightsTrainingLayer
    spec = mok.LayerSpec(hidden=128, intermediate=128, experts=4, top_k=2, tokens=4,
                         padding=128, precision=precision)
    mx = precision == "mxfp8"
    quantizer = mok.ops.mxfp8_quantize if mx else mok.ops.fp8_quantize

    def expected(w):  # (values, scales, values_t, scales_t) as the kernels take them
        v, s, vt, st = quantizer(w, True, True)
        return ((v, mok.ops.mxfp8_scale_atoms(s), vt, mok.ops.mxfp8_scale_atoms(st)) if mx
                else (v, s, vt, st))
    try:
        art = mok.compile(spec, target="sm_90a", training=True, fp8_quantized_weights=True,
                          tensor_cores=not mx, cache_dir=str(tmp_path_factory.mktemp("c")))
    except ImportError as e:  # a GPU machine without the carried mok-compile
        pytest.skip(str(e))
    fwd, _ = _cpu_gpu_layer(art.forward.metadata, monkeypatch)
    bwd, _ = _cpu_gpu_layer(art.backward.metadata, monkeypatch)
    inner = object.__new__(mok.GpuTrainingLayer)
    inner._init(art, fwd, bwd)
    layer = Fp8WeightsTrainingLayer(inner)
    assert layer.arg_names == ["x", "top_experts", "router_weights", "gate_weights",
                               "up_weights", "down_weights"]
    assert "gate_qt" in layer.kernel_arg_names
    made = []

    def counted(*a, **kw):
        made.append(a[0].data_ptr())
        return quantizer(*a, **kw)
    monkeypatch.setattr(mok.ops, "mxfp8_quantize" if mx else "fp8_quantize", counted)
    g = torch.Generator().manual_seed(3)
    weights = {w: torch.randn(4, 128, 128, generator=g).to(torch.bfloat16)
               for w in ("gate_weights", "up_weights", "down_weights")}
    args = dict(x=torch.randn(4, 128, generator=g).to(torch.bfloat16),
                top_experts=torch.zeros(4, 2, dtype=torch.int32),
                router_weights=torch.ones(4, 2), **weights)
    out, ctx = layer.forward(**args)
    assert set(ctx.inputs) == set(args) and ctx.inputs["gate_weights"] is weights["gate_weights"]
    (named, _, _), = fwd._layer.calls
    assert "gate_weights" not in named
    for w in ("gate", "up", "down"):
        want = expected(weights[w + "_weights"])
        for suffix, t in zip(("_q", "_scale", "_qt", "_scale_t"), want):
            got = named[w + suffix]
            assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn
                               else got, t.view(torch.uint8)
                               if t.dtype == torch.float8_e4m3fn else t), w + suffix
    gate_q = named["gate_q"]
    assert len(made) == 3  # (by the layer; the check above calls the unpatched one)
    del made[:]
    layer.backward(ctx, torch.zeros(4, 128, dtype=torch.bfloat16))
    (bnamed, _, _), = bwd._layer.calls
    assert bnamed["gate_q"].data_ptr() == gate_q.data_ptr()
    assert bnamed["gate_qt"].data_ptr() == named["gate_qt"].data_ptr()
    assert "gate_weights" not in bnamed
    # Unchanged: the same copies; updated in place: refreshed in place.
    layer.forward(**args)
    assert fwd._layer.calls[-1][0]["gate_q"].data_ptr() == gate_q.data_ptr()
    assert made == []  # (the backward and the second forward: none made)
    before = gate_q.view(torch.uint8).clone()
    with torch.no_grad():
        weights["gate_weights"].mul_(-1)
    layer.forward(**args)
    assert made == [weights["gate_weights"].data_ptr()]
    again = fwd._layer.calls[-1][0]["gate_q"]
    assert again.data_ptr() == gate_q.data_ptr() and not torch.equal(again.view(torch.uint8),
                                                                      before)
    want = expected(weights["gate_weights"])
    assert torch.equal(again.view(torch.uint8), want[0].view(torch.uint8))
    scale = fwd._layer.calls[-1][0]["gate_scale_t"]
    assert torch.equal(scale.view(torch.uint8) if mx else scale,
                       want[3].view(torch.uint8) if mx else want[3])
    # A write the version counter misses (through .data): refresh_weights.
    weights["gate_weights"].data.mul_(-1)
    layer.forward(**args)
    assert made == [weights["gate_weights"].data_ptr()]
    layer.refresh_weights()
    layer.forward(**args)
    assert sorted(made) == sorted([weights["gate_weights"].data_ptr()] +
                                  [w.data_ptr() for w in weights.values()])
    assert torch.equal(fwd._layer.calls[-1][0]["gate_q"].view(torch.uint8),
                       before if not mx else expected(weights["gate_weights"])[0]
                       .view(torch.uint8))
    # Copies first made under inference mode still refresh in place.
    fresh = Fp8WeightsTrainingLayer(inner)
    with torch.inference_mode():
        fresh.forward(**args)
    with torch.no_grad():
        weights["up_weights"].mul_(2)
    fresh.forward(**args)
    # Arguments named as the caller passes them.
    with pytest.raises(ValueError, match=r"gate_weights: expected a torch.bfloat16 tensor "
                                         r"of shape \[4, 128, 128\] on cpu, got "
                                         r"torch.float32"):
        layer.forward(**dict(args, gate_weights=weights["gate_weights"].float()))
    with pytest.raises(TypeError, match="gate_weights: this layer takes its routed weights "
                                        "quantized"):
        layer.bind_weights("gate_weights", weights["gate_weights"])
    assert [p["name"] for p in layer.input_params] == layer.arg_names
    assert layer.input_params[3]["dtype"] == "bf16"
    assert layer.input_params[3]["shape"] == [4, 128, 128]
    with pytest.raises(ValueError, match="compiled without fp8_quantized_weights"):
        plain = mok.compile(spec, target="sm_90a", training=True, tensor_cores=not mx,
                            cache_dir=str(tmp_path_factory.mktemp("p")))
        pf, _ = _cpu_gpu_layer(plain.forward.metadata, monkeypatch)
        pb, _ = _cpu_gpu_layer(plain.backward.metadata, monkeypatch)
        other = object.__new__(mok.GpuTrainingLayer)
        other._init(plain, pf, pb)
        Fp8WeightsTrainingLayer(other)


def test_gpu_layer_takes_fp8_weight_inputs(monkeypatch, tmp_path_factory):
    """An FP8 layer compiled with fp8_quantized_weights: GpuLayer and the
    runtime take torch's float8_e4m3fn tensors (mok.ops.fp8_quantize's)
    and f32 scales for the routed weights, and name a wrong dtype."""
    torch = pytest.importorskip("torch")
    import mok.ops
    spec = mok.LayerSpec(hidden=128, intermediate=128, experts=4, top_k=2, tokens=4,
                         padding=128, precision="fp8")
    try:
        art = mok.compile(spec, target="sm_90a", fp8_quantized_weights=True,
                          cache_dir=str(tmp_path_factory.mktemp("c")))
    except ImportError as e:  # a GPU machine without the carried mok-compile
        pytest.skip(str(e))
    layer, torch = _cpu_gpu_layer(art.metadata, monkeypatch)
    args = dict(x=torch.zeros(4, 128, dtype=torch.bfloat16),
                top_experts=torch.zeros(4, 2, dtype=torch.int32),
                router_weights=torch.zeros(4, 2))
    for w, shape in (("gate", (4, 128, 128)), ("up", (4, 128, 128)), ("down", (4, 128, 128))):
        args[w + "_q"], args[w + "_scale"], _, _ = mok.ops.fp8_quantize(
            torch.randn(*shape).to(torch.bfloat16))
    out = layer(**args)
    assert out.dtype == torch.bfloat16 and list(out.shape) == [4, 128]
    (named, _, _), = layer._layer.calls
    assert named["gate_q"].dtype == torch.float8_e4m3fn
    with raises(TypeError, "gate_q: expected dtype torch.float8_e4m3fn, got torch.uint8"):
        layer(**dict(args, gate_q=args["gate_q"].view(torch.uint8)))
