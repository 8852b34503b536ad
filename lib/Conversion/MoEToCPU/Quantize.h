// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// moe.quantize and moe.dequantize as host loops on memrefs: block-scaled
// E4M3 with E8M0 (MX) or f32 scales, every rounding spelled out in integer
// and f32 operations so the result is the op's definition bit for bit.
//
#ifndef MOK_LIB_CONVERSION_MOETOCPU_QUANTIZE_H
#define MOK_LIB_CONVERSION_MOETOCPU_QUANTIZE_H

#include "mok/Conversion/Common/ScalarEmitter.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <optional>

namespace mok::cpu {

/// Quantizes `input` (bf16 or f32) into `values` (f8E4M3FN) and `scales`
/// (f8E8M0FNU or f32), blocks of rows x cols over the last two dimensions;
/// with `transpose`, the input with those two dimensions swapped (`values`
/// has the swapped shape).
void emitQuantize(conversion::Emitter &e, mlir::Value input, mlir::Value values,
                  mlir::Value scales, int64_t rows, int64_t cols,
                  bool transpose = false);

/// output = f32(values) * scale of each element's block, rounded to the
/// output's element type.
void emitDequantize(conversion::Emitter &e, mlir::Value values,
                    mlir::Value scales, mlir::Value output, int64_t rows,
                    int64_t cols);

/// An f32 copy of `src` (bf16 or f32) holding the values moe.quantize and
/// moe.dequantize give it: blocks of rows x cols over its last two
/// dimensions, E8M0 scales when `mx`, else f32 ones. The buffers it
/// allocates are appended to `temps`.
mlir::Value emitFakeQuantize(conversion::Emitter &e, mlir::Value src,
                             int64_t rows, int64_t cols, bool mx,
                             llvm::SmallVectorImpl<mlir::Value> &temps);

/// The blocks of an FP8 precision ("mxfp8" or "fp8") of moe.layer and
/// moe.layer_grad: along a row of activations, a weight along its last
/// dimension or along its rows, and routed rows for the weight gradients.
struct Fp8Blocks {
  bool on = false, mx = false;
  int64_t act = 0;                 // [1, act]
  int64_t weightRows = 0, weightCols = 0;   // along the last dimension
  int64_t weightRowsT = 0, weightColsT = 0; // along the rows
  int64_t rows = 0;                // [rows, 1] of routed rows
  static Fp8Blocks of(std::optional<llvm::StringRef> precision) {
    Fp8Blocks b;
    if (!precision)
      return b;
    b.on = true;
    b.mx = *precision == "mxfp8";
    b.act = b.mx ? 32 : 128;
    b.weightRows = b.mx ? 1 : 128;
    b.weightCols = b.mx ? 32 : 128;
    b.weightRowsT = b.mx ? 32 : 128;
    b.weightColsT = b.mx ? 1 : 128;
    b.rows = b.mx ? 32 : 128;
    return b;
  }
};

} // namespace mok::cpu

#endif // MOK_LIB_CONVERSION_MOETOCPU_QUANTIZE_H
