// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-gpu: a fused forward moe.layer → one persistent kernel in
// a gpu.module, run in phases separated by grid-wide barriers.
//
// Every phase distributes its outermost iterations over all threads of the
// grid (grid-stride loops) and computes each element exactly as the CPU
// reference does, with the same scalar emitter; the plan is built on the
// device, so a forward needs no host synchronization. The GEMM phases of an
// eligible layer are TMA + tensor-core tile loops instead (GemmPipeline.h),
// with the same rounding points: wgmma on sm_90a (Hopper.h), tcgen05 on
// sm_100a (Blackwell.h).
//
#include "Blackwell.h"
#include "GemmPipeline.h"
#include "Hopper.h"
#include "mok/Conversion/Common/ScalarEmitter.h"
#include "mok/Conversion/MoEToGPU/MoEToGPU.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/BuiltinOps.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMOETOGPU
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok::moe;
using namespace mok::conversion;

namespace {

/// One kernel parameter: a buffer of static shape, passed as a bare pointer.
struct Param {
  std::string name;
  std::string role; // "input", "output", "workspace" or "tensor_maps"
  MemRefType type;
};

/// The sizes of the layer, all static.
struct Sizes {
  int64_t tokens, hidden, inter, experts, topK, padding, sharedInter = 0;
  int64_t routedCapacity() const {
    return tokens * topK + experts * (padding - 1);
  }
  bool hasShared() const { return sharedInter > 0; }
  /// Whether the tensor-core GEMM phases (TMA + wgmma on sm_90a, TMA +
  /// tcgen05 on sm_100a) apply: K and N fit the tiles (H, the down GEMMs' N,
  /// may be a multiple of 64: the last n-tile's extra columns are computed
  /// and dropped), and every expert segment of the plan is a whole number of
  /// 64-row m-tiles. TMA coordinates are 32-bit.
  bool tensorCoreEligible() const {
    using namespace gemm;
    int64_t maxRows = std::max({routedCapacity(), experts * inter,
                                experts * hidden, tokens, hidden,
                                sharedInter});
    return hidden % kTileK == 0 && inter % kTileN == 0 &&
           (!hasShared() || sharedInter % kTileN == 0) &&
           padding % kTileM == 0 && maxRows < (int64_t(1) << 31);
  }
};

class KernelBuilder {
public:
  KernelBuilder(LayerOp layer, const Sizes &s) : layer(layer), s(s) {}

  /// Emits the kernel into `gpuModule`; returns its parameters. With
  /// `tensorMaps` non-empty (eligible layer), the GEMM phases are tensor-core
  /// tile loops for `chip` reading those maps, and blockSize is
  /// gemm::kBlock.
  SmallVector<Param> build(gpu::GPUModuleOp gpuModule, StringRef name,
                           StringRef chip, unsigned blockSize,
                           ArrayRef<gemm::TensorMapSpec> tensorMaps);

private:
  LayerOp layer;
  Sizes s;
  DenseMap<StringRef, Value> buf;
  Value gridThreads, globalId, numBlocks;

