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

    **Precision.** Without `precision` the routed experts compute in bf16
    as above. `precision = "mxfp8"` or `"fp8"` makes them FP8: the operands
    of the routed GEMMs are quantized as `moe.quantize` defines it and the
    GEMMs run on the dequantized values with fp32 accumulation:
    `routed_x` and `hidden` per row along their reduction dimension
    (blocks `[1, 32]` with E8M0 scales for `"mxfp8"`, `[1, 128]` with f32
    scales for `"fp8"`), the gate and up weights along H and the down
    weights along I (`[1, 32]` E8M0 for `"mxfp8"`, `[128, 128]` f32 for
    `"fp8"`). `hidden` is quantized from its bf16 value. The shared expert
    stays bf16. H and I must be multiples of the blocks. An FP8 layer that
    saves the backward context (training) saves the bf16 values (routed_x
    before quantization, the bf16 gate, up and hidden), and its plan's
    padding must be a multiple of the row block of its backward (32 for
    `"mxfp8"`, 128 for `"fp8"`; see `moe.layer_grad`).

    **Saved context.** For training, the op can also return what backward
    needs (the *backward context*, see `moe.layer_grad`), in this order:
    `routed_x [R, H]`, `gate [R, I]`, `up [R, I]` (the bf16 GEMM outputs
    before the activation), `hidden [R, I]`, and with a shared expert
    `shared_gate [T, I_s]`, `shared_up [T, I_s]`, `shared_hidden [T, I_s]`.
    Routed rows are in the plan's row order, so a backward that rebuilds the
    plan from the same `top_experts` finds every row where forward left it.
    `--moe-generate-backward` adds these results.

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
                       MoE_SwigluLimit:$swiglu_limit,
                       OptionalAttr<StrAttr>:$precision);
  let results = (outs MoE_BF16Matrix:$out, Variadic<MoE_BF16Matrix>:$saved);
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
    /// Whether the op returns the backward context.
    bool savesContext() { return !getSaved().empty(); }
    bool hasSharedExpert() { return getSharedWeights().size() == 3; }
    /// gate, up, down, then the shared expert's (moe.layer_grad's order
    /// of the weights' gradients and main_grads).
    ::llvm::SmallVector<::mlir::Value> getWeights() {
      ::llvm::SmallVector<::mlir::Value> weights = {
          getGateWeights(), getUpWeights(), getDownWeights()};
      ::llvm::append_range(weights, getSharedWeights());
      return weights;
    }
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

//===----------------------------------------------------------------------===//
// moe.layer_grad
//===----------------------------------------------------------------------===//

