// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk's plans of an expert-parallel (ep > 1) layer: one
// rank's forward (inference, or training with the saved context) and
// backward, each one kernel with the exchange of docs/ExpertParallel.md
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

/// A region of a rank's symmetric buffer, at a byte offset that is a
/// multiple of 128: what the peers store into (and this rank reads).
struct SymmetricRegion {
  StringRef name;
  SmallVector<int64_t> shape;
  Type element;
  int64_t offset = 0;
};

/// Lays the regions out; the buffer's bytes, or none when they overflow.
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

/// The phases of the schedules, in order (profiling names them).
ArrayRef<StringRef> forwardPhaseNames() {
  static const StringRef names[] = {
      "plan: count routes",    "plan: count ranks", "plan: scan ranks",
      "counts: send",          "send plan + counts: wait",
      "dispatch: send rows + shared gate/up", "dispatch: wait + local count",
      "local plan: scan",      "local plan: offsets",
      "local plan: assign",    "local gather",      "gate/up + SwiGLU",
      "down",                  "return rows",       "return: wait + combine"};
  return names;
}
ArrayRef<StringRef> backwardPhaseNames() {
  static const StringRef names[] = {
      "plan: count routes",     "plan: count ranks",
      "plan: scan ranks",       "counts: send",
      "send plan + counts: wait",
      "dispatch: send d_out rows + shared down dgrad + wgrad",
      "dispatch: wait + local count",
      "local plan: scan",       "local plan: offsets",
      "local plan: assign",     "reverse combine",
      "down dgrad + wgrad",     "SwiGLU backward",
      "gate/up dgrad + wgrads", "return rows",
      "return: wait + reverse dispatch"};
  return names;
}

/// One rank's kernel: the layer's sizes (experts: the local ones; the
/// routed rows bounded by the receive capacity), the group's, the
/// symmetric buffer's regions and the parameters.
struct EPKernel {
  Sizes s;
  int64_t globalExperts, capacity, symmetricBytes = 0;
  SmallVector<SymmetricRegion> regions;
  SmallVector<Param> params;
};

/// Sets the kernel's symmetric regions (the flags of the three signals:
/// counts, rows, results; the launch count, which only this rank writes;
/// the count matrix; the receive buffers, C rows;
/// the return buffer, a row a route of this rank's tokens) and their
/// layout; `backward` adds the received router weights and the returned
/// router-weight gradients.
LogicalResult layoutSymmetric(Operation *op, EPKernel &k, bool backward) {
  MLIRContext *ctx = op->getContext();
  const Sizes &s = k.s;
  Type i64 = IntegerType::get(ctx, 64), i32 = IntegerType::get(ctx, 32);
  Type bf16 = BFloat16Type::get(ctx), f32 = Float32Type::get(ctx);
  k.regions = {{"flags", {3, s.ep}, i64},
               {"launches", {1}, i64},
               {"matrix", {s.ep, 2 * s.ep}, i64},
               {"recv_origin", {k.capacity}, i64},
               {"recv_experts", {k.capacity, s.topK}, i32},
               {"recv_x", {k.capacity, s.hidden}, bf16},
               {"ret", {s.tokens * s.topK, s.hidden}, bf16}};
  if (backward) {
    k.regions.push_back({"recv_weights", {k.capacity, s.topK}, f32});
    k.regions.push_back({"ret_weights", {s.tokens * s.topK}, f32});
  }
  std::optional<int64_t> bytes = layoutRegions(k.regions);
  if (!bytes)
    return op->emitError()
           << "convert-moe-to-mk: the exchange's symmetric buffer is too "
              "large for 64-bit sizes (recv_capacity = "
           << k.capacity << ", H = " << s.hidden << ")";
  k.symmetricBytes = *bytes;
  return success();
}

