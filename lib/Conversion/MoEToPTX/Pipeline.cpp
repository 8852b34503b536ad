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

#include <cstdlib>

using namespace mlir;

void mok::buildMoEToPTXPipeline(OpPassManager &pm, const std::string &chip,
                                const std::string &toolkit, bool tensorCores,
                                bool warpSpecialize,
                                std::optional<bool> fuseDispatch,
                                bool multicast) {
  buildMoEToGPUPipeline(pm, chip, tensorCores, /*profile=*/false,
                        warpSpecialize, fuseDispatch, multicast);
  buildGPUToPTXPipeline(pm, chip, toolkit);
}

/// convert-moe-to-mk's dispatch options: neither set, fused wherever it is
/// implemented; fuse-dispatch requires it; copy-dispatch keeps the copy
/// (both set: the pass refuses them).
static void addMoEToMK(OpPassManager &pm, const std::string &chip,
                       bool tensorCores, bool profile, bool warpSpecialize,
                       bool fuseDispatch, bool copyDispatch, bool multicast) {
  pm.addPass(mok::moe::createMoEFuseLayer());
  mok::ConvertMoEToMKOptions options;
  options.chip = chip;
  options.tensorCores = tensorCores;
  options.profile = profile;
  options.warpSpecialize = warpSpecialize;
  options.fuseDispatch = fuseDispatch;
  options.copyDispatch = copyDispatch;
  options.multicast = multicast;
  pm.addPass(mok::createConvertMoEToMK(options));
}

void mok::buildMoEToMKPipeline(OpPassManager &pm, const std::string &chip,
                               bool tensorCores, bool profile,
                               bool warpSpecialize,
                               std::optional<bool> fuseDispatch,
                               bool multicast) {
  addMoEToMK(pm, chip, tensorCores, profile, warpSpecialize,
             fuseDispatch.value_or(false),
             fuseDispatch.has_value() && !*fuseDispatch, multicast);
}

void mok::buildMoEToGPUPipeline(OpPassManager &pm, const std::string &chip,
                                bool tensorCores, bool profile,
                                bool warpSpecialize,
                                std::optional<bool> fuseDispatch,
                                bool multicast) {
  buildMoEToMKPipeline(pm, chip, tensorCores, profile, warpSpecialize,
                       fuseDispatch, multicast);
  pm.addPass(createConvertMKToGPU());
}

void mok::buildGPUToPTXPipeline(OpPassManager &pm, const std::string &chip,
                                const std::string &toolkit) {
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

  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = "isa"; // PTX text, assembled by the driver
  binary.toolkitPath = toolkit;     // libdevice, for expf
  pm.addPass(createGpuModuleToBinaryPass(binary));
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
};
} // namespace

void mok::registerMoEToPTXPipeline() {
  PassPipelineRegistration<MoEToPTXOptions>(
      "moe-to-ptx",
      "Lower fused forward MoE layers to one persistent GPU kernel each and "
      "emit PTX for chip=sm_90a or chip=sm_100a (in a gpu.binary)",
      [](OpPassManager &pm, const MoEToPTXOptions &options) {
        std::string toolkit = options.toolkit;
        if (toolkit.empty()) {
          const char *home = std::getenv("CUDA_HOME");
          toolkit = home && *home ? home : "/usr/local/cuda";
        }
        addMoEToMK(pm, options.chip, options.tensorCores, /*profile=*/false,
                   options.warpSpecialize, options.fuseDispatch,
                   options.copyDispatch, options.multicast);
        pm.addPass(createConvertMKToGPU());
        buildGPUToPTXPipeline(pm, options.chip, toolkit);
      });
}
