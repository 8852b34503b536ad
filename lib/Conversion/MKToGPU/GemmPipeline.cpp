// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The tensor-core mk.gemm above the MMA layer, shared by sm_90a and sm_100a
// (the shape of the H200-verified probe, scripts/probe/gemm_sm90.mlir, made
// persistent):
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
/// Warp roles: the consumers' register decrease before the producer
/// warpgroup's increase.
constexpr int32_t kRegisterBarrier = 2;
/// Warp roles with a gathered A: the producer warpgroup, each k-tile.
constexpr int32_t kProducerBarrier = 3;
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
static nvgpu::TensorMapDescriptorType tensorMapType(MLIRContext *ctx,
                                                    int64_t boxRows) {
  return nvgpu::TensorMapDescriptorType::get(
      ctx, smemType(ctx, {boxRows, kTileK}, BFloat16Type::get(ctx)),
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
  if (roles.producer)
    emptyBarriers = nvgpu::MBarrierCreateOp::create(
        b, loc, nvgpu::MBarrierGroupType::get(ctx, workgroup(ctx), kStages));

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
      if (roles.producer)
        nvgpu::MBarrierInitOp::create(b, loc, emptyBarriers,
                                      e.index(4 * roles.consumers), e.index(s),
                                      Value());
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

Value GemmEmitter::mapAt(Value slot, int64_t boxRows) {
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
             b, loc, TypeRange{tensorMapType(ctx, boxRows)}, ValueRange{ptr})
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
  int64_t bytes = (p.gatherRows ? 0 : p.bytesA()) + numB * p.bytesB();
  nvgpu::MBarrierArriveExpectTxOp::create(b, loc, barriers, e.index(bytes),
                                          stage, Value());
  Value kc = e.mul(kTile, e.index(kTileK));
  if (t.kBase)
    kc = e.add(t.kBase, kc);
  auto tma = [&](Value map, int64_t boxRows, Value offset, Value row,
                 Value mask = Value()) {
    nvgpu::TmaAsyncLoadOp::create(
        b, loc, view(offset, smemType(ctx, {boxRows, kTileK}, bf16)), barriers,
        map, ValueRange{kc, row}, stage, mask, Value());
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
          pair(t.mapA2, t.mapB2, e.sub(kTileStart, e.index(p.kSplit * kTileK)));
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
    tma(t.mapA, p.tileM, base, t.m0);
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

void storeGlobalStreaming(OpBuilder &b, Location loc, Value address,
                          ValueRange words) {
  assert((words.size() == 1 || words.size() == 2 || words.size() == 4) &&
         "st.global takes 1, 2 or 4 words");
  std::string vec =
      words.size() == 1 ? "" : ".v" + std::to_string(words.size());
  std::string list, constraints = "l";
  for (size_t i = 0; i < words.size(); ++i) {
    list += (i ? ", $" : "$") + std::to_string(i + 1);
    constraints += ",r";
  }
  if (words.size() > 1)
    list = "{" + list + "}";
  SmallVector<Value> operands = {address};
  operands.append(words.begin(), words.end());
  LLVM::InlineAsmOp::create(b, loc, TypeRange{}, operands,
                            "st.global.cs" + vec + ".b32 [$0], " + list + ";",
                            constraints,
                            /*has_side_effects=*/true, /*is_align_stack=*/false,
                            LLVM::tailcallkind::TailCallKind::None,
                            LLVM::AsmDialectAttr(), ArrayAttr());
}

void storeGlobalStreaming16(OpBuilder &b, Location loc, Value address,
                            Value value) {
  auto words4 = VectorType::get({4}, b.getI32Type());
  if (value.getType() != words4)
    value = LLVM::BitcastOp::create(b, loc, words4, value);
  SmallVector<Value> words;
  for (int64_t w = 0; w < 4; ++w)
    words.push_back(LLVM::ExtractElementOp::create(
        b, loc, value, arith::ConstantIntOp::create(b, loc, w, 32)));
  storeGlobalStreaming(b, loc, address, words);
}

void reduceAddGlobalF32(OpBuilder &b, Location loc, Value address,
                        ValueRange values) {
  assert((values.size() == 1 || values.size() == 2) &&
         "red.global.add takes 1 or 2 f32");
  std::string asmString = values.size() == 1
                              ? "red.global.add.f32 [$0], $1;"
                              : "red.global.add.v2.f32 [$0], {$1, $2};";
  SmallVector<Value> operands = {address};
  operands.append(values.begin(), values.end());
  LLVM::InlineAsmOp::create(b, loc, TypeRange{}, operands, asmString,
                            values.size() == 1 ? "l,f" : "l,f,f",
                            /*has_side_effects=*/true, /*is_align_stack=*/false,
                            LLVM::tailcallkind::TailCallKind::None,
                            LLVM::AsmDialectAttr(), ArrayAttr());
}

void GemmEmitter::syncWarpgroup(int64_t warpgroups) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  NVVM::BarrierOp::create(
      b, loc, Type(), arith::ConstantIntOp::create(b, loc, kNamedBarrier, 32),
      arith::ConstantIntOp::create(b, loc, kThreads * warpgroups, 32),
      NVVM::BarrierReductionAttr(), Value());
}

void GemmEmitter::release(Value g) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value lane0 =
      e.cmp(arith::CmpIPredicate::eq, e.rem(tid, e.index(32)), e.index(0));
  e.ifThen(lane0, [&] {
    nvgpu::MBarrierArriveOp::create(
        b, loc, nvgpu::MBarrierTokenType::get(b.getContext()), emptyBarriers,
        e.rem(e.add(g, e.index(kStages)), e.index(kStages)));
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

void GemmEmitter::emit(const GemmPhase &p) {
  if (roles.producer)
    return emitWarpSpecialized(p);
  OpBuilder &b = e.b;
  Location loc = e.loc;
  SmallVector<Value> state = {iteration};
  state.append(carried);
  Value inGroup =
      e.cmp(arith::CmpIPredicate::ult, tid, e.index(kThreads * p.consumers()));
  SmallVector<Type> types;
  for (Value v : state)
    types.push_back(v.getType());
  auto ifOp = scf::IfOp::create(b, loc, types, inGroup,
                                /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.elseBlock());
    scf::YieldOp::create(b, loc, state);
    b.setInsertionPointToStart(ifOp.thenBlock());
    tasks(p);
    state = {iteration};
    state.append(carried);
    scf::YieldOp::create(b, loc, state);
  }
  iteration = ifOp.getResult(0);
  ValueRange rest = ifOp.getResults().drop_front();
  carried.assign(rest.begin(), rest.end());
}

/// Warp roles: the consumer warpgroups run the task loop (MMAs and the
/// epilogue from registers), the producer thread the same tasks' loads;
/// the producer warpgroup's other threads go on (with `registers`, to
/// named barrier 2). With `registers`, each side moves to its share for the
/// GEMM and back to the even share after it: the consumers give theirs back
/// first, and the whole producer warpgroup waits for that on named barrier
/// 2 before it increases (an idle warp's early increase took registers the
/// consumers' increase needed: a deadlock on the H200). Unless a grid
/// barrier follows, a CTA barrier ends the GEMM: otherwise the consumers'
/// increase for a next GEMM could take the registers the producer
/// warpgroup's increase waits for, which then waits for the end of a GEMM
/// whose loads it has yet to issue (also seen on the H200). (Keeping the
/// split over a run of GEMMs instead made ptxas ignore setmaxnreg and
/// spill.)
void GemmEmitter::emitWarpSpecialized(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  assert(p.consumers() == roles.consumers &&
         "every GEMM of the kernel has the kernel's consumers");
  SmallVector<Value> state = {iteration};
  state.append(carried);
  SmallVector<Type> types;
  for (Value v : state)
    types.push_back(v.getType());
  Value isConsumer =
      e.cmp(arith::CmpIPredicate::ult, tid, e.index(kThreads * p.consumers()));
  auto ifOp = scf::IfOp::create(b, loc, types, isConsumer,
                                /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    if (roles.registers)
      setRegisters(roles.registers->first, /*increase=*/true);
    tasks(p);
    if (roles.registers) {
      // The warps of a warpgroup synchronize between two setmaxnreg (PTX
      // ISA); the task loop has no barrier of its own with a producer.
      syncWarpgroup(p.consumers());
      setRegisters(roles.evenRegisters, /*increase=*/false);
      // Given back: the producer warpgroup may take its share back.
      NVVM::BarrierArriveOp::create(b, loc, i32(kRegisterBarrier),
                                    i32(kThreads * (p.consumers() + 1)));
    }
    SmallVector<Value> next = {iteration};
    next.append(carried);
    scf::YieldOp::create(b, loc, next);

    // The producer branch starts from the same count.
    iteration = state[0];
    carried.assign(state.begin() + 1, state.end());
    b.setInsertionPointToStart(ifOp.elseBlock());
    if (roles.registers)
      setRegisters(roles.registers->second, /*increase=*/false);
    // (Gathered A: every thread of the warpgroup copies rows.)
    Value isProducer =
        p.gatherRows ? arith::ConstantIntOp::create(b, loc, 1, 1).getResult()
                     : e.cmp(arith::CmpIPredicate::eq, tid,
                             e.index(kThreads * p.consumers()));
    auto producer =
        scf::IfOp::create(b, loc, TypeRange{iteration.getType()}, isProducer,
                          /*withElseRegion=*/true);
    Value before = iteration;
    {
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToStart(producer.elseBlock());
      scf::YieldOp::create(b, loc, before);
      b.setInsertionPointToStart(producer.thenBlock());
      producerTasks(p);
      scf::YieldOp::create(b, loc, iteration);
    }
    if (roles.registers) {
      // Every warp of the warpgroup waits for the consumers' decrease: an
      // idle warp's increase could otherwise take registers from the
      // pool before the producer warp's decrease, leaving too few for the
      // consumers' increase (a deadlock, seen on the H200).
      NVVM::BarrierOp::create(b, loc, Type(), i32(kRegisterBarrier),
                              i32(kThreads * (p.consumers() + 1)),
                              NVVM::BarrierReductionAttr(), Value());
      setRegisters(roles.evenRegisters, /*increase=*/true);
    }
    // The producer thread (with a gathered A, every thread of the
    // warpgroup) counted the same k-tiles as the consumers. The others keep
    // the count from before this GEMM: a later gathered GEMM would start
    // them from it, so convert-mk-to-gpu allows a gathered A with a
    // producer in the kernel's first tensor-core GEMM only.
    SmallVector<Value> same = {producer.getResult(0)};
    same.append(state.begin() + 1, state.end());
    scf::YieldOp::create(b, loc, same);
  }
  iteration = ifOp.getResult(0);
  ValueRange rest = ifOp.getResults().drop_front();
  carried.assign(rest.begin(), rest.end());
  // Unless a grid barrier follows, every warpgroup is back to the even
  // share before anything else runs (another GEMM's moves: see above).
  if (roles.registers && !p.gridBarrierFollows)
    gpu::BarrierOp::create(b, loc);
}

Value GemmEmitter::mTiles(const GemmPhase &p) {
  return e.div(e.add(p.rows, e.index(p.tileM - 1)), e.index(p.tileM));
}

Value GemmEmitter::taskCount(const GemmPhase &p) {
  return e.mul(mTiles(p), e.index(p.nTiles()));
}

std::pair<Value, Value> GemmEmitter::tileOf(const GemmPhase &p, Value task) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t nTiles = p.nTiles();
  Value mTiles = this->mTiles(p);
  // Grouped raster (kGroupM m-tiles at a time, n-tiles outer within the
  // group): the CTAs running at once share each weight tile across the
  // group's m-tiles (a group of 16 is about one expert's rows) and the
  // group's A tiles stay in L2 across n-tiles. Row-major order re-read
  // every expert's weights from HBM once per m-tile.
  Value groupSize = e.index(kGroupM * nTiles);
  Value group = e.div(task, groupSize);
  Value inGroup = e.rem(task, groupSize);
  Value firstM = e.mul(group, e.index(kGroupM));
  Value groupRows = arith::MinSIOp::create(
      b, loc, e.index(kGroupM), e.sub(mTiles, firstM)); // the last is short
  Value mTile = e.add(firstM, e.rem(inGroup, groupRows));
  Value nTile = e.div(inGroup, groupRows);
  return {e.mul(mTile, e.index(p.tileM)), e.mul(nTile, e.index(p.tileN))};
}

Task GemmEmitter::taskAt(const GemmPhase &p, Value task) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  auto [m0, n0] = tileOf(p, task);
  // Grouped: the m-tile's expert picks the B maps' slots.
  Value expert = p.expertOf ? p.expertOf(m0) : e.index(0);
  // M-major A in 64-row boxes.
  int64_t boxA = p.transposeA ? kTileM : p.tileM;
  // (Clusters load B in 128-row halves, through maps of 128-row boxes;
  // N-major B in 64 x 64 boxes.)
  int64_t boxB = p.transposeB ? kTileK : clusterEmpty ? kTileN : p.tileN;
  Task t{m0,
         n0,
         mapAt(e.index(p.a), boxA),
         mapAt(e.add(e.index(p.b0), expert), boxB),
         p.b1 ? mapAt(e.add(e.index(*p.b1), expert), boxB) : Value(),
         p.a2 ? mapAt(e.index(*p.a2), p.tileM) : Value(),
         p.b2 ? mapAt(e.add(e.index(*p.b2), expert), boxB) : Value(),
         {},
         {},
         {},
         {},
         {},
         {},
         {},
         {}};
  // K in groups: the m-tile's group, its K rows and A's column.
  if (p.kOffsets) {
    Value group = e.div(m0, e.index(p.groupRows));
    Value begin = e.toIndex(e.load(p.kOffsets, {group}));
    Value end = e.toIndex(e.load(p.kOffsets, {e.add(group, e.index(1))}));
    t.kBase = begin;
    Value rows = e.sub(end, begin);
    if (p.kCounts) // whole k-tiles over the counted rows
      rows = arith::MinSIOp::create(
          b, loc, rows,
          e.mul(e.div(e.add(e.toIndex(e.load(p.kCounts, {group})),
                            e.index(kTileK - 1)),
                      e.index(kTileK)),
                e.index(kTileK)));
    t.kTiles = e.div(rows, e.index(kTileK));
    t.aCol = e.sub(m0, e.mul(group, e.index(p.groupRows)));
  }
  // Gathered A: the consumer threads copy the rows (with a producer, the
  // producer warpgroup does: producerTasks).
  if (p.gatherRows && !roles.producer)
    planGather(p, t, tid, p.consumers() * kThreads);
  return t;
}

void GemmEmitter::planGather(const GemmPhase &p, Task &t, Value index,
                             int64_t threads) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // Thread i of the `threads` copies chunk c = i % 8 of rows i / 8 + j *
  // (threads / 8): a warp covers four whole 128-byte rows (coalesced). In
  // the 128-byte-swizzled box (1024-aligned), chunk c of row r lies at
  // r * 128 + (c ^ (r % 8)) * 16, where TMA would have put it.
  Type i64 = b.getI64Type();
  int64_t rowsPerPass = threads / kGatherChunks;
  assert(threads % kGatherChunks == 0 && p.tileM % rowsPerPass == 0 &&
         "whole rows a pass, whole passes a tile");
  Value chunk = e.rem(index, e.index(kGatherChunks));
  for (int64_t i = 0; i < p.tileM / rowsPerPass; ++i) {
    Value r =
        e.add(e.div(index, e.index(kGatherChunks)), e.index(i * rowsPerPass));
    Value q = e.toIndex(e.load(p.gatherRows, {e.add(t.m0, r)}));
    // A padding row (no route) copies 0 bytes from row 0: zeros.
    Value valid = e.cmp(arith::CmpIPredicate::sge, q, e.index(0));
    Value src = e.select(valid, e.div(q, e.index(p.gatherTopK)), e.index(0));
    Value offset =
        e.mul(e.add(e.mul(src, e.index(p.k)),
                    e.mul(chunk, e.index(kGatherChunkBytes / kBf16))),
              e.index(kBf16));
    t.gatherSrc.push_back(
        arith::AddIOp::create(b, loc, p.gatherSource,
                              arith::IndexCastOp::create(b, loc, i64, offset)));
    t.gatherBytes.push_back(arith::SelectOp::create(
        b, loc, valid, arith::ConstantIntOp::create(b, loc, 16, 32),
        arith::ConstantIntOp::create(b, loc, 0, 32)));
    Value swizzled = arith::XOrIOp::create(b, loc, chunk, e.rem(r, e.index(8)));
    t.gatherDst.push_back(e.add(e.mul(r, e.index(kTileK * kBf16)),
                                e.mul(swizzled, e.index(kGatherChunkBytes))));
  }
}

