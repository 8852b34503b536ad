// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-mk-to-gpu's checks of a kernel before it is lowered.
//
#include "Lowering.h"

#include "mok/Dialect/MK/IR/MKSchedule.h"

#include "llvm/Support/CheckedArithmetic.h"

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

/// The largest buffer the lowering takes, in elements.
static constexpr int64_t kMaxElements = int64_t(1) << 40;
namespace sched = mok::mk::schedule;

namespace {

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
/// The exchange's stores into the peers' symmetric buffers are seen, on
/// every rank, after the mk.wait of their signal: an mk.wait ends the
/// interval of mk.put_counts' stores (and of the signals', whose flags it
/// reads). An mk.signal publishes what the grid stored before it, so the
/// grid-wide exchange stores (mk.send_rows, mk.return_rows) need a grid
/// barrier between them and it (mk.put_counts stores from the first CTA,
/// which the signal's CTA barrier orders).
LogicalResult checkBarrierIntervals(gpu::GPUFuncOp func) {
  DenseMap<Value, Operation *> writer, accessor;
  // The peer stores not yet fenced (mk.fence_peers) before their signal.
  Operation *unfenced = nullptr;
  for (Operation &op : func.getBody().front()) {
    if (isa<mk::SendRowsOp, mk::ReturnRowsOp>(op))
      unfenced = &op;
    if (isa<mk::FencePeersOp>(op))
      unfenced = nullptr;
    if (isa<mk::SignalOp>(op) && unfenced) {
      InFlightDiagnostic d =
          op.emitOpError() << "publishes what '" << unfenced->getName()
                           << "' stored into the peers, which no "
                              "mk.fence_peers made visible (add one before "
                              "the grid barrier that precedes the signal)";
      d.attachNote(unfenced->getLoc()) << "stored here";
      return d;
    }
    if (isa<mk::GridBarrierOp>(op)) {
      writer.clear();
      accessor.clear();
      continue;
    }
    if (!isa<mk::MKDialect>(op.getDialect()))
      continue;
    // (The grid-wide stores, mk.send_rows and mk.return_rows, need a grid
    // barrier before their signal, which ends their interval anyway.)
    auto exchange = [](Operation *o) {
      return isa<mk::PutCountsOp, mk::SignalOp>(o);
    };
    if (isa<mk::SignalOp>(op))
      for (auto [v, w] : writer)
        if (isa<mk::SendRowsOp, mk::ReturnRowsOp>(w)) {
          InFlightDiagnostic d =
              op.emitOpError()
              << "publishes the peers' copies of " << bufferName(func, v)
              << ", which '" << w->getName()
              << "' stores from every CTA in the same barrier interval (add "
                 "an mk.grid_barrier between them)";
          d.attachNote(w->getLoc()) << "stored here";
          return d;
        }
    if (isa<mk::WaitOp>(op)) {
      SmallVector<Value> seen;
      for (auto [v, w] : writer)
        if (exchange(w))
          seen.push_back(v);
      for (Value v : seen) {
        writer.erase(v);
        accessor.erase(v);
      }
    }
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
    if (!experts || !rows || experts.getInt() < 0)
      return std::nullopt;
    // (slot - first, not first + experts: no overflow; when the slot is
    // past this map, first + experts <= slot.)
    if (slot - first < experts.getInt())
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

/// The kernel's tensor-core GEMMs: each one implemented by the chip's
/// lowering (mk::TargetSupport), and together one engine, one tile height,
/// one tensor-map buffer and one kind of warp roles, in a launch that fits
/// them (block size, dynamic shared memory, clusters for multicast).
FailureOr<std::optional<mk::Engine>> checkTensorCoreGemms(gpu::GPUFuncOp func) {
  std::optional<mk::Engine> engine;
  std::optional<int64_t> tileM;
  std::optional<mk::GemmScheduleAttr> roles;
  Value maps;
  StringRef chip;
  auto desc = func->getAttrOfType<DictionaryAttr>("mok.kernel");
  if (desc)
    if (auto c = desc.getAs<StringAttr>("chip"))
      chip = c.getValue();
  std::optional<mk::TargetSupport> support = mk::TargetSupport::forChip(chip);
  FailureOr<int64_t> cluster = clusterSize(func);
  if (failed(cluster))
    return failure();
  bool anyTensorCores = false;
  for (auto gemm : func.getBody().front().getOps<mk::GemmOp>()) {
    if (!gemm.usesTensorCores())
      continue;
    anyTensorCores = true;
    mk::GemmScheduleAttr schedule = gemm.getSchedule();
    mk::Engine e = schedule.getEngine();
    if (!support) {
      StringRef want = e == mk::Engine::wgmma ? "sm_90a" : "sm_100a";
      return gemm.emitOpError()
             << "the " << mk::stringifyEngine(e) << " engine needs a " << want
             << " kernel (mok.kernel chip = \"" << want << "\"), got "
             << (chip.empty() ? "none" : "\"" + chip.str() + "\"");
    }
    // The pairs of a cluster run every phase's tasks together.
    if (schedule.getMulticast() && *cluster != 2)
      return gemm.emitOpError(
          "multicast needs a kernel launched in clusters of 2 CTAs "
          "(mok.kernel cluster = 2)");
    if (!schedule.getMulticast() && *cluster > 1)
      return gemm.emitOpError()
             << "in a kernel of mok.kernel cluster = " << *cluster
             << " every tensor-core GEMM multicasts (the CTA pairs run each "
                "phase's tasks together): its schedule needs multicast";
    if (std::string why = support->whyNot(mk::GemmForm::of(gemm), schedule);
        !why.empty())
      return gemm.emitOpError() << why;
    // Multicast reads B through 128-row boxes, one half a CTA.
    if (schedule.getMulticast())
      for (int64_t slot : gemm.getMaps()->drop_front())
        if (std::optional<int64_t> rows = mapBoxRows(func, slot);
            rows && *rows != sched::kTileN)
          return gemm.emitOpError()
                 << "with multicast B is loaded in " << sched::kTileN
                 << "-row halves, but map slot " << slot << " has boxes of "
                 << *rows << " rows";
    // The runtime launches with the description's dynamic shared memory:
    // it must hold what the GEMM phases use (on sm_90a the ring and the
    // epilogue staging).
    int64_t need = support->dynamicSharedMemory();
    if (desc) {
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
    // Threads outside a tile's warpgroups skip its task loop: every tensor-
    // core GEMM of a kernel must keep the same threads counting k-tiles.
    if (tileM && *tileM != schedule.tileM())
      return gemm.emitOpError() << "a kernel's tensor-core GEMMs must have "
                                   "one tile height; got "
                                << schedule.tileM() << " after " << *tileM;
    tileM = schedule.tileM();
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
    // The shapes are static (checkKernel). Slots are >= 0 (mk.gemm's
    // verifier) and may be as large as int64_t goes: compared with
    // slots - width, which cannot overflow.
    for (auto [i, slot] : llvm::enumerate(mapSlots)) {
      int64_t width = i == 0 ? 1 : perB;
      if (slot > slots - width)
        return gemm.emitOpError()
               << "map slot " << slot << " (+" << width
               << ") is out of the tensor_maps buffer's " << slots << " slots";
    }
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
    // FP8 with K in groups: each group's K range starts on a k-tile (the
    // k-tile is the f32 scales' block, and MXFP8's atom column), so the
    // padding must be a multiple of the k-tile.
    bool fp8KGroups = gemm.getKOffsets() && gemm.isFp8();
    if (gemm.isGrouped() || fp8KGroups) {
      Value offsets = fp8KGroups ? gemm.getKOffsets() : gemm.getOffsets();
      mk::PadOffsetsOp plan;
      for (auto pad : func.getBody().front().getOps<mk::PadOffsetsOp>())
        if (pad.getOffsets() == offsets)
          plan = pad;
      if (!plan)
        return gemm.emitOpError()
               << "a " << (fp8KGroups ? "k_groups FP8" : "grouped")
               << " tensor-core GEMM needs offsets made by an "
                  "mk.pad_offsets of its kernel";
      if (gemm.isGrouped() && plan.getPadding() % schedule.tileM())
        return gemm.emitOpError()
               << "expert segments are padded to " << plan.getPadding()
               << " rows, not a multiple of the tile's " << schedule.tileM()
               << ": a tile would span two experts";
      if (fp8KGroups && plan.getPadding() % schedule.getTile()[2])
        return gemm.emitOpError()
               << "k_groups over segments padded to " << plan.getPadding()
               << " rows, not a multiple of the FP8 k-tile's "
               << schedule.getTile()[2]
               << ": a k-tile would span two experts' scale blocks";
    }
    // Warp roles: one kind per kernel (the threads counting k-tiles, the
    // barriers and the register split are the kernel's).
    if (roles && (roles->getProducer() != schedule.getProducer() ||
                  roles->getRegisters() != schedule.getRegisters()))
      return gemm.emitOpError("a kernel's tensor-core GEMMs must have the "
                              "same warp roles (producer, registers)");
    // With a producer only its first thread counts the k-tiles of GEMMs
    // without a gathered A; a gathered one starts every producer thread
    // from the count, so it must come first.
    if (roles && schedule.getProducer() && gemm.getGatherRows())
      return gemm.emitOpError(
          "with a producer, a gathered A operand is implemented for the "
          "kernel's first tensor-core GEMM only (the producer warpgroup's "
          "other threads do not count the k-tiles of the GEMMs before it)");
    // With a producer the consumers peel a bf16 task's first k-tile, so
    // its k-tile count must not be 0: K over the call's rows (a runtime
    // count) is implemented for FP8 operands there. (K in groups is
    // whyNot's: its form.)
    if (schedule.getProducer() && !gemm.isFp8() && gemm.getTokens() &&
        gemm.getTransposeA())
      return gemm.emitOpError()
             << "with a producer, a bf16 GEMM's K must be static: K = the "
                "call's rows is implemented with a producer for FP8 operands "
                "only";
    roles = schedule;
    unsigned threads = support->blockSize(schedule);
    // (Null when the kernel has no known_block_size.)
    DenseI32ArrayAttr block = func.getKnownBlockSizeAttr();
    if (!block || block[0] != static_cast<int32_t>(threads) || block[1] != 1 ||
        block[2] != 1)
      return gemm.emitOpError()
             << "tensor-core GEMMs "
             << (schedule.getProducer() ? "with a producer " : "") << "of "
             << schedule.tileM() << "-row tiles need a kernel with "
             << "known_block_size = [" << threads << ", 1, 1]";
  }
  if (*cluster > 1 && !anyTensorCores)
    return func.emitOpError()
           << "mok.kernel cluster = " << *cluster
           << " needs tensor-core GEMMs (the pairs share their B boxes)";
  return engine;
}

} // namespace

FailureOr<std::optional<mk::Engine>>
mok::conversion::checkKernel(gpu::GPUFuncOp func) {
  for (Block &block : func.getBody())
    for (Operation &op : block) {
      if (!isa<mk::MKDialect>(op.getDialect()))
        continue;
      if (&block != &func.getBody().front())
        return op.emitOpError("must be in the entry block of its kernel");
      // What lowerKernel's switch lowers (MKToGPU.cpp); any other mk op
      // would be erased unlowered, so it is refused here.
      if (!isa<mk::FillOp, mk::CheckRoutesOp, mk::CountRoutesOp,
               mk::ScanChunksOp, mk::PadOffsetsOp, mk::AssignRowsOp,
               mk::GatherOp, mk::GemmOp, mk::CombineOp, mk::SwigluGradOp,
               mk::QuantizeRowsOp, mk::QuantizeColumnsOp,
               mk::QuantizeWeightsOp, mk::GridBarrierOp, mk::TimestampOp, mk::RouteRanksOp,
               mk::PutCountsOp, mk::SignalOp, mk::WaitOp,
               mk::CheckCapacityOp, mk::ReceivedRowsOp, mk::SendRowsOp,
               mk::ReturnRowsOp, mk::TakeRoutesOp, mk::LaunchEpochOp,
               mk::CountLaunchOp, mk::FencePeersOp>(op))
        return op.emitOpError("has no lowering in convert-mk-to-gpu");
      // The lowering sizes loops, tiles and scans from the shapes, in
      // int64_t arithmetic: static shapes, of at most 2^40 elements (a
      // size-0 dimension counted as 1; far beyond a GPU's memory).
      for (auto [i, operand] : llvm::enumerate(op.getOperands())) {
        auto type = dyn_cast<MemRefType>(operand.getType());
        if (!type)
          continue;
        if (!type.hasStaticShape())
          return op.emitOpError() << "convert-mk-to-gpu needs static shapes: "
                                  << "operand #" << i << " is " << type;
        std::optional<int64_t> elements = 1;
        for (int64_t d : type.getShape())
          if (elements)
            elements = llvm::checkedMul(*elements, std::max<int64_t>(d, 1));
        if (!elements || *elements > kMaxElements)
          return op.emitOpError()
                 << "convert-mk-to-gpu takes buffers of at most 2^40 "
                    "elements: operand #"
                 << i << " is " << type;
      }
    }
  if (failed(checkBarrierIntervals(func)))
    return failure();
  // mk.swiglu_grad gives each row, the quantizers each block, to one warp
  // of whole-warp blocks.
  std::optional<ArrayRef<int32_t>> block = func.getKnownBlockSize();
  bool wholeWarps =
      block && (*block)[0] % 32 == 0 && (*block)[1] == 1 && (*block)[2] == 1;
  if (!wholeWarps)
    for (Operation &op : func.getBody().front())
      if (isa<mk::SwigluGradOp, mk::QuantizeRowsOp, mk::QuantizeColumnsOp,
              mk::QuantizeWeightsOp>(op))
        return op.emitOpError("needs a kernel of whole warps: a "
                              "known_block_size [n, 1, 1] with n a multiple "
                              "of 32");
  return checkTensorCoreGemms(func);
}
