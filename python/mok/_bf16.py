# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""bf16 <-> float32 for NumPy, which has no bf16 dtype: bf16 values travel as
uint16 bit patterns (the upper half of a float32)."""
import numpy as np


def to_bf16(a):
    """Rounds to bf16 (nearest, ties to even; NaN stays NaN) and returns the
    bit patterns as uint16."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(f)
    out = rounded.astype(np.uint16)
    out[nan] = np.uint16(0x7FC0)
    return out


def bf16_to_float32(a):
    """Widens bf16 (uint16 bit patterns or ml_dtypes.bfloat16) to float32,
    exactly."""
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    if a.dtype != np.uint16:
        raise TypeError(f"expected bf16 bit patterns (uint16), got {a.dtype}")
    return (a.astype(np.uint32) << 16).view(np.float32)


def is_bf16(dtype):
    return dtype == np.uint16 or dtype.name == "bfloat16"
