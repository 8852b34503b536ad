// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_IR_MOEOPS_H
#define MOK_DIALECT_MOE_IR_MOEOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "mok/Dialect/MoE/IR/MoEDialect.h"
#include "mok/Dialect/MoE/IR/MoETypes.h"

#define GET_OP_CLASSES
#include "mok/Dialect/MoE/IR/MoEOps.h.inc"

#endif // MOK_DIALECT_MOE_IR_MOEOPS_H
