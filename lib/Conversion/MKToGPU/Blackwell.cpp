// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// sm_100a MMA layer: tcgen05 (5th-generation tensor cores) under the shared
// TMA + mbarrier pipeline (GemmPipeline.cpp). Validated by ptxas and
// FileCheck only: no sm_100a GPU is available to this project.
//
//   * Tensor Memory: warp 0 allocates kTmemColumns columns once per CTA
//     (tcgen05.alloc, whose result lands in a shared-memory slot), then
//     gives up the CTA's right to allocate (tcgen05.relinquish_alloc_permit);
//     every thread reads the address after a CTA barrier framed by
//     tcgen05.fence::before/after_thread_sync. Warp 0 frees it
//     (tcgen05.dealloc) after the last GEMM phase (`finish`).
//   * Accumulators: M = 64 (one m-tile), N = 128 (one n-tile), fp32, B_0's
//     at TMEM column 0 and B_1's at column 128. An M = 64 cta_group::1 MMA
//     writes data-path Layout F (PTX ISA 9.7.16.10.5): row 16w + i of the
//     tile in TMEM lane 32w + i, i < 16, for the four 32-lane
//     sub-partitions w (half the lanes are unused).
//   * MMA: thread 0 waits for a stage's full barrier, issues the k-tile's
//     tcgen05.mma.cta_group::1.kind::f16 (4 k16 steps x B_0, B_1; shared-
//     memory descriptors for both operands, bf16 in, fp32 accumulate) and
//     tcgen05.commit's them to the stage's "empty" mbarrier. Thread 0 is also
//     the producer: before it refills a stage (the previous k-tile's, one
//     k-tile behind so the tensor core always has the current k-tile
//     queued), it waits on that stage's empty barrier (`acquire`). After the
//     last k-tile it commits to the accumulator barrier.
//   * Epilogue: the warpgroup waits on the accumulator barrier, then each
//     warp reads its 32 TMEM lanes with tcgen05.ld.32x32b.x32 (32 columns a
//     time) + tcgen05.wait::ld; the threads holding rows (lanes < 16) store
//     them to the shared-memory tiles of the shared SIMT epilogue.
//
// Barrier phases: the empty barrier of stage s completes once per k-tile g
// with g % kStages == s, like the full barrier, so k-tile g's commit
// completes phase (g / kStages) & 1 of it; every load of a k-tile g >=
// kStages first waits for k-tile g - kStages's commit, so those phases are
// observed in order. The accumulator barrier completes once per task; the
// warpgroup counts the tasks it finished (carried across tasks and phases
// like `iteration`).
//
#include "Blackwell.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/IR/BuiltinOps.h"

using namespace mlir;
using namespace mok::mk::schedule;
using namespace mok::conversion::gemm;

