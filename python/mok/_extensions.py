# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The package's two native extensions, imported on first use: both are
optional (a GPU machine may have the runtime but not the compiler, a CPU
machine the reverse), and the compiler's loads LLVM/MLIR, which
`import mok` should not pay for."""


def compiler():
    """mok._mok, the compiler library; ImportError without it."""
    from . import _mok
    return _mok


def runtime():
    """mok._runtime, the runtime; ImportError saying how to build it."""
    try:
        from . import _runtime
    except ImportError as e:
        raise ImportError(
            f"running GPU layers needs the runtime extension mok._runtime ({e}); it is "
            "built into build/python by the main build, or without MLIR by "
            "`cmake -S python/runtime-ext -B build-gpu && cmake --build build-gpu` "
            "(then PYTHONPATH=build-gpu/python)") from None
    return _runtime
