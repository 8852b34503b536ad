// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_DIALECT_MK_IR_MKOPS_TD
#define MOK_DIALECT_MK_IR_MKOPS_TD

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Dialect
//===----------------------------------------------------------------------===//

def MK_Dialect : Dialect {
  let name = "mk";
  let cppNamespace = "::mok::mk";
  let summary = "The megakernel: one persistent kernel's schedule, explicit";
  let description = [{
    The `mk` dialect is the kernel level between the fused `moe.layer` and
    NVVM. A megakernel is a `gpu.func` (launched cooperatively, one CTA per
    SM) whose body is a straight sequence of `mk` ops over its buffer
    parameters. Each op is a *grid-wide step*: every thread of the grid takes
    part, and the op says how the work is split (grid-stride loops over
    elements, or a persistent loop over output tiles assigned to CTAs
    round-robin). What an op writes is visible to other CTAs only after the
    next `mk.grid_barrier`: within one barrier interval, a buffer written by
    one op may not be read or written by another (`convert-mk-to-gpu`
    checks this and reports the pair of ops).

    So the schedule is printed and tested here, without a GPU: the phases
    (routing plan, dispatch gather, grouped GEMMs with their epilogues,
    combine), the barriers between them, and for every GEMM its engine
    (`simt` scalar FMAs; `wgmma` on sm_90a or `tcgen05` on sm_100a, both fed
    by TMA through an mbarrier-completed shared-memory ring), tile, stage
    count and tensor-map slots. `convert-moe-to-mk` chooses them;
    `convert-mk-to-gpu` expands each op into gpu/scf/memref/nvgpu/nvvm ops.
    What the lowering implements for each chip is one query
    (`mok/Dialect/MK/IR/MKSchedule.h`): the planner asks it for every GEMM it
    plans, and the lowering checks every GEMM against it.

    *Any token count.* A kernel compiled for every token count up to a
    capacity (`!moe.plan<tokens = ?, ..., max_tokens = C>`) keeps its buffers'
    static shapes at the capacity `C` and takes the call's token count `T`
    (`1 <= T <= C`) as an `i64` parameter. The ops whose work runs over
    tokens take it as an optional `tokens(%t)` operand (`index`): only the
    first `T` rows of their token-indexed buffers (`top_experts`,
    `router_weights`, `x`, `out`, the shared expert's rows, ...) are read or
    written, and the rows past `T` of those buffers may not exist (the
    caller's tensors have `T` rows). Without the operand, every row is.

    *Expert parallelism.* A kernel of one rank of an `ep`-rank group has a
    symmetric buffer (`memref<Bxi8>`, the same size and layout on every
    rank) and the peer table `peers [ep]` (i64: the address of each rank's
    symmetric buffer, this rank's included). Its regions are `memref.view`s
    of the buffer at fixed byte offsets; rank `d`'s copy of a region is at
    the same offset from `peers[d]`. The exchange ops (`mk.put_counts`,
    `mk.send_rows`, `mk.return_rows`) store into the peers' copies;
    `mk.signal` and `mk.wait` order those stores with flags that carry the
    launch's `epoch`, all on the device.

    ```mlir
    gpu.func @layer_forward(...) kernel {
      mk.fill %row_route, -1 : memref<34784xi64>
      mk.count_routes %top_experts into %chunk_counts {chunk = 64 : i64}
          : memref<4096x8xi32>, memref<512x32xi64>
      mk.grid_barrier %bar : memref<2xi32>
      ...
      mk.gemm swiglu %routed_x, %gate, %up into %hidden
          grouped(%row_expert, %offsets : memref<34784xi64>, memref<33xi64>)
          maps(%tensor_maps : memref<...xi64>)
          schedule <wgmma, tile = [64, 128, 64], stages = 4>
          {maps = array<i64: 0, 1, 33>}
          : memref<34784x7168xbf16>, memref<32x2048x7168xbf16>, memref<32x2048x7168xbf16>
            -> memref<34784x2048xbf16>
      mk.grid_barrier %bar : memref<2xi32>
      ...
    }
    ```
  }];
  let useDefaultAttributePrinterParser = 1;
}

class MK_Op<string mnemonic, list<Trait> traits = []>
    : Op<MK_Dialect, mnemonic,
         !listconcat(traits, [HasParent<"::mlir::gpu::GPUFuncOp">])>;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def MK_Engine : I32EnumAttr<"Engine", "how a GEMM's output tiles are computed", [
    I32EnumAttrCase<"simt", 0>,
    I32EnumAttrCase<"wgmma", 1>,
    I32EnumAttrCase<"tcgen05", 2>]> {
  let cppNamespace = "::mok::mk";
}

def MK_Epilogue : I32EnumAttr<"Epilogue", "what a GEMM does with its accumulators", [
    I32EnumAttrCase<"store", 0>,
    I32EnumAttrCase<"swiglu", 1>]> {
  let cppNamespace = "::mok::mk";
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def MK_GemmScheduleAttr : AttrDef<MK_Dialect, "GemmSchedule"> {
  let mnemonic = "gemm_schedule";
  let summary = "How an mk.gemm computes its output tiles";
  let description = [{
    The schedule of one GEMM, as the planner chose it and the lowering
    implements it: the engine; for the tensor-core engines the output tile
    `[M, N, K]` and the shared-memory stages it is reduced through; and on
    `wgmma` the warp roles and the CTA pairs:

    * `producer`: one thread of an extra warpgroup after the consumer
      warpgroups issues every TMA load (warp specialization);
    * `registers = [consumer, producer]` (with `producer`): the registers
      each consumer and each producer-warpgroup thread get for the phase
      (`setmaxnreg`), each a multiple of 8 in [24, 256];
    * `multicast`: the CTAs of a cluster pair (the kernel's `mok.kernel`
      `cluster = 2`) take two tasks at once and load each weight box once
      for both (TMA multicast of two 128-row halves); without `producer`.

    What the op computes (its epilogue, operand forms and clamp) is the
    op's own; this attribute says only how. `simt` has no other parameter.

    ```mlir
    #mk.gemm_schedule<simt>
    #mk.gemm_schedule<tcgen05, tile = [64, 128, 64], stages = 4>
    #mk.gemm_schedule<wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]>
    #mk.gemm_schedule<wgmma, tile = [128, 256, 64], stages = 4, multicast>
    ```
  }];
  let parameters = (ins
      EnumParameter<MK_Engine>:$engine,
      OptionalArrayRefParameter<"int64_t">:$tile,
      DefaultValuedParameter<"int64_t", "0">:$stages,
      DefaultValuedParameter<"bool", "false">:$producer,
      OptionalArrayRefParameter<"int64_t">:$registers,
      DefaultValuedParameter<"bool", "false">:$multicast);
  let builders = [
    AttrBuilder<(ins "Engine":$engine), [{
      return $_get($_ctxt, engine, ArrayRef<int64_t>(), 0, false,
                   ArrayRef<int64_t>(), false);
    }]>
  ];
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    bool usesTensorCores() const { return getEngine() != Engine::simt; }
    /// The tile's rows, columns and K (tensor-core engines).
    int64_t tileM() const { return getTile()[0]; }
    int64_t tileN() const { return getTile()[1]; }
    int64_t tileK() const { return getTile()[2]; }
  }];
}

//===----------------------------------------------------------------------===//
// Buffer types
//===----------------------------------------------------------------------===//

def MK_I64Vector : MemRefRankOf<[I64], [1]>;
def MK_Ids : MemRefRankOf<[I32, I64], [2]>;
def MK_Bf16Matrix : MemRefRankOf<[BF16], [2]>;
// MX block scales (precision = "mxfp8"): E8M0 bytes in tcgen05's
// scale-factor layout, one 512-byte atom per 128 rows x 128 columns
// (docs/FP8.md, "MX scales in the kernels").
def MK_MxScales : MemRefRankOf<[F8E8M0FNU], [3, 4]>;
/// A GEMM operand: bf16, or FP8 E4M3 with block scales.
def MK_GemmMatrix : MemRefRankOf<[BF16, F8E4M3FN], [2]>;

//===----------------------------------------------------------------------===//
// The routing plan
//===----------------------------------------------------------------------===//

def MK_FillOp : MK_Op<"fill"> {
  let summary = "Sets every element of an i64 buffer, grid-stride";
  let description = [{
    ```mlir
    mk.fill %row_route, -1 : memref<332xi64>
    ```
  }];
  let arguments = (ins Arg<MK_I64Vector, "", [MemWrite]>:$buffer,
                       I64Attr:$value);
  let assemblyFormat = "$buffer `,` $value attr-dict `:` type($buffer)";
}

def MK_CountRoutesOp : MK_Op<"count_routes"> {
  let summary = "Counts each chunk's valid routes per expert";
  let description = [{
    The routes of `top_experts [T, k]` (route `q` = token `q / k`, slot
    `q % k`) are cut into chunks of `chunk` consecutive routes; chunk `c`'s
    row of `chunk_counts [C, E]` (C = ceil(T*k / chunk)) becomes the number
    of its routes to each expert `e` in `[0, E)`; other ids are no route. In
    kernels of whole warps (a known block size, a multiple of 32) one warp a
    chunk zeroes the row and counts 32 routes a round (`match.sync` groups
    the lanes by expert; each group's first lane adds its size); else one
    thread a chunk walks its routes. Either way a chunk's row is written by
    its own warp or thread alone. With `tokens(%t)`, the routes are
    `q < t * k` (chunks past them get zero counts).

    ```mlir
    mk.count_routes %top into %chunk_counts {chunk = 64 : i64} : memref<40x2xi32>, memref<2x4xi64>
    ```
  }];
  let arguments = (ins Arg<MK_Ids, "", [MemRead]>:$top_experts,
                       Arg<MemRefRankOf<[I64], [2]>, "", [MemWrite]>:$chunk_counts,
                       Optional<Index>:$tokens,
                       ConfinedAttr<I64Attr, [IntPositive]>:$chunk);
  let assemblyFormat = [{
    $top_experts `into` $chunk_counts (`tokens` `(` $tokens^ `)`)? attr-dict
    `:` type($top_experts) `,` type($chunk_counts)
  }];
  let hasVerifier = 1;
}

def MK_Status : MemRefRankOf<[I32], [1]>;

def MK_CheckRoutesOp : MK_Op<"check_routes"> {
  let summary = "Reports expert ids that are neither -1 nor an expert";
  let description = [{
    Every route of `top_experts [T, k]` whose id is not -1 (no route) and
    not in `[0, experts)` is reported in `status` (8 words, the kernel's
    report to the runtime, zero before the launch): `status[0]` becomes 1,
    `status[1]` one such id (its low 32 bits) and `status[2]` its route
    `q` (token `q / k`, slot `q % k`). The routing plan treats such a route
    as no route (`mk.count_routes`, `mk.assign_rows`), so nothing reads or
    writes out of bounds; the runtime turns the report into an error after
    the call (`mok_layer_take_report`). One thread a route, spread over the
    grid; only threads that find a bad id write. With `tokens(%t)`, the
    routes are `q < t * k`.

    ```mlir
    mk.check_routes %top into %status {experts = 8 : i64} : memref<40x2xi32>, memref<8xi32>
    ```
  }];
  let arguments = (ins Arg<MK_Ids, "", [MemRead]>:$top_experts,
                       Arg<MK_Status, "", [MemWrite]>:$status,
                       Optional<Index>:$tokens,
                       ConfinedAttr<I64Attr, [IntPositive]>:$experts);
  let assemblyFormat = [{
    $top_experts `into` $status (`tokens` `(` $tokens^ `)`)? attr-dict `:`
    type($top_experts) `,` type($status)
  }];
  let hasVerifier = 1;
}

def MK_ScanChunksOp : MK_Op<"scan_chunks"> {
  let summary = "Per expert, each chunk's first rank and the total count";
  let description = [{
    For every expert `e`: replaces `chunk_counts[c][e]` by the exclusive
    prefix sum over the chunks before `c`, and writes the total to
    `counts[e]`. Lowered with one warp an expert (each lane's run of
    chunks loaded up to 32 at once and summed, a shuffle scan over the
    lanes, the prefixes written in a second pass) in kernels of whole
    warps, else one thread an expert. Afterwards chunk `c`'s routes to `e`
    rank from `chunk_counts[c][e]` within the expert, in route order.

    ```mlir
    mk.scan_chunks %chunk_counts into %counts : memref<2x4xi64>, memref<4xi64>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[I64], [2]>, "",
                           [MemRead, MemWrite]>:$chunk_counts,
                       Arg<MK_I64Vector, "", [MemWrite]>:$counts);
  let assemblyFormat = [{
    $chunk_counts `into` $counts attr-dict `:` type($chunk_counts) `,`
    type($counts)
  }];
  let hasVerifier = 1;
}

def MK_PadOffsetsOp : MK_Op<"pad_offsets"> {
  let summary = "Exclusive scan of the counts rounded up to the padding";
  let description = [{
    `offsets[e] = sum_{i<e} ceil(counts[i] / padding) * padding`, and
    `offsets[E]` is the padded routed row count R. The grid's first warp
    computes it (a lane's run of experts, a shuffle scan over the lanes) in
    kernels of whole warps, else its first thread.

    ```mlir
    mk.pad_offsets %counts into %offsets {padding = 64 : i64} : memref<4xi64>, memref<5xi64>
    ```
  }];
  let arguments = (ins Arg<MK_I64Vector, "", [MemRead]>:$counts,
                       Arg<MK_I64Vector, "", [MemWrite]>:$offsets,
                       ConfinedAttr<I64Attr, [IntPositive]>:$padding);
  let assemblyFormat = [{
    $counts `into` $offsets attr-dict `:` type($counts) `,` type($offsets)
  }];
  let hasVerifier = 1;
}

def MK_AssignRowsOp : MK_Op<"assign_rows"> {
  let summary = "Gives every valid route a row of its expert's segment";
  let description = [{
    Expert `e`'s routes take rows `offsets[e], offsets[e] + 1, ...` in route
    order: each chunk (of `chunk` routes, as in `mk.count_routes`) ranks its
    routes from the chunk's first ranks in `chunk_counts` (as
    `mk.scan_chunks` leaves them; the lowering may advance them, so they
    are scratch afterwards), so the assignment is deterministic. In
    kernels of whole warps one warp a chunk takes 32 routes a round, a
    route's rank adding its `match.sync` peers on lower lanes; else one thread a chunk walks them. Writes `route_row [T*k]` (-1
    for invalid routes), `row_route [Rcap]` (the route of a row; padding
    rows keep what they held, -1 from an `mk.fill`) and `row_expert [Rcap]`
    (the expert of every row of a segment, padding rows included, one warp
    or thread an expert; rows past R are left as they are). With
    `tokens(%t)`, the routes are `q < t * k` (route_row's others are left
    as they are).

    ```mlir
    mk.assign_rows %top, %offsets, %chunk_counts into %route_row, %row_route, %row_expert
        {chunk = 64 : i64} : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64>
        -> memref<80xi64>, memref<108xi64>, memref<108xi64>
    ```
  }];
  let arguments = (ins Arg<MK_Ids, "", [MemRead]>:$top_experts,
                       Arg<MK_I64Vector, "", [MemRead]>:$offsets,
                       Arg<MemRefRankOf<[I64], [2]>, "",
                           [MemRead, MemWrite]>:$chunk_counts,
                       Arg<MK_I64Vector, "", [MemWrite]>:$route_row,
                       Arg<MK_I64Vector, "", [MemWrite]>:$row_route,
                       Arg<MK_I64Vector, "", [MemWrite]>:$row_expert,
                       Optional<Index>:$tokens,
                       ConfinedAttr<I64Attr, [IntPositive]>:$chunk);
  let assemblyFormat = [{
    $top_experts `,` $offsets `,` $chunk_counts `into` $route_row `,`
    $row_route `,` $row_expert (`tokens` `(` $tokens^ `)`)? attr-dict `:`
    type($top_experts) `,`
    type($offsets) `,` type($chunk_counts) `->` type($route_row) `,`
    type($row_route) `,` type($row_expert)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Dispatch, GEMMs, combine
//===----------------------------------------------------------------------===//

def MK_GatherOp : MK_Op<"gather", [AttrSizedOperandSegments]> {
  let summary = "Dispatch: copies each routed row's token row";
  let description = [{
    For every row `r < R = offsets[E]`: `routed_x[r] = x[row_route[r] / k]`,
    or zeros for a padding row (`row_route[r] = -1`). Grid-stride over
    elements (16-byte pieces when the hidden size is a multiple of 8 and
    the buffers are 16-byte aligned).

    *Scaled* (`scale(%router_weights)`, the backward's reverse combine):
    `routed_x[r] = bf16(w * f32(x[t]))` with `w = router_weights[t, q % k]`
    for `q = row_route[r]`, `t = q / k` (zeros for padding rows as before).

    *FP8* (`x` and `routed_x` f8E4M3FN, with `block_scales(%x_scales into
    %routed_scales)`): the rows of x's E4M3 values are copied as they are,
    and their 1 x 128 block scales (`mk.quantize_rows`' layout, `[H/128,
    S]`) with them: `routed_scales[b, r] = x_scales[b, t]`, 1 for a padding
    row (whose values are zeros). A routed row quantized so is the routed
    row of x quantized (row blocks), so the FP8 dispatch quantizes x's T
    rows instead of the k times more routed ones.

    ```mlir
    mk.gather %x, %row_route, %offsets into %routed_x {top_k = 2 : i64}
        : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    mk.gather %d_out, %row_route, %offsets into %d_y
        scale(%router_weights : memref<40x2xf32>) {top_k = 2 : i64}
        : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    ```
  }];
  let arguments = (ins Arg<MK_GemmMatrix, "", [MemRead]>:$x,
                       Arg<MK_I64Vector, "", [MemRead]>:$row_route,
                       Arg<MK_I64Vector, "", [MemRead]>:$offsets,
                       Arg<MK_GemmMatrix, "", [MemWrite]>:$routed_x,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "",
                           [MemRead]>:$scale,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "",
                           [MemRead]>:$x_scales,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "",
                           [MemWrite]>:$routed_scales,
                       ConfinedAttr<I64Attr, [IntPositive]>:$top_k);
  let assemblyFormat = [{
    $x `,` $row_route `,` $offsets `into` $routed_x
    (`scale` `(` $scale^ `:` type($scale) `)`)?
    (`block_scales` `(` $x_scales^ `into` $routed_scales `:` type($x_scales)
     `->` type($routed_scales) `)`)? attr-dict `:` type($x)
    `,` type($row_route) `,` type($offsets) `->` type($routed_x)
  }];
  let hasVerifier = 1;
}

def MK_QuantizeRowsOp : MK_Op<"quantize_rows", [AttrSizedOperandSegments]> {
  let summary = "FP8: E4M3 values and f32 scales of 1 x 128 row blocks";
  let description = [{
    Block-scaled FP8 of a bf16 matrix `src [R, C]` (C a multiple of 128),
    the blocks 128 consecutive elements of a row, by moe.quantize's rule
    with f32 scales (docs/FP8.md): for block `b` of row `r`, `s = f32(amax
    / 448)` (an IEEE division; 1 for a block of zeros), `values[r, c] =
    E4M3(f32(src[r, c] / s))` rounded to nearest even with saturation to
    +-448, and `scales[b, r] = s`, the scales block-major so that a tile's
    scales of one block of columns are contiguous (`S >= R` columns, a
    multiple of 4: 16-byte rows). A block holding a NaN or an infinity gets
    a NaN scale and NaN values (`0x7F` with each element's sign). With
    `tokens(%t)` only rows `r < t` are quantized (a kernel for any token
    count); with `grouped(%offsets)` (the routed rows of a grouped layout,
    `offsets [E + 1]`) only rows `r < offsets[E]`, the rows the experts
    use: the capacity's rows past them are never written and are not read
    (compute-sanitizer's initcheck). The others are left as they are.

    With E8M0 scales (`f8E8M0FNU`, the `precision = "mxfp8"` layers) the
    blocks are 32 elements of a row and the rule is moe.quantize's MX one:
    the scale `2^e` with `e` the smallest integer such that `amax <= 448 *
    2^e`, clamped to [-127, 127] (-127 for a block of zeros), stored as the
    byte `e + 127`, and `values[r, c] = E4M3(src[r, c] * 2^-e)`; a block
    holding a NaN or an infinity gets the byte 0xFF and NaN values. The
    scales are `[R' / 128, C / 128, 512]` (R' >= R rounded up to 128) in
    tcgen05's scale-factor layout: row `r`'s block `c / 32` is byte
    `(r % 32) * 16 + (r % 128) / 32 * 4 + (c % 128) / 32` of atom `[r / 128,
    c / 128]`.

    The step of the FP8 layers (`precision = "fp8"`) that quantizes
    activations inside the kernel (x's rows, the hidden activation, the
    backward's d_out). convert-mk-to-gpu gives each block to one warp of a
    kernel of whole warps (the scale an IEEE division; each quotient the
    correctly rounded `x / s`, from `RN(1 / s)` and two fused Newton
    steps; `cvt.rn.satfinite` to E4M3), bit for bit the rule above.

    ```mlir
    mk.quantize_rows %x into %x_q, %x_scales
        : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<2x40xf32>
    ```
  }];
  let arguments = (ins Arg<MK_Bf16Matrix, "", [MemRead]>:$src,
                       Arg<MemRefRankOf<[F8E4M3FN], [2]>, "", [MemWrite]>:$values,
                       Arg<AnyTypeOf<[MemRefRankOf<[F32], [2]>, MK_MxScales]>, "",
                           [MemWrite]>:$scales,
                       Optional<Index>:$tokens,
                       Arg<Optional<MemRefRankOf<[I64], [1]>>, "",
                           [MemRead]>:$offsets);
  let assemblyFormat = [{
    $src `into` $values `,` $scales (`tokens` `(` $tokens^ `)`)?
    (`grouped` `(` $offsets^ `:` type($offsets) `)`)? attr-dict
    `:` type($src) `->` type($values) `,` type($scales)
  }];
  let extraClassDeclaration = [{
    /// E8M0 scales: the MX rule, blocks of 32 along a row.
    bool isMx() {
      return mlir::isa<mlir::Float8E8M0FNUType>(
          mlir::cast<mlir::MemRefType>(getScales().getType()).getElementType());
    }
  }];
  let hasVerifier = 1;
}

def MK_QuantizeColumnsOp : MK_Op<"quantize_columns", [AttrSizedOperandSegments]> {
  let summary = "FP8: E4M3 values and f32 scales of 128 x 1 column blocks, "
                "stored transposed";
  let description = [{
    Block-scaled FP8 of a bf16 matrix `src [R, C]` whose blocks are 128
    consecutive rows of one column, by `mk.quantize_rows`' rule, stored
    transposed (K-major for a GEMM that reduces over the rows):
    `values [C, R']` (R' >= R, a multiple of 128) with `values[c, r] =
    E4M3(f32(src[r, c] / s))` for block `b = r / 128` of column `c`, and
    `scales [R' / 128, S]` (S >= C, a multiple of 4) with `scales[b, c] =
    s`. Rows past R read as zeros.

    With `routed(%row_route, %offsets)` the rows are the routing plan's:
    only the blocks holding routed rows (`r < offsets[E]`) are written, and
    a padding row (`row_route[r] < 0`) reads as zeros whatever `src` holds
    there. So a weight gradient's K loop over an expert's segment (a
    multiple of 128 rows, the FP8 padding) reads only its own rows.

    The backward of the FP8 layers (`precision = "fp8"`) quantizes d_y, the
    hidden activation, d_gate, d_up and the routed rows of x so for the
    weight gradients. convert-mk-to-gpu gives each block of 32 columns to a
    warp: with 16-byte aligned buffers the block stays in registers (a
    lane 16 rows of 8 columns) and each warp loads its next block while it
    quantizes the current one; otherwise a lane a column, an amax pass and
    then the quantizing pass. Either stores 16 consecutive values of a
    column at a time.

    *Gathered* (`gathered(%router_weights)`, with `routed`): the rows are
    those `mk.gather`'s scaled form makes of the token rows `src [T, C]`,
    read from `src` instead of from a gathered copy: row `r` (`r <
    offsets[E]`, R = row_route's length) is `bf16(w * f32(src[t]))` for
    `q = row_route[r]`, `t = q / k`, `w = router_weights[t, q % k]` (`k` =
    router_weights' columns, static), zeros for a padding row (a NaN
    product's sign is the multiply's). The FP8
    backward quantizes d_y's column blocks so, straight from d_out: d_y
    (the routed rows, k times d_out's) is never stored in bf16.

    With E8M0 scales (`precision = "mxfp8"`) the blocks are 32 rows of a
    column, by `mk.quantize_rows`' MX rule, and the scales are tcgen05's
    scale-factor atoms of the transposed matrix, `[ceil(C / 128), R' / 128,
    512]`: column `c`'s block `r / 32` is byte `(c % 32) * 16 + (c % 128) /
    32 * 4 + (r % 128) / 32` of atom `[c / 128, r / 128]`.

    ```mlir
    mk.quantize_columns %d_y into %d_y_t, %d_y_t_scales
        routed(%row_route, %offsets : memref<640xi64>, memref<5xi64>)
        : memref<640x256xbf16> -> memref<256x640xf8E4M3FN>, memref<5x256xf32>
    mk.quantize_columns %d_out into %d_y_t, %d_y_t_scales
        routed(%row_route, %offsets : memref<640xi64>, memref<5xi64>)
        gathered(%router_weights : memref<300x2xf32>)
        : memref<300x256xbf16> -> memref<256x640xf8E4M3FN>, memref<5x256xf32>
    ```
  }];
  let arguments = (ins Arg<MK_Bf16Matrix, "", [MemRead]>:$src,
                       Arg<MemRefRankOf<[F8E4M3FN], [2]>, "", [MemWrite]>:$values,
                       Arg<AnyTypeOf<[MemRefRankOf<[F32], [2]>, MK_MxScales]>, "",
                           [MemWrite]>:$scales,
                       Arg<Optional<MK_I64Vector>, "", [MemRead]>:$row_route,
                       Arg<Optional<MK_I64Vector>, "", [MemRead]>:$offsets,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "",
                           [MemRead]>:$router_weights);
  let assemblyFormat = [{
    $src `into` $values `,` $scales
    (`routed` `(` $row_route^ `,` $offsets `:` type($row_route) `,`
     type($offsets) `)`)?
    (`gathered` `(` $router_weights^ `:` type($router_weights) `)`)? attr-dict
    `:` type($src) `->` type($values) `,` type($scales)
  }];
  let extraClassDeclaration = [{
    /// E8M0 scales: the MX rule, blocks of 32 rows of a column.
    bool isMx() {
      return mlir::isa<mlir::Float8E8M0FNUType>(
          mlir::cast<mlir::MemRefType>(getScales().getType()).getElementType());
    }
    /// The rows quantized: row_route's when gathered, else src's.
    int64_t quantizedRows() {
      mlir::Value rows = getRouterWeights() ? getRowRoute() : getSrc();
      return mlir::cast<mlir::MemRefType>(rows.getType()).getDimSize(0);
    }
  }];
  let hasVerifier = 1;
}

def MK_QuantizeWeightsOp : MK_Op<"quantize_weights"> {
  let summary = "FP8: E4M3 values and f32 scales of 128 x 128 weight blocks";
  let description = [{
    Block-scaled FP8 of the routed experts' bf16 weights `src [E, N, K]`
    (N and K multiples of 128), the blocks 128 x 128, by
    `mk.quantize_rows`' rule over a block: `s = f32(amax / 448)` (1 for a
    block of zeros), `values[e, n, k] = E4M3(f32(src[e, n, k] / s))`
    rounded to nearest even with saturation to +-448, `scales[e, n/128,
    k/128] = s`; a block holding a NaN or an infinity gets a NaN scale and
    NaN values (`0x7F` with each element's sign). The scales have the
    layout FP8 `mk.gemm` reads for its B operands.

    With `transposed` the values and scales are those of `src` transposed,
    `values [E, K, N]` and `scales [E, K/128, N/128]`: the blocks are
    square, so they are the same blocks and scales, stored transposed. The
    backward's GEMMs reduce over the weights' other dimension and read them
    so, K-major as E4M3 wgmma requires.

    With E8M0 scales (`f8E8M0FNU`, the `precision = "mxfp8"` layers) each
    row of each expert is quantized as `mk.quantize_rows` does with E8M0
    scales (blocks of 32 along K), the scales `[E, N / 128, K / 128, 512]`
    in tcgen05's scale-factor layout; with `transposed`, those of `src`
    transposed (blocks of 32 along N), `[E, K / 128, N / 128, 512]`.

    The FP8 layers' weights (`precision = "fp8"`: gate, up and down),
    quantized inside the kernel at every call. convert-mk-to-gpu gives each
    block to one warp of a kernel of whole warps: an amax pass over the
    block, then the quantizing pass (transposed: a lane a column of the
    block, 16 consecutive values of its output row at a time).

    ```mlir
    mk.quantize_weights %gate into %gate_q, %gate_scales
        : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1xf32>
    mk.quantize_weights %down into %down_t, %down_t_scales transposed
        : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2xf32>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[BF16], [3]>, "", [MemRead]>:$src,
                       Arg<MemRefRankOf<[F8E4M3FN], [3]>, "", [MemWrite]>:$values,
                       Arg<AnyTypeOf<[MemRefRankOf<[F32], [3]>, MK_MxScales]>, "",
                           [MemWrite]>:$scales,
                       UnitAttr:$transposed);
  let assemblyFormat = [{
    $src `into` $values `,` $scales (`transposed` $transposed^)? attr-dict
    `:` type($src) `->` type($values) `,` type($scales)
  }];
  let extraClassDeclaration = [{
    /// E8M0 scales: the MX rule, blocks of 32 along a row.
    bool isMx() {
      return mlir::isa<mlir::Float8E8M0FNUType>(
          mlir::cast<mlir::MemRefType>(getScales().getType()).getElementType());
    }
  }];
  let hasVerifier = 1;
}

def MK_GemmOp : MK_Op<"gemm", [AttrSizedOperandSegments]> {
  let summary = "A (grouped) GEMM over output tiles, with its epilogue";
  let description = [{
    `acc_j[r, c] = sum_k a[r, k] * b_j[c, k]` in fp32 for each of the one
    (`store`) or two (`swiglu`) B operands, then the epilogue per element:
    `store` writes `bf16(acc_0)`; `swiglu` writes
    `bf16(swiglu(bf16(acc_0), bf16(acc_1)))`, clamped by `swiglu_limit` when
    present (the rounding points of `moe.layer`).

    *Grouped* (`grouped(%row_expert, %offsets)`): the B operands are
    `[E, N, K]`, the rows computed are `r < offsets[E]`, and row `r` uses
    expert `row_expert[r]`'s matrix. Otherwise B is `[N, K]` and every row of
    `a` is computed.

    How is the `schedule` (`#mk.gemm_schedule`), printed after the
    keyword `schedule`; its engine:
    * `simt`: grid-stride over output elements, fp32 FMAs in k order;
    * `wgmma` (sm_90a) and `tcgen05` (sm_100a): a persistent loop over
      the schedule's `tile = [M, N, K]` output tiles (m-tiles of one expert each: grouped
      segments are multiples of M), assigned to CTAs round-robin in groups of
      16 m-tiles (n-tiles outer) and computed by each CTA's first M / 64
      warpgroups (one 64-row half each); TMA loads k-tiles into a ring of
      the schedule's `stages` shared-memory stages completed by mbarriers; accumulators in
      registers (wgmma) or Tensor Memory (tcgen05). The operands are read
      through the CUtensorMaps in `%tensor_maps`: `maps` gives the slot of
      `a` and the first slot of each B operand (grouped: one slot per
      expert, expert `e` at first + e).

    *Gathered A* (`gather(%row_route)`, `wgmma` only; with a producer, the
    kernel's first tensor-core GEMM only): row
    `r` of the A operand is row `row_route[r] / gather_top_k` of `a` (the
    layer's `x`); a padding row (`row_route[r] < 0`) reads row 0, and its
    results are not to be read: the dispatch copy fused into the GEMM's
    loads. The consumer threads copy the rows with `cp.async` (16 bytes at
    a time, swizzled as TMA would); the map at `maps[0]` has one-row boxes
    and is only encoded (the runtime checks `a`'s alignment with it);
    `gather_rows` has out's rows.

    *Padding rows* (`padding(%row_route)`, grouped only): row `r` is a
    padding row when `row_route[r] < 0`, and its results are unspecified
    (a reader must discard them, as `mk.swiglu_grad` does by `row_route`). Padding rows end each grouped segment, so a tile
    half whose first row is padding is all padding: `wgmma` with the
    `store` epilogue, two consumer warpgroups, no producer and an even N
    (the register epilogue) skips that warpgroup's MMAs and stores.
    Otherwise padding rows are computed like any other. `padding_rows` has
    out's rows.

    Register epilogue (`wgmma`, even N): each warp stages 16 rows x 64
    columns of its results at a time in shared memory after the stage ring
    (16 KiB in all, which the kernel's dynamic shared memory must include)
    and stores whole 16-byte row pieces when `out` is 16-byte aligned and
    N a multiple of 8, else column pairs.

    Warp roles (`wgmma` only): with the schedule's `producer`, one thread of an extra
    warpgroup after the consumer warpgroups issues every TMA load, running
    ahead across k-tiles and tasks; the consumers hand each stage back
    through a per-stage "empty" mbarrier and store their results from
    registers, so the next task's loads overlap their epilogue. The CTA then
    has M / 64 + 1 warpgroups. Its `registers = [consumer, producer]` moves
    registers between the roles for the phase (`setmaxnreg`): each consumer
    thread gets `consumer` registers, each producer-warpgroup thread
    `producer`; the kernel is compiled for the even share and gets it back
    after the phase. With its `multicast`, the CTA pairs of a 2-CTA
    cluster share each weight box (the kernel's `mok.kernel` says
    `cluster = 2`).

    The training forms (every engine; `wgmma` without warp roles or
    clusters; a gathered A only with `transpose_b` alone):
    * `transpose_a`: `a` is `[K, M]` (M contiguous), `a(r, k) = a[k, r]`;
    * `transpose_b`: each B is `[K, N]` (`[E, K, N]` grouped),
      `b(c, k) = b[k, c]`;
    * `concat(%a2)` (`store`, two B operands): one accumulator over both
      K-loops, `acc = a b_0 + a2 b_1` (`a2` has `a`'s type);
    * `k_groups(%offsets)` (with both transposes, not grouped): the K
      range is split by `offsets [E + 1]` and `out [E, M, N]` gets one
      product per group, `out[e] = sum_{k in [offsets[e], offsets[e+1])}
      a(., k) b(., k)`, each sum in k order (weight gradients; K runs over
      an expert's routed rows). On the tensor-core engines every offset
      must be a multiple of 64 (whole k-tiles: the plan's padding is) and
      out's M a multiple of the tile's M;
    * `k_counts(%counts)` (with `k_groups`; `counts [E]`, each at most its
      group's size): group e's rows from `offsets[e] + counts[e]` on are
      padding, zero in `a` and finite in every B (the plan's padding rows
      are zero in both), so they add nothing: the engines skip them
      (`simt` sums `[offsets[e], offsets[e] + counts[e])`, the tensor
      cores stop after the k-tile that holds the last counted row);
    * an `f32` out (`store`): the fp32 accumulators, unrounded;
    * `accumulate` (an `f32` out): `out += acc`, in fp32, once per element
      by the one task that computes it (weight gradients into
      Megatron-Core's fp32 `main_grad`): `simt` reads, adds and writes
      back; the tensor-core engines add by reductions in L2
      (`red.global.add.f32`, in pairs on `wgmma`), the same sums but that
      they flush subnormals to zero.
    `saves(%gate, %up)` (`swiglu`): also stores `bf16(acc_0)` and
    `bf16(acc_1)`, the activation's inputs (the backward context).
    `tokens(%t)` (not grouped, not `k_groups`): `a`'s token rows are the
    first `t` (the rows computed and stored, or with `transpose_a` the K
    rows summed); the tensor maps of the buffers with token rows must have
    `t` rows, so that TMA reads the rows past them as zeros.

    *FP8* (`f8E4M3FN` operands, `precision = "fp8"` layers): `a`, `a2` and
    every B are E4M3 together, K-major (no `transpose_a`, `transpose_b` or
    gathered A), with K and N multiples of 128, and
    `scales(%sa[, %sa2], %sb_0[, %sb_1])` gives their f32 block scales in
    that order: `sa [K/128, S]` (`S >= a's rows`, a multiple of 4;
    `mk.quantize_rows`' layout) with `a(r, k) = f32(a[r, k]) * sa[k/128,
    r]`, and each B's `[E, N/128, K/128]` (`[N/128, K/128]` not grouped)
    with `b(c, k) = f32(b[e, c, k]) * sb[e, c/128, k/128]`: 1 x 128
    activation blocks and 128 x 128 weight blocks. With `k_groups` (a weight
    gradient: A `[M, K]` and B `[N, K]`, K the routed rows, as
    `mk.quantize_columns` writes them) both operands' blocks run along K:
    B's scales are `[K/128, S]` (`S >= N`) with `b(c, k) = f32(b[c, k]) *
    sb[k/128, c]`; each group's K range must start on a block (offsets
    multiples of 128: the FP8 layers' padding). Each dequantized value is an f32 product, then the GEMM
    above. `simt` sums the products in k order; `wgmma` (sm_90a) sums each
    128-K block's E4M3 products on the tensor cores and adds the block's
    sums to fp32 accumulators times the two scales, so its results differ
    from `simt`'s in the last bits.

    *MXFP8* (E8M0 scales, `precision = "mxfp8"` layers): the same operands
    with blocks of 32 along K, every operand's scales in tcgen05's
    scale-factor layout: `sa [M' / 128, K / 128, 512]` with `a(r, k) =
    f32(a[r, k]) * 2^(sa[r / 128, k / 128, (r % 32) * 16 + (r % 128) / 32 *
    4 + (k % 128) / 32] - 127)`, and each B's `[E, N / 128, K / 128, 512]`
    (`[N / 128, K / 128, 512]` not grouped) likewise by column; with
    `k_groups` (A `[M, K]`, B `[N, K]`, K the routed rows) each operand's
    atoms are `[rows / 128, K / 128, 512]`, and `concat`'s `a2` has `a`'s
    layout. `simt` sums the products in k order; `tcgen05` (sm_100a) runs
    `tcgen05.mma.kind::mxf8f6f4.block_scale` on the E4M3 tiles with the
    scales copied to Tensor Memory, tiles of 128 rows.

    ```mlir
    mk.gemm store %hidden, %down into %routed_y
        grouped(%row_expert, %offsets : memref<108xi64>, memref<5xi64>)
        schedule <simt>
        : memref<108x32xbf16>, memref<4x64x32xbf16> -> memref<108x64xbf16>
    mk.gemm store %d_y, %hidden into %d_down
        k_groups(%offsets : memref<5xi64>) k_counts(%counts : memref<4xi64>)
        schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    ```
  }];
  let arguments = (ins
      MK_Epilogue:$epilogue,
      Arg<MK_GemmMatrix, "", [MemRead]>:$a,
      Arg<Variadic<MemRefOf<[BF16, F8E4M3FN]>>, "", [MemRead]>:$b,
      Arg<MemRefOf<[BF16, F32]>, "read only with accumulate",
          [MemRead, MemWrite]>:$out,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$row_expert,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$offsets,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$tensor_maps,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$gather_rows,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$padding_rows,
      Arg<Optional<MK_GemmMatrix>, "", [MemRead]>:$a2,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$k_offsets,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$k_counts,
      Arg<Variadic<MK_Bf16Matrix>, "", [MemWrite]>:$saves,
      Arg<Variadic<AnyTypeOf<[MemRefRankOf<[F32], [2, 3]>, MK_MxScales]>>, "",
          [MemRead]>:$scales,
      Optional<Index>:$tokens,
      MK_GemmScheduleAttr:$schedule,
      OptionalAttr<F32Attr>:$swiglu_limit,
      OptionalAttr<DenseI64ArrayAttr>:$maps,
      OptionalAttr<ConfinedAttr<I64Attr, [IntPositive]>>:$gather_top_k,
      UnitAttr:$transpose_a,
      UnitAttr:$transpose_b,
      UnitAttr:$accumulate);
  let assemblyFormat = [{
    $epilogue $a `,` $b `into` $out
    (`grouped` `(` $row_expert^ `,` $offsets `:` type($row_expert) `,`
                   type($offsets) `)`)?
    (`maps` `(` $tensor_maps^ `:` type($tensor_maps) `)`)?
    (`gather` `(` $gather_rows^ `:` type($gather_rows) `)`)?
    (`padding` `(` $padding_rows^ `:` type($padding_rows) `)`)?
    (`concat` `(` $a2^ `:` type($a2) `)`)?
    (`k_groups` `(` $k_offsets^ `:` type($k_offsets) `)`)?
    (`k_counts` `(` $k_counts^ `:` type($k_counts) `)`)?
    (`saves` `(` $saves^ `:` type($saves) `)`)?
    (`scales` `(` $scales^ `:` type($scales) `)`)?
    (`tokens` `(` $tokens^ `)`)?
    `schedule` $schedule
    attr-dict `:` type($a) `,` type($b) `->` type($out)
  }];
  let extraClassDeclaration = [{
    bool isGrouped() { return getRowExpert() != nullptr; }
    /// The FP8 form's checks (a's rows m, K, N), part of the verifier.
    mlir::LogicalResult verifyFp8(int64_t m, int64_t k, int64_t n);
    /// FP8 E4M3 operands with block scales.
    bool isFp8() {
      return mlir::isa<mlir::Float8E4M3FNType>(
          mlir::cast<mlir::MemRefType>(getA().getType()).getElementType());
    }
    /// MXFP8: FP8 operands with E8M0 block scales (blocks of 32 along K).
    bool isMx() {
      return isFp8() && !getScales().empty() &&
             mlir::isa<mlir::Float8E8M0FNUType>(
                 mlir::cast<mlir::MemRefType>(getScales()[0].getType())
                     .getElementType());
    }

    Engine getEngine() { return getSchedule().getEngine(); }
    bool usesTensorCores() { return getSchedule().usesTensorCores(); }
  }];
  let hasVerifier = 1;
}

def MK_SwigluGradOp : MK_Op<"swiglu_grad", [AttrSizedOperandSegments]> {
  let summary = "SwiGLU backward per row, and the router-weight gradient";
  let description = [{
    The backward of the SwiGLU activation for rows `r` of `d_hidden_u`
    (`[R, I]`, fp32: `d_out W_d`, not yet scaled by the router weight):
    `dh = bf16(w * d_hidden_u[r])`, then `d_gate[r]`, `d_up[r]` (bf16) as
    `moe.layer_grad` defines them from `gate[r]`, `up[r]` and the clamp
    `swiglu_limit`.

    *Routed* (`routes(%row_route, %route_row, %router_weights, %offsets)
    -> %d_router_weights`): the rows are `r < offsets[E]`; row `r` holds
    route `q = row_route[r]` (token `q / k`, slot `q % k`) with weight
    `w = router_weights[q / k, q % k]`, and `d_router_weights` gets
    `<d_hidden_u[r], hidden[r]>` (fp32, a fixed summation order) at that
    route. Padding rows (`q < 0`) get zeros in `d_gate` and `d_up`; routes
    without a row (`route_row[q] < 0`) get a zero gradient. Otherwise
    (the shared expert) `w = 1` on every row of `d_hidden_u`, and `hidden`
    is not read (pass any buffer of its shape).

    One warp a row; lanes stride over the columns and the row sum is a
    fixed shuffle tree, so results are bitwise reproducible. `tokens(%t)`:
    routed, the routes are `q < t * k`; shared, the rows are `r < t`.

    ```mlir
    mk.swiglu_grad %dh_u, %gate, %up, %hidden into %d_gate, %d_up
        routes(%row_route, %route_row, %router_weights, %offsets
               : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>)
        -> %d_router_weights : memref<108x32xf32>, memref<108x32xbf16>,
        memref<108x32xbf16>, memref<108x32xbf16> -> memref<108x32xbf16>,
        memref<108x32xbf16>, memref<40x2xf32>
    ```
  }];
  let arguments = (ins
      Arg<MemRefRankOf<[F32], [2]>, "", [MemRead]>:$d_hidden_u,
      Arg<MK_Bf16Matrix, "", [MemRead]>:$gate,
      Arg<MK_Bf16Matrix, "", [MemRead]>:$up,
      Arg<MK_Bf16Matrix, "", [MemRead]>:$hidden,
      Arg<MK_Bf16Matrix, "", [MemWrite]>:$d_gate,
      Arg<MK_Bf16Matrix, "", [MemWrite]>:$d_up,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$row_route,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$route_row,
      Arg<Optional<MemRefRankOf<[F32], [2]>>, "", [MemRead]>:$router_weights,
      Arg<Optional<MK_I64Vector>, "", [MemRead]>:$offsets,
      Arg<Optional<MemRefRankOf<[F32], [2]>>, "", [MemWrite]>:$d_router_weights,
      Optional<Index>:$tokens,
      OptionalAttr<F32Attr>:$swiglu_limit);
  let assemblyFormat = [{
    $d_hidden_u `,` $gate `,` $up `,` $hidden `into` $d_gate `,` $d_up
    (`routes` `(` $row_route^ `,` $route_row `,` $router_weights `,` $offsets
       `:` type($row_route) `,` type($route_row) `,` type($router_weights)
       `,` type($offsets) `)` `->` $d_router_weights)?
    (`tokens` `(` $tokens^ `)`)? attr-dict `:` type($d_hidden_u) `,` type($gate) `,` type($up) `,`
    type($hidden) `->` type($d_gate) `,` type($d_up)
    (`,` type($d_router_weights)^)?
  }];
  let hasVerifier = 1;
}

def MK_CombineOp : MK_Op<"combine", [AttrSizedOperandSegments]> {
  let summary = "Router-weighted sum of each token's routed rows";
  let description = [{
    `out[t] = bf16(f32(shared_out[t]) + sum_k w[t,k] * f32(routed_y[route_row[t*K + k]]))`,
    skipping routes whose row is -1; without `shared` the sum starts at 0.
    Without `weights` every `w` is 1 (the backward's reverse dispatch, `K`
    = route_row's size / out's rows). Grid-stride over output elements.
    `tokens(%t)`: the tokens are `t < %t`. `poison(%verdict)` (an
    expert-parallel kernel's capacity verdict, `mk.check_capacity`): when
    `verdict[0]` is set no row was exchanged, and every element is NaN
    instead, so that an output past the capacity cannot pass for one.

    ```mlir
    mk.combine %routed_y, %route_row weights(%router_weights : memref<40x2xf32>)
        shared(%shared_out : memref<40x64xbf16>) into %out
        : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    ```
  }];
  let arguments = (ins Arg<MK_Bf16Matrix, "", [MemRead]>:$routed_y,
                       Arg<MK_I64Vector, "", [MemRead]>:$route_row,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "", [MemRead]>:$router_weights,
                       Arg<Optional<MK_Bf16Matrix>, "", [MemRead]>:$shared_out,
                       Arg<MK_Bf16Matrix, "", [MemWrite]>:$out,
                       Optional<Index>:$tokens,
                       Arg<Optional<MK_I64Vector>, "", [MemRead]>:$poison);
  let assemblyFormat = [{
    $routed_y `,` $route_row (`weights` `(` $router_weights^ `:` type($router_weights) `)`)?
    (`shared` `(` $shared_out^ `:` type($shared_out) `)`)?
    `into` $out (`tokens` `(` $tokens^ `)`)?
    (`poison` `(` $poison^ `:` type($poison) `)`)? attr-dict `:` type($routed_y) `,`
    type($route_row) `->` type($out)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Expert parallelism: the exchange between the ranks of a group
//===----------------------------------------------------------------------===//

def MK_Peers : MemRefRankOf<[I64], [1]>;
def MK_Flags : MemRefRankOf<[I64], [2]>;

def MK_RouteRanksOp : MK_Op<"route_ranks"> {
  let summary = "Which ranks each token sends to, and each route's own row";
  let description = [{
    The send side of an expert-parallel layer (`ep` ranks, `experts / ep`
    local experts a rank, rank `d` owning experts
    `[d * experts / ep, (d + 1) * experts / ep)`). For token `t` of
    `top_experts [T, k]`: `ranks[t, d] = d` when any of its routes goes to an
    expert of rank `d`, else `-1` (`ranks [T, ep]`, i32): the "routes" of a
    plan over ranks, which `mk.count_routes` ... `mk.assign_rows` with
    `experts = ep` and `padding = 1` turn into the list of rows to send, each
    (token, rank) pair once. And `route_row[q] = q` for every valid route
    `q` (token `q / k`, slot `q % k`), `-1` for the others: the row of the
    return buffer where that route's result comes back, which
    `mk.combine` reads. Ids that are neither `-1` nor an expert are no
    route (`mk.check_routes` reports them). One thread a token,
    grid-stride; with `tokens(%t)`, the tokens are `t < %t`.

    ```mlir
    mk.route_ranks %top into %ranks, %route_row {experts = 16 : i64, ep = 4 : i64}
        : memref<40x2xi32>, memref<40x4xi32>, memref<80xi64>
    ```
  }];
  let arguments = (ins Arg<MK_Ids, "", [MemRead]>:$top_experts,
                       Arg<MemRefRankOf<[I32], [2]>, "", [MemWrite]>:$ranks,
                       Arg<MK_I64Vector, "", [MemWrite]>:$route_row,
                       Optional<Index>:$tokens,
                       ConfinedAttr<I64Attr, [IntPositive]>:$experts,
                       ConfinedAttr<I64Attr, [IntPositive]>:$ep);
  let assemblyFormat = [{
    $top_experts `into` $ranks `,` $route_row (`tokens` `(` $tokens^ `)`)?
    attr-dict `:` type($top_experts) `,` type($ranks) `,` type($route_row)
  }];
  let hasVerifier = 1;
}

def MK_PutCountsOp : MK_Op<"put_counts"> {
  let summary = "Stores this rank's send counts into every rank's matrix";
  let description = [{
    Step 2 of the exchange (`docs/ExpertParallel.md`): rank `s` (`rank`)
    stores its row of the group's count matrix into every rank's copy of
    `matrix [ep, 2 * ep]` (i64, a region of the kernel's symmetric buffer):
    `matrix[s, d] = rows[d]`, the token rows `s` sends rank `d` (the counts
    of the plan over ranks), and `matrix[s, ep + d]` the routes they carry
    (the sum of `routes [experts]`, the per-expert route counts, over rank
    `d`'s experts). Rank `d`'s copy is at the region's offset in `d`'s
    symmetric buffer, whose address is `peers[d]`. Thread `d` of the grid's
    first CTA writes rank `d`'s copy; an `mk.signal` publishes it.

    ```mlir
    mk.put_counts %rows, %routes into %matrix peers(%peers : memref<4xi64>) rank(%rank)
        : memref<4xi64>, memref<16xi64>, memref<4x8xi64>
    ```
  }];
  let arguments = (ins Arg<MK_I64Vector, "", [MemRead]>:$rows,
                       Arg<MK_I64Vector, "", [MemRead]>:$routes,
                       Arg<MemRefRankOf<[I64], [2]>, "the peers' copies",
                           [MemWrite]>:$matrix,
                       Arg<MK_Peers, "", [MemRead]>:$peers,
                       I32:$rank);
  let assemblyFormat = [{
    $rows `,` $routes `into` $matrix `peers` `(` $peers `:` type($peers) `)`
    `rank` `(` $rank `)` attr-dict `:` type($rows) `,` type($routes) `,`
    type($matrix)
  }];
  let hasVerifier = 1;
}

def MK_SignalOp : MK_Op<"signal"> {
  let summary = "Tells every rank that this rank's stores to it are done";
  let description = [{
    After a CTA barrier, the grid's first thread makes everything the grid
    stored before it visible to the whole system (`fence.acq_rel.sys`) and
    stores `epoch` into `flags[index, rank]` of every rank's copy of
    `flags [n, ep]` (a region of the symmetric buffer; `st.release.sys`).
    What other CTAs stored is covered when an `mk.grid_barrier` separates
    their stores from the signal (`convert-mk-to-gpu` checks that one
    does after `mk.send_rows` and `mk.return_rows`). `epoch` is the
    launch's, new at every launch of the layer on every rank, so a flag
    still holding the last launch's epoch is not taken for this one's.

    ```mlir
    mk.signal %flags[1] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    ```
  }];
  let arguments = (ins Arg<MK_Flags, "the peers' copies", [MemWrite]>:$flags,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$index,
                       Arg<MK_Peers, "", [MemRead]>:$peers,
                       I32:$rank,
                       I64:$epoch);
  let assemblyFormat = [{
    $flags `[` $index `]` `peers` `(` $peers `:` type($peers) `)`
    `rank` `(` $rank `)` `epoch` `(` $epoch `)` attr-dict `:` type($flags)
  }];
  let hasVerifier = 1;
}

def MK_WaitOp : MK_Op<"wait"> {
  let summary = "Waits until every rank has signalled this rank";
  let description = [{
    The first thread of every CTA waits until `flags[index, s]` of this
    rank's `flags [n, ep]` holds `epoch` for every rank `s`
    (`ld.acquire.sys`), then a CTA barrier: everything each rank stored
    into this rank's symmetric buffer before its `mk.signal` of the same
    row is visible to every thread after the wait. Like a grid barrier for
    those stores: `convert-mk-to-gpu`'s barrier-interval check forgets
    `mk.put_counts`' and the signals' writes here. All ranks' kernels must
    be running.

    With `status` (the kernel's report) and `timeout_ns`, the wait is
    bounded, as `mk.grid_barrier`'s (a debugging mode): a CTA that has
    waited `timeout_ns` for a rank's flag records the wait in `status`
    (`status[3]` = `report` + 1, `status[4]` the rank whose flag did not
    come, `status[5]` the flags' row, `status[6]` the CTA, `status[7]` = 1:
    an exchange's wait) and goes on, and so does every CTA waiting at a
    bounded wait or barrier once `status[3]` is set; the kernel then ends
    with results that are not defined. `report` numbers the kernel's
    bounded waits and barriers together, in schedule order.

    ```mlir
    mk.wait %flags[1] epoch(%epoch) : memref<3x4xi64>
    mk.wait %flags[1] epoch(%epoch) status(%st : memref<8xi32>) {report = 7 : i64, timeout_ns = 1000000000 : i64} : memref<3x4xi64>
    ```
  }];
  let arguments = (ins Arg<MK_Flags, "", [MemRead]>:$flags,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$index,
                       I64:$epoch,
                       Arg<Optional<MK_Status>, "", [MemRead, MemWrite]>:$status,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntPositive]>>:$timeout_ns,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$report);
  let assemblyFormat = [{
    $flags `[` $index `]` `epoch` `(` $epoch `)`
    (`status` `(` $status^ `:` type($status) `)`)? attr-dict `:` type($flags)
  }];
  let hasVerifier = 1;
}

def MK_CheckCapacityOp : MK_Op<"check_capacity"> {
  let summary = "Whether some rank's experts would receive too many routes";
  let description = [{
    After the counts' `mk.wait`, the grid's first thread: when the routes
    sent to some rank `d`, the sum of column `ep + d` of `matrix [ep, 2 *
    ep]`, exceed `capacity` (the plan's receive capacity), it records the
    first such `d` in `status` (the kernel's report: `status[0] = 2`,
    `status[1] = d`, `status[2]` its routes, saturated to 2^31 - 1) and
    sets `verdict[0] = 1`; else `verdict[0] = 0`. Every rank sees the same
    matrix, so every rank comes to the same verdict: with 1, no rank sends
    or returns a row (`mk.send_rows`, `mk.received_rows`) and every rank
    reports the overflow.

    ```mlir
    mk.check_capacity %matrix into %status, %verdict {capacity = 160 : i64}
        : memref<4x8xi64>, memref<8xi32>, memref<1xi64>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[I64], [2]>, "", [MemRead]>:$matrix,
                       Arg<MK_Status, "", [MemWrite]>:$status,
                       Arg<MK_I64Vector, "", [MemWrite]>:$verdict,
                       ConfinedAttr<I64Attr, [IntPositive]>:$capacity);
  let assemblyFormat = [{
    $matrix `into` $status `,` $verdict attr-dict `:` type($matrix) `,`
    type($status) `,` type($verdict)
  }];
  let hasVerifier = 1;
}

def MK_ReceivedRowsOp : MK_Op<"received_rows"> {
  let summary = "The token rows this rank receives";
  let description = [{
    After the counts' `mk.wait` and the `mk.check_capacity` that wrote
    `verdict`: the rows every rank sends this rank, the sum of column
    `rank` of `matrix [ep, 2 * ep]`, or 0 when `verdict[0]` is 1 (some
    rank's routes exceed the capacity): the received rows' count, the
    `tokens` of the plan over them. Every thread reads it.

    ```mlir
    %n = mk.received_rows %matrix, %verdict rank(%rank) : memref<4x8xi64>, memref<1xi64>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[I64], [2]>, "", [MemRead]>:$matrix,
                       Arg<MK_I64Vector, "", [MemRead]>:$verdict,
                       I32:$rank);
  let results = (outs Index:$rows);
  let assemblyFormat = [{
    $matrix `,` $verdict `rank` `(` $rank `)` attr-dict `:` type($matrix) `,`
    type($verdict)
  }];
  let hasVerifier = 1;
}

def MK_SendRowsOp : MK_Op<"send_rows", [AttrSizedOperandSegments]> {
  let summary = "Dispatch: each token's row once to each rank it routes to";
  let description = [{
    Step 3 of the exchange. The rows to send are the plan over ranks':
    send row `r < offsets[ep]` is the pair `q = send_route[r]` (token
    `t = q / ep`, destination `d = q % ep`), the `(r - offsets[d])`-th of
    the rows to `d` in token order. It lands in row
    `sum_{s < rank} matrix[s, d] + r - offsets[d]` of `d`'s receive
    buffers (this rank's rows follow the lower ranks'): `recv_x[row] =
    x[t]`, `recv_origin[row] = rank << 32 | t`, and
    `recv_experts[row, j]` the local id of route `j` (`e - d * L`) when it
    goes to `d` (rank `d` owns experts `[d * L, (d + 1) * L)`, `L` =
    `local_experts`), else -1. When `verdict[0]` is 1 (`mk.check_capacity`:
    some rank's routes exceed the capacity), nothing is sent. Grid-stride over 16-byte pieces of the rows. The stores are not
    waited for: an `mk.fence_peers` makes them visible, after whatever
    runs while they drain, before the grid barrier that precedes the
    `mk.signal`. With `tokens(%t)`,
    x has `%t` rows.

    *With weights* (`weights(%router_weights into %recv_weights)`, the
    backward's dispatch of `d_out`): also `recv_weights[row, j]` (f32,
    `[C, k]`), the router weight of route `j` when it goes to `d`, else 0.

    ```mlir
    mk.send_rows %x, %top, %send_route, %send_offsets, %matrix, %verdict
        into %recv_x, %recv_origin, %recv_experts peers(%peers : memref<4xi64>)
        rank(%rank) {local_experts = 4 : i64}
        : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>,
          memref<4x8xi64>, memref<1xi64>
          -> memref<160x64xbf16>, memref<160xi64>, memref<160x2xi32>
    ```
  }];
  let arguments = (ins Arg<MK_Bf16Matrix, "", [MemRead]>:$x,
                       Arg<MK_Ids, "", [MemRead]>:$top_experts,
                       Arg<MK_I64Vector, "", [MemRead]>:$send_route,
                       Arg<MK_I64Vector, "", [MemRead]>:$send_offsets,
                       Arg<MemRefRankOf<[I64], [2]>, "", [MemRead]>:$matrix,
                       Arg<MK_I64Vector, "", [MemRead]>:$verdict,
                       Arg<MK_Bf16Matrix, "the peers' copies", [MemWrite]>:$recv_x,
                       Arg<MK_I64Vector, "the peers' copies", [MemWrite]>:$recv_origin,
                       Arg<MemRefRankOf<[I32], [2]>, "the peers' copies",
                           [MemWrite]>:$recv_experts,
                       Arg<MK_Peers, "", [MemRead]>:$peers,
                       I32:$rank,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "",
                           [MemRead]>:$router_weights,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "the peers' copies",
                           [MemWrite]>:$recv_weights,
                       Optional<Index>:$tokens,
                       ConfinedAttr<I64Attr, [IntPositive]>:$local_experts);
  let assemblyFormat = [{
    $x `,` $top_experts `,` $send_route `,` $send_offsets `,` $matrix `,`
    $verdict `into`
    $recv_x `,` $recv_origin `,` $recv_experts
    (`weights` `(` $router_weights^ `into` $recv_weights `:`
       type($router_weights) `,` type($recv_weights) `)`)?
    `peers` `(` $peers `:` type($peers) `)` `rank` `(` $rank `)`
    (`tokens` `(` $tokens^ `)`)? attr-dict `:` type($x) `,` type($top_experts)
    `,` type($send_route) `,` type($send_offsets) `,` type($matrix) `,`
    type($verdict) `->`
    type($recv_x) `,` type($recv_origin) `,` type($recv_experts)
  }];
  let hasVerifier = 1;
}

def MK_ReturnRowsOp : MK_Op<"return_rows", [AttrSizedOperandSegments]> {
  let summary = "Return: each routed row's result to its source rank";
  let description = [{
    Step 5 of the exchange. For every routed row `r < offsets[L]` of the
    plan over the received rows with route `q = row_route[r] >= 0`
    (received row `i = q / top_k`, slot `j = q % top_k`) and origin
    `o = recv_origin[i]` (source `s = o >> 32`, token `t = o & (2^32 - 1)`):
    row `t * top_k + j` of `s`'s copy of `ret [T * top_k, H]` becomes
    `routed_y[r]`. Padding rows go nowhere. Grid-stride over 16-byte pieces;
    an `mk.fence_peers` makes the stores visible before the grid barrier
    that precedes the `mk.signal`.

    *With scalars* (`scalars(%values into %ret_values)`, the backward's
    router-weight gradients): also `ret_values[t * top_k + j]` of the
    source becomes `values[i, j]` (f32; `values [C, top_k]` per received
    route, `ret_values [T * top_k]`).

    ```mlir
    mk.return_rows %routed_y, %row_route, %offsets, %recv_origin into %ret
        peers(%peers : memref<4xi64>) {top_k = 2 : i64}
        : memref<172x64xbf16>, memref<172xi64>, memref<5xi64>, memref<160xi64>
          -> memref<80x64xbf16>
    ```
  }];
  let arguments = (ins Arg<MK_Bf16Matrix, "", [MemRead]>:$routed_y,
                       Arg<MK_I64Vector, "", [MemRead]>:$row_route,
                       Arg<MK_I64Vector, "", [MemRead]>:$offsets,
                       Arg<MK_I64Vector, "", [MemRead]>:$recv_origin,
                       Arg<MK_Bf16Matrix, "the peers' copies", [MemWrite]>:$ret,
                       Arg<MK_Peers, "", [MemRead]>:$peers,
                       Arg<Optional<MemRefRankOf<[F32], [2]>>, "",
                           [MemRead]>:$values,
                       Arg<Optional<MemRefRankOf<[F32], [1]>>, "the peers' copies",
                           [MemWrite]>:$ret_values,
                       ConfinedAttr<I64Attr, [IntPositive]>:$top_k);
  let assemblyFormat = [{
    $routed_y `,` $row_route `,` $offsets `,` $recv_origin `into` $ret
    (`scalars` `(` $values^ `into` $ret_values `:` type($values) `,`
       type($ret_values) `)`)?
    `peers` `(` $peers `:` type($peers) `)` attr-dict `:` type($routed_y) `,`
    type($row_route) `,` type($offsets) `,` type($recv_origin) `->` type($ret)
  }];
  let hasVerifier = 1;
}

def MK_FencePeersOp : MK_Op<"fence_peers", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "Every thread's stores to peers, visible to the system";
  let description = [{
    Every thread fences at system scope (`fence.acq_rel.sys`): the stores
    it made into the peers' symmetric buffers (`mk.send_rows`,
    `mk.return_rows`) are then ordered before what it does next, the grid
    barrier and the `mk.signal` that publish them. Placed after other work
    (a GEMM), it lets the stores drain while that work runs;
    `convert-mk-to-gpu` checks that one follows every such store before
    its signal.

    ```mlir
    mk.fence_peers
    ```
  }];
  let assemblyFormat = "attr-dict";
}

def MK_CountLaunchOp : MK_Op<"count_launch"> {
  let summary = "Counts this launch: the launch count plus one";
  let description = [{
    The grid's first thread adds 1 to `launches[0]`: `launches [1]` (a
    region of the symmetric buffer that only this rank writes, zeroed with
    the buffer) counts the kernel's launches, and the count after this one
    is this launch's epoch (`mk.launch_epoch` reads it after a grid
    barrier). Every rank launches every step, so the ranks' epochs agree,
    and a replayed CUDA graph counts on the device as a launch does.

    ```mlir
    mk.count_launch %launches : memref<1xi64>
    ```
  }];
  let arguments = (ins Arg<MK_I64Vector, "", [MemRead, MemWrite]>:$launches);
  let assemblyFormat = "$launches attr-dict `:` type($launches)";
  let hasVerifier = 1;
}

def MK_LaunchEpochOp : MK_Op<"launch_epoch"> {
  let summary = "This launch's epoch, read where it is used";
  let description = [{
    `launches[0]`, after the grid barrier that follows `mk.count_launch`:
    this launch's epoch, for an `mk.signal` or `mk.wait` next to it (read at
    each, so that no register holds it across the kernel).

    ```mlir
    %epoch = mk.launch_epoch %launches : memref<1xi64>
    ```
  }];
  let arguments = (ins Arg<MK_I64Vector, "", [MemRead]>:$launches);
  let results = (outs I64:$epoch);
  let assemblyFormat = "$launches attr-dict `:` type($launches)";
  let hasVerifier = 1;
}

def MK_TakeRoutesOp : MK_Op<"take_routes", [AttrSizedOperandSegments]> {
  let summary = "Each route's value from its row, or 0";
  let description = [{
    `out[t, j] = values[route_row[t * k + j]]` when that row is `>= 0`,
    else 0 (f32; `out [T, k]`, `route_row [T * k]`): the backward's router
    weights' gradients, returned a value a route. Grid-stride over the
    routes; with `tokens(%t)`, the tokens are `t < %t`; `poison(%verdict)`
    as `mk.combine`'s (NaN everywhere when `verdict[0]` is set).

    ```mlir
    mk.take_routes %ret_dw, %route_row into %d_router_weights
        : memref<80xf32>, memref<80xi64> -> memref<40x2xf32>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[F32], [1]>, "", [MemRead]>:$values,
                       Arg<MK_I64Vector, "", [MemRead]>:$route_row,
                       Arg<MemRefRankOf<[F32], [2]>, "", [MemWrite]>:$out,
                       Optional<Index>:$tokens,
                       Arg<Optional<MK_I64Vector>, "", [MemRead]>:$poison);
  let assemblyFormat = [{
    $values `,` $route_row `into` $out (`tokens` `(` $tokens^ `)`)?
    (`poison` `(` $poison^ `:` type($poison) `)`)? attr-dict
    `:` type($values) `,` type($route_row) `->` type($out)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Synchronization
//===----------------------------------------------------------------------===//

def MK_GridBarrierOp : MK_Op<"grid_barrier"> {
  let summary = "Every thread of the grid waits for all the others";
  let description = [{
    A generation barrier over `state = [arrived CTAs, generation]` (zero
    before the first launch; left reusable): a CTA barrier, then thread 0 of
    each CTA arrives with release/acquire fences, the last arrival bumps the
    generation the others spin on, and a CTA barrier again. Everything any
    thread wrote before it is visible to every thread after it.

    With `status` (the kernel's report, 8 words) and `timeout_ns`, the wait
    is bounded (a debugging mode): a CTA that has waited `timeout_ns`
    nanoseconds (`%globaltimer`) without the generation moving records the
    barrier in `status` (`status[3]` = `index` + 1, `status[4]` the CTAs
    arrived, `status[5]` the grid's CTAs, `status[6]` the waiting CTA) and
    goes on; every CTA waiting at this or a later barrier goes on as soon
    as `status[3]` is set. The kernel then ends (its results are not
    defined) instead of hanging, and the runtime reports the barrier after
    the call and resets `state`.

    ```mlir
    mk.grid_barrier %bar : memref<2xi32>
    mk.grid_barrier %bar status(%st : memref<8xi32>) {index = 2 : i64, timeout_ns = 1000000000 : i64} : memref<2xi32>
    ```
  }];
  let arguments = (ins Arg<MemRefRankOf<[I32], [1]>, "",
                           [MemRead, MemWrite]>:$state,
                       Arg<Optional<MK_Status>, "", [MemRead, MemWrite]>:$status,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntPositive]>>:$timeout_ns,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$index);
  let assemblyFormat = [{
    $state (`status` `(` $status^ `:` type($status) `)`)? attr-dict `:`
    type($state)
  }];
  let hasVerifier = 1;
}

def MK_TimestampOp : MK_Op<"timestamp"> {
  let summary = "Thread 0 of the grid records the global timer";
  let description = [{
    Profiling: the first thread of the grid writes `%globaltimer`
    (nanoseconds) to `clock[index]`, and with `cycles(%c)` its SM's
    `%clock64` (SM clock cycles) to `c[index]`. After an `mk.grid_barrier`,
    that is about when the last CTA finished the phase before it; the
    runtime reads the buffers back (`mok_layer_read_workspace`). The
    cycles between two stamps are the phase's length in clock cycles, at
    whatever clock the board ran it (at its power cap the clock falls).

    ```mlir
    mk.timestamp %clock[3] : memref<12xi64>
    mk.timestamp %clock[3] cycles(%cycles : memref<12xi64>) : memref<12xi64>
    ```
  }];
  let arguments = (ins Arg<MK_I64Vector, "", [MemWrite]>:$clock,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$index,
                       Arg<Optional<MK_I64Vector>, "", [MemWrite]>:$cycles);
  let assemblyFormat = [{
    $clock `[` $index `]` (`cycles` `(` $cycles^ `:` type($cycles) `)`)?
    attr-dict `:` type($clock)
  }];
  let hasVerifier = 1;
}

#endif // MOK_DIALECT_MK_IR_MKOPS_TD
