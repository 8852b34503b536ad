// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-mk-to-gpu: checks a megakernel's schedule (barrier intervals, one
// MMA engine that matches the chip, the implemented tile), then expands each
// mk op in place.
//
// The SIMT steps distribute their outermost iterations over all threads of
// the grid (grid-stride loops) and compute each element exactly as the CPU
// reference does, with the same scalar emitter. Tensor-core mk.gemm ops are
// TMA + tensor-core tile loops (GemmPipeline.h) with the same rounding
// points: wgmma on sm_90a (Hopper.h), tcgen05 on sm_100a (Blackwell.h).
//
#include "mok/Conversion/MKToGPU/MKToGPU.h"
#include "Blackwell.h"
#include "GemmPipeline.h"
#include "Hopper.h"
#include "mok/Conversion/Common/ScalarEmitter.h"
#include "mok/Dialect/MK/IR/MKOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMKTOGPU
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok;
using namespace mok::conversion;
namespace sched = mok::mk_schedule;

namespace {

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

/// How the diagnostics name a kernel buffer: its parameter name from
/// `mok.kernel` when there is one.
std::string bufferName(gpu::GPUFuncOp func, Value v) {
  auto arg = dyn_cast<BlockArgument>(v);
  if (!arg || arg.getOwner() != &func.getBody().front())
    return "a buffer";
  if (auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel"))
    if (auto params = desc.getAs<ArrayAttr>("params"))
      if (arg.getArgNumber() < params.size())
        if (auto p = dyn_cast<DictionaryAttr>(params[arg.getArgNumber()]))
          if (auto name = p.getAs<StringAttr>("name"))
            return ("'" + name.getValue() + "'").str();
  return "argument #" + std::to_string(arg.getArgNumber());
}

/// Within one barrier interval, a buffer written by one op may not be read
/// or written by another: other CTAs see the writes only after the barrier.
LogicalResult checkBarrierIntervals(gpu::GPUFuncOp func) {
  DenseMap<Value, Operation *> writer, accessor;
  for (Operation &op : func.getBody().front()) {
    if (isa<mk::GridBarrierOp>(op)) {
      writer.clear();
      accessor.clear();
      continue;
    }
    if (!isa<mk::MKDialect>(op.getDialect()))
      continue;
    SmallVector<MemoryEffects::EffectInstance> effects;
    cast<MemoryEffectOpInterface>(op).getEffects(effects);
    for (auto &effect : effects) {
      Value v = effect.getValue();
      if (!v)
        continue;
      // `other` already did `what` to v in this interval.
      auto conflict = [&](Operation *other, StringRef doing, StringRef what,
                          StringRef note) {
        InFlightDiagnostic d =
            op.emitOpError() << doing << " " << bufferName(func, v)
                             << ", which '" << other->getName() << "' " << what
                             << " in the same barrier interval (add an "
                                "mk.grid_barrier between them)";
        d.attachNote(other->getLoc()) << note;
        return d;
      };
      auto it = writer.find(v);
      if (it != writer.end() && it->second != &op)
        return conflict(it->second, "accesses", "writes", "written here");
      if (isa<MemoryEffects::Write>(effect.getEffect())) {
        auto acc = accessor.find(v);
        if (acc != accessor.end() && acc->second != &op)
          return conflict(acc->second, "writes", "accesses", "accessed here");
        writer[v] = &op;
      }
      accessor.try_emplace(v, &op);
    }
  }
  return success();
}

/// The box rows of the CUtensorMap in `slot`, from the kernel's mok.kernel
/// description (tensor_maps entries, `experts` slots each), if it has one.
std::optional<int64_t> mapBoxRows(gpu::GPUFuncOp func, int64_t slot) {
  auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel");
  auto maps = desc ? desc.getAs<ArrayAttr>("tensor_maps") : ArrayAttr();
  if (!maps)
    return std::nullopt;
  int64_t first = 0;
  for (Attribute a : maps) {
    auto m = dyn_cast<DictionaryAttr>(a);
    auto experts = m ? m.getAs<IntegerAttr>("experts") : IntegerAttr();
    auto rows = m ? m.getAs<IntegerAttr>("box_rows") : IntegerAttr();
    if (!experts || !rows)
      return std::nullopt;
    if (slot < first + experts.getInt())
      return rows.getInt();
    first += experts.getInt();
  }
  return std::nullopt;
}

/// The CTAs per cluster of `func`'s launch (mok.kernel `cluster`, 1 when
/// absent): 1 or 2.
FailureOr<int64_t> clusterSize(gpu::GPUFuncOp func) {
  auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel");
  Attribute a = desc ? desc.get("cluster") : Attribute();
  if (!a)
    return 1;
  auto n = dyn_cast<IntegerAttr>(a);
  if (!n || (n.getInt() != 1 && n.getInt() != 2))
    return func.emitOpError()
           << "mok.kernel cluster must be the integer 1 or 2 (CTAs per "
              "cluster), got "
           << a;
  return n.getInt();
}

/// The kernel's tensor-core GEMMs: one engine, the chip's, the implemented
/// tile and stages, one tensor-map buffer, a kBlock-thread CTA (with warp
/// roles, producerBlock(tile rows) threads).
FailureOr<std::optional<mk::Engine>> checkEngines(gpu::GPUFuncOp func) {
  std::optional<mk::Engine> engine;
  std::optional<int64_t> tileM;
  std::optional<bool> producer;
  DenseI64ArrayAttr registers;
  Value maps;
  StringRef chip;
  if (auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel"))
    if (auto c = desc.getAs<StringAttr>("chip"))
      chip = c.getValue();
  FailureOr<int64_t> cluster = clusterSize(func);
  if (failed(cluster))
    return failure();
  bool anyTensorCores = false;
  for (auto gemm : func.getBody().front().getOps<mk::GemmOp>()) {
    if (!gemm.usesTensorCores())
      continue;
    anyTensorCores = true;
    // The training forms (saves, M-/N-major operands, concat, k_groups, an
    // f32 out) exist for both tensor-core engines without warp roles or
    // clusters; a gathered A (wgmma) only with an N-major B alone.
    bool dgradForms =
        gemm.getTransposeB() || gemm.getA2() || gemm.getTransposeA() ||
        gemm.getKOffsets() ||
        !cast<MemRefType>(gemm.getOut().getType()).getElementType().isBF16();
    bool saves = !gemm.getSaves().empty();
    if (saves && (gemm.getProducer() || *cluster > 1 || gemm.getGatherRows()))
      return gemm.emitOpError("saves is implemented for wgmma GEMMs without a "
                              "producer, clusters or a gathered A");
    // (A gathered A with an N-major B: the down dgrad, d_out's rows.)
    bool gatherOk =
        !gemm.getGatherRows() ||
        (!gemm.getTransposeA() && !gemm.getA2() && !gemm.getKOffsets());
    if (dgradForms && (gemm.getProducer() || *cluster > 1 || !gatherOk ||
                       gemm.getB().size() != (gemm.getA2() ? 2u : 1u)))
      return gemm.emitOpError()
             << "transpose_a, transpose_b, concat, k_groups and an f32 out "
                "are implemented for tensor-core GEMMs of one B operand (two "
                "with concat) without a producer or clusters, and a gathered "
                "A only with transpose_b alone";
    if (gemm.getTransposeA() && !gemm.getTransposeB())
      return gemm.emitOpError(
          "on the tensor-core engines, transpose_a needs transpose_b");
    if (gemm.getA2() && gemm.getTransposeA())
      return gemm.emitOpError(
          "concat on the tensor-core engines takes a K-major A");
    if (gemm.getKOffsets() &&
        cast<MemRefType>(gemm.getOut().getType()).getDimSize(1) %
            (*gemm.getTile())[0])
      return gemm.emitOpError()
             << "k_groups on the tensor-core engines: out's M ("
             << cast<MemRefType>(gemm.getOut().getType()).getDimSize(1)
             << ") must be a multiple of the tile's M (" << (*gemm.getTile())[0]
             << ")";
    // Clusters of 2 (TMA multicast of B halves): wgmma without a producer,
    // register epilogues (whole column pairs: the shared-memory epilogue
    // reuses stages the partner may already fill), B two 128-row halves
    // (gate + up, or one 256-column operand) read through 128-row boxes.
    if (*cluster > 1) {
      ArrayRef<int64_t> tile = *gemm.getTile();
      int64_t halves =
          static_cast<int64_t>(gemm.getB().size()) * tile[1] / sched::kTileN;
      if (gemm.getEngine() != mk::Engine::wgmma || gemm.getProducer())
        return gemm.emitOpError()
               << "mok.kernel cluster = " << *cluster
               << " is implemented for wgmma GEMMs without a producer";
      if (halves != 2)
        return gemm.emitOpError()
               << "with mok.kernel cluster = " << *cluster
               << " the B boxes of a tile must be two " << sched::kTileN
               << "-row halves (gate and up, or one operand of "
               << 2 * sched::kTileN << "-column tiles); got "
               << gemm.getB().size() << " operand(s) of " << tile[1]
               << "-column tiles";
      if (cast<MemRefType>(gemm.getOut().getType()).getDimSize(1) % 2)
        return gemm.emitOpError()
               << "with mok.kernel cluster = " << *cluster
               << " the epilogue stores pairs of columns from registers: out "
                  "needs an even number of columns";
      for (int64_t slot : gemm.getMaps()->drop_front())
        if (std::optional<int64_t> rows = mapBoxRows(func, slot);
            rows && *rows != sched::kTileN)
          return gemm.emitOpError() << "with mok.kernel cluster = " << *cluster
                                    << " B is loaded in " << sched::kTileN
                                    << "-row halves, but map slot " << slot
                                    << " has boxes of " << *rows << " rows";
    }
    mk::Engine e = gemm.getEngine();
    StringRef want = e == mk::Engine::wgmma ? "sm_90a" : "sm_100a";
    if (chip != want)
      return gemm.emitOpError()
             << "the " << mk::stringifyEngine(e) << " engine needs a " << want
             << " kernel (mok.kernel chip = \"" << want << "\"), got "
             << (chip.empty() ? "none" : "\"" + chip.str() + "\"");
    // The runtime launches with the description's dynamic shared memory:
    // it must hold what the GEMM phases use (on sm_90a the ring and the
    // epilogue staging).
    int64_t need = sched::dynamicSharedMemory(e == mk::Engine::wgmma);
    if (auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel")) {
      auto smem = desc.getAs<IntegerAttr>("dynamic_shared_memory");
      if (!smem)
        return gemm.emitOpError()
               << "the " << mk::stringifyEngine(e) << " engine uses " << need
               << " bytes of dynamic shared memory, but mok.kernel has no "
                  "dynamic_shared_memory (the runtime would launch with 0)";
      if (smem.getInt() < need)
        return gemm.emitOpError()
               << "the " << mk::stringifyEngine(e) << " engine uses " << need
               << " bytes of dynamic shared memory, but mok.kernel "
                  "dynamic_shared_memory is "
               << smem.getInt();
    }
    if (engine && *engine != e)
      return gemm.emitOpError("a kernel's tensor-core GEMMs must use one "
                              "engine");
    engine = e;
    // The tiles implemented: [64, 128, 64] with 4 stages; on sm_90a also
    // 128 rows (two consumer warpgroups) and, with one B operand, 256
    // columns (the same stage bytes).
    ArrayRef<int64_t> tile = *gemm.getTile();
    bool wgmma = e == mk::Engine::wgmma;
    // (concat's two B operands take turns in one B box.)
    bool wide = tile[1] == 2 * sched::kTileN && wgmma &&
                gemm.getB().size() == (gemm.getA2() ? 2u : 1u);
    bool tall = tile[0] == sched::kMaxConsumers * sched::kTileM && wgmma;
    if ((tile[0] != sched::kTileM && !tall) ||
        (tile[1] != sched::kTileN && !wide) || tile[2] != sched::kTileK ||
        *gemm.getStages() != sched::kStages)
      return gemm.emitOpError()
             << "tile [" << tile[0] << ", " << tile[1] << ", " << tile[2]
             << "] with " << *gemm.getStages()
             << " stages is not implemented; the lowering supports tile ["
             << sched::kTileM << ", " << sched::kTileN << ", " << sched::kTileK
             << "] with " << sched::kStages << " stages (and, for wgmma, M = "
             << sched::kMaxConsumers * sched::kTileM
             << ", and N = " << 2 * sched::kTileN << " with one B operand)";
    // Threads outside a tile's warpgroups skip its task loop: every tensor-
    // core GEMM of a kernel must keep the same threads counting k-tiles.
    if (tileM && *tileM != tile[0])
      return gemm.emitOpError() << "a kernel's tensor-core GEMMs must have "
                                   "one tile height; got "
                                << tile[0] << " after " << *tileM;
    tileM = tile[0];
    if (maps && maps != gemm.getTensorMaps())
      return gemm.emitOpError("a kernel's tensor-core GEMMs must read one "
                              "tensor_maps buffer");
    maps = gemm.getTensorMaps();
    // The map slots the GEMM reads (grouped B operands: one per expert)
    // must lie in the buffer (16 i64 a CUtensorMap).
    int64_t slots = cast<MemRefType>(maps.getType()).getDimSize(0) / 16;
    ArrayRef<int64_t> mapSlots = *gemm.getMaps();
    int64_t perB =
        gemm.isGrouped()
            ? cast<MemRefType>(gemm.getB()[0].getType()).getDimSize(0)
            : 1;
    for (auto [i, slot] : llvm::enumerate(mapSlots))
      if (slot + (i == 0 ? 1 : perB) > slots)
        return gemm.emitOpError()
               << "map slot " << slot << " (+" << (i == 0 ? 1 : perB)
               << ") is out of the tensor_maps buffer's " << slots << " slots";
    // Gathered A: the map at maps[0] must have one-row boxes (the
    // planner's map of x for it: never read on the device, it has the
    // runtime check x's 16-byte alignment when it encodes it, which the
    // cp.async copies rely on). Checked against the kernel's description
    // when it has one.
    if (gemm.getGatherRows())
      if (std::optional<int64_t> rows = mapBoxRows(func, mapSlots[0]);
          rows && *rows != 1)
        return gemm.emitOpError()
               << "a gathered A operand is read through one-row boxes, but "
                  "map slot "
               << mapSlots[0] << " has boxes of " << *rows << " rows";
    // Grouped: an m-tile must lie in one expert's segment, so the padding
    // of the plan that made the offsets must be a multiple of the tile
    // height.
    if (gemm.isGrouped()) {
      mk::PadOffsetsOp plan;
      for (auto pad : func.getBody().front().getOps<mk::PadOffsetsOp>())
        if (pad.getOffsets() == gemm.getOffsets())
          plan = pad;
      if (!plan)
        return gemm.emitOpError("a grouped tensor-core GEMM needs offsets "
                                "made by an mk.pad_offsets of its kernel");
      if (plan.getPadding() % tile[0])
        return gemm.emitOpError()
               << "expert segments are padded to " << plan.getPadding()
               << " rows, not a multiple of the tile's " << tile[0]
               << ": a tile would span two experts";
    }
    // Warp roles: one kind per kernel (the threads counting k-tiles, the
    // barriers and the register split are the kernel's).
    if (producer && (*producer != gemm.getProducer() ||
                     registers != gemm.getRegistersAttr()))
      return gemm.emitOpError("a kernel's tensor-core GEMMs must have the "
                              "same warp roles (producer, registers)");
    // With a producer only its first thread counts the k-tiles of GEMMs
    // without a gathered A; a gathered one starts every producer thread
    // from the count, so it must come first.
    if (producer && gemm.getProducer() && gemm.getGatherRows())
      return gemm.emitOpError(
          "with a producer, a gathered A operand is implemented for the "
          "kernel's first tensor-core GEMM only (the producer warpgroup's "
          "other threads do not count the k-tiles of the GEMMs before it)");
    producer = gemm.getProducer();
    registers = gemm.getRegistersAttr();
    if (*producer &&
        cast<MemRefType>(gemm.getOut().getType()).getDimSize(1) % 2)
      return gemm.emitOpError("with a producer the epilogue stores pairs of "
                              "columns from registers: out needs an even "
                              "number of columns");
    unsigned threads =
        *producer ? sched::producerBlock(tile[0]) : sched::kBlock;
    std::optional<DenseI32ArrayAttr> block = func.getKnownBlockSizeAttr();
    if (!block || (*block)[0] != static_cast<int32_t>(threads) ||
        (*block)[1] != 1 || (*block)[2] != 1)
      return gemm.emitOpError()
             << "tensor-core GEMMs " << (*producer ? "with a producer " : "")
             << "of " << tile[0] << "-row tiles need a kernel with "
             << "known_block_size = [" << threads << ", 1, 1]";
    if (registers) {
      // Consumers and producer share the registers of the even split.
      int64_t consumers = tile[0] / sched::kTileM;
      int64_t even = sched::evenRegisters(threads);
      ArrayRef<int64_t> r = registers.asArrayRef();
      if (consumers * r[0] + r[1] > (consumers + 1) * even)
        return gemm.emitOpError()
               << "registers [" << r[0] << ", " << r[1] << "] for " << consumers
               << " consumer warpgroup(s) and a producer exceed "
               << "the register file (" << even << " a thread for " << threads
               << " threads)";
      // setmaxnreg increases the consumers and decreases the producer
      // warpgroup from the even share the kernel is compiled for.
      if (r[0] < even || r[1] > even)
        return gemm.emitOpError()
               << "registers [" << r[0] << ", " << r[1]
               << "]: the consumers need at least and the producer at most "
               << "the even share (" << even << " a thread for " << threads
               << " threads)";
    }
  }
  if (*cluster > 1 && !anyTensorCores)
    return func.emitOpError()
           << "mok.kernel cluster = " << *cluster
           << " needs tensor-core GEMMs (the pairs share their B boxes)";
  return engine;
}

//===----------------------------------------------------------------------===//
// Lowering
//===----------------------------------------------------------------------===//

class KernelLowering {
public:
  KernelLowering(gpu::GPUFuncOp func, Emitter &e) : func(func), e(e) {}

  void run(std::optional<mk::Engine> engine);

private:
  gpu::GPUFuncOp func;
  Emitter &e;
  Value gridThreads, globalId, spreadId, numBlocks;
  /// Items (8 columns of a token) a thread of the vector combine works on
  /// at once: on the H200, 4 took the dsv3-shard combine from 0.181 to
  /// 0.177 ms and qwen3-30b's from 0.102 to 0.095 ms (2: 0.177-0.182 and
  /// 0.093).
  int64_t combineItems = 4;
  /// 16-byte pieces of a row a thread of the vector gathers copies at once
  /// (the most that divides the row's pieces): on the H200 4 left the
  /// dsv3-shard reverse combine at 0.36 ms and qwen3-30b's at 0.19 ms
  /// (about 1.5 TB/s: a route load, then the row loads, in flight per
  /// thread), before the pieces were spread (gatherVector).
  int64_t gatherPieces = 16;
  /// The SwiGLU's sigmoid in fast math (ScalarEmitter.h): the IEEE
  /// reciprocal's range check and slow-path call per element cost a tenth
  /// of qwen3-30b's gate/up GEMM phase on the H200 (run 67). Not in kernels
  /// with warp roles or clusters, nor for a clamped SwiGLU (sigmoidFor):
  /// without the branches ptxas keeps more of the epilogue in flight, and
  /// there it spilled (4-60 bytes on the benchmark shapes with warp roles
  /// or clusters; up to 232 bytes in the clamped test layers, none
  /// before). The CPU reference stays exact.
  SigmoidMath sigmoidMath = SigmoidMath::fast;
  SigmoidMath sigmoidFor(Limit limit) const {
    return limit ? SigmoidMath::exact : sigmoidMath;
  }
  int64_t gatherPiecesOf(int64_t pieces) const {
    int64_t per = gatherPieces;
    while (pieces % per)
      per /= 2;
    return per;
  }
  /// 16-byte pieces of a row a lane of the vector SwiGLU backward loads
  /// before it computes any (fewer when the row has fewer per lane).
  int64_t rowPieces = 4;
  std::unique_ptr<gemm::GemmEmitter> gemm;
  /// Tensor-core GEMMs whose next mk op is an mk.grid_barrier.
  llvm::SmallPtrSet<Operation *, 4> beforeGridBarrier;
  static bool isTensorCoreGemm(Operation *op) {
    auto g = dyn_cast<mk::GemmOp>(op);
    return g && g.usesTensorCores();
  }

  /// for i in [0, n) over the grid, spread CTA-first (thread t of CTA b
  /// takes i = t * CTAs + b, ...): for loops of few, long iterations (one a
  /// chunk of routes or an expert), which would otherwise all land on the
  /// first CTAs' SMs.
  void forAllSpread(Value n, function_ref<void(Value)> body) {
    e.loop(spreadId, n, gridThreads, body);
  }
  /// Whether the kernel's block is known and whole warps: the warp-wide
  /// lowerings (shuffles, match.sync, warp barriers over all 32 lanes)
  /// need every lane of a warp present.
  bool wholeWarps() {
    std::optional<ArrayRef<int32_t>> block = func.getKnownBlockSize();
    return block && (*block)[0] % 32 == 0 && (*block)[1] == 1 &&
           (*block)[2] == 1;
  }
  /// for i in [0, n), one warp an i over the grid, spread CTA-first as
  /// forAllSpread spreads threads; body(i, lane). The loop is uniform over
  /// each warp, so warp-wide operations inside see all 32 lanes.
  void forAllWarps(Value n, function_ref<void(Value, Value)> body) {
    Value tid = gpu::ThreadIdOp::create(e.b, e.loc, gpu::Dimension::x);
    Value warp = e.add(e.mul(e.div(tid, e.index(32)), numBlocks),
                       gpu::BlockIdOp::create(e.b, e.loc, gpu::Dimension::x));
    // The lane from %laneid (tid % 32 in a block of whole warps). A tid %
    // 32 here, at the top of the kernel, was merged with the GEMM
    // epilogues' tid % 32 and kept live through the GEMMs: ptxas spilled
    // 4-8 bytes in two small training forwards.
    Value lane = arith::IndexCastOp::create(
        e.b, e.loc, e.b.getIndexType(),
        NVVM::LaneIdOp::create(e.b, e.loc, e.b.getI32Type()));
    e.loop(warp, n, e.div(gridThreads, e.index(32)),
           [&](Value i) { body(i, lane); });
  }
  /// A gpu.shuffle of an i64 (two i32 halves) over the whole warp.
  Value shuffle64(Value v, int64_t offset, gpu::ShuffleMode mode);
  /// The inclusive prefix sum of an i64 over the lanes of a warp.
  Value warpInclusiveSum(Value v, Value lane);
  void syncWarp() {
    NVVM::SyncWarpOp::create(e.b, e.loc,
                             arith::ConstantIntOp::create(e.b, e.loc, -1, 32));
  }
  /// The routes of one 32-route round of a chunk, a route a lane:
  /// route q = c * chunk + round * 32 + lane, `inside` whether the chunk
  /// (and the routes) hold it, its expert (-1: none or outside), the
  /// lanes of the warp whose routes go to the same expert (match.sync) and
  /// those of them on lower lanes.
  struct RouteRound {
    Value q, inside, expert, peers, below;
  };
  /// Whether this lane is the first of its group and the group's expert
  /// valid (`valid`, or computed here when null): the lane that adds the
  /// group's size to the chunk's count of that expert, cc[c, expert]
  /// (addGroupSize, after a warp barrier that orders the count's earlier
  /// stores).
  Value groupFirst(const RouteRound &r, Value valid = Value());
  void addGroupSize(Value first, const RouteRound &r, Value cc, Value c);
  RouteRound routeRound(Value top, Value c, Value round, Value lane,
                        int64_t chunk, int64_t routes, int64_t experts);
  Value popc(Value mask) { return LLVM::CtPopOp::create(e.b, e.loc, mask); }
  /// for q over chunk `c`'s routes [c * chunk, min((c + 1) * chunk,
  /// routes)), in order, on this thread.
  void forChunk(Value c, int64_t chunk, int64_t routes,
                function_ref<void(Value)> body) {
    Value first = e.mul(c, e.index(chunk));
    Value end = e.add(first, e.index(chunk));
    if (routes % chunk)
      end = arith::MinSIOp::create(e.b, e.loc, end, e.index(routes));
    e.loop(first, end, body);
  }
  void forAll(Value n, function_ref<void(Value)> body) {
    e.loop(globalId, n, gridThreads, body);
  }
  /// for (r, c) in [0, rows) x [0, cols), distributed over the grid.
  void forAll2(Value rows, int64_t cols,
               function_ref<void(Value, Value)> body) {
    Value c = e.index(cols);
    forAll(e.mul(rows, c), [&](Value i) { body(e.div(i, c), e.rem(i, c)); });
  }
  Value i64Of(Value index) {
    return arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(), index);
  }
  /// R, the padded routed row count of the plan.
  Value routedRows(Value offsets) {
    int64_t experts = cast<MemRefType>(offsets.getType()).getDimSize(0) - 1;
    return e.toIndex(e.load(offsets, {e.index(experts)}));
  }
  /// The expert of route q of `top` [T, k] in [0, experts), or -1.
  Value expertOf(Value top, Value q, int64_t experts) {
    Value k = e.index(cast<MemRefType>(top.getType()).getDimSize(1));
    Value id = e.toIndex(e.load(top, {e.div(q, k), e.rem(q, k)}));
    Value valid = arith::AndIOp::create(
        e.b, e.loc, e.cmp(arith::CmpIPredicate::sge, id, e.index(0)),
        e.cmp(arith::CmpIPredicate::slt, id, e.index(experts)));
    return e.select(valid, id, e.index(-1));
  }
  static int64_t size(Value v, unsigned i) {
    return cast<MemRefType>(v.getType()).getDimSize(i);
  }

  // 16-byte accesses (ld/st.global.v4) for the memory-bound SIMT steps.
  /// The global address (i64) of a buffer's first element.
  Value base(Value m) {
    return arith::IndexCastOp::create(
        e.b, e.loc, e.b.getI64Type(),
        memref::ExtractAlignedPointerAsIndexOp::create(e.b, e.loc, m));
  }
  /// A global pointer `elements` (index) bf16 elements past `base`.
  Value at(Value base, Value elements, int64_t elementBytes = 2) {
    Value bytes = arith::MulIOp::create(
        e.b, e.loc,
        arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(), elements),
        arith::ConstantIntOp::create(e.b, e.loc, elementBytes, 64));
    return LLVM::IntToPtrOp::create(
        e.b, e.loc, LLVM::LLVMPointerType::get(e.b.getContext(), 1),
        arith::AddIOp::create(e.b, e.loc, base, bytes),
        LLVM::DereferenceableAttr());
  }
  Value load16(Type type, Value ptr) {
    return LLVM::LoadOp::create(e.b, e.loc, type, ptr, /*alignment=*/16);
  }
  void store16(Value v, Value ptr) {
    LLVM::StoreOp::create(e.b, e.loc, v, ptr, /*alignment=*/16);
  }
  /// A 16-byte streaming store (st.global.cs: evict-first in L1 and L2),
  /// as the GEMM epilogues store: for the memory-bound steps' routed
  /// outputs (hundreds of MB on the benchmark shapes), read once by the
  /// next phase, so that they do not push out of L2 what is re-read (the
  /// rows of x and d_out, gathered k times).
  void store16Streaming(Value v, Value ptr) {
    gemm::storeGlobalStreaming16(
        e.b, e.loc, LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr),
        v);
  }
  /// Whether all of `buffers` start 16-byte aligned (uniform over the grid;
  /// the runtime's workspace is, caller tensors usually are).
  Value aligned16(ArrayRef<Value> buffers) { return aligned(buffers, 16); }
  /// Whether all of `buffers` start `bytes`-aligned (a power of two).
  Value aligned(ArrayRef<Value> buffers, int64_t bytes) {
    Value bits = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
    for (Value m : buffers)
      bits = arith::OrIOp::create(e.b, e.loc, bits, base(m));
    Value low = arith::AndIOp::create(
        e.b, e.loc, bits,
        arith::ConstantIntOp::create(e.b, e.loc, bytes - 1, 64));
    return e.cmp(arith::CmpIPredicate::eq, low,
                 arith::ConstantIntOp::create(e.b, e.loc, 0, 64));
  }
  /// The routes a token has in a combine: router_weights' columns, or
  /// (unweighted) route_row's size over the tokens.
  static int64_t topKOf(mk::CombineOp op) {
    if (Value w = op.getRouterWeights())
      return size(w, 1);
    return size(op.getRouteRow(), 0) / size(op.getOut(), 0);
  }
  /// The 8 bf16 lanes of a 16-byte vector as f32, and back (rounded).
  SmallVector<Value> unpack8(Value vec) {
    SmallVector<Value> xs;
    for (int64_t i = 0; i < 8; ++i) {
      Value lane = arith::ConstantIntOp::create(e.b, e.loc, i, 32);
      Value x = LLVM::ExtractElementOp::create(e.b, e.loc, vec, lane);
      xs.push_back(arith::ExtFOp::create(e.b, e.loc, e.b.getF32Type(), x));
    }
    return xs;
  }
  Value pack8(ArrayRef<Value> xs) {
    Type bf16 = e.b.getBF16Type();
    Value packed =
        LLVM::UndefOp::create(e.b, e.loc, VectorType::get({8}, bf16));
    for (int64_t i = 0; i < 8; ++i)
      packed = LLVM::InsertElementOp::create(
          e.b, e.loc, packed, arith::TruncFOp::create(e.b, e.loc, bf16, xs[i]),
          arith::ConstantIntOp::create(e.b, e.loc, i, 32));
    return packed;
  }
  void gatherScalar(mk::GatherOp op);
  void gatherScaledVector(mk::GatherOp op);
  void swigluGradVector(mk::SwigluGradOp op);
  void swigluGradScalar(mk::SwigluGradOp op);
  /// mk.swiglu_grad's row loop: one warp a row (warps spread over the
  /// blocks first); `row(r, lane, valid, t, kk, scale)` does row r (valid,
  /// t, kk: its route, routed form only; scale: its weight, 1 shared) and
  /// returns the lane's partial of d_w, which a fixed butterfly sums and
  /// lane 0 stores; then the routes without a row get zeros.
  void swigluGradRows(mk::SwigluGradOp op,
                      function_ref<Value(Value, Value, Value, Value)> row);
  void gatherVector(mk::GatherOp op);
  void combineScalar(mk::CombineOp op);
  void combineVector(mk::CombineOp op);