namespace mok::conversion::sm100 {

namespace {

constexpr const char *kTmemSlot = "mok_tmem_base";
constexpr int64_t kTmemAddressSpace = 6; // NVPTX's tensor memory
constexpr int64_t kLdColumns = 32;       // columns per tcgen05.ld (.x32)

/// The 32-bit instruction descriptor of tcgen05.mma .kind::f16 (PTX ISA
/// 9.7.16.4.2, "Instruction descriptor format for .kind::tf32, .kind::f16,
/// .kind::f8f6f4 and .kind::i8"): dense, D = F32, A = B = BF16, no negation,
/// A and B K-major unless transposed (bit 15: A MN-major, bit 16: B
/// MN-major), N >> 3 in bits 17-22, M >> 4 in bits 24-28; no shift (bits
/// 30-31, .ws only).
constexpr uint32_t instrDescF16(int64_t m, int64_t n, bool transposeA = false,
                                bool transposeB = false) {
  return (1u << 4)    // bits 4-5: D type, F32 = 1
         | (1u << 7)  // bits 7-9: A type, BF16 = 1
         | (1u << 10) // bits 10-12: B type, BF16 = 1
         | (static_cast<uint32_t>(transposeA) << 15) |
         (static_cast<uint32_t>(transposeB) << 16) |
         (static_cast<uint32_t>(n >> 3) << 17) |
         (static_cast<uint32_t>(m >> 4) << 24);
}
static_assert(instrDescF16(64, 128) == 0x04200490u);
static_assert(instrDescF16(64, 128, true, true) == 0x04218490u);
// M = 64 needs N % 8 == 0, 8 <= N <= 256 (cta_group::1, dense, kind::f16).
static_assert(kTileM == 64 && kTileN % 8 == 0 && kTileN <= 256);
static_assert(2 * kTileN <= kTmemColumns && kTmemColumns <= 512 &&
                  (kTmemColumns & (kTmemColumns - 1)) == 0,
              "tcgen05.alloc takes a power of two of at least 32 columns");
static_assert(kTileN % kLdColumns == 0);

/// Fields of the 64-bit shared memory descriptor (PTX ISA 9.7.16.4.1,
/// "Shared memory descriptor", Table 40) of a K-major operand tile as the
/// TMA leaves it with SWIZZLE_128B: rows of 128 bytes, 8-row swizzle atoms
/// of 1024 bytes stacked along M (or N). Offsets are encoded (x >> 4):
///   leading dimension byte offset: unused for swizzled K-major layouts,
///     "assumed to be 1" (9.7.16.3.1.1), so 1;
///   stride dimension byte offset: from one 8-row group to the next,
///     1024 bytes, so 64;
///   matrix base offset 0: every tile starts on a 1024-byte boundary, where
///     the 128-byte swizzle pattern repeats (Table 41);
///   leading dimension mode 0 (relative offset);
///   swizzle mode (bits 61-63) 2 = 128-byte swizzling. (wgmma's descriptor
///     has a 2-bit field in bits 62-63 instead, where 128B is 1; the fixed
///     0b001 in bits 46-48 is also tcgen05's own.)
constexpr int32_t kDescLeadingOffset = 1;
constexpr int32_t kDescStrideOffset = 1024 >> 4;
constexpr int8_t kDescSwizzle128B = 2;
/// An MN-major operand (the backward's transposed A and B): TMA boxes of 64
/// (M or N) x 64 (K), 128-byte rows along MN, 8 KiB apart along MN. The
/// leading dimension byte offset steps between those 64-element MN blocks
/// (8192 bytes), the stride dimension byte offset between 8-row K groups
/// (1024 bytes): wgmma's values for the same layout, which the backward's
/// GPU tests check on the H200 (the sm_90a descriptors:
/// test/Conversion/MoEToPTX/wgmma-operand-forms.mlir). A k16 step is 16 K
/// rows, +2048 bytes.
constexpr int32_t kDescLeadingOffsetMN = (kTileK * kTileK * 2) >> 4;
constexpr int64_t kK16BytesMN = 16 * kTileK * 2;

class Tcgen05Emitter final : public GemmEmitter {
public:
  Tcgen05Emitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
                 ArrayRef<std::pair<int64_t, int64_t>> prefetch);

  void finish() override;

private:
  /// kStages "empty" barriers (stage s at index s), then the accumulator
  /// barrier (index kStages); arrival count 1, arrived on by tcgen05.commit.
  Value mmaBarriers;
  Value tmem; // the Tensor Memory base address (i32: lane << 16 | column)
  Value isWarp0;

  void acquire(Value g) override;
  SmallVector<Value> accumulate(const GemmPhase &p, Value it,
                                const Task &t) override;

