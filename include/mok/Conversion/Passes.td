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

    **Expert parallelism** (`ep = N > 1`, docs/ExpertParallel.md). A rank's
    layer cannot run alone: it exchanges rows with the other ranks. A
    function of one fused `moe.layer` or `moe.layer_grad` (returning its
    results) is replaced by three *stage functions*, which a host runs on
    every rank of the group, moving their buffers between the ranks in
    between (the `mok` package's `CompiledGroupLayer`). Each has a C
    interface; every argument is a memref, inputs first, then outputs,
    named by its `moe.buffer` attribute. With `L = E / N`, `S` a rank's
    rows sent and `R` routed rows, for `@f` holding a `moe.layer`:

    * `@f__ep_send(top_experts, x) -> (send_rows [N] i64, send_routes [N]
      i64, token [S] i32, expert_ids [S, k] i32, x_rows [S, H])`: per
      destination rank `d`, the tokens with a route to it (`send_rows[d]`)
      and those routes (`send_routes[d]`); then each such token packed once
      per destination rank, by destination then token: its index, the local
      expert id of each of its routes to `d` (`-1` otherwise) and its row of
      `x`. The caller sizes the packed buffers for `T * min(k, N)` rows.
    * `@f__ep_experts(recv_rows [N] i64, token, expert_ids, x_rows, gate,
      up, down) -> (routed_y [R, H], dest_rank [R] i32, dest_row [R] i32
      [, routed_x, gate, up, hidden])`: the rows received (source rank `s`'s
      `recv_rows[s]` rows after those of ranks `< s`) run through the local
      experts, rows ordered by expert, then source rank, then token, then
      `k`; each routed row's result goes back to row `token * k + k'` of
      rank `dest_rank` (`-1` for padding rows). Routed outputs are written to
      their first `R` rows; callers size them for `routes + L * (padding -
      1)` rows, `routes` being the routes received.
    * `@f__ep_combine(x, top_experts, router_weights[, shared weights],
      returned_y [T * k, H]) -> (out[, shared_gate, shared_up,
      shared_hidden])`: the shared expert, and `out` combined from the
      returned per-route rows with the router weights, in `k` order.

    For a `moe.layer_grad`, the mirror: `send(top_experts, d_out,
    router_weights[, x]) -> (send_rows, send_routes, token, expert_ids,
    d_out_rows, weights [S, k] f32[, x_rows])` (`x` when it recomputes);
    `experts(recv_rows, token, expert_ids, d_out_rows, weights[, x_rows],
    gate, up, down[, routed_x, gate, up, hidden]) -> (d_routed_x [R, H],
    d_route_weights [R] f32, dest_rank, dest_row, d_gate_weights,
    d_up_weights, d_down_weights)`; `combine(x, top_experts[, shared
    weights][, shared_gate, shared_up, shared_hidden], d_out, returned_dx
    [T * k, H], returned_dw [T * k] f32) -> (d_x, d_router_weights[, the
    shared weights' gradients])`. Unfused ops with `ep > 1`, `main_grads`
    and a function that is called are refused.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect",
                           "::mlir::LLVM::LLVMDialect"];
}

//===----------------------------------------------------------------------===//
// MoEToMK
//===----------------------------------------------------------------------===//

def ConvertMoEToMK : Pass<"convert-moe-to-mk", "::mlir::ModuleOp"> {
  let summary = "Plan a fused forward MoE layer as one persistent megakernel";
  let description = [{
    For every function whose body is one fused forward `moe.layer`, adds a
    `gpu.module @<name>_kernels` holding `gpu.func @<name>_forward`: one
    persistent kernel, launched cooperatively with one CTA per SM, whose
    body is the layer's schedule in the `mk` dialect, in phases separated by
    `mk.grid_barrier`:

    1. the routing plan on the device (`mk.fill`, `mk.count_routes`,
       `mk.scan_chunks`, `mk.pad_offsets`, `mk.assign_rows`: per-chunk
       counts, a per-expert scan, padded offsets, deterministic row
       assignment in route order within each expert), so no host
       synchronization is needed;
    2. the dispatch gather of routed rows (`mk.gather`);
    3. gate/up with the (clamped) SwiGLU, routed and shared (`mk.gemm ...
       swiglu`);
    4. the down projections (`mk.gemm ... store`);
    5. the router-weighted combine with the shared expert's output
       (`mk.combine`).

    The plan: a layer whose shapes fit the tensor-core tiles (H % 64 == 0,
    I % 128 == 0, I_s % 128 == 0 with a shared expert, padding % 64 == 0,
    TMA's 32-bit coordinates) gets tensor-core GEMMs for the chip, 4 stages
    and 256 threads per CTA. On sm_100a: `tcgen05`, tile [64, 128, 64], the
    first warpgroup computes. On sm_90a: `wgmma`, with 128-row tiles (both
    warpgroups compute, one 64-row half each, sharing the B boxes) when
    padding % 128 == 0, else 64-row tiles; gate/up tiles are 128 columns
    per operand, down tiles 256 columns. Otherwise, or with
    `tensor-cores=false`, `simt` GEMMs with `block-size` threads.

    The kernel takes bare pointers: the inputs and output of the layer, then
    the workspace buffers, each described in the `mok.kernel` attribute
    (name, role, element type, shape, and `access`: "tensor_maps" for inputs
    the kernel reads only through tensor maps, which is what lets the
    runtime bind weight views to them) that the runtime reads. A tensor-core
    kernel takes one more, last parameter, `tensor_maps` (role
    "tensor_maps", `memref<16n x i64>`): n CUtensorMap slots that the
    runtime encodes as `mok.kernel`'s `tensor_maps` list describes (buffer,
    rows, cols, row_stride, box_rows, box_cols, experts; bf16,
    SWIZZLE_128B, OOB zero). A routed weight's entry has one slot per
    expert (its [rows, cols] matrix), so any weight view (one tensor, the
    halves of a fused FC1, one allocation per expert) is read the same way.

    Training (docs/Backward.md): when the shapes fit the tiles (and with
    tensor-cores), every GEMM of both kernels runs on the chip's engine:
    `wgmma` on sm_90a (the weights read N-major by the dgrads, both
    operands M-/N-major by the weight gradients, the down dgrad gathering
    d_out's rows), `tcgen05` on sm_100a ([64, 128, 64] tiles, d_out
    copied); otherwise `simt`:
    * a `moe.layer` that returns the saved context becomes the training
      forward `<fn>_forward`, whose extra outputs (after `out`) are the
      context, routed rows at the plan's capacity: `routed_x`, `gate`,
      `up`, `hidden` and the shared expert's `shared_gate`, `shared_up`,
      `shared_hidden` (the gate/up GEMMs' `saves`);
    * `moe.layer_grad` becomes the backward kernel `<fn>_backward`: inputs
      `d_out`, the layer's operands and the context (unless it
      recomputes: then the kernel repeats the dispatch and the gate/up
      GEMMs first); outputs `d_x`, `d_router_weights` (f32) and `d_` plus
      each weight's name. Its phases: the plan rebuilt from `top_experts`;
      d_out gathered scaled by the router weight (and unscaled, unless the
      wgmma down dgrad gathers its rows itself); the down
      dgrad (f32) with the down weights' gradient (`k_groups`); the SwiGLU
      backward with the router weights' gradient (`mk.swiglu_grad`); the
      gate/up dgrad (`concat`, one accumulator) with the gate and up
      weights' gradients; the reverse dispatch (`mk.combine` without
      weights). Every sum has a fixed order: the gradients are bitwise
      reproducible.
    fuse-dispatch and multicast are refused for them; warp-specialize
    gives the training forward's GEMMs a producer warpgroup (and the FP8
    backward's; the bf16 backward's run without one) and is refused with
    a backward that recomputes the forward.

    Any token count: a layer whose plan has `tokens = ?` and a capacity
    (`max_tokens = C`) becomes a kernel for every T from 1 to C. Its
    buffers are sized for C; it takes the call's T as one more parameter
    (`tokens`, role "tokens", an i64 by value), which the routing plan, the
    shared expert's GEMMs, the SwiGLU backward and the combine read
    (`tokens(%t)` operands). In `mok.kernel`, `max_tokens` is C, and a
    parameter or tensor map whose rows follow T says so with `call_rows =
    [scale, offset]`: at a call they are `scale * T + offset` (T for token
    rows, T * k for routes, T * k + E * (padding - 1) for routed rows);
    the runtime checks the caller's tensors against those sizes and
    encodes those maps with them.

    Expert parallelism (`ep = N > 1`, docs/ExpertParallel.md): a forward
    (inference or training) and a backward each become one rank's kernel
    with the exchange inside it. Its extra parameters: `peers` (role "peers", `memref<N x i64>`, the
    address of every rank's symmetric buffer), `rank` (role "rank", an i32
    by value), `epoch` (role "epoch", an i64 by value, new at every launch)
    and `symmetric` (role "symmetric", `memref<B x i8>`: this rank's
    symmetric buffer, `symmetric_bytes` = B in `mok.kernel`, with its
    regions' offsets in `symmetric_layout`); `recv_capacity` (the plan's,
    or by default `N * T * min(k, E / N)`) sizes the receive and routed
    buffers. The schedule: the routes counted per rank and per expert,
    the counts stored into every rank (`mk.put_counts`, `mk.signal`,
    `mk.wait`) and checked against the capacity (`mk.check_capacity`),
    each token's row sent once to each rank it routes to (`mk.send_rows`),
    the shared expert's gate/up while the rows cross, the local experts
    planned over the received rows (`mk.received_rows`) and run as at
    `ep = 1` (with the dispatch copy), each result returned to its source
    (`mk.return_rows`) and combined there. The backward mirrors it: d_out's
    rows with their routes' router weights out, each routed row's d_x and
    each route's router-weight gradient back (`mk.take_routes`).

    With `self-exchange`, a layer of `ep = 1` is planned the same way, as
    the one rank of a group of one: its routes cross its own symmetric
    buffer through the peer table (one entry) and the epoch flags, so the
    exchange runs on one GPU through a real one-rank communicator (NCCL's
    window, docs/ExpertParallel.md). Its kernel is described with `ep = 1`
    and a `symmetric_bytes`, and runs bound to a communicator of one rank.
    It is slower than the `ep = 1` plan: it exists to test the exchange.

    Not supported yet, and rejected with an error: a dynamic token count
    without a capacity; at `ep > 1` or with `self-exchange`, a backward
    that recomputes the forward and the warp-specialize, fuse-dispatch and
    multicast options.
  }];
  let options = [
    Option<"chip", "chip", "std::string", /*default=*/"\"sm_90a\"",
           "GPU target: sm_90a (Hopper) or sm_100a (Blackwell)">,
    Option<"blockSize", "block-size", "unsigned", /*default=*/"256",
           "Threads per CTA of the kernels with simt GEMMs">,
    Option<"tensorCores", "tensor-cores", "bool", /*default=*/"true",
           "Use tensor-core GEMMs (wgmma on sm_90a, tcgen05 on sm_100a) "
           "when the layer's shapes fit (false: simt GEMMs everywhere)">,
    Option<"profile", "profile", "bool", /*default=*/"false",
           "Record the global timer at the start, after every grid barrier "
           "and at the end (one more barrier) into a `phase_clock` "
           "workspace buffer, with the phases named in mok.kernel's "
           "`phases`">,
    Option<"fuseDispatch", "fuse-dispatch", "bool", /*default=*/"false",
           "Require the fused dispatch (sm_90a): no dispatch copy; the "
           "routed gate/up GEMM copies its A rows straight from x "
           "(cp.async by the consumer threads, or with warp-specialize by "
           "the producer warpgroup; mk.gemm gather). Without fuse-dispatch "
           "or copy-dispatch it is used on sm_90a without warp-specialize">,
    Option<"copyDispatch", "copy-dispatch", "bool", /*default=*/"false",
           "Keep the dispatch copy (mk.gather into routed_x) where the "
           "fused dispatch would be used">,
    Option<"warpSpecialize", "warp-specialize", "bool", /*default=*/"false",
           "sm_90a: warp-specialized GEMMs (a TMA producer warpgroup after "
           "the consumers, per-stage empty barriers, epilogues from "
           "registers, setmaxnreg with two consumer warpgroups) instead of "
           "the first consumer thread loading between its MMAs">,
    Option<"multicast", "multicast", "bool", /*default=*/"false",
           "sm_90a tensor-core GEMMs without warp-specialize: launch "
           "clusters of 2 CTAs (mok.kernel cluster = 2) whose paired tasks "
           "of one expert and n-tile load each weight box once for both "
           "(TMA multicast of two 128-row halves; the down projections' "
           "maps get 128-row boxes). Refused where not implemented">,
    Option<"fp8QuantizedWeights", "fp8-quantized-weights", "bool",
           /*default=*/"false",
           "FP8 layers (precision = \"fp8\" or \"mxfp8\"): the kernels "
           "take the routed weights quantized, as inputs gate_q, "
           "gate_scale, up_q, up_scale, down_q and down_scale (the normal "
           "layout of mok.ops.fp8_quantize, or of mok.ops.mxfp8_quantize "
           "with its scales in tcgen05's atoms), and for training also "
           "the transposed layout, gate_qt, gate_scale_t, ... "
           "down_scale_t, refreshed by the caller when the weights "
           "change, instead of quantizing the bf16 weights at every "
           "call">,
    Option<"selfExchange", "self-exchange", "bool", /*default=*/"false",
           "Plan ep = 1 layers as one rank of an expert-parallel group: "
           "the routes cross the layer's own symmetric buffer (the "
           "exchange, tested through a one-rank communicator)">,
    Option<"barrierTimeoutMs", "barrier-timeout-ms", "unsigned",
           /*default=*/"0",
           "Debugging: bound every grid barrier's wait to this many "
           "milliseconds (0: unbounded). A barrier that times out is "
           "recorded in the kernel's `status` report and the kernel ends "
           "instead of hanging; the runtime names the barrier after the "
           "call">,
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::gpu::GPUDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mok::mk::MKDialect"];
}

