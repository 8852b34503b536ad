// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The moe-to-ptx pipeline: moe → megakernel schedule (mk) → gpu/nvgpu →
// NVVM → PTX, in process through LLVM's NVPTX backend (MLIR's NVVM target).
//
#include "mok/Conversion/MKToGPU/MKToGPU.h"
#include "mok/Conversion/MoEToMK/MoEToMK.h"
#include "mok/Conversion/MoEToPTX/MoEToPTX.h"
#include "mok/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/NVGPUToNVVM/NVGPUToNVVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

const char *mok::stageName(PTXStep step) {
  switch (step) {
  case PTXStep::Training:
    return "training";
  case PTXStep::MK:
    return "mk";
  case PTXStep::GPU:
    return "gpu";
  case PTXStep::LLVM:
    return "llvm";
  case PTXStep::PTX:
    return "ptx";
  }
  return "";
}

/// moe-fuse-layer, then convert-moe-to-mk with `options` (which checks
/// them: mok-opt's textual options reach it unchecked).
static void addMoEToMK(OpPassManager &pm,
                       const mok::ConvertMoEToMKOptions &options) {
  pm.addPass(mok::moe::createMoEFuseLayer());
  pm.addPass(mok::createConvertMoEToMK(options));
}

/// convert-moe-to-mk's options for `options`: the dispatch enum is its two
/// flags (neither: fused wherever implemented).
static mok::ConvertMoEToMKOptions moeToMKOptions(const mok::CompileOptions &o) {
  mok::ConvertMoEToMKOptions options;
  options.chip = o.chip;
  options.tensorCores = o.tensorCores;
  options.profile = o.profile;
  options.warpSpecialize = o.warpSpecialize;
  options.fuseDispatch = o.dispatch == mok::Dispatch::Fused;
  options.copyDispatch = o.dispatch == mok::Dispatch::Copy;
  options.multicast = o.multicast;
  options.barrierTimeoutMs = o.barrierTimeoutMs;
  options.selfExchange = o.selfExchange;
  options.fp8QuantizedWeights = o.fp8QuantizedWeights;
  return options;
}

/// The NVVM target and the kernels' lowering to the LLVM dialect.
static void addGPUToNVVM(OpPassManager &pm, const std::string &chip) {
  GpuNVVMAttachTargetOptions target;
  target.chip = chip;
  // tcgen05's block-scaled forms need PTX 8.8 (without it the NVPTX backend
  // aborts the process); Hopper's instructions are in PTX 8.0, and the
  // vector reductions (red.global.add.v2.f32, main_grad) in PTX 8.1.
  target.features = chip == "sm_100a" ? "+ptx88" : "+ptx81";
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));

  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  // The GEMM phases' TMA and mbarrier ops, and sm_90a's wgmma (nothing else
  // uses nvgpu; sm_100a's tcgen05 ops are NVVM already).
  kernels.addPass(createConvertNVGPUToNVVMPass());
  kernels.addPass(createCanonicalizerPass());
  kernels.addPass(createCSEPass());
  kernels.addPass(createSCFToControlFlowPass());
  kernels.addPass(memref::createExpandStridedMetadataPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.indexBitwidth = 64;
  nvvm.useBarePtrCallConv = true; // one pointer a buffer, for the runtime
  kernels.addPass(createConvertGpuOpsToNVVMOps(nvvm));
  kernels.addPass(createConvertNVVMToLLVMPass());
  kernels.addPass(createReconcileUnrealizedCastsPass());
}

void mok::buildPTXStep(OpPassManager &pm, PTXStep step,
                       const CompileOptions &options,
                       PTXEmissionTimes *times) {
  switch (step) {
  case PTXStep::Training:
    if (options.training) {
      moe::MoEGenerateBackwardOptions backward;
      backward.recompute = options.recompute;
      backward.mainGrads = options.mainGrads;
      pm.addPass(moe::createMoEGenerateBackward(backward));
    }
    return;
  case PTXStep::MK:
    return addMoEToMK(pm, moeToMKOptions(options));
  case PTXStep::GPU:
    pm.addPass(createConvertMKToGPU());
    return;
  case PTXStep::LLVM:
    return addGPUToNVVM(pm, options.chip);
  case PTXStep::PTX:
    // PTX text (assembled by the driver); the toolkit's libdevice for expf.
    pm.addPass(createEmitPTXPass(options.resolvedToolkit(), times));
    return;
  }
}

/// Adds the steps [first, last] in order.
static void addSteps(OpPassManager &pm, mok::PTXStep first, mok::PTXStep last,
                     const mok::CompileOptions &options) {
  for (int s = static_cast<int>(first); s <= static_cast<int>(last); ++s)
    mok::buildPTXStep(pm, static_cast<mok::PTXStep>(s), options);
}

