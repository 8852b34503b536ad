// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The sm_100a MMA layer of the GEMM phases (GemmPipeline.h): tcgen05.mma
// issued by one thread, fp32 accumulators in Tensor Memory, read back with
// tcgen05.ld, in the NVVM dialect. Private to MKToGPU.
//
// No sm_100a GPU is available to this project: this layer is validated by
// `ptxas -arch=sm_100a` and FileCheck tests only, never run.
//
#ifndef MOK_LIB_CONVERSION_MKTOGPU_BLACKWELL_H
#define MOK_LIB_CONVERSION_MKTOGPU_BLACKWELL_H

#include "GemmPipeline.h"

namespace mok::conversion::sm100 {

/// Tensor Memory columns allocated per CTA: one 128-column fp32 accumulator
/// for B_0 and one for B_1.
constexpr int32_t kTmemColumns = 256;

/// The GEMM phases of one sm_100a kernel; emits the one-time setup at the
/// builder's insertion point (see gemm::GemmEmitter), including the Tensor
/// Memory allocation. Call `finish()` after the last GEMM phase (after a
/// CTA-wide barrier): it frees the Tensor Memory.
///
/// `roles`: the consumer warpgroups (2 for MXFP8's 128-row tiles); `mx`:
/// the kernel has MXFP8 GEMMs (block-scaled MMAs: the scale atoms' shared
/// memory and Tensor Memory, kMxTmemColumns in all).
std::unique_ptr<gemm::GemmEmitter>
createGemmEmitter(Emitter &e, mlir::gpu::GPUModuleOp module,
                  mlir::Value tensorMaps,
                  mlir::ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                  const gemm::WarpRoles &roles, bool mx);

} // namespace mok::conversion::sm100

#endif // MOK_LIB_CONVERSION_MKTOGPU_BLACKWELL_H
