// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk's plans, shared by the forward (Forward.cpp) and the
// backward (Backward.cpp): the layer's sizes, the kernel's parameters and
// tensor maps, its description for the runtime, and the builder of its
// schedule (buffers by name, barriers, the routing plan, GEMMs checked
// against the chip's lowering). Private to MoEToMK.
//
#ifndef MOK_LIB_CONVERSION_MOETOMK_KERNELPLAN_H
#define MOK_LIB_CONVERSION_MOETOMK_KERNELPLAN_H

#include "mok/Dialect/MK/IR/MKSchedule.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"

#include <string>

namespace mok::moe_to_mk {

namespace sched = mok::mk::schedule;

/// A size that grows with the call's token count T in a kernel compiled
/// for any T up to a capacity: `scale * T + offset` (scale 0: a static
/// size).
struct TokenSize {
  int64_t scale = 0, offset = 0;
  bool dynamic() const { return scale != 0; }
};

/// One kernel parameter: a buffer of static shape, passed as a bare pointer,
/// or (role "tokens") the call's token count, an i64 passed by value.
/// The bytes to which the runtime aligns every buffer a kernel writes
/// whole (outputs that are not added into, workspaces): the params'
/// `align` in the kernel description and the metadata.
inline constexpr int64_t kOutputAlignment = 16;

struct Param {
  std::string name;
  std::string role; // "input", "output", "workspace", "tensor_maps",
                    // "status" or "tokens"
  mlir::MemRefType type; // null for "tokens"
  /// Inputs only: "tensor_maps" when the kernel never dereferences the
  /// pointer (it reads the buffer through tensor maps), else "pointer".
  std::string access = "pointer";
  /// Outputs only: the kernel adds into the buffer (main_grad += dW), so
  /// the caller passes it with the values to add to.
  bool accumulate = false;
};

/// A 2-D bf16 view of a kernel buffer that the runtime encodes with
/// cuTensorMapEncodeTiled (SWIZZLE_128B, OOB zero fill). With experts > 1,
/// `experts` consecutive slots, slot e viewing expert e's [rows, cols].
struct TensorMapSpec {
  std::string buffer;
  int64_t rows, cols, rowStride, boxRows, boxCols, experts = 1;
};

/// Any T: the rows of the kernel buffer `name` at a call (its dimension 0;
/// the static shape has them at the capacity), by what they index: tokens,
/// routes or routed rows. Static for the others, and without anyTokens.
struct Sizes;
TokenSize callRowsOf(llvm::StringRef name, const Sizes &s);

/// The sizes of the layer, all static. `tokens` is T, or with `anyTokens`
/// the capacity (the kernel's buffers are sized for it, and the call's T,
/// 1 <= T <= tokens, is a kernel parameter).
struct Sizes {
  int64_t tokens, hidden, inter, experts, topK, padding, sharedInter = 0;
  bool anyTokens = false;
  /// The call's sizes of buffers with token rows (T), route rows (T * k)
  /// and routed rows (the routed capacity for T); static without anyTokens.
  TokenSize tokenRows() const { return anyTokens ? TokenSize{1, 0} : TokenSize{}; }
  TokenSize routeRows() const {
    return anyTokens ? TokenSize{topK, 0} : TokenSize{};
  }
  TokenSize routedRows() const {
    return anyTokens && !maxRoutes ? TokenSize{topK, experts * (padding - 1)}
                                   : TokenSize{};
  }
  /// Expert parallelism (ep > 1): the group size, and the receive
  /// capacity C (the most routes the rank's `experts` local experts
  /// receive), which bounds the routed rows instead of T * k; the
  /// received token rows are at most C too.
  int64_t ep = 1, maxRoutes = 0;
  /// The dispatch copy fused into the gate/up GEMM's A loads (no mk.gather,
  /// no routed_x): sm_90a tensor-core kernels with fuse-dispatch.
  bool fusedDispatch = false;
  /// precision = "fp8": the routed GEMMs read E4M3 operands with f32 block
  /// scales (1 x 128 activations, 128 x 128 weights), quantized in the
  /// kernel.
  bool fp8 = false;
  /// precision = "mxfp8" (with fp8): E8M0 block scales of 1 x 32 blocks
  /// along K, in tcgen05's scale-factor atoms (mk.quantize_rows); the
  /// routed rows are quantized after the dispatch.
  bool mx = false;
  /// FP8: the routed weights are the kernel's inputs, quantized (gate_q,
  /// gate_scale, ...), instead of bf16 ones it quantizes at every call.
  bool fp8WeightInputs = false;
  /// FP8 without the saved context (inference): x's T rows quantized and
  /// their E4M3 rows dispatched, instead of the routed bf16 rows (k times
  /// more) copied, then quantized.
  bool fp8GatherQuantized = false;
  /// The routed capacity rounded up to a multiple of 4: the width of the
  /// FP8 routed rows' block scales (16-byte rows).
  int64_t scaleWidth() const { return (routedCapacity() + 3) / 4 * 4; }
  int64_t routes() const { return maxRoutes ? maxRoutes : tokens * topK; }
  int64_t routedCapacity() const {
    return routes() + experts * (padding - 1);
  }
  /// The kernel buffer's type of a layer operand or result `v` (a ranked
  /// tensor): its memref, the token dimension at the capacity (any T).
  mlir::MemRefType bufferType(mlir::Value v) const {
    auto t = llvm::cast<mlir::RankedTensorType>(v.getType());
    llvm::SmallVector<int64_t> shape(t.getShape());
    for (int64_t &d : shape)
      if (mlir::ShapedType::isDynamic(d))
        d = tokens;
    return mlir::MemRefType::get(shape, t.getElementType());
  }
  /// Routes of a chunk of the routing plan: a warp's 32 routes a round
  /// (one thread walking them without whole warps), a multiple of 32, and few
  /// enough chunks (<= 1024) that the scan's lanes, one warp an expert,
  /// load all theirs at once (32 each). (On the H200, with the plan by
  /// warps: dsv3-shard's 1024 chunks scanned in 7 us, qwen3-30b's 2048 in
  /// 28 us; by threads, 64 and <= 1024, scanned by one thread an expert,
  /// took 65 us of planning on dsv3-shard and 114 us on qwen3-30b.)
  static int64_t chunkOf(int64_t routes) {
    int64_t chunk = std::max<int64_t>(32, (routes + 1023) / 1024);
    return (chunk + 31) / 32 * 32; // whole rounds of a warp
  }
  static int64_t chunksOf(int64_t routes) {
    return (routes + chunkOf(routes) - 1) / chunkOf(routes);
  }
  int64_t chunk() const { return chunkOf(tokens * topK); }
  int64_t chunks() const { return chunksOf(tokens * topK); }
  bool hasShared() const { return sharedInter > 0; }
  /// Why the kernel's buffers cannot be planned with these sizes (their
  /// element counts and byte sizes, and the routed capacity, must fit in
  /// int64_t), or "" when they can.
  std::string whyTooLarge() const;
  /// Whether the tensor-core GEMMs apply: K and N fit the tiles (H, the
  /// down GEMMs' N, may be a multiple of 64: the last n-tile's extra columns
  /// are computed and dropped), and every expert segment of the plan is a
  /// whole number of m-tiles. TMA coordinates are 32-bit.
  bool tensorCoreEligible() const {
    int64_t maxRows =
        std::max({routedCapacity(), inter, hidden, tokens, sharedInter});
    return hidden % sched::kTileK == 0 && inter % sched::kTileN == 0 &&
           (!hasShared() || sharedInter % sched::kTileN == 0) &&
           padding % sched::kTileM == 0 && maxRows < (int64_t(1) << 31);
  }
};

/// The columns of a routed gate/up tile for each of gate and up: FP8 tiles
/// are 128 columns in all (64 each), as a k-tile's partial sums take as
/// many registers again as the accumulators (sm_90a: 2 x 128 + 128 of
/// them spilled); mk::TargetSupport::whyNot says so too.
/// (MXFP8's tcgen05 tiles keep 128 an operand: the accumulators are in
/// Tensor Memory.)
inline int64_t gateUpTileN(const Sizes &s) {
  return s.fp8 && !s.mx ? sched::kTileN / 2 : sched::kTileN;
}

/// The tensor maps of a forward kernel (slots in `slots`): `tileM` the
/// rows of every tile (the A boxes); `storeTileN` the output columns of
/// the GEMMs with one B operand, whose B boxes have that many rows (128
/// with clusters of `cluster` = 2 CTAs); `sharedStoreTileN`, when not 0,
/// the shared expert's down projection's (bf16 in an FP8 layer).
struct MapSlots;
mlir::SmallVector<TensorMapSpec> forwardTensorMaps(const Sizes &s,
                                                   MapSlots &slots,
                                                   int64_t tileM,
                                                   int64_t storeTileN,
                                                   int64_t cluster,
                                                   int64_t sharedStoreTileN = 0);

/// The tiles of a forward kernel's tensor-core GEMMs, the largest the
/// chip's lowering implements for the layer (`saves`: the training
/// forward's; `producer`: with warp roles; `multicast`: in CTA pairs), and
/// the kernel's block.
struct ForwardTiles {
  int64_t tileM = sched::kTileM, storeTileN = sched::kTileN;
  /// The shared expert's down projection (bf16 also in an FP8 layer,
  /// whose routed tiles are narrower).
  int64_t sharedStoreTileN = sched::kTileN;
  unsigned block = 0;
};
ForwardTiles forwardTiles(mlir::MLIRContext *ctx, const Sizes &s,
                          const mk::TargetSupport &support, bool saves,
                          bool producer, bool multicast);

/// The slots of the tensor maps of a tensor-core kernel.
struct MapSlots {
  int64_t routedX, gate, up, hidden, down;                        // routed
  int64_t x = -1, sharedGate, sharedUp, sharedHidden, sharedDown; // shared
};

/// One mk.gemm of a schedule, forward or backward: simt, or with `maps`
/// (slots: a, each B, then a2) on `engine` with tile [tileM, tileN, 64].
struct GemmPlan {
  /// What it computes, for diagnostics ("routed gate/up", "down dgrad").
  mlir::StringRef role;
  mk::Epilogue epilogue = mk::Epilogue::store;
  mlir::Value a, a2, out, rowExpert, offsets, kOffsets, kCounts;
  /// wgmma: the row_route of a grouped GEMM's rows, so that a tile half of
  /// padding rows skips its MMAs (mk.gemm's `padding`).
  mlir::Value paddingRows;
  mlir::SmallVector<mlir::Value> b, saves;
  /// FP8 operands: the f32 block scales of a, a2 and each B, in order.
  mlir::SmallVector<mlir::Value> scales;
  bool transposeA = false, transposeB = false;
  mlir::FloatAttr limit;
  mlir::SmallVector<int64_t> maps;
  mlir::Value tensorMaps;
  mk::Engine engine = mk::Engine::wgmma; // with maps
  int64_t tileM = sched::kTileM, tileN = 2 * sched::kTileN;
  mlir::Value
      gatherRows; // a gathered A (wgmma): row r is a's row gatherRows[r] / k
  int64_t gatherTopK = 0;
  /// wgmma: warp roles (a producer warpgroup), with registers moved to the
  /// consumers when set.
  bool producer = false;
  mlir::DenseI64ArrayAttr registers;
  /// wgmma in clusters of 2 CTAs: the pair's tasks share each B box.
  bool multicast = false;
  /// out += the product (an f32 out: main_grad += dW).
  bool accumulate = false;
};

/// The tensor-core plan of a backward (sm_90a, the shapes eligible): the
/// dgrads run on wgmma, reading the weights N-major; the slots of their
/// maps. Empty `maps` means every GEMM is simt.
struct BackwardMaps {
  mlir::SmallVector<TensorMapSpec> maps;
  int64_t routedDOut = -1, down = -1, dGate = -1, dUp = -1, gate = -1, up = -1;
  int64_t dOut = -1, sharedDown = -1, dSharedGate = -1, dSharedUp = -1,
          sharedGate = -1, sharedUp = -1;
  // The weight gradients' operands, M- and N-major ([K = rows, M or N]).
  int64_t dYT = -1, hiddenT = -1, dGateT = -1, dUpT = -1, routedXT = -1;
  int64_t dOutT = -1, sharedHiddenT = -1, dSharedGateT = -1, dSharedUpT = -1,
          xT = -1;
  // Recompute: the forward's gate/up GEMMs (K-major operands).
  int64_t routedX = -1, gateK = -1, upK = -1, x = -1, sharedGateK = -1,
          sharedUpK = -1;
  // FP8 on wgmma (sm_90a): the down dgrad's E4M3 operands, routed d_out
  // rows and the transposed down weights (K-major, 128-byte boxes).
  int64_t fp8DOut = -1, fp8Down = -1;
  // ... the gate/up dgrad's (d_gate's and d_up's E4M3 rows, the transposed
  // gate and up weights) ...
  int64_t fp8DGate = -1, fp8DUp = -1, fp8GateT = -1, fp8UpT = -1;
  // ... and the weight gradients' (K-major [M or N, R'], K the routed rows:
  // mk.quantize_columns' copies).
  int64_t fp8DYT = -1, fp8HiddenT = -1, fp8DGateT = -1, fp8DUpT = -1,
          fp8RoutedXT = -1;
  int64_t tileM = sched::kTileM;
  /// sm_90a: 256-column tiles for the GEMMs of one B operand (as the
  /// forward's down projections) and the down dgrad's A gathered from d_out;
  /// sm_100a (tcgen05): [64, 128, 64] tiles and a routed copy of d_out.
  int64_t storeTileN = sched::kTileN;
  bool gatherDOut = false;
  mk::Engine engine = mk::Engine::wgmma;
  /// sm_90a, FP8, warp-specialize: every GEMM of the backward with a
  /// producer warpgroup (registers moved to the consumers of 128-row
  /// tiles: sched::producerRegisters).
  bool producer = false;
};

/// The backward's tensor-core plan for the layer (empty maps: simt);
/// `mayGatherDOut`: the down dgrad may gather its A rows from d_out (not
/// when d_out's rows arrive in a symmetric buffer, which has no map);
/// `warpRoles`: a producer warpgroup for the GEMMs where the plan admits
/// one (FP8 on wgmma with the tokens static).
BackwardMaps backwardMapsFor(mlir::MLIRContext *ctx, const Sizes &s,
                             const mk::TargetSupport &support,
                             bool tensorCores, bool recompute,
                             bool mayGatherDOut, bool warpRoles = false);

/// What every kernel's schedule starts with: its buffers by parameter
/// name, grid barriers (each followed, when profiling, by a timestamp into
/// `phase_clock` and `phase_cycles`) and the routing plan.
struct ScheduleBuilder {
  mlir::OpBuilder &b;
  mlir::Location loc;
  llvm::StringMap<mlir::Value> buf;
  mlir::Value clock, cycles;
  int64_t stamps = 0;
  /// The chip's lowering, asked about every GEMM the schedule gets.
  const mk::TargetSupport &support;
  /// Whether every GEMM so far is one the chip's lowering implements.
  mlir::LogicalResult status = mlir::success();