  void lower(mk::FillOp op);
  void lower(mk::CountRoutesOp op);
  void countRoutesByWarps(mk::CountRoutesOp op);
  void lower(mk::ScanChunksOp op);
  void scanChunksByWarps(mk::ScanChunksOp op);
  void lower(mk::PadOffsetsOp op);
  void padOffsetsByWarp(mk::PadOffsetsOp op);
  void lower(mk::AssignRowsOp op);
  void assignRowsByWarps(mk::AssignRowsOp op);
  void lower(mk::GatherOp op);
  void lower(mk::GemmOp op);
  void lowerSimt(mk::GemmOp op);
  void lowerTensorCores(mk::GemmOp op);
  void lower(mk::CombineOp op);
  void lower(mk::SwigluGradOp op);
  void lower(mk::GridBarrierOp op);
  void lower(mk::TimestampOp op);
};

void KernelLowering::run(std::optional<mk::Engine> engine) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Block &body = func.getBody().front();
  b.setInsertionPointToStart(&body);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value bdim = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  numBlocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  globalId = e.add(e.mul(bid, bdim), tid);
  spreadId = e.add(e.mul(tid, numBlocks), bid);
  gridThreads = e.mul(numBlocks, bdim);

  SmallVector<Operation *> ops;
  Operation *lastTensorCoreGemm = nullptr;
  for (Operation &op : body)
    if (isa<mk::MKDialect>(op.getDialect())) {
      if (isa<mk::GridBarrierOp>(op) && !ops.empty() &&
          isTensorCoreGemm(ops.back()))
        beforeGridBarrier.insert(ops.back());
      ops.push_back(&op);
      if (isTensorCoreGemm(&op))
        lastTensorCoreGemm = &op;
    }

  // The tensor-core GEMMs' one-time setup (mbarriers, the prefetch of the
  // maps every task reads; sm_100a: Tensor Memory), in uniform control flow
  // at the start of the kernel.
  if (engine) {
    SmallVector<std::pair<int64_t, int64_t>> prefetch;
    Value maps;
    gemm::WarpRoles roles;
    for (auto g : body.getOps<mk::GemmOp>()) {
      if (!g.usesTensorCores())
        continue;
      // The same in every tensor-core GEMM (checkEngines).
      roles.consumers = (*g.getTile())[0] / sched::kTileM;
      roles.producer = g.getProducer();
      roles.cluster = *clusterSize(func); // checked by checkEngines
      // Under the producer's register split, four combine items spilled
      // (the SwiGLU backward's pieces: one, the gathers' four, the same
      // caution).
      if (roles.producer) {
        combineItems = 2;
        rowPieces = 1;
        gatherPieces = 4;
      }
      if (roles.producer || roles.cluster > 1)
        sigmoidMath = SigmoidMath::exact;
      if (std::optional<ArrayRef<int64_t>> r = g.getRegisters()) {
        roles.registers = {(*r)[0], (*r)[1]};
        roles.evenRegisters = sched::evenRegisters(
            static_cast<unsigned>((*func.getKnownBlockSize())[0]));
      }
      maps = g.getTensorMaps();
      ArrayRef<int64_t> slots = *g.getMaps();
      prefetch.push_back({slots[0], (*g.getTile())[0]});
      if (!g.isGrouped())
        for (int64_t s : slots.drop_front())
          prefetch.push_back({s, (*g.getTile())[1]});
    }
    auto module = func->getParentOfType<gpu::GPUModuleOp>();
    gemm = *engine == mk::Engine::tcgen05
               ? sm100::createGemmEmitter(e, module, maps, prefetch)
               : sm90::createGemmEmitter(e, module, maps, prefetch, roles);
    // setmaxnreg needs the kernel's register count fixed (.maxnreg): the
    // even share, which the phases move between the roles and restore.
    if (roles.registers)
      func->setAttr("nvvm.maxnreg", b.getI32IntegerAttr(static_cast<int32_t>(
                                        roles.evenRegisters)));
  }

  bool finished = !engine;
  bool afterLastGemm = false;
  for (Operation *op : ops) {
    b.setInsertionPoint(op);
    TypeSwitch<Operation *>(op)
        .Case<mk::FillOp, mk::CountRoutesOp, mk::ScanChunksOp, mk::PadOffsetsOp,
              mk::AssignRowsOp, mk::GatherOp, mk::GemmOp, mk::CombineOp,
              mk::SwigluGradOp, mk::GridBarrierOp, mk::TimestampOp>(
            [&](auto typed) { lower(typed); });
    if (op == lastTensorCoreGemm)
      afterLastGemm = true;
    // What follows the last tensor-core GEMM and a CTA-wide barrier
    // (sm_100a: frees Tensor Memory): after the next grid barrier.
    if (!finished && afterLastGemm && isa<mk::GridBarrierOp>(op)) {
      gemm->finish();
      finished = true;
    }
    op->erase();
  }
  if (!finished) {
    b.setInsertionPoint(body.getTerminator());
    gpu::BarrierOp::create(b, loc);
    gemm->finish();
  }
}

