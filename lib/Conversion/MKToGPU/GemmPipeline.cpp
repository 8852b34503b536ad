// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The tensor-core mk.gemm above the MMA layer, shared by sm_90a and sm_100a
// (a TMA + mbarrier pipeline of k-tiles feeding the MMAs, made persistent):
//
//   * the first one or two warpgroups of each CTA compute (one 64-row half
//     of a tile each); tasks (m-tile, n-tile) are assigned to CTAs
//     round-robin in groups of kGroupM m-tiles, n-tiles outer; the
//     consumers sync on named barrier 1;
//   * kStages stage buffers, each [A tileM x 64 | B_0 tileN x 64 | B_1] bf16,
//     each part 1024-aligned (the swizzle atom), filled by thread 0's TMA
//     loads (with warp roles: by the producer thread, the first of the
//     warpgroup after the consumers, which waits for a per-stage "empty"
//     barrier the consumers release; emitWarpSpecialized) and completed by
//     a per-stage mbarrier (arrival count 1 + expect_tx). The warpgroup counts
//     the k-tiles it consumed over all tasks and phases (`iteration`): k-tile g
//     lives in stage g % kStages and completes phase (g / kStages) & 1 of that
//     stage's barrier, so the barriers are initialized once per kernel;
//   * both operands are K-major (A rows and W rows are contiguous in K), as
//     the TMA boxes (128-byte swizzled rows of 64 bf16) leave them;
//   * the MMA layer (GemmEmitter::accumulate, per chip) consumes the stages
//     and either leaves the fp32 accumulators in shared memory (over the
//     stage buffers, whose loads have all completed: sm_100a, and sm_90a
//     with odd N) or stores the results itself from registers (sm_90a).
//     On sm_90a the next task's first stages then start loading as soon as
//     the task's MMAs are complete (onStagesFree), before those stores;
//   * epilogue: a SIMT loop hands each element to the caller, which rounds
//     and stores it as the scalar path does (from registers: column pairs,
//     storePair);
//   * a gathered A (fused dispatch, sm_90a): the consumer threads copy its
//     rows with cp.async into the swizzled A box, one group per k-tile;
//     with warp roles the producer warpgroup's threads copy them, each
//     thread's copies completing on the stage's full barrier
//     (cp.async.mbarrier.arrive), before its first thread's TMA loads of B.
//
#include "GemmPipeline.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/ErrorHandling.h"

using namespace mlir;
using namespace mok::mk::schedule;

