// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MOE_TRANSFORMS_PASSES_TD
#define MOK_DIALECT_MOE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def MoEFuseLayer : Pass<"moe-fuse-layer"> {
  let summary = "Fuse the plan/dispatch/experts/combine chain into one moe.layer";
  let description = [{
    Finds every `moe.combine` whose routed rows come from the chain
    `moe.plan` → `moe.dispatch` → `moe.expert_swiglu` → `moe.expert_down`
    (all on one routing plan, in one block) and replaces the chain with one
    `moe.layer`. A shared expert whose output feeds the combine, computed on
    the same tokens with the same `swiglu_limit`, is fused too.

    A chain is left alone when fusing would change what the program computes
    or how often: an intermediate (routed rows, hidden activations, expert
    outputs, shared output) with another use, a plan that is not a
    `moe.plan`, ops spread over several blocks, or routed and shared experts
    with different clamps. With `remarks=true` the pass says why at each
    combine it leaves unfused. The `moe.plan` itself may have other users; it
    stays for them.

    Before:

    ```mlir
    %p = moe.plan %top : tensor<8192x8xi32> -> !moe.plan<...>
    %xr = moe.dispatch %x, %p : ...
    %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu : ...
    %y = moe.expert_down %h, %p, down %wd : ...
    %out = moe.combine %y, %p, weights %rw : ...
    ```

    After:

    ```mlir
    %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
        plan !moe.plan<...> : (...) -> tensor<8192x2048xbf16>
    ```
  }];
  let options = [
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark at every moe.combine left unfused, saying why">,
  ];
  let statistics = [
    Statistic<"numFused", "num-fused", "Number of layers fused">,
    Statistic<"numUnfused", "num-unfused",
              "Number of moe.combine ops left unfused">,
  ];
  let dependentDialects = ["::mok::moe::MoEDialect"];
}

def MoEGenerateBackward : Pass<"moe-generate-backward", "::mlir::ModuleOp"> {
  let summary = "Derive the training forward and the backward of every MoE layer function";
  let description = [{
    For every function `@f` whose body is one MoE layer (fused, or an
    unfused chain that `--moe-fuse-layer` can fuse, which this pass does
    first), adds two functions and leaves `@f` as the inference form:

    * `@f_forward` — same arguments; returns `@f`'s output followed by the
      **backward context**, the tensors backward reads: `routed_x`, `gate`,
      `up`, `hidden` and, with a shared expert, `shared_gate`, `shared_up`,
      `shared_hidden`. Each context result is tagged `moe.saved = "<name>"`.
    * `@f_backward` — `@f`'s arguments, then the context (tagged the same
      way), then `d_out` (tagged `moe.cotangent`); returns the gradient of
      every floating-point argument, in argument order, each tagged
      `moe.gradient_of = <argument index>`. Expert ids get no gradient.

    With `recompute=true` the context is empty: `@f_forward` returns only the
    output and `@f_backward` replays dispatch, the gate/up GEMMs and the
    activation from the inputs (less memory, more compute).

    With `main-grads=true` (Megatron-Core's gradient accumulation)
    `@f_backward` also takes one fp32 `main_grad` per weight after `d_out`
    (in the weights' order, each tagged `moe.main_grad_of = <argument
    index>`), and each weight's gradient result is fp32 `main_grad + dW`
    (`moe.layer_grad`'s `main_grads`).

    Supported today: a body of exactly one layer whose operands are distinct
    function arguments and whose result is returned. Anything else (other
    ops around the layer, an argument used for two operands, several layers)
    is rejected with an error at the op that is not supported.

    ```mlir
    // Before
    func.func @f(%x, %top, %rw, %wg, %wu, %wd) -> tensor<64x32xbf16> {
      %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan : ...
      return %o : tensor<64x32xbf16>
    }
    // After (besides @f)
    func.func @f_forward(...) -> (tensor<64x32xbf16>,
        tensor<?x32xbf16> {moe.saved = "routed_x"}, ...)
    func.func @f_backward(..., %ctx..., %dout {moe.cotangent})
        -> (tensor<64x32xbf16> {moe.gradient_of = 0 : i64}, ...)
    ```
  }];
  let options = [
    Option<"recompute", "recompute", "bool", /*default=*/"false",
           "Save no context; recompute gate/up and the activation in backward">,
    Option<"mainGrads", "main-grads", "bool", /*default=*/"false",
           "The backward adds each weight's gradient into an fp32 main_grad "
           "argument (main_grad + dW)">,
  ];
  let dependentDialects = ["::mok::moe::MoEDialect",
                           "::mlir::func::FuncDialect"];
}

#endif // MOK_DIALECT_MOE_TRANSFORMS_PASSES_TD