  void forAll(Emitter &e, Value n, function_ref<void(Value)> body) {
    e.loop(globalId, n, gridThreads, body);
  }
  /// for (r, c) in [0, rows) x [0, cols), distributed over the grid.
  void forAll2(Emitter &e, Value rows, int64_t cols,
               function_ref<void(Value, Value)> body) {
    Value c = e.index(cols);
    forAll(e, e.mul(rows, c), [&](Value i) { body(e.div(i, c), e.rem(i, c)); });
  }
  void gridBarrier(Emitter &e);
  /// Phases 3 (gate/up + SwiGLU) and 4 (down), each ending with a grid
  /// barrier: scalar FMA loops, or tensor-core tile loops.
  void scalarGemms(Emitter &e, Limit limit);
  void tensorCoreGemms(Emitter &e, gemm::GemmEmitter &gemm, Limit limit);
  Value rows(Emitter &e) { // R, the padded routed row count of the plan
    return e.toIndex(e.load(buf["offsets"], {e.index(s.experts)}));
  }
};

/// The tensor maps of the tensor-core GEMM phases, in index order (MapIndex).
enum MapIndex : unsigned {
  kRoutedX, kGate, kUp, kHidden, kDown, // routed experts
  kX, kSharedGate, kSharedUp, kSharedHidden, kSharedDown, // shared expert
};

static SmallVector<gemm::TensorMapSpec> tensorMapsFor(const Sizes &s) {
  using namespace gemm;
  int64_t rc = s.routedCapacity(), h = s.hidden, in = s.inter, e = s.experts;
  SmallVector<TensorMapSpec> maps = {
      operandA("routed_x", rc, h),        // gate/up A: [Rcap, H]
      operandB("gate_weights", e * in, h), // [E, I, H] as [E*I, H]
      operandB("up_weights", e * in, h),
      operandA("hidden", rc, in),          // down A: [Rcap, I]
      operandB("down_weights", e * h, in), // [E, H, I] as [E*H, I]
  };
  if (s.hasShared()) {
    int64_t is = s.sharedInter, t = s.tokens;
    maps.append({operandA("x", t, h), operandB("shared_gate_weights", is, h),
                 operandB("shared_up_weights", is, h),
                 operandA("shared_hidden", t, is),
                 operandB("shared_down_weights", h, is)});
  }
  return maps;
}

void KernelBuilder::gridBarrier(Emitter &e) {
  // Sense-free generation barrier: the last CTA to arrive resets the count
  // and bumps the generation the others spin on. Thread 0 of each CTA
  // arrives after a CTA barrier, with release/acquire fences at system
  // scope around it, so every thread's writes of the phase are visible to
  // every thread of the next.
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value bar = buf["grid_barrier"];
  gpu::BarrierOp::create(b, loc);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, tid, e.index(0)), [&] {
    Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
    Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
    Value c0 = e.index(0), c1 = e.index(1);
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel);
    Value gen = memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                            zero, bar, ValueRange{c1});
    Value arrived = memref::AtomicRMWOp::create(
        b, loc, arith::AtomicRMWKind::addi, one, bar, ValueRange{c0});
    Value blocks = arith::IndexCastOp::create(b, loc, b.getI32Type(), numBlocks);
    Value last = e.cmp(arith::CmpIPredicate::eq,
                       arith::AddIOp::create(b, loc, arrived, one), blocks);
    e.ifThen(
        last,
        [&] {
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::assign,
                                      zero, bar, ValueRange{c0});
          LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel);
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
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel);
  });
  gpu::BarrierOp::create(b, loc);
}

void KernelBuilder::scalarGemms(Emitter &e, Limit limit) {
  // Phase 3: gate/up + SwiGLU, routed and shared.
  auto gateUp = [&](Value in, Value row, Value wg, Value wu,
                    SmallVector<Value> prefix, Value i, Value out) {
    auto dot = [&](Value w) {
      return e.roundBF16(e.sum(s.hidden, [&](Value j) {
        SmallVector<Value> widx(prefix);
        widx.append({i, j});
        return e.mul(e.loadF32(in, {row, j}), e.loadF32(w, widx));
      }));
    };
    e.storeRounded(swiglu(e, dot(wg), dot(wu), limit), out, {row, i});
  };
  forAll2(e, rows(e), s.inter, [&](Value r, Value i) {
    Value ex = e.toIndex(e.load(buf["row_expert"], {r}));
    // Padding rows have an expert too (their segment's): their routed_x is
    // zero, so they compute zeros, as on the CPU.
    gateUp(buf["routed_x"], r, buf["gate_weights"], buf["up_weights"], {ex}, i,
           buf["hidden"]);
  });
  if (layer.hasSharedExpert())
    forAll2(e, e.index(s.tokens), s.sharedInter, [&](Value t, Value i) {
      gateUp(buf["x"], t, buf["shared_gate_weights"], buf["shared_up_weights"],
             {}, i, buf["shared_hidden"]);
    });
  gridBarrier(e);

  // Phase 4: down projections.
  auto down = [&](Value in, Value row, Value w, SmallVector<Value> prefix,
                  Value j, int64_t inner, Value out) {
    Value acc = e.sum(inner, [&](Value i) {
      SmallVector<Value> widx(prefix);
      widx.append({j, i});
      return e.mul(e.loadF32(in, {row, i}), e.loadF32(w, widx));
    });
    e.storeRounded(acc, out, {row, j});
  };
  forAll2(e, rows(e), s.hidden, [&](Value r, Value j) {
    Value ex = e.toIndex(e.load(buf["row_expert"], {r}));
    down(buf["hidden"], r, buf["down_weights"], {ex}, j, s.inter,
         buf["routed_y"]);
  });
  if (layer.hasSharedExpert())
    forAll2(e, e.index(s.tokens), s.hidden, [&](Value t, Value j) {
      down(buf["shared_hidden"], t, buf["shared_down_weights"], {}, j,
           s.sharedInter, buf["shared_out"]);
    });
  gridBarrier(e);
}

