// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk's forward plan: a fused moe.layer (inference, or the
// training forward that also saves the backward context) as one
// persistent kernel, its tiles the largest the chip's lowering implements
// for the layer (mk::TargetSupport).
//
#include "KernelPlan.h"

using namespace mlir;
using namespace mok;
using namespace mok::moe;
using namespace mok::moe_to_mk;

namespace {

} // namespace

SmallVector<TensorMapSpec>
mok::moe_to_mk::forwardTensorMaps(const Sizes &s, MapSlots &slots,
                                  int64_t tileM, int64_t storeTileN,
                                  int64_t cluster, int64_t sharedStoreTileN) {
  // Clusters load B in 128-row halves (one per CTA of a pair).
  int64_t downBox = cluster > 1 ? sched::kTileN : storeTileN;
  int64_t sharedDownBox =
      cluster > 1 || !sharedStoreTileN ? downBox : sharedStoreTileN;
  int64_t rc = s.routedCapacity(), h = s.hidden, in = s.inter, e = s.experts;
  // (FP8: the routed GEMMs read the E4M3 copies, boxes of 128-element
  // rows: the same 128 bytes.)
  auto a = [tileM](StringRef buffer, int64_t rows, int64_t cols,
                   bool fp8 = false) {
    return TensorMapSpec{buffer.str(), rows, cols, cols, tileM,
                         sched::tileK(fp8)};
  };
  auto b = [](StringRef buffer, int64_t rows, int64_t cols, int64_t experts = 1,
              int64_t box = sched::kTileN, bool fp8 = false) {
    return TensorMapSpec{buffer.str(), rows,          cols,   cols,
                         box,          sched::tileK(fp8), experts};
  };
  bool fp8 = s.fp8;
  StringRef routedX = fp8 ? "routed_x_q" : "routed_x";
  StringRef gate = fp8 ? "gate_q" : "gate_weights";
  StringRef up = fp8 ? "up_q" : "up_weights";
  StringRef hidden = fp8 ? "hidden_q" : "hidden";
  StringRef down = fp8 ? "down_q" : "down_weights";
  SmallVector<TensorMapSpec> maps;
  int64_t next = 0;
  auto add = [&](TensorMapSpec spec) {
    maps.push_back(spec);
    int64_t slot = next;
    next += spec.experts;
    return slot;
  };
  // gate/up A: routed_x, or, with the dispatch fused, x one row a box.
  slots.routedX =
      s.fusedDispatch
          ? add(TensorMapSpec{"x", s.tokens, h, h, 1, sched::kTileK})
          : add(a(routedX, rc, h, fp8));
  slots.gate = add(b(gate, in, h, e, gateUpTileN(s), fp8)); // [I, H] each
  slots.up = add(b(up, in, h, e, gateUpTileN(s), fp8));
  slots.hidden = add(a(hidden, rc, in, fp8));                 // down A
  slots.down = add(b(down, h, in, e, downBox, fp8)); // [H, I] each
  if (s.hasShared()) {
    int64_t is = s.sharedInter, t = s.tokens;
    slots.x = add(a("x", t, h));
    slots.sharedGate = add(b("shared_gate_weights", is, h));
    slots.sharedUp = add(b("shared_up_weights", is, h));
    slots.sharedHidden = add(a("shared_hidden", t, is));
    slots.sharedDown = add(b("shared_down_weights", h, is, 1, sharedDownBox));
  }
  return maps;
}

