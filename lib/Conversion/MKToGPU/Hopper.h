// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The sm_90a MMA layer of the GEMM phases (GemmPipeline.h): wgmma on one or
// two warpgroups, fp32 accumulators in registers, emitted with NVVM's wgmma
// ops (descriptors from nvgpu's generator). Private to MKToGPU.
//
#ifndef MOK_LIB_CONVERSION_MKTOGPU_HOPPER_H
#define MOK_LIB_CONVERSION_MKTOGPU_HOPPER_H

#include "GemmPipeline.h"

namespace mok::conversion::sm90 {

/// The GEMM phases of one sm_90a kernel; emits the one-time setup at the
/// builder's insertion point (see gemm::GemmEmitter).
std::unique_ptr<gemm::GemmEmitter>
createGemmEmitter(Emitter &e, mlir::gpu::GPUModuleOp module,
                  mlir::Value tensorMaps,
                  mlir::ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                  const gemm::WarpRoles &roles);

} // namespace mok::conversion::sm90

#endif // MOK_LIB_CONVERSION_MKTOGPU_HOPPER_H
