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


def compile_gpu(source, name, target, function, cache_dir):
    from . import _mok
    key = hashlib.sha256("\0".join([source, target, function, __version__]).encode())
    directory = os.path.join(_cache_dir(cache_dir), key.hexdigest()[:24])
    base = os.path.join(directory, function)
    if os.path.exists(base + ".json") and os.path.exists(base + ".ptx"):
        return GpuArtifact.from_files(base)
    module = _mok.Module.parse(source, name)
    toolkit = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    kernels = [k for k in module.compile_gpu(target, toolkit) if k.function == function]
    if not kernels:
        raise ValueError(f"no fused forward layer in @{function}")
    artifact = GpuArtifact(kernels[0].ptx, json.loads(kernels[0].metadata))
    artifact.path = artifact.save(directory)
    return artifact


class MokRuntimeError(RuntimeError):
    """A failing runtime call; the message is the runtime's, naming the
    argument or the driver call."""


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
    lib.mok_last_error.restype = ctypes.c_char_p
    lib.mok_module_load_ptx.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                        ctypes.POINTER(ctypes.c_void_p)]
    lib.mok_module_launch.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                      ctypes.POINTER(ctypes.c_uint32),
                                      ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32,
                                      ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.c_uint32]
    lib.mok_device_sm_count.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.mok_module_destroy.argtypes = [ctypes.c_void_p]
    lib.mok_tma_descriptor_2d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                          ctypes.c_int64, ctypes.c_int64, ctypes.c_uint32,
                                          ctypes.c_uint32]
    return lib


class GpuLayer:
    """A compiled forward layer on one CUDA device, called with torch tensors
    (inputs by name, as in the CPU layer). Outputs are allocated per call
    and poisoned with NaN before the launch; the workspace is allocated once.
    Launches are asynchronous on torch's current stream and need no host
    synchronization, so they can be captured in a CUDA graph."""

    COOPERATIVE = 1

    def __init__(self, artifact, device=0, runtime_library=None):
        import torch
        self.torch = torch
        self.meta = artifact.metadata
        self.device = torch.device("cuda", device)
        self._rt = _load_runtime(runtime_library)
        handle = ctypes.c_void_p()
        self._check(self._rt.mok_module_load_ptx(device, artifact.ptx.encode(),
                                                 ctypes.byref(handle)))
        self._module = handle
        sms = ctypes.c_int()
        self._check(self._rt.mok_device_sm_count(device, ctypes.byref(sms)))
        self.grid = sms.value  # persistent: one CTA per multiprocessor
        self.block = int(self.meta["block"])
        params = self.meta["params"]
        self.inputs = [p for p in params if p["role"] == "input"]
        self.output = next(p for p in params if p["role"] == "output")
        self.workspace = {}
        for p in params:
            if p["role"] in ("workspace", "tensor_maps"):
                t = torch.empty(p["shape"], dtype=getattr(torch, _DTYPES[p["dtype"]]),
                                device=self.device)
                if p["name"] in self.meta.get("zero_before_first_launch", []):
                    t.zero_()
                self.workspace[p["name"]] = t
        # TMA descriptors of the buffers the kernel reads by tiles, rebuilt
        # only when a buffer's address changes (never during graph replay).
        self.maps = self.meta.get("tensor_maps", [])
        self._map_key = None
        self._map_host = None
        if self.maps:
            storage = next(p["name"] for p in params if p["role"] == "tensor_maps")
            self._map_device = self.workspace[storage]
            # 128 bytes a map, 64-byte aligned (CUtensorMap's alignment).
            self._map_raw = ctypes.create_string_buffer(128 * len(self.maps) + 64)
            base = ctypes.addressof(self._map_raw)
            self._map_base = base + (-base) % 64

    def _check(self, status):
        if status != 0:
            raise MokRuntimeError(self._rt.mok_last_error().decode())

    def _validate(self, name, t, p):
        torch = self.torch
        want = getattr(torch, _DTYPES[p["dtype"]])
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor ({p['dtype']} {p['shape']}), "
                            f"got {type(t).__name__}")
        if t.dtype != want:
            raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
        if list(t.shape) != list(p["shape"]):
            raise ValueError(f"{name}: expected shape {list(p['shape'])}, got {list(t.shape)}")
        if t.device != self.device:
            raise ValueError(f"{name}: expected a tensor on {self.device}, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: expected 16-byte aligned data")

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
            self._validate(p["name"], bound[p["name"]], p)
        torch = self.torch
        out = torch.full(self.output["shape"], float("nan"), dtype=torch.bfloat16,
                         device=self.device)
        by_name = dict(bound)
        by_name[self.output["name"]] = out
        by_name.update(self.workspace)
        buffers = [by_name[p["name"]] for p in self.meta["params"]]
        if self.maps:
            self._update_tensor_maps(by_name)
        values = (ctypes.c_uint64 * len(buffers))(*[b.data_ptr() for b in buffers])
        params = (ctypes.c_void_p * len(buffers))(
            *[ctypes.addressof(values) + 8 * i for i in range(len(buffers))])
        grid = (ctypes.c_uint32 * 3)(self.grid, 1, 1)
        block = (ctypes.c_uint32 * 3)(self.block, 1, 1)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._check(self._rt.mok_module_launch(
            self._module, self.meta["kernel"].encode(), grid, block,
            int(self.meta.get("dynamic_shared_memory", 0)), ctypes.c_void_p(stream),
            params, self.COOPERATIVE if self.meta.get("cooperative") else 0))
        return out

    def _update_tensor_maps(self, by_name):
        key = tuple(by_name[m["buffer"]].data_ptr() for m in self.maps)
        if key == self._map_key:
            return
        for i, (m, ptr) in enumerate(zip(self.maps, key)):
            self._check(self._rt.mok_tma_descriptor_2d(
                ctypes.c_void_p(self._map_base + 128 * i), ctypes.c_void_p(ptr),
                m["rows"], m["cols"], m["row_stride"], m["box_rows"], m["box_cols"]))
        torch = self.torch
        host = torch.frombuffer(
            (ctypes.c_char * (128 * len(self.maps))).from_address(self._map_base),
            dtype=torch.int64).clone()
        self._map_device.copy_(host.view(self._map_device.shape))
        self._map_key = key

    def __del__(self):
        if getattr(self, "_module", None):
            self._rt.mok_module_destroy(self._module)