namespace mok::conversion::gemm {

namespace {
constexpr const char *kDynSmem = "mok_dyn_smem";
/// Clusters of 2: the per-stage empty barriers (static shared memory).
constexpr const char *kClusterEmpty = "mok_cluster_empty";
static_assert(kBytesA % kAlign == 0 && kBytesB % kAlign == 0,
              "stage parts must stay 1024-aligned");
static_assert(2 * kAccBytes <= kStages * kStageBytes &&
                  kMaxConsumers * kTileM * 2 * kTileN * kF32 <=
                      kStages * kStageBytes,
              "the epilogue's accumulator tiles (at most 128 x 256 f32 or "
              "2 x 64 x 128 f32) reuse the stage buffers");
static_assert(kTileN % kThreads == 0, "the epilogue gives threads columns");
static_assert(kBlock % kThreads == 0 && kBlock >= kThreads,
              "the computing warpgroup is the CTA's first");
constexpr int32_t kNamedBarrier = 1; // 0 is gpu.barrier's
} // namespace

static_assert(kStageBytes == kMaxConsumers * kBytesA + 2 * kBytesB &&
                  kDynamicSharedMemory == kStages * kStageBytes + kAlign,
              "the planned shared memory is the ring's");
static_assert(dynamicSharedMemory(true) ==
                  kDynamicSharedMemory + kEpilogueStagingBytes,
              "the sm_90a staging follows the ring");
int64_t dynamicSharedMemoryBytes(bool sm90) {
  return dynamicSharedMemory(sm90);
}

void insertDialects(DialectRegistry &registry) {
  registry.insert<nvgpu::NVGPUDialect, NVVM::NVVMDialect, LLVM::LLVMDialect>();
}

static Attribute workgroup(MLIRContext *ctx) {
  return gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
}
MemRefType smemType(MLIRContext *ctx, ArrayRef<int64_t> shape, Type elt) {
  return MemRefType::get(shape, elt, MemRefLayoutAttrInterface(),
                         workgroup(ctx));
}
/// A box of `boxRows` 128-byte rows: 64 bf16 or (fp8) 128 E4M3 elements.
static MemRefType boxType(MLIRContext *ctx, int64_t boxRows, bool fp8) {
  Type elt = fp8 ? Type(Float8E4M3FNType::get(ctx))
                 : Type(BFloat16Type::get(ctx));
  return smemType(ctx, {boxRows, schedule::tileK(fp8)}, elt);
}
static nvgpu::TensorMapDescriptorType tensorMapType(MLIRContext *ctx,
                                                    int64_t boxRows, bool fp8) {
  return nvgpu::TensorMapDescriptorType::get(
      ctx, boxType(ctx, boxRows, fp8),
      nvgpu::TensorMapSwizzleKind::SWIZZLE_128B,
      nvgpu::TensorMapL2PromoKind::L2PROMO_NONE,
      nvgpu::TensorMapOOBKind::OOB_ZERO,
      nvgpu::TensorMapInterleaveKind::INTERLEAVE_NONE);
}

GemmEmitter::~GemmEmitter() = default;

GemmEmitter::GemmEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
                         ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                         const WarpRoles &roles, bool sm90)
    : e(e), roles(roles) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type i8 = b.getI8Type(), i64 = b.getI64Type();

  // Dynamic shared memory: a public, uninitialized, zero-sized workgroup
  // global is `.extern .shared .align 1024 .b8 mok_dyn_smem[]` in PTX (CUDA's
  // `extern __shared__`, after all static smem). gpu.dynamic_shared_memory
  // would be an internal 1-byte global that ptxas may place before the
  // static mbarriers.
  MemRefType empty = smemType(ctx, {0}, i8);
  if (!module.lookupSymbol(kDynSmem)) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(module.getBody());
    memref::GlobalOp::create(b, loc, kDynSmem, b.getStringAttr("public"), empty,
                             Attribute(), /*constant=*/false,
                             b.getI64IntegerAttr(kAlign));
  }
  int64_t bytes = dynamicSharedMemoryBytes(sm90);
  Value dyn0 = memref::GetGlobalOp::create(b, loc, empty, kDynSmem);
  smem = memref::ReinterpretCastOp::create(b, loc, smemType(ctx, {bytes}, i8),
                                           dyn0, /*offset=*/0,
                                           /*sizes=*/{bytes}, /*strides=*/{1});
  // Round the base up to 1024 in case the declared alignment is not
  // honoured (then `pad` is 0).
  smemBase = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, smem);
  Value align = e.index(kAlign);
  pad = e.sub(e.mul(arith::DivUIOp::create(
                        b, loc, e.add(smemBase, e.index(kAlign - 1)), align),
                    align),
              smemBase);
  if (sm90)
    staging = e.add(pad, e.index(kStages * kStageBytes));

  barriers = nvgpu::MBarrierCreateOp::create(
      b, loc, nvgpu::MBarrierGroupType::get(ctx, workgroup(ctx), kStages));
  if (roles.cluster > 1) {
    assert(roles.cluster == 2 && !roles.producer && sm90 &&
           "clusters of 2, sm_90a without a producer");
    MemRefType type = smemType(ctx, {kStages}, i64);
    if (!module.lookupSymbol(kClusterEmpty)) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(module.getBody());
      memref::GlobalOp::create(b, loc, kClusterEmpty,
                               b.getStringAttr("private"), type, Attribute(),
                               /*constant=*/false, b.getI64IntegerAttr(8));
    }
    clusterEmpty = memref::ExtractAlignedPointerAsIndexOp::create(
        b, loc, memref::GetGlobalOp::create(b, loc, type, kClusterEmpty));
    Value r = NVVM::ClusterId::create(b, loc, b.getI32Type());
    rank = arith::IndexCastUIOp::create(b, loc, b.getIndexType(), r);
    peer = arith::SubIOp::create(b, loc, i32(1), r);
  }
  if (roles.producer) {
    emptyBarriers = nvgpu::MBarrierCreateOp::create(
        b, loc, nvgpu::MBarrierGroupType::get(ctx, workgroup(ctx), kStages));
    gatherBarriers = nvgpu::MBarrierCreateOp::create(
        b, loc, nvgpu::MBarrierGroupType::get(ctx, workgroup(ctx), kStages));
  }

  // The tensor maps: 128-byte CUtensorMaps, back to back in global memory.
  mapsBase = arith::IndexCastOp::create(
      b, loc, i64,
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, tensorMaps));
  SmallVector<Value> prefetched;
  for (auto [slot, rows] : prefetch)
    prefetched.push_back(mapAt(e.index(slot), rows));

  tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  isThread0 = e.cmp(arith::CmpIPredicate::eq, tid, e.index(0));
  e.ifThen(isThread0, [&] {
    for (int64_t s = 0; s < kStages; ++s) {
      nvgpu::MBarrierInitOp::create(b, loc, barriers, e.index(1), e.index(s),
                                    Value());
      // Empty: one arrival per consumer warp.
      if (roles.producer) {
        nvgpu::MBarrierInitOp::create(b, loc, emptyBarriers,
                                      e.index(4 * roles.consumers), e.index(s),
                                      Value());
        // Gathered A: one arrival per producer thread.
        nvgpu::MBarrierInitOp::create(b, loc, gatherBarriers,
                                      e.index(kThreads), e.index(s), Value());
      }
      // Clusters: one arrival per CTA of the pair.
      if (clusterEmpty)
        NVVM::MBarrierInitOp::create(b, loc, emptyBarrier(e.index(s)), i32(2),
                                     Value());
    }
    // (.release.cluster: the partner's multicasts and arrivals find them
    // initialized after the cluster barrier below.)
    NVVM::FenceMbarrierInitOp::create(b, loc);
    for (Value map : prefetched)
      nvgpu::TmaPrefetchOp::create(b, loc, map, Value());
  });
  if (clusterEmpty) {
    clusterBarrier();
  } else {
    gpu::BarrierOp::create(b, loc);
  }
  iteration = e.index(0);
}

