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

#endif // MOK_DIALECT_MOE_TRANSFORMS_PASSES_TD
