// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_IR_MOETYPES_H
#define MOK_DIALECT_MOE_IR_MOETYPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "mok/Dialect/MoE/IR/MoETypes.h.inc"

#endif // MOK_DIALECT_MOE_IR_MOETYPES_H
