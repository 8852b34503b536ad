// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_PASSES_TD
#define MOK_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

//===----------------------------------------------------------------------===//
// MoEToCPU
//===----------------------------------------------------------------------===//

def ConvertMoEToCPU : Pass<"convert-moe-to-cpu", "::mlir::ModuleOp"> {
  let summary = "Lower MoE functions to loops on memrefs: the executable reference";
  let description = [{
    Rewrites every function that uses the `moe` dialect into scalar loops
    (`scf`, `memref`, `arith`, `math`) that compute exactly the dialect's
    semantics on the host: bf16 storage, fp32 accumulation in a fixed order,
    the routing plan built from `top_experts`. It is the reference every
    GPU lowering is checked against, not a fast CPU kernel.

    Every moe op is supported: `moe.plan`, `moe.dispatch`,
    `moe.expert_swiglu`, `moe.expert_down`, `moe.shared_expert`,
    `moe.combine`, `moe.layer` (with or without its saved context) and
    `moe.layer_grad` (from a saved context or recomputing).

    Calling convention of a lowered function (also given the C interface,
    `_mlir_ciface_<name>`): every tensor argument becomes a memref of the
    same shape; every tensor result becomes a trailing output memref argument,
    and the function returns nothing. A result whose routed-row dimension is
    dynamic (the saved context) is written to its first `R` rows, `R` being
    the plan's padded row count; callers size such buffers for the worst
    case, `T * top_k + (E / ep) * (padding - 1)` rows. Other dynamic
    dimensions are taken from the arguments.

    Expert ids outside `[0, E)` (including `-1`) are treated as "no route".
    Expert parallelism needs a communicator, so `ep > 1` is rejected.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect",
                           "::mlir::LLVM::LLVMDialect"];
}

#endif // MOK_CONVERSION_PASSES_TD