ForwardTiles mok::moe_to_mk::forwardTiles(MLIRContext *ctx, const Sizes &s,
                                          const mk::TargetSupport &support,
                                          bool saves, bool producer,
                                          bool multicast) {
  // The largest tiles the chip's lowering implements for the layer's
  // GEMMs: 128 rows when the expert segments are whole 128-row tiles (two
  // consumer warpgroups compute, sharing each B box; with warp roles
  // registers move to them), and 256 columns for the down projections
  // (one B operand: twice the work per A tile and per k-tile sync, the
  // same stage bytes as gate + up).
  mk::Engine engine = support.tensorCoreEngine();
  auto scheduleOf = [&](int64_t m, int64_t n, bool fp8) {
    SmallVector<int64_t, 2> registers;
    if (producer)
      registers = sched::producerRegisters(m);
    return mk::GemmScheduleAttr::get(ctx, engine, {m, n, sched::tileK(fp8)},
                                     sched::kStages, producer, registers,
                                     multicast);
  };
  mk::GemmForm gateUp, down;
  gateUp.fp8 = down.fp8 = s.fp8;
  gateUp.mx = down.mx = s.mx;
  gateUp.epilogue = mk::Epilogue::swiglu;
  gateUp.bOperands = 2;
  gateUp.grouped = down.grouped = true;
  gateUp.gathered = s.fusedDispatch;
  gateUp.saves = saves;
  gateUp.columns = s.inter;
  down.columns = s.hidden;
  ForwardTiles t;
  int64_t tall = sched::kMaxConsumers * sched::kTileM;
  // (tcgen05 takes 128-row tiles for MXFP8 only: its block-scaled MMA
  // has M = 128; the bf16 layers keep 64.)
  if (s.padding % tall == 0 && (engine == mk::Engine::wgmma || s.mx) &&
      support.whyNot(gateUp, scheduleOf(tall, gateUpTileN(s), s.fp8)).empty())
    t.tileM = tall;
  if (support.whyNot(down, scheduleOf(t.tileM, 2 * sched::kTileN, s.fp8))
          .empty())
    t.storeTileN = 2 * sched::kTileN;
  // The shared expert's down projection is bf16 in an FP8 layer too: its
  // own widest tile.
  t.sharedStoreTileN = t.storeTileN;
  mk::GemmForm sharedDown = down;
  sharedDown.fp8 = false;
  sharedDown.grouped = false;
  if (s.fp8 &&
      support.whyNot(sharedDown, scheduleOf(t.tileM, 2 * sched::kTileN, false))
          .empty())
    t.sharedStoreTileN = 2 * sched::kTileN;
  t.block = support.blockSize(scheduleOf(t.tileM, t.storeTileN, s.fp8));
  return t;
}

