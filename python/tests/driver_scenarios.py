# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Scenarios run in a process of their own, with the stand-in CUDA driver
(runtime/tests/FakeCuda.cpp, <build>/lib/libmok_fake_cuda.so) as
MOK_CUDA_DRIVER: layers really loaded, run and destroyed through
mok._runtime without a GPU (the runtime loads its driver once a process,
hence the process). test_runtime_driver.py and test_leaks.py run them:

    python3 driver_scenarios.py SCENARIO [SEED]

Each prints one JSON line of what it measured, then exits (nanobind reports
leaked instances on stderr at that exit)."""
import ctypes
import gc
import json
import os
import random
import sys

import numpy as np

import mok
from mok import _runtime as rt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from properties import CUDA0, DTYPES, Producer, dense  # noqa: E402
from test_api_properties import RT_META, _RT_PARAMS, _rt_mutation  # noqa: E402

LIB = os.path.join(os.path.dirname(os.path.abspath(rt.__file__)), "..", "..", "lib")
FAKE = os.path.join(LIB, "libmok_fake_cuda.so")
RUNTIME = os.path.join(LIB, "libmok_runtime.so")
PTX = ".version 8.1\n.target sm_90a\n.address_size 64\n.visible .entry k(\n)\n{\n  ret;\n}\n"

CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_LAUNCH_FAILED = 2, 400, 719


def available():
    """Why the scenarios cannot run here ("" when they can)."""
    for path in (FAKE, RUNTIME):
        if not os.path.exists(path):
            return f"{path} is not built (the runtime's tests, MOK_BUILD_TESTS)"
    return ""


class Fake:
    """The stand-in's counters, and the runtime's injected failures."""

    def __init__(self):
        self.lib = ctypes.CDLL(FAKE)
        for name in ("live_allocations", "live_bytes", "live_modules", "context_retains",
                     "bad_releases", "launches", "tensor_maps"):
            getattr(self.lib, "mok_fake_cuda_" + name).restype = ctypes.c_int64
        self.lib.mok_fake_cuda_cubin.restype = ctypes.c_size_t
        self.lib.mok_fake_cuda_cubin.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                                 ctypes.c_void_p, ctypes.c_size_t]
        self.runtime = ctypes.CDLL(RUNTIME)
        self.runtime.mok_testing_fail_driver_call.restype = ctypes.c_int
        self.runtime.mok_testing_fail_driver_call.argtypes = [
            ctypes.c_char_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        self.runtime.mok_testing_driver_calls.restype = ctypes.c_int64
        self.runtime.mok_testing_driver_calls.argtypes = [ctypes.c_char_p]

    def count(self, name):
        return getattr(self.lib, "mok_fake_cuda_" + name)()

    def clean(self):
        return {n: self.count(n) for n in ("live_allocations", "live_modules",
                                           "context_retains", "bad_releases")}

    def cubin(self, chip, ptx):
        """The stand-in's cubin of `ptx`'s kernels for `chip` (bytes)."""
        size = self.lib.mok_fake_cuda_cubin(chip.encode(), ptx.encode(), None, 0)
        buf = ctypes.create_string_buffer(size)
        self.lib.mok_fake_cuda_cubin(chip.encode(), ptx.encode(), buf, size)
        return buf.raw

    def calls(self, function):
        """The runtime's calls of driver entry point `function` so far."""
        return self.runtime.mok_testing_driver_calls(function.encode())

    def inject(self, function, result, skip=0, times=1):
        status = self.runtime.mok_testing_fail_driver_call(function.encode(), result, skip,
                                                           times)
        assert status == 0, function


def _good(device=CUDA0):
    args = {n: dense(_RT_PARAMS[n]["shape"], _RT_PARAMS[n]["dtype"], device)
            for n in ("x", "top_experts", "router_weights", "gate", "d_router_weights")}
    return args, dense(_RT_PARAMS["out"]["shape"], "bf16", device)


def _on_cuda(value):
    """A CPU Producer moved to cuda:0 (the same memory: the stand-in's
    "device" memory is host memory), other values as they are."""
    if isinstance(value, Producer) and value.device[0] == 1:
        value.device = CUDA0
    return value


