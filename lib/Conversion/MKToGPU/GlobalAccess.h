// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Global-memory accesses of the GPU lowering that the NVVM dialect has no op
// for: streaming stores and f32 reductions in L2, each one PTX instruction.
// Private to MKToGPU.
//
#ifndef MOK_LIB_CONVERSION_MKTOGPU_GLOBALACCESS_H
#define MOK_LIB_CONVERSION_MKTOGPU_GLOBALACCESS_H

#include "mlir/IR/Builders.h"

namespace mok::conversion {

/// A streaming store (st.global.cs: evict-first in L1 and L2) of one, two
/// or four 32-bit `words` (i32) at global address `address` (i64, aligned
/// to their size): for GEMM outputs, read once by a later phase.
void storeGlobalStreaming(mlir::OpBuilder &b, mlir::Location loc,
                          mlir::Value address, mlir::ValueRange words);
/// The same of a 16-byte vector `value` (its four 32-bit words).
void storeGlobalStreaming16(mlir::OpBuilder &b, mlir::Location loc,
                            mlir::Value address, mlir::Value value);
/// Adds one or two f32 `values` to the f32 elements at global address
/// `address` (i64, aligned to their size) by a reduction in L2
/// (red.global.add[.v2].f32; sm_90 for the pair): no value comes back, so
/// the thread does not wait for memory. f32 red flushes subnormals.
void reduceAddGlobalF32(mlir::OpBuilder &b, mlir::Location loc,
                        mlir::Value address, mlir::ValueRange values);

} // namespace mok::conversion

#endif // MOK_LIB_CONVERSION_MKTOGPU_GLOBALACCESS_H
