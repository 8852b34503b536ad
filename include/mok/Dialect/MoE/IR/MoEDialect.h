// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_IR_MOEDIALECT_H
#define MOK_DIALECT_MOE_IR_MOEDIALECT_H

#include "mlir/IR/Dialect.h"

#include "mok/Dialect/MoE/IR/MoEDialect.h.inc"

#endif // MOK_DIALECT_MOE_IR_MOEDIALECT_H