void KernelLowering::lower(mk::FillOp op) {
  Value v = arith::ConstantIntOp::create(e.b, e.loc, op.getValue(), 64);
  Value buffer = op.getBuffer();
  forAll(e.index(size(buffer, 0)), [&](Value i) { e.store(v, buffer, {i}); });
}

void KernelLowering::lower(mk::CountRoutesOp op) {
  if (wholeWarps())
    return countRoutesByWarps(op);
  Value top = op.getTopExperts(), cc = op.getChunkCounts();
  int64_t experts = size(cc, 1), chunk = op.getChunk();
  int64_t routes = size(top, 0) * size(top, 1);
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  Value one = arith::ConstantIntOp::create(e.b, e.loc, 1, 64);
  // One thread a chunk: zero its row, then count its routes in order.
  forAllSpread(e.index(size(cc, 0)), [&](Value c) {
    e.loop(e.index(0), e.index(experts), [&](Value ex) {
      e.store(zero, cc, {c, ex});
    });
    forChunk(c, chunk, routes, [&](Value q) {
      Value ex = expertOf(top, q, experts);
      e.ifThen(e.isValid(ex), [&] {
        Value n = e.load(cc, {c, ex});
        e.store(arith::AddIOp::create(e.b, e.loc, n, one), cc, {c, ex});
      });
    });
  });
}

