# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""GPU layers: compile to PTX + metadata (needs the compiler extension), and
run them with torch through the mok runtime (needs neither MLIR nor the
extension: only libmok_runtime.so and a CUDA driver).

The runtime is reached through ctypes for now; the calls are the C API of
runtime/include/mok/Runtime/mok_runtime.h.
"""
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__version__ = "0.1.0"

_DTYPES = {"bf16": "bfloat16", "f32": "float32", "i32": "int32", "i64": "int64"}


def _cache_dir(cache_dir):
    return cache_dir or os.environ.get("MOK_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "mok")


@dataclass
class GpuArtifact:
    """What the compiler emits for one layer on one GPU target."""
    ptx: str
    metadata: dict
    path: str = ""

    @property
    def kernel(self):
        return self.metadata["kernel"]

    def save(self, directory):
        os.makedirs(directory, exist_ok=True)
        base = os.path.join(directory, self.metadata["function"])
        with open(base + ".ptx", "w") as f:
            f.write(self.ptx)
        with open(base + ".json", "w") as f:
            json.dump(self.metadata, f, indent=2)
        return base

    @staticmethod
    def from_files(base):
        """Reads <base>.ptx and <base>.json, as save() wrote them."""
        with open(base + ".ptx") as f:
            ptx = f.read()
        with open(base + ".json") as f:
            metadata = json.load(f)
        if metadata.get("mok_metadata_version") != 1:
            raise ValueError(f"{base}.json: unsupported metadata version "
                             f"{metadata.get('mok_metadata_version')!r}")
        return GpuArtifact(ptx, metadata, base)

    def load(self, device=0, runtime_library=None):
        """A callable GpuLayer on CUDA `device`."""
        return GpuLayer(self, device, runtime_library)


def _compile_with_extension(source, name, target, function, toolkit):
    from . import _mok
    module = _mok.Module.parse(source, name)
    kernels = [k for k in module.compile_gpu(target, toolkit) if k.function == function]
    if not kernels:
        raise ValueError(f"no fused forward layer in @{function}")
    return GpuArtifact(kernels[0].ptx, json.loads(kernels[0].metadata))


def _find_compiler():
    here = os.path.dirname(__file__)
    for c in [os.environ.get("MOK_COMPILER"),
              os.path.join(here, "..", "..", "bin", "mok-compile"),
              shutil.which("mok-compile"), shutil.which("mok-compile-static")]:
        if c and os.access(c, os.X_OK):
            return c
    return None


def _compile_with_tool(tool, source, target, function, toolkit):
    """The same through the mok-compile binary (e.g. the static one carried
    to a GPU machine without MLIR)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "layer.mlir")
        with open(path, "w") as f:
            f.write(source)
        proc = subprocess.run([tool, path, "--chip", target, "--toolkit", toolkit,
                               "-o", tmp], capture_output=True, text=True)
        if proc.returncode:
            raise ValueError(proc.stderr.strip() or f"{tool} failed")
        base = os.path.join(tmp, function)
        if not os.path.exists(base + ".ptx"):
            raise ValueError(f"no fused forward layer in @{function}")
        return GpuArtifact.from_files(base)


def compile_gpu(source, name, target, function, cache_dir):
    key = hashlib.sha256("\0".join([source, target, function, __version__]).encode())
    directory = os.path.join(_cache_dir(cache_dir), key.hexdigest()[:24])
    base = os.path.join(directory, function)
    if os.path.exists(base + ".json") and os.path.exists(base + ".ptx"):
        return GpuArtifact.from_files(base)
    toolkit = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    try:
        artifact = _compile_with_extension(source, name, target, function, toolkit)
    except ImportError:
        tool = _find_compiler()
        if tool is None:
            raise ImportError("compiling for a GPU needs the compiler: the mok._mok "
                              "extension (build/python) or the mok-compile binary "
                              "(set MOK_COMPILER)") from None
        artifact = _compile_with_tool(tool, source, target, function, toolkit)
    artifact.path = artifact.save(directory)
    return artifact


class MokRuntimeError(RuntimeError):
    """A failing runtime call; the message is the runtime's, naming the
    argument or the driver call."""


