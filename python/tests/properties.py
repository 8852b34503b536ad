# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The property tests' generator and checks (test_api_properties.py, and
gpu/test_gpu_api_properties.py on the GPU machine): seeded cases, no
dependency. The seed is fixed, so CI runs the same cases every time;
MOK_PROPERTY_SEED=<n> picks other ones and MOK_PROPERTY_CASES=<n> sets how
many a property runs (default 300). A failure says its seed and case, which
reproduce it."""
import ctypes
import os
import random

import numpy as np

SEED = int(os.environ.get("MOK_PROPERTY_SEED", "27"))
CASES = int(os.environ.get("MOK_PROPERTY_CASES", "300"))


def generator(name):
    """The random source of property `name`: the same cases for one seed,
    whatever else runs (a str seed is hashed deterministically)."""
    return random.Random(f"{SEED}/{name}")


def where(prop, case):
    """How to name a case in a failure: enough to rerun it."""
    return f"[{prop}, case {case}, MOK_PROPERTY_SEED={SEED}]"


def expect(label, call, names, errors=(TypeError, ValueError)):
    """Runs call(), which must raise one of `errors` naming one of `names`
    (each a str the message must contain; any of them). Anything else — no
    error, another type, a message that names nothing — fails the case."""
    try:
        result = call()
    except errors as e:
        message = str(e)
        if not any(n in message for n in names):
            raise AssertionError(f"{label}: {type(e).__name__} names none of {names}: "
                                 f"{message!r}") from e
        return e
    except Exception as e:  # noqa: BLE001 - the point: no other exception
        raise AssertionError(f"{label}: expected {[t.__name__ for t in errors]} naming "
                             f"{names}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{label}: expected an error naming {names}, got a result "
                         f"{type(result).__name__}")


def succeed(label, call):
    """Runs call(), which must not raise; returns its result."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{label}: expected a result, got {type(e).__name__}: "
                             f"{e}") from e


# Values of every Python type an argument may wrongly be given.
WRONG_TYPES = [None, "x", b"x", 3, 2.5, True, [1, 2], (1, 2), {"a": 1}, object()]


def misaligned(array, offset=1):
    """A copy of `array` whose data starts `offset` bytes past an aligned
    address (not a multiple of its element size for offset 1)."""
    buf = np.zeros(array.nbytes + 64, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    out = buf[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def strided(array, step=2, axis=-1):
    """A view of a larger array holding `array`'s values every `step`
    elements along `axis`: the same shape and values, not contiguous."""
    shape = list(array.shape)
    shape[axis] *= step
    big = np.zeros(shape, array.dtype)
    index = [slice(None)] * array.ndim
    index[axis] = slice(None, None, step)
    view = big[tuple(index)]
    view[...] = array
    return view


# DLPack producers for the runtime extension's checks: any dtype, shape,
# strides (in elements), address and device over NumPy memory, which no
# kernel reads. dlpack.h's layout.
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


_DELETER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAME = ctypes.c_char_p(b"dltensor")
# DLPack (code, bits) of the runtime's dtypes.
DTYPES = {"bf16": (4, 16), "f32": (2, 32), "i32": (0, 32), "i64": (0, 64), "u8": (1, 8)}
CPU, CUDA0 = (1, 0), (2, 0)


class Producer:
    """A DLPack producer of `shape` and `strides` (elements; None: row-major)
    with dtype (code, bits, lanes) on `device`, whose data starts `offset`
    bytes into `memory` (a NumPy array kept alive with every capsule, which
    only the checks read)."""

    # What exported capsules point into, by the address of their managed
    # tensor, until the consumer calls its deleter.
    keep = {}

    def __init__(self, memory, shape, dtype=(4, 16, 1), strides=None, offset=0,
                 device=CPU):
        self.memory, self.shape, self.offset, self.device = memory, list(shape), offset, device
        self.dtype = dtype if len(dtype) == 3 else (*dtype, 1)
        if strides is None:
            strides, step = [], 1
            for d in reversed(self.shape):
                strides.insert(0, step)
                step *= max(d, 1)
        self.strides = list(strides)

    @property
    def address(self):
        return self.memory.ctypes.data + self.offset

    def extent(self):
        """[first byte, one past the last byte) it spans (elements laid by
        its strides; positive strides)."""
        size = (self.dtype[1] * self.dtype[2]) // 8
        if any(d == 0 for d in self.shape):
            return (self.address, self.address)
        last = sum((d - 1) * s for d, s in zip(self.shape, self.strides))
        return (self.address, self.address + (last + 1) * size)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, **kwargs):
        n = len(self.shape)
        shape = (ctypes.c_int64 * max(n, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(n, 1))(*self.strides)
        m = _Managed()
        code, bits, lanes = self.dtype
        m.dl_tensor = _DLTensor(self.address, _Device(*self.device), n,
                                _DType(code, bits, lanes), shape, strides, 0)
        m.deleter = ctypes.cast(_DELETER, ctypes.c_void_p)
        Producer.keep[ctypes.addressof(m)] = (self.memory, shape, strides, m)
        return _capsule_new(ctypes.addressof(m), _NAME, None)


def _delete(managed):
    """DLManagedTensor.deleter: the consumer is done with the capsule."""
    Producer.keep.pop(managed, None)


_DELETER = _DELETER_TYPE(_delete)


def backing(nbytes):
    """64-byte aligned, zeroed memory of at least `nbytes` bytes."""
    buf = np.zeros(nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64
    return buf[start:start + nbytes + 64]


def dense(shape, dtype, device=CPU):
    """A fresh, aligned, row-major producer of a runtime dtype ("bf16", ...)."""
    code, bits = DTYPES[dtype]
    n = int(np.prod(shape)) if shape else 1
    return Producer(backing(n * bits // 8), shape, (code, bits, 1), device=device)