Value GemmEmitter::mapAt(Value slot, int64_t boxRows, bool fp8) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Value offset = arith::MulIOp::create(
      b, loc, arith::IndexCastOp::create(b, loc, b.getI64Type(), slot),
      arith::ConstantIntOp::create(b, loc, 128, 64));
  Value ptr =
      LLVM::IntToPtrOp::create(b, loc, LLVM::LLVMPointerType::get(ctx),
                               arith::AddIOp::create(b, loc, mapsBase, offset),
                               LLVM::DereferenceableAttr());
  return UnrealizedConversionCastOp::create(
             b, loc, TypeRange{tensorMapType(ctx, boxRows, fp8)},
             ValueRange{ptr})
      .getResult(0);
}

Value GemmEmitter::view(Value byteOffset, MemRefType type) {
  return memref::ViewOp::create(e.b, e.loc, type, smem, byteOffset,
                                ValueRange{});
}

Value GemmEmitter::stageOffset(Value g) {
  return e.add(pad, e.mul(e.rem(g, e.index(kStages)), e.index(kStageBytes)));
}

Value GemmEmitter::phaseParity(Value g) {
  return e.cmp(arith::CmpIPredicate::ne,
               e.rem(e.div(g, e.index(kStages)), e.index(2)), e.index(0));
}

