# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.ops: the weight-quantization entry points NeMo AutoModel's MoK
backend calls for ``precision: mxfp8``.

mok has bf16 experts only: MXFP8 (E4M3 data, one E8M0 scale per 32
elements) is not implemented yet, so ``mxfp8_quantize`` raises
NotImplementedError naming it. AutoModel calls it only with
``precision="mxfp8"``; ``precision="bf16"`` (its default) never does.
"""

__all__ = ["mxfp8_quantize"]


def mxfp8_quantize(weight, normal=True, transposed=False):
    """MXFP8 quantization of a bf16 weight [E, rows, cols], in the normal
    and/or transposed layout. Not supported: raises NotImplementedError."""
    raise NotImplementedError(
        "mok.ops.mxfp8_quantize: mok has no MXFP8 experts yet (precision='mxfp8'); "
        "use precision='bf16'")