void KernelBuilder::tensorCoreGemms(Emitter &e, gemm::GemmEmitter &gemm,
                                    Limit limit) {
  Value routed = rows(e), tokens = e.index(s.tokens);
  // An m-tile lies in one expert's segment (segments are whole multiples of
  // the padding, itself a multiple of the tile), so its weights are that
  // expert's rows of the [E*N, K] view. Padding rows compute zeros, as on
  // the CPU.
  auto expertRows = [&](int64_t n) {
    return [&, n](Value m0) {
      Value ex = e.toIndex(e.load(buf["row_expert"], {m0}));
      return e.mul(ex, e.index(n));
    };
  };
  auto gateUpRows = expertRows(s.inter), downRows = expertRows(s.hidden);
  auto firstRow = [&](Value) { return e.index(0); };
  // gate and up are each rounded to bf16, then the SwiGLU in f32.
  auto storeSwiglu = [&](StringRef out) {
    return [&, out](Value row, Value col, Value g, Value u) {
      e.storeRounded(swiglu(e, e.roundBF16(g), e.roundBF16(u), limit),
                     buf[out], {row, col});
    };
  };
  auto storeDown = [&](StringRef out) {
    return [&, out](Value row, Value col, Value y, Value) {
      e.storeRounded(y, buf[out], {row, col});
    };
  };
  auto routedHidden = storeSwiglu("hidden"),
       sharedHidden = storeSwiglu("shared_hidden");
  auto routedY = storeDown("routed_y"), sharedOut = storeDown("shared_out");

  // Phase 3: gate/up + SwiGLU, routed and shared.
  gemm.emit({kRoutedX, kGate, kUp, s.hidden, s.inter, routed, gateUpRows,
             routedHidden});
  if (s.hasShared())
    gemm.emit({kX, kSharedGate, kSharedUp, s.hidden, s.sharedInter, tokens,
               firstRow, sharedHidden});
  gridBarrier(e);

  // Phase 4: down projections.
  gemm.emit({kHidden, kDown, std::nullopt, s.inter, s.hidden, routed,
             downRows, routedY});
  if (s.hasShared())
    gemm.emit({kSharedHidden, kSharedDown, std::nullopt, s.sharedInter,
               s.hidden, tokens, firstRow, sharedOut});
  gridBarrier(e);
  // After the grid barrier's CTA barrier (sm_100a: frees Tensor Memory).
  gemm.finish();
}