  /// The kernel's report to the runtime (mk.check_routes, bounded
  /// barriers) and the bound of each grid barrier's wait (0: none).
  mlir::Value report;
  int64_t timeoutNs = 0, barriers = 0;
  /// Any T: the call's token count (index), from the "tokens" parameter;
  /// null in a kernel for one T.
  mlir::Value tokens;

  ScheduleBuilder(mlir::OpBuilder &b, mlir::Location loc,
                  mlir::ArrayRef<Param> params, mlir::gpu::GPUFuncOp func,
                  const mk::TargetSupport &support, unsigned timeoutMs = 0)
      : b(b), loc(loc), support(support),
        timeoutNs(int64_t(timeoutMs) * 1000000) {
    for (auto [i, p] : llvm::enumerate(params))
      buf[p.name] = func.getArgument(i);
    report = buf.lookup("status");
    if (mlir::Value t = buf.lookup("tokens"))
      tokens = mlir::arith::IndexCastOp::create(b, loc, b.getIndexType(), t);
    clock = buf.lookup("phase_clock");
    cycles = buf.lookup("phase_cycles");
    timestamp();
  }
  void timestamp() {
    if (clock)
      mk::TimestampOp::create(b, loc, clock, stamps++, cycles);
  }
  void barrier() {
    if (timeoutNs)
      mk::GridBarrierOp::create(b, loc, buf["grid_barrier"], report,
                                b.getI64IntegerAttr(timeoutNs),
                                b.getI64IntegerAttr(barriers));
    else
      mk::GridBarrierOp::create(b, loc, buf["grid_barrier"], mlir::Value(),
                                nullptr, nullptr);
    ++barriers;
    timestamp();
  }
  /// The routing plan's four steps, each ending in a barrier: parallel over
  /// chunks of routes and over experts, and deterministic (rows in route
  /// order within each expert).
  void plan(const Sizes &s) {
    mk::FillOp::create(b, loc, buf["row_route"], -1);
    mk::FillOp::create(b, loc, buf["row_expert"], -1);
    mk::CheckRoutesOp::create(b, loc, buf["top_experts"], report, tokens,
                              s.experts);
    mk::CountRoutesOp::create(b, loc, buf["top_experts"], buf["chunk_counts"],
                              tokens, s.chunk());
    barrier();
    mk::ScanChunksOp::create(b, loc, buf["chunk_counts"], buf["counts"]);
    barrier();
    mk::PadOffsetsOp::create(b, loc, buf["counts"], buf["offsets"], s.padding);
    barrier();
    mk::AssignRowsOp::create(b, loc, buf["top_experts"], buf["offsets"],
                             buf["chunk_counts"], buf["route_row"],
                             buf["row_route"], buf["row_expert"], tokens,
                             s.chunk());
    barrier();
  }
  /// Emits `g` as an mk.gemm, which the chip's lowering must implement
  /// (else a diagnostic naming the GEMM, and `status` fails).
  void gemm(const GemmPlan &g);
};

/// The GEMMs both backward plans emit alike (Backward.cpp and, at ep > 1,
/// ExpertParallel.cpp), by buffer name, on tensor cores when `tc` has
/// maps.
struct BackwardGemms {
  ScheduleBuilder &frame;
  const BackwardMaps &tc;
  const Sizes &s;
  /// main_grads: the weights' gradients are added into their outputs.
  bool accumulate;
  /// Gives `g` the tensor-core plan's maps `slots`, tiles and engine.
  void onTensorCores(GemmPlan &g, llvm::ArrayRef<int64_t> slots) const;
  /// The down dgrad (f32, unscaled) from `dOut`'s routed rows (`gathered`:
  /// d_out's rows gathered by the A loads), and the down weights'
  /// gradient from d_y.
  void routedDown(llvm::StringRef dOut, bool gathered);
  /// The shared expert's down dgrad and down weights' gradient.
  void sharedDown();
  /// The gate/up dgrads (both K-loops into one accumulator) and the gate
  /// and up weights' gradients, routed and (`shared`) the shared expert's.
  void gateUp(bool shared);
};

/// The sizes of a forward or backward layer (T, or the capacity of a
/// layer for any T; checked by the pass).
template <typename LayerLike> Sizes sizesOf(LayerLike layer) {
  moe::PlanType plan = layer.getPlanType();
  auto x = mlir::cast<mlir::RankedTensorType>(layer.getX().getType());
  auto wg =
      mlir::cast<mlir::RankedTensorType>(layer.getGateWeights().getType());
  bool anyTokens = !plan.hasStaticTokens();
  Sizes s{anyTokens ? plan.getMaxTokens() : plan.getTokens(),
          x.getDimSize(1),
          wg.getDimSize(1),
          plan.getLocalExperts(),
          plan.getTopK(),
          plan.getPadding()};
  s.anyTokens = anyTokens;
  s.ep = plan.getEp();
  if (s.ep > 1)
    s.maxRoutes = plan.getReceiveCapacity();
  if (layer.hasSharedExpert())
    s.sharedInter = mlir::cast<mlir::RankedTensorType>(
                        layer.getSharedWeights()[0].getType())
                        .getDimSize(0);
  return s;
}

int64_t slotCount(mlir::ArrayRef<TensorMapSpec> maps);

/// FP8: the routed weights quantized, with their scales (f32 [E, rows /
/// 128, cols / 128], or MXFP8's E8M0 atoms [E, ceil(rows / 128), cols /
/// 128, 512]), as params of role `role` (a kernel's inputs, given the
/// weights quantized, or its workspace). The normal layout, which the
/// forward's GEMMs read: gate_q and up_q [E, I, H], down_q [E, H, I],
/// each with its `_scale` (the values' `access` as given); or
/// (`transposed`) the layout the backward's dgrads read (K-major): gate_qt
/// and up_qt [E, H, I], down_qt [E, I, H], each with its `_scale_t`.
mlir::SmallVector<Param> fp8Weights(mlir::MLIRContext *ctx, const Sizes &s,
                                    llvm::StringRef role, bool transposed,
                                    llvm::StringRef access = "pointer");

/// The kernel's description for the runtime, on the gpu.func.
mlir::DictionaryAttr
describeKernel(mlir::MLIRContext *ctx, mlir::ArrayRef<Param> params,
               const Sizes &s, mlir::StringRef chip, unsigned blockSize,
               mlir::ArrayRef<TensorMapSpec> tensorMaps,
               mlir::ArrayRef<mlir::StringRef> phases, int64_t cluster);

/// A kernel `<func>_<suffix>` in a new gpu.module `<func>_kernels` (one a
/// function), with its description; the builder is left at its body.
mlir::gpu::GPUFuncOp createKernel(mlir::OpBuilder &b, mlir::ModuleOp module,
                                  mlir::func::FuncOp func,
                                  mlir::Operation *layer,
                                  mlir::StringRef suffix,
                                  mlir::ArrayRef<Param> params, unsigned block,
                                  mlir::DictionaryAttr description);

/// What the plans read of convert-moe-to-mk's options (checked by the pass).
struct PlanOptions {
  mk::TargetSupport support;
  unsigned blockSize;
  bool tensorCores, profile, warpSpecialize, fuseDispatch, copyDispatch,
      multicast;
  /// Bounded grid barriers (debugging): 0 = unbounded.
  unsigned barrierTimeoutMs = 0;
  /// ep = 1 layers planned as a group of one rank (self-exchange).
  bool selfExchange = false;
  /// FP8 layers: the routed weights are inputs, quantized
  /// (fp8-quantized-weights).
  bool fp8QuantizedWeights = false;

