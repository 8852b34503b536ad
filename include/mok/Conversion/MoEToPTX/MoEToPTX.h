// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_MOETOPTX_MOETOPTX_H
#define MOK_CONVERSION_MOETOPTX_MOETOPTX_H

#include "mok/Conversion/MoEToPTX/CompileOptions.h"

#include "mlir/Pass/Pass.h"

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace mok {

/// The steps of moe → PTX, each ending at an IR that a GPU compile can show
/// (mok::Module::compileGPU's stages, named by stageName):
enum class PTXStep {
  /// moe-generate-backward: each layer's training forward and backward
  /// (only with options.training; its recompute and main-grads options).
  Training,
  /// moe-fuse-layer + convert-moe-to-mk: one persistent megakernel schedule
  /// (mk) a layer.
  MK,
  /// convert-mk-to-gpu: the kernels in gpu/nvgpu, with their `mok.kernel`
  /// descriptions.
  GPU,
  /// The NVVM target attached, the kernels lowered to the LLVM dialect
  /// (NVVM): what the NVPTX backend gets.
  LLVM,
  /// gpu-module-to-binary: PTX text in a gpu.binary a kernel.
  PTX,
};

/// "training", "mk", "gpu", "llvm", "ptx".
const char *stageName(PTXStep step);

/// Adds the passes of `step` to `pm`, as `options` asks (the Training step
/// adds nothing without options.training).
void buildPTXStep(mlir::OpPassManager &pm, PTXStep step,
                  const CompileOptions &options);

/// moe → one persistent megakernel (mk) → gpu/nvgpu → NVVM → PTX (in a
/// gpu.binary): every step in order. The options are not checked here
/// (convert-moe-to-mk checks its own; CompileOptions::validate checks all).
void buildMoEToPTXPipeline(mlir::OpPassManager &pm,
                           const CompileOptions &options);

/// Its parts: up to the megakernel schedule (Training, MK), up to the GPU
/// kernels (and GPU), and from the GPU kernels to PTX (LLVM, PTX).
void buildMoEToMKPipeline(mlir::OpPassManager &pm,
                          const CompileOptions &options);
void buildMoEToGPUPipeline(mlir::OpPassManager &pm,
                           const CompileOptions &options);
void buildGPUToPTXPipeline(mlir::OpPassManager &pm,
                           const CompileOptions &options);

/// Registers `--moe-to-ptx="chip=sm_90a"` (mok-opt's textual options: chip,
/// toolkit, tensor-cores, warp-specialize, fuse-dispatch, copy-dispatch,
/// multicast).
void registerMoEToPTXPipeline();

} // namespace mok

#endif // MOK_CONVERSION_MOETOPTX_MOETOPTX_H
