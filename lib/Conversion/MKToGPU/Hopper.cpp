// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// sm_90a MMA layer: wgmma (bf16 x bf16 -> f32) on one warpgroup, or two
// sharing each stage's B boxes (a 128-row tile, 64 rows each), under the
// shared TMA + mbarrier pipeline (GemmPipeline.cpp):
//
//   * every thread of the warpgroup waits for a stage's full barrier;
//   * a k-tile is one wgmma group: wgmma.fence, one nvvm.wgmma.mma_async
//     per k16 step (descriptors from nvgpu's generator, +32 bytes per k16
//     step inside the 128-byte swizzled row): m64n256k16, over the down
//     projections' 256-row B box or over gate's and up's adjacent 128-row
//     boxes at once (one accumulator: gate's columns, then up's); one
//     commit_group; then wait_group 1, so the tensor cores run k-tile kt
//     while the warpgroup confirms that k-tile kt-1 is done;
//   * after that wait (and a warpgroup barrier), no wgmma reads the stage
//     of k-tile kt-1 any more: thread 0 refills it with k-tile
//     kt-1+kStages, so the pipeline needs no "empty" barriers. With warp
//     roles (a producer), lane 0 of each warp releases that stage to the
//     producer through its "empty" barrier instead (the task's last
//     k-tile after its final wait; FP8, whose k-tiles each end in
//     wait_group 0, releases k-tile kt's own stage right after that
//     wait), and a task's first k-tile is emitted apart (scale-d = 0 on
//     undefined accumulators);
//   * after the last k-tile (wait_group 0 and a consumer barrier) thread 0
//     starts the next task's first stages, and the epilogue runs from
//     registers (the wgmma D fragment layout; the SwiGLU on gate and up
//     elements i and i + 64), overlapping those loads: each warp rounds
//     and packs its column pairs, puts 16 rows x 64 columns at a time into
//     its 2 KiB of shared memory after the ring (stmatrix.x4, 16-byte
//     pieces swizzled by row) and stores them back as whole 16-byte row
//     pieces (st.global.cs.v4: four 128-byte row segments a warp store).
//     On the H200 the column-pair stores (4 bytes, eight rows a warp
//     store) cost about a third of each GEMM phase. (Unaligned outputs
//     keep the column-pair stores.) With warp roles the producer loads
//     ahead anyway and the epilogue is the same.
//     (Without a pair store — odd N — the down projections go through the
//     shared-memory epilogue and the next task loads after it.)
//   * padding rows (mk.gemm's `padding`): in that early-prefetch form of
//     the down projections, the second warpgroup of a 128-row tile whose
//     64 rows are all padding runs the same k-loop without waits and MMAs
//     (the consumer barriers and refills stay) and stores nothing.
//
#include "Hopper.h"
#include "GlobalAccess.h"
#include "GridBuilder.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

using namespace mlir;
using namespace mok::mk::schedule;
using namespace mok::conversion::gemm;

namespace mok::conversion::sm90 {

namespace {

/// FP8: the columns of a tile (one E4M3 m64n128k32 wgmma chain: gate's 64
/// and up's, or one operand's 128, within one block of the B scales).
constexpr int64_t kFp8N = 128;
/// FP8 weight gradients: the slot at the end of each stage (their operand
/// boxes fill 32 of its 48 KiB) holding the k-tile's scales: A's tileM row
/// scales from byte 0, B's 128 column scales from byte kScaleSlotB.
constexpr int64_t kScaleSlot = kStageBytes - 1024;
constexpr int64_t kScaleSlotB = 4 * schedule::kMaxConsumers * kTileM;

class WgmmaEmitter final : public GemmEmitter {
public:
  WgmmaEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
               ArrayRef<std::pair<int64_t, int64_t>> prefetch,
               const WarpRoles &roles)
      : GemmEmitter(e, module, tensorMaps, prefetch, roles, /*sm90=*/true) {}

private:
  SmallVector<Value> accumulate(const GemmPhase &p, Value it,
                                const Task &t) override;
  /// The operand descriptor (i64) of a wgmma step: the shared-memory view
  /// `step` at byte `offset` (from smem), swizzled as `map`'s boxes.
  Value descriptorAt(MemRefType step, Value offset, Value map);
  /// The attributes of the wgmmas here: f32 accumulators, scale-d one
  /// (or zero: the first step of fresh accumulators), unscaled inputs, A
  /// K-major ("row"), B K-major ("col") or N-major.
  struct WgmmaAttrs {
    NVVM::WGMMATypesAttr f32;
    NVVM::WGMMAScaleOutAttr scaleD, zeroD;
    NVVM::WGMMAScaleInAttr scaleIn;
    NVVM::MMALayoutAttr row, col;
  };
  static WgmmaAttrs wgmmaAttrs(MLIRContext *ctx);
  /// FP8: the scales of task `t`'s k-tile `kt` that this thread
  /// multiplies its partial sums by: its two rows' A scales, then B's (one
  /// a B operand; with K in groups one for each of its fragment's 32
  /// columns, in fragment order). The k-loop loads them a k-tile ahead, so
  /// `kt` may be one past the task's last k-tile (or a task may have
  /// none): every block index is clamped into its scales, and such values
  /// go unused.
  SmallVector<Value> fp8Scales(const GemmPhase &p, const Task &t, Value kt,
                               Value wg);
  /// FP8 (B's scales a block): what the k-loop carries of fp8Scales' values
  /// `s`: each B operand's scale times each row's, [2 j + h] for operand j
  /// and row half h. (Multiplied at the end of the k-tile before, after
  /// its promotion: the k-tile's MMAs never wait for the loads.) With K in
  /// groups, the scales as they are (a column's B scale multiplies in the
  /// promotion).
  SmallVector<Value> fp8Factors(const GemmPhase &p, ArrayRef<Value> s);
  /// FP8: the MMAs of the k-tile numbered `g` in the kernel, from the stage
  /// at `base` (this warpgroup's A rows at `baseA`): its partial sums in
  /// fresh registers, waited for (with a producer, the stage then released
  /// at once), then added to the accumulator `acc` times `scales` (this
  /// k-tile's fp8Factors); returns the accumulator.
  Value fp8KTile(const GemmPhase &p, const Task &t, Value g, Value baseA,
                 Value base, ArrayRef<Value> scales, Value acc);
  /// FP8 with K in groups (the weight gradients, a B scale a column):
  /// whether each k-tile's scales come staged with its operands. The
  /// loader copies A's tileM row scales and B's 128 column scales of the
  /// k-tile's block into the stage's scale slot (two bulk copies on the
  /// stage's full barrier), and the consumers read them from shared
  /// memory after their wait (2 and 16 loads a thread instead of 34 from
  /// L2, carried a k-tile). Decided from the scales' static shapes (rows
  /// a multiple of 4 floats wide, at least a tile's); otherwise the
  /// k-loop loads them from global memory (fp8Scales).
  bool fp8StagedColumns(const GemmPhase &p) const;
  int64_t extraLoadBytes(const GemmPhase &p) const override {
    return fp8StagedColumns(p) ? 4 * (p.tileM + kFp8N) : 0;
  }
  void loadExtra(const GemmPhase &p, Value g, Value kTile,
                 const Task &t) override;
  /// The first row (A) and column (B) of task `t`'s staged runs: m0 and
  /// n0, moved back so that a run of tileM (128) stays inside its scales.
  std::pair<Value, Value> stagedStarts(const GemmPhase &p, const Task &t);
  /// The shared address of k-tile number `g`'s scale slot (kScaleSlot of
  /// its stage).
  Value scaleSlot(Value g) {
    return e.add(smemBase, e.add(stageOffset(g), e.index(kScaleSlot)));
  }
  /// fp8Scales' values for k-tile number `g` of a staged phase, read from
  /// its stage after the full barrier's wait.
  SmallVector<Value> fp8StagedScales(const GemmPhase &p, const Task &t,
                                     Value g, Value wg);
  bool prefetchesEarly() const override { return true; }
  /// With a producer, bf16: the phase's last k-tile goes back (its tasks
  /// release each k-tile at the next one's issue), so that every phase
  /// releases exactly its own k-tiles whatever precision the next has.
  void phaseDone(const GemmPhase &p) override {
    if (!roles.producer || p.fp8)
      return;
    e.ifThen(e.cmp(mlir::arith::CmpIPredicate::ne, iteration, phaseStart),
             [&] { release(e.sub(iteration, e.index(1))); });
  }
  /// Clusters: neither CTA of a pair goes on (and exits) while the
  /// partner may still arrive on its empty barriers.
  void finish() override {
    if (roles.cluster > 1) {
      clusterBarrier();
    }
  }
};

} // namespace