void GemmEmitter::load(const GemmPhase &p, Value g, Value kTile,
                       const Task &t) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type bf16 = b.getBF16Type();
  int64_t numB = p.b1 ? 2 : 1;
  Value stage = e.rem(g, e.index(kStages));
  Value base = stageOffset(g);
  // (Gathered A: the consumer threads copy it with cp.async, which this
  // barrier does not count.)
  // Clusters: the partner's multicast of this k-tile writes into this
  // stage too, so both CTAs must be done with its previous k-tile (number
  // g - kStages, the (g / kStages - 1)-th completion of the stage's empty
  // barrier; for g < kStages, parity 1, which a fresh barrier reports
  // complete).
  if (clusterEmpty) {
    Value parity = arith::ExtUIOp::create(
        b, loc, b.getI32Type(),
        e.cmp(arith::CmpIPredicate::eq,
              e.rem(e.div(g, e.index(kStages)), e.index(2)), e.index(0)));
    NVVM::MBarrierTryWaitParityOp::create(b, loc, emptyBarrier(stage), parity,
                                          i32(10000000));
  }
  // (Multicast: the partner's half completes bytes on this CTA's barrier of
  // the stage, which expects all of B either way.)
  int64_t bytes = (p.gatherRows ? 0 : p.bytesA()) + numB * p.bytesB() +
                  extraLoadBytes(p);
  nvgpu::MBarrierArriveExpectTxOp::create(b, loc, barriers, e.index(bytes),
                                          stage, Value());
  loadExtra(p, g, kTile, t);
  // (FP8: K in E4M3 elements, the maps' unit; a k-tile's rows are the
  // same 128 bytes.)
  Value kc = e.mul(kTile, e.index(schedule::tileK(p.fp8)));
  if (t.kBase)
    kc = e.add(t.kBase, kc);
  auto tma = [&](Value map, int64_t boxRows, Value offset, Value row,
                 Value mask = Value()) {
    nvgpu::TmaAsyncLoadOp::create(
        b, loc, view(offset, boxType(ctx, boxRows, p.fp8)), barriers, map,
        ValueRange{kc, row}, stage, mask, Value());
  };
  Value baseB = e.add(base, e.index(p.bytesA()));
  // N-major B: tileN / 64 boxes of 64 (N) x 64 (K) at (n0 + 64 i, kc).
  auto tmaTransposed = [&](Value map, Value k0) {
    for (int64_t i = 0; i < p.tileN / kTileK; ++i)
      nvgpu::TmaAsyncLoadOp::create(
          b, loc,
          view(e.add(baseB, e.index(i * kTileK * kTileK * kBf16)),
               smemType(ctx, {kTileK, kTileK}, bf16)),
          barriers, map, ValueRange{e.add(t.n0, e.index(i * kTileK)), k0},
          stage, Value(), Value());
  };
  if (p.a2) {
    // concat: the k-tile's pair of operands, and its k within that pair.
    Value second = e.cmp(arith::CmpIPredicate::sge, kTile, e.index(p.kSplit));
    Value kTileStart = kc; // (`tma` reads kc: set per branch below)
    auto pair = [&](Value mapA, Value mapB, Value k0) {
      kc = k0;
      if (!p.gatherRows)
        tma(mapA, p.tileM, base, t.m0);
      if (p.transposeB)
        tmaTransposed(mapB, k0);
      else
        tma(mapB, p.tileN, baseB, t.n0);
    };
    e.ifThen(
        second,
        [&] {
          pair(t.mapA2, t.mapB2,
               e.sub(kTileStart, e.index(p.kSplit * p.tileK())));
        },
        [&] { pair(t.mapA, t.mapB0, kTileStart); });
    return;
  }
  if (p.transposeA) {
    // M-major A: tileM / 64 boxes of 64 (M) x 64 (K) at (aCol + 64 i, kc).
    Value aCol = t.aCol ? t.aCol : t.m0;
    for (int64_t i = 0; i < p.tileM / kTileM; ++i)
      nvgpu::TmaAsyncLoadOp::create(
          b, loc,
          view(e.add(base, e.index(i * kBytesA)),
               smemType(ctx, {kTileK, kTileK}, bf16)),
          barriers, t.mapA, ValueRange{e.add(aCol, e.index(i * kTileM)), kc},
          stage, Value(), Value());
  } else if (!p.gatherRows) {
    // (K-major A with K in groups, FP8's weight gradients: A's rows are
    // out's M within the group.)
    tma(t.mapA, p.tileM, base, t.aCol ? t.aCol : t.m0);
  }
  if (p.transposeB) {
    tmaTransposed(t.mapB0, kc);
    return;
  }
  if (!clusterEmpty) {
    tma(t.mapB0, p.tileN, baseB, t.n0);
    if (p.b1)
      tma(t.mapB1, p.tileN, e.add(baseB, e.index(p.bytesB())), t.n0);
    return;
  }
  // Clusters: B as two 128-row halves, gate's and up's boxes or the two
  // halves of a 256-row box (its map has 128-row boxes).
  if (numB * p.tileN != 2 * kTileN)
    llvm::report_fatal_error("clusters load B as two 128-row halves");
  auto half = [&](int64_t h, Value mask) {
    Value map = p.b1 && h == 1 ? t.mapB1 : t.mapB0;
    Value row = p.b1 ? t.n0 : e.add(t.n0, e.index(h * kTileN));
    tma(map, kTileN, e.add(baseB, e.index(h * kBytesB)), row, mask);
  };
  e.ifThen(
      t.multicast,
      [&] {
        Value both = arith::ConstantIntOp::create(b, loc, 0b11, 16);
        e.ifThen(
            e.cmp(arith::CmpIPredicate::eq, rank, e.index(0)),
            [&] { half(0, both); }, [&] { half(1, both); });
      },
      [&] {
        half(0, Value());
        half(1, Value());
      });
}

