// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk: plans a fused forward moe.layer as one persistent
// megakernel, a gpu.func whose body is the schedule in the mk dialect, and
// describes the kernel's interface for the runtime (the `mok.kernel`
// attribute, which mok-compile writes out as the metadata JSON).
//
// The plan is small today: tensor-core GEMMs (the chip's engine, the one
// tile and stage count convert-mk-to-gpu implements) when the shapes fit,
// simt GEMMs otherwise. It is the place where a cost model chooses tiles,
// stages and task order per shape.
//
#include "mok/Conversion/MoEToMK/MoEToMK.h"
#include "mok/Dialect/MK/IR/MKSchedule.h"
#include "mok/Dialect/MK/IR/MKOps.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMOETOMK
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok;
using namespace mok::moe;
namespace sched = mok::mk::schedule;

namespace {

/// One kernel parameter: a buffer of static shape, passed as a bare pointer.
struct Param {
  std::string name;
  std::string role; // "input", "output", "workspace" or "tensor_maps"
  MemRefType type;
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

/// The sizes of the layer, all static.
struct Sizes {
  int64_t tokens, hidden, inter, experts, topK, padding, sharedInter = 0;
  /// The dispatch copy fused into the gate/up GEMM's A loads (no mk.gather,
  /// no routed_x): sm_90a tensor-core kernels with fuse-dispatch.
  bool fusedDispatch = false;
  int64_t routedCapacity() const {
    return tokens * topK + experts * (padding - 1);
  }
  /// Routes of a chunk of the routing plan: a warp's 32 routes a round
  /// (one thread walking them without whole warps), a multiple of 32, and few
  /// enough chunks (<= 1024) that the scan's lanes, one warp an expert,
  /// load all theirs at once (32 each). (On the H200, with the plan by
  /// warps: dsv3-shard's 1024 chunks scanned in 7 us, qwen3-30b's 2048 in
  /// 28 us; by threads, 64 and <= 1024, scanned by one thread an expert,
  /// took 65 us of planning on dsv3-shard and 114 us on qwen3-30b.)
  int64_t chunk() const {
    int64_t routes = tokens * topK;
    int64_t chunk = std::max<int64_t>(32, (routes + 1023) / 1024);
    return (chunk + 31) / 32 * 32; // whole rounds of a warp
  }
  int64_t chunks() const { return (tokens * topK + chunk() - 1) / chunk(); }
  bool hasShared() const { return sharedInter > 0; }
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

/// The slots of the tensor maps of a tensor-core kernel.
struct MapSlots {
  int64_t routedX, gate, up, hidden, down;                        // routed
  int64_t x = -1, sharedGate, sharedUp, sharedHidden, sharedDown; // shared
};

/// `tileM`: the rows of every tile (the A boxes); `storeTileN`: the output
/// columns of the tiles of the GEMMs with one B operand (the down
/// projections), whose B boxes have that many rows (128 with clusters of
/// `cluster` = 2 CTAs).
SmallVector<TensorMapSpec> tensorMapsFor(const Sizes &s, MapSlots &slots,
                                         int64_t tileM, int64_t storeTileN,
                                         int64_t cluster) {
  // Clusters load B in 128-row halves (one per CTA of a pair).
  int64_t downBox = cluster > 1 ? sched::kTileN : storeTileN;
  int64_t rc = s.routedCapacity(), h = s.hidden, in = s.inter, e = s.experts;
  auto a = [tileM](StringRef buffer, int64_t rows, int64_t cols) {
    return TensorMapSpec{buffer.str(), rows, cols, cols, tileM, sched::kTileK};
  };
  auto b = [](StringRef buffer, int64_t rows, int64_t cols, int64_t experts = 1,
              int64_t box = sched::kTileN) {
    return TensorMapSpec{buffer.str(), rows,          cols,   cols,
                         box,          sched::kTileK, experts};
  };
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
          : add(a("routed_x", rc, h));
  slots.gate = add(b("gate_weights", in, h, e)); // [I, H] each
  slots.up = add(b("up_weights", in, h, e));
  slots.hidden = add(a("hidden", rc, in));                   // down A
  slots.down = add(b("down_weights", h, in, e, downBox));    // [H, I] each
  if (s.hasShared()) {
    int64_t is = s.sharedInter, t = s.tokens;
    slots.x = add(a("x", t, h));
    slots.sharedGate = add(b("shared_gate_weights", is, h));
    slots.sharedUp = add(b("shared_up_weights", is, h));
    slots.sharedHidden = add(a("shared_hidden", t, is));
    slots.sharedDown = add(b("shared_down_weights", h, is, 1, downBox));
  }
  return maps;
}

int64_t slotCount(ArrayRef<TensorMapSpec> maps) {
  int64_t n = 0;
  for (const TensorMapSpec &m : maps)
    n += m.experts;
  return n;
}

/// The kernel's parameters: the layer's inputs and output, the workspace,
/// and (tensor-core kernels) the tensor maps, last.
/// The phases of the schedule, in order: what lies between two barriers
/// (profiling names them; emitSchedule checks it emits that many).
ArrayRef<StringRef> phaseNames(bool fusedDispatch) {
  static const StringRef names[] = {
      "plan: count", "plan: scan",       "plan: offsets", "plan: assign",
      "dispatch",    "gate/up + SwiGLU", "down",          "combine"};
  static const StringRef fused[] = {
      "plan: count",      "plan: scan", "plan: offsets", "plan: assign",
      "gate/up + SwiGLU", "down",       "combine"};
  if (fusedDispatch)
    return fused;
  return names;
}

SmallVector<Param> paramsFor(LayerOp layer, const Sizes &s,
                             ArrayRef<TensorMapSpec> maps, bool profile) {
  Builder tb(layer.getContext());
  Type bf16 = tb.getBF16Type(), i64 = tb.getI64Type();
  auto ty = [&](ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  };
  auto tensorType = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return ty(t.getShape(), t.getElementType());
  };
  // With tensor-core GEMMs, the kernel reads the weights only through
  // their tensor maps: the runtime may bind weight views to them.
  std::string weights = maps.empty() ? "pointer" : "tensor_maps";
  int64_t rc = s.routedCapacity();
  SmallVector<Param> params = {
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
  if (!s.fusedDispatch && !saves)
    params.push_back({"routed_x", "workspace", ty({rc, s.hidden}, bf16)});
  if (!saves)
    params.push_back({"hidden", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"routed_y", "workspace", ty({rc, s.hidden}, bf16)});
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
  // Profiling: %globaltimer and the first SM's %clock64 at the start and
  // after each phase.
  if (profile)
    for (StringRef name : {"phase_clock", "phase_cycles"})
      params.push_back(
          {name.str(), "workspace",
           ty({static_cast<int64_t>(phaseNames(s.fusedDispatch).size()) + 1},
              i64)});
  // 128-byte CUtensorMaps; last, so the other parameters keep their
  // positions.
  if (!maps.empty())
    params.push_back(
        {"tensor_maps", "tensor_maps", ty({16 * slotCount(maps)}, i64)});
  return params;
}

/// The kernel's description for the runtime, on the gpu.func.
DictionaryAttr describeKernel(MLIRContext *ctx, ArrayRef<Param> params,
                              const Sizes &s, StringRef chip,
                              unsigned blockSize,
                              ArrayRef<TensorMapSpec> tensorMaps,
                              ArrayRef<StringRef> phases, int64_t cluster) {
  Builder b(ctx);
  SmallVector<Attribute> ps;
  for (const Param &p : params) {
    std::string dtype;
    llvm::raw_string_ostream(dtype) << p.type.getElementType();
    SmallVector<NamedAttribute> entry = {
        b.getNamedAttr("name", b.getStringAttr(p.name)),
        b.getNamedAttr("role", b.getStringAttr(p.role)),
        b.getNamedAttr("dtype", b.getStringAttr(dtype)),
        b.getNamedAttr("shape", b.getDenseI64ArrayAttr(p.type.getShape())),
    };
    if (p.role == "input")
      entry.push_back(b.getNamedAttr("access", b.getStringAttr(p.access)));
    if (p.accumulate)
      entry.push_back(b.getNamedAttr("accumulate", b.getBoolAttr(true)));
    ps.push_back(b.getDictionaryAttr(entry));
  }
  int64_t smem =
      tensorMaps.empty() ? 0 : sched::dynamicSharedMemory(chip == "sm_90a");
  SmallVector<NamedAttribute> entries = {
      b.getNamedAttr("chip", b.getStringAttr(chip)),
      b.getNamedAttr("block", b.getI64IntegerAttr(blockSize)),
      b.getNamedAttr("grid", b.getStringAttr("persistent: one CTA per SM")),
      b.getNamedAttr("cooperative", b.getBoolAttr(true)),
      b.getNamedAttr("dynamic_shared_memory", b.getI64IntegerAttr(smem)),
      b.getNamedAttr("zero_before_first_launch",
                     b.getArrayAttr({b.getStringAttr("grid_barrier")})),
      b.getNamedAttr("routed_capacity",
                     b.getI64IntegerAttr(s.routedCapacity())),
      b.getNamedAttr("params", b.getArrayAttr(ps)),
  };
  // CTAs per cluster (launched as clusters of that many, grid a multiple).
  if (cluster > 1)
    entries.push_back(b.getNamedAttr("cluster", b.getI64IntegerAttr(cluster)));
  // Entry i covers `experts` consecutive CUtensorMaps in the `tensor_maps`
  // parameter (128 bytes each): bf16, 2-D {cols, rows} with a row stride of
  // row_stride elements, box {box_cols, box_rows}, SWIZZLE_128B, no
  // interleave, OOB zero fill; slot e of a per-expert entry views expert
  // e's matrix.
  if (!tensorMaps.empty()) {
    SmallVector<Attribute> maps;
    for (const TensorMapSpec &m : tensorMaps)
      maps.push_back(b.getDictionaryAttr({
          b.getNamedAttr("buffer", b.getStringAttr(m.buffer)),
          b.getNamedAttr("rows", b.getI64IntegerAttr(m.rows)),
          b.getNamedAttr("cols", b.getI64IntegerAttr(m.cols)),
          b.getNamedAttr("row_stride", b.getI64IntegerAttr(m.rowStride)),
          b.getNamedAttr("box_rows", b.getI64IntegerAttr(m.boxRows)),
          b.getNamedAttr("box_cols", b.getI64IntegerAttr(m.boxCols)),
          b.getNamedAttr("experts", b.getI64IntegerAttr(m.experts)),
      }));
    entries.push_back(b.getNamedAttr("tensor_maps", b.getArrayAttr(maps)));
  }
  if (!phases.empty()) {
    SmallVector<Attribute> names;
    for (StringRef n : phases)
      names.push_back(b.getStringAttr(n));
    entries.push_back(b.getNamedAttr("phases", b.getArrayAttr(names)));
  }
  return b.getDictionaryAttr(entries);
}

/// What every kernel's schedule starts with: its buffers by parameter
/// name, grid barriers (each followed, when profiling, by a timestamp into
/// `phase_clock` and `phase_cycles`) and the routing plan.
struct Schedule {
  OpBuilder &b;
  Location loc;
  llvm::StringMap<Value> buf;
  Value clock, cycles;
  int64_t stamps = 0;