void mok::buildMoEToPTXPipeline(OpPassManager &pm,
                                const CompileOptions &options) {
  addSteps(pm, PTXStep::Training, PTXStep::PTX, options);
}

void mok::buildMoEToMKPipeline(OpPassManager &pm,
                               const CompileOptions &options) {
  addSteps(pm, PTXStep::Training, PTXStep::MK, options);
}

void mok::buildMoEToGPUPipeline(OpPassManager &pm,
                                const CompileOptions &options) {
  addSteps(pm, PTXStep::Training, PTXStep::GPU, options);
}

void mok::buildGPUToPTXPipeline(OpPassManager &pm,
                                const CompileOptions &options) {
  addSteps(pm, PTXStep::LLVM, PTXStep::PTX, options);
}

namespace {
struct MoEToPTXOptions : public PassPipelineOptions<MoEToPTXOptions> {
  Option<std::string> chip{
      *this, "chip", llvm::cl::desc("sm_90a (Hopper) or sm_100a (Blackwell)"),
      llvm::cl::init("sm_90a")};
  Option<std::string> toolkit{
      *this, "toolkit",
      llvm::cl::desc("CUDA toolkit with libdevice (default: $CUDA_HOME or "
                     "/usr/local/cuda)"),
      llvm::cl::init("")};
  Option<bool> tensorCores{
      *this, "tensor-cores",
      llvm::cl::desc("TMA + tensor-core GEMM phases (wgmma on sm_90a, "
                     "tcgen05 on sm_100a) for eligible layers"),
      llvm::cl::init(true)};
  Option<bool> warpSpecialize{
      *this, "warp-specialize",
      llvm::cl::desc("sm_90a: GEMMs with a TMA producer warpgroup "
                     "(convert-moe-to-mk's warp-specialize)"),
      llvm::cl::init(false)};
  Option<bool> fuseDispatch{
      *this, "fuse-dispatch",
      llvm::cl::desc("sm_90a: require the gate/up GEMM to load its A rows "
                     "straight from x (convert-moe-to-mk's fuse-dispatch)"),
      llvm::cl::init(false)};
  Option<bool> copyDispatch{
      *this, "copy-dispatch",
      llvm::cl::desc("Keep the dispatch copy (convert-moe-to-mk's "
                     "copy-dispatch)"),
      llvm::cl::init(false)};
  Option<bool> multicast{
      *this, "multicast",
      llvm::cl::desc("sm_90a: clusters of 2 CTAs sharing weight boxes by "
                     "TMA multicast (convert-moe-to-mk's multicast)"),
      llvm::cl::init(false)};
  Option<bool> fp8QuantizedWeights{
      *this, "fp8-quantized-weights",
      llvm::cl::desc("FP8 layers: the routed weights as quantized inputs "
                     "(convert-moe-to-mk's fp8-quantized-weights)"),
      llvm::cl::init(false)};
  Option<bool> selfExchange{
      *this, "self-exchange",
      llvm::cl::desc("ep = 1 layers as a group of one rank, through the "
                     "exchange (convert-moe-to-mk's self-exchange)"),
      llvm::cl::init(false)};
};
} // namespace

void mok::registerMoEToPTXPipeline() {
  PassPipelineRegistration<MoEToPTXOptions>(
      "moe-to-ptx",
      "Lower fused forward MoE layers to one persistent GPU kernel each and "
      "emit PTX for chip=sm_90a or chip=sm_100a (in a gpu.binary)",
      [](OpPassManager &pm, const MoEToPTXOptions &textual) {
        // Both dispatch flags may be given here: convert-moe-to-mk gets
        // them as they are, and refuses them together.
        ConvertMoEToMKOptions moeToMK;
        moeToMK.chip = textual.chip;
        moeToMK.tensorCores = textual.tensorCores;
        moeToMK.warpSpecialize = textual.warpSpecialize;
        moeToMK.fuseDispatch = textual.fuseDispatch;
        moeToMK.copyDispatch = textual.copyDispatch;
        moeToMK.multicast = textual.multicast;
        moeToMK.selfExchange = textual.selfExchange;
        moeToMK.fp8QuantizedWeights = textual.fp8QuantizedWeights;
        addMoEToMK(pm, moeToMK);
        CompileOptions options;
        options.chip = textual.chip;
        options.toolkit = textual.toolkit;
        addSteps(pm, PTXStep::GPU, PTXStep::PTX, options);
      });
}
