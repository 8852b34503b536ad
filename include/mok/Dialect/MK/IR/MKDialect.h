// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MK_IR_MKDIALECT_H
#define MOK_DIALECT_MK_IR_MKDIALECT_H

#include "mlir/IR/Dialect.h"

#include "mok/Dialect/MK/IR/MKDialect.h.inc"

#endif // MOK_DIALECT_MK_IR_MKDIALECT_H