void GemmEmitter::clusterBarrier() {
  // barrier.cluster.arrive (release) and wait (acquire), every thread.
  NVVM::ClusterArriveOp::create(e.b, e.loc, UnitAttr());
  NVVM::ClusterWaitOp::create(e.b, e.loc, UnitAttr());
}

int64_t GemmEmitter::prologueLoads(int64_t kTiles) const {
  return std::min(clusterEmpty ? kStages - 1 : kStages, kTiles);
}

Value GemmEmitter::emptyBarrier(Value stage) {
  return sharedPointer(e.add(clusterEmpty, e.mul(stage, e.index(8))));
}

void GemmEmitter::clusterRelease(Value g) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Value local = emptyBarrier(e.rem(g, e.index(kStages)));
  NVVM::MBarrierArriveOp::create(b, loc, b.getI64Type(), local, Value());
  Value remote = NVVM::MapaOp::create(
      b, loc,
      LLVM::LLVMPointerType::get(
          ctx, static_cast<unsigned>(NVVM::NVVMMemorySpace::SharedCluster)),
      local, peer);
  // Release at CTA scope (the PTX default), as this CTA's reads of the
  // stage it hands over are complete (wgmma wait_group, then the consumer
  // barrier): .release.cluster put a MEMBAR.ALL.GPU before every such
  // arrival (on the H200 dsv3-shard 5.8 -> 7.1 ms, with or without the
  // multicast). The memory model alone does not order those reads before
  // the partner's multicast at CTA scope; CUTLASS's cluster barriers rely
  // on the same convention (completed reads, then a remote arrival).
  NVVM::MBarrierArriveOp::create(b, loc, Type(), remote, Value());
}