def MoE_LayerGradOp : MoE_Op<"layer_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "the backward of moe.layer: input, router-weight and weight gradients";
  let description = [{
    Given `d_out = dL/d out` of a `moe.layer` with the same operands and
    attributes, returns `d_x`, `d_router_weights` and the gradients of the
    routed (and shared) gate, up and down weights, each in the shape and
    element type of its operand.

    The `saved(...)` group is the backward context returned by the forward
    `moe.layer` (same order and shapes). Without it, the op *recomputes*
    dispatch, the gate/up GEMMs and the activation from the inputs.

    Numerics, per route `(t, k)` with weight `w` to local expert `e`, row `r`
    (all sums in fp32, in a fixed order, so results are deterministic):

    ```
    dh_u   = d_out[t] W_d[e]                    unscaled, fp32
    d_w[t,k] = <dh_u, h[r]>                     = <d_out[t], y[t,k]>; 0 for -1 routes
    dh     = bf16(w * dh_u)
    d_g    = bf16(1[g <= L] dh u' (s + silu(g') (1 - s))),  s = sigmoid(g')
    d_u    = bf16(1[-L <= u <= L] dh silu(g'))
    d_xr   = bf16(d_g W_g[e] + d_u W_u[e])      one accumulator for both
    dW_d[e] += bf16(w d_out[t])^T h[r],  dW_g[e] += d_g^T x_r,  dW_u[e] += d_u^T x_r
    d_x[t] = bf16(f32(d_x_shared[t]) + sum_k f32(d_xr[t,k]))
    ```

    The shared expert is the same with `w = 1` on every token.

    **Precision.** With `precision = "mxfp8"` or `"fp8"` (the forward
    layer's), every routed GEMM of the backward reads operands quantized
    as `moe.quantize` defines it, each along that GEMM's reduction
    dimension, then dequantized, accumulating in fp32:

    ```
    dh_u   = Qa(d_out[t]) Qt(W_d[e])                  d_out per token row along H
    d_xr   = bf16(Qa(d_g) Qt(W_g[e]) + Qa(d_u) Qt(W_u[e]))   d_g, d_u per row along I
    dW_d[e] += Qr(bf16(w d_out[t]))^T Qr(h[r])
    dW_g[e] += Qr(d_g)^T Qr(x_r),  dW_u[e] += Qr(d_u)^T Qr(x_r)
    ```

    `Qa`: blocks `[1, 32]` with E8M0 scales (`"mxfp8"`) or `[1, 128]` with
    f32 scales (`"fp8"`) along a row. `Qt`: a weight quantized along the
    dimension the GEMM reduces (W_d along H, W_g and W_u along I): blocks
    `[32, 1]` E8M0, or `[128, 128]` f32. `Qr`: blocks of `[32, 1]` E8M0 or
    `[128, 1]` f32 rows of the routed buffers, which the plan's padding (a
    multiple of that row block) keeps inside one expert's segment; padding
    rows are zero. The rest (d_w, dh, d_g, d_u from the saved bf16 gate, up
    and hidden; the shared expert) is as above. The context must be saved
    (no recompute).

    `main_grads(...)` (one fp32 tensor per weight, in the weights' order and
    shapes): Megatron-Core's gradient accumulation. Each weight's gradient
    result is then fp32, `main_grad + dW` with `dW` the unrounded fp32 sum
    (no bf16 rounding in between); a lowering may update the main_grad
    buffers in place.

    ```mlir
    %dx, %drw, %dwg, %dwu, %dwd = moe.layer_grad %dout, %x, %top, %rw,
        gate %wg, up %wu, down %wd saved(%xr, %g, %u, %h) plan !plan
        : (...) -> (tensor<8192x2048xbf16>, tensor<8192x8xf32>,
                    tensor<128x768x2048xbf16>, tensor<128x768x2048xbf16>,
                    tensor<128x2048x768xbf16>)
    ```
  }];
  let arguments = (ins MoE_BF16Matrix:$d_out, MoE_BF16Matrix:$x,
                       MoE_ExpertIds:$top_experts,
                       MoE_RouterWeights:$router_weights,
                       MoE_BF16Tensor3D:$gate_weights,
                       MoE_BF16Tensor3D:$up_weights,
                       MoE_BF16Tensor3D:$down_weights,
                       Variadic<MoE_BF16Matrix>:$shared_weights,
                       Variadic<MoE_BF16Matrix>:$saved,
                       Variadic<RankedTensorOf<[F32]>>:$main_grads,
                       TypeAttrOf<MoE_PlanType>:$plan,
                       MoE_SwigluLimit:$swiglu_limit,
                       OptionalAttr<StrAttr>:$precision);
  let results = (outs MoE_BF16Matrix:$d_x,
                      MoE_RouterWeights:$d_router_weights,
                      TensorRankOf<[BF16, F32], [3]>:$d_gate_weights,
                      TensorRankOf<[BF16, F32], [3]>:$d_up_weights,
                      TensorRankOf<[BF16, F32], [3]>:$d_down_weights,
                      Variadic<TensorRankOf<[BF16, F32], [2]>>:$d_shared_weights);
  let assemblyFormat = [{
    $d_out `,` $x `,` $top_experts `,` $router_weights `,` `gate` $gate_weights
    `,` `up` $up_weights `,` `down` $down_weights
    (`shared` `(` $shared_weights^ `)`)?
    (`saved` `(` $saved^ `)`)?
    (`main_grads` `(` $main_grads^ `)`)?
    `plan` $plan attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    PlanType getPlanType() { return ::llvm::cast<PlanType>(getPlan()); }
    bool hasSharedExpert() { return getSharedWeights().size() == 3; }
    /// gate, up, down, then the shared expert's, as moe.layer's.
    ::llvm::SmallVector<::mlir::Value> getWeights() {
      ::llvm::SmallVector<::mlir::Value> weights = {
          getGateWeights(), getUpWeights(), getDownWeights()};
      ::llvm::append_range(weights, getSharedWeights());
      return weights;
    }
    /// Their gradients, in the same order.
    ::llvm::SmallVector<::mlir::Value> getWeightGradients() {
      ::llvm::SmallVector<::mlir::Value> grads = {
          getDGateWeights(), getDUpWeights(), getDDownWeights()};
      ::llvm::append_range(grads, getDSharedWeights());
      return grads;
    }
    /// Whether backward recomputes gate/up instead of reading a saved context.
    bool recomputes() { return getSaved().empty(); }
    /// Whether the weights' gradients are added into fp32 main_grads.
    bool accumulatesMainGrads() { return !getMainGrads().empty(); }
  }];
}


//===----------------------------------------------------------------------===//
// moe.quantize / moe.dequantize: block-scaled FP8
//===----------------------------------------------------------------------===//