Value KernelLowering::shuffle64(Value v, int64_t offset,
                                gpu::ShuffleMode mode) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type(), i64 = b.getI64Type();
  Value off = arith::ConstantIntOp::create(b, loc, offset, 32);
  Value width = arith::ConstantIntOp::create(b, loc, 32, 32);
  Value shift = arith::ConstantIntOp::create(b, loc, 32, 64);
  Value lo = arith::TruncIOp::create(b, loc, i32, v);
  Value hi = arith::TruncIOp::create(b, loc, i32,
                                     arith::ShRUIOp::create(b, loc, v, shift));
  Value lo2 = gpu::ShuffleOp::create(b, loc, lo, off, width, mode).getResult(0);
  Value hi2 = gpu::ShuffleOp::create(b, loc, hi, off, width, mode).getResult(0);
  return arith::OrIOp::create(
      b, loc, arith::ExtUIOp::create(b, loc, i64, lo2),
      arith::ShLIOp::create(b, loc, arith::ExtUIOp::create(b, loc, i64, hi2),
                            shift));
}

Value KernelLowering::warpInclusiveSum(Value v, Value lane) {
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  for (int64_t d = 1; d < 32; d *= 2) {
    Value up = shuffle64(v, d, gpu::ShuffleMode::UP);
    Value take = e.cmp(arith::CmpIPredicate::sge, lane, e.index(d));
    v = arith::AddIOp::create(e.b, e.loc, v, e.select(take, up, zero));
  }
  return v;
}

KernelLowering::RouteRound
KernelLowering::routeRound(Value top, Value c, Value round, Value lane,
                           int64_t chunk, int64_t routes, int64_t experts) {
  Value j = e.add(e.mul(round, e.index(32)), lane);
  Value q = e.add(e.mul(c, e.index(chunk)), j);
  Value inside = arith::AndIOp::create(
      e.b, e.loc, e.cmp(arith::CmpIPredicate::slt, j, e.index(chunk)),
      e.cmp(arith::CmpIPredicate::slt, q, e.index(routes)));
  // Lanes past the chunk read the last route and drop it.
  Value read = arith::MinSIOp::create(e.b, e.loc, q, e.index(routes - 1));
  Value ex = e.select(inside, expertOf(top, read, experts), e.index(-1));
  Value peers = NVVM::MatchSyncOp::create(
      e.b, e.loc, e.b.getI32Type(),
      arith::ConstantIntOp::create(e.b, e.loc, -1, 32),
      arith::IndexCastOp::create(e.b, e.loc, e.b.getI32Type(), ex),
      NVVM::MatchSyncKind::any);
  Value below = arith::AndIOp::create(
      e.b, e.loc, peers,
      NVVM::LaneMaskLtOp::create(e.b, e.loc, e.b.getI32Type()));
  return {q, inside, ex, peers, below};
}

Value KernelLowering::groupFirst(const RouteRound &r, Value valid) {
  Value noneBelow = e.cmp(arith::CmpIPredicate::eq, r.below,
                          arith::ConstantIntOp::create(e.b, e.loc, 0, 32));
  if (!valid)
    valid = e.isValid(r.expert);
  return arith::AndIOp::create(e.b, e.loc, valid, noneBelow);
}

void KernelLowering::addGroupSize(Value first, const RouteRound &r, Value cc,
                                  Value c) {
  e.ifThen(first, [&] {
    Value n =
        arith::ExtUIOp::create(e.b, e.loc, e.b.getI64Type(), popc(r.peers));
    e.store(arith::AddIOp::create(e.b, e.loc, e.load(cc, {c, r.expert}), n), cc,
            {c, r.expert});
  });
}

/// One warp a chunk, 32 routes a round: match.sync groups the lanes whose
/// routes go to the same expert, and the group's first lane adds its size
/// to the chunk's counter. The counters hold the same integers as one
/// thread walking the chunk; only the order of the additions differs. On
/// the H200 one thread a chunk took 13 us of qwen3-30b's plan (32 routes
/// a thread, each a read-modify-write in memory after the last).
void KernelLowering::countRoutesByWarps(mk::CountRoutesOp op) {
  Value top = op.getTopExperts(), cc = op.getChunkCounts();
  int64_t experts = size(cc, 1), chunk = op.getChunk();
  int64_t routes = size(top, 0) * size(top, 1);
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  forAllWarps(e.index(size(cc, 0)), [&](Value c, Value lane) {
    e.loop(lane, e.index(experts), e.index(32), [&](Value ex) {
      e.store(zero, cc, {c, ex});
    });
    e.loop((chunk + 31) / 32, [&](Value round) {
      RouteRound r = routeRound(top, c, round, lane, chunk, routes, experts);
      Value first = groupFirst(r);
      // The row's zeros and the last round's additions, stored by other
      // lanes, are visible after the warp barrier.
      syncWarp();
      addGroupSize(first, r, cc, c);
    });
  });
}

void KernelLowering::lower(mk::ScanChunksOp op) {
  if (wholeWarps())
    return scanChunksByWarps(op);
  Value cc = op.getChunkCounts(), counts = op.getCounts();
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  // One thread an expert: exclusive prefix over the chunks, then the total.
  forAllSpread(e.index(size(cc, 1)), [&](Value ex) {
    Value total = e.fold(
        e.index(0), e.index(size(cc, 0)), zero, [&](Value c, Value running) {
          Value n = e.load(cc, {c, ex});
          e.store(running, cc, {c, ex});
          return arith::AddIOp::create(e.b, e.loc, running, n).getResult();
        });
    e.store(total, counts, {ex});
  });
}

/// Chunks a lane of the warp scan reads at once, at most.
static constexpr int64_t kScanGroup = 32;

/// The scan with one warp an expert (whole warps: a known block size that
/// is a multiple of 32): lane l takes chunks [l * per, (l + 1) * per), sums
/// them, an inclusive shuffle scan over the lanes gives each lane its
/// start, and a second pass writes the exclusive prefixes. The same sums
/// as the one-thread scan (integers). One thread walking 1024 chunks took
/// 45 us on the H200 (qwen3-30b); one warp over 2048 chunks, a chunk at a
/// time, 34 us (and 32 us on dsv3-shard, where one thread had 512 chunks
/// in 23 us); in groups of 8 loads, 21-22 us on both. A lane now issues up
/// to 32 loads at once, and with a single group (per <= 32) the second
/// pass reuses the values of the first.
void KernelLowering::scanChunksByWarps(mk::ScanChunksOp op) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value cc = op.getChunkCounts(), counts = op.getCounts();
  int64_t chunks = size(cc, 0), experts = size(cc, 1);
  int64_t per = (chunks + 31) / 32;
  const int64_t group = std::min(per, kScanGroup);
  const int64_t groups = (per + group - 1) / group;
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 64);
  forAllWarps(e.index(experts), [&](Value ex, Value lane) {
    Value first = arith::MinSIOp::create(b, loc, e.mul(lane, e.index(per)),
                                         e.index(chunks));
    Value end = arith::MinSIOp::create(b, loc, e.add(first, e.index(per)),
                                       e.index(chunks));
    // A group of a lane's chunks, all its loads issued before they are
    // used (unrolled; past `end`, chunk chunks - 1 is read and dropped).
    struct Group {
      SmallVector<Value> inside, at, values;
    };
    auto groupLoads = [&](Value g) {
      Group out;
      for (int64_t j = 0; j < group; ++j) {
        Value c = e.add(first, e.add(e.mul(g, e.index(group)), e.index(j)));
        out.inside.push_back(e.cmp(arith::CmpIPredicate::slt, c, end));
        out.at.push_back(c);
        Value read = arith::MinSIOp::create(b, loc, c, e.index(chunks - 1));
        out.values.push_back(e.load(cc, {read, ex}));
      }
      return out;
    };
    auto addGroup = [&](const Group &grp, Value acc, bool store) {
      for (int64_t j = 0; j < group; ++j) {
        if (store) {
          Value here = acc;
          e.ifThen(grp.inside[j], [&] { e.store(here, cc, {grp.at[j], ex}); });
        }
        acc = arith::AddIOp::create(
            b, loc, acc, e.select(grp.inside[j], grp.values[j], zero));
      }
      return acc;
    };
    std::optional<Group> only;
    Value local;
    if (groups == 1) {
      only = groupLoads(e.index(0));
      local = addGroup(*only, zero, /*store=*/false);
    } else {
      local =
          e.fold(e.index(0), e.index(groups), zero, [&](Value g, Value acc) {
            return addGroup(groupLoads(g), acc, /*store=*/false);
          });
    }
    Value inclusive = warpInclusiveSum(local, lane);
    Value start = arith::SubIOp::create(b, loc, inclusive, local);
    if (only)
      addGroup(*only, start, /*store=*/true);
    else
      e.fold(e.index(0), e.index(groups), start, [&](Value g, Value running) {
        return addGroup(groupLoads(g), running, /*store=*/true);
      });
    Value total = shuffle64(inclusive, 31, gpu::ShuffleMode::IDX);
    e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)),
             [&] { e.store(total, counts, {ex}); });
  });
}

void KernelLowering::lower(mk::PadOffsetsOp op) {
  if (wholeWarps())
    return padOffsetsByWarp(op);
  Value counts = op.getCounts(), offsets = op.getOffsets();
  int64_t experts = size(counts, 0), padding = op.getPadding();
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    Value pad = e.index(padding);
    Value total = e.fold(
        e.index(0), e.index(experts), e.index(0), [&](Value ex, Value start) {
          e.store(i64Of(start), offsets, {ex});
          Value c = e.toIndex(e.load(counts, {ex}));
          Value padded = e.mul(e.div(e.add(c, e.index(padding - 1)), pad), pad);
          return e.add(start, padded);
        });
    e.store(i64Of(total), offsets, {e.index(experts)});
  });
}

