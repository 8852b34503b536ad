# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.fp8: block-scaled FP8 (E4M3) quantization as the moe dialect defines
it (moe.quantize, moe.dequantize), run by the CPU target: the executable
statement of the formats, for checking and for preparing data.

    values, scales = mok.fp8.quantize(w, block=(1, 32), scale="e8m0")   # MXFP8
    values, scales = mok.fp8.quantize(x, block=(1, 128), scale="f32")   # FP8, f32 scales
    w2 = mok.fp8.dequantize(values, scales, block=(1, 32))              # float32

`x`: a float32 array or bf16 bit patterns (uint16, see mok.to_bf16) of
rank >= 2; blocks of `block` = (rows, cols) tile its last two dimensions.
Returns `values` as uint8 E4M3 (f8E4M3FN) bit patterns of x's shape and
`scales` (x's shape divided by the block) as uint8 E8M0 bytes ("e8m0":
power-of-two MX scales) or float32 ("f32": amax / 448). The exact
rounding, saturation, scale and NaN rules are moe.quantize's
(docs/generated/Dialects/MoE.md; docs/FP8.md). Each shape is compiled
once (a fraction of a second) and cached.
"""
import threading

import numpy as np

from . import _extensions

__all__ = ["dequantize", "quantize"]

_SCALES = {"e8m0": ("f8E8M0FNU", np.uint8), "f32": ("f32", np.float32)}
_CACHE = {}
_LOCK = threading.Lock()


def _block(block, shape, name):
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                       for b in block)):
        raise ValueError(f"block: expected two positive ints (rows, cols), got {block!r}")
    if len(shape) < 2:
        raise ValueError(f"{name}: expected an array of rank >= 2 (blocks tile its last two "
                         f"dimensions), got shape {list(shape)}")
    for size, b, axis in ((shape[-2], block[0], -2), (shape[-1], block[1], -1)):
        if size % b:
            raise ValueError(f"{name}: dimension {len(shape) + axis} ({size}) is not a "
                             f"multiple of the block's {b} (block={tuple(block)})")
    return tuple(block)


def _scale_kind(scale):
    if scale not in _SCALES:
        raise ValueError(f"scale: expected 'e8m0' (MX, power-of-two) or 'f32', got {scale!r}")
    return _SCALES[scale]


def _tensor(shape, dtype):
    return "tensor<" + "x".join(str(d) for d in shape) + f"x{dtype}>"


def _executable(key, ir):
    with _LOCK:
        exe = _CACHE.get(key)
    if exe is None:
        c = _extensions.compiler()
        exe = c.HostExecutable.compile(c.Module.parse(ir, "<mok.fp8>"))
        with _LOCK:
            _CACHE[key] = exe
    return exe


def quantize(x, block=(1, 32), scale="e8m0", transpose=False):
    """(values uint8 [x's shape], scales): moe.quantize of `x`; with
    `transpose`, of `x` with its last two dimensions swapped (the op's
    `transpose`: values of that swapped shape, blocks of it)."""
    x = np.asarray(x)
    if x.dtype == np.uint16 or x.dtype.name == "bfloat16":
        x, dtype = np.ascontiguousarray(x).view(np.uint16), "bf16"
    elif x.dtype == np.float32:
        x, dtype = np.ascontiguousarray(x), "f32"
    else:
        raise TypeError(f"x: expected float32 or bf16 (uint16 bit patterns), got {x.dtype}")
    if not isinstance(transpose, bool):
        raise TypeError(f"transpose: expected True or False, got {transpose!r}")
    if transpose and x.ndim < 2:
        raise ValueError(f"x: expected an array of rank >= 2 to transpose, got shape "
                         f"{list(x.shape)}")
    vshape = (*x.shape[:-2], x.shape[-1], x.shape[-2]) if transpose else x.shape
    block = _block(block, vshape, "x transposed" if transpose else "x")
    scale_type, scale_np = _scale_kind(scale)
    sshape = (*vshape[:-2], vshape[-2] // block[0], vshape[-1] // block[1])
    attr = ", transpose" if transpose else ""
    ir = (f"func.func @quantize(%x: {_tensor(x.shape, dtype)}) -> "
          f"({_tensor(vshape, 'f8E4M3FN')}, {_tensor(sshape, scale_type)}) {{\n"
          f"  %q, %s = moe.quantize %x {{block = array<i64: {block[0]}, {block[1]}>{attr}}} : "
          f"{_tensor(x.shape, dtype)} -> {_tensor(vshape, 'f8E4M3FN')}, "
          f"{_tensor(sshape, scale_type)}\n"
          f"  return %q, %s : {_tensor(vshape, 'f8E4M3FN')}, {_tensor(sshape, scale_type)}\n"
          f"}}\n")
    exe = _executable(("q", x.shape, dtype, block, scale, transpose), ir)
    values = np.empty(vshape, np.uint8)
    scales = np.empty(sshape, scale_np)
    exe.invoke("quantize", [x], [values, scales])
    return values, scales


def dequantize(values, scales, block=(1, 32), dtype="f32"):
    """moe.dequantize: float32 (dtype "f32") or bf16 bit patterns as uint16
    ("bf16") of values' shape: each E4M3 value times its block's scale."""
    values = np.ascontiguousarray(values)
    scales = np.ascontiguousarray(scales)
    if values.dtype != np.uint8:
        raise TypeError(f"values: expected uint8 E4M3 bit patterns, got {values.dtype}")
    block = _block(block, values.shape, "values")
    sshape = (*values.shape[:-2], values.shape[-2] // block[0], values.shape[-1] // block[1])
    if scales.dtype == np.uint8:
        scale_type = "f8E8M0FNU"
    elif scales.dtype == np.float32:
        scale_type = "f32"
    else:
        raise TypeError(f"scales: expected uint8 E8M0 bytes or float32, got {scales.dtype}")
    if scales.shape != sshape:
        raise ValueError(f"scales: expected shape {list(sshape)} (values' shape divided by "
                         f"block={block}), got {list(scales.shape)}")
    if dtype not in ("f32", "bf16"):
        raise ValueError(f"dtype: expected 'f32' or 'bf16', got {dtype!r}")
    vt, st, ot = (_tensor(values.shape, "f8E4M3FN"), _tensor(sshape, scale_type),
                  _tensor(values.shape, dtype))
    ir = (f"func.func @dequantize(%q: {vt}, %s: {st}) -> {ot} {{\n"
          f"  %w = moe.dequantize %q, %s {{block = array<i64: {block[0]}, {block[1]}>}} : "
          f"{vt}, {st} -> {ot}\n"
          f"  return %w : {ot}\n}}\n")
    exe = _executable(("d", values.shape, scale_type, block, dtype), ir)
    out = np.empty(values.shape, np.float32 if dtype == "f32" else np.uint16)
    exe.invoke("dequantize", [values, scales], [out])
    return out