def MoE_QuantInput : TensorOf<[BF16, F32]>;
def MoE_FP8Values : TensorOf<[F8E4M3FN]>;
def MoE_BlockScales : TensorOf<[F8E8M0FNU, F32]>;

def MoE_QuantizeOp : MoE_Op<"quantize", [Pure]> {
  let summary = "block-scaled FP8 (E4M3) quantization";
  let description = [{
    Splits the last two dimensions of `input` (rank >= 2; bf16 or f32) into
    blocks of `block = [rows, cols]` elements and quantizes each block to
    E4M3 (`f8E4M3FN`) values with one scale. Leading dimensions are batch
    dimensions (an expert's weights, a token row of activations).
    `values` has the input's shape; `scales` has its shape with the last two
    dimensions divided by the block's.

    The scale's element type picks the scaling rule:

    - `f8E8M0FNU` (MX, e.g. MXFP8 with `block = [1, 32]`): a power of two
      `2^e`, with `e` the smallest integer such that `amax <= 448 * 2^e`
      (`amax` = the block's largest magnitude), clamped to `[-127, 127]`;
      a block of zeros has `e = -127`. Stored as the byte `e + 127`.
      Elements are `E4M3(x * 2^-e)`, the product taken exactly.
    - `f32` (fine-grained FP8, e.g. `[1, 128]` activations and
      `[128, 128]` weights): `s = f32(amax / 448)` (IEEE division, round
      to nearest even), `s = 1` for a block of zeros. Elements are
      `E4M3(f32(x / s))`.

    `E4M3(v)`: the `f8E4M3FN` value nearest to `v`, ties to an even
    mantissa, keeping the sign (`-0` stays `-0`); `|v| >= 448` saturates to
    `±448` (never NaN); subnormals (`m * 2^-9`) are kept.

    A block holding a NaN or an infinity has a NaN scale (the byte `0xFF`;
    an f32 NaN) and every element of it is NaN (`0x7F` with the element's
    sign bit): non-finite values are never hidden by saturation.

    With `transpose`, the op quantizes `input` with its last two dimensions
    swapped: `values` has that swapped shape, the blocks are blocks of the
    swapped data and `scales` follows from it (a weight `[E, N, K]` gives
    `values [E, K, N]`). A trainer keeps its FP8 weights in both layouts,
    K-major for the forward's GEMMs and for the backward's.

    On the GPU targets `moe.quantize` compiles on its own, outside a layer:
    a function whose body is `moe.quantize` ops of bf16 weights `[E, N, K]`
    in 128 x 128 blocks with f32 scales, each reading an argument and
    returned as it comes, is one kernel (convert-moe-to-mk; the scale
    refresh of `mok.ops.fp8_quantize`).

    ```mlir
    %q, %s = moe.quantize %w {block = array<i64: 1, 32>}
        : tensor<8x256x512xbf16> -> tensor<8x256x512xf8E4M3FN>, tensor<8x256x16xf8E8M0FNU>
    %qt, %st = moe.quantize %w {block = array<i64: 128, 128>, transpose}
        : tensor<8x256x512xbf16> -> tensor<8x512x256xf8E4M3FN>, tensor<8x4x2xf32>
    ```
  }];
  let arguments = (ins MoE_QuantInput:$input, DenseI64ArrayAttr:$block,
                       UnitAttr:$transpose);
  let results = (outs MoE_FP8Values:$values, MoE_BlockScales:$scales);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) `->` type($values) `,` type($scales)
  }];
  let hasVerifier = 1;
}

def MoE_DequantizeOp : MoE_Op<"dequantize", [Pure]> {
  let summary = "the values of block-scaled FP8 (E4M3) data";
  let description = [{
    The inverse map of `moe.quantize` with the same `block`: every element
    is `f32(v) * scale` of its block, multiplied in f32 (IEEE, so an E8M0
    scale past f32's range gives an infinity, and a NaN scale or value a
    NaN), then rounded to nearest even when the result is bf16.

    ```mlir
    %w = moe.dequantize %q, %s {block = array<i64: 1, 32>}
        : tensor<8x256x512xf8E4M3FN>, tensor<8x256x16xf8E8M0FNU> -> tensor<8x256x512xf32>
    ```
  }];
  let arguments = (ins MoE_FP8Values:$values, MoE_BlockScales:$scales,
                       DenseI64ArrayAttr:$block);
  let results = (outs MoE_QuantInput:$output);
  let assemblyFormat = [{
    $values `,` $scales attr-dict `:` type($values) `,` type($scales) `->` type($output)
  }];
  let hasVerifier = 1;
}

#endif // MOK_DIALECT_MOE_IR_MOEOPS_TD
