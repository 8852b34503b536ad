// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-mk-to-gpu's pieces, one file an op family, and the kernel checks.
// The driver (MKToGPU.cpp) checks a kernel, then walks its mk ops in order
// and hands each to its family's lowering, which expands it in place at the
// builder's insertion point (before the op, which the driver then erases).
// Private to MKToGPU.
//
#ifndef MOK_LIB_CONVERSION_MKTOGPU_LOWERING_H
#define MOK_LIB_CONVERSION_MKTOGPU_LOWERING_H

#include "GridBuilder.h"

#include <optional>

namespace mok::conversion {

namespace gemm {
class GemmEmitter;
} // namespace gemm

//===----------------------------------------------------------------------===//
// Checks (KernelChecks.cpp)
//===----------------------------------------------------------------------===//

/// Everything convert-mk-to-gpu needs of a kernel before it lowers it, each
/// failure a diagnostic naming the op and what to change: no buffer written
/// and accessed by two ops of one barrier interval, whole warps for the
/// warp-wide steps, and tensor-core GEMMs that the chip's lowering
/// implements (mk::TargetSupport) and that agree with each other and with
/// the kernel's launch (`mok.kernel`). Returns the engine of the kernel's
/// tensor-core GEMMs, if it has any.
mlir::FailureOr<std::optional<mk::Engine>>
checkKernel(mlir::gpu::GPUFuncOp func);

//===----------------------------------------------------------------------===//
// Op families
//===----------------------------------------------------------------------===//

/// mk.fill, mk.count_routes, mk.scan_chunks, mk.pad_offsets,
/// mk.assign_rows (RoutingPlan.cpp).
void lowerRoutingPlanStep(const GridBuilder &grid, mlir::Operation *op);
/// mk.gather and mk.combine (Dispatch.cpp).
void lowerGather(const GridBuilder &grid, mk::GatherOp op);
void lowerCombine(const GridBuilder &grid, mk::CombineOp op);
/// mk.gemm (Gemm.cpp): tensor-core GEMMs through `tensorCores`, the
/// kernel's GEMM emitter; `gridBarrierFollows`: the next mk op is an
/// mk.grid_barrier.
void lowerGemm(const GridBuilder &grid, mk::GemmOp op,
               gemm::GemmEmitter *tensorCores, bool gridBarrierFollows);
/// mk.swiglu_grad (SwigluGrad.cpp).
void lowerSwigluGrad(const GridBuilder &grid, mk::SwigluGradOp op);
/// mk.quantize_rows and mk.quantize_weights (Quantize.cpp).
void lowerQuantize(const GridBuilder &grid, mlir::Operation *op);
/// Whether `next` quantizes the same weights as `op` transposed (both
/// 128 x 128 f32 blocks, `op` the normal layout): the two are lowered
/// together, one pass over each block for both layouts.
bool isTransposedTwin(mk::QuantizeWeightsOp op, mlir::Operation *next);
void lowerQuantizeWeightsPair(const GridBuilder &grid, mk::QuantizeWeightsOp op,
                              mk::QuantizeWeightsOp twin);
/// The expert-parallel exchange (Exchange.cpp): mk.route_ranks,
/// mk.put_counts, mk.signal, mk.wait, mk.check_capacity,
/// mk.received_rows, mk.send_rows, mk.return_rows, mk.take_routes,
/// mk.launch_epoch, mk.count_launch, mk.fence_peers.
void lowerExchange(const GridBuilder &grid, mlir::Operation *op);
/// mk.grid_barrier and mk.timestamp (Synchronization.cpp); `tensorCores`:
/// the kernel has tensor-core GEMMs.
void lowerGridBarrier(const GridBuilder &grid, mk::GridBarrierOp op,
                      bool tensorCores);
void lowerTimestamp(const GridBuilder &grid, mk::TimestampOp op);

} // namespace mok::conversion

#endif // MOK_LIB_CONVERSION_MKTOGPU_LOWERING_H
