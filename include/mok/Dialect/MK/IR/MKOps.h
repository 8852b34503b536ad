// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MK_IR_MKOPS_H
#define MOK_DIALECT_MK_IR_MKOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "mok/Dialect/MK/IR/MKDialect.h"
#include "mok/Dialect/MK/IR/MKEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "mok/Dialect/MK/IR/MKAttrs.h.inc"

#define GET_OP_CLASSES
#include "mok/Dialect/MK/IR/MKOps.h.inc"

#endif // MOK_DIALECT_MK_IR_MKOPS_H