Task GemmEmitter::taskOfRound(const GemmPhase &p, Value first, Value tasks) {
  if (!clusterEmpty)
    return taskAt(p, first);
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // The pair's tasks first and first + 1; rank r runs first + r, or, past
  // the last task, first again without storing it.
  auto orFirst = [&](Value task) {
    return e.select(e.cmp(arith::CmpIPredicate::slt, task, tasks), task, first);
  };
  Value mine = e.add(first, rank);
  Value other = e.add(first, e.sub(e.index(1), rank));
  Task t = taskAt(p, orFirst(mine));
  t.live = e.cmp(arith::CmpIPredicate::slt, mine, tasks);
  // One expert and one n-tile: the same B boxes.
  auto [m0, n0] = tileOf(p, orFirst(other));
  t.multicast = e.cmp(arith::CmpIPredicate::eq, n0, t.n0);
  if (p.expertOf)
    t.multicast = arith::AndIOp::create(
        b, loc, t.multicast,
        e.cmp(arith::CmpIPredicate::eq, p.expertOf(m0), p.expertOf(t.m0)));
  return t;
}

void GemmEmitter::producerTasks(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t kTiles = p.k / kTileK;
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value grid = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  // Gathered A: the warpgroup's threads copy the rows, its first thread
  // issues the TMA loads.
  Value rank = e.sub(tid, e.index(kThreads * p.consumers()));
  Value isLoader = e.cmp(arith::CmpIPredicate::eq, rank, e.index(0));
  auto taskLoop = scf::ForOp::create(b, loc, bid, taskCount(p), grid,
                                     ValueRange{iteration});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(taskLoop.getBody());
    Value it = taskLoop.getRegionIterArgs()[0];
    Task t = taskAt(p, taskLoop.getInductionVar());
    if (p.gatherRows)
      planGather(p, t, rank, kThreads);
    e.loop(kTiles, [&](Value kt) {
      Value g = e.add(it, kt);
      // k-tile g reuses the stage s of k-tile g - kStages: wait until the
      // consumers released it. They release k-tiles -1, 0, 1, ... in
      // order (-1 virtual, in stage kStages - 1), so that takes
      // c = g / kStages (+1 for the last stage) completions of the stage's
      // empty barrier; the c-th completes its phase c - 1, of parity
      // (c - 1) & 1. With c = 0 (the first round) the parity is 1, which a
      // fresh barrier (in its phase 0) reports complete at once.
      Value s = e.rem(g, e.index(kStages));
      Value c =
          e.add(e.div(g, e.index(kStages)),
                arith::IndexCastOp::create(
                    b, loc, b.getIndexType(),
                    arith::ExtUIOp::create(b, loc, b.getI32Type(),
                                           e.cmp(arith::CmpIPredicate::eq, s,
                                                 e.index(kStages - 1)))));
      Value parity =
          e.cmp(arith::CmpIPredicate::eq, e.rem(c, e.index(2)), e.index(0));
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, emptyBarriers, parity,
                                             e.index(10000000), s);
      if (!p.gatherRows)
        return load(p, g, kt, t);
      // Gathered A: each thread's copies complete on the stage's full
      // barrier (cp.async.mbarrier.arrive without .noinc: the pending
      // count goes up now and down when the copies land, so the barrier
      // keeps its one expected arrival, the loader's arrive.expect_tx).
      // Every thread's increment precedes that arrival (the warpgroup's
      // barrier), else the phase could complete on B's bytes alone.
      loadGatheredRows(p, g, kt, t);
      Value full =
          nvgpu::MBarrierGetOp::create(b, loc, b.getI32Type(), barriers, s);
      NVVM::CpAsyncMBarrierArriveOp::create(
          b, loc,
          LLVM::IntToPtrOp::create(
              b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3), full,
              LLVM::DereferenceableAttr()),
          /*noinc=*/false);
      NVVM::BarrierOp::create(b, loc, Type(), i32(kProducerBarrier),
                              i32(kThreads), NVVM::BarrierReductionAttr(),
                              Value());
      e.ifThen(isLoader, [&] { load(p, g, kt, t); });
    });
    scf::YieldOp::create(b, loc, ValueRange{e.add(it, e.index(kTiles))});
  }
  iteration = taskLoop.getResult(0);
}