Value WgmmaEmitter::descriptorAt(MemRefType step, Value offset, Value map) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  auto type = nvgpu::WarpgroupMatrixDescriptorType::get(b.getContext(), step);
  Value d = nvgpu::WarpgroupGenerateDescriptorOp::create(
      b, loc, type, view(offset, step), map);
  return UnrealizedConversionCastOp::create(b, loc, TypeRange{b.getI64Type()},
                                            ValueRange{d})
      .getResult(0);
}

WgmmaEmitter::WgmmaAttrs WgmmaEmitter::wgmmaAttrs(MLIRContext *ctx) {
  return {NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::f32),
          NVVM::WGMMAScaleOutAttr::get(ctx, NVVM::WGMMAScaleOut::one),
          NVVM::WGMMAScaleOutAttr::get(ctx, NVVM::WGMMAScaleOut::zero),
          NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one),
          NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::row),
          NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::col)};
}

SmallVector<Value> WgmmaEmitter::fp8Scales(const GemmPhase &p, const Task &t,
                                           Value kt, Value wg) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  const int64_t fragment = kTileM * kFp8N / kThreads; // 64 floats
  // Block `block` of dimension `dim` of `scales`, clamped into it.
  auto clamped = [&](Value scales, int64_t dim, Value block) {
    Value last = e.sub(memref::DimOp::create(b, loc, scales, dim), e.index(1));
    return arith::MinSIOp::create(b, loc, block, last).getResult();
  };
  // This thread's two rows (16w + l/4 and + 8 of its warpgroup's 64) and
  // each B operand's block (uniform). K in groups (the weight gradients):
  // the k-tile is scale block kBase / 128 + kt of A's rows (out's M within
  // the group) and of B's columns, one B scale a column (the 1 x 128
  // blocks of both run along K).
  Value lane = e.rem(tid, e.index(32));
  Value warp = e.rem(e.div(tid, e.index(32)), e.index(4));
  // concat: k-tiles from kSplit on are the second K-loop's (a2's and B_1's
  // scales, from their block 0); both scales' shapes are the first's, so
  // both loads are in bounds and the right ones are selected.
  Value second;
  if (p.a2) {
    second = e.cmp(arith::CmpIPredicate::sge, kt, e.index(p.kSplit));
    kt = e.select(second, e.sub(kt, e.index(p.kSplit)), kt);
  }
  auto pick = [&](Value first, Value other) {
    return second ? e.select(second, other, first) : first;
  };
  Value kb = t.kBase ? e.add(e.div(t.kBase, e.index(kTileKFp8)), kt) : kt;
  Value kbA = clamped(p.aScales, 0, kb);
  Value r0 = e.add(e.add(t.aCol ? t.aCol : t.m0, e.mul(wg, e.index(kTileM))),
                   e.add(e.mul(warp, e.index(16)), e.div(lane, e.index(4))));
  SmallVector<Value> scales;
  for (int64_t h = 0; h < 2; ++h) {
    Value r = e.add(r0, e.index(8 * h));
    Value sa = e.load(p.aScales, {kbA, r});
    if (second)
      sa = pick(sa, e.load(p.a2Scales, {kbA, r}));
    scales.push_back(sa);
  }
  if (p.kOffsets) {
    // Column 8c + 2 (l % 4) + v's, in fragment order (c, v).
    Value kbB = clamped(p.bScales[0], 0, kb);
    Value c0 = e.add(t.n0, e.mul(e.rem(lane, e.index(4)), e.index(2)));
    for (int64_t c = 0; c < fragment / 4; ++c)
      for (int64_t v = 0; v < 2; ++v)
        scales.push_back(
            e.load(p.bScales[0], {kbB, e.add(c0, e.index(8 * c + v))}));
    return scales;
  }
  Value nBlock = e.div(t.n0, e.index(kFp8N));
  SmallVector<Value, 2> sb;
  for (Value bScales : p.bScales) {
    SmallVector<Value> idx;
    if (t.expert)
      idx.push_back(t.expert);
    idx.push_back(nBlock);
    idx.push_back(clamped(bScales, idx.size(), kt));
    sb.push_back(e.load(bScales, idx));
  }
  if (second) // one accumulator: B_0's scale in the first loop, B_1's after
    sb = {pick(sb[0], sb[1])};
  scales.append(sb.begin(), sb.end());
  return scales;
}

