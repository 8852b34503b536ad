// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The moe-to-cpu pipeline: moe → loops → LLVM dialect.
//
#include "mok/Conversion/MoEToCPU/MoEToCPU.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void mok::buildMoEToCPUPipeline(OpPassManager &pm) {
  pm.addPass(createConvertMoEToCPU());
  buildHostLoopsToLLVMPipeline(pm);
}

void mok::buildHostLoopsToLLVMPipeline(OpPassManager &pm) {
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  // bf16 <-> f32 conversions become integer code (round to nearest even),
  // so the JIT needs no soft-float runtime.
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void mok::registerMoEToCPUPipeline() {
  PassPipelineRegistration<>(
      "moe-to-cpu",
      "Lower MoE functions to the LLVM dialect for the host (the executable "
      "reference): convert-moe-to-cpu, then the standard conversions",
      [](OpPassManager &pm) { buildMoEToCPUPipeline(pm); });
}
