// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The pieces of a MoE layer as host loops on memrefs, shared by the
// lowering of one rank's whole layer (MoEToCPU.cpp) and of an
// expert-parallel layer's stage functions (ExpertParallel.cpp): the routing
// plan, dispatch, the experts, the combine, and their backward.
//
// Every piece reads and writes the buffers it is given; the ones that need
// scratch space allocate it and append it to `temps`, which the caller
// frees before its function returns.
//
#ifndef MOK_LIB_CONVERSION_MOETOCPU_LAYEREMITTERS_H
#define MOK_LIB_CONVERSION_MOETOCPU_LAYEREMITTERS_H

#include "mok/Conversion/Common/ScalarEmitter.h"

#include "Quantize.h"

#include "llvm/ADT/SmallVector.h"

namespace mok::cpu {

using Temps = llvm::SmallVectorImpl<mlir::Value>;

/// The run-time form of a routing plan on the host.
struct Plan {
  int64_t topK = 0, experts = 0, padding = 1;
  mlir::Value tokens;   // T, the rows of the routing (token rows)
  mlir::Value rows;     // R, the padded routed row count
  mlir::Value offsets;  // [experts + 1] start of each expert's row segment
  mlir::Value routeRow; // [T * top_k] row of route t * top_k + k, or -1
  mlir::Value rowRoute; // [R] route of each row, or -1 for padding rows
};

mlir::MemRefType indexBuffer(mlir::OpBuilder &b,
                             int64_t size = mlir::ShapedType::kDynamic);

/// The plan of `topExperts` ([T, topK], integer ids; ids outside
/// [0, experts) are no route): counts per expert, offsets padded to
/// `padding`, rows assigned by expert, then route order (row of the routing,
/// then k).
Plan emitPlan(conversion::Emitter &e, int64_t topK, int64_t experts,
              int64_t padding, mlir::Value topExperts, Temps &temps);

/// The routes of `topExperts` ([T, topK]) as the rows of a [T * topK]
/// buffer: routeRow[t * topK + k] = t * topK + k for ids in [0, experts),
/// -1 otherwise. Only `topK`, `tokens` and `routeRow` are set. It is how a
/// source rank reads the per-route results returned to it.
Plan emitRouteRows(conversion::Emitter &e, int64_t topK, int64_t experts,
                   mlir::Value topExperts, Temps &temps);

/// routed_x[r] = x[routing row of r], zero for padding rows.
void emitDispatch(conversion::Emitter &e, const Plan &p, mlir::Value x,
                  mlir::Value routedX);

/// Gate/up with the SwiGLU on every routed row; gateOut and upOut may be
/// null (not saved).
void emitExpertSwiglu(conversion::Emitter &e, const Plan &p,
                      mlir::Value routedX, mlir::Value wg, mlir::Value wu,
                      conversion::Limit limit, mlir::Value gateOut,
                      mlir::Value upOut, mlir::Value hiddenOut);

void emitExpertDown(conversion::Emitter &e, const Plan &p, mlir::Value hidden,
                    mlir::Value wd, mlir::Value routedY);

/// The shared expert on every row of `x`; `out` may be null when only the
/// activations are wanted (backward recomputation), gateOut and upOut when
/// they are not saved.
void emitSharedExpert(conversion::Emitter &e, mlir::Value x, mlir::Value sg,
                      mlir::Value su, mlir::Value sd, conversion::Limit limit,
                      mlir::Value gateOut, mlir::Value upOut,
                      mlir::Value hiddenOut, mlir::Value out);

/// out[t] = bf16(f32(shared[t]) + sum_k w[t,k] * f32(y[row(t,k)])); shared
/// may be null.
void emitCombine(conversion::Emitter &e, const Plan &p, mlir::Value routedY,
                 mlir::Value routerWeights, mlir::Value shared,
                 mlir::Value out);

/// The routed part of the backward context: null members when the
/// backward recomputes it.
struct RoutedContext {
  mlir::Value routedX, gate, up, hidden;
  explicit operator bool() const { return bool(routedX); }
};

/// Where the routed backward writes the router-weight gradient of each
/// route: a [T, k] buffer indexed by (routing row, k), or a [R] buffer
/// indexed by routed row (padding rows get 0). The caller zero-fills it.
enum class RouteWeightGrads { ByRoute, ByRow };

/// The routed experts' backward over the plan's rows (with `fp8` on, its
/// GEMMs read quantized operands as moe.layer_grad's precision defines): dOut and rw are
/// indexed by the routing row (`dOut [T, H]`, `rw [T, k]`), `x` (read only
/// to recompute, when `saved` is empty) too. Writes dRouteWeights (see
/// RouteWeightGrads), dRoutedX [R, H] and the local experts' weight
/// gradients.
void emitRoutedGrad(conversion::Emitter &e, const Plan &p,
                    conversion::Limit limit, mlir::Value x, mlir::Value dOut,
                    mlir::Value rw, mlir::Value wg, mlir::Value wu,
                    mlir::Value wd, RoutedContext saved,
                    mlir::Value dRouteWeights, RouteWeightGrads layout,
                    mlir::Value dRoutedX, mlir::Value dWg, mlir::Value dWu,
                    mlir::Value dWd, Temps &temps, Fp8Blocks fp8 = {});

/// The shared expert's part of the backward context, or nulls to recompute.
struct SharedContext {
  mlir::Value gate, up, hidden;
  explicit operator bool() const { return bool(gate); }
};

/// The shared expert's backward on every row of `x`: writes its weight
/// gradients and returns its d_x contribution (a temporary [T, H]).
mlir::Value emitSharedGrad(conversion::Emitter &e, conversion::Limit limit,
                           mlir::Value x, mlir::Value dOut, mlir::Value sg,
                           mlir::Value su, mlir::Value sd, SharedContext saved,
                           mlir::Value dSg, mlir::Value dSu, mlir::Value dSd,
                           Temps &temps);

/// d_x[t] = bf16(f32(d_x_shared[t]) + sum_k f32(d_routed_x[row(t, k)]));
/// dSharedX may be null.
void emitInputGrad(conversion::Emitter &e, const Plan &p,
                   mlir::Value dRoutedX, mlir::Value dSharedX, mlir::Value dX);

/// Copies the leading rows of `src` into `dst`: along every dimension the
/// smaller of the two sizes.
void emitCopyPrefix(conversion::Emitter &e, mlir::Value src, mlir::Value dst);

} // namespace mok::cpu

#endif // MOK_LIB_CONVERSION_MOETOCPU_LAYEREMITTERS_H