  Value i32(int64_t v) {
    return arith::ConstantIntOp::create(e.b, e.loc, v, 32);
  }
  /// A Tensor Memory pointer (!llvm.ptr<6>) from its 32-bit address.
  Value tmemPointer(Value address);
  /// An mbarrier of `mmaBarriers` as a shared-memory pointer (for
  /// tcgen05.commit).
  Value mmaBarrierPointer(Value index);
  /// Waits (mbarrier.try_wait.parity) for the phase of parity `parity` of
  /// mmaBarriers[index].
  void waitMmaBarrier(Value index, Value parity);
  /// Emits tcgen05.fence::before_thread_sync or ::after_thread_sync.
  void fence(NVVM::Tcgen05FenceKind kind);
  /// The shared memory descriptor of the K-major, 128B-swizzled tile at
  /// `byteOffset` from the dynamic shared memory (nvvm.tcgen05.mma_smem_desc,
  /// plain integer arithmetic in LLVM IR).
  Value smemDescriptor(Value byteOffset, bool mnMajor = false);
  /// Emits tcgen05.mma.cta_group::1.kind::f16 [d], aDesc, bDesc, idesc,
  /// accumulate.
  void mma(Value d, Value aDesc, Value bDesc, Value accumulate,
           bool transposeA = false, bool transposeB = false);
  /// Emits tcgen05.commit.cta_group::1.mbarrier::arrive::one on
  /// mmaBarriers[index]: it arrives once the MMAs this thread issued so far
  /// have completed.
  void commit(Value index);
};

} // namespace