void KernelLowering::lower(mk::AssignRowsOp op) {
  if (wholeWarps())
    return assignRowsByWarps(op);
  Value top = op.getTopExperts(), offsets = op.getOffsets(),
        cc = op.getChunkCounts();
  Value routeRow = op.getRouteRow(), rowRoute = op.getRowRoute(),
        rowExpert = op.getRowExpert();
  int64_t experts = size(offsets, 0) - 1, chunk = op.getChunk();
  int64_t routes = size(routeRow, 0);
  Value none = arith::ConstantIntOp::create(e.b, e.loc, -1, 64);
  Value one = arith::ConstantIntOp::create(e.b, e.loc, 1, 64);
  // One thread a chunk walks its routes in order; chunk_counts holds the
  // rank of the chunk's next route to each expert.
  forAllSpread(e.index(size(cc, 0)), [&](Value c) {
    forChunk(c, chunk, routes, [&](Value q) {
      Value ex = expertOf(top, q, experts);
      e.ifThen(
          e.isValid(ex),
          [&] {
            Value rank = e.load(cc, {c, ex});
            e.store(arith::AddIOp::create(e.b, e.loc, rank, one), cc, {c, ex});
            Value row =
                arith::AddIOp::create(e.b, e.loc, e.load(offsets, {ex}), rank);
            e.store(row, routeRow, {q});
            e.store(i64Of(q), rowRoute, {e.toIndex(row)});
          },
          [&] { e.store(none, routeRow, {q}); });
    });
  });
  // One thread an expert labels its segment, padding rows included.
  forAllSpread(e.index(experts), [&](Value ex) {
    Value start = e.toIndex(e.load(offsets, {ex}));
    Value end = e.toIndex(e.load(offsets, {e.add(ex, e.index(1))}));
    e.loop(start, end, [&](Value r) { e.store(i64Of(ex), rowExpert, {r}); });
  });
}

/// The first warp of the grid: lane l takes experts [l * per, (l + 1) *
/// per), loads their counts at once, and a shuffle scan over the lanes of
/// their padded sizes gives each lane its first offset. One thread walking
/// the 128 experts of qwen3-30b took 11 us on the H200 (a load after each
/// store).
void KernelLowering::padOffsetsByWarp(mk::PadOffsetsOp op) {
  Value counts = op.getCounts(), offsets = op.getOffsets();
  int64_t experts = size(counts, 0), padding = op.getPadding();
  int64_t per = (experts + 31) / 32;
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  e.ifThen(e.cmp(arith::CmpIPredicate::slt, globalId, e.index(32)), [&] {
    Value lane = globalId;
    Value pad = e.index(padding);
    SmallVector<Value> inside, sizes;
    Value local = zero;
    for (int64_t j = 0; j < per; ++j) {
      Value ex = e.add(e.mul(lane, e.index(per)), e.index(j));
      inside.push_back(e.cmp(arith::CmpIPredicate::slt, ex, e.index(experts)));
      Value read = arith::MinSIOp::create(e.b, e.loc, ex, e.index(experts - 1));
      Value c = e.toIndex(e.load(counts, {read}));
      Value padded = e.mul(e.div(e.add(c, e.index(padding - 1)), pad), pad);
      sizes.push_back(e.select(inside.back(), i64Of(padded), zero));
      local = arith::AddIOp::create(e.b, e.loc, local, sizes.back());
    }
    Value inclusive = warpInclusiveSum(local, lane);
    Value running = arith::SubIOp::create(e.b, e.loc, inclusive, local);
    for (int64_t j = 0; j < per; ++j) {
      Value ex = e.add(e.mul(lane, e.index(per)), e.index(j));
      Value here = running;
      e.ifThen(inside[j], [&] { e.store(here, offsets, {ex}); });
      running = arith::AddIOp::create(e.b, e.loc, running, sizes[j]);
    }
    e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(31)),
             [&] { e.store(inclusive, offsets, {e.index(experts)}); });
  });
}

/// One warp a chunk, 32 routes a round: a route's rank in its expert is
/// the chunk's scanned count, plus the routes of its match.sync group on
/// lower lanes; with several rounds the group's first lane then moves the
/// chunk's count on. The same rows as one thread walking the chunk (route
/// order within each expert). One warp an expert labels its segment.
/// On the H200 one thread a chunk took 27 us of qwen3-30b's plan.
void KernelLowering::assignRowsByWarps(mk::AssignRowsOp op) {
  Value top = op.getTopExperts(), offsets = op.getOffsets(),
        cc = op.getChunkCounts();
  Value routeRow = op.getRouteRow(), rowRoute = op.getRowRoute(),
        rowExpert = op.getRowExpert();
  int64_t experts = size(offsets, 0) - 1, chunk = op.getChunk();
  int64_t routes = size(routeRow, 0);
  int64_t rounds = (chunk + 31) / 32;
  Type i32 = e.b.getI32Type(), i64 = e.b.getI64Type();
  Value none = arith::ConstantIntOp::create(e.b, e.loc, -1, 64);
  forAllWarps(e.index(size(cc, 0)), [&](Value c, Value lane) {
    e.loop(rounds, [&](Value round) {
      RouteRound r = routeRound(top, c, round, lane, chunk, routes, experts);
      Value valid = e.isValid(r.expert);
      Value rank = arith::ExtUIOp::create(e.b, e.loc, i64, popc(r.below));
      e.ifThen(r.inside, [&] {
        e.ifThen(
            valid,
            [&] {
              Value row = arith::AddIOp::create(
                  e.b, e.loc,
                  arith::AddIOp::create(e.b, e.loc, e.load(offsets, {r.expert}),
                                        e.load(cc, {c, r.expert})),
                  rank);
              e.store(row, routeRow, {r.q});
              e.store(i64Of(r.q), rowRoute, {e.toIndex(row)});
            },
            [&] { e.store(none, routeRow, {r.q}); });
      });
      if (rounds == 1)
        return;
      // Every lane has read the chunk's count before the group's first
      // lane moves it on for the next round, and the next round reads it
      // after.
      syncWarp();
      addGroupSize(groupFirst(r, valid), r, cc, c);
      syncWarp();
    });
  });
  forAllWarps(e.index(experts), [&](Value ex, Value lane) {
    Value start = e.toIndex(e.load(offsets, {ex}));
    Value end = e.toIndex(e.load(offsets, {e.add(ex, e.index(1))}));
    e.loop(e.add(start, lane), end, e.index(32),
           [&](Value row) { e.store(i64Of(ex), rowExpert, {row}); });
  });
}

void KernelLowering::lower(mk::GatherOp op) {
  // Rows of 8 bf16 multiples are copied 16 bytes at a time when every
  // buffer is 16-byte aligned (the same bits either way; scaled, the same
  // rounding of w * x per element).
  if (size(op.getX(), 1) % 8)
    return gatherScalar(op);
  e.ifThen(
      aligned16({op.getX(), op.getRoutedX()}),
      [&] {
        if (op.getScale())
          gatherScaledVector(op);
        else
          gatherVector(op);
      },
      [&] { gatherScalar(op); });
}

void KernelLowering::gatherScalar(mk::GatherOp op) {
  Value x = op.getX(), rowRoute = op.getRowRoute(), out = op.getRoutedX();
  Value k = e.index(op.getTopK());
  forAll2(routedRows(op.getOffsets()), size(out, 1), [&](Value r, Value j) {
    Value route = e.toIndex(e.load(rowRoute, {r}));
    Value v = e.ifValue(
        e.isValid(route),
        [&] {
          Value t = e.div(route, k);
          Value v = e.loadF32(x, {t, j});
          if (Value w = op.getScale())
            v = e.mul(e.load(w, {t, e.rem(route, k)}), v);
          return v;
        },
        [&] { return e.f32(0.0f); });
    e.storeRounded(v, out, {r, j});
  });
}

void KernelLowering::gatherVector(mk::GatherOp op) {
  // A thread copies `per` 16-byte pieces of a row, c, c + G, c + 2G, ...
  // (G = pieces / per, the threads of a row): all loads first, then all
  // stores, so that several loads are in flight (the compiler may not move
  // a load above a store to another buffer it cannot tell apart), and each
  // load or store instruction of a warp covers consecutive pieces. (With
  // each thread's pieces adjacent instead, a warp's instruction touched 32
  // pieces 16 * per bytes apart: at 16 pieces a thread the dsv3-shard
  // dispatch copy took 0.61 ms, at 4 0.31 ms.)
  Value rowRoute = op.getRowRoute();
  Value k = e.index(op.getTopK());
  int64_t h = size(op.getX(), 1);
  int64_t pieces = h / 8, per = gatherPiecesOf(pieces);
  Value xBase = base(op.getX()), outBase = base(op.getRoutedX());
  auto v4 = VectorType::get({4}, e.b.getI32Type());
  Value zero = arith::ConstantOp::create(
      e.b, e.loc, v4, DenseElementsAttr::get(v4, int32_t(0)));
  int64_t stride = 8 * (pieces / per); // elements between a thread's pieces
  forAll2(routedRows(op.getOffsets()), pieces / per, [&](Value r, Value c) {
    Value col = e.mul(c, e.index(8));
    Value route = e.toIndex(e.load(rowRoute, {r}));
    Value valid = e.isValid(route);
    // Padding rows (no route) read row 0 of x and store zeros instead.
    Value token = e.select(valid, e.div(route, k), e.index(0));
    Value src = e.add(e.mul(token, e.index(h)), col);
    Value dst = e.add(e.mul(r, e.index(h)), col);
    SmallVector<Value> values;
    for (int64_t i = 0; i < per; ++i)
      values.push_back(e.select(
          valid, load16(v4, at(xBase, e.add(src, e.index(stride * i)))), zero));
    for (int64_t i = 0; i < per; ++i)
      store16Streaming(values[i], at(outBase, e.add(dst, e.index(stride * i))));
  });
}

void KernelLowering::gatherScaledVector(mk::GatherOp op) {
  // gatherVector's shape (`per` 16-byte pieces of a row a thread, G apart,
  // all loads first), then bf16(w * x) per element; padding rows store
  // zeros. One piece a thread took the dsv3-shard reverse combine 0.69 ms
  // on the H200 (a route, a weight and one load in flight per thread); four
  // adjacent ones 0.36 ms, sixteen adjacent ones 0.60 ms.
  Value rowRoute = op.getRowRoute(), w = op.getScale();
  Value k = e.index(op.getTopK());
  int64_t h = size(op.getX(), 1);
  int64_t pieces = h / 8, per = gatherPiecesOf(pieces);
  Value xBase = base(op.getX()), outBase = base(op.getRoutedX());
  auto v8 = VectorType::get({8}, e.b.getBF16Type());
  int64_t stride = 8 * (pieces / per);
  forAll2(routedRows(op.getOffsets()), pieces / per, [&](Value r, Value c) {
    Value col = e.mul(c, e.index(8));
    Value route = e.toIndex(e.load(rowRoute, {r}));
    Value valid = e.isValid(route);
    Value q = e.select(valid, route, e.index(0));
    Value t = e.div(q, k);
    Value scale = e.select(valid, e.load(w, {t, e.rem(q, k)}), e.f32(0.0f));
    Value src = e.add(e.mul(t, e.index(h)), col);
    Value dst = e.add(e.mul(r, e.index(h)), col);
    SmallVector<Value> loaded;
    for (int64_t i = 0; i < per; ++i)
      loaded.push_back(load16(v8, at(xBase, e.add(src, e.index(stride * i)))));
    for (int64_t i = 0; i < per; ++i) {
      SmallVector<Value> xs = unpack8(loaded[i]);
      // (Padding rows: zeros, whatever row 0 of x holds.)
      for (Value &x : xs)
        x = e.select(valid, e.mul(scale, x), e.f32(0.0f));
      store16Streaming(pack8(xs), at(outBase, e.add(dst, e.index(stride * i))));
    }
  });
}

