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
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/DialectRegistry.h"

#include "mok/Dialect/MoE/IR/MoEDialect.h"

namespace mok {

/// The moe dialect, and the dialects its lowerings produce, so that every
/// stage printed by mok-opt can be read back.
inline void registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<moe::MoEDialect, mlir::arith::ArithDialect,
                  mlir::cf::ControlFlowDialect, mlir::func::FuncDialect,
                  mlir::LLVM::LLVMDialect, mlir::math::MathDialect,
                  mlir::memref::MemRefDialect, mlir::scf::SCFDialect>();
}

} // namespace mok

#endif // MOK_INITALLDIALECTS_H