//===----------------------------------------------------------------------===//
// MKToGPU
//===----------------------------------------------------------------------===//

def ConvertMKToGPU : Pass<"convert-mk-to-gpu", "::mlir::ModuleOp"> {
  let summary = "Expand megakernel schedules into gpu, nvgpu and NVVM ops";
  let description = [{
    Checks, then expands every `gpu.func` whose body holds `mk` ops:

    * barrier intervals: within one interval (between two
      `mk.grid_barrier`s) no buffer written by one op is read or written by
      another; the error names both ops and the buffer;
    * a kernel's tensor-core GEMMs use one engine, which matches the chip of
      `mok.kernel` (`wgmma`: sm_90a, `tcgen05`: sm_100a), with 4 stages and
      a tile it implements — [64, 128, 64]; for wgmma also 128 rows, and
      256 columns with one B operand — in a kernel of 256 threads;

    then lowers each op in place: grid-stride SIMT loops for the plan,
    gather, simt GEMMs and combine (the CPU reference's emitters and
    rounding points); for tensor-core GEMMs, the persistent TMA + mbarrier
    tile loop (tasks in groups of 16 m-tiles, n-tiles outer, for L2 reuse)
    with the chip's MMA layer (wgmma: one wgmma group per k-tile with one
    group in flight, register accumulators, the SwiGLU epilogue from
    registers; tcgen05.mma issued by one thread into Tensor Memory, read
    back with tcgen05.ld); `mk.grid_barrier` as a generation barrier on its state
    buffer. The sm_100a code is checked by ptxas and FileCheck only: no
    sm_100a GPU has run it.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::gpu::GPUDialect",
                           "::mlir::math::MathDialect",
                           "::mlir::memref::MemRefDialect",
                           "::mlir::scf::SCFDialect",
                           "::mlir::LLVM::LLVMDialect"];
}

#endif // MOK_CONVERSION_PASSES_TD