bool WgmmaEmitter::fp8StagedColumns(const GemmPhase &p) const {
  if (!p.fp8 || p.mx || !p.kOffsets || p.a2 || p.bScales.size() != 1)
    return false;
  // [K/128, width] with width a multiple of 4 (16-byte runs) and at least
  // the run's.
  // (16-byte aligned by the runtime: the bulk copies' source.)
  auto fits = [](Value scales, int64_t run) {
    auto type = dyn_cast<MemRefType>(scales.getType());
    return type && type.hasStaticShape() && type.getLayout().isIdentity() &&
           type.getRank() == 2 && type.getDimSize(1) % 4 == 0 &&
           type.getDimSize(1) >= run && kernelParamAlignment(scales) >= 16;
  };
  return fits(p.aScales, p.tileM) && fits(p.bScales[0], kFp8N);
}

std::pair<Value, Value> WgmmaEmitter::stagedStarts(const GemmPhase &p,
                                                   const Task &t) {
  auto start = [&](Value scales, Value first, int64_t run) {
    int64_t width = cast<MemRefType>(scales.getType()).getDimSize(1);
    return arith::MinSIOp::create(e.b, e.loc, first, e.index(width - run))
        .getResult();
  };
  return {start(p.aScales, t.aCol ? t.aCol : t.m0, p.tileM),
          start(p.bScales[0], t.n0, kFp8N)};
}

void WgmmaEmitter::loadExtra(const GemmPhase &p, Value g, Value kTile,
                             const Task &t) {
  if (!fp8StagedColumns(p))
    return;
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type i64 = b.getI64Type();
  Value stage = e.rem(g, e.index(kStages));
  Value barrier = LLVM::IntToPtrOp::create(
      b, loc, LLVM::LLVMPointerType::get(ctx, /*shared=*/3),
      nvgpu::MBarrierGetOp::create(b, loc, b.getI32Type(), barriers, stage),
      LLVM::DereferenceableAttr());
  Value slot = scaleSlot(g);
  // The k-tile's block of both scales: kBase / 128 + kTile (clamped, as
  // fp8Scales does).
  Value kb =
      t.kBase ? e.add(e.div(t.kBase, e.index(kTileKFp8)), kTile) : kTile;
  auto [a0, b0] = stagedStarts(p, t);
  auto copy = [&](Value dst, Value scales, Value first, int64_t run) {
    auto type = cast<MemRefType>(scales.getType());
    Value row = arith::MinSIOp::create(b, loc, kb,
                                       e.index(type.getDimSize(0) - 1));
    Value element = e.add(e.mul(row, e.index(type.getDimSize(1))), first);
    Value address = arith::AddIOp::create(
        b, loc,
        arith::IndexCastOp::create(
            b, loc, i64,
            memref::ExtractAlignedPointerAsIndexOp::create(b, loc, scales)),
        arith::IndexCastOp::create(b, loc, i64, e.mul(element, e.index(4))));
    Value src = LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(ctx, /*global=*/1), address,
        LLVM::DereferenceableAttr());
    // (The shared::cluster form, which PTX 8.1 has: the CTA's own shared
    // memory seen through the cluster window.)
    Value clusterDst = LLVM::AddrSpaceCastOp::create(
        b, loc, LLVM::LLVMPointerType::get(ctx, /*shared::cluster=*/7),
        sharedPointer(dst));
    NVVM::CpAsyncBulkGlobalToSharedClusterOp::create(
        b, loc, clusterDst, src, barrier,
        arith::ConstantIntOp::create(b, loc, 4 * run, 32),
        /*multicastMask=*/Value(), /*l2CacheHint=*/Value());
  };
  copy(slot, p.aScales, a0, p.tileM);
  copy(e.add(slot, e.index(kScaleSlotB)), p.bScales[0], b0, kFp8N);
}

SmallVector<Value> WgmmaEmitter::fp8StagedScales(const GemmPhase &p,
                                                 const Task &t, Value g,
                                                 Value wg) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f32 = b.getF32Type();
  Type v2 = VectorType::get({2}, f32);
  const int64_t fragment = kTileM * kFp8N / kThreads; // 64 floats
  Value slot = scaleSlot(g);
  auto [a0, b0] = stagedStarts(p, t);
  Value lane = e.rem(tid, e.index(32));
  Value warp = e.rem(e.div(tid, e.index(32)), e.index(4));
  // This thread's rows within the staged run, as fp8Scales' r0.
  Value r0 = e.add(e.sub(t.aCol ? t.aCol : t.m0, a0),
                   e.add(e.mul(wg, e.index(kTileM)),
                         e.add(e.mul(warp, e.index(16)),
                               e.div(lane, e.index(4)))));
  // Each run's loads at constant offsets from one pointer (immediate
  // offsets in the loads; a GEP's constant indices are i32).
  Type ptr = LLVM::LLVMPointerType::get(b.getContext(), /*shared=*/3);
  auto at = [&](Value pointer, int32_t bytes) {
    return LLVM::GEPOp::create(b, loc, ptr, b.getI8Type(), pointer,
                               ArrayRef<LLVM::GEPArg>{bytes},
                               LLVM::GEPNoWrapFlags::inbounds)
        .getResult();
  };
  Value aRow = sharedPointer(e.add(slot, e.mul(r0, e.index(4))));
  SmallVector<Value> scales;
  for (int64_t h = 0; h < 2; ++h)
    scales.push_back(LLVM::LoadOp::create(b, loc, f32, at(aRow, 32 * h)));
  // Columns 8c + 2 (l % 4) + v of the tile, in fragment order (c, v): a
  // pair of adjacent floats for each c (8-byte aligned: the run starts at
  // a multiple of 4 columns).
  Value c0 = e.add(e.sub(t.n0, b0), e.mul(e.rem(lane, e.index(4)),
                                          e.index(2)));
  Value bCols = sharedPointer(
      e.add(slot, e.add(e.index(kScaleSlotB), e.mul(c0, e.index(4)))));
  for (int64_t c = 0; c < fragment / 4; ++c) {
    Value pair = LLVM::LoadOp::create(b, loc, v2, at(bCols, 32 * c),
                                      /*alignment=*/8);
    for (int64_t v = 0; v < 2; ++v)
      scales.push_back(LLVM::ExtractElementOp::create(
          b, loc, pair,
          LLVM::ConstantOp::create(b, loc, b.getI32Type(), v)));
  }
  return scales;
}