SmallVector<Param>
KernelBuilder::build(gpu::GPUModuleOp gpuModule, StringRef name,
                     StringRef chip, unsigned blockSize,
                     ArrayRef<gemm::TensorMapSpec> tensorMaps) {
  MLIRContext *ctx = layer.getContext();
  Builder tb(ctx);
  Type bf16 = tb.getBF16Type(), i64 = tb.getI64Type();
  auto ty = [&](ArrayRef<int64_t> shape, Type elt) {
    return MemRefType::get(shape, elt);
  };
  auto tensorType = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    return ty(t.getShape(), t.getElementType());
  };
  int64_t rc = s.routedCapacity();
  SmallVector<Param> params = {
      {"x", "input", tensorType(layer.getX())},
      {"top_experts", "input", tensorType(layer.getTopExperts())},
      {"router_weights", "input", tensorType(layer.getRouterWeights())},
      {"gate_weights", "input", tensorType(layer.getGateWeights())},
      {"up_weights", "input", tensorType(layer.getUpWeights())},
      {"down_weights", "input", tensorType(layer.getDownWeights())}};
  if (layer.hasSharedExpert()) {
    params.push_back({"shared_gate_weights", "input",
                      tensorType(layer.getSharedGate())});
    params.push_back(
        {"shared_up_weights", "input", tensorType(layer.getSharedUp())});
    params.push_back(
        {"shared_down_weights", "input", tensorType(layer.getSharedDown())});
  }
  params.push_back({"out", "output", tensorType(layer.getOut())});
  params.push_back({"counts", "workspace", ty({s.experts}, i64)});
  params.push_back({"offsets", "workspace", ty({s.experts + 1}, i64)});
  params.push_back({"route_row", "workspace", ty({s.tokens * s.topK}, i64)});
  params.push_back({"row_route", "workspace", ty({rc}, i64)});
  params.push_back({"row_expert", "workspace", ty({rc}, i64)});
  params.push_back({"routed_x", "workspace", ty({rc, s.hidden}, bf16)});
  params.push_back({"hidden", "workspace", ty({rc, s.inter}, bf16)});
  params.push_back({"routed_y", "workspace", ty({rc, s.hidden}, bf16)});
  if (layer.hasSharedExpert()) {
    params.push_back(
        {"shared_hidden", "workspace", ty({s.tokens, s.sharedInter}, bf16)});
    params.push_back({"shared_out", "workspace", ty({s.tokens, s.hidden}, bf16)});
  }
  // [arrived CTAs, generation]; zero before the first launch, and left
  // reusable by every launch.
  params.push_back({"grid_barrier", "workspace", ty({2}, tb.getI32Type())});
  // The CUtensorMaps (128 bytes each) the runtime encodes from the
  // `tensor_maps` description; last, so the other parameters keep their
  // positions.
  if (!tensorMaps.empty())
    params.push_back({"tensor_maps", "tensor_maps",
                      ty({16 * static_cast<int64_t>(tensorMaps.size())}, i64)});

  SmallVector<Type> argTypes;
  for (const Param &p : params)
    argTypes.push_back(p.type);
  OpBuilder b = OpBuilder::atBlockEnd(gpuModule.getBody());
  auto func = gpu::GPUFuncOp::create(b, layer.getLoc(), name,
                                     b.getFunctionType(argTypes, {}));
  func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  func.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr(
      {static_cast<int32_t>(blockSize), 1, 1}));
  // Keys point into `params`, which outlives the map's use in this call.
  for (auto [i, p] : llvm::enumerate(params))
    buf[p.name] = func.getArgument(i);
  b.setInsertionPointToStart(&func.getBody().front());
  Location loc = layer.getLoc();
  Emitter e(b, loc);
  Limit limit = getLimit(layer.getSwigluLimitAttr());

  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value bdim = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  numBlocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  globalId = e.add(e.mul(bid, bdim), tid);
  gridThreads = e.mul(numBlocks, bdim);
  // The tensor-core phases' one-time setup (mbarriers, tensor map pointers;
  // sm_100a: Tensor Memory).
  std::unique_ptr<gemm::GemmEmitter> gemm;
  if (!tensorMaps.empty())
    gemm = chip == "sm_100a"
               ? sm100::createGemmEmitter(e, gpuModule, buf["tensor_maps"],
                                          tensorMaps)
               : sm90::createGemmEmitter(e, gpuModule, buf["tensor_maps"],
                                         tensorMaps);

  Value k = e.index(s.topK), numExperts = e.index(s.experts);
  Value routes = e.index(s.tokens * s.topK);
  Value none = arith::ConstantIntOp::create(b, loc, -1, 64);
  auto i64Of = [&](Value index) {
    return arith::IndexCastOp::create(b, loc, b.getI64Type(), index);
  };
  // The local expert of route q, or -1.
  auto expertOf = [&](Value q) {
    Value id = e.toIndex(e.load(buf["top_experts"], {e.div(q, k), e.rem(q, k)}));
    Value valid = arith::AndIOp::create(
        b, loc, e.cmp(arith::CmpIPredicate::sge, id, e.index(0)),
        e.cmp(arith::CmpIPredicate::slt, id, numExperts));
    return e.select(valid, id, e.index(-1));
  };

  // Phase 1: the routing plan.
  forAll(e, numExperts, [&](Value ex) {
    e.store(i64Of(e.index(0)), buf["counts"], {ex});
  });
  forAll(e, e.index(rc), [&](Value r) {
    e.store(none, buf["row_route"], {r});
    e.store(none, buf["row_expert"], {r});
  });
  gridBarrier(e);
  forAll(e, routes, [&](Value q) {
    Value ex = expertOf(q);
    e.ifThen(e.isValid(ex), [&] {
      Value one = arith::ConstantIntOp::create(b, loc, 1, 64);
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                  buf["counts"], ValueRange{ex});
    });
  });
  gridBarrier(e);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    Value pad = e.index(s.padding);
    Value total = e.fold(e.index(0), numExperts, e.index(0),
                         [&](Value ex, Value start) {
                           e.store(i64Of(start), buf["offsets"], {ex});
                           Value c = e.toIndex(e.load(buf["counts"], {ex}));
                           Value padded = e.mul(
                               e.div(e.add(c, e.index(s.padding - 1)), pad), pad);
                           return e.add(start, padded);
                         });
    e.store(i64Of(total), buf["offsets"], {numExperts});
  });
  gridBarrier(e);
  // Rows in route order within each expert: one thread an expert scans the
  // routes in order, so the assignment is deterministic.
  forAll(e, numExperts, [&](Value ex) {
    Value start = e.toIndex(e.load(buf["offsets"], {ex}));
    e.fold(e.index(0), routes, start, [&](Value q, Value cursor) {
      Value match = e.cmp(arith::CmpIPredicate::eq, expertOf(q), ex);
      e.ifThen(match, [&] {
        e.store(i64Of(cursor), buf["route_row"], {q});
        e.store(i64Of(q), buf["row_route"], {cursor});
      });
      return e.select(match, e.add(cursor, e.index(1)), cursor);
    });
    Value end = e.toIndex(e.load(buf["offsets"], {e.add(ex, e.index(1))}));
    e.loop(start, end, [&](Value r) {
      e.store(i64Of(ex), buf["row_expert"], {r});
    });
  });
  forAll(e, routes, [&](Value q) {
    e.ifThen(e.cmp(arith::CmpIPredicate::slt, expertOf(q), e.index(0)),
             [&] { e.store(none, buf["route_row"], {q}); });
  });
  gridBarrier(e);

  // Phase 2: dispatch.
  forAll2(e, rows(e), s.hidden, [&](Value r, Value j) {
    Value route = e.toIndex(e.load(buf["row_route"], {r}));
    Value v = e.ifValue(
        e.isValid(route),
        [&] { return e.loadF32(buf["x"], {e.div(route, k), j}); },
        [&] { return e.f32(0.0f); });
    e.storeRounded(v, buf["routed_x"], {r, j});
  });
  gridBarrier(e);

  // Phase 3: gate/up + SwiGLU, routed and shared; phase 4: down.
  if (gemm)
    tensorCoreGemms(e, *gemm, limit);
  else
    scalarGemms(e, limit);

  // Phase 5: combine.
  forAll2(e, e.index(s.tokens), s.hidden, [&](Value t, Value j) {
    Value init = layer.hasSharedExpert() ? e.loadF32(buf["shared_out"], {t, j})
                                         : e.f32(0.0f);
    Value acc = e.fold(e.index(0), k, init, [&](Value kk, Value acc) {
      Value row = e.toIndex(
          e.load(buf["route_row"], {e.add(e.mul(t, k), kk)}));
      Value term = e.ifValue(
          e.isValid(row),
          [&] {
            return e.mul(e.load(buf["router_weights"], {t, kk}),
                         e.loadF32(buf["routed_y"], {row, j}));
          },
          [&] { return e.f32(0.0f); });
      return e.add(acc, term);
    });
    e.storeRounded(acc, buf["out"], {t, j});
  });
  gpu::ReturnOp::create(b, loc);
  return params;
}

