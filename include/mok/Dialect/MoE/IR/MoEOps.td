// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_IR_MOEOPS_TD
#define MOK_DIALECT_MOE_IR_MOEOPS_TD

include "mok/Dialect/MoE/IR/MoEDialect.td"
include "mok/Dialect/MoE/IR/MoETypes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/IR/CommonTypeConstraints.td"

//===----------------------------------------------------------------------===//
// Operand constraints
//===----------------------------------------------------------------------===//

def MoE_BF16Matrix : TensorRankOf<[BF16], [2]>;
def MoE_BF16Tensor3D : TensorRankOf<[BF16], [3]>;
def MoE_ExpertIds : TensorRankOf<[I32, I64], [2]>;
def MoE_RouterWeights : TensorRankOf<[F32], [2]>;

// The clamp of the clamped SwiGLU. Absent means no clamp; +inf is
// canonicalized to absent.
defvar MoE_SwigluLimit = OptionalAttr<F32Attr>;

//===----------------------------------------------------------------------===//
// moe.plan
//===----------------------------------------------------------------------===//

def MoE_PlanOp : MoE_Op<"plan", [Pure]> {
  let summary = "build the routing plan from the router's top-k expert ids";
  let description = [{
    Counts the routes of every local expert (over all ranks of the
    expert-parallel group), pads each expert's row segment to a multiple of
    the plan's `padding`, and assigns every `(token, k)` route a row of the
    routed activations. Routes with expert id `-1` get no row. Expert ids
    outside `[-1, E)` are a run-time error of the executing backend.

    Row order inside an expert's segment is deterministic: by source rank,
    then token, then `k`.

    ```mlir
    %plan = moe.plan %top_experts : tensor<4096x8xi32>
        -> !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>
    ```
  }];
  let arguments = (ins MoE_ExpertIds:$top_experts);
  let results = (outs MoE_PlanType:$plan);
  let assemblyFormat = [{
    $top_experts attr-dict `:` type($top_experts) `->` qualified(type($plan))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// moe.dispatch
//===----------------------------------------------------------------------===//

def MoE_DispatchOp : MoE_Op<"dispatch", [Pure]> {
  let summary = "gather routed token rows, grouped by local expert";
  let description = [{
    Produces the routed activations: row `r` of the result is the token row
    of `x` that the plan assigns to row `r` (pulled from the owning rank when
    `ep > 1`); padding rows are zero. The row count is data-dependent, so the
    result's first dimension is always dynamic.

    ```mlir
    %xr = moe.dispatch %x, %plan : tensor<4096x7168xbf16>,
        !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>
        -> tensor<?x7168xbf16>
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$x, MoE_PlanType:$plan);
  let results = (outs MoE_BF16Matrix:$routed_x);
  let assemblyFormat = [{
    $x `,` $plan attr-dict `:` type($x) `,` qualified(type($plan))
    `->` type($routed_x)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// moe.expert_swiglu
//===----------------------------------------------------------------------===//

def MoE_ExpertSwigluOp : MoE_Op<"expert_swiglu",
    [Pure, AllTypesMatch<["gate_weights", "up_weights"]>]> {
  let summary = "grouped gate and up projections with the clamped SwiGLU";
  let description = [{
    For every routed row `r` in the segment of local expert `e`:
    `g = x_r W_g[e]^T`, `u = x_r W_u[e]^T` (fp32 accumulation, rounded to
    bf16), then in fp32 `h_r = silu(min(g, L)) * clamp(u, -L, L)`, rounded to
    bf16. Without `swiglu_limit` there is no clamp. Padding rows give zero.

    ```mlir
    %h = moe.expert_swiglu %xr, %plan, gate %wg, up %wu {swiglu_limit = 7.0 : f32}
        : tensor<?x2048xbf16>,
          !moe.plan<tokens = 8192, top_k = 8, experts = 128, ep = 1, padding = 128>,
          tensor<128x768x2048xbf16> -> tensor<?x768xbf16>
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$routed_x, MoE_PlanType:$plan,
                       MoE_BF16Tensor3D:$gate_weights,
                       MoE_BF16Tensor3D:$up_weights,
                       MoE_SwigluLimit:$swiglu_limit);
  let results = (outs MoE_BF16Matrix:$hidden);
  let assemblyFormat = [{
    $routed_x `,` $plan `,` `gate` $gate_weights `,` `up` $up_weights attr-dict
    `:` type($routed_x) `,` qualified(type($plan)) `,` type($gate_weights)
    `->` type($hidden)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// moe.expert_down
//===----------------------------------------------------------------------===//

def MoE_ExpertDownOp : MoE_Op<"expert_down", [Pure]> {
  let summary = "grouped down projection of every local expert";
  let description = [{
    For every routed row `r` in the segment of local expert `e`:
    `y_r = h_r W_d[e]^T`, fp32 accumulation rounded to bf16. Router weights
    are *not* applied here; `moe.combine` applies them.

    ```mlir
    %y = moe.expert_down %h, %plan, down %wd
        : tensor<?x768xbf16>,
          !moe.plan<tokens = 8192, top_k = 8, experts = 128, ep = 1, padding = 128>,
          tensor<128x2048x768xbf16> -> tensor<?x2048xbf16>
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$hidden, MoE_PlanType:$plan,
                       MoE_BF16Tensor3D:$down_weights);
  let results = (outs MoE_BF16Matrix:$routed_y);
  let assemblyFormat = [{
    $hidden `,` $plan `,` `down` $down_weights attr-dict
    `:` type($hidden) `,` qualified(type($plan)) `,` type($down_weights)
    `->` type($routed_y)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// moe.shared_expert
//===----------------------------------------------------------------------===//

def MoE_SharedExpertOp : MoE_Op<"shared_expert",
    [Pure, AllTypesMatch<["gate_weights", "up_weights"]>,
     AllTypesMatch<["x", "out"]>]> {
  let summary = "the dense shared expert, a SwiGLU MLP on every local token";
  let description = [{
    `out = (silu(min(x W_g^T, L)) * clamp(x W_u^T, -L, L)) W_d^T` with the
    same roundings as the routed experts: bf16 gate/up and hidden, fp32 math.

    ```mlir
    %ys = moe.shared_expert %x, gate %sg, up %su, down %sd
        : tensor<4096x7168xbf16>, tensor<2048x7168xbf16>, tensor<7168x2048xbf16>
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$x, MoE_BF16Matrix:$gate_weights,
                       MoE_BF16Matrix:$up_weights,
                       MoE_BF16Matrix:$down_weights,
                       MoE_SwigluLimit:$swiglu_limit);
  let results = (outs MoE_BF16Matrix:$out);
  let assemblyFormat = [{
    $x `,` `gate` $gate_weights `,` `up` $up_weights `,` `down` $down_weights
    attr-dict `:` type($x) `,` type($gate_weights) `,` type($down_weights)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// moe.combine
//===----------------------------------------------------------------------===//

def MoE_CombineOp : MoE_Op<"combine", [Pure]> {
  let summary = "return routed rows to their tokens and sum them, weighted";
  let description = [{
    `out[t] = bf16(f32(shared[t]) + sum_k w[t,k] * f32(y[row(t,k)]))`, where
    `row(t,k)` is the routed row the plan gave route `(t,k)`; routes with
    expert id `-1` are skipped. Without a `shared` operand the shared term is
    zero. The sum over `k` runs in a fixed order, so the result is
    deterministic.

    ```mlir
    %out = moe.combine %y, %plan, weights %rw shared %ys
        : tensor<?x7168xbf16>,
          !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>,
          tensor<4096x8xf32>, tensor<4096x7168xbf16> -> tensor<4096x7168xbf16>
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$routed_y, MoE_PlanType:$plan,
                       MoE_RouterWeights:$router_weights,
                       Optional<MoE_BF16Matrix>:$shared_out);
  let results = (outs MoE_BF16Matrix:$out);
  let assemblyFormat = [{
    $routed_y `,` $plan `,` `weights` $router_weights
    (`shared` $shared_out^)? attr-dict
    `:` type($routed_y) `,` qualified(type($plan)) `,` type($router_weights)
    (`,` type($shared_out)^)? `->` type($out)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// moe.layer
//===----------------------------------------------------------------------===//

def MoE_LayerOp : MoE_Op<"layer", [Pure]> {
  let summary = "a whole forward MoE layer: plan, dispatch, experts, combine";
  let description = [{
    The fused form of the chain `moe.plan` → `moe.dispatch` →
    `moe.expert_swiglu` → `moe.expert_down` → `moe.combine`, with an optional
    `moe.shared_expert` on the same tokens, as produced by `--moe-fuse-layer`.
    The routing parameters live in the `plan` type attribute; `swiglu_limit`
    applies to the routed and the shared experts alike. The optional
    `shared(...)` group lists the shared expert's gate, up and down weights.

    This is the unit the GPU lowering plans as one persistent megakernel.

    ```mlir
    %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
        shared(%sg, %su, %sd)
        plan !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>
        : (tensor<4096x7168xbf16>, tensor<4096x8xi32>, tensor<4096x8xf32>,
           tensor<32x2048x7168xbf16>, tensor<32x2048x7168xbf16>,
           tensor<32x7168x2048xbf16>, tensor<2048x7168xbf16>,
           tensor<2048x7168xbf16>, tensor<7168x2048xbf16>)
        -> tensor<4096x7168xbf16>
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$x, MoE_ExpertIds:$top_experts,
                       MoE_RouterWeights:$router_weights,
                       MoE_BF16Tensor3D:$gate_weights,
                       MoE_BF16Tensor3D:$up_weights,
                       MoE_BF16Tensor3D:$down_weights,
                       Variadic<MoE_BF16Matrix>:$shared_weights,
                       TypeAttrOf<MoE_PlanType>:$plan,
                       MoE_SwigluLimit:$swiglu_limit);
  let results = (outs MoE_BF16Matrix:$out);
  let assemblyFormat = [{
    $x `,` $top_experts `,` $router_weights `,` `gate` $gate_weights `,`
    `up` $up_weights `,` `down` $down_weights
    (`shared` `(` $shared_weights^ `)`)?
    `plan` $plan attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    PlanType getPlanType() { return ::llvm::cast<PlanType>(getPlan()); }
    bool hasSharedExpert() { return getSharedWeights().size() == 3; }
    ::mlir::Value getSharedGate() {
      return hasSharedExpert() ? getSharedWeights()[0] : ::mlir::Value();
    }
    ::mlir::Value getSharedUp() {
      return hasSharedExpert() ? getSharedWeights()[1] : ::mlir::Value();
    }
    ::mlir::Value getSharedDown() {
      return hasSharedExpert() ? getSharedWeights()[2] : ::mlir::Value();
    }
  }];
}

#endif // MOK_DIALECT_MOE_IR_MOEOPS_TD