def loaded_arguments(seed, cases):
    """The argument mutations of test_api_properties.py on a loaded layer's
    forward: every one named, none launched; the valid ones launched."""
    fake, g = Fake(), random.Random(f"{seed}/loaded")
    layer = rt.Layer(json.dumps(RT_META))
    layer.load(0, PTX)
    report = {"named": 0, "launched": 0, "problems": []}
    for case in range(cases):
        args, out = _good()
        kind, names, call = _rt_mutation(g, args, out)
        # check(...) calls become forward(...) calls on CUDA arrays.
        launches = fake.count("launches")

        def forward(layer):
            class Forward:
                def check(self, inputs=None, out=None, **named):
                    inputs = {k: _on_cuda(v) for k, v in (inputs or {}).items()}
                    named = {k: _on_cuda(v) for k, v in named.items()}
                    return layer.forward(inputs, out=_on_cuda(out), stream=0, **named)
            return call(Forward())
        try:
            forward(layer)
            ok = True
        except (TypeError, mok.MokRuntimeError) as e:
            ok = False
            # A loaded layer adds one check: the array's device (a CPU
            # producer, a NumPy scalar, another device are refused so).
            named = any(n in str(e) for n in names or []) or \
                ": expected a CUDA array on device 0, got " in str(e)
            if names is None and kind != "device":
                report["problems"].append(f"case {case} {kind}: refused: {e}")
            elif not named and kind != "device":
                report["problems"].append(f"case {case} {kind}: {e} names none of {names}")
            report["named"] += 1
        launched = fake.count("launches") - launches
        if ok and names is not None and kind != "device":
            report["problems"].append(f"case {case} {kind}: launched a wrong call")
        if launched != (1 if ok else 0):
            report["problems"].append(f"case {case} {kind}: {launched} launches")
        report["launched"] += launched
    # A loaded layer takes arrays on its own device only.
    args, out = _good((2, 1))
    try:
        layer.forward(args, out=out)
        report["problems"].append("cuda:1 arrays accepted by a layer on cuda:0")
    except mok.MokRuntimeError as e:
        report["device_error"] = str(e)
    del layer
    gc.collect()
    report["after"] = fake.clean()
    print(json.dumps(report))


