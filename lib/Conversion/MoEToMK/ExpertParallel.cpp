// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk's plan of an expert-parallel (ep > 1) inference
// forward: one rank's kernel, with the exchange of docs/ExpertParallel.md
// inside it (counts, dispatch, return), its stores going straight into the
// peers' symmetric buffers and ordered by epoch flags, no host step.
//
#include "KernelPlan.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "llvm/Support/CheckedArithmetic.h"

using namespace mlir;
using namespace mok;
using namespace mok::moe;
using namespace mok::moe_to_mk;

namespace {

/// The regions of a rank's symmetric buffer, each at a byte offset that is
/// a multiple of 128: what the peers store into (and this rank reads).
struct SymmetricRegion {
  StringRef name;
  SmallVector<int64_t> shape;
  Type element;
  int64_t offset = 0;
};

/// The layout of the symmetric buffer, or none when its size overflows.
std::optional<int64_t> layoutRegions(SmallVectorImpl<SymmetricRegion> &regions) {
  int64_t at = 0;
  for (SymmetricRegion &r : regions) {
    std::optional<int64_t> bytes = r.element.getIntOrFloatBitWidth() / 8;
    for (int64_t d : r.shape)
      bytes = bytes ? llvm::checkedMul(*bytes, d) : std::nullopt;
    if (!bytes)
      return std::nullopt;
    r.offset = at;
    std::optional<int64_t> end = llvm::checkedAdd(at, *bytes);
    if (!end || *end > (int64_t(1) << 62))
      return std::nullopt;
    at = (*end + 127) / 128 * 128;
  }
  return at;
}

/// The phases of the schedule, in order (profiling names them).
ArrayRef<StringRef> phaseNames() {
  static const StringRef names[] = {
      "plan: count routes",    "plan: count ranks", "plan: scan ranks",
      "counts: send",          "send plan + counts: wait",
      "dispatch: send rows",   "shared gate/up + dispatch: wait",
      "local plan: scan",      "local plan: offsets",
      "local plan: assign",    "local gather",      "gate/up + SwiGLU",
      "down",                  "return rows",       "return: wait + combine"};
  return names;
}

struct EPKernel {
  Sizes s;
  int64_t globalExperts, capacity, symmetricBytes = 0;
  SmallVector<SymmetricRegion> regions;
  SmallVector<Param> params;
};

/// The kernel's parameters: the layer's inputs and output, the
/// workspace, the exchange's (peers, rank, epoch, the symmetric buffer)
/// and (tensor-core kernels) the tensor maps, last.
void addParams(EPKernel &k, LayerOp layer, ArrayRef<TensorMapSpec> maps,
               bool profile) {
  const Sizes &s = k.s;
  Builder tb(layer.getContext());
  Type bf16 = tb.getBF16Type(), i64 = tb.getI64Type(), i32 = tb.getI32Type();
  auto ty = [&](ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  };
  auto tensorType = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    SmallVector<int64_t> shape(t.getShape());
    for (int64_t &d : shape)
      if (ShapedType::isDynamic(d))
        d = s.tokens;
    return ty(shape, t.getElementType());
  };
  std::string weights = maps.empty() ? "pointer" : "tensor_maps";
  int64_t t = s.tokens, n = s.ep, rc = s.routedCapacity(), c = k.capacity;
  SmallVector<Param> &params = k.params;
  params = {
      {"x", "input", tensorType(layer.getX())},
      {"top_experts", "input", tensorType(layer.getTopExperts())},
      {"router_weights", "input", tensorType(layer.getRouterWeights())},
      {"gate_weights", "input", tensorType(layer.getGateWeights()), weights},
      {"up_weights", "input", tensorType(layer.getUpWeights()), weights},
      {"down_weights", "input", tensorType(layer.getDownWeights()), weights}};
  if (layer.hasSharedExpert()) {
    params.push_back({"shared_gate_weights", "input",
                      tensorType(layer.getSharedGate()), weights});
    params.push_back({"shared_up_weights", "input",
                      tensorType(layer.getSharedUp()), weights});
    params.push_back({"shared_down_weights", "input",
                      tensorType(layer.getSharedDown()), weights});
  }
  params.push_back({"out", "output", tensorType(layer.getOut())});
  auto work = [&](StringRef name, MemRefType type) {
    params.push_back({name.str(), "workspace", type});
  };
  // The send side: the routes' ranks, each route's return row, the plan
  // over ranks (rows to send, in token order per rank) and the routes per
  // global expert (their sum per rank is what each rank receives).
  work("top_ranks", ty({t, n}, i32));
  work("route_row", ty({t * s.topK}, i64));
  work("expert_chunk_counts",
       ty({Sizes::chunksOf(t * s.topK), k.globalExperts}, i64));
  work("expert_counts", ty({k.globalExperts}, i64));
  work("send_chunk_counts", ty({Sizes::chunksOf(t * n), n}, i64));
  work("send_counts", ty({n}, i64));
  work("send_offsets", ty({n + 1}, i64));
  work("send_row", ty({t * n}, i64));
  work("send_route", ty({t * n}, i64));
  work("send_rank", ty({t * n}, i64));
  // The local plan over the received rows (C of them at most, k routes
  // each, at most C valid) and the local experts' rows.
  work("chunk_counts", ty({Sizes::chunksOf(c * s.topK), s.experts}, i64));
  work("counts", ty({s.experts}, i64));
  work("offsets", ty({s.experts + 1}, i64));
  work("recv_route_row", ty({c * s.topK}, i64));
  work("row_route", ty({rc}, i64));
  work("row_expert", ty({rc}, i64));
  work("routed_x", ty({rc, s.hidden}, bf16));
  work("hidden", ty({rc, s.inter}, bf16));
  work("routed_y", ty({rc, s.hidden}, bf16));
  if (layer.hasSharedExpert()) {
    work("shared_hidden", ty({t, s.sharedInter}, bf16));
    work("shared_out", ty({t, s.hidden}, bf16));
  }
  // Whether some rank's routes exceed the capacity (mk.check_capacity).
  work("verdict", ty({1}, i64));
  work("grid_barrier", ty({2}, i32));
  params.push_back({"status", "status", ty({8}, i32)});
  if (s.anyTokens)
    params.push_back({"tokens", "tokens", MemRefType()});
  // The exchange: the peer table (a device array of ep addresses), this
  // rank and the launch's epoch (by value), and this rank's symmetric
  // buffer.
  params.push_back({"peers", "peers", ty({n}, i64)});
  params.push_back({"rank", "rank", MemRefType()});
  params.push_back({"epoch", "epoch", MemRefType()});
  params.push_back({"symmetric", "symmetric",
                    ty({k.symmetricBytes}, tb.getIntegerType(8))});
  if (profile)
    for (StringRef name : {"phase_clock", "phase_cycles"})
      params.push_back(
          {name.str(), "workspace",
           ty({static_cast<int64_t>(phaseNames().size()) + 1}, i64)});
  if (!maps.empty())
    params.push_back(
        {"tensor_maps", "tensor_maps", ty({16 * slotCount(maps)}, i64)});
}