void KernelLowering::lower(mk::GemmOp op) {
  if (op.usesTensorCores())
    lowerTensorCores(op);
  else
    lowerSimt(op);
}

void KernelLowering::lowerSimt(mk::GemmOp op) {
  Value a = op.getA(), out = op.getOut();
  ValueRange bs = op.getB();
  bool ta = op.getTransposeA(), tb = op.getTransposeB();
  int64_t k = size(a, ta ? 0 : 1);
  // A(r, j) and B(c, j) in either operand form.
  auto aAt = [&](Value src, Value r, Value j) {
    return ta ? e.loadF32(src, {j, r}) : e.loadF32(src, {r, j});
  };
  auto bAt = [&](Value w, ArrayRef<Value> prefix, Value c, Value j) {
    SmallVector<Value> idx(prefix);
    if (tb)
      idx.append({j, c});
    else
      idx.append({c, j});
    return e.loadF32(w, idx);
  };
  // Weight gradients: out[g] sums over group g's K range, in k order.
  if (Value kOffsets = op.getKOffsets()) {
    int64_t m = size(out, 1), n = size(out, 2);
    Value mm = e.index(m);
    forAll2(e.index(size(out, 0) * m), n, [&](Value gr, Value c) {
      Value g = e.div(gr, mm), r = e.rem(gr, mm);
      Value begin = e.toIndex(e.load(kOffsets, {g}));
      Value end = e.toIndex(e.load(kOffsets, {e.add(g, e.index(1))}));
      if (Value counts = op.getKCounts()) // the rows past it add zeros
        end = arith::MinSIOp::create(
            e.b, e.loc, end, e.add(begin, e.toIndex(e.load(counts, {g}))));
      Value acc = e.sum(begin, end, [&](Value j) {
        return e.mul(aAt(a, r, j), bAt(bs[0], {}, c, j));
      });
      if (op.getAccumulate()) // out += acc (f32)
        acc = e.add(e.load(out, {g, r, c}), acc);
      e.storeRounded(acc, out, {g, r, c});
    });
    return;
  }
  int64_t n = size(out, 1);
  Value rows = op.isGrouped() ? routedRows(op.getOffsets())
                              : e.index(size(a, ta ? 1 : 0));
  Limit limit = getLimit(op.getSwigluLimitAttr());
  bool swigluEpilogue = op.getEpilogue() == mk::Epilogue::swiglu;
  forAll2(rows, n, [&](Value r, Value c) {
    // Grouped: the row's expert (padding rows have their segment's: their
    // A row is zero, so they compute zeros, as on the CPU).
    SmallVector<Value> prefix;
    if (op.isGrouped())
      prefix.push_back(e.toIndex(e.load(op.getRowExpert(), {r})));
    auto dot = [&](Value src, Value w, Value init) {
      return e.fold(e.index(0), e.index(k), init, [&](Value j, Value acc) {
        return e.add(acc, e.mul(aAt(src, r, j), bAt(w, prefix, c, j)));
      });
    };
    if (swigluEpilogue) {
      Value g = e.roundBF16(dot(a, bs[0], e.f32(0.0f)));
      Value u = e.roundBF16(dot(a, bs[1], e.f32(0.0f)));
      if (!op.getSaves().empty()) {
        e.storeRounded(g, op.getSaves()[0], {r, c});
        e.storeRounded(u, op.getSaves()[1], {r, c});
      }
      e.storeRounded(swiglu(e, g, u, limit, sigmoidFor(limit)), out, {r, c});
      return;
    }
    // concat: one accumulator over both K-loops.
    Value v = dot(a, bs[0], e.f32(0.0f));
    if (Value a2 = op.getA2())
      v = dot(a2, bs[1], v);
    if (op.getAccumulate()) // out += v (f32)
      v = e.add(e.load(out, {r, c}), v);
    e.storeRounded(v, out, {r, c});
  });
}

void KernelLowering::lowerTensorCores(mk::GemmOp op) {
  Value out = op.getOut();
  ArrayRef<int64_t> slots = *op.getMaps();
  Limit limit = getLimit(op.getSwigluLimitAttr());
  bool ta = op.getTransposeA();
  Value kOffsets = op.getKOffsets();
  // K in groups: out [E, M, N] as [E * M, N] rows.
  int64_t groupRows = kOffsets ? size(out, 1) : 0;
  Value rows = op.isGrouped() ? routedRows(op.getOffsets())
               : kOffsets     ? e.index(size(out, 0) * groupRows)
                              : e.index(size(op.getA(), ta ? 1 : 0));
  // The output element of (flattened) row `row`.
  auto outAt = [&](Value row, Value col) -> SmallVector<Value> {
    if (!kOffsets)
      return {row, col};
    Value m = e.index(groupRows);
    return {e.div(row, m), e.rem(row, m), col};
  };
  // An m-tile lies in one expert's segment (segments are whole multiples of
  // the padding, itself a multiple of the tile): its first row's expert.
  auto expertOf = [&](Value m0) {
    return e.toIndex(e.load(op.getRowExpert(), {m0}));
  };
  ValueRange saves = op.getSaves();
  auto storeSwiglu = [&](Value row, Value col, Value g, Value u) {
    // gate and up are each rounded to bf16, then the SwiGLU in f32.
    e.storeRounded(
        swiglu(e, e.roundBF16(g), e.roundBF16(u), limit, sigmoidFor(limit)),
        out, {row, col});
    if (!saves.empty()) { // the activation's inputs, as rounded
      e.storeRounded(g, saves[0], {row, col});
      e.storeRounded(u, saves[1], {row, col});
    }
  };
  bool accumulate = op.getAccumulate();
  // Two adjacent columns at once: one 4-byte store of both bf16 values
  // when the buffer is 4-byte aligned (uniform; the runtime's workspace
  // is), else the two scalar stores. The same rounding either way.
  int64_t n = size(out, kOffsets ? 2 : 1);
  Value outBase = base(out);
  Value aligned4 = aligned({out}, 4);
  // Two results rounded to bf16, packed (col's first).
  auto packTwo = [&](Value v0, Value v1) -> Value {
    Type bf16 = e.b.getBF16Type();
    Value packed =
        LLVM::UndefOp::create(e.b, e.loc, VectorType::get({2}, bf16));
    Value values[2] = {v0, v1};
    for (int64_t i = 0; i < 2; ++i)
      packed = LLVM::InsertElementOp::create(
          e.b, e.loc, packed,
          arith::TruncFOp::create(e.b, e.loc, bf16, values[i]),
          arith::ConstantIntOp::create(e.b, e.loc, i, 32));
    return packed;
  };
  auto word = [&](Value packed) -> Value {
    return LLVM::BitcastOp::create(e.b, e.loc, e.b.getI32Type(), packed);
  };
  auto storeTwoIn = [&](Value buffer, Value bufferBase, Value bufferAligned4,
                        Value row, Value col, Value v0, Value v1) {
    e.ifThen(
        bufferAligned4,
        [&] {
          Value packed = packTwo(v0, v1);
          // A streaming store (.cs: evict-first in L1 and L2): the GEMM
          // outputs (hundreds of MB on the benchmark shapes) are read
          // once, by the next phase, long after; keeping them out of L2's
          // way of the re-read A and weight tiles made dsv3-shard 2 %
          // faster on the H200. (The staged epilogue's 16-byte stores,
          // Hopper.cpp, are the same kind; this pair store is its
          // fallback for unaligned outputs.)
          Value ptr = at(bufferBase, e.add(e.mul(row, e.index(n)), col));
          Value address =
              LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr);
          gemm::storeGlobalStreaming(e.b, e.loc, address, {word(packed)});
        },
        [&] {
          e.storeRounded(v0, buffer, outAt(row, col));
          e.storeRounded(v1, buffer, outAt(row, e.add(col, e.index(1))));
        });
  };
  auto storeTwo = [&](Value row, Value col, Value v0, Value v1) {
    storeTwoIn(out, outBase, aligned4, row, col, v0, v1);
  };
  // saves: the gate and up pairs, rounded to bf16, to their buffers.
  SmallVector<std::pair<Value, Value>> saveBases;
  for (Value v : saves)
    saveBases.push_back({base(v), aligned({v}, 4)});
  // The SwiGLU of element i of a column pair: gate and up each rounded to
  // bf16, then the SwiGLU in f32.
  auto act = [&](ArrayRef<Value> g, ArrayRef<Value> u, int i) {
    return swiglu(e, e.roundBF16(g[i]), e.roundBF16(u[i]), limit,
                  sigmoidFor(limit));
  };
  auto pairSwiglu = [&](Value row, Value col, ArrayRef<Value> g,
                        ArrayRef<Value> u) {
    // (The second element first: the order the H200-verified kernels
    // were emitted in.)
    Value a1 = act(g, u, 1);
    storeTwo(row, col, act(g, u, 0), a1);
    if (!saves.empty()) {
      storeTwoIn(saves[0], saveBases[0].first, saveBases[0].second, row, col,
                 g[0], g[1]);
      storeTwoIn(saves[1], saveBases[1].first, saveBases[1].second, row, col,
                 u[0], u[1]);
    }
  };
  bool f32Out = cast<MemRefType>(out.getType()).getElementType().isF32();
  Value aligned8 = f32Out ? aligned({out}, 8) : Value();
  auto pairPlain = [&](Value row, Value col, ArrayRef<Value> y,
                       ArrayRef<Value>) {
    if (f32Out) { // the fp32 accumulators as they are
      // One 8-byte streaming store of the pair when out is 8-byte aligned
      // (col is even): a warp store then writes whole 32-byte sectors of
      // eight rows, where two 4-byte stores each wrote half of every
      // sector. (k_groups: row is the flattened [E * M] row, which is how
      // out's rows lie in memory.)
      e.ifThen(
          aligned8,
          [&] {
            Value ptr = at(outBase, e.add(e.mul(row, e.index(n)), col),
                           /*elementBytes=*/4);
            Value address =
                LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr);
            SmallVector<Value> words;
            for (Value v : y.take_front(2))
              words.push_back(
                  LLVM::BitcastOp::create(e.b, e.loc, e.b.getI32Type(), v));
            gemm::storeGlobalStreaming(e.b, e.loc, address, words);
          },
          [&] {
            for (int64_t i = 0; i < 2; ++i)
              e.store(y[i], out, outAt(row, i ? e.add(col, e.index(1)) : col));
          });
      return;
    }
    storeTwo(row, col, y[0], y[1]);
  };
  // accumulate (f32 out): the pair added to out's by reductions in L2
  // (red.global.add.f32): nothing is loaded into the SM, so the epilogue
  // does not wait on memory. Each element gets exactly one addition per
  // kernel, so the sums are a load-add-store's, bit for bit (but for
  // subnormals, which red's f32 add flushes to zero). One 8-byte
  // reduction of the pair when out is 8-byte aligned (pairReduce8, chosen
  // once a tile by the register epilogue), else two 4-byte ones.
  auto reduceAt = [&](Value row, Value col, ValueRange y) {
    Value ptr = at(outBase, e.add(e.mul(row, e.index(n)), col),
                   /*elementBytes=*/4);
    gemm::reduceAddGlobalF32(
        e.b, e.loc, LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr),
        y);
  };
  // One result (the shared-memory epilogue's): stored rounded, or with
  // accumulate added to out's by a reduction.
  auto storePlain = [&](Value row, Value col, Value y, Value) {
    if (accumulate)
      return reduceAt(row, col, y);
    e.storeRounded(y, out, outAt(row, col));
  };
  auto pairReduce8 = [&](Value row, Value col, ArrayRef<Value> y,
                         ArrayRef<Value>) {
    reduceAt(row, col, y.take_front(2));
  };
  auto pairReduce4 = [&](Value row, Value col, ArrayRef<Value> y,
                         ArrayRef<Value>) {
    reduceAt(row, col, y[0]);
    reduceAt(row, e.add(col, e.index(1)), y[1]);
  };
  // The same pairs rounded and packed (the staged epilogue's).
  auto packSwiglu = [&](ArrayRef<Value> g, ArrayRef<Value> u) -> Value {
    Value a1 = act(g, u, 1);
    return word(packTwo(act(g, u, 0), a1));
  };
  auto packPlain = [&](ArrayRef<Value> y, ArrayRef<Value>) -> Value {
    return word(packTwo(y[0], y[1]));
  };
  // saves: the gate and the up pairs as they are (rounded to bf16).
  auto packGate = [&](ArrayRef<Value> g, ArrayRef<Value>) -> Value {
    return word(packTwo(g[0], g[1]));
  };
  auto packUp = [&](ArrayRef<Value>, ArrayRef<Value> u) -> Value {
    return word(packTwo(u[0], u[1]));
  };
  using PairFn =
      function_ref<void(Value, Value, ArrayRef<Value>, ArrayRef<Value>)>;
  bool swigluEpilogue = op.getEpilogue() == mk::Epilogue::swiglu;
  bool concat = static_cast<bool>(op.getA2());
  gemm::GemmPhase phase{
      slots[0], slots[1],
      swigluEpilogue ? std::optional<int64_t>(slots[2]) : std::nullopt,
      // (Transposed A: K rows past the matrix read as zeros: whole k-tiles.)
      concat ? 2 * size(op.getA(), 1)
      : ta   ? (size(op.getA(), 0) + sched::kTileK - 1) / sched::kTileK *
                 sched::kTileK
           : size(op.getA(), 1),
      n, rows, op.isGrouped() ? function_ref<Value(Value)>(expertOf) : nullptr,
      swigluEpilogue
          ? function_ref<void(Value, Value, Value, Value)>(storeSwiglu)
          : function_ref<void(Value, Value, Value, Value)>(storePlain),
      n % 2            ? PairFn()
      : swigluEpilogue ? PairFn(pairSwiglu)
      : accumulate     ? PairFn(pairReduce4)
                       : PairFn(pairPlain),
      (*op.getTile())[1], (*op.getTile())[0]};
  phase.gridBarrierFollows = beforeGridBarrier.contains(op);
  phase.paddingRows = op.getPaddingRows();
  phase.transposeB = op.getTransposeB();
  phase.transposeA = ta;
  if (kOffsets) {
    phase.kOffsets = kOffsets;
    phase.kCounts = op.getKCounts();
    phase.groupRows = groupRows;
    phase.k = 0;
  }
  if (concat) { // maps = [a, b_0, b_1, a2]
    phase.b2 = slots[2];
    phase.a2 = slots[3];
    phase.kSplit = size(op.getA(), 1) / sched::kTileK;
  }
  if (accumulate && !(n % 2)) {
    phase.storePairAligned = pairReduce8;
    phase.pairsAligned = aligned8;
  }
  if (n % 8 == 0 && !f32Out) {
    phase.packPair =
        swigluEpilogue
            ? function_ref<Value(ArrayRef<Value>, ArrayRef<Value>)>(packSwiglu)
            : function_ref<Value(ArrayRef<Value>, ArrayRef<Value>)>(packPlain);
    phase.outAddress = outBase;
    SmallVector<Value> staged = {out};
    if (!saves.empty()) { // gate and up staged after the activation
      phase.alsoStaged.push_back({packGate, saveBases[0].first});
      phase.alsoStaged.push_back({packUp, saveBases[1].first});
      staged.append(saves.begin(), saves.end());
    }
    phase.outAligned16 = aligned(staged, 16);
  }
  if (Value rows = op.getGatherRows()) {
    phase.gatherRows = rows;
    phase.gatherSource = base(op.getA());
    phase.gatherTopK = *op.getGatherTopK();
  }
  gemm->emit(phase);
}