namespace {

/// The phases of the schedule, in order: what lies between two barriers
/// (profiling names them; emitSchedule checks it emits that many).
SmallVector<StringRef> phaseNames(const Sizes &s) {
  // (FP8: x quantized with the counting, its E4M3 rows dispatched, with
  // the saved context beside its bf16 rows; MXFP8: the routed rows
  // quantized in a phase of their own. The weights are quantized with the
  // dispatch unless they are inputs.)
  SmallVector<StringRef> names = {
      s.fp8GatherQuantized ? "plan: count + quantize x" : "plan: count",
      "plan: scan", "plan: offsets", "plan: assign"};
  if (!s.fusedDispatch)
    names.push_back(s.fp8 && !s.fp8WeightInputs ? "dispatch + quantize weights"
                                                 : "dispatch");
  if (s.fp8 && !s.fp8GatherQuantized)
    names.push_back("quantize routed x");
  names.push_back("gate/up + SwiGLU");
  if (s.fp8)
    names.push_back("quantize hidden");
  names.append({"down", "combine"});
  return names;
}

/// The kernel's parameters: the layer's inputs and output, the workspace,
/// and (tensor-core kernels) the tensor maps, last.
SmallVector<Param> paramsFor(LayerOp layer, const Sizes &s,
                             ArrayRef<TensorMapSpec> maps, bool profile) {
  Builder tb(layer.getContext());
  Type bf16 = tb.getBF16Type(), i64 = tb.getI64Type();
  auto ty = [&](ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  };
  // With tensor-core GEMMs, the kernel reads the weights only through
  // their tensor maps: the runtime may bind weight views to them. (FP8:
  // the routed weights are read by the quantizer, through pointers.)
  std::string weights = maps.empty() ? "pointer" : "tensor_maps";
  std::string routedWeights = s.fp8 ? "pointer" : weights;
  int64_t rc = s.routedCapacity();
  Type f8 = tb.getType<Float8E4M3FNType>(), f32 = tb.getF32Type();
  Type e8 = tb.getType<Float8E8M0FNUType>();
  int64_t h = s.hidden, in = s.inter;
  SmallVector<Param> params = {
      {"x", "input", s.bufferType(layer.getX())},
      {"top_experts", "input", s.bufferType(layer.getTopExperts())},
      {"router_weights", "input", s.bufferType(layer.getRouterWeights())}};
  if (s.fp8WeightInputs) {
    params.append(fp8Weights(tb.getContext(), s, "input", false, weights));
    // A training forward also takes the transposed copies the backward's
    // dgrads read (unread here): the context carries the inputs, so both
    // kernels take the same ones.
    if (layer.savesContext())
      params.append(fp8Weights(tb.getContext(), s, "input", true));
  } else {
    params.push_back({"gate_weights", "input",
                      s.bufferType(layer.getGateWeights()), routedWeights});
    params.push_back(
        {"up_weights", "input", s.bufferType(layer.getUpWeights()), routedWeights});
    params.push_back({"down_weights", "input",
                      s.bufferType(layer.getDownWeights()), routedWeights});
  }
  if (layer.hasSharedExpert()) {
    params.push_back({"shared_gate_weights", "input",
                      s.bufferType(layer.getSharedGate()), weights});
    params.push_back({"shared_up_weights", "input",
                      s.bufferType(layer.getSharedUp()), weights});
    params.push_back({"shared_down_weights", "input",
                      s.bufferType(layer.getSharedDown()), weights});
  }
  params.push_back({"out", "output", s.bufferType(layer.getOut())});
  // The training forward's backward context, outputs in moe.layer's order
  // (the simt plan: routed_x is materialized).
  bool saves = layer.savesContext();
  if (saves) {
    for (StringRef name : {"routed_x", "gate", "up", "hidden"})
      params.push_back(
          {name.str(), "output",
           ty({rc, name == "routed_x" ? s.hidden : s.inter}, bf16)});
    if (layer.hasSharedExpert())
      for (StringRef name : {"shared_gate", "shared_up", "shared_hidden"})
        params.push_back(
            {name.str(), "output", ty({s.tokens, s.sharedInter}, bf16)});
  }
  params.push_back({"counts", "workspace", ty({s.experts}, i64)});
  params.push_back(
      {"chunk_counts", "workspace", ty({s.chunks(), s.experts}, i64)});
  params.push_back({"offsets", "workspace", ty({s.experts + 1}, i64)});
  params.push_back({"route_row", "workspace", ty({s.tokens * s.topK}, i64)});
  params.push_back({"row_route", "workspace", ty({rc}, i64)});
  params.push_back({"row_expert", "workspace", ty({rc}, i64)});
  if (!s.fusedDispatch && !saves && !s.fp8GatherQuantized)
    params.push_back({"routed_x", "workspace", ty({rc, s.hidden}, bf16)});
  if (!saves)
    params.push_back({"hidden", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"routed_y", "workspace", ty({rc, s.hidden}, bf16)});
  // FP8: the quantized weights (unless they are inputs: quantized at
  // every call) and routed rows, and their block scales.
  if (s.fp8) {
    int64_t w = s.scaleWidth();
    if (!s.fp8WeightInputs)
      params.append(fp8Weights(tb.getContext(), s, "workspace", false));
    if (s.fp8GatherQuantized) {
      params.push_back({"x_q", "workspace", ty({s.tokens, h}, f8)});
      params.push_back(
          {"x_scale", "workspace", ty({h / 128, (s.tokens + 3) / 4 * 4}, f32)});
    }
    auto rowScales = [&](int64_t cols) {
      return s.mx ? ty({(rc + 127) / 128, cols / 128, 512}, e8)
                  : ty({cols / 128, w}, f32);
    };
    params.push_back({"routed_x_q", "workspace", ty({rc, h}, f8)});
    params.push_back({"routed_x_scale", "workspace", rowScales(h)});
    params.push_back({"hidden_q", "workspace", ty({rc, in}, f8)});
    params.push_back({"hidden_scale", "workspace", rowScales(in)});
  }
  if (layer.hasSharedExpert()) {
    if (!saves)
      params.push_back(
          {"shared_hidden", "workspace", ty({s.tokens, s.sharedInter}, bf16)});
    params.push_back(
        {"shared_out", "workspace", ty({s.tokens, s.hidden}, bf16)});
  }
  // [arrived CTAs, generation]; zero before the first launch, and left
  // reusable by every launch.
  params.push_back({"grid_barrier", "workspace", ty({2}, tb.getI32Type())});
  // The kernel's report to the runtime (mk.check_routes, bounded grid
  // barriers): host memory the runtime zeroes and reads after the call.
  params.push_back({"status", "status", ty({8}, tb.getI32Type())});
  // Any T: the call's token count, by value.
  if (s.anyTokens)
    params.push_back({"tokens", "tokens", MemRefType()});
  // Profiling: %globaltimer and the first SM's %clock64 at the start and
  // after each phase.
  if (profile)
    for (StringRef name : {"phase_clock", "phase_cycles"})
      params.push_back(
          {name.str(), "workspace",
           ty({static_cast<int64_t>(phaseNames(s).size()) + 1},
              i64)});
  // 128-byte CUtensorMaps; last, so the other parameters keep their
  // positions.
  if (!maps.empty())
    params.push_back(
        {"tensor_maps", "tensor_maps", ty({16 * slotCount(maps)}, i64)});
  return params;
}

/// Emits the schedule of `layer` into the body of `func`, whose arguments
/// are `params`.
LogicalResult emitSchedule(OpBuilder &b, LayerOp layer, const Sizes &s,
                           ArrayRef<Param> params, gpu::GPUFuncOp func,
                           std::optional<mk::Engine> engine,
                           const MapSlots &slots, int64_t tileM,
                           int64_t storeTileN, int64_t sharedStoreTileN,
                           bool warpSpecialize,
                           int64_t cluster, const mk::TargetSupport &support,
                           unsigned timeoutMs) {
  Location loc = layer.getLoc();
  ScheduleBuilder frame(b, loc, params, func, support, timeoutMs);
  llvm::StringMap<Value> &buf = frame.buf;
  Value clock = frame.clock;
  auto barrier = [&] { frame.barrier(); };
  // sm_90a: warp-specialized GEMMs (a producer warpgroup after the
  // consumers); with two consumer warpgroups, registers move to them.
  bool warpRoles = engine == mk::Engine::wgmma && warpSpecialize;
  DenseI64ArrayAttr registers;
  if (warpRoles && !sched::producerRegisters(tileM).empty())
    registers = b.getDenseI64ArrayAttr(sched::producerRegisters(tileM));

  // FP8: x's rows quantized, with the plan's counting (they read only
  // x).
  if (s.fp8GatherQuantized)
    mk::QuantizeRowsOp::create(b, loc, buf["x"], buf["x_q"], buf["x_scale"],
                               frame.tokens, /*offsets=*/Value());

  // Phase 1: the routing plan.
  frame.plan(s);

  // Phase 2: dispatch (or, fused, the gate/up GEMM's A loads gather).
  if (!s.fusedDispatch) {
    // FP8: the E4M3 rows and their block scales (a routed row is its
    // token's row, so they are the routed rows' own quantization; a
    // padding row is zeros with scale 1, as quantizing its zeros gives);
    // with the saved context, the bf16 rows too.
    if (s.fp8GatherQuantized)
      mk::GatherOp::create(b, loc, buf["x_q"], buf["row_route"],
                           buf["offsets"], buf["routed_x_q"],
                           /*scale=*/Value(), buf["x_scale"],
                           buf["routed_x_scale"], s.topK);
    if (!s.fp8GatherQuantized || layer.savesContext())
      mk::GatherOp::create(b, loc, buf["x"], buf["row_route"], buf["offsets"],
                           buf["routed_x"], /*scale=*/Value(),
                           /*xScales=*/Value(), /*routedScales=*/Value(),
                           s.topK);
    // FP8: the weights' 128 x 128 blocks, with the dispatch (they read
    // only the layer's weights), unless they come quantized.
    if (s.fp8 && !s.fp8WeightInputs)
      for (StringRef w : {"gate", "up", "down"})
        mk::QuantizeWeightsOp::create(b, loc, buf[(w + "_weights").str()],
                                      buf[(w + "_q").str()],
                                      buf[(w + "_scale").str()]);
    barrier();
  }
  // MXFP8: the routed rows' 1 x 32 blocks, from the bf16 rows (their
  // scale atoms hold 128 routed rows).
  if (s.fp8 && !s.fp8GatherQuantized) {
    mk::QuantizeRowsOp::create(b, loc, buf["routed_x"], buf["routed_x_q"],
                               buf["routed_x_scale"], /*tokens=*/Value(),
                               buf["offsets"]);
    barrier();
  }

  // Phases 3 (gate/up + SwiGLU) and 4 (down), routed and shared.
  FloatAttr limit = layer.getSwigluLimitAttr();
  auto gemm = [&](StringRef role, mk::Epilogue epilogue, StringRef a,
                  ArrayRef<StringRef> bs, StringRef out, bool grouped,
                  ArrayRef<int64_t> mapSlots, bool gathered = false,
                  ArrayRef<StringRef> saves = {}) {
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
    for (StringRef name : saves)
      g.saves.push_back(buf[name]);
    // FP8 (routed GEMMs): the operands' quantized copies and their scales.
    if (s.fp8 && grouped) {
      g.scales.push_back(buf[(a + "_scale").str()]);
      g.a = buf[(a + "_q").str()];
      for (auto [i, name] : llvm::enumerate(bs)) {
        StringRef w = name.drop_back(StringRef("_weights").size());
        g.b[i] = buf[(w + "_q").str()];
        g.scales.push_back(buf[(w + "_scale").str()]);
      }
    }
    if (epilogue == mk::Epilogue::swiglu)
      g.limit = limit;
    if (gathered) {
      g.gatherRows = buf["row_route"];
      g.gatherTopK = s.topK;
    }
    if (engine) {
      g.engine = *engine;
      g.maps.assign(mapSlots.begin(), mapSlots.end());
      g.tensorMaps = buf["tensor_maps"];
      g.tileM = tileM;
      g.tileN = epilogue == mk::Epilogue::swiglu
                    ? (grouped ? gateUpTileN(s) : sched::kTileN)
                : grouped ? storeTileN
                          : sharedStoreTileN;
      // wgmma's down projections skip the MMAs of a tile half that is all
      // padding.
      if (grouped && *engine == mk::Engine::wgmma &&
          epilogue == mk::Epilogue::store)
        g.paddingRows = buf["row_route"];
      g.producer = warpRoles;
      g.registers = registers;
      g.multicast = cluster > 1;
    }
    frame.gemm(g);
  };
  // The training forward also stores the activation's inputs (the
  // backward context).
  bool saves = layer.savesContext();
  SmallVector<StringRef> routedSaves, sharedSaves;
  if (saves) {
    routedSaves = {"gate", "up"};
    sharedSaves = {"shared_gate", "shared_up"};
  }
  if (s.fusedDispatch)
    gemm("routed gate/up", mk::Epilogue::swiglu, "x",
         {"gate_weights", "up_weights"}, "hidden",
         /*grouped=*/true, {slots.routedX, slots.gate, slots.up},
         /*gathered=*/true);
  else
    gemm("routed gate/up", mk::Epilogue::swiglu, "routed_x",
         {"gate_weights", "up_weights"}, "hidden", /*grouped=*/true,
         {slots.routedX, slots.gate, slots.up},
         /*gathered=*/false, routedSaves);
  if (s.hasShared())
    gemm("shared gate/up", mk::Epilogue::swiglu, "x",
         {"shared_gate_weights", "shared_up_weights"}, "shared_hidden",
         /*grouped=*/false, {slots.x, slots.sharedGate, slots.sharedUp},
         /*gathered=*/false, sharedSaves);
  barrier();
  // FP8: the hidden activation's 1 x 128 blocks, from its bf16 value.
  if (s.fp8) {
    mk::QuantizeRowsOp::create(b, loc, buf["hidden"], buf["hidden_q"],
                               buf["hidden_scale"], /*tokens=*/Value(),
                               buf["offsets"]);
    barrier();
  }
  gemm("routed down", mk::Epilogue::store, "hidden", {"down_weights"},
       "routed_y",
       /*grouped=*/true, {slots.hidden, slots.down});
  if (s.hasShared())
    gemm("shared down", mk::Epilogue::store, "shared_hidden",
         {"shared_down_weights"}, "shared_out", /*grouped=*/false,
         {slots.sharedHidden, slots.sharedDown});
  barrier();

  // Phase 5: combine.
  mk::CombineOp::create(
      b, loc, buf["routed_y"], buf["route_row"], buf["router_weights"],
      s.hasShared() ? buf["shared_out"] : Value(), buf["out"], frame.tokens,
      /*poison=*/Value());
  // Profiling: one more barrier, so the last stamp follows every CTA.
  if (clock)
    barrier();
  assert((!clock ||
          frame.stamps ==
              static_cast<int64_t>(phaseNames(s).size()) + 1) &&
         "phaseNames() must name every phase");
  gpu::ReturnOp::create(b, loc);
  return frame.status;
}

} // namespace