LogicalResult emitSchedule(OpBuilder &b, LayerOp layer, const EPKernel &k,
                           gpu::GPUFuncOp func,
                           std::optional<mk::Engine> engine,
                           const MapSlots &slots, int64_t tileM,
                           int64_t storeTileN, const mk::TargetSupport &support,
                           unsigned timeoutMs) {
  const Sizes &s = k.s;
  Location loc = layer.getLoc();
  ScheduleBuilder frame(b, loc, k.params, func, support, timeoutMs);
  llvm::StringMap<Value> &buf = frame.buf;
  auto barrier = [&] { frame.barrier(); };
  Value tokens = frame.tokens;
  Value peers = buf["peers"], rank = buf["rank"], epoch = buf["epoch"];
  // The regions of the symmetric buffer, as views of it.
  llvm::StringMap<Value> region;
  for (const SymmetricRegion &r : k.regions)
    region[r.name] = memref::ViewOp::create(
        b, loc, MemRefType::get(r.shape, r.element), buf["symmetric"],
        arith::ConstantIndexOp::create(b, loc, r.offset), ValueRange{});
  Value flags = region["flags"], matrix = region["matrix"];
  enum Flag : int64_t { kCounts = 0, kRows = 1, kResults = 2 };

  // Send side, step 1: count. The routes per global expert (their sums
  // per rank: the routes each rank receives), and the plan over ranks:
  // each token once per rank it routes to, in token order (padding 1).
  mk::FillOp::create(b, loc, buf["row_route"], -1);
  mk::FillOp::create(b, loc, buf["row_expert"], -1);
  mk::CheckRoutesOp::create(b, loc, buf["top_experts"], frame.report, tokens,
                            k.globalExperts);
  mk::RouteRanksOp::create(b, loc, buf["top_experts"], buf["top_ranks"],
                           buf["route_row"], tokens, k.globalExperts, s.ep);
  mk::CountRoutesOp::create(b, loc, buf["top_experts"],
                            buf["expert_chunk_counts"], tokens,
                            Sizes::chunkOf(s.tokens * s.topK));
  barrier();
  int64_t sendChunk = Sizes::chunkOf(s.tokens * s.ep);
  mk::CountRoutesOp::create(b, loc, buf["top_ranks"], buf["send_chunk_counts"],
                            tokens, sendChunk);
  mk::ScanChunksOp::create(b, loc, buf["expert_chunk_counts"],
                           buf["expert_counts"]);
  barrier();
  mk::ScanChunksOp::create(b, loc, buf["send_chunk_counts"],
                           buf["send_counts"]);
  barrier();
  // Step 2: every rank's counts to every rank.
  mk::PadOffsetsOp::create(b, loc, buf["send_counts"], buf["send_offsets"], 1);
  mk::PutCountsOp::create(b, loc, buf["send_counts"], buf["expert_counts"],
                          matrix, peers, rank);
  mk::SignalOp::create(b, loc, flags, kCounts, peers, rank, epoch);
  barrier();
  mk::AssignRowsOp::create(b, loc, buf["top_ranks"], buf["send_offsets"],
                           buf["send_chunk_counts"], buf["send_row"],
                           buf["send_route"], buf["send_rank"], tokens,
                           sendChunk);
  mk::WaitOp::create(b, loc, flags, kCounts, epoch);
  mk::CheckCapacityOp::create(b, loc, matrix, frame.report, buf["verdict"],
                              k.capacity);
  barrier();
  // Step 3: dispatch, each token's row once to each rank it routes to.
  mk::SendRowsOp::create(b, loc, buf["x"], buf["top_experts"],
                         buf["send_route"], buf["send_offsets"], matrix,
                         buf["verdict"], region["recv_x"],
                         region["recv_origin"], region["recv_experts"], peers,
                         rank, tokens, s.experts);
  barrier();
  mk::SignalOp::create(b, loc, flags, kRows, peers, rank, epoch);

  FloatAttr limit = layer.getSwigluLimitAttr();
  auto gemm = [&](StringRef role, mk::Epilogue epilogue, StringRef a,
                  ArrayRef<StringRef> bs, StringRef out, bool grouped,
                  ArrayRef<int64_t> mapSlots) {
    GemmPlan g;
    g.role = role;
    g.epilogue = epilogue;
    g.a = buf[a];
    for (StringRef name : bs)
      g.b.push_back(buf[name]);
    g.out = buf[out];
    if (grouped) {
      g.rowExpert = buf["row_expert"];
      g.offsets = buf["offsets"];
    }
    if (epilogue == mk::Epilogue::swiglu)
      g.limit = limit;
    if (engine) {
      g.engine = *engine;
      g.maps.assign(mapSlots.begin(), mapSlots.end());
      g.tensorMaps = buf["tensor_maps"];
      g.tileM = tileM;
      g.tileN = epilogue == mk::Epilogue::store ? storeTileN : sched::kTileN;
      if (grouped && *engine == mk::Engine::wgmma &&
          epilogue == mk::Epilogue::store)
        g.paddingRows = buf["row_route"];
    }
    frame.gemm(g);
  };
  // While the rows cross: the shared expert's gate/up, on this rank's own
  // tokens.
  if (s.hasShared())
    gemm("shared gate/up", mk::Epilogue::swiglu, "x",
         {"shared_gate_weights", "shared_up_weights"}, "shared_hidden",
         /*grouped=*/false, {slots.x, slots.sharedGate, slots.sharedUp});
  mk::WaitOp::create(b, loc, flags, kRows, epoch);

  // Step 4: the local experts, over the rows received (the plan of
  // mk.count_routes ... mk.assign_rows with the received rows as tokens).
  Value received =
      mk::ReceivedRowsOp::create(b, loc, b.getIndexType(), matrix,
                                 buf["verdict"], rank);
  int64_t localChunk = Sizes::chunkOf(k.capacity * s.topK);
  mk::CountRoutesOp::create(b, loc, region["recv_experts"], buf["chunk_counts"],
                            received, localChunk);
  barrier();
  mk::ScanChunksOp::create(b, loc, buf["chunk_counts"], buf["counts"]);
  barrier();
  mk::PadOffsetsOp::create(b, loc, buf["counts"], buf["offsets"], s.padding);
  barrier();
  mk::AssignRowsOp::create(b, loc, region["recv_experts"], buf["offsets"],
                           buf["chunk_counts"], buf["recv_route_row"],
                           buf["row_route"], buf["row_expert"], received,
                           localChunk);
  barrier();
  mk::GatherOp::create(b, loc, region["recv_x"], buf["row_route"],
                       buf["offsets"], buf["routed_x"], /*scale=*/Value(),
                       s.topK);
  barrier();
  gemm("routed gate/up", mk::Epilogue::swiglu, "routed_x",
       {"gate_weights", "up_weights"}, "hidden", /*grouped=*/true,
       {slots.routedX, slots.gate, slots.up});
  barrier();
  gemm("routed down", mk::Epilogue::store, "hidden", {"down_weights"},
       "routed_y", /*grouped=*/true, {slots.hidden, slots.down});
  if (s.hasShared())
    gemm("shared down", mk::Epilogue::store, "shared_hidden",
         {"shared_down_weights"}, "shared_out", /*grouped=*/false,
         {slots.sharedHidden, slots.sharedDown});
  barrier();
  // Step 5: each routed row's result back to its source, once a route.
  mk::ReturnRowsOp::create(b, loc, buf["routed_y"], buf["row_route"],
                           buf["offsets"], region["recv_origin"],
                           region["ret"], peers, s.topK);
  barrier();
  mk::SignalOp::create(b, loc, flags, kResults, peers, rank, epoch);
  mk::WaitOp::create(b, loc, flags, kResults, epoch);
  // Step 6: combine, reading each route's result at its own row.
  mk::CombineOp::create(b, loc, region["ret"], buf["route_row"],
                        buf["router_weights"],
                        s.hasShared() ? buf["shared_out"] : Value(),
                        buf["out"], tokens);
  if (frame.clock)
    barrier();
  assert((!frame.clock ||
          frame.stamps == static_cast<int64_t>(phaseNames().size()) + 1) &&
         "phaseNames() must name every phase");
  gpu::ReturnOp::create(b, loc);
  return frame.status;
}

} // namespace