void KernelLowering::lower(mk::CombineOp op) {
  if (size(op.getOut(), 1) % 8)
    return combineScalar(op);
  SmallVector<Value> buffers = {op.getRoutedY(), op.getOut()};
  if (Value shared = op.getSharedOut())
    buffers.push_back(shared);
  e.ifThen(
      aligned16(buffers), [&] { combineVector(op); },
      [&] { combineScalar(op); });
}

void KernelLowering::combineScalar(mk::CombineOp op) {
  Value out = op.getOut(), w = op.getRouterWeights(), y = op.getRoutedY();
  Value routeRow = op.getRouteRow(), shared = op.getSharedOut();
  Value k = e.index(topKOf(op));
  forAll2(e.index(size(out, 0)), size(out, 1), [&](Value t, Value j) {
    Value init = shared ? e.loadF32(shared, {t, j}) : e.f32(0.0f);
    Value acc = e.fold(e.index(0), k, init, [&](Value kk, Value acc) {
      Value row = e.toIndex(e.load(routeRow, {e.add(e.mul(t, k), kk)}));
      Value term = e.ifValue(
          e.isValid(row),
          [&] {
            Value v = e.loadF32(y, {row, j});
            return w ? e.mul(e.load(w, {t, kk}), v) : v;
          },
          [&] { return e.f32(0.0f); });
      return e.add(acc, term);
    });
    e.storeRounded(acc, out, {t, j});
  });
}

void KernelLowering::combineVector(mk::CombineOp op) {
  // The scalar combine, 8 columns a thread: the same operations in the same
  // order per element (a route without a row adds +0.0), with 16-byte
  // loads and stores. Straight-line over the k routes, with selects instead
  // of branches, so that all the row loads are in flight at once; a route
  // without a row loads row 0 and selects the value away.
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value w = op.getRouterWeights(), routeRow = op.getRouteRow();
  Value shared = op.getSharedOut();
  int64_t h = size(op.getOut(), 1), topK = topKOf(op);
  Value yBase = base(op.getRoutedY()), outBase = base(op.getOut());
  Value sharedBase = shared ? base(shared) : Value();
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  auto v8 = VectorType::get({8}, bf16);
  auto unpack = [&](Value vec) {
    SmallVector<Value> xs;
    for (int64_t i = 0; i < 8; ++i) {
      Value lane = arith::ConstantIntOp::create(b, loc, i, 32);
      Value x = LLVM::ExtractElementOp::create(b, loc, vec, lane);
      xs.push_back(arith::ExtFOp::create(b, loc, f32, x));
    }
    return xs;
  };
  // One item: token t's 8 columns from 8 * c8, its loads issued.
  struct Item {
    Value offset;
    SmallVector<Value> valid, weights, loaded;
    Value shared;
  };
  Value cols = e.index(h / 8);
  auto issue = [&](Value i) {
    Item it;
    Value t = e.div(i, cols);
    Value col = e.mul(e.rem(i, cols), e.index(8));
    it.offset = e.add(e.mul(t, e.index(h)), col);
    SmallVector<Value> rows;
    for (int64_t kk = 0; kk < topK; ++kk) {
      Value row = e.toIndex(
          e.load(routeRow, {e.add(e.mul(t, e.index(topK)), e.index(kk))}));
      it.valid.push_back(e.isValid(row));
      rows.push_back(e.select(it.valid.back(), row, e.index(0)));
      if (w)
        it.weights.push_back(e.load(w, {t, e.index(kk)}));
    }
    for (int64_t kk = 0; kk < topK; ++kk)
      it.loaded.push_back(
          load16(v8, at(yBase, e.add(e.mul(rows[kk], e.index(h)), col))));
    if (shared)
      it.shared = load16(v8, at(sharedBase, it.offset));
    return it;
  };
  auto finish = [&](const Item &it) {
    SmallVector<Value> acc =
        shared ? unpack(it.shared) : SmallVector<Value>(8, e.f32(0.0f));
    for (int64_t kk = 0; kk < topK; ++kk) {
      SmallVector<Value> ys = unpack(it.loaded[kk]);
      for (int64_t i = 0; i < 8; ++i) {
        Value y = w ? e.mul(it.weights[kk], ys[i]) : ys[i];
        Value term = e.select(it.valid[kk], y, e.f32(0.0f));
        acc[i] = e.add(acc[i], term);
      }
    }
    Value packed = LLVM::UndefOp::create(b, loc, v8);
    for (int64_t i = 0; i < 8; ++i) {
      Value lane = arith::ConstantIntOp::create(b, loc, i, 32);
      Value r = arith::TruncFOp::create(b, loc, bf16, acc[i]);
      packed = LLVM::InsertElementOp::create(b, loc, packed, r, lane);
    }
    store16(packed, at(outBase, it.offset));
  };
  // combineItems items a thread per iteration (i, i + G, ...; G the grid's
  // threads), all their loads issued before any item is summed and stored:
  // an item's loads wait on its route rows, then on the routed rows, and
  // the stores keep LLVM from moving the next iteration's loads up. An
  // item past the end loads the last item again and stores nothing.
  Value n = e.mul(e.index(size(op.getOut(), 0)), cols);
  Value last = e.sub(n, e.index(1));
  e.loop(globalId, n, e.mul(gridThreads, e.index(combineItems)), [&](Value i) {
    SmallVector<Value> items = {i};
    for (int64_t u = 1; u < combineItems; ++u)
      items.push_back(e.add(i, e.mul(gridThreads, e.index(u))));
    SmallVector<Item> issued;
    for (Value item : items)
      issued.push_back(
          issue(arith::MinSIOp::create(b, loc, item, last).getResult()));
    finish(issued[0]);
    for (int64_t u = 1; u < combineItems; ++u)
      e.ifThen(e.cmp(arith::CmpIPredicate::slt, items[u], n),
               [&] { finish(issued[u]); });
  });
}

void KernelLowering::lower(mk::SwigluGradOp op) {
  // 8 columns a lane (16-byte accesses) when the rows are whole 16-byte
  // pieces and every buffer is aligned; else one column a lane.
  if (size(op.getDHiddenU(), 1) % 8 == 0) {
    SmallVector<Value> buffers = {op.getDHiddenU(), op.getGate(), op.getUp(),
                                  op.getDGate(), op.getDUp()};
    if (op.getRowRoute())
      buffers.push_back(op.getHidden());
    e.ifThen(
        aligned16(buffers), [&] { swigluGradVector(op); },
        [&] { swigluGradScalar(op); });
    return;
  }
  swigluGradScalar(op);
}