class _Tensor(ctypes.Structure):
    """mok_tensor."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4)]


class _NamedTensor(ctypes.Structure):
    """mok_named_tensor."""
    _fields_ = [("name", ctypes.c_char_p), ("tensor", _Tensor)]


_MOK_DTYPE = {"bfloat16": 1, "float32": 2, "int32": 3, "int64": 4}


def _load_runtime(path=None):
    candidates = [path, os.environ.get("MOK_RUNTIME_LIBRARY"),
                  os.path.join(os.path.dirname(__file__), "..", "..", "lib",
                               "libmok_runtime.so"),
                  "libmok_runtime.so"]
    errors = []
    for c in candidates:
        if not c:
            continue
        try:
            lib = ctypes.CDLL(c)
            break
        except OSError as e:
            errors.append(f"{c}: {e}")
    else:
        raise OSError("the mok runtime library (libmok_runtime.so) was not found; set "
                      "MOK_RUNTIME_LIBRARY. Tried: " + "; ".join(errors))
    P = ctypes.c_void_p
    lib.mok_last_error.restype = ctypes.c_char_p
    lib.mok_layer_create.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
    lib.mok_layer_load.argtypes = [P, ctypes.c_int, ctypes.c_char_p]
    lib.mok_layer_forward.argtypes = [P, ctypes.POINTER(_NamedTensor), ctypes.c_size_t,
                                      ctypes.POINTER(_Tensor), P]
    lib.mok_layer_destroy.argtypes = [P]
    return lib


def _describe(t, name=None):
    """A mok_tensor (or mok_named_tensor) over a torch tensor's storage."""
    d = _Tensor(t.data_ptr(), _MOK_DTYPE[str(t.dtype).replace("torch.", "")], t.dim())
    for i, (n, st) in enumerate(zip(t.shape, t.stride())):
        d.shape[i], d.strides[i] = n, st
    return d if name is None else _NamedTensor(name.encode(), d)


class GpuLayer:
    """A compiled forward layer on one CUDA device, called with torch tensors
    by argument name, as the CPU layer is. A thin layer over the runtime's
    mok_layer (which owns the module, the workspace and the TMA descriptors,
    and checks every argument against the metadata); torch-level checks
    (tensor type, device) are made here. Outputs are allocated per call and
    poisoned with NaN before the launch. Launches are asynchronous on torch's
    current stream and need no host synchronization, so they can be captured
    in a CUDA graph."""

    def __init__(self, artifact, device=0, runtime_library=None):
        import torch
        self.torch = torch
        self.meta = artifact.metadata
        self.device = torch.device("cuda", device)
        torch.cuda.init()  # the runtime uses the primary context torch uses
        self._rt = _load_runtime(runtime_library)
        handle = ctypes.c_void_p()
        self._check(self._rt.mok_layer_create(json.dumps(self.meta).encode(),
                                              ctypes.byref(handle)))
        self._layer = handle
        self._check(self._rt.mok_layer_load(handle, device, artifact.ptx.encode()))
        params = self.meta["params"]
        self.inputs = [p for p in params if p["role"] == "input"]
        self.output = next(p for p in params if p["role"] == "output")

    def _check(self, status):
        if status != 0:
            raise MokRuntimeError(self._rt.mok_last_error().decode())

    def _validate(self, name, t, p):
        """Checks one argument in torch terms; returns it as a torch tensor
        (any DLPack-capable GPU array — CuPy, JAX, ... — is taken zero-copy)."""
        torch = self.torch
        want = getattr(torch, _DTYPES[p["dtype"]])
        if not isinstance(t, torch.Tensor) and hasattr(t, "__dlpack__"):
            t = torch.from_dlpack(t)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor ({p['dtype']} {p['shape']}), "
                            f"got {type(t).__name__}")
        if t.dtype != want:
            raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
        if list(t.shape) != list(p["shape"]):
            raise ValueError(f"{name}: expected shape {list(p['shape'])}, got {list(t.shape)}")
        if t.device != self.device:
            raise ValueError(f"{name}: expected a tensor on {self.device}, got {t.device}")
        return t

    def __call__(self, *args, **kwargs):
        names = [p["name"] for p in self.inputs]
        if len(args) > len(names):
            raise TypeError(f"expected at most {len(names)} arguments ({', '.join(names)})")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise TypeError(f"unexpected or repeated argument {k!r}; expected "
                                f"{', '.join(names)}")
            bound[k] = v
        missing = [n for n in names if n not in bound]
        if missing:
            raise TypeError(f"missing argument(s): {', '.join(missing)}")
        for p in self.inputs:
            bound[p["name"]] = self._validate(p["name"], bound[p["name"]], p)
        torch = self.torch
        out = torch.full(self.output["shape"], float("nan"), dtype=torch.bfloat16,
                         device=self.device)
        inputs = (_NamedTensor * len(names))(*[_describe(bound[n], n) for n in names])
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._check(self._rt.mok_layer_forward(self._layer, inputs, len(names),
                                               ctypes.byref(_describe(out)),
                                               ctypes.c_void_p(stream)))
        return out

    def __del__(self):
        if getattr(self, "_layer", None):
            self._rt.mok_layer_destroy(self._layer)