/// The parameters every EP kernel has besides the layer's tensors: the
/// send side's and the local plan's workspace (before the kernel's own
/// workspace), and, after it, the grid barrier, the report, the call's T,
/// the exchange's (the peer table, this rank by value, this rank's
/// symmetric buffer), profiling and the tensor maps.
struct ParamBuilder {
  EPKernel &k;
  Builder tb;
  explicit ParamBuilder(EPKernel &k, MLIRContext *ctx) : k(k), tb(ctx) {}
  MemRefType ty(ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  }
  void work(StringRef name, MemRefType type) {
    k.params.push_back({name.str(), "workspace", type});
  }
  void plans() {
    const Sizes &s = k.s;
    Type i64 = tb.getI64Type(), i32 = tb.getI32Type();
    int64_t t = s.tokens, n = s.ep, rc = s.routedCapacity(), c = k.capacity;
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
    // each, at most C valid).
    work("chunk_counts", ty({Sizes::chunksOf(c * s.topK), s.experts}, i64));
    work("counts", ty({s.experts}, i64));
    work("offsets", ty({s.experts + 1}, i64));
    work("recv_route_row", ty({c * s.topK}, i64));
    work("row_route", ty({rc}, i64));
    work("row_expert", ty({rc}, i64));
    // Whether some rank's routes exceed the capacity (mk.check_capacity).
    work("verdict", ty({1}, i64));
  }
  void tail(ArrayRef<TensorMapSpec> maps, int64_t phases) {
    const Sizes &s = k.s;
    Type i64 = tb.getI64Type(), i32 = tb.getI32Type();
    work("grid_barrier", ty({2}, i32));
    k.params.push_back({"status", "status", ty({8}, i32)});
    if (s.anyTokens)
      k.params.push_back({"tokens", "tokens", MemRefType()});
    k.params.push_back({"peers", "peers", ty({s.ep}, i64)});
    k.params.push_back({"rank", "rank", MemRefType()});
    k.params.push_back({"symmetric", "symmetric",
                        ty({k.symmetricBytes}, tb.getIntegerType(8))});
    if (phases)
      for (StringRef name : {"phase_clock", "phase_cycles"})
        work(name, ty({phases + 1}, i64));
    if (!maps.empty())
      k.params.push_back(
          {"tensor_maps", "tensor_maps", ty({16 * slotCount(maps)}, i64)});
  }
};

/// The exchange's steps shared by the forward and the backward: the
/// schedule's frame, the symmetric buffer's regions as views of it, and
/// the send side, the local plan and the return.
struct Exchange {
  ScheduleBuilder &frame;
  const EPKernel &k;
  OpBuilder &b;
  Location loc;
  llvm::StringMap<Value> &buf;
  llvm::StringMap<Value> region;
  Value peers, rank, flags, matrix;
  enum Flag : int64_t { kCounts = 0, kRows = 1, kResults = 2 };

  /// This launch's epoch, read where it is used (after the first grid
  /// barrier, which follows mk.count_launch).
  Value epoch() {
    return mk::LaunchEpochOp::create(b, loc, b.getI64Type(),
                                     region["launches"]);
  }
  void signal(int64_t step) {
    mk::SignalOp::create(b, loc, flags, step, peers, rank, epoch());
  }
  /// A wait for the flags of `step`, bounded as the grid barriers are
  /// (the kernels' bounded waits and barriers numbered together).
  void wait(int64_t step) {
    Value epoch = this->epoch();
    if (frame.timeoutNs)
      mk::WaitOp::create(b, loc, flags, step, epoch, frame.report,
                         b.getI64IntegerAttr(frame.timeoutNs),
                         b.getI64IntegerAttr(frame.barriers++));
    else
      mk::WaitOp::create(b, loc, flags, step, epoch, Value(), nullptr,
                         nullptr);
  }

  Exchange(ScheduleBuilder &frame, const EPKernel &k)
      : frame(frame), k(k), b(frame.b), loc(frame.loc), buf(frame.buf) {
    peers = buf["peers"];
    rank = buf["rank"];
    for (const SymmetricRegion &r : k.regions)
      region[r.name] = memref::ViewOp::create(
          b, loc, MemRefType::get(r.shape, r.element), buf["symmetric"],
          arith::ConstantIndexOp::create(b, loc, r.offset), ValueRange{});
    flags = region["flags"];
    matrix = region["matrix"];
    // The kernel counts its launches on the device, and the count is the
    // launch's epoch: a CUDA graph's replay is a new epoch as a launch is.
    mk::CountLaunchOp::create(b, loc, region["launches"]);
  }

