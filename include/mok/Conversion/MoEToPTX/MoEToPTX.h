// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_MOETOPTX_MOETOPTX_H
#define MOK_CONVERSION_MOETOPTX_MOETOPTX_H

#include "mlir/Pass/Pass.h"

#include <optional>
#include <string>

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace mok {

/// moe → one persistent megakernel (mk) → gpu/nvgpu → NVVM → PTX (in a
/// gpu.binary), for `chip`
/// ("sm_90a" or "sm_100a"). `toolkit` is the CUDA toolkit holding libdevice.
/// `tensorCores`: TMA + tensor-core GEMM phases for eligible layers (wgmma
/// on sm_90a, tcgen05 on sm_100a). `warpSpecialize`: sm_90a GEMMs with a TMA
/// producer warpgroup (convert-moe-to-mk's warp-specialize). `multicast`:
/// sm_90a clusters of 2 CTAs sharing weight boxes (convert-moe-to-mk's
/// multicast).
void buildMoEToPTXPipeline(mlir::OpPassManager &pm, const std::string &chip,
                           const std::string &toolkit, bool tensorCores = true,
                           bool warpSpecialize = false,
                           std::optional<bool> fuseDispatch = std::nullopt,
                           bool multicast = false);

/// Its halves: fuse + convert-moe-to-mk + convert-mk-to-gpu (the kernels,
/// with their `mok.kernel` descriptions), then NVVM lowering and PTX
/// emission; buildMoEToMKPipeline stops at the megakernel schedule.
void buildMoEToMKPipeline(mlir::OpPassManager &pm, const std::string &chip,
                          bool tensorCores = true, bool profile = false,
                          bool warpSpecialize = false,
                          std::optional<bool> fuseDispatch = std::nullopt,
                          bool multicast = false);
void buildMoEToGPUPipeline(mlir::OpPassManager &pm, const std::string &chip,
                           bool tensorCores = true, bool profile = false,
                           bool warpSpecialize = false,
                           std::optional<bool> fuseDispatch = std::nullopt,
                           bool multicast = false);
void buildGPUToPTXPipeline(mlir::OpPassManager &pm, const std::string &chip,
                           const std::string &toolkit);

/// Registers `--moe-to-ptx="chip=sm_90a"`.
void registerMoEToPTXPipeline();

} // namespace mok

#endif // MOK_CONVERSION_MOETOPTX_MOETOPTX_H