/// The kernel's description for the runtime, on the gpu.func.
static DictionaryAttr
describeKernel(MLIRContext *ctx, ArrayRef<Param> params, const Sizes &s,
               StringRef chip, unsigned blockSize,
               ArrayRef<gemm::TensorMapSpec> tensorMaps) {
  Builder b(ctx);
  SmallVector<Attribute> ps;
  for (const Param &p : params) {
    std::string dtype;
    llvm::raw_string_ostream(dtype) << p.type.getElementType();
    ps.push_back(b.getDictionaryAttr({
        b.getNamedAttr("name", b.getStringAttr(p.name)),
        b.getNamedAttr("role", b.getStringAttr(p.role)),
        b.getNamedAttr("dtype", b.getStringAttr(dtype)),
        b.getNamedAttr("shape", b.getDenseI64ArrayAttr(p.type.getShape())),
    }));
  }
  int64_t smem = tensorMaps.empty() ? 0 : gemm::dynamicSharedMemoryBytes();
  SmallVector<NamedAttribute> entries = {
      b.getNamedAttr("chip", b.getStringAttr(chip)),
      b.getNamedAttr("block", b.getI64IntegerAttr(blockSize)),
      b.getNamedAttr("grid", b.getStringAttr("persistent: one CTA per SM")),
      b.getNamedAttr("cooperative", b.getBoolAttr(true)),
      b.getNamedAttr("dynamic_shared_memory", b.getI64IntegerAttr(smem)),
      b.getNamedAttr("zero_before_first_launch",
                     b.getArrayAttr({b.getStringAttr("grid_barrier")})),
      b.getNamedAttr("routed_capacity", b.getI64IntegerAttr(s.routedCapacity())),
      b.getNamedAttr("params", b.getArrayAttr(ps)),
  };
  // Map i is the CUtensorMap at byte 128*i of the `tensor_maps` parameter:
  // bf16, 2-D {cols, rows} with a row stride of row_stride elements, box
  // {box_cols, box_rows}, SWIZZLE_128B, no interleave, OOB zero fill.
  if (!tensorMaps.empty()) {
    SmallVector<Attribute> maps;
    for (const gemm::TensorMapSpec &m : tensorMaps)
      maps.push_back(b.getDictionaryAttr({
          b.getNamedAttr("buffer", b.getStringAttr(m.buffer)),
          b.getNamedAttr("rows", b.getI64IntegerAttr(m.rows)),
          b.getNamedAttr("cols", b.getI64IntegerAttr(m.cols)),
          b.getNamedAttr("row_stride", b.getI64IntegerAttr(m.rowStride)),
          b.getNamedAttr("box_rows", b.getI64IntegerAttr(m.boxRows)),
          b.getNamedAttr("box_cols", b.getI64IntegerAttr(m.boxCols)),
      }));
    entries.push_back(b.getNamedAttr("tensor_maps", b.getArrayAttr(maps)));
  }
  return b.getDictionaryAttr(entries);
}