  /// Steps 1-3: count (routes per global expert, the plan over ranks),
  /// the counts to every rank and the capacity verdict, then each token's
  /// row of `rows` (x, or the backward's d_out with the router weights)
  /// once to each rank it routes to, `overlap` (work on this rank's own
  /// tokens) running while the stores drain; ends after the rows' signal.
  void sendSide(StringRef rows, bool withWeights,
                function_ref<void()> overlap) {
    const Sizes &s = k.s;
    Value tokens = frame.tokens;
    mk::FillOp::create(b, loc, buf["row_route"], -1);
    mk::FillOp::create(b, loc, buf["row_expert"], -1);
    mk::CheckRoutesOp::create(b, loc, buf["top_experts"], frame.report, tokens,
                              k.globalExperts);
    mk::RouteRanksOp::create(b, loc, buf["top_experts"], buf["top_ranks"],
                             buf["route_row"], tokens, k.globalExperts, s.ep);
    mk::CountRoutesOp::create(b, loc, buf["top_experts"],
                              buf["expert_chunk_counts"], tokens,
                              Sizes::chunkOf(s.tokens * s.topK));
    frame.barrier();
    int64_t sendChunk = Sizes::chunkOf(s.tokens * s.ep);
    mk::CountRoutesOp::create(b, loc, buf["top_ranks"],
                              buf["send_chunk_counts"], tokens, sendChunk);
    mk::ScanChunksOp::create(b, loc, buf["expert_chunk_counts"],
                             buf["expert_counts"]);
    frame.barrier();
    mk::ScanChunksOp::create(b, loc, buf["send_chunk_counts"],
                             buf["send_counts"]);
    frame.barrier();
    // Every rank's counts to every rank.
    mk::PadOffsetsOp::create(b, loc, buf["send_counts"], buf["send_offsets"],
                             1);
    mk::PutCountsOp::create(b, loc, buf["send_counts"], buf["expert_counts"],
                            matrix, peers, rank);
    signal(kCounts);
    frame.barrier();
    mk::AssignRowsOp::create(b, loc, buf["top_ranks"], buf["send_offsets"],
                             buf["send_chunk_counts"], buf["send_row"],
                             buf["send_route"], buf["send_rank"], tokens,
                             sendChunk);
    wait(kCounts);
    mk::CheckCapacityOp::create(b, loc, matrix, frame.report, buf["verdict"],
                                k.capacity);
    frame.barrier();
    // Dispatch: each token's row once to each rank it routes to.
    mk::SendRowsOp::create(
        b, loc, buf[rows], buf["top_experts"], buf["send_route"],
        buf["send_offsets"], matrix, buf["verdict"], region["recv_x"],
        region["recv_origin"], region["recv_experts"], peers, rank,
        withWeights ? buf["router_weights"] : Value(),
        withWeights ? region["recv_weights"] : Value(), tokens, s.experts);
    overlap();
    mk::FencePeersOp::create(b, loc);
    frame.barrier();
    signal(kRows);
  }

  /// Step 4's plan: waits for the rows, then plans the local experts over
  /// them (the routing plan with the received rows as tokens); returns
  /// their count.
  Value localPlan() {
    const Sizes &s = k.s;
    wait(kRows);
    Value received = mk::ReceivedRowsOp::create(b, loc, b.getIndexType(),
                                                matrix, buf["verdict"], rank);
    int64_t localChunk = Sizes::chunkOf(k.capacity * s.topK);
    mk::CountRoutesOp::create(b, loc, region["recv_experts"],
                              buf["chunk_counts"], received, localChunk);
    frame.barrier();
    mk::ScanChunksOp::create(b, loc, buf["chunk_counts"], buf["counts"]);
    frame.barrier();
    mk::PadOffsetsOp::create(b, loc, buf["counts"], buf["offsets"], s.padding);
    frame.barrier();
    mk::AssignRowsOp::create(b, loc, region["recv_experts"], buf["offsets"],
                             buf["chunk_counts"], buf["recv_route_row"],
                             buf["row_route"], buf["row_expert"], received,
                             localChunk);
    frame.barrier();
    return received;
  }

  /// Step 5: each routed row of `rows` back to its source (and, backward,
  /// each route's router-weight gradient), then the results' signal and
  /// wait.
  void returnSide(StringRef rows, StringRef values) {
    mk::ReturnRowsOp::create(
        b, loc, buf[rows], buf["row_route"], buf["offsets"],
        region["recv_origin"], region["ret"], peers,
        values.empty() ? Value() : buf[values],
        values.empty() ? Value() : region["ret_weights"], k.s.topK);
    mk::FencePeersOp::create(b, loc);
    frame.barrier();
    signal(kResults);
    wait(kResults);
  }
};