/// The consumer warpgroups' task loop; advances `iteration` (and
/// `carried`).
void GemmEmitter::tasks(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  assert(p.k % kTileK == 0 && "k must be a multiple of kTileK");
  int64_t kTiles = p.k / kTileK;
  assert(p.tileN % kThreads == 0 &&
         p.bytesA() + (p.b1 ? 2 : 1) * p.bytesB() <= kStageBytes &&
         p.consumers() * kThreads <= kBlock &&
         "the tile's boxes must fit a stage, its warpgroups the CTA");
  int64_t numAcc = p.b1 ? 2 : 1;

  Value tasks = taskCount(p);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value grid = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);

  // Prologue (without a producer): the first stages of task `t`, whose
  // k-tiles are numbered from `it`: thread 0's TMA loads and, gathered,
  // every consumer thread's cp.async copies (one group per k-tile).
  int64_t first = std::min(kStages, kTiles);
  auto prologue = [&](const Task &t, Value it) {
    e.ifThen(isThread0, [&] {
      if (t.kTiles) { // K in groups: up to kStages of the task's k-tiles
        for (int64_t kt = 0; kt < kStages; ++kt)
          e.ifThen(e.cmp(arith::CmpIPredicate::slt, e.index(kt), t.kTiles),
                   [&] {
                     Value g = e.add(it, e.index(kt));
                     acquire(g);
                     load(p, g, e.index(kt), t);
                   });
        return;
      }
      for (int64_t kt = 0; kt < prologueLoads(kTiles); ++kt) {
        Value g = e.add(it, e.index(kt));
        acquire(g);
        load(p, g, e.index(kt), t);
      }
    });
    if (p.gatherRows)
      for (int64_t kt = 0; kt < first; ++kt) {
        loadGatheredRows(p, e.add(it, e.index(kt)), e.index(kt), t);
        NVVM::CpAsyncCommitGroupOp::create(b, loc);
      }
  };
  // Early prefetch: the MMA layer calls onStagesFree once the task's MMAs
  // are complete and the consumers synchronized, before its epilogue (from
  // registers, leaving the stages alone); the next task's prologue starts
  // there, so its loads overlap this task's stores. (Otherwise each task
  // loads its own first stages after the previous epilogue.)
  bool early = !roles.producer && p.storePair && prefetchesEarly();
  // (convert-mk-to-gpu checks it: clusters need even N, so the register
  // epilogue. Without the early path each task's last k-tile would never be
  // released and the pair would deadlock, so it is an error in every build.)
  if (clusterEmpty && !early)
    llvm::report_fatal_error("clusters of CTAs need the early-prefetch "
                             "register epilogue");
  // The task loop's rounds: task `bid` first, or with clusters of 2 the
  // pair's first task (bid - rank; the grid is whole clusters).
  Value firstTask = clusterEmpty ? e.sub(bid, rank) : bid;
  if (early)
    e.ifThen(e.cmp(arith::CmpIPredicate::slt, firstTask, tasks),
             [&] { prologue(taskOfRound(p, firstTask, tasks), iteration); });

  SmallVector<Value> init = {iteration};
  init.append(carried);
  auto taskLoop = scf::ForOp::create(b, loc, firstTask, tasks, grid, init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(taskLoop.getBody());
    Value task = taskLoop.getInductionVar();
    Value it = taskLoop.getRegionIterArgs()[0];
    ValueRange args = taskLoop.getRegionIterArgs().drop_front();
    carried.assign(args.begin(), args.end());
    Task t = taskOfRound(p, task, tasks);
    Value m0 = t.m0, n0 = t.n0;

    // Prologue (without a producer, unless started early): the first
    // stages of the task. The previous task consumed all the k-tiles it
    // loaded and its epilogue ended with a warpgroup barrier; `acquire`
    // waits for what the MMA layer may still read.
    if (!roles.producer && !early)
      prologue(t, it);
    // Gathered A: k-tile 0's rows ready before the MMA layer starts (it
    // waits for later k-tiles' itself; the prologue's groups are the last
    // committed).
    if (!roles.producer && p.gatherRows) {
      gatheredRowsLanded(first - 1);
      syncWarpgroup(p.consumers());
    }

    // The MMA layer: accumulators into shared memory, or (empty result) the
    // epilogue done from registers.
    std::function<void()> startNext;
    if (early)
      startNext = [&, it, task] {
        // Clusters: the task's last k-tile is released here (the others
        // were in the MMA layer's loop), whether a next task follows or not.
        if (clusterEmpty)
          e.ifThen(isThread0,
                   [&] { clusterRelease(e.add(it, e.index(kTiles - 1))); });
        Value next = e.add(task, grid);
        e.ifThen(e.cmp(arith::CmpIPredicate::slt, next, tasks), [&] {
          prologue(taskOfRound(p, next, tasks),
                   e.add(it, t.kTiles ? t.kTiles : e.index(kTiles)));
        });
      };
    onStagesFree = startNext;
    SmallVector<Value> tiles = accumulate(p, it, t);
    onStagesFree = nullptr;
    assert((!early || tiles.empty()) &&
           "an early prefetch needs the epilogue from registers");
    assert(tiles.empty() || static_cast<int64_t>(tiles.size()) == numAcc);

    // Epilogue through shared memory: each warpgroup its 64 rows, each
    // thread a column (tileN / 128 of them), rows in turn, so each row is
    // written whole.
    Value wgRow = e.mul(e.div(tid, e.index(kThreads)), e.index(kTileM));
    Value wgTid = e.rem(tid, e.index(kThreads));
    for (int64_t cc = 0; !tiles.empty() && cc < p.tileN / kThreads; ++cc) {
      Value local = e.add(wgTid, e.index(cc * kThreads));
      Value col = e.add(n0, local);
      auto body = [&] {
        e.loop(kTileM, [&](Value rr) {
          Value r = e.add(wgRow, rr);
          Value row = e.add(m0, r);
          e.ifThen(e.cmp(arith::CmpIPredicate::slt, row, p.rows), [&] {
            Value v0 = e.load(tiles[0], {r, local});
            Value v1 = numAcc > 1 ? e.load(tiles[1], {r, local}) : Value();
            p.store(row, col, v0, v1);
          });
        });
      };
      if (p.n % p.tileN)
        e.ifThen(e.cmp(arith::CmpIPredicate::slt, col, e.index(p.n)), body);
      else
        body();
    }
    // The next task's TMA (async proxy) overwrites what this epilogue wrote
    // and read through the generic proxy. (A producer's stages are never
    // written by the consumers: the epilogue is from registers.)
    assert((!roles.producer || tiles.empty()) &&
           "with a producer the epilogue leaves the stages alone");
    if (!roles.producer && !early) {
      fenceAsyncShared();
      syncWarpgroup(p.consumers());
    }
    SmallVector<Value> next = {
        e.add(it, t.kTiles ? t.kTiles : e.index(kTiles))};
    next.append(carried);
    scf::YieldOp::create(b, loc, next);
  }
  iteration = taskLoop.getResult(0);
  ValueRange results = taskLoop.getResults().drop_front();
  carried.assign(results.begin(), results.end());
}

} // namespace mok::conversion::gemm