struct ConvertMoEToGPUPass
    : public mok::impl::ConvertMoEToGPUBase<ConvertMoEToGPUPass> {
  using ConvertMoEToGPUBase::ConvertMoEToGPUBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    ConvertMoEToGPUBase::getDependentDialects(registry);
    gemm::insertDialects(registry);
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (chip != "sm_90a" && chip != "sm_100a") {
      module.emitError() << "convert-moe-to-gpu: chip '" << chip
                         << "' is not supported; expected sm_90a or sm_100a";
      return signalPassFailure();
    }
    if (blockSize < 32 || blockSize > 1024 || blockSize % 32) {
      module.emitError() << "convert-moe-to-gpu: block-size must be a "
                            "multiple of 32 in [32, 1024], got "
                         << blockSize;
      return signalPassFailure();
    }
    SmallVector<std::pair<func::FuncOp, LayerOp>> layers;
    WalkResult walk = module.walk([&](Operation *op) {
      if (isa<LayerGradOp>(op)) {
        op->emitError("convert-moe-to-gpu: moe.layer_grad (backward) is not "
                      "supported on the GPU yet");
        return WalkResult::interrupt();
      }
      if (isa<MoEDialect>(op->getDialect()) && !isa<LayerOp>(op)) {
        op->emitError() << "convert-moe-to-gpu: '" << op->getName()
                        << "' must be fused first (run --moe-fuse-layer)";
        return WalkResult::interrupt();
      }
      auto layer = dyn_cast<LayerOp>(op);
      if (!layer)
        return WalkResult::advance();
      PlanType plan = layer.getPlanType();
      if (plan.getEp() != 1) {
        layer.emitError() << "convert-moe-to-gpu: expert parallelism (ep = "
                          << plan.getEp() << ") is not supported yet";
        return WalkResult::interrupt();
      }
      if (!plan.hasStaticTokens()) {
        layer.emitError("convert-moe-to-gpu: a dynamic token count is not "
                        "supported yet; the GPU kernel is compiled for one T");
        return WalkResult::interrupt();
      }
      if (layer.savesContext()) {
        layer.emitError("convert-moe-to-gpu: the saved context (training "
                        "forward) is not supported on the GPU yet");
        return WalkResult::interrupt();
      }
      auto func = layer->getParentOfType<func::FuncOp>();
      layers.push_back({func, layer});
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
      Sizes s{plan.getTokens(), x.getDimSize(1),     wg.getDimSize(1),
              plan.getLocalExperts(), plan.getTopK(), plan.getPadding()};
      if (layer.hasSharedExpert())
        s.sharedInter =
            cast<RankedTensorType>(layer.getSharedGate().getType()).getDimSize(0);
      OpBuilder b(module.getBodyRegion());
      b.setInsertionPointToEnd(module.getBody());
      std::string name = func.getSymName().str();
      auto gpuModule =
          gpu::GPUModuleOp::create(b, layer.getLoc(), name + "_kernels");
      // TMA + tensor-core GEMM phases (wgmma on sm_90a, tcgen05 on sm_100a)
      // when the shapes fit the tiles, run by the first warpgroup of each
      // CTA; the same maps, metadata and block size on both chips.
      SmallVector<gemm::TensorMapSpec> maps;
      unsigned block = blockSize;
      if (tensorCores && s.tensorCoreEligible()) {
        maps = tensorMapsFor(s);
        block = gemm::kBlock;
      }
      KernelBuilder builder(layer, s);
      std::string kernel = name + "_forward";
      SmallVector<Param> params =
          builder.build(gpuModule, kernel, chip, block, maps);
      auto gpuFunc = cast<gpu::GPUFuncOp>(gpuModule.lookupSymbol(kernel));
      gpuFunc->setAttr("mok.kernel",
                       describeKernel(ctx, params, s, chip, block, maps));
    }
  }
};

} // namespace
