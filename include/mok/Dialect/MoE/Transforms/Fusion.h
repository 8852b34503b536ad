// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_TRANSFORMS_FUSION_H
#define MOK_DIALECT_MOE_TRANSFORMS_FUSION_H

#include "mok/Dialect/MoE/IR/MoEOps.h"

#include <string>

namespace mok::moe {

/// Replaces the chain plan → dispatch → expert_swiglu → expert_down →
/// `combine` (+ shared_expert) with one moe.layer. When the chain cannot be
/// fused the IR is left unchanged and `why` says what prevents it (the rules
/// are those of --moe-fuse-layer).
mlir::FailureOr<LayerOp> fuseLayerChain(CombineOp combine, std::string &why);

} // namespace mok::moe

#endif // MOK_DIALECT_MOE_TRANSFORMS_FUSION_H