void KernelLowering::swigluGradRows(
    mk::SwigluGradOp op, function_ref<Value(Value, Value, Value, Value)> row) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value dh = op.getDHiddenU(), rowRoute = op.getRowRoute();
  Value w = op.getRouterWeights(), dw = op.getDRouterWeights();
  bool routed = static_cast<bool>(rowRoute);
  Value rows = routed ? routedRows(op.getOffsets()) : e.index(size(dh, 0));
  Value k = routed ? e.index(size(w, 1)) : Value();
  // One warp a row, warps spread over the blocks first.
  Value width = arith::ConstantIntOp::create(b, loc, 32, 32);
  forAllWarps(rows, [&](Value r, Value lane) {
    Value valid, t, kk, scale = e.f32(1.0f);
    if (routed) {
      Value q = e.toIndex(e.load(rowRoute, {r}));
      valid = e.isValid(q);
      Value route = e.select(valid, q, e.index(0));
      t = e.div(route, k);
      kk = e.rem(route, k);
      scale = e.select(valid, e.load(w, {t, kk}), e.f32(0.0f));
    }
    Value partial = row(r, lane, valid, scale);
    if (!routed)
      return;
    // The row sum: a fixed butterfly over the lanes.
    for (int64_t d = 16; d >= 1; d /= 2) {
      Value off = arith::ConstantIntOp::create(b, loc, d, 32);
      Value other = gpu::ShuffleOp::create(b, loc, partial, off, width,
                                           gpu::ShuffleMode::XOR)
                        .getResult(0);
      partial = e.add(partial, other);
    }
    Value first = e.cmp(arith::CmpIPredicate::eq, lane, e.index(0));
    e.ifThen(arith::AndIOp::create(b, loc, first, valid), [&] {
      e.store(partial, dw, {t, kk});
    });
  });
  if (!routed)
    return;
  // Routes without a row: a zero gradient.
  Value routeRow = op.getRouteRow();
  forAll(e.index(size(routeRow, 0)), [&](Value q) {
    e.ifThen(e.cmp(arith::CmpIPredicate::slt, e.toIndex(e.load(routeRow, {q})),
                   e.index(0)),
             [&] {
               e.store(e.f32(0.0f), dw, {e.div(q, k), e.rem(q, k)});
             });
  });
}

void KernelLowering::swigluGradScalar(mk::SwigluGradOp op) {
  Value dh = op.getDHiddenU(), gate = op.getGate(), up = op.getUp();
  Value hidden = op.getHidden();
  bool routed = static_cast<bool>(op.getRowRoute());
  int64_t cols = size(dh, 1);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  swigluGradRows(op, [&](Value r, Value lane, Value valid, Value scale) {
    return e.fold(
        lane, e.index(cols), e.index(32), e.f32(0.0f), [&](Value i, Value acc) {
          Value dhU = e.loadF32(dh, {r, i});
          auto [dg, du] = swigluGrad(
              e, e.roundBF16(e.mul(scale, dhU)), e.loadF32(gate, {r, i}),
              e.loadF32(up, {r, i}), limit, sigmoidFor(limit));
          if (routed) { // padding rows: zeros, whatever gate and up hold
            dg = e.select(valid, dg, e.f32(0.0f));
            du = e.select(valid, du, e.f32(0.0f));
          }
          e.storeRounded(dg, op.getDGate(), {r, i});
          e.storeRounded(du, op.getDUp(), {r, i});
          return routed ? e.add(acc, e.mul(dhU, e.loadF32(hidden, {r, i})))
                        : acc;
        });
  });
}

void KernelLowering::swigluGradVector(mk::SwigluGradOp op) {
  // The scalar form's arithmetic, 8 columns a lane: 16-byte loads and
  // stores (d_hidden_u's 8 floats in two), the lane's partial of d_w
  // summed in column order within each piece. A lane loads `per` pieces
  // (c, c + 32, ...) before it computes any, so that several are in flight;
  // its partial still sums them in the order c, c + 32, ...
  bool routed = static_cast<bool>(op.getRowRoute());
  int64_t cols = size(op.getDHiddenU(), 1), pieces = cols / 8;
  int64_t per = std::min<int64_t>(rowPieces, (pieces + 31) / 32);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  Value dhBase = base(op.getDHiddenU()), gBase = base(op.getGate());
  Value uBase = base(op.getUp()), hBase = base(op.getHidden());
  Value dgBase = base(op.getDGate()), duBase = base(op.getDUp());
  auto v8 = VectorType::get({8}, e.b.getBF16Type());
  auto f4 = VectorType::get({4}, e.b.getF32Type());
  struct Piece {
    Value at0, inRange;
    SmallVector<Value, 2> dh;
    Value g, u, h;
  };
  swigluGradRows(op, [&](Value r, Value lane, Value valid, Value scale) {
    return e.fold(
        lane, e.index(pieces), e.index(32 * per), e.f32(0.0f),
        [&](Value c0, Value acc) {
          // Loads of every piece first (a piece past the row's end loads
          // the last piece again and is not used).
          SmallVector<Piece> loaded;
          for (int64_t i = 0; i < per; ++i) {
            Piece p;
            Value c = e.add(c0, e.index(32 * i));
            p.inRange = e.cmp(arith::CmpIPredicate::slt, c, e.index(pieces));
            c = arith::MinSIOp::create(e.b, e.loc, c, e.index(pieces - 1));
            p.at0 = e.add(e.mul(r, e.index(cols)), e.mul(c, e.index(8)));
            for (int64_t half = 0; half < 2; ++half)
              p.dh.push_back(
                  load16(f4, at(dhBase, e.add(p.at0, e.index(4 * half)), 4)));
            p.g = load16(v8, at(gBase, p.at0));
            p.u = load16(v8, at(uBase, p.at0));
            if (routed)
              p.h = load16(v8, at(hBase, p.at0));
            loaded.push_back(p);
          }
          for (const Piece &p : loaded) {
            SmallVector<Value> dhU;
            for (Value v : p.dh)
              for (int64_t i = 0; i < 4; ++i)
                dhU.push_back(LLVM::ExtractElementOp::create(
                    e.b, e.loc, v,
                    arith::ConstantIntOp::create(e.b, e.loc, i, 32)));
            SmallVector<Value> g = unpack8(p.g), u = unpack8(p.u), h;
            if (routed)
              h = unpack8(p.h);
            SmallVector<Value> dgs, dus;
            Value partial = acc;
            for (int64_t i = 0; i < 8; ++i) {
              auto [dg, du] = swigluGrad(e, e.roundBF16(e.mul(scale, dhU[i])),
                                         g[i], u[i], limit, sigmoidFor(limit));
              if (routed) {
                dg = e.select(valid, dg, e.f32(0.0f));
                du = e.select(valid, du, e.f32(0.0f));
                partial = e.add(partial, e.mul(dhU[i], h[i]));
              }
              dgs.push_back(dg);
              dus.push_back(du);
            }
            bool whole = pieces % (32 * per) == 0;
            auto store = [&] {
              store16Streaming(pack8(dgs), at(dgBase, p.at0));
              store16Streaming(pack8(dus), at(duBase, p.at0));
            };
            if (whole) {
              store();
              acc = partial;
            } else {
              e.ifThen(p.inRange, store);
              acc = e.select(p.inRange, partial, acc);
            }
          }
          return acc;
        });
  });
}

void KernelLowering::lower(mk::GridBarrierOp op) {
  // Sense-free generation barrier: the last CTA to arrive resets the count
  // and bumps the generation the others spin on. Thread 0 of each CTA
  // arrives after a CTA barrier, with release/acquire fences at GPU scope
  // around it (fence.acq_rel.gpu: the CTAs of one kernel on one GPU; the
  // system scope, MEMBAR.SYS, also drained to host coherence), so every
  // thread's writes of the phase are visible to every thread of the next.
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value bar = op.getState();
  // What this thread wrote with ordinary stores may be read by TMA (the
  // async proxy) after the barrier: order it for that proxy first.
  if (gemm)
    NVVM::FenceProxyOp::create(b, loc, NVVM::ProxyKind::async_global,
                               NVVM::SharedSpaceAttr());
  gpu::BarrierOp::create(b, loc);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, tid, e.index(0)), [&] {
    Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
    Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
    Value c0 = e.index(0), c1 = e.index(1);
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel, "device");
    Value gen = memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                            zero, bar, ValueRange{c1});
    Value arrived = memref::AtomicRMWOp::create(
        b, loc, arith::AtomicRMWKind::addi, one, bar, ValueRange{c0});
    Value blocks =
        arith::IndexCastOp::create(b, loc, b.getI32Type(), numBlocks);
    Value last = e.cmp(arith::CmpIPredicate::eq,
                       arith::AddIOp::create(b, loc, arrived, one), blocks);
    e.ifThen(
        last,
        [&] {
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::assign,
                                      zero, bar, ValueRange{c0});
          LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel, "device");
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                      bar, ValueRange{c1});
        },
        [&] {
          auto spin = scf::WhileOp::create(b, loc, TypeRange{}, ValueRange{});
          Block *before = b.createBlock(&spin.getBefore());
          {
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToEnd(before);
            Value now = memref::AtomicRMWOp::create(
                b, loc, arith::AtomicRMWKind::addi, zero, bar, ValueRange{c1});
            Value same = e.cmp(arith::CmpIPredicate::eq, now, gen);
            scf::ConditionOp::create(b, loc, same, ValueRange{});
          }
          Block *after = b.createBlock(&spin.getAfter());
          {
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToEnd(after);
            scf::YieldOp::create(b, loc);
          }
          b.setInsertionPointAfter(spin);
        });
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel, "device");
  });
  gpu::BarrierOp::create(b, loc);
}

void KernelLowering::lower(mk::TimestampOp op) {
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    Value now = NVVM::GlobalTimerOp::create(e.b, e.loc, e.b.getI64Type());
    e.store(now, op.getClock(), {e.index(op.getIndex())});
    if (Value cycles = op.getCycles())
      e.store(NVVM::Clock64Op::create(e.b, e.loc, e.b.getI64Type()), cycles,
              {e.index(op.getIndex())});
  });
}

struct ConvertMKToGPUPass
    : public mok::impl::ConvertMKToGPUBase<ConvertMKToGPUPass> {
  using ConvertMKToGPUBase::ConvertMKToGPUBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    ConvertMKToGPUBase::getDependentDialects(registry);
    gemm::insertDialects(registry);
  }

  void runOnOperation() override {
    SmallVector<std::pair<gpu::GPUFuncOp, std::optional<mk::Engine>>> kernels;
    WalkResult walk = getOperation().walk([&](gpu::GPUFuncOp func) {
      bool hasMK = false;
      for (Block &block : func.getBody())
        for (Operation &op : block)
          if (isa<mk::MKDialect>(op.getDialect())) {
            if (&block != &func.getBody().front()) {
              op.emitOpError("must be in the entry block of its kernel");
              return WalkResult::interrupt();
            }
            // The lowering sizes loops, tiles and scans from the shapes.
            for (auto [i, operand] : llvm::enumerate(op.getOperands()))
              if (auto type = dyn_cast<MemRefType>(operand.getType());
                  type && !type.hasStaticShape()) {
                op.emitOpError() << "convert-mk-to-gpu needs static shapes: "
                                 << "operand #" << i << " is " << type;
                return WalkResult::interrupt();
              }
            hasMK = true;
          }
      if (!hasMK)
        return WalkResult::advance();
      if (failed(checkBarrierIntervals(func)))
        return WalkResult::interrupt();
      // mk.swiglu_grad gives each row to one warp of whole-warp blocks.
      std::optional<ArrayRef<int32_t>> block = func.getKnownBlockSize();
      bool wholeWarps = block && (*block)[0] % 32 == 0 && (*block)[1] == 1 &&
                        (*block)[2] == 1;
      if (!wholeWarps)
        for (auto op : func.getBody().front().getOps<mk::SwigluGradOp>()) {
          op.emitOpError("needs a kernel of whole warps: a known_block_size "
                         "[n, 1, 1] with n a multiple of 32");
          return WalkResult::interrupt();
        }
      FailureOr<std::optional<mk::Engine>> engine = checkEngines(func);
      if (failed(engine))
        return WalkResult::interrupt();
      kernels.push_back({func, *engine});
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();
    for (auto [func, engine] : kernels) {
      OpBuilder b(func.getContext());
      Emitter e(b, func.getLoc());
      KernelLowering(func, e).run(engine);
    }
  }
};

} // namespace
