// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// moe.quantize and moe.dequantize as host loops on memrefs: block-scaled
// E4M3 with E8M0 (MX) or f32 scales, every rounding spelled out in integer
// and f32 operations so the result is the op's definition bit for bit.
//
#ifndef MOK_LIB_CONVERSION_MOETOCPU_QUANTIZE_H
#define MOK_LIB_CONVERSION_MOETOCPU_QUANTIZE_H

#include "mok/Conversion/Common/ScalarEmitter.h"

namespace mok::cpu {

/// Quantizes `input` (bf16 or f32) into `values` (f8E4M3FN) and `scales`
/// (f8E8M0FNU or f32), blocks of rows x cols over the last two dimensions.
void emitQuantize(conversion::Emitter &e, mlir::Value input, mlir::Value values,
                  mlir::Value scales, int64_t rows, int64_t cols);

/// output = f32(values) * scale of each element's block, rounded to the
/// output's element type.
void emitDequantize(conversion::Emitter &e, mlir::Value values,
                    mlir::Value scales, mlir::Value output, int64_t rows,
                    int64_t cols);

} // namespace mok::cpu

#endif // MOK_LIB_CONVERSION_MOETOCPU_QUANTIZE_H