/// Builds the parts of a kernel both plans share and emits the kernel:
/// its description with the group's entries (the size, the receive
/// capacity, the symmetric buffer's bytes and layout).
gpu::GPUFuncOp createEPKernel(OpBuilder &b, ModuleOp module, func::FuncOp func,
                              Operation *layer, StringRef suffix,
                              const EPKernel &k, StringRef chip,
                              unsigned block, ArrayRef<TensorMapSpec> maps,
                              ArrayRef<StringRef> phases) {
  MLIRContext *ctx = module.getContext();
  DictionaryAttr description =
      describeKernel(ctx, k.params, k.s, chip, block, maps, phases, 1);
  NamedAttrList entries(description);
  entries.set("ep", b.getI64IntegerAttr(k.s.ep));
  entries.set("recv_capacity", b.getI64IntegerAttr(k.capacity));
  entries.set("symmetric_bytes", b.getI64IntegerAttr(k.symmetricBytes));
  SmallVector<Attribute> layout;
  for (const SymmetricRegion &r : k.regions)
    layout.push_back(b.getDictionaryAttr(
        {b.getNamedAttr("name", b.getStringAttr(r.name)),
         b.getNamedAttr("offset", b.getI64IntegerAttr(r.offset))}));
  entries.set("symmetric_layout", b.getArrayAttr(layout));
  return createKernel(b, module, func, layer, suffix, k.params, block,
                      entries.getDictionary(ctx));
}

//===----------------------------------------------------------------------===//
// The forward
//===----------------------------------------------------------------------===//

void addForwardParams(EPKernel &k, LayerOp layer, ArrayRef<TensorMapSpec> maps,
                      bool profile) {
  const Sizes &s = k.s;
  ParamBuilder pb(k, layer.getContext());
  Type bf16 = pb.tb.getBF16Type();
  std::string weights = maps.empty() ? "pointer" : "tensor_maps";
  int64_t t = s.tokens, rc = s.routedCapacity();
  SmallVector<Param> &params = k.params;
  params = {
      {"x", "input", s.bufferType(layer.getX())},
      {"top_experts", "input", s.bufferType(layer.getTopExperts())},
      {"router_weights", "input", s.bufferType(layer.getRouterWeights())},
      {"gate_weights", "input", s.bufferType(layer.getGateWeights()),
       weights},
      {"up_weights", "input", s.bufferType(layer.getUpWeights()), weights},
      {"down_weights", "input", s.bufferType(layer.getDownWeights()),
       weights}};
  if (layer.hasSharedExpert()) {
    params.push_back({"shared_gate_weights", "input",
                      s.bufferType(layer.getSharedGate()), weights});
    params.push_back({"shared_up_weights", "input",
                      s.bufferType(layer.getSharedUp()), weights});
    params.push_back({"shared_down_weights", "input",
                      s.bufferType(layer.getSharedDown()), weights});
  }
  params.push_back({"out", "output", s.bufferType(layer.getOut())});
  // The training forward's context, outputs in moe.layer's order: the
  // routed rows of the local plan over the rows this rank received (its
  // backward rebuilds the same plan) and the shared expert's.
  bool saves = layer.savesContext();
  if (saves) {
    for (StringRef name : {"routed_x", "gate", "up", "hidden"})
      params.push_back(
          {name.str(), "output",
           pb.ty({rc, name == "routed_x" ? s.hidden : s.inter}, bf16)});
    if (layer.hasSharedExpert())
      for (StringRef name : {"shared_gate", "shared_up", "shared_hidden"})
        params.push_back(
            {name.str(), "output", pb.ty({t, s.sharedInter}, bf16)});
  }
  pb.plans();
  if (!saves) {
    pb.work("routed_x", pb.ty({rc, s.hidden}, bf16));
    pb.work("hidden", pb.ty({rc, s.inter}, bf16));
  }
  pb.work("routed_y", pb.ty({rc, s.hidden}, bf16));
  if (layer.hasSharedExpert()) {
    if (!saves)
      pb.work("shared_hidden", pb.ty({t, s.sharedInter}, bf16));
    pb.work("shared_out", pb.ty({t, s.hidden}, bf16));
  }
  pb.tail(maps, profile ? forwardPhaseNames().size() : 0);
}