SmallVector<Value> WgmmaEmitter::fp8Factors(const GemmPhase &p,
                                            ArrayRef<Value> s) {
  if (p.kOffsets)
    return SmallVector<Value>(s);
  SmallVector<Value> factors;
  for (Value sb : s.drop_front(2))
    for (int64_t h = 0; h < 2; ++h)
      factors.push_back(arith::MulFOp::create(e.b, e.loc, s[h], sb));
  return factors;
}

Value WgmmaEmitter::fp8KTile(const GemmPhase &p, const Task &t, Value g,
                             Value baseA, Value base, ArrayRef<Value> scales,
                             Value acc) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type f8 = Float8E4M3FNType::get(ctx), f32 = b.getF32Type();
  constexpr int64_t kStepK = 32; // an e4m3 wgmma's K: 32 bytes of a row
  const int64_t fragment = kTileM * kFp8N / kThreads; // 64 floats
  auto partType =
      LLVM::LLVMStructType::getLiteral(ctx, SmallVector<Type>(fragment, f32));
  // The k32 steps of the 128-byte rows: A [64 rows][32], K-major B spelled
  // [K][N] as for bf16 (the descriptors' strides are the bf16 ones: the
  // same bytes). B is the tile's 128 rows: gate's 64 then up's (B_1's box
  // right after B_0's), or the one operand's.
  MemRefType aStep = smemType(ctx, {kTileM, kStepK}, f8);
  MemRefType bStep = smemType(ctx, {kStepK, kFp8N}, f8);
  auto shape = NVVM::MMAShapeAttr::get(ctx, kTileM, kFp8N, kStepK);
  auto e4m3 = NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::e4m3);
  WgmmaAttrs attrs = wgmmaAttrs(ctx);

  NVVM::WgmmaFenceAlignedOp::create(b, loc);
  // The partial sums start from scale-d = 0: never read undefined. Step
  // ks's descriptors are step 0's plus ks * 32 bytes in their start
  // address field (which counts 16 bytes; shared addresses stay below its
  // 2^18, so the sum never carries out of the field).
  Value descA0 = descriptorAt(aStep, baseA, t.mapA);
  Value descB0 = descriptorAt(bStep, e.add(base, e.index(p.bytesA())), t.mapB0);
  Type i64 = b.getI64Type();
  auto advance = [&](Value desc, int64_t bytes) {
    if (bytes == 0)
      return desc;
    Value step = LLVM::ConstantOp::create(b, loc, i64, bytes / 16);
    return LLVM::AddOp::create(b, loc, desc, step).getResult();
  };
  Value part = LLVM::UndefOp::create(b, loc, partType);
  for (int64_t ks = 0; ks < kTileKFp8 / kStepK; ++ks) {
    part = NVVM::WgmmaMmaAsyncOp::create(
        b, loc, partType, part, advance(descA0, ks * kStepK),
        advance(descB0, ks * kStepK), shape, e4m3, e4m3, attrs.f32,
        ks == 0 ? attrs.zeroD : attrs.scaleD, attrs.scaleIn, attrs.scaleIn,
        attrs.row, attrs.col, NVVM::MMAIntOverflowAttr());
  }
  NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
  // With a producer the stage goes back now: the partial sums are in
  // registers, and the scaling below reads no shared memory.
  if (roles.producer)
    release(g);
  // acc += partial * sa[row] * sb[operand]: element 4c + 2h + v is row
  // half h of 8-column block c (columns 8c + 2 (l % 4) + v), whose operand
  // is B_1 from column 64 on; with K in groups sb is the column's.
  if (p.kOffsets) {
    ArrayRef<Value> sa = scales.take_front(2), sb = scales.drop_front(2);
    for (int64_t c = 0; c < fragment / 4; ++c)
      for (int64_t v = 0; v < 2; ++v) {
        Value sbCol = sb[2 * c + v];
        for (int64_t h = 0; h < 2; ++h) {
          int64_t i = 4 * c + 2 * h + v;
          Value x = LLVM::ExtractValueOp::create(b, loc, part, i);
          Value y = LLVM::ExtractValueOp::create(b, loc, acc, i);
          Value scale = arith::MulFOp::create(b, loc, sa[h], sbCol);
          Value sum = LLVM::FMAOp::create(b, loc, x, scale, y);
          acc = LLVM::InsertValueOp::create(b, loc, acc, sum, i);
        }
      }
    return acc;
  }
  for (int64_t i = 0; i < fragment; ++i) {
    int64_t j = p.b1 && i >= fragment / 2 ? 1 : 0;
    Value x = LLVM::ExtractValueOp::create(b, loc, part, i);
    Value y = LLVM::ExtractValueOp::create(b, loc, acc, i);
    Value sum = LLVM::FMAOp::create(b, loc, x, scales[2 * j + (i / 2) % 2], y);
    acc = LLVM::InsertValueOp::create(b, loc, acc, sum, i);
  }
  return acc;
}