LogicalResult mok::moe_to_mk::planForwardEP(ModuleOp module, func::FuncOp func,
                                            LayerOp layer,
                                            const PlanOptions &options) {
  MLIRContext *ctx = module.getContext();
  const mk::TargetSupport &support = options.support;
  PlanType plan = layer.getPlanType();
  EPKernel k{sizesOf(layer), plan.getExperts(), plan.getReceiveCapacity()};
  Sizes &s = k.s;
  Type i64 = IntegerType::get(ctx, 64), i32 = IntegerType::get(ctx, 32);
  Type bf16 = BFloat16Type::get(ctx);
  // The symmetric buffer: the flags of the three signals (counts, rows,
  // results), the count matrix, the receive buffers (C rows) and the
  // return buffer (a row a route of this rank's tokens).
  k.regions = {{"flags", {3, s.ep}, i64},
               {"matrix", {s.ep, 2 * s.ep}, i64},
               {"recv_origin", {k.capacity}, i64},
               {"recv_experts", {k.capacity, s.topK}, i32},
               {"recv_x", {k.capacity, s.hidden}, bf16},
               {"ret", {s.tokens * s.topK, s.hidden}, bf16}};
  std::optional<int64_t> bytes = layoutRegions(k.regions);
  if (!bytes)
    return layer.emitError()
           << "convert-moe-to-mk: the exchange's symmetric buffer is too "
              "large for 64-bit sizes (recv_capacity = "
           << k.capacity << ", H = " << s.hidden << ")";
  k.symmetricBytes = *bytes;

  std::optional<mk::Engine> engine;
  SmallVector<TensorMapSpec> maps;
  MapSlots slots{};
  unsigned block = options.blockSize;
  int64_t tileM = sched::kTileM, storeTileN = sched::kTileN;
  if (options.tensorCores && s.tensorCoreEligible()) {
    engine = support.tensorCoreEngine();
    auto scheduleOf = [&](int64_t m, int64_t n) {
      return mk::GemmScheduleAttr::get(ctx, *engine, {m, n, sched::kTileK},
                                       sched::kStages, false, {}, false);
    };
    mk::GemmForm gateUp, down;
    gateUp.epilogue = mk::Epilogue::swiglu;
    gateUp.bOperands = 2;
    gateUp.grouped = down.grouped = true;
    gateUp.columns = s.inter;
    down.columns = s.hidden;
    int64_t tall = sched::kMaxConsumers * sched::kTileM;
    if (s.padding % tall == 0 &&
        support.whyNot(gateUp, scheduleOf(tall, sched::kTileN)).empty())
      tileM = tall;
    if (support.whyNot(down, scheduleOf(tileM, 2 * sched::kTileN)).empty())
      storeTileN = 2 * sched::kTileN;
    maps = forwardTensorMaps(s, slots, tileM, storeTileN, /*cluster=*/1);
    block = support.blockSize(scheduleOf(tileM, storeTileN));
  }
  addParams(k, layer, maps, options.profile);

  OpBuilder b(ctx);
  DictionaryAttr description = describeKernel(
      ctx, k.params, s, support.chip(), block, maps,
      options.profile ? phaseNames() : ArrayRef<StringRef>(), 1);
  // The group: its size, the receive capacity, and the bytes of symmetric
  // buffer a rank needs (the runtime allocates them on every rank and
  // fills the peer table).
  NamedAttrList entries(description);
  entries.set("ep", b.getI64IntegerAttr(s.ep));
  entries.set("recv_capacity", b.getI64IntegerAttr(k.capacity));
  entries.set("symmetric_bytes", b.getI64IntegerAttr(k.symmetricBytes));
  SmallVector<Attribute> layout;
  for (const SymmetricRegion &r : k.regions)
    layout.push_back(b.getDictionaryAttr(
        {b.getNamedAttr("name", b.getStringAttr(r.name)),
         b.getNamedAttr("offset", b.getI64IntegerAttr(r.offset))}));
  entries.set("symmetric_layout", b.getArrayAttr(layout));
  gpu::GPUFuncOp kernel =
      createKernel(b, module, func, layer, "_forward", k.params, block,
                   entries.getDictionary(ctx));
  return emitSchedule(b, layer, k, kernel, engine, slots, tileM, storeTileN,
                      support, options.barrierTimeoutMs);
}
