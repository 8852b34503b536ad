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
#include "mok/Conversion/MKToGPU/MKToGPU.h"
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
namespace sched = mok::mk_schedule;

namespace {

/// One kernel parameter: a buffer of static shape, passed as a bare pointer.
struct Param {
  std::string name;
  std::string role; // "input", "output", "workspace" or "tensor_maps"
  MemRefType type;
  /// Inputs only: "tensor_maps" when the kernel never dereferences the
  /// pointer (it reads the buffer through tensor maps), else "pointer".
  std::string access = "pointer";
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
  /// Routes a thread of the routing plan walks, one after the other (a
  /// read-modify-write of its chunk's counters each): at least 16, and few
  /// enough chunks (<= 2048) for the scan, one warp an expert, to stay
  /// short. (64 and <= 1024, scanned by one thread an expert, took 65 us of
  /// planning on dsv3-shard and 114 us on qwen3-30b on the H200.)
  int64_t chunk() const {
    int64_t routes = tokens * topK;
    return std::max<int64_t>(16, (routes + 2047) / 2048);
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
  params.push_back({"counts", "workspace", ty({s.experts}, i64)});
  params.push_back(
      {"chunk_counts", "workspace", ty({s.chunks(), s.experts}, i64)});
  params.push_back({"offsets", "workspace", ty({s.experts + 1}, i64)});
  params.push_back({"route_row", "workspace", ty({s.tokens * s.topK}, i64)});
  params.push_back({"row_route", "workspace", ty({rc}, i64)});
  params.push_back({"row_expert", "workspace", ty({rc}, i64)});
  if (!s.fusedDispatch)
    params.push_back({"routed_x", "workspace", ty({rc, s.hidden}, bf16)});
  params.push_back({"hidden", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"routed_y", "workspace", ty({rc, s.hidden}, bf16)});
  if (layer.hasSharedExpert()) {
    params.push_back(
        {"shared_hidden", "workspace", ty({s.tokens, s.sharedInter}, bf16)});
    params.push_back(
        {"shared_out", "workspace", ty({s.tokens, s.hidden}, bf16)});
  }
  // [arrived CTAs, generation]; zero before the first launch, and left
  // reusable by every launch.
  params.push_back({"grid_barrier", "workspace", ty({2}, tb.getI32Type())});
  // Profiling: %globaltimer at the start and after each phase.
  if (profile)
    params.push_back(
        {"phase_clock", "workspace",
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
                              ArrayRef<TensorMapSpec> tensorMaps, bool profile,
                              int64_t cluster) {
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
  if (profile) {
    SmallVector<Attribute> names;
    for (StringRef n : phaseNames(s.fusedDispatch))
      names.push_back(b.getStringAttr(n));
    entries.push_back(b.getNamedAttr("phases", b.getArrayAttr(names)));
  }
  return b.getDictionaryAttr(entries);
}

/// Emits the schedule of `layer` into the body of `func`, whose arguments
/// are `params`.
void emitSchedule(OpBuilder &b, LayerOp layer, const Sizes &s,
                  ArrayRef<Param> params, gpu::GPUFuncOp func,
                  std::optional<mk::Engine> engine, const MapSlots &slots,
                  int64_t tileM, int64_t storeTileN, bool warpSpecialize) {
  Location loc = layer.getLoc();
  llvm::StringMap<Value> buf;
  for (auto [i, p] : llvm::enumerate(params))
    buf[p.name] = func.getArgument(i);
  Value clock = buf.lookup("phase_clock");
  int64_t stamps = 0;
  auto timestamp = [&] {
    if (clock)
      mk::TimestampOp::create(b, loc, clock, stamps++);
  };
  auto barrier = [&] {
    mk::GridBarrierOp::create(b, loc, buf["grid_barrier"]);
    timestamp();
  };
  timestamp();
  // sm_90a: warp-specialized GEMMs (a producer warpgroup after the
  // consumers); with two consumer warpgroups, registers move to them.
  bool warpRoles = engine == mk::Engine::wgmma && warpSpecialize;
  DenseI64ArrayAttr registers;
  if (warpRoles && tileM == sched::kMaxConsumers * sched::kTileM)
    registers = b.getDenseI64ArrayAttr(
        {sched::kConsumerRegisters, sched::kProducerRegisters});

  // Phase 1: the routing plan, parallel over chunks of routes and over
  // experts, and deterministic (rows in route order within each expert).
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

  // Phase 2: dispatch (or, fused, the gate/up GEMM's A loads gather).
  if (!s.fusedDispatch) {
    mk::GatherOp::create(b, loc, buf["x"], buf["row_route"], buf["offsets"],
                         buf["routed_x"], s.topK);
    barrier();
  }

  // Phases 3 (gate/up + SwiGLU) and 4 (down), routed and shared.
  FloatAttr limit = layer.getSwigluLimitAttr();
  auto gemm = [&](mk::Epilogue epilogue, StringRef a, ArrayRef<StringRef> bs,
                  StringRef out, bool grouped, ArrayRef<int64_t> mapSlots,
                  bool gathered = false) {
    SmallVector<Value> bValues;
    for (StringRef name : bs)
      bValues.push_back(buf[name]);
    Value rowExpert = grouped ? buf["row_expert"] : Value();
    Value offsets = grouped ? buf["offsets"] : Value();
    mk::Engine e = engine.value_or(mk::Engine::simt);
    bool tc = engine.has_value();
    mk::GemmOp::create(
        b, loc, e, epilogue, buf[a], bValues, buf[out], rowExpert, offsets,
        tc ? buf["tensor_maps"] : Value(),
        gathered ? buf["row_route"] : Value(),
        // wgmma's down projections skip the MMAs of a tile half that is
        // all padding.
        grouped && e == mk::Engine::wgmma && epilogue == mk::Epilogue::store
            ? buf["row_route"]
            : Value(),
        epilogue == mk::Epilogue::swiglu ? limit : FloatAttr(),
        tc ? b.getDenseI64ArrayAttr(
                 {tileM,
                  epilogue == mk::Epilogue::store ? storeTileN : sched::kTileN,
                  sched::kTileK})
           : DenseI64ArrayAttr(),
        tc ? b.getI64IntegerAttr(sched::kStages) : IntegerAttr(),
        tc ? b.getDenseI64ArrayAttr(mapSlots) : DenseI64ArrayAttr(),
        /*producer=*/warpRoles, warpRoles ? registers : DenseI64ArrayAttr(),
        gathered ? b.getI64IntegerAttr(s.topK) : IntegerAttr());
  };
  if (s.fusedDispatch)
    gemm(mk::Epilogue::swiglu, "x", {"gate_weights", "up_weights"}, "hidden",
         /*grouped=*/true, {slots.routedX, slots.gate, slots.up},
         /*gathered=*/true);
  else
    gemm(mk::Epilogue::swiglu, "routed_x", {"gate_weights", "up_weights"},
         "hidden", /*grouped=*/true, {slots.routedX, slots.gate, slots.up});
  if (s.hasShared())
    gemm(mk::Epilogue::swiglu, "x",
         {"shared_gate_weights", "shared_up_weights"}, "shared_hidden",
         /*grouped=*/false, {slots.x, slots.sharedGate, slots.sharedUp});
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
          stamps ==
              static_cast<int64_t>(phaseNames(s.fusedDispatch).size()) + 1) &&
         "phaseNames() must name every phase");
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
    WalkResult walk = module.walk([&](Operation *op) {
      if (isa<LayerGradOp>(op)) {
        op->emitError("convert-moe-to-mk: moe.layer_grad (backward) is not "
                      "supported on the GPU yet");
        return WalkResult::interrupt();
      }
      if (isa<MoEDialect>(op->getDialect()) && !isa<LayerOp>(op)) {
        op->emitError() << "convert-moe-to-mk: '" << op->getName()
                        << "' must be fused first (run --moe-fuse-layer)";
        return WalkResult::interrupt();
      }
      auto layer = dyn_cast<LayerOp>(op);
      if (!layer)
        return WalkResult::advance();
      PlanType plan = layer.getPlanType();
      if (plan.getEp() != 1) {
        layer.emitError() << "convert-moe-to-mk: expert parallelism (ep = "
                          << plan.getEp() << ") is not supported yet";
        return WalkResult::interrupt();
      }
      if (!plan.hasStaticTokens()) {
        layer.emitError("convert-moe-to-mk: a dynamic token count is not "
                        "supported yet; the GPU kernel is compiled for one T");
        return WalkResult::interrupt();
      }
      if (layer.savesContext()) {
        layer.emitError("convert-moe-to-mk: the saved context (training "
                        "forward) is not supported on the GPU yet");
        return WalkResult::interrupt();
      }
      layers.push_back({layer->getParentOfType<func::FuncOp>(), layer});
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();

    MLIRContext *ctx = &getContext();
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(ctx));
    for (auto [func, layer] : layers) {
      PlanType plan = layer.getPlanType();
      auto x = cast<RankedTensorType>(layer.getX().getType());
      auto wg = cast<RankedTensorType>(layer.getGateWeights().getType());
      Sizes s{plan.getTokens(),       x.getDimSize(1), wg.getDimSize(1),
              plan.getLocalExperts(), plan.getTopK(),  plan.getPadding()};
      if (layer.hasSharedExpert())
        s.sharedInter = cast<RankedTensorType>(layer.getSharedGate().getType())
                            .getDimSize(0);

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
        s.fusedDispatch = !copyDispatch && *engine == mk::Engine::wgmma &&
                          (!warpSpecialize || fuseDispatch);
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
      b.setInsertionPointToEnd(module.getBody());
      std::string name = func.getSymName().str();
      auto gpuModule =
          gpu::GPUModuleOp::create(b, layer.getLoc(), name + "_kernels");
      b.setInsertionPointToEnd(gpuModule.getBody());
      SmallVector<Type> argTypes;
      for (const Param &p : params)
        argTypes.push_back(p.type);
      auto kernel = gpu::GPUFuncOp::create(b, layer.getLoc(), name + "_forward",
                                           b.getFunctionType(argTypes, {}));
      kernel->setAttr(gpu::GPUDialect::getKernelFuncAttrName(),
                      b.getUnitAttr());
      kernel.setKnownBlockSizeAttr(
          b.getDenseI32ArrayAttr({static_cast<int32_t>(block), 1, 1}));
      // Persistent: one CTA per SM. Said to ptxas (.minnctapersm 1), whose
      // default is to aim for more CTAs per SM and so fewer registers (on
      // sm_100a it capped a layer at 80 registers and spilled).
      kernel->setAttr("nvvm.minctasm", b.getI32IntegerAttr(1));
      kernel->setAttr("mok.kernel", describeKernel(ctx, params, s, chip, block,
                                                   maps, profile, cluster));
      b.setInsertionPointToStart(&kernel.getBody().front());
      emitSchedule(b, layer, s, params, kernel, engine, slots, tileM,
                   storeTileN, warpSpecialize);
    }
  }
};

} // namespace