def driver_failures(seed, cases):
    """Driver calls failing at random during loads, forwards and workspace
    reads: each a MokRuntimeError with the driver's status and the call
    named; a failed load leaves the layer unloaded, a failed forward the
    layer usable; nothing allocated, loaded or retained after the layers
    are gone."""
    fake, g = Fake(), random.Random(f"{seed}/failures")
    report = {"errors": {}, "problems": []}
    load_calls = ["cuDeviceGetAttribute", "cuModuleLoadDataEx", "cuMemAlloc", "cuMemsetD8",
                  "cuCtxSetCurrent", "cuDevicePrimaryCtxRetain", "cuDeviceGetCount"]
    forward_calls = ["cuStreamIsCapturing", "cuTensorMapEncodeTiled", "cuMemcpyHtoDAsync",
                     "cuLaunchCooperativeKernel", "cuModuleGetFunction", "cuCtxSetCurrent"]
    meta = dict(RT_META, zero_before_first_launch=["grid_barrier"])
    for case in range(cases):
        layer = rt.Layer(json.dumps(meta))
        function = g.choice(load_calls)
        result = g.choice([CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_HANDLE,
                           CUDA_ERROR_LAUNCH_FAILED])
        fake.inject(function, result, skip=g.choice([0, 0, 1, 2]))
        try:
            layer.load(0, PTX)
        except mok.MokRuntimeError as e:
            report["errors"][e.status] = report["errors"].get(e.status, 0) + 1
            if layer.device is not None:
                report["problems"].append(f"case {case}: {function}: loaded after a failure")
            if fake.count("live_allocations") or fake.count("live_modules"):
                report["problems"].append(f"case {case}: {function}: {fake.clean()} left")
        fake.runtime.mok_testing_fail_driver_call(None, 0, 0, 1)
        if layer.device is None:
            layer.load(0, PTX)  # a failed load may be retried
        args, out = _good()
        # A new address for x each case: the tensor maps are rebuilt.
        args["x"] = dense([4, 64], "bf16", CUDA0)
        function = g.choice(forward_calls)
        fake.inject(function, g.choice([CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_LAUNCH_FAILED]))
        try:
            layer.forward(args, out=out)
            report["problems"].append(f"case {case}: forward with {function} failing passed")
        except mok.MokRuntimeError as e:
            report["errors"][e.status] = report["errors"].get(e.status, 0) + 1
        fake.runtime.mok_testing_fail_driver_call(None, 0, 0, 1)
        launches = fake.count("launches")
        layer.forward(args, out=out)  # usable after the failure
        if fake.count("launches") != launches + 1:
            report["problems"].append(f"case {case}: no launch after {function} failed")
        fake.inject("cuMemcpyDtoH", CUDA_ERROR_LAUNCH_FAILED)
        try:
            layer.read_workspace("grid_barrier")
            report["problems"].append(f"case {case}: read_workspace passed")
        except mok.MokRuntimeError as e:
            report["read_error"] = str(e)
        barrier = np.frombuffer(layer.read_workspace("grid_barrier"), np.int32)
        if barrier.tolist() != [0, 0]:
            report["problems"].append(f"case {case}: grid_barrier not zeroed: {barrier}")
        del layer
    gc.collect()
    report["after"] = fake.clean()
    print(json.dumps(report))


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def load_unload_loop(seed, cycles):
    """Load, forward, drop `cycles` times: the stand-in's counts and this
    process's RSS before and after (after a warm-up of cycles // 10)."""
    fake = Fake()
    args, out = _good()

    def cycle():
        layer = rt.Layer(json.dumps(RT_META))
        layer.load(0, PTX)
        layer.forward(args, out=out)

    for _ in range(max(1, cycles // 10)):
        cycle()
    gc.collect()
    before = _rss_kib()
    for _ in range(cycles):
        cycle()
    gc.collect()
    print(json.dumps({"rss_before_kib": before, "rss_after_kib": _rss_kib(),
                      "launches": fake.count("launches"), "after": fake.clean()}))


def leaks(seed, cases):
    """What a trainer does with layers on a loaded driver, then exit with
    them dropped: create, load, forward, failing calls (errors caught and
    kept until the end: their tracebacks hold the layers' frames), reads,
    views."""
    fake = Fake()
    kept = []
    for case in range(cases):
        layer = rt.Layer(json.dumps(RT_META))
        layer.load(0, PTX)
        args, out = _good()
        layer.forward(args, out=out)
        try:
            layer.forward(dict(args, x=None), out=out)
        except TypeError as e:
            kept.append(e)  # an error keeps its traceback: the layer's frame
        try:
            layer.load(0, PTX)
        except mok.MokRuntimeError as e:
            kept.append(e)
        layer.read_workspace("grid_barrier")
        views = rt.weights_split_fc1(np.zeros((2, 8, 16), np.float32), "fc1")
        kept.append(views[0])
    print(json.dumps({"after_run": fake.clean(), "kept": len(kept)}))


def cubin_loads(seed, cases):
    """Layers loaded from a given cubin and from the PTX, through
    mok._runtime; artifacts carrying a cubin."""
    import tempfile
    fake = Fake()
    args, out = _good()
    report = {"problems": []}

    def load(ptx, cubin=None):
        layer = rt.Layer(json.dumps(RT_META))
        before = layer.load_source
        layer.load(0, ptx, cubin)
        layer.forward(args, out=out)
        return [before, list(layer.load_source)]

    jits = fake.calls("cuModuleLoadDataEx")
    report["first"] = load(PTX)
    report["jits"] = fake.calls("cuModuleLoadDataEx") - jits
    ours, theirs = fake.cubin("sm_90a", PTX), fake.cubin("sm_100a", PTX)
    report["given"] = load(PTX, ours)[1]
    report["alone"] = load(None, ours)[1]
    report["other_chip"] = load(PTX, theirs)[1]
    try:
        real = mok._artifact.make_cubin(PTX, "sm_90a")
        report["ptxas"] = [real[:4].decode("latin-1"), load(PTX, real)[1]]
    except FileNotFoundError as e:
        report["ptxas"] = str(e)
    report["errors"] = []
    for ptx, cubin in ((None, b""), (PTX, "text"), (None, None), (None, theirs)):
        try:
            load(ptx, cubin)
            report["problems"].append(f"load({ptx!r:.8}, {cubin!r:.8}) passed")
        except (TypeError, mok.MokRuntimeError) as e:
            report["errors"].append(f"{type(e).__name__}: {e}")
    # An artifact carrying a cubin: saved, read back, loaded from it.
    with tempfile.TemporaryDirectory() as tmp:
        meta = dict(RT_META, chip="sm_90a")
        base = mok.GpuArtifact(PTX, meta, cubin=ours).save(tmp)
        read = mok.GpuArtifact.from_files(base)
        report["artifact"] = [read.cubin == ours, sorted(os.listdir(tmp)),
                              load(read.ptx, read.cubin)[1][0]]
    report["after"] = fake.clean()
    print(json.dumps(report))


# A kernel with static shared memory (an mbarrier) and dynamic shared
# memory declared on a 1024-byte boundary, as the tensor-core kernels do.
ALIGNED_PTX = (".version 8.1\n.target sm_90a\n.address_size 64\n"
               ".extern .shared .align 1024 .b8 mok_dyn_smem[];\n"
               ".visible .entry k(\n  .param .u64 k_out\n)\n{\n"
               "  .shared .align 8 .b64 bar;\n  .reg .b32 %r<3>;\n  .reg .b64 %rd<2>;\n"
               "  mov.u32 %r1, bar;\n  mbarrier.init.shared.b64 [%r1], 1;\n"
               "  mov.u32 %r2, mok_dyn_smem;\n  ld.param.u64 %rd1, [k_out];\n"
               "  st.global.u32 [%rd1], %r2;\n  ret;\n}\n")


def toolkit():
    """(ptxas, nvlink) of the CUDA toolkit, or FileNotFoundError."""
    ptxas = mok._artifact.find_ptxas()
    nvlink = os.path.join(os.path.dirname(ptxas), "nvlink")
    if not os.access(nvlink, os.X_OK):
        raise FileNotFoundError(f"no nvlink beside {ptxas}")
    return ptxas, nvlink


def toolkit_cubins(seed, cases):
    """ALIGNED_PTX's cubins made by the toolkit, loaded beside it through
    mok._runtime: ptxas's whole-program one passes the runtime's check (the
    stand-in then refuses it: it runs no real machine code), the one linked
    from relocatable code (ptxas -c, nvlink) is not used."""
    import subprocess
    import tempfile
    fake = Fake()
    args, out = _good()
    ptxas, nvlink = toolkit()
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "k.ptx"), "w") as f:
            f.write(ALIGNED_PTX)
        for command in ([ptxas, "-arch=sm_90a", "k.ptx", "-o", "whole.cubin"],
                        [ptxas, "-c", "-arch=sm_90a", "k.ptx", "-o", "k.o"],
                        [nvlink, "-arch=sm_90a", "k.o", "-o", "linked.cubin"]):
            subprocess.run(command, cwd=tmp, check=True, capture_output=True)
        for name in ("whole", "linked"):
            with open(os.path.join(tmp, name + ".cubin"), "rb") as f:
                cubin = f.read()
            images = fake.calls("cuModuleLoadData")
            layer = rt.Layer(json.dumps(RT_META))
            layer.load(0, ALIGNED_PTX, cubin)
            layer.forward(args, out=out)
            report[name] = list(layer.load_source) + [fake.calls("cuModuleLoadData") - images]
            del layer
    gc.collect()
    report["after"] = fake.clean()
    print(json.dumps(report))


SCENARIOS = {"loaded_arguments": loaded_arguments, "driver_failures": driver_failures,
             "load_unload_loop": load_unload_loop, "leaks": leaks,
             "cubin_loads": cubin_loads, "toolkit_cubins": toolkit_cubins}

if __name__ == "__main__":
    name, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    SCENARIOS[name](seed, n)
