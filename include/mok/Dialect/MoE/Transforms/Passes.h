// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_TRANSFORMS_PASSES_H
#define MOK_DIALECT_MOE_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"

#include "mok/Dialect/MoE/IR/MoEDialect.h"

namespace mok::moe {

#define GEN_PASS_DECL
#define GEN_PASS_REGISTRATION
#include "mok/Dialect/MoE/Transforms/Passes.h.inc"

} // namespace mok::moe

#endif // MOK_DIALECT_MOE_TRANSFORMS_PASSES_H
