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
  /// PTX text in a gpu.binary a kernel module (createEmitPTXPass).
  PTX,
};

/// "training", "mk", "gpu", "llvm", "ptx".
const char *stageName(PTXStep step);

/// How long the parts of the PTX step took, in seconds, each summed over
/// the kernel modules (which are emitted in parallel: the sum can exceed
/// the step's wall time).
struct PTXEmissionTimes {
  double translate = 0; ///< the LLVM dialect to LLVM IR
  double link = 0;      ///< libdevice linked in (what the kernels call)
  double optimize = 0;  ///< LLVM's optimization pipeline (O3)
  double codegen = 0;   ///< the NVPTX back end: the PTX text
};

/// The PTX step's pass: every gpu.module with an NVVM target becomes a
/// gpu.binary holding its PTX (gpu-module-to-binary's format=isa, the
/// modules serialized in parallel, LLVM's O3 without the SLP vectorizer). `toolkit` holds libdevice; `times`, if
/// given, has the parts' times added to it.
std::unique_ptr<mlir::Pass>
createEmitPTXPass(const std::string &toolkit,
                  PTXEmissionTimes *times = nullptr);

/// Adds the passes of `step` to `pm`, as `options` asks (the Training step
/// adds nothing without options.training). `times`: the PTX step's
/// timings (createEmitPTXPass).
void buildPTXStep(mlir::OpPassManager &pm, PTXStep step,
                  const CompileOptions &options,
                  PTXEmissionTimes *times = nullptr);

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
