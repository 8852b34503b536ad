// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_MOETOCPU_MOETOCPU_H
#define MOK_CONVERSION_MOETOCPU_MOETOCPU_H

#include "mlir/Pass/Pass.h"

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace mok {

#define GEN_PASS_DECL_CONVERTMOETOCPU
#include "mok/Conversion/Passes.h.inc"

/// The whole CPU lowering, from the moe dialect to the LLVM dialect (ready
/// for translation to LLVM IR and the ExecutionEngine): convert-moe-to-cpu,
/// canonicalize, bf16 expansion, and the standard conversions to LLVM.
void buildMoEToCPUPipeline(mlir::OpPassManager &pm);

/// The second half of the above: from convert-moe-to-cpu's loops on memrefs
/// to the LLVM dialect.
void buildHostLoopsToLLVMPipeline(mlir::OpPassManager &pm);

/// Registers `--moe-to-cpu`, the pipeline above as one mok-opt flag.
void registerMoEToCPUPipeline();

} // namespace mok

#endif // MOK_CONVERSION_MOETOCPU_MOETOCPU_H
