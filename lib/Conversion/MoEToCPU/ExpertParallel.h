// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-cpu for an expert-parallel layer (ep > 1): the layer
// function becomes the stage functions a host runs on every rank, moving
// the buffers between the ranks in between (docs/ExpertParallel.md).
//
#ifndef MOK_LIB_CONVERSION_MOETOCPU_EXPERTPARALLEL_H
#define MOK_LIB_CONVERSION_MOETOCPU_EXPERTPARALLEL_H

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mok::cpu {

/// Whether `func` holds an op whose plan has ep > 1.
bool isExpertParallel(mlir::func::FuncOp func);

/// Replaces `func` (one fused moe.layer or moe.layer_grad with ep > 1,
/// whose results it returns) by its stage functions `@<func>__ep_send`, `@<func>__ep_experts`
/// and `@<func>__ep_combine`; an error at what is in the way otherwise,
/// with nothing changed.
mlir::LogicalResult lowerExpertParallel(mlir::func::FuncOp func);

} // namespace mok::cpu

#endif // MOK_LIB_CONVERSION_MOETOCPU_EXPERTPARALLEL_H