Tcgen05Emitter::Tcgen05Emitter(Emitter &e, gpu::GPUModuleOp module,
                               Value tensorMaps,
                               ArrayRef<std::pair<int64_t, int64_t>> prefetch)
    : GemmEmitter(e, module, tensorMaps, prefetch, WarpRoles{},
                  /*sm90=*/false) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type i32Type = b.getI32Type();

  // The shared-memory slot tcgen05.alloc writes the TMEM address to.
  MemRefType slotType = smemType(ctx, {1}, i32Type);
  if (!module.lookupSymbol(kTmemSlot)) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(module.getBody());
    memref::GlobalOp::create(b, loc, kTmemSlot, b.getStringAttr("private"),
                             slotType, Attribute(), /*constant=*/false,
                             b.getI64IntegerAttr(4));
  }
  Value slot = memref::GetGlobalOp::create(b, loc, slotType, kTmemSlot);
  Value slotAddress = arith::IndexCastOp::create(
      b, loc, b.getI64Type(),
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, slot));
  Value slotPointer = LLVM::IntToPtrOp::create(
      b, loc, LLVM::LLVMPointerType::get(ctx, /*shared=*/3), slotAddress,
      LLVM::DereferenceableAttr());

  mmaBarriers = nvgpu::MBarrierCreateOp::create(
      b, loc,
      nvgpu::MBarrierGroupType::get(
          ctx, gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup),
          kStages + 1));
  e.ifThen(isThread0, [&] {
    for (int64_t s = 0; s <= kStages; ++s)
      nvgpu::MBarrierInitOp::create(b, loc, mmaBarriers, e.index(1), e.index(s),
                                    Value());
    // fence.mbarrier_init: the inits are visible to the async proxy that
    // tcgen05.commit arrives through.
    NVVM::FenceMbarrierInitOp::create(b, loc);
  });

  // tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 and
  // tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned: warp-wide
  // (.sync.aligned), so all of warp 0, in warp-uniform control flow.
  auto cta1 = NVVM::CTAGroupKindAttr::get(ctx, NVVM::CTAGroupKind::CTA_1);
  isWarp0 = e.cmp(arith::CmpIPredicate::ult, tid, e.index(32));
  e.ifThen(isWarp0, [&] {
    Value columns = i32(kTmemColumns);
    NVVM::Tcgen05AllocOp::create(b, loc, slotPointer, columns, cta1);
    NVVM::Tcgen05RelinquishAllocPermitOp::create(b, loc, cta1);
  });
  fence(NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
  gpu::BarrierOp::create(b, loc);
  fence(NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
  tmem = e.load(slot, {e.index(0)});

  carried = {e.index(0)}; // tasks finished: the accumulator barrier's phase
}

void Tcgen05Emitter::finish() {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // The caller's CTA barrier follows every thread's last tcgen05 operation
  // (and its tcgen05.fence::before_thread_sync, in the epilogue).
  fence(NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
  // tcgen05.dealloc.cta_group::1.sync.aligned.b32, by the allocating warp.
  e.ifThen(isWarp0, [&] {
    Value pointer = tmemPointer(tmem);
    Value columns = i32(kTmemColumns);
    NVVM::Tcgen05DeallocOp::create(
        b, loc, pointer, columns,
        NVVM::CTAGroupKindAttr::get(b.getContext(), NVVM::CTAGroupKind::CTA_1));
  });
}

Value Tcgen05Emitter::tmemPointer(Value address) {
  return LLVM::IntToPtrOp::create(
      e.b, e.loc,
      LLVM::LLVMPointerType::get(e.b.getContext(), kTmemAddressSpace), address,
      LLVM::DereferenceableAttr());
}

Value Tcgen05Emitter::mmaBarrierPointer(Value index) {
  OpBuilder &b = e.b;
  Value address = nvgpu::MBarrierGetOp::create(b, e.loc, b.getI32Type(),
                                               mmaBarriers, index);
  return LLVM::IntToPtrOp::create(
      b, e.loc, LLVM::LLVMPointerType::get(b.getContext(), /*shared=*/3),
      address, LLVM::DereferenceableAttr());
}

void Tcgen05Emitter::waitMmaBarrier(Value index, Value parity) {
  nvgpu::MBarrierTryWaitParityOp::create(e.b, e.loc, mmaBarriers, parity,
                                         e.index(10000000), index);
}

void Tcgen05Emitter::fence(NVVM::Tcgen05FenceKind kind) {
  NVVM::Tcgen05FenceOp::create(
      e.b, e.loc, NVVM::Tcgen05FenceKindAttr::get(e.b.getContext(), kind));
}

Value Tcgen05Emitter::smemDescriptor(Value byteOffset, bool mnMajor) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value address = arith::IndexCastOp::create(b, loc, b.getI32Type(),
                                             e.add(smemBase, byteOffset));
  Value start = arith::ShRUIOp::create(b, loc, address, i32(4));
  Value leading = i32(mnMajor ? kDescLeadingOffsetMN : kDescLeadingOffset);
  Value stride = i32(kDescStrideOffset);
  Value baseOffset = arith::ConstantIntOp::create(b, loc, 0, 8);
  Value absoluteLeading = arith::ConstantIntOp::create(b, loc, 0, 1);
  Value swizzle = arith::ConstantIntOp::create(b, loc, kDescSwizzle128B, 8);
  return NVVM::Tcgen05MmaSmemDescOp::create(b, loc, b.getI64Type(), start,
                                            leading, stride, baseOffset,
                                            absoluteLeading, swizzle);
}

void Tcgen05Emitter::mma(Value d, Value aDesc, Value bDesc, Value accumulate,
                         bool transposeA, bool transposeB) {
  OpBuilder &b = e.b;
  MLIRContext *ctx = b.getContext();
  Value dPointer = tmemPointer(d);
  Value idesc = i32(static_cast<int32_t>(
      instrDescF16(kTileM, kTileN, transposeA, transposeB)));
  NVVM::Tcgen05MMAOp::create(
      b, e.loc, NVVM::Tcgen05MMAKindAttr::get(ctx, NVVM::Tcgen05MMAKind::F16),
      NVVM::CTAGroupKindAttr::get(ctx, NVVM::CTAGroupKind::CTA_1),
      NVVM::Tcgen05MMACollectorOpAttr::get(
          ctx, NVVM::Tcgen05MMACollectorOp::DISCARD),
      /*aShift=*/UnitAttr(), dPointer, aDesc, bDesc, idesc, accumulate,
      /*scaleInputD=*/Value(), /*disableOutputLane=*/Value());
}

void Tcgen05Emitter::commit(Value index) {
  NVVM::Tcgen05CommitOp::create(
      e.b, e.loc, mmaBarrierPointer(index), /*multicastMask=*/Value(),
      NVVM::CTAGroupKindAttr::get(e.b.getContext(), NVVM::CTAGroupKind::CTA_1));
}

/// Thread 0, before loading k-tile number g: the MMAs of k-tile g - kStages
/// (the stage's previous occupant) have completed.
void Tcgen05Emitter::acquire(Value g) {
  Value stageCount = e.index(kStages);
  e.ifThen(e.cmp(arith::CmpIPredicate::sge, g, stageCount), [&] {
    Value previous = e.sub(g, stageCount);
    Value stage = e.rem(previous, stageCount);
    waitMmaBarrier(stage, phaseParity(previous));
  });
}

SmallVector<Value> Tcgen05Emitter::accumulate(const GemmPhase &p, Value it,
                                              const Task &t) {
  assert(p.tileN == kTileN && "tcgen05: tiles of kTileN columns only");
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  assert(!p.gatherRows && "tcgen05: no gathered A");
  int64_t kTiles = p.k / kTileK;
  int64_t numAcc = p.b1 ? 2 : 1;
  Value accBarrier = e.index(kStages);
  Value tasksDone = carried[0];
  // K in groups (mk.gemm k_groups): the task's own k-tile count.
  Value kTilesV = t.kTiles ? t.kTiles : e.index(kTiles);

  // Thread 0 issues the MMAs of the task and keeps the stages filled.
  e.ifThen(isThread0, [&] {
    e.loop(kTilesV, [&](Value kt) {
      Value g = e.add(it, kt);
      Value stage = e.rem(g, e.index(kStages));
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, barriers, phaseParity(g),
                                             e.index(10000000), stage);
      // The MMAs come after the wait for the stage's TMA data, and after the
      // previous task's tcgen05.ld of the accumulators (which precede the
      // warpgroup barrier that ended its epilogue), whose TMEM they
      // overwrite.
      fence(NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
      Value base = stageOffset(g);
      // The first MMA of the task overwrites the accumulators
      // (enable-input-d false); the others accumulate.
      Value notFirstKTile = e.cmp(arith::CmpIPredicate::ne, kt, e.index(0));
      Value yes = arith::ConstantIntOp::create(b, loc, 1, 1);
      int64_t stepA = p.transposeA ? kK16BytesMN : kK16Bytes;
      int64_t stepB = p.transposeB ? kK16BytesMN : kK16Bytes;
      for (int64_t ks = 0; ks < kTileK / 16; ++ks) {
        Value aDesc =
            smemDescriptor(e.add(base, e.index(ks * stepA)), p.transposeA);
        for (int64_t j = 0; j < numAcc; ++j) {
          Value bDesc = smemDescriptor(
              e.add(base, e.index(kBytesA + j * kBytesB + ks * stepB)),
              p.transposeB);
          Value d = arith::AddIOp::create(b, loc, tmem, i32(j * kTileN));
          mma(d, aDesc, bDesc, ks == 0 ? notFirstKTile : yes, p.transposeA,
              p.transposeB);
        }
      }
      // The stage is free once these MMAs complete.
      commit(stage);
      // Refill the previous k-tile's stage (its MMAs were queued one k-tile
      // earlier) with k-tile kt - 1 + kStages.
      if (t.kTiles || kTiles > kStages) {
        Value next = e.add(kt, e.index(kStages - 1));
        Value refill = arith::AndIOp::create(
            b, loc, e.cmp(arith::CmpIPredicate::sge, kt, e.index(1)),
            e.cmp(arith::CmpIPredicate::slt, next, kTilesV));
        e.ifThen(refill, [&] {
          Value gNext = e.add(g, e.index(kStages - 1));
          acquire(gNext);
          load(p, gNext, next, t);
        });
      }
    });
    // The accumulators are complete once every MMA of the task is.
    commit(accBarrier);
  });

  // The warpgroup: wait for the accumulators, then each warp reads its TMEM
  // lanes (tcgen05.ld.sync.aligned.32x32b.x32.b32) into the shared-memory
  // tiles; Layout F puts tile row 16w + i in lane 32w + i, i < 16.
  Value accParity =
      e.cmp(arith::CmpIPredicate::ne, e.rem(tasksDone, e.index(2)), e.index(0));
  waitMmaBarrier(accBarrier, accParity);
  fence(NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
  Value warp = e.div(tid, e.index(32)), lane = e.rem(tid, e.index(32));
  Value row = e.add(e.mul(warp, e.index(16)), lane);
  Value holdsRow = e.cmp(arith::CmpIPredicate::slt, lane, e.index(16));
  // A task without k-tiles (an idle expert's weight gradient) issued no
  // MMA: its results are zeros, not what Tensor Memory holds.
  Value anyKTile = t.kTiles
                       ? e.cmp(arith::CmpIPredicate::sgt, t.kTiles, e.index(0))
                       : Value();
  // The warp's lane quarter: lane field (bits 16-31) = 32 * warp.
  Value laneBase = arith::ShLIOp::create(
      b, loc,
      arith::IndexCastOp::create(b, loc, b.getI32Type(),
                                 e.mul(warp, e.index(32))),
      i32(16));
  Type f32 = b.getF32Type(), i32Type = b.getI32Type();
  auto ldType = VectorType::get({kLdColumns}, i32Type);
  auto f32Vector = VectorType::get({kLdColumns}, f32);
  MemRefType accTile = smemType(ctx, {kTileM, kTileN}, f32);
  auto ldShape = NVVM::Tcgen05LdStShapeAttr::get(
      ctx, NVVM::Tcgen05LdStShape::SHAPE_32X32B);
  SmallVector<Value> tiles;
  for (int64_t j = 0; j < numAcc; ++j) {
    tiles.push_back(view(e.add(pad, e.index(j * kAccBytes)), accTile));
    Value tile = tiles.back();
    Value accBase = arith::AddIOp::create(
        b, loc, arith::AddIOp::create(b, loc, tmem, laneBase), i32(j * kTileN));
    e.loop(kTileN / kLdColumns, [&](Value chunk) {
      Value column = e.mul(chunk, e.index(kLdColumns));
      Value address = arith::AddIOp::create(
          b, loc, accBase, arith::IndexCastOp::create(b, loc, i32Type, column));
      Value bits = NVVM::Tcgen05LdOp::create(b, loc, ldType, UnitAttr(),
                                             ldShape, tmemPointer(address),
                                             /*offset=*/Value());
      // tcgen05.wait::ld.sync.aligned: the registers are valid after it.
      NVVM::Tcgen05WaitOp::create(
          b, loc,
          NVVM::Tcgen05WaitKindAttr::get(ctx, NVVM::Tcgen05WaitKind::LOAD));
      Value values = LLVM::BitcastOp::create(b, loc, f32Vector, bits);
      e.ifThen(holdsRow, [&] {
        for (int64_t i = 0; i < kLdColumns; ++i) {
          Value v = LLVM::ExtractElementOp::create(
              b, loc, values, arith::ConstantIntOp::create(b, loc, i, 32));
          if (anyKTile)
            v = e.select(anyKTile, v, e.f32(0.0f));
          e.store(v, tile, {row, e.add(column, e.index(i))});
        }
      });
    });
  }
  // The loads are done before the barrier after which thread 0 may start
  // the next task's MMAs (and before the final deallocation).
  fence(NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
  syncWarpgroup();
  carried[0] = e.add(tasksDone, e.index(1));
  return tiles;
}

std::unique_ptr<GemmEmitter>
createGemmEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
                  ArrayRef<std::pair<int64_t, int64_t>> prefetch) {
  return std::make_unique<Tcgen05Emitter>(e, module, tensorMaps, prefetch);
}

} // namespace mok::conversion::sm100
