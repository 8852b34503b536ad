// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The one place that says which dialects mok's tools (mok-opt, the Python
// extension, tests) can parse.
//
#ifndef MOK_INITALLDIALECTS_H
#define MOK_INITALLDIALECTS_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"

#include "mok/Dialect/MoE/IR/MoEDialect.h"

namespace mok {

inline void registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<moe::MoEDialect, mlir::arith::ArithDialect,
                  mlir::cf::ControlFlowDialect, mlir::func::FuncDialect>();
}

} // namespace mok

#endif // MOK_INITALLDIALECTS_H