  Schedule(OpBuilder &b, Location loc, ArrayRef<Param> params,
           gpu::GPUFuncOp func)
      : b(b), loc(loc) {
    for (auto [i, p] : llvm::enumerate(params))
      buf[p.name] = func.getArgument(i);
    clock = buf.lookup("phase_clock");
    cycles = buf.lookup("phase_cycles");
    timestamp();
  }
  void timestamp() {
    if (clock)
      mk::TimestampOp::create(b, loc, clock, stamps++, cycles);
  }
  void barrier() {
    mk::GridBarrierOp::create(b, loc, buf["grid_barrier"]);
    timestamp();
  }
  /// The routing plan's four steps, each ending in a barrier: parallel over
  /// chunks of routes and over experts, and deterministic (rows in route
  /// order within each expert).
  void plan(const Sizes &s) {
    mk::FillOp::create(b, loc, buf["row_route"], -1);
    mk::FillOp::create(b, loc, buf["row_expert"], -1);
    mk::CountRoutesOp::create(b, loc, buf["top_experts"], buf["chunk_counts"],
                              s.chunk());
    barrier();
    mk::ScanChunksOp::create(b, loc, buf["chunk_counts"], buf["counts"]);
    barrier();
    mk::PadOffsetsOp::create(b, loc, buf["counts"], buf["offsets"], s.padding);
    barrier();
    mk::AssignRowsOp::create(b, loc, buf["top_experts"], buf["offsets"],
                             buf["chunk_counts"], buf["route_row"],
                             buf["row_route"], buf["row_expert"], s.chunk());
    barrier();
  }
};

/// One mk.gemm of a schedule, forward or backward: simt, or with `maps`
/// (slots: a, each B, then a2) on `engine` with tile [tileM, tileN, 64].
struct GemmPlan {
  mk::Epilogue epilogue = mk::Epilogue::store;
  Value a, a2, out, rowExpert, offsets, kOffsets, kCounts;
  /// wgmma: the row_route of a grouped GEMM's rows, so that a tile half of
  /// padding rows skips its MMAs (mk.gemm's `padding`).
  Value paddingRows;
  SmallVector<Value> b, saves;
  bool transposeA = false, transposeB = false;
  FloatAttr limit;
  SmallVector<int64_t> maps;
  Value tensorMaps;
  mk::Engine engine = mk::Engine::wgmma; // with maps
  int64_t tileM = sched::kTileM, tileN = 2 * sched::kTileN;
  Value gatherRows; // a gathered A (wgmma): row r is a's row gatherRows[r] / k
  int64_t gatherTopK = 0;
  /// wgmma: warp roles (a producer warpgroup), with registers moved to the
  /// consumers when set.
  bool producer = false;
  DenseI64ArrayAttr registers;
  /// wgmma in clusters of 2 CTAs: the pair's tasks share each B box.
  bool multicast = false;
  /// out += the product (an f32 out: main_grad += dW).
  bool accumulate = false;
};

void createGemm(OpBuilder &b, Location loc, const GemmPlan &g) {
  bool tc = !g.maps.empty();
  MLIRContext *ctx = b.getContext();
  mk::GemmScheduleAttr schedule =
      tc ? mk::GemmScheduleAttr::get(
               ctx, g.engine, {g.tileM, g.tileN, sched::kTileK},
               sched::kStages, g.producer,
               g.producer && g.registers ? g.registers.asArrayRef()
                                         : ArrayRef<int64_t>(),
               g.multicast)
         : mk::GemmScheduleAttr::get(ctx, mk::Engine::simt);
  mk::GemmOp::create(
      b, loc, g.epilogue, g.a, g.b, g.out, g.rowExpert, g.offsets,
      tc ? g.tensorMaps : Value(), g.gatherRows, tc ? g.paddingRows : Value(),
      g.a2, g.kOffsets, g.kCounts, g.saves, schedule, g.limit,
      tc ? b.getDenseI64ArrayAttr(g.maps) : DenseI64ArrayAttr(),
      g.gatherRows ? b.getI64IntegerAttr(g.gatherTopK) : IntegerAttr(),
      g.transposeA, g.transposeB, g.accumulate);
}

/// Emits the schedule of `layer` into the body of `func`, whose arguments
/// are `params`.
void emitSchedule(OpBuilder &b, LayerOp layer, const Sizes &s,
                  ArrayRef<Param> params, gpu::GPUFuncOp func,
                  std::optional<mk::Engine> engine, const MapSlots &slots,
                  int64_t tileM, int64_t storeTileN, bool warpSpecialize,
                  int64_t cluster) {
  Location loc = layer.getLoc();
  Schedule frame(b, loc, params, func);
  llvm::StringMap<Value> &buf = frame.buf;
  Value clock = frame.clock;
  auto barrier = [&] { frame.barrier(); };
  // sm_90a: warp-specialized GEMMs (a producer warpgroup after the
  // consumers); with two consumer warpgroups, registers move to them.
  bool warpRoles = engine == mk::Engine::wgmma && warpSpecialize;
  DenseI64ArrayAttr registers;
  if (warpRoles && tileM == sched::kMaxConsumers * sched::kTileM)
    registers = b.getDenseI64ArrayAttr(
        {sched::kConsumerRegisters, sched::kProducerRegisters});

  // Phase 1: the routing plan.
  frame.plan(s);

  // Phase 2: dispatch (or, fused, the gate/up GEMM's A loads gather).
  if (!s.fusedDispatch) {
    mk::GatherOp::create(b, loc, buf["x"], buf["row_route"], buf["offsets"],
                         buf["routed_x"], /*scale=*/Value(), s.topK);
    barrier();
  }

  // Phases 3 (gate/up + SwiGLU) and 4 (down), routed and shared.
  FloatAttr limit = layer.getSwigluLimitAttr();
  auto gemm = [&](mk::Epilogue epilogue, StringRef a, ArrayRef<StringRef> bs,
                  StringRef out, bool grouped, ArrayRef<int64_t> mapSlots,
                  bool gathered = false, ArrayRef<StringRef> saves = {}) {
    GemmPlan g;
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
      g.tileN = epilogue == mk::Epilogue::store ? storeTileN : sched::kTileN;
      // wgmma's down projections skip the MMAs of a tile half that is all
      // padding.
      if (grouped && *engine == mk::Engine::wgmma &&
          epilogue == mk::Epilogue::store)
        g.paddingRows = buf["row_route"];
      g.producer = warpRoles;
      g.registers = registers;
      g.multicast = cluster > 1;
    }
    createGemm(b, loc, g);
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
    gemm(mk::Epilogue::swiglu, "x", {"gate_weights", "up_weights"}, "hidden",
         /*grouped=*/true, {slots.routedX, slots.gate, slots.up},
         /*gathered=*/true);
  else
    gemm(mk::Epilogue::swiglu, "routed_x", {"gate_weights", "up_weights"},
         "hidden", /*grouped=*/true, {slots.routedX, slots.gate, slots.up},
         /*gathered=*/false, routedSaves);
  if (s.hasShared())
    gemm(mk::Epilogue::swiglu, "x",
         {"shared_gate_weights", "shared_up_weights"}, "shared_hidden",
         /*grouped=*/false, {slots.x, slots.sharedGate, slots.sharedUp},
         /*gathered=*/false, sharedSaves);
  barrier();
  gemm(mk::Epilogue::store, "hidden", {"down_weights"}, "routed_y",
       /*grouped=*/true, {slots.hidden, slots.down});
  if (s.hasShared())
    gemm(mk::Epilogue::store, "shared_hidden", {"shared_down_weights"},
         "shared_out", /*grouped=*/false,
         {slots.sharedHidden, slots.sharedDown});
  barrier();

  // Phase 5: combine.
  mk::CombineOp::create(
      b, loc, buf["routed_y"], buf["route_row"], buf["router_weights"],
      s.hasShared() ? buf["shared_out"] : Value(), buf["out"]);
  // Profiling: one more barrier, so the last stamp follows every CTA.
  if (clock)
    barrier();
  assert((!clock ||
          frame.stamps ==
              static_cast<int64_t>(phaseNames(s.fusedDispatch).size()) + 1) &&
         "phaseNames() must name every phase");
  gpu::ReturnOp::create(b, loc);
}

/// The sizes of a forward or backward layer (static tokens, checked).
template <typename LayerLike> Sizes sizesOf(LayerLike layer) {
  PlanType plan = layer.getPlanType();
  auto x = cast<RankedTensorType>(layer.getX().getType());
  auto wg = cast<RankedTensorType>(layer.getGateWeights().getType());
  Sizes s{plan.getTokens(),       x.getDimSize(1), wg.getDimSize(1),
          plan.getLocalExperts(), plan.getTopK(),  plan.getPadding()};
  if (layer.hasSharedExpert())
    s.sharedInter =
        cast<RankedTensorType>(layer.getSharedWeights()[0].getType())
            .getDimSize(0);
  return s;
}

/// A kernel `<func>_<suffix>` in a new gpu.module `<func>_kernels` (one a
/// function), with its description; the builder is left at its body.
gpu::GPUFuncOp createKernel(OpBuilder &b, ModuleOp module, func::FuncOp func,
                            Operation *layer, StringRef suffix,
                            ArrayRef<Param> params, unsigned block,
                            DictionaryAttr description) {
  b.setInsertionPointToEnd(module.getBody());
  std::string name = func.getSymName().str();
  auto gpuModule =
      gpu::GPUModuleOp::create(b, layer->getLoc(), name + "_kernels");
  b.setInsertionPointToEnd(gpuModule.getBody());
  SmallVector<Type> argTypes;
  for (const Param &p : params)
    argTypes.push_back(p.type);
  auto kernel = gpu::GPUFuncOp::create(b, layer->getLoc(), name + suffix.str(),
                                       b.getFunctionType(argTypes, {}));
  kernel->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  kernel.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({static_cast<int32_t>(block), 1, 1}));
  // Persistent: one CTA per SM. Said to ptxas (.minnctapersm 1), whose
  // default is to aim for more CTAs per SM and so fewer registers (on
  // sm_100a it capped a layer at 80 registers and spilled).
  kernel->setAttr("nvvm.minctasm", b.getI32IntegerAttr(1));
  kernel->setAttr("mok.kernel", description);
  b.setInsertionPointToStart(&kernel.getBody().front());
  return kernel;
}

//===----------------------------------------------------------------------===//
// The backward (moe.layer_grad)
//===----------------------------------------------------------------------===//

/// The backward kernel's phases, in order (profiling names them).
SmallVector<StringRef> backwardPhaseNames(LayerGradOp grad) {
  SmallVector<StringRef> names = {"plan: count", "plan: scan", "plan: offsets",
                                  "plan: assign"};
  if (grad.recomputes())
    names.append({"recompute: dispatch", "recompute: gate/up"});
  names.append({"reverse combine", "down dgrad + wgrad", "SwiGLU backward",
                "gate/up dgrad + wgrads", "reverse dispatch"});
  return names;
}

/// The tensor-core plan of a backward (sm_90a, the shapes eligible): the
/// dgrads run on wgmma, reading the weights N-major; the slots of their
/// maps. Empty `maps` means every GEMM is simt.
struct BackwardMaps {
  SmallVector<TensorMapSpec> maps;
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
  int64_t tileM = sched::kTileM;
  /// sm_90a: 256-column tiles for the GEMMs of one B operand (as the
  /// forward's down projections) and the down dgrad's A gathered from d_out;
  /// sm_100a (tcgen05): [64, 128, 64] tiles and a routed copy of d_out.
  int64_t storeTileN = sched::kTileN;
  bool gatherDOut = false;
  mk::Engine engine = mk::Engine::wgmma;
};

BackwardMaps backwardMapsFor(const Sizes &s, StringRef chip, bool tensorCores,
                             bool recompute) {
  BackwardMaps m;
  if (!tensorCores || !s.tensorCoreEligible())
    return m;
  bool sm90 = chip == "sm_90a";
  // 128-row tiles (sm_90a) when the expert segments and the weight
  // gradients' M (H, I, I_s) are whole tiles of them.
  int64_t tall = sched::kMaxConsumers * sched::kTileM;
  if (sm90 && s.padding % tall == 0 && s.hidden % tall == 0)
    m.tileM = tall;
  if (sm90) {
    m.storeTileN = 2 * sched::kTileN;
    m.gatherDOut = true;
  } else {
    m.engine = mk::Engine::tcgen05;
  }
  int64_t next = 0, rc = s.routedCapacity(), h = s.hidden, in = s.inter;
  auto add = [&](TensorMapSpec spec) {
    m.maps.push_back(spec);
    int64_t slot = next;
    next += spec.experts;
    return slot;
  };
  // K-major A boxes of tileM rows; N-major B boxes of 64 x 64 over each
  // [K, N] matrix.
  auto a = [&](StringRef buffer, int64_t rows, int64_t cols) {
    return add(
        TensorMapSpec{buffer.str(), rows, cols, cols, m.tileM, sched::kTileK});
  };
  auto bT = [&](StringRef buffer, int64_t rows, int64_t cols,
                int64_t experts = 1) {
    return add(TensorMapSpec{buffer.str(), rows, cols, cols, sched::kTileK,
                             sched::kTileK, experts});
  };
  // sm_90a: the down dgrad gathers its A rows from d_out (one-row boxes:
  // the runtime checks d_out's alignment with them; never read on the
  // device).
  m.routedDOut =
      m.gatherDOut
          ? add(TensorMapSpec{"d_out", s.tokens, h, h, 1, sched::kTileK})
          : a("routed_d_out", rc, h);
  m.down = bT("down_weights", h, in, s.experts); // [H = K, I = N]
  m.dGate = a("d_gate", rc, in);
  m.dUp = a("d_up", rc, in);
  m.gate = bT("gate_weights", in, h, s.experts); // [I = K, H = N]
  m.up = bT("up_weights", in, h, s.experts);
  if (s.hasShared()) {
    int64_t t = s.tokens, is = s.sharedInter;
    m.dOut = a("d_out", t, h);
    m.sharedDown = bT("shared_down_weights", h, is);
    m.dSharedGate = a("d_shared_gate", t, is);
    m.dSharedUp = a("d_shared_up", t, is);
    m.sharedGate = bT("shared_gate_weights", is, h);
    m.sharedUp = bT("shared_up_weights", is, h);
  }
  m.dYT = bT("d_y", rc, h);
  m.hiddenT = bT("hidden", rc, in);
  m.dGateT = bT("d_gate", rc, in);
  m.dUpT = bT("d_up", rc, in);
  m.routedXT = bT("routed_x", rc, h);
  if (s.hasShared()) {
    int64_t t = s.tokens, is = s.sharedInter;
    m.dOutT = bT("d_out", t, h);
    m.sharedHiddenT = bT("shared_hidden", t, is);
    m.dSharedGateT = bT("d_shared_gate", t, is);
    m.dSharedUpT = bT("d_shared_up", t, is);
    m.xT = bT("x", t, h);
  }
  if (recompute) {
    auto bK = [&](StringRef buffer, int64_t rows, int64_t cols,
                  int64_t experts = 1) {
      return add(TensorMapSpec{buffer.str(), rows, cols, cols, sched::kTileN,
                               sched::kTileK, experts});
    };
    m.routedX = a("routed_x", rc, h);
    m.gateK = bK("gate_weights", in, h, s.experts); // [I = N, H = K]
    m.upK = bK("up_weights", in, h, s.experts);
    if (s.hasShared()) {
      m.x = a("x", s.tokens, h);
      m.sharedGateK = bK("shared_gate_weights", s.sharedInter, h);
      m.sharedUpK = bK("shared_up_weights", s.sharedInter, h);
    }
  }
  return m;
}

/// The backward kernel's parameters: `moe.layer_grad`'s operands (the saved
/// context by the names of moe.layer's results), its results (`d_` and the
/// operand's name), then the workspace.
SmallVector<Param> backwardParamsFor(LayerGradOp grad, const Sizes &s,
                                     bool profile, ArrayRef<TensorMapSpec> maps,
                                     bool gatherDOut) {
  Builder tb(grad.getContext());
  Type bf16 = tb.getBF16Type(), f32 = tb.getF32Type(), i64 = tb.getI64Type();
  auto ty = [&](ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  };
  auto tensorType = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return ty(t.getShape(), t.getElementType());
  };
  int64_t rc = s.routedCapacity(), t = s.tokens;
  SmallVector<Param> params;
  std::pair<StringRef, Value> operands[] = {
      {"d_out", grad.getDOut()},
      {"x", grad.getX()},
      {"top_experts", grad.getTopExperts()},
      {"router_weights", grad.getRouterWeights()}};
  for (auto [name, v] : operands)
    params.push_back({name.str(), "input", tensorType(v)});
  // With tensor-core GEMMs (maps), the kernel reads the weights only
  // through their tensor maps, as the forward does: the runtime may bind
  // weight views to them.
  std::string access = maps.empty() ? "pointer" : "tensor_maps";
  static const StringRef weightNames[] = {
      "gate_weights",        "up_weights",        "down_weights",
      "shared_gate_weights", "shared_up_weights", "shared_down_weights"};
  for (auto [name, w] : llvm::zip(weightNames, grad.getWeights()))
    params.push_back({name.str(), "input", tensorType(w), access});
  static const StringRef savedNames[] = {
      "routed_x",    "gate",      "up",           "hidden",
      "shared_gate", "shared_up", "shared_hidden"};
  // The context's routed rows (dynamic in moe.layer_grad) have the plan's
  // capacity, as the training forward's outputs do.
  for (size_t i = 0; i < grad.getSaved().size(); ++i) {
    int64_t rows = i < 4 ? rc : t;
    int64_t cols = i == 0 ? s.hidden : i < 4 ? s.inter : s.sharedInter;
    params.push_back({savedNames[i].str(), "input", ty({rows, cols}, bf16)});
  }
  params.push_back({"d_x", "output", tensorType(grad.getDX())});
  params.push_back(
      {"d_router_weights", "output", tensorType(grad.getDRouterWeights())});
  // With main_grads, the weights' gradients are fp32 outputs the kernel
  // adds into (the main_grad buffers themselves: main_grad + dW in place).
  for (auto [name, g] : llvm::zip(weightNames, grad.getWeightGradients())) {
    params.push_back({("d_" + name).str(), "output", tensorType(g)});
    params.back().accumulate = grad.accumulatesMainGrads();
  }
  params.push_back({"counts", "workspace", ty({s.experts}, i64)});
  params.push_back(
      {"chunk_counts", "workspace", ty({s.chunks(), s.experts}, i64)});
  params.push_back({"offsets", "workspace", ty({s.experts + 1}, i64)});
  params.push_back({"route_row", "workspace", ty({t * s.topK}, i64)});
  params.push_back({"row_route", "workspace", ty({rc}, i64)});
  params.push_back({"row_expert", "workspace", ty({rc}, i64)});
  if (grad.recomputes()) {
    params.push_back({"routed_x", "workspace", ty({rc, s.hidden}, bf16)});
    for (StringRef name : {"gate", "up", "hidden"})
      params.push_back({name.str(), "workspace", ty({rc, s.inter}, bf16)});
    if (s.hasShared())
      for (StringRef name : {"shared_gate", "shared_up", "shared_hidden"})
        params.push_back(
            {name.str(), "workspace", ty({t, s.sharedInter}, bf16)});
  }
  // d_out's routed rows, unscaled (the simt down dgrad's A; the wgmma one
  // gathers them itself) and scaled by the router weight (d_y, the down
  // weights' gradient's A).
  if (!gatherDOut)
    params.push_back({"routed_d_out", "workspace", ty({rc, s.hidden}, bf16)});
  params.push_back({"d_y", "workspace", ty({rc, s.hidden}, bf16)});
  params.push_back({"d_hidden_u", "workspace", ty({rc, s.inter}, f32)});
  params.push_back({"d_gate", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"d_up", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"d_routed_x", "workspace", ty({rc, s.hidden}, bf16)});
  if (s.hasShared()) {
    params.push_back(
        {"d_shared_hidden_u", "workspace", ty({t, s.sharedInter}, f32)});
    params.push_back(
        {"d_shared_gate", "workspace", ty({t, s.sharedInter}, bf16)});
    params.push_back(
        {"d_shared_up", "workspace", ty({t, s.sharedInter}, bf16)});
    params.push_back({"d_shared_x", "workspace", ty({t, s.hidden}, bf16)});
  }
  params.push_back({"grid_barrier", "workspace", ty({2}, tb.getI32Type())});
  if (profile)
    for (StringRef name : {"phase_clock", "phase_cycles"})
      params.push_back(
          {name.str(), "workspace",
           ty({static_cast<int64_t>(backwardPhaseNames(grad).size()) + 1},
              i64)});
  if (!maps.empty())
    params.push_back(
        {"tensor_maps", "tensor_maps", ty({16 * slotCount(maps)}, i64)});
  return params;
}

/// Emits the backward's schedule (docs/Backward.md) into `func`.
void emitBackwardSchedule(OpBuilder &b, LayerGradOp grad, const Sizes &s,
                          ArrayRef<Param> params, gpu::GPUFuncOp func,
                          int64_t phases, const BackwardMaps &tc) {
  Location loc = grad.getLoc();
  Schedule frame(b, loc, params, func);
  llvm::StringMap<Value> &buf = frame.buf;
  Value clock = frame.clock;
  auto barrier = [&] { frame.barrier(); };
  FloatAttr limit = grad.getSwigluLimitAttr();
  bool shared = s.hasShared();

  // The plan, rebuilt from top_experts: deterministic, so every routed row
  // is where the forward left it.
  frame.plan(s);
  auto gather = [&](StringRef from, StringRef into, Value scale) {
    mk::GatherOp::create(b, loc, buf[from], buf["row_route"], buf["offsets"],
                         buf[into], scale, s.topK);
  };

  // The GEMMs on tensor cores when the plan has maps for them.
  auto onTensorCores = [&](GemmPlan &g, ArrayRef<int64_t> slots) {
    if (tc.maps.empty())
      return;
    g.maps.assign(slots.begin(), slots.end());
    g.tensorMaps = buf["tensor_maps"];
    g.tileM = tc.tileM;
    g.tileN = tc.storeTileN;
    g.engine = tc.engine;
  };
  // Recompute: the forward's dispatch and gate/up GEMMs, storing the
  // activation's inputs as the training forward does.
  if (grad.recomputes()) {
    gather("x", "routed_x", Value());
    barrier();
    GemmPlan g;
    g.epilogue = mk::Epilogue::swiglu;
    g.a = buf["routed_x"];
    g.b = {buf["gate_weights"], buf["up_weights"]};
    g.out = buf["hidden"];
    g.rowExpert = buf["row_expert"];
    g.offsets = buf["offsets"];
    g.saves = {buf["gate"], buf["up"]};
    g.limit = limit;
    onTensorCores(g, {tc.routedX, tc.gateK, tc.upK});
    g.tileN = sched::kTileN;
    createGemm(b, loc, g);
    if (shared) {
      GemmPlan sg;
      sg.epilogue = mk::Epilogue::swiglu;
      sg.a = buf["x"];
      sg.b = {buf["shared_gate_weights"], buf["shared_up_weights"]};
      sg.out = buf["shared_hidden"];
      sg.saves = {buf["shared_gate"], buf["shared_up"]};
      sg.limit = limit;
      onTensorCores(sg, {tc.x, tc.sharedGateK, tc.sharedUpK});
      sg.tileN = sched::kTileN;
      createGemm(b, loc, sg);
    }
    barrier();
  }

  // Reverse combine: d_out's routed rows scaled (and, for a simt down
  // dgrad, unscaled).
  bool gathersDOut = tc.gatherDOut;
  if (!gathersDOut)
    gather("d_out", "routed_d_out", Value());
  gather("d_out", "d_y", buf["router_weights"]);
  barrier();

  // Down dgrad (fp32, unscaled) and the down weights' gradients.
  {
    GemmPlan g;
    g.a = gathersDOut ? buf["d_out"] : buf["routed_d_out"];
    if (gathersDOut) { // the dispatch of d_out fused into the A loads
      g.gatherRows = buf["row_route"];
      g.gatherTopK = s.topK;
    }
    g.b = {buf["down_weights"]}; // [E, H, I]: K = H, N = I
    g.transposeB = true;
    g.out = buf["d_hidden_u"];
    g.rowExpert = buf["row_expert"];
    g.offsets = buf["offsets"];
    if (tc.engine == mk::Engine::wgmma)
      g.paddingRows = buf["row_route"];
    onTensorCores(g, {tc.routedDOut, tc.down});
    createGemm(b, loc, g);
    GemmPlan w;
    w.a = buf["d_y"];      // [R, H]: K = rows, M = H
    w.b = {buf["hidden"]}; // [R, I]: K = rows, N = I
    w.transposeA = w.transposeB = true;
    w.kOffsets = buf["offsets"];
    w.kCounts = buf["counts"]; // past each expert's rows: zero padding
    w.out = buf["d_down_weights"];
    w.accumulate = grad.accumulatesMainGrads();
    onTensorCores(w, {tc.dYT, tc.hiddenT});
    createGemm(b, loc, w);
  }
  if (shared) {
    GemmPlan g;
    g.a = buf["d_out"];
    g.b = {buf["shared_down_weights"]}; // [H, I_s]
    g.transposeB = true;
    g.out = buf["d_shared_hidden_u"];
    onTensorCores(g, {tc.dOut, tc.sharedDown});
    createGemm(b, loc, g);
    GemmPlan w;
    w.a = buf["d_out"];
    w.b = {buf["shared_hidden"]};
    w.transposeA = w.transposeB = true;
    w.out = buf["d_shared_down_weights"];
    w.accumulate = grad.accumulatesMainGrads();
    onTensorCores(w, {tc.dOutT, tc.sharedHiddenT});
    createGemm(b, loc, w);
  }
  barrier();

  // SwiGLU backward and the router weights' gradient.
  mk::SwigluGradOp::create(
      b, loc, buf["d_hidden_u"], buf["gate"], buf["up"], buf["hidden"],
      buf["d_gate"], buf["d_up"], buf["row_route"], buf["route_row"],
      buf["router_weights"], buf["offsets"], buf["d_router_weights"], limit);
  if (shared)
    mk::SwigluGradOp::create(
        b, loc, buf["d_shared_hidden_u"], buf["shared_gate"], buf["shared_up"],
        buf["shared_hidden"], buf["d_shared_gate"], buf["d_shared_up"], Value(),
        Value(), Value(), Value(), Value(), limit);
  barrier();

  // The gate/up dgrad (both K-loops into one accumulator) and the gate and
  // up weights' gradients.
  auto dgrad = [&](StringRef dg, StringRef du, StringRef wg, StringRef wu,
                   StringRef out, bool grouped, ArrayRef<int64_t> slots) {
    GemmPlan g;
    g.a = buf[dg];
    g.a2 = buf[du];
    g.b = {buf[wg], buf[wu]}; // [(E,) I, H]: K = I, N = H
    g.transposeB = true;
    g.out = buf[out];
    if (grouped) {
      g.rowExpert = buf["row_expert"];
      g.offsets = buf["offsets"];
      // No padding skip (row_route as `padding`), unlike the down dgrad:
      // on the H200 the second k-loop slowed this GEMM's phase (qwen3-30b
      // 1.41 -> 1.52 ms, dsv3-shard 7.35 -> 7.75 ms), as it slowed the
      // forward's gate/up GEMM.
    }
    onTensorCores(g, slots);
    createGemm(b, loc, g);
  };
  auto wgrad = [&](StringRef dAct, StringRef xs, StringRef out, bool grouped,
                   ArrayRef<int64_t> slots) {
    GemmPlan w;
    w.a = buf[dAct]; // [K, I]
    w.b = {buf[xs]}; // [K, H]
    w.transposeA = w.transposeB = true;
    if (grouped) {
      w.kOffsets = buf["offsets"];
      w.kCounts = buf["counts"];
    }
    w.out = buf[out];
    w.accumulate = grad.accumulatesMainGrads();
    onTensorCores(w, slots);
    createGemm(b, loc, w);
  };
  dgrad("d_gate", "d_up", "gate_weights", "up_weights", "d_routed_x", true,
        {tc.dGate, tc.gate, tc.up, tc.dUp});
  wgrad("d_gate", "routed_x", "d_gate_weights", true, {tc.dGateT, tc.routedXT});
  wgrad("d_up", "routed_x", "d_up_weights", true, {tc.dUpT, tc.routedXT});
  if (shared) {
    dgrad("d_shared_gate", "d_shared_up", "shared_gate_weights",
          "shared_up_weights", "d_shared_x", false,
          {tc.dSharedGate, tc.sharedGate, tc.sharedUp, tc.dSharedUp});
    wgrad("d_shared_gate", "x", "d_shared_gate_weights", false,
          {tc.dSharedGateT, tc.xT});
    wgrad("d_shared_up", "x", "d_shared_up_weights", false,
          {tc.dSharedUpT, tc.xT});
  }
  barrier();

  // Reverse dispatch: each token sums its routed rows' d_x, in route order.
  mk::CombineOp::create(b, loc, buf["d_routed_x"], buf["route_row"],
                        /*router_weights=*/Value(),
                        shared ? buf["d_shared_x"] : Value(), buf["d_x"]);
  if (clock)
    barrier();
  assert((!clock || frame.stamps == phases + 1) &&
         "backwardPhaseNames() must name every phase");
  (void)phases;
  gpu::ReturnOp::create(b, loc);
}

struct ConvertMoEToMKPass
    : public mok::impl::ConvertMoEToMKBase<ConvertMoEToMKPass> {
  using ConvertMoEToMKBase::ConvertMoEToMKBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (chip != "sm_90a" && chip != "sm_100a") {
      module.emitError() << "convert-moe-to-mk: chip '" << chip
                         << "' is not supported; expected sm_90a or sm_100a";
      return signalPassFailure();
    }
    if (fuseDispatch && copyDispatch) {
      module.emitError() << "convert-moe-to-mk: fuse-dispatch and "
                            "copy-dispatch exclude each other";
      return signalPassFailure();
    }
    if (fuseDispatch && chip != "sm_90a") {
      module.emitError() << "convert-moe-to-mk: fuse-dispatch is "
                            "implemented for sm_90a only";
      return signalPassFailure();
    }
    if (multicast && (chip != "sm_90a" || warpSpecialize)) {
      module.emitError() << "convert-moe-to-mk: multicast is implemented for "
                            "sm_90a without warp-specialize only";
      return signalPassFailure();
    }
    if (warpSpecialize && chip != "sm_90a") {
      module.emitError() << "convert-moe-to-mk: warp-specialize is "
                            "implemented for sm_90a (wgmma) only, not "
                         << chip;
      return signalPassFailure();
    }
    if (blockSize < 32 || blockSize > 1024 || blockSize % 32) {
      module.emitError() << "convert-moe-to-mk: block-size must be a "
                            "multiple of 32 in [32, 1024], got "
                         << blockSize;
      return signalPassFailure();
    }
    SmallVector<std::pair<func::FuncOp, LayerOp>> layers;
    SmallVector<std::pair<func::FuncOp, LayerGradOp>> grads;
    WalkResult walk = module.walk([&](Operation *op) {
      if (isa<MoEDialect>(op->getDialect()) && !isa<LayerOp, LayerGradOp>(op)) {
        op->emitError() << "convert-moe-to-mk: '" << op->getName()
                        << "' must be fused first (run --moe-fuse-layer)";
        return WalkResult::interrupt();
      }
      if (!isa<LayerOp, LayerGradOp>(op))
        return WalkResult::advance();
      PlanType plan = isa<LayerOp>(op) ? cast<LayerOp>(op).getPlanType()
                                       : cast<LayerGradOp>(op).getPlanType();
      if (plan.getEp() != 1) {
        op->emitError() << "convert-moe-to-mk: expert parallelism (ep = "
                        << plan.getEp() << ") is not supported yet";
        return WalkResult::interrupt();
      }
      if (!plan.hasStaticTokens()) {
        op->emitError("convert-moe-to-mk: a dynamic token count is not "
                      "supported yet; the GPU kernel is compiled for one T");
        return WalkResult::interrupt();
      }
      // The backward and the training forward have their own tensor-core
      // plan (docs/Backward.md), without warp roles, clusters or the fused
      // dispatch of x: those options are refused for them, not ignored.
      bool training = isa<LayerGradOp>(op) || cast<LayerOp>(op).savesContext();
      if (training && (warpSpecialize || fuseDispatch || multicast)) {
        op->emitError() << "convert-moe-to-mk: "
                        << (warpSpecialize ? "warp-specialize"
                            : fuseDispatch ? "fuse-dispatch"
                                           : "multicast")
                        << " is not implemented for "
                        << (isa<LayerGradOp>(op)
                                ? "the backward (moe.layer_grad)"
                                : "the training forward (saved context)")
                        << " yet";
        return WalkResult::interrupt();
      }
      auto func = op->getParentOfType<func::FuncOp>();
      if (auto grad = dyn_cast<LayerGradOp>(op))
        grads.push_back({func, grad});
      else
        layers.push_back({func, cast<LayerOp>(op)});
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();

    MLIRContext *ctx = &getContext();
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(ctx));
    for (auto [func, layer] : layers) {
      Sizes s = sizesOf(layer);

      // The plan: tensor-core GEMMs for the chip when the shapes fit.
      std::optional<mk::Engine> engine;
      SmallVector<TensorMapSpec> maps;
      MapSlots slots{};
      unsigned block = blockSize;
      // On sm_90a the down projections (one B operand) take 256-column
      // tiles (twice the work per A tile and per k-tile sync, the same
      // stage bytes as gate + up), and when the expert segments are whole
      // 128-row tiles every GEMM takes 128-row tiles: two consumer
      // warpgroups compute, sharing each B box, and a producer warpgroup
      // after them loads (kernels of producerBlock(tileM) threads).
      int64_t tileM = sched::kTileM, storeTileN = sched::kTileN;
      int64_t cluster = 1;
      if (tensorCores && s.tensorCoreEligible()) {
        engine = chip == "sm_100a" ? mk::Engine::tcgen05 : mk::Engine::wgmma;
        if (*engine == mk::Engine::wgmma) {
          storeTileN = 2 * sched::kTileN;
          if (s.padding % (sched::kMaxConsumers * sched::kTileM) == 0)
            tileM = sched::kMaxConsumers * sched::kTileM;
        }
        // The fused dispatch on wgmma, unless the copy is asked for; with
        // warp roles (the producer warpgroup gathers) only when asked for:
        // under the producer's 56 registers ptxas spills a few values of
        // those kernels (40-200 bytes on the benchmark shapes), and on the
        // H200 it did not speed dsv3-shard up (docs/performance.md).
        // (The training forward saves routed_x: the dispatch copy.)
        s.fusedDispatch = !copyDispatch && *engine == mk::Engine::wgmma &&
                          (!warpSpecialize || fuseDispatch) &&
                          !layer.savesContext();
        // Clusters of 2 (weight boxes multicast to pairs of tasks): wgmma
        // without a producer (the options are checked above).
        if (multicast)
          cluster = 2;
        maps = tensorMapsFor(s, slots, tileM, storeTileN, cluster);
        block = *engine == mk::Engine::wgmma && warpSpecialize
                    ? sched::producerBlock(tileM)
                    : sched::kBlock;
      }
      // The options that change the tensor-core GEMMs are refused, not
      // ignored, for a layer that runs scalar GEMMs.
      if (!engine && (warpSpecialize || fuseDispatch || multicast)) {
        layer.emitError()
            << "convert-moe-to-mk: "
            << (warpSpecialize ? "warp-specialize"
                : fuseDispatch ? "fuse-dispatch"
                               : "multicast")
            << " needs tensor-core GEMMs, and this layer runs scalar ones "
            << (tensorCores ? "(its shapes do not fit the tiles: H % 64, I "
                              "and I_s % 128, padding % 64 must be 0)"
                            : "(tensor-cores=false)");
        return signalPassFailure();
      }
      SmallVector<Param> params = paramsFor(layer, s, maps, profile);

      OpBuilder b(ctx);
      gpu::GPUFuncOp kernel =
          createKernel(b, module, func, layer, "_forward", params, block,
                       describeKernel(ctx, params, s, chip, block, maps,
                                      profile ? phaseNames(s.fusedDispatch)
                                              : ArrayRef<StringRef>(),
                                      cluster));
      emitSchedule(b, layer, s, params, kernel, engine, slots, tileM,
                   storeTileN, warpSpecialize, cluster);
    }
    for (auto [func, grad] : grads) {
      Sizes s = sizesOf(grad);
      SmallVector<StringRef> phases = backwardPhaseNames(grad);
      BackwardMaps tc =
          backwardMapsFor(s, chip, tensorCores, grad.recomputes());
      SmallVector<Param> params =
          backwardParamsFor(grad, s, profile, tc.maps, tc.gatherDOut);
      unsigned block = tc.maps.empty() ? blockSize : sched::kBlock;
      OpBuilder b(ctx);
      gpu::GPUFuncOp kernel =
          createKernel(b, module, func, grad, "_backward", params, block,
                       describeKernel(ctx, params, s, chip, block, tc.maps,
                                      profile ? ArrayRef<StringRef>(phases)
                                              : ArrayRef<StringRef>(),
                                      /*cluster=*/1));
      emitBackwardSchedule(b, grad, s, params, kernel,
                           static_cast<int64_t>(phases.size()), tc);
    }
  }
};

} // namespace