/// The k-loop of one task: fp32 accumulators in registers (LLVM structs of
/// mmaN / 2 floats a thread, loop-carried), then the epilogue from
/// registers.
SmallVector<Value> WgmmaEmitter::accumulate(const GemmPhase &p, Value it,
                                            const Task &t) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i64 = b.getI64Type();
  int64_t kTiles = p.k / p.tileK();
  const int64_t tileN = p.tileN;
  const bool fp8 = p.fp8;
  // Two B operands (gate and up) lie side by side in the stage (B_1's box
  // right after B_0's, both 1024-aligned, so one 2 * tileN-row K-major
  // box): one m64n(2 tileN) wgmma per k-step reads A once for both, into
  // one accumulator whose first half is gate's columns and second half
  // up's. (Two m64n(tileN) wgmmas read each A step twice.)
  // (FP8 tiles are 128 columns in all, gate's 64 and up's or the down
  // projection's 128: one accumulator, whose k-tile partial sums need as
  // many registers again. whyNot.)
  const bool wide = p.b1 && 2 * tileN <= 256;
  const int64_t mmaN = wide ? 2 * tileN : tileN;
  assert((!fp8 || mmaN == kFp8N) && "FP8 tiles of 128 columns");
  int64_t numAcc = p.b1 && !wide ? 2 : 1;
  const int64_t fragment = kTileM * mmaN / kThreads; // 64 or 128 floats

  auto accType =
      LLVM::LLVMStructType::getLiteral(ctx, SmallVector<Type>(fragment, f32));
  MemRefType aStep = smemType(ctx, {kTileM, 16}, bf16);
  // K-major B, spelled [K][N] as nvgpu's descriptor generator wants. In
  // NVVM's terms A is "row" and a K-major B is "col" (imm-trans-a = 0,
  // imm-trans-b = 0 in PTX: what the verified probe's nvgpu path emits).
  MemRefType bStep = smemType(ctx, {16, mmaN}, bf16);
  auto shape = NVVM::MMAShapeAttr::get(ctx, kTileM, mmaN, 16);
  auto bf16Type = NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::bf16);
  WgmmaAttrs attrs = wgmmaAttrs(ctx);

  // The warpgroup of this thread: its half of a two-warpgroup tile.
  Value wg = e.div(tid, e.index(kThreads));
  // One k-tile: wait for its stage, one wgmma group over it, then hand
  // back (or refill) the stage of the k-tile before. The first k-tile of a
  // task is emitted apart, its first step with scale-d = 0 on undefined
  // accumulators: zero-initialized ones were copies of one zero register
  // that ptxas took for reads of in-flight accumulators (C7514, wgmmas
  // serialized).
  //
  // `mma` false: a warpgroup whose half of the tile is all padding does
  // its share of the pipeline (the consumer barriers, its gathered
  // copies, its releases) without MMAs.
  const bool staged = fp8StagedColumns(p);
  auto kTileStep = [&](Value kt, SmallVector<Value> acc, bool first, bool mma) {
    Value g = e.add(it, kt);
    Value stageCount = e.index(kStages);
    Value stage = e.rem(g, stageCount);
    // (A warpgroup without MMAs, the padding split's, never has a
    // producer: the split needs the early prefetch, which a producer
    // replaces. Its FP8 k-tiles would release nothing.)
    assert((mma || !roles.producer) && "no padding split with a producer");
    // FP8: the scales of k-tile kt+1, loaded now and carried to it, so that
    // their latency (L2, a new block every k-tile) passes during this
    // k-tile's wait and MMAs; kt's came from the k-tile before. K in
    // groups (the weight gradients, 32 column scales a thread): loaded
    // after this k-tile's promotion instead, into the registers it has
    // just read, so that their latency passes during the next k-tile's
    // wait and MMAs. (Loaded before, both sets were live at once: with a
    // producer, at 224 registers, ptxas copied the set at the back edge,
    // 34 moves a k-tile, and spilled in the k-loops.)
    SmallVector<Value> next;
    if (mma && fp8 && !p.kOffsets)
      next = fp8Scales(p, t, e.add(kt, e.index(1)), wg);
    if (mma || roles.producer)
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, barriers, phaseParity(g),
                                             e.index(10000000), stage);
    // Gathered A with a producer: its threads' cp.async copies (generic
    // proxy) completed on the stage's gather barrier, whose phases follow
    // the full barrier's (a gathered A with a producer is the kernel's
    // first tensor-core GEMM: every k-tile so far was gathered); the
    // wgmmas read through the async proxy.
    if (roles.producer && p.gatherRows) {
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, gatherBarriers,
                                             phaseParity(g), e.index(10000000),
                                             stage);
      if (mma)
        fenceAsyncShared();
    }
    if (mma && fp8) {
      Value base = e.add(pad, e.mul(stage, e.index(kStageBytes)));
      // Staged: this k-tile's scales from its stage, now that it landed.
      SmallVector<Value> scales =
          staged ? fp8StagedScales(p, t, g, wg)
                 : SmallVector<Value>(acc.begin() + 1, acc.end());
      acc[0] = fp8KTile(p, t, g, e.add(base, e.mul(wg, e.index(kBytesA))), base,
                        scales, acc[0]);
      if (p.kOffsets && !staged)
        next = fp8Scales(p, t, e.add(kt, e.index(1)), wg);
      acc.resize(1);
      if (!staged)
        acc.append(fp8Factors(p, next));
    } else if (mma) {
      Value base = e.add(pad, e.mul(stage, e.index(kStageBytes)));
      // This warpgroup's 64 rows of the A box (128-byte rows).
      Value baseA = e.add(base, e.mul(wg, e.index(kBytesA)));
      NVVM::WgmmaFenceAlignedOp::create(b, loc);
      for (int64_t ks = 0; ks < kTileK / 16; ++ks) {
        // M-major A: a k16 step is 16 of its box's 128-byte K rows.
        int64_t kStepA = p.transposeA ? 16 * kTileK * kBf16 : kK16Bytes;
        Value descA =
            descriptorAt(aStep, e.add(baseA, e.index(ks * kStepA)), t.mapA);
        for (int64_t j = 0; j < numAcc; ++j) {
          // N-major B: a k16 step is 16 of the boxes' 128-byte K rows (the
          // descriptor's leading-dimension offset, from the map's 64-row
          // boxes, steps between the 64-column blocks).
          int64_t kStep = p.transposeB ? 16 * kTileK * kBf16 : kK16Bytes;
          Value descB = descriptorAt(
              bStep,
              e.add(base, e.index(p.bytesA() + j * p.bytesB() + ks * kStep)),
              j == 0 ? t.mapB0 : t.mapB1);
          acc[j] = NVVM::WgmmaMmaAsyncOp::create(
              b, loc, accType, acc[j], descA, descB, shape, bf16Type, bf16Type,
              attrs.f32, first && ks == 0 ? attrs.zeroD : attrs.scaleD,
              attrs.scaleIn, attrs.scaleIn, p.transposeA ? attrs.col : attrs.row,
              p.transposeB ? attrs.row : attrs.col, NVVM::MMAIntOverflowAttr());
        }
      }
      NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
      // k-tile kt-1's group is complete (kt's may still run).
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 1);
    }
    Value prev = e.sub(kt, e.index(1));
    if (roles.producer) {
      // Hand k-tile g-1's stage back to the producer: at kt = 0 the
      // previous task's last k-tile (none at the phase's first k-tile:
      // each phase releases its own, the last after its task loop). No
      // branch on kt: LLVM peeled the loop's first iteration for one, and
      // ptxas serialized that copy's wgmmas. FP8 released this k-tile's
      // own stage already.
      if (!fp8 && first)
        e.ifThen(e.cmp(arith::CmpIPredicate::ne, g, phaseStart),
                 [&] { release(e.sub(g, e.index(1))); });
      else if (!fp8)
        release(e.sub(g, e.index(1)));
    } else {
      // Gathered A: this thread's rows of k-tile kt+1 have landed (copied
      // two k-tiles ago; one cp.async group per k-tile, the prologue's and
      // the refills', empty or not), so the barrier below makes them
      // everyone's before kt+1's wgmmas.
      static_assert(kStages >= 3, "k-tile kt+1's group must be committed "
                                  "before iteration kt's wait");
      if (p.gatherRows)
        gatheredRowsLanded(
            std::max<int64_t>(0, std::min<int64_t>(kStages - 3, kTiles - 2)));
      // Every thread is past that point before thread 0 refills kt-1's
      // stage.
      syncWarpgroup(p.consumers());
      Value next = e.add(prev, stageCount);
      Value inRange = arith::AndIOp::create(
          b, loc, e.cmp(arith::CmpIPredicate::sge, prev, e.index(0)),
          e.cmp(arith::CmpIPredicate::slt, next,
                t.kTiles ? t.kTiles : e.index(kTiles)));
      Value stageOf = e.add(e.sub(g, e.index(1)), stageCount);
      if (roles.cluster > 1) {
        // Clusters: k-tile kt-1 released to both CTAs' empty barriers
        // (every k-tile, refilled or not; the last at onStagesFree). The
        // refill is one k-tile later than without clusters: k-tile kt+2
        // goes into the stage of k-tile kt-2, whose release by the partner
        // has had a k-tile's time to land, so thread 0 (a consumer) does
        // not wait for the partner to reach this very point. The task's
        // prologue loads one k-tile fewer (prologueLoads), and k-tile
        // kStages-1 comes here at kt = 1, into the stage of the previous
        // task's last k-tile (released at that task's onStagesFree).
        e.ifThen(arith::AndIOp::create(
                     b, loc, isThread0,
                     e.cmp(arith::CmpIPredicate::sge, prev, e.index(0))),
                 [&] { clusterRelease(e.sub(g, e.index(1))); });
        Value next2 = e.add(kt, e.index(2));
        Value refill = arith::AndIOp::create(
            b, loc,
            e.cmp(arith::CmpIPredicate::sge, next2,
                  e.index(prologueLoads(kTiles))),
            e.cmp(arith::CmpIPredicate::slt, next2, e.index(kTiles)));
        e.ifThen(arith::AndIOp::create(b, loc, isThread0, refill), [&] {
          load(p, e.add(g, e.index(2)), next2, t);
        });
      } else {
        e.ifThen(arith::AndIOp::create(b, loc, isThread0, inRange),
                 [&] { load(p, stageOf, next, t); });
      }
      // Gathered A: every consumer thread its chunks.
      if (p.gatherRows) {
        e.ifThen(inRange, [&] { loadGatheredRows(p, stageOf, next, t); });
        NVVM::CpAsyncCommitGroupOp::create(b, loc);
      }
    }
    return acc;
  };
  // (Without a producer: zero accumulators and every k-tile in the loop,
  // the form the H200 runs verified before the producer existed.)
  auto kLoop = [&](bool mma) {
    SmallVector<Value> init;
    // (FP8: the accumulator is no wgmma's, only the partial sums are;
    // it starts at zero with a producer too.)
    for (int64_t j = 0; j < numAcc; ++j)
      init.push_back((roles.producer && !fp8) || !mma
                         ? Value(LLVM::UndefOp::create(b, loc, accType))
                         : Value(LLVM::ZeroOp::create(b, loc, accType)));
    // FP8: k-tile 0's scales; the loop carries each next k-tile's.
    if (mma && fp8 && !staged)
      init.append(fp8Factors(p, fp8Scales(p, t, e.index(0), wg)));
    // With a producer the first k-tile is peeled (bf16: it releases the
    // previous task's last stage and zeroes the accumulators), except for
    // FP8 with a k-tile count of the task's own (K in groups: it may be
    // 0), whose k-tiles release their own stages and whose accumulators
    // start at zero.
    bool peel = roles.producer && !(fp8 && t.kTiles);
    if (peel)
      init = kTileStep(e.index(0), init, /*first=*/true, mma);
    auto loop = scf::ForOp::create(b, loc, e.index(peel ? 1 : 0),
                                   t.kTiles ? t.kTiles : e.index(kTiles),
                                   e.index(1), init);
    // FP8: never unrolled. With the scale factors carried, LLVM unrolled
    // a k-loop of three k-tiles (K = 512) in full, and ptxas then
    // serialized the kernel's wgmmas for want of registers (C7512).
    if (fp8) {
      auto unroll = LLVM::LoopUnrollAttr::get(ctx, b.getBoolAttr(true), {}, {},
                                              {}, {}, {}, {});
      loop->setAttr("loop_annotation",
                    LLVM::LoopAnnotationAttr::get(ctx, {}, {}, {}, unroll, {},
                                                  {}, {}, {}, {}, {}, {}, {},
                                                  {}, {}, {}));
    }
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    SmallVector<Value> acc = kTileStep(
        loop.getInductionVar(), SmallVector<Value>(loop.getRegionIterArgs()),
        /*first=*/false, mma);
    scf::YieldOp::create(b, loc, acc);
    return SmallVector<Value>(loop.getResults().take_front(numAcc));
  };
  // Padding rows (the down projections, mk.gemm's `padding`): with two
  // consumer warpgroups and the register epilogue after an early prefetch,
  // the second one skips its MMAs and stores when its 64 rows are all
  // padding (the first row of a tile is always a routed row; padding ends
  // each segment). With uniform routing about half of the experts' last
  // tiles have such a half. Not in the wide gate/up GEMM: the second
  // k-loop slowed it on the H200 (dsv3-shard gate/up 3.29 -> 3.44 ms with
  // the loop never taken, 3.56 ms with skips; down 2.02 -> 1.90-1.95 ms).
  // Not with a producer: the second k-loop made ptxas spill there.
  Value live;
  SmallVector<Value> accs;
  if (p.paddingRows && p.consumers() == 2 && onStagesFree && !p.b1) {
    Value firstRow = e.add(t.m0, e.mul(wg, e.index(kTileM)));
    live = arith::OrIOp::create(
        b, loc, e.cmp(arith::CmpIPredicate::eq, wg, e.index(0)),
        e.cmp(arith::CmpIPredicate::sge,
              e.toIndex(e.load(p.paddingRows, {firstRow})), e.index(0)));
    auto ifOp =
        scf::IfOp::create(b, loc, SmallVector<Type>(numAcc, accType), live,
                          /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    splitWarpgroups = true;
    b.setInsertionPointToStart(ifOp.thenBlock());
    scf::YieldOp::create(b, loc, kLoop(/*mma=*/true));
    b.setInsertionPointToStart(ifOp.elseBlock());
    scf::YieldOp::create(b, loc, kLoop(/*mma=*/false));
    splitWarpgroups = false;
    accs.assign(ifOp.getResults().begin(), ifOp.getResults().end());
  } else {
    accs = kLoop(/*mma=*/true);
  }
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);

  // Thread t of the warpgroup (warp w = t / 32, lane l) holds, for every
  // 8-column block c, rows 16w + l/4 and +8, columns 8c + 2(l%4) and +1:
  // element 4c + 2h + v of the fragment is (16w + l/4 + 8h, 8c + 2(l%4) + v).
  Value lane = e.rem(tid, e.index(32));
  Value warp = e.rem(e.div(tid, e.index(32)), e.index(4));
  Value row0 =
      e.add(e.add(e.mul(wg, e.index(kTileM)), e.mul(warp, e.index(16))),
            e.div(lane, e.index(4)));
  Value col0 = e.mul(e.rem(lane, e.index(4)), e.index(2));
  // Element `index` of B_j's fragment (the wgmma D layout of tileN columns).
  auto element = [&](int64_t j, int64_t index) {
    if (wide)
      return LLVM::ExtractValueOp::create(b, loc, accs[0],
                                          index + j * fragment / 2)
          .getResult();
    return LLVM::ExtractValueOp::create(b, loc, accs[j], index).getResult();
  };

  // Without a producer, with an early prefetch: once every consumer warp's
  // wgmmas are complete, the next task's first stages start loading, and
  // the epilogue stores from registers.
  if (onStagesFree) {
    assert(!roles.producer && p.storePair && "an early prefetch");
    syncWarpgroup(p.consumers());
    onStagesFree();
  }
  // With a producer (or an early prefetch), the stages may already hold the
  // next task's k-tiles: both epilogues store from registers, two adjacent
  // columns at a time.
  if (roles.producer || onStagesFree) {
    assert(p.n % 2 == 0 && p.storePair && "pairs of columns");
    // The accumulators of the column pair at fragment element `index`
    // (gate's, then up's with two B operands), as storePair and packPair
    // take them.
    auto pairAt = [&](int64_t index) {
      std::pair<SmallVector<Value>, SmallVector<Value>> acc;
      acc.first = {element(0, index), element(0, index + 1)};
      if (p.b1)
        acc.second = {element(1, index), element(1, index + 1)};
      return acc;
    };
    // Whether output (row, col) is stored: a computed row, and (ragged N)
    // a column inside.
    auto stored = [&](Value row, Value col) {
      Value inside = e.cmp(arith::CmpIPredicate::slt, row, p.rows);
      if (p.n % tileN)
        inside = arith::AndIOp::create(
            b, loc, inside,
            e.cmp(arith::CmpIPredicate::slt, col, e.index(p.n)));
      return inside;
    };
    // Output (row, col) of the column pair at fragment block c, row half h.
    auto pairOrigin = [&](int64_t c, int64_t h) -> std::pair<Value, Value> {
      return {e.add(t.m0, e.add(row0, e.index(8 * h))),
              e.add(t.n0, e.add(col0, e.index(8 * c)))};
    };
    auto storesWith = [&](decltype(p.storePair) storePair) {
      for (int64_t c = 0; c < tileN / 8; ++c)
        for (int64_t h = 0; h < 2; ++h) {
          auto [r, col] = pairOrigin(c, h);
          e.ifThen(stored(r, col), [&] {
            auto [acc0, acc1] = pairAt(4 * c + 2 * h);
            storePair(r, col, acc0, acc1);
          });
        }
    };
    assert(!p.storePairAligned == !p.pairsAligned &&
           "storePairAligned goes with pairsAligned");
    auto stores = [&] {
      if (p.storePairAligned)
        e.ifThen(
            p.pairsAligned, [&] { storesWith(p.storePairAligned); },
            [&] { storesWith(p.storePair); });
      else
        storesWith(p.storePair);
    };
    // Staged: each warp puts 16 rows x 64 columns of its results at a time
    // into its 2 KiB of shared memory (stmatrix: four 8 x 8 bf16 blocks a
    // call, exactly the D fragment's pairs; 16-byte pieces swizzled by
    // row so that neither side conflicts on banks) and reads them back as
    // whole 16-byte row pieces: every global store instruction of a warp
    // writes four 128-byte row segments (instead of 16-byte pieces of
    // eight rows).
    auto stagedOne = [&](function_ref<Value(ArrayRef<Value>, ArrayRef<Value>)>
                             pack,
                         Value outAddress) {
      Type i32 = b.getI32Type();
      Value lane8 = e.rem(lane, e.index(8)),
            laneGroup = e.div(lane, e.index(8));
      Value buf = e.add(
          staging, e.mul(e.div(tid, e.index(32)), e.index(kEpilogueWarpBytes)));
      Value mask = arith::ConstantIntOp::create(b, loc, -1, 32);
      // Byte offset (from smem) of 16-byte piece `unit` of staged row `r`.
      auto piece = [&](Value r, Value unit) {
        return e.add(buf, e.add(e.mul(r, e.index(128)),
                                e.mul(arith::XOrIOp::create(
                                          b, loc, unit, e.rem(r, e.index(8))),
                                      e.index(16))));
      };
      auto sharedPtr = [&](Value offset) {
        return sharedPointer(e.add(smemBase, offset));
      };
      Value firstRow = e.add(
          t.m0, e.add(e.mul(wg, e.index(kTileM)), e.mul(warp, e.index(16))));
      for (int64_t q = 0; q < tileN / 64; ++q) {
        // This lane addresses row lane % 8 of block lane / 8 of each call:
        // block m is (column block c = 8q + 2j + m / 2, row half m % 2).
        Value stagedRow =
            e.add(e.mul(e.rem(laneGroup, e.index(2)), e.index(8)), lane8);
        for (int64_t j = 0; j < 4; ++j) {
          SmallVector<Value> regs;
          for (int64_t m = 0; m < 4; ++m) {
            int64_t c = 8 * q + 2 * j + m / 2, h = m % 2;
            auto [acc0, acc1] = pairAt(4 * c + 2 * h);
            regs.push_back(pack(acc0, acc1));
          }
          Value unit = e.add(e.index(2 * j), e.div(laneGroup, e.index(2)));
          NVVM::StMatrixOp::create(
              b, loc, sharedPtr(piece(stagedRow, unit)), regs,
              NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::row),
              NVVM::LdStMatrixShapeAttr::get(ctx, 8, 8),
              NVVM::LdStMatrixEltTypeAttr::get(ctx,
                                               NVVM::LdStMatrixEltType::B16));
        }
        NVVM::SyncWarpOp::create(b, loc, mask);
        // Lane l: piece l % 8 of rows l / 8 + 4i.
        for (int64_t i = 0; i < 4; ++i) {
          Value r = e.add(laneGroup, e.index(4 * i));
          Value v = LLVM::LoadOp::create(b, loc, VectorType::get({4}, i32),
                                         sharedPtr(piece(r, lane8)), 16);
          Value row = e.add(firstRow, r);
          Value col =
              e.add(t.n0, e.add(e.index(64 * q), e.mul(lane8, e.index(8))));
          e.ifThen(stored(row, col), [&] {
            Value offset = arith::IndexCastOp::create(
                b, loc, i64,
                e.mul(e.add(e.mul(row, e.index(p.n)), col), e.index(kBf16)));
            Value address = arith::AddIOp::create(b, loc, outAddress, offset);
            // Streaming (evict-first): read once, by the next phase.
            storeGlobalStreaming16(b, loc, address, v);
          });
        }
        // Every lane has read the staged rows before the next piece.
        NVVM::SyncWarpOp::create(b, loc, mask);
      }
    };
    auto staged = [&] {
      stagedOne(p.packPair, p.outAddress);
      for (const GemmPhase::StagedOutput &o : p.alsoStaged)
        stagedOne(o.pack, o.address);
    };
    auto epilogue = [&] {
      if (p.packPair && p.n % 8 == 0 && staging)
        e.ifThen(p.outAligned16, staged, stores);
      else
        stores();
    };
    // (Clusters: a copy of the partner's task stores nothing.)
    if (t.live)
      live = live ? arith::AndIOp::create(b, loc, live, t.live) : t.live;
    if (live)
      e.ifThen(live, epilogue);
    else
      epilogue();
    return {};
  }

  // One operand (the down projections): the accumulators go through shared
  // memory, so that the shared epilogue writes whole rows (coalesced).
  if (!p.b1) {
    // Every warp's wgmmas of the task are complete first: the other warps'
    // (and the other warpgroup's) may still read the stages this reuses.
    syncWarpgroup(p.consumers());
    MemRefType accTile = smemType(ctx, {p.tileM, tileN}, f32);
    Value tile = view(pad, accTile);
    for (int64_t c = 0; c < tileN / 8; ++c)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t v = 0; v < 2; ++v)
          e.store(
              element(0, 4 * c + 2 * h + v), tile,
              {e.add(row0, e.index(8 * h)), e.add(col0, e.index(8 * c + v))});
    syncWarpgroup(p.consumers());
    return {tile};
  }

  // Gate and up (element i of gate's fragment and of up's, `element`):
  // the SwiGLU epilogue straight from registers, one column at a time
  // (without a pair store: odd N).
  for (int64_t c = 0; c < tileN / 8; ++c)
    for (int64_t h = 0; h < 2; ++h) {
      Value r = e.add(t.m0, e.add(row0, e.index(8 * h)));
      Value inRows = e.cmp(arith::CmpIPredicate::slt, r, p.rows);
      e.ifThen(inRows, [&] {
        for (int64_t v = 0; v < 2; ++v) {
          int64_t index = 4 * c + 2 * h + v;
          Value col = e.add(t.n0, e.add(col0, e.index(8 * c + v)));
          auto store = [&] {
            p.store(r, col, element(0, index), element(1, index));
          };
          if (p.n % tileN)
            e.ifThen(e.cmp(arith::CmpIPredicate::slt, col, e.index(p.n)),
                     store);
          else
            store();
        }
      });
    }
  return {};
}

std::unique_ptr<GemmEmitter>
createGemmEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
                  ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                  const WarpRoles &roles) {
  return std::make_unique<WgmmaEmitter>(e, module, tensorMaps, prefetch, roles);
}

} // namespace mok::conversion::sm90