  /// Whether `plan`'s layer runs the exchange: ep > 1, or self-exchange.
  bool exchanges(moe::PlanType plan) const {
    return plan.getEp() > 1 || selfExchange;
  }
};

/// Plans `layer` (the body of `func`) as the kernel `<func>_forward` in a
/// new gpu.module of `module`; fails with a diagnostic.
mlir::LogicalResult planForward(mlir::ModuleOp module, mlir::func::FuncOp func,
                                moe::LayerOp layer, const PlanOptions &options);
/// An expert-parallel (ep > 1, or self-exchange) forward
/// (ExpertParallel.cpp).
mlir::LogicalResult planForwardEP(mlir::ModuleOp module,
                                  mlir::func::FuncOp func, moe::LayerOp layer,
                                  const PlanOptions &options);
/// An expert-parallel (ep > 1, or self-exchange) backward
/// (ExpertParallel.cpp).
mlir::LogicalResult planBackwardEP(mlir::ModuleOp module,
                                   mlir::func::FuncOp func,
                                   moe::LayerGradOp grad,
                                   const PlanOptions &options);
/// The same for a backward, `<func>_backward`.
mlir::LogicalResult planBackward(mlir::ModuleOp module, mlir::func::FuncOp func,
                                 moe::LayerGradOp grad,
                                 const PlanOptions &options);

/// A function of moe.quantize ops alone (FP8 weights, 128 x 128 blocks)
/// as the kernel `<func>_quantize` (Quantize.cpp). `checkQuantizer` reports
/// why `func` is not one the GPU targets compile, at the op at fault.
mlir::LogicalResult checkQuantizer(mlir::func::FuncOp func);
mlir::LogicalResult planQuantizer(mlir::ModuleOp module,
                                  mlir::func::FuncOp func,
                                  const PlanOptions &options);

} // namespace mok::moe_to_mk

#endif // MOK_LIB_CONVERSION_MOETOMK_KERNELPLAN_H