LogicalResult emitForward(OpBuilder &b, LayerOp layer, const EPKernel &k,
                          gpu::GPUFuncOp func, std::optional<mk::Engine> engine,
                          const MapSlots &slots, int64_t tileM,
                          int64_t storeTileN, const mk::TargetSupport &support,
                          unsigned timeoutMs) {
  const Sizes &s = k.s;
  ScheduleBuilder frame(b, layer.getLoc(), k.params, func, support, timeoutMs);
  llvm::StringMap<Value> &buf = frame.buf;
  Location loc = frame.loc;
  Exchange x(frame, k);
  FloatAttr limit = layer.getSwigluLimitAttr();
  bool saves = layer.savesContext();
  auto gemm = [&](StringRef role, mk::Epilogue epilogue, StringRef a,
                  ArrayRef<StringRef> bs, StringRef out, bool grouped,
                  ArrayRef<int64_t> mapSlots, ArrayRef<StringRef> saved = {}) {
    GemmPlan g;
    g.role = role;
    g.epilogue = epilogue;
    g.a = buf[a];
    for (StringRef name : bs)
      g.b.push_back(buf[name]);
    g.out = buf[out];
    for (StringRef name : saved)
      g.saves.push_back(buf[name]);
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
  SmallVector<StringRef> routedSaves, sharedSaves;
  if (saves) {
    routedSaves = {"gate", "up"};
    sharedSaves = {"shared_gate", "shared_up"};
  }

  // While the rows drain to the other ranks: the shared expert's gate/up,
  // on this rank's own tokens.
  x.sendSide("x", /*withWeights=*/false, [&] {
    if (s.hasShared())
      gemm("shared gate/up", mk::Epilogue::swiglu, "x",
           {"shared_gate_weights", "shared_up_weights"}, "shared_hidden",
           /*grouped=*/false, {slots.x, slots.sharedGate, slots.sharedUp},
           sharedSaves);
  });
  x.localPlan();
  // Step 4: the local experts, as at ep = 1 (with the dispatch copy).
  mk::GatherOp::create(b, loc, x.region["recv_x"], buf["row_route"],
                       buf["offsets"], buf["routed_x"], /*scale=*/Value(),
                       /*xScales=*/Value(), /*routedScales=*/Value(), s.topK);
  frame.barrier();
  gemm("routed gate/up", mk::Epilogue::swiglu, "routed_x",
       {"gate_weights", "up_weights"}, "hidden", /*grouped=*/true,
       {slots.routedX, slots.gate, slots.up}, routedSaves);
  frame.barrier();
  gemm("routed down", mk::Epilogue::store, "hidden", {"down_weights"},
       "routed_y", /*grouped=*/true, {slots.hidden, slots.down});
  if (s.hasShared())
    gemm("shared down", mk::Epilogue::store, "shared_hidden",
         {"shared_down_weights"}, "shared_out", /*grouped=*/false,
         {slots.sharedHidden, slots.sharedDown});
  frame.barrier();
  x.returnSide("routed_y", "");
  // Step 6: combine, reading each route's result at its own row.
  mk::CombineOp::create(b, loc, x.region["ret"], buf["route_row"],
                        buf["router_weights"],
                        s.hasShared() ? buf["shared_out"] : Value(),
                        buf["out"], frame.tokens, buf["verdict"]);
  if (frame.clock)
    frame.barrier();
  assert((!frame.clock || frame.stamps == static_cast<int64_t>(
                                              forwardPhaseNames().size()) +
                                              1) &&
         "forwardPhaseNames() must name every phase");
  gpu::ReturnOp::create(b, loc);
  return frame.status;
}

//===----------------------------------------------------------------------===//
// The backward
//===----------------------------------------------------------------------===//

void addBackwardParams(EPKernel &k, LayerGradOp grad,
                       ArrayRef<TensorMapSpec> maps, bool profile) {
  const Sizes &s = k.s;
  ParamBuilder pb(k, grad.getContext());
  Type bf16 = pb.tb.getBF16Type(), f32 = pb.tb.getF32Type();
  int64_t rc = s.routedCapacity(), t = s.tokens;
  SmallVector<Param> &params = k.params;
  std::pair<StringRef, Value> operands[] = {
      {"d_out", grad.getDOut()},
      {"x", grad.getX()},
      {"top_experts", grad.getTopExperts()},
      {"router_weights", grad.getRouterWeights()}};
  for (auto [name, v] : operands)
    params.push_back({name.str(), "input", s.bufferType(v)});
  std::string access = maps.empty() ? "pointer" : "tensor_maps";
  static const StringRef weightNames[] = {
      "gate_weights",        "up_weights",        "down_weights",
      "shared_gate_weights", "shared_up_weights", "shared_down_weights"};
  for (auto [name, w] : llvm::zip(weightNames, grad.getWeights()))
    params.push_back({name.str(), "input", s.bufferType(w), access});
  static const StringRef savedNames[] = {
      "routed_x",    "gate",      "up",           "hidden",
      "shared_gate", "shared_up", "shared_hidden"};
  for (size_t i = 0; i < grad.getSaved().size(); ++i) {
    int64_t rows = i < 4 ? rc : t;
    int64_t cols = i == 0 ? s.hidden : i < 4 ? s.inter : s.sharedInter;
    params.push_back({savedNames[i].str(), "input", pb.ty({rows, cols}, bf16)});
  }
  params.push_back({"d_x", "output", s.bufferType(grad.getDX())});
  params.push_back(
      {"d_router_weights", "output", s.bufferType(grad.getDRouterWeights())});
  for (auto [name, g] : llvm::zip(weightNames, grad.getWeightGradients())) {
    params.push_back({("d_" + name).str(), "output", s.bufferType(g)});
    params.back().accumulate = grad.accumulatesMainGrads();
  }
  pb.plans();
  // d_out's received rows, unscaled (the down dgrad's A) and scaled by the
  // router weight (the down weights' gradient's A), the dgrads' rows, and
  // each received route's router-weight gradient.
  pb.work("routed_d_out", pb.ty({rc, s.hidden}, bf16));
  pb.work("d_y", pb.ty({rc, s.hidden}, bf16));
  pb.work("d_hidden_u", pb.ty({rc, s.inter}, f32));
  pb.work("d_gate", pb.ty({rc, s.inter}, bf16));
  pb.work("d_up", pb.ty({rc, s.inter}, bf16));
  pb.work("d_routed_x", pb.ty({rc, s.hidden}, bf16));
  pb.work("d_recv_weights", pb.ty({k.capacity, s.topK}, f32));
  if (s.hasShared()) {
    pb.work("d_shared_hidden_u", pb.ty({t, s.sharedInter}, f32));
    pb.work("d_shared_gate", pb.ty({t, s.sharedInter}, bf16));
    pb.work("d_shared_up", pb.ty({t, s.sharedInter}, bf16));
    pb.work("d_shared_x", pb.ty({t, s.hidden}, bf16));
  }
  pb.tail(maps, profile ? backwardPhaseNames().size() : 0);
}

LogicalResult emitBackward(OpBuilder &b, LayerGradOp grad, const EPKernel &k,
                           gpu::GPUFuncOp func, const BackwardMaps &tc,
                           const mk::TargetSupport &support,
                           unsigned timeoutMs) {
  const Sizes &s = k.s;
  ScheduleBuilder frame(b, grad.getLoc(), k.params, func, support, timeoutMs);
  llvm::StringMap<Value> &buf = frame.buf;
  Location loc = frame.loc;
  Exchange x(frame, k);
  FloatAttr limit = grad.getSwigluLimitAttr();
  bool shared = s.hasShared(), accumulate = grad.accumulatesMainGrads();
  BackwardGemms gemms{frame, tc, s, accumulate};

  // Steps 1-3: the forward's counts (rebuilt from top_experts: every
  // received row lands where the forward's did), and d_out's rows with the
  // router weights of their routes.
  // While the rows drain to the other ranks: the shared expert's down
  // dgrad and down weights' gradient, on this rank's own tokens.
  x.sendSide("d_out", /*withWeights=*/true, [&] {
    if (shared)
      gemms.sharedDown();
  });
  Value received = x.localPlan();

  // Step 4, the local experts' backward: the received d_out rows, unscaled
  // and scaled by their routes' router weights.
  mk::GatherOp::create(b, loc, x.region["recv_x"], buf["row_route"],
                       buf["offsets"], buf["routed_d_out"], Value(), Value(),
                       Value(), s.topK);
  mk::GatherOp::create(b, loc, x.region["recv_x"], buf["row_route"],
                       buf["offsets"], buf["d_y"], x.region["recv_weights"],
                       Value(), Value(), s.topK);
  frame.barrier();
  gemms.routedDown("routed_d_out", /*gathered=*/false);
  frame.barrier();
  // The SwiGLU backward; each received route's router-weight gradient.
  mk::SwigluGradOp::create(
      b, loc, buf["d_hidden_u"], buf["gate"], buf["up"], buf["hidden"],
      buf["d_gate"], buf["d_up"], buf["row_route"], buf["recv_route_row"],
      x.region["recv_weights"], buf["offsets"], buf["d_recv_weights"],
      received, limit);
  if (shared)
    mk::SwigluGradOp::create(
        b, loc, buf["d_shared_hidden_u"], buf["shared_gate"], buf["shared_up"],
        buf["shared_hidden"], buf["d_shared_gate"], buf["d_shared_up"], Value(),
        Value(), Value(), Value(), Value(), frame.tokens, limit);
  frame.barrier();
  gemms.gateUp(shared);
  frame.barrier();
  // Step 5: each routed row's d_x and each route's d_w back to its source.
  x.returnSide("d_routed_x", "d_recv_weights");
  // Step 6: the reverse dispatch (each token's routes' d_x in route order,
  // plus the shared expert's) and the router weights' gradients.
  mk::CombineOp::create(b, loc, x.region["ret"], buf["route_row"],
                        /*router_weights=*/Value(),
                        shared ? buf["d_shared_x"] : Value(), buf["d_x"],
                        frame.tokens, buf["verdict"]);
  mk::TakeRoutesOp::create(b, loc, x.region["ret_weights"], buf["route_row"],
                           buf["d_router_weights"], frame.tokens,
                           buf["verdict"]);
  if (frame.clock)
    frame.barrier();
  assert((!frame.clock || frame.stamps == static_cast<int64_t>(
                                              backwardPhaseNames().size()) +
                                              1) &&
         "backwardPhaseNames() must name every phase");
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
  s.maxRoutes = k.capacity; // (sizesOf sets it at ep > 1 only)
  if (failed(layoutSymmetric(layer, k, /*backward=*/false)))
    return failure();

  std::optional<mk::Engine> engine;
  SmallVector<TensorMapSpec> maps;
  MapSlots slots{};
  unsigned block = options.blockSize;
  int64_t tileM = sched::kTileM, storeTileN = sched::kTileN;
  if (options.tensorCores && s.tensorCoreEligible()) {
    engine = support.tensorCoreEngine();
    ForwardTiles tiles = forwardTiles(ctx, s, support, layer.savesContext(),
                                      /*producer=*/false, /*multicast=*/false);
    tileM = tiles.tileM;
    storeTileN = tiles.storeTileN;
    maps = forwardTensorMaps(s, slots, tileM, storeTileN, /*cluster=*/1);
    block = tiles.block;
  }
  addForwardParams(k, layer, maps, options.profile);
  OpBuilder b(ctx);
  gpu::GPUFuncOp kernel = createEPKernel(
      b, module, func, layer, "_forward", k, support.chip(), block, maps,
      options.profile ? forwardPhaseNames() : ArrayRef<StringRef>());
  return emitForward(b, layer, k, kernel, engine, slots, tileM, storeTileN,
                     support, options.barrierTimeoutMs);
}

LogicalResult mok::moe_to_mk::planBackwardEP(ModuleOp module, func::FuncOp func,
                                             LayerGradOp grad,
                                             const PlanOptions &options) {
  MLIRContext *ctx = module.getContext();
  const mk::TargetSupport &support = options.support;
  PlanType plan = grad.getPlanType();
  EPKernel k{sizesOf(grad), plan.getExperts(), plan.getReceiveCapacity()};
  k.s.maxRoutes = k.capacity; // (sizesOf sets it at ep > 1 only)
  if (failed(layoutSymmetric(grad, k, /*backward=*/true)))
    return failure();
  // d_out's rows arrive in the symmetric buffer, which has no tensor map:
  // the down dgrad reads a routed copy of them.
  BackwardMaps tc = backwardMapsFor(ctx, k.s, support, options.tensorCores,
                                    /*recompute=*/false,
                                    /*mayGatherDOut=*/false);
  addBackwardParams(k, grad, tc.maps, options.profile);
  unsigned block = tc.maps.empty() ? options.blockSize : sched::kBlock;
  OpBuilder b(ctx);
  gpu::GPUFuncOp kernel = createEPKernel(
      b, module, func, grad, "_backward", k, support.chip(), block, tc.maps,
      options.profile ? backwardPhaseNames() : ArrayRef<StringRef>());
  return emitBackward(b, grad, k, kernel, tc, support,
                      options.barrierTimeoutMs);
}
