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

//===----------------------------------------------------------------------===//
// MoEToGPU
//===----------------------------------------------------------------------===//

def ConvertMoEToGPU : Pass<"convert-moe-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Lower a fused forward MoE layer to one persistent GPU kernel";
  let description = [{
    For every function whose body is one fused forward `moe.layer`, adds a
    `gpu.module @<name>_kernels` holding `gpu.func @<name>_forward`: one
    persistent kernel, launched cooperatively with one CTA per SM, that runs
    the whole layer in phases separated by grid-wide barriers:

    1. the routing plan on the device (per-expert counts, padded offsets,
       deterministic row assignment: token order within each expert), so
       no host synchronization is needed;
    2. the dispatch gather of routed rows;
    3. gate/up with the (clamped) SwiGLU, and the shared expert's gate/up;
    4. the down projections;
    5. the router-weighted combine with the shared expert's output.

    The numerics are the CPU reference's (same emitters, same rounding
    points). Phases 3 and 4 are scalar FMA loops (same reduction order as
    the CPU), except for an *eligible* layer (H % 64 == 0, I % 128 == 0,
    I_s % 128 == 0 with a shared expert, padding % 64 == 0), where they are
    persistent TMA + mbarrier tensor-core tile loops (64x128 output tiles,
    k-tiles of 64 in a 4-stage shared-memory ring, fp32 accumulation in
    another order, gate/up rounded to bf16 before the SwiGLU as on the CPU)
    run by the first warpgroup of each CTA; such a kernel has 256 threads
    per CTA, whatever `block-size` says. The MMA layer is per chip: on
    sm_90a, wgmma with accumulators in registers; on sm_100a, tcgen05.mma
    (kind::f16, M = 64, N = 128) issued by one thread, with accumulators in
    Tensor Memory (256 columns allocated once per CTA) read back with
    tcgen05.ld. Everything else (tasks, tensor maps, pipeline, epilogue,
    kernel interface) is shared. The sm_100a code is checked by ptxas and
    FileCheck only: no sm_100a GPU has run it.

    The kernel takes bare pointers: the inputs and output of the layer, then
    the workspace buffers, each described in the `mok.kernel` attribute
    (name, element type, shape) that the runtime reads. A tensor-core kernel
    takes one more, last parameter, `tensor_maps` (role "tensor_maps",
    `memref<16n x i64>`): n 64-byte aligned CUtensorMaps that the runtime
    encodes as `mok.kernel`'s `tensor_maps` list describes (buffer, rows,
    cols, row_stride, box_rows, box_cols; bf16, SWIZZLE_128B, OOB zero), and
    `dynamic_shared_memory` gives the bytes to launch with.

    Not supported yet, and rejected with an error: expert parallelism
    (ep > 1), a dynamic token count, the saved context and `moe.layer_grad`.
  }];
  let options = [
    Option<"chip", "chip", "std::string", /*default=*/"\"sm_90a\"",
           "GPU target: sm_90a (Hopper) or sm_100a (Blackwell)">,
    Option<"blockSize", "block-size", "unsigned", /*default=*/"256",
           "Threads per CTA of the scalar kernels">,
    Option<"tensorCores", "tensor-cores", "bool", /*default=*/"true",
           "Use the TMA + tensor-core GEMM phases (wgmma on sm_90a, tcgen05 "
           "on sm_100a) when the layer is eligible (false: scalar GEMM "
           "phases everywhere)">,
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::gpu::GPUDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect",
                           "::mlir::LLVM::LLVMDialect"];
}

#endif // MOK_CONVERSION_PASSES_TD