LogicalResult mok::moe_to_mk::planForward(ModuleOp module, func::FuncOp func,
                                          LayerOp layer,
                                          const PlanOptions &options) {
  if (options.exchanges(layer.getPlanType()))
    return planForwardEP(module, func, layer, options);
  MLIRContext *ctx = module.getContext();
  const mk::TargetSupport &support = options.support;
  StringRef chip = support.chip();
  bool tensorCores = options.tensorCores, profile = options.profile;
  bool warpSpecialize = options.warpSpecialize;
  bool fuseDispatch = options.fuseDispatch, multicast = options.multicast;
  Sizes s = sizesOf(layer);
  // (convert-moe-to-mk admits "fp8" here, with tensor-cores=false.)
  std::optional<StringRef> precision = layer.getPrecision();
  s.fp8 = precision == StringRef("fp8") || precision == StringRef("mxfp8");
  s.mx = precision == StringRef("mxfp8");
  s.fp8WeightInputs = s.fp8 && options.fp8QuantizedWeights;
  // (MXFP8's scale atoms hold 128 routed rows: the routed rows are
  // quantized after the dispatch.)
  s.fp8GatherQuantized = s.fp8 && !s.mx;

  // The plan: tensor-core GEMMs for the chip when the shapes fit.
  std::optional<mk::Engine> engine;
  SmallVector<TensorMapSpec> maps;
  MapSlots slots{};
  unsigned block = options.blockSize;
  int64_t tileM = sched::kTileM, storeTileN = sched::kTileN;
  int64_t sharedStoreTileN = sched::kTileN;
  int64_t cluster = 1;
  if (tensorCores && s.tensorCoreEligible()) {
    engine = support.tensorCoreEngine();
    // The fused dispatch on wgmma, unless the copy is asked for; with
    // warp roles (the producer warpgroup gathers) only when asked for:
    // under the producer's 56 registers ptxas spills a few values of
    // those kernels (40-200 bytes on the benchmark shapes), and on the
    // H200 it did not speed dsv3-shard up (docs/performance.md).
    // (The training forward saves routed_x: the dispatch copy.)
    s.fusedDispatch = !options.copyDispatch && *engine == mk::Engine::wgmma &&
                      (!warpSpecialize || fuseDispatch) &&
                      !layer.savesContext() && !s.fp8;
    // Clusters of 2 (weight boxes multicast to pairs of tasks): wgmma
    // without a producer (the options are checked by the pass).
    if (multicast)
      cluster = 2;
    ForwardTiles tiles =
        forwardTiles(ctx, s, support, layer.savesContext(),
                     warpSpecialize && *engine == mk::Engine::wgmma, multicast);
    tileM = tiles.tileM;
    storeTileN = tiles.storeTileN;
    sharedStoreTileN = tiles.sharedStoreTileN;
    block = tiles.block;
    maps = forwardTensorMaps(s, slots, tileM, storeTileN, cluster,
                             sharedStoreTileN);
  }
  // The options that change the tensor-core GEMMs are refused, not
  // ignored, for a layer that runs scalar GEMMs.
  if (!engine && (warpSpecialize || fuseDispatch || multicast))
    return layer.emitError()
           << "convert-moe-to-mk: "
           << (warpSpecialize ? "warp-specialize"
               : fuseDispatch ? "fuse-dispatch"
                              : "multicast")
           << " needs tensor-core GEMMs, and this layer runs scalar ones "
           << (tensorCores ? "(its shapes do not fit the tiles: H % 64, I "
                             "and I_s % 128, padding % 64 must be 0)"
                           : "(tensor-cores=false)");
  SmallVector<Param> params = paramsFor(layer, s, maps, profile);

  OpBuilder b(ctx);
  gpu::GPUFuncOp kernel =
      createKernel(b, module, func, layer, "_forward", params, block,
                   describeKernel(ctx, params, s, chip, block, maps,
                                  profile ? phaseNames(s)
                                          : SmallVector<StringRef>(),
                                  cluster));
  return emitSchedule(b, layer, s, params, kernel, engine, slots, tileM,
                      storeTileN, sharedStoreTileN, warpSpecialize, cluster,
                      support,
                      options.barrierTimeoutMs);
}