void GemmEmitter::loadGatheredRows(const GemmPhase &p, Value g, Value kTile,
                                   const Task &t) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type i64 = b.getI64Type();
  Value box = e.add(smemBase, stageOffset(g)); // the A box
  Value kBytes = arith::IndexCastOp::create(
      b, loc, i64, e.mul(kTile, e.index(kTileK * kBf16)));
  for (size_t i = 0; i < t.gatherSrc.size(); ++i) {
    Value dst = sharedPointer(e.add(box, t.gatherDst[i]));
    Value src = LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(ctx, 1),
        arith::AddIOp::create(b, loc, t.gatherSrc[i], kBytes),
        LLVM::DereferenceableAttr());
    NVVM::CpAsyncOp::create(b, loc, dst, src, 16,
                            NVVM::LoadCacheModifierKind::CG, t.gatherBytes[i]);
  }
}

void GemmEmitter::gatheredRowsLanded(int64_t pending) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  NVVM::CpAsyncWaitGroupOp::create(b, loc, static_cast<uint32_t>(pending));
  // cp.async writes through the generic proxy; wgmma reads through the
  // async proxy.
  fenceAsyncShared();
}

void GemmEmitter::fenceAsyncShared() {
  NVVM::FenceProxyOp::create(
      e.b, e.loc, NVVM::ProxyKind::async_shared,
      NVVM::SharedSpaceAttr::get(e.b.getContext(),
                                 NVVM::SharedSpace::shared_cta));
}

Value GemmEmitter::sharedPointer(Value address) {
  return LLVM::IntToPtrOp::create(
      e.b, e.loc, LLVM::LLVMPointerType::get(e.b.getContext(), 3),
      arith::IndexCastOp::create(e.b, e.loc, e.b.getI32Type(), address),
      LLVM::DereferenceableAttr());
}

void GemmEmitter::syncWarpgroup(int64_t warpgroups) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  if (!splitWarpgroups) {
    NVVM::BarrierOp::create(
        b, loc, Type(), arith::ConstantIntOp::create(b, loc, kNamedBarrier, 32),
        arith::ConstantIntOp::create(b, loc, kThreads * warpgroups, 32),
        NVVM::BarrierReductionAttr(), Value());
    return;
  }
  // The warpgroups run k-loops of their own (one of them skips its MMAs):
  // they reach this barrier at different instructions, which bar.sync
  // (nvvm.barrier, .aligned) does not allow (compute-sanitizer's synccheck
  // reports "divergent threads in block"); barrier.sync without .aligned
  // does.
  LLVM::InlineAsmOp::create(
      b, loc, TypeRange{}, ValueRange{},
      "barrier.sync " + std::to_string(kNamedBarrier) + ", " +
          std::to_string(kThreads * warpgroups) + ";",
      "~{memory}", /*has_side_effects=*/true, /*is_align_stack=*/false,
      LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
      ArrayAttr());
}

void GemmEmitter::release(Value g) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value lane0 =
      e.cmp(arith::CmpIPredicate::eq, e.rem(tid, e.index(32)), e.index(0));
  e.ifThen(lane0, [&] {
    nvgpu::MBarrierArriveOp::create(
        b, loc, nvgpu::MBarrierTokenType::get(b.getContext()), emptyBarriers,
        e.rem(g, e.index(kStages)));
  });
}

Value GemmEmitter::i32(int64_t v) {
  return arith::ConstantIntOp::create(e.b, e.loc, v, 32);
}

void GemmEmitter::setRegisters(int64_t count, bool increase) {
  NVVM::SetMaxRegisterOp::create(e.b, e.loc, static_cast<int32_t>(count),
                                 increase
                                     ? NVVM::SetMaxRegisterAction::increase
                                     : NVVM::SetMaxRegisterAction::decrease);
}

} // namespace mok::conversion::gemm
