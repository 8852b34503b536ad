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
static_assert(instrDescF16(128, 128) == 0x08200490u);
// M = 64 needs N % 8 == 0, 8 <= N <= 256 (cta_group::1, dense, kind::f16).
static_assert(kTileM == 64 && kTileN % 8 == 0 && kTileN <= 256);
static_assert(2 * kTileN <= kTmemColumns && kTmemColumns <= 512 &&
                  (kTmemColumns & (kTmemColumns - 1)) == 0,
              "tcgen05.alloc takes a power of two of at least 32 columns");
static_assert(kTileN % kLdColumns == 0);

/// The 32-bit instruction descriptor of tcgen05.mma .kind::mxf8f6f4
/// .block_scale (PTX ISA 9.7.16.4.2, the block-scaled kinds' format): A = B
/// = E4M3 (format 0 in bits 7-9 and 10-12), both K-major, N >> 3 in bits
/// 17-22, scale type UE8M0 (bit 23), M >> 4 in bits 24-28, and the scale
/// factors' byte within each 32-bit Tensor Memory word, for B in bits 4-5
/// and for A in bits 29-30: the k32 step `ks` of a k-tile reads byte ks
/// (the atom's 32-element block ks).
constexpr uint32_t instrDescMx(int64_t m, int64_t n, int64_t ks) {
  return (static_cast<uint32_t>(ks) << 4) |
         (static_cast<uint32_t>(n >> 3) << 17) | (1u << 23) |
         (static_cast<uint32_t>(m >> 4) << 24) |
         (static_cast<uint32_t>(ks) << 29);
}
static_assert(instrDescMx(128, 128, 0) == 0x08A00000u);
static_assert(instrDescMx(128, 128, 3) == 0x68A00030u);

/// MXFP8 tiles: M = 128 (block-scaled MMAs with cta_group::1 take no other
/// M; Layout D, row r in TMEM lane r), N = 128 an operand, k-tiles of 128
/// E4M3 (four k32 MMAs, one E8M0 scale a row and a column each).
constexpr int64_t kMxTileM = 128;
constexpr int64_t kMxStepK = 32;
/// A k-tile's scale atoms (A's, then each B's) in shared memory, 512 bytes
/// each, copied to Tensor Memory with tcgen05.cp.32x128b.warpx4: an atom
/// fills 4 columns (column c, lane l: rows 32 c + l's four bytes), the
/// same in each 32-lane sub-partition. The Tensor Memory columns of stage
/// s's atoms follow the two accumulators: kMxScaleColumn + 12 s + 4 i.
constexpr int64_t kAtomBytes = 512;
constexpr int64_t kMxAtoms = 3;
constexpr int64_t kMxScaleColumn = 2 * kTileN;
constexpr int32_t kMxTmemColumns = 512;
static_assert(kMxScaleColumn + kStages * kMxAtoms * 4 <= kMxTmemColumns);
constexpr const char *kMxAtomsSlot = "mok_mx_scale_atoms";

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
                 ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                 const WarpRoles &roles, bool mx);

  void finish() override;

private:
  /// kStages "empty" barriers (stage s at index s), then the accumulator
  /// barrier (index kStages); arrival count 1, arrived on by tcgen05.commit.
  Value mmaBarriers;
  Value tmem; // the Tensor Memory base address (i32: lane << 16 | column)
  Value isWarp0;
  /// MXFP8: the Tensor Memory columns allocated, and the shared-window
  /// address (index) of the scale atoms, kMxAtoms a stage.
  int32_t tmemColumns = kTmemColumns;
  Value mxAtoms;

  int64_t extraLoadBytes(const GemmPhase &p) const override {
    return p.mx ? kAtomBytes * (1 + (p.b1 ? 2 : 1)) : 0;
  }
  void loadExtra(const GemmPhase &p, Value g, Value kTile,
                 const Task &t) override;
  /// A 128-row tile (both consumer warpgroups): MXFP8's block-scaled MMAs,
  /// or bf16's kind::f16 ones at M = 128, K- or MN-major (an MXFP8
  /// kernel's shared expert, forward and backward), and the epilogue.
  SmallVector<Value> accumulateTall(const GemmPhase &p, Value it,
                                    const Task &t);
  /// The global address (i64) of a buffer's first byte.
  Value globalAddress(Value buffer);

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
           bool transposeA = false, bool transposeB = false,
           int64_t m = kTileM);
  /// Emits tcgen05.commit.cta_group::1.mbarrier::arrive::one on
  /// mmaBarriers[index]: it arrives once the MMAs this thread issued so far
  /// have completed.
  void commit(Value index);
  /// In thread 0's k-loop, after k-tile `kt` (global k-tile `g`) is
  /// committed: refills the previous k-tile's stage (its MMAs were queued
  /// one k-tile earlier) with k-tile kt - 1 + kStages, when the task has
  /// one. Nothing when the task's `kTiles` fit the stages.
  void refillBehind(const GemmPhase &p, Value g, Value kt, Value kTilesV,
                    int64_t kTiles, const Task &t);
};

} // namespace

Tcgen05Emitter::Tcgen05Emitter(Emitter &e, gpu::GPUModuleOp module,
                               Value tensorMaps,
                               ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                               const WarpRoles &roles, bool mx)
    : GemmEmitter(e, module, tensorMaps, prefetch, roles,
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
  // MXFP8: the scale atoms' stage ring (static shared memory, beside the
  // dynamic ring the operand boxes fill) and the Tensor Memory for their
  // copies.
  if (mx) {
    tmemColumns = kMxTmemColumns;
    MemRefType atomsType =
        smemType(ctx, {kStages * kMxAtoms * kAtomBytes}, b.getI8Type());
    if (!module.lookupSymbol(kMxAtomsSlot)) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(module.getBody());
      memref::GlobalOp::create(b, loc, kMxAtomsSlot,
                               b.getStringAttr("private"), atomsType,
                               Attribute(), /*constant=*/false,
                               b.getI64IntegerAttr(128));
    }
    mxAtoms = memref::ExtractAlignedPointerAsIndexOp::create(
        b, loc, memref::GetGlobalOp::create(b, loc, atomsType, kMxAtomsSlot));
  }
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
    Value columns = i32(tmemColumns);
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
    Value columns = i32(tmemColumns);
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
                         bool transposeA, bool transposeB, int64_t m) {
  OpBuilder &b = e.b;
  MLIRContext *ctx = b.getContext();
  Value dPointer = tmemPointer(d);
  Value idesc = i32(static_cast<int32_t>(
      instrDescF16(m, kTileN, transposeA, transposeB)));
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
void Tcgen05Emitter::refillBehind(const GemmPhase &p, Value g, Value kt,
                                  Value kTilesV, int64_t kTiles,
                                  const Task &t) {
  if (!t.kTiles && kTiles <= kStages)
    return;
  Value next = e.add(kt, e.index(kStages - 1));
  Value refill = arith::AndIOp::create(
      e.b, e.loc, e.cmp(arith::CmpIPredicate::sge, kt, e.index(1)),
      e.cmp(arith::CmpIPredicate::slt, next, kTilesV));
  e.ifThen(refill, [&] {
    Value gNext = e.add(g, e.index(kStages - 1));
    acquire(gNext);
    load(p, gNext, next, t);
  });
}

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
  if (p.tileM == kMxTileM)
    return accumulateTall(p, it, t);
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
      refillBehind(p, g, kt, kTilesV, kTiles, t);
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

Value Tcgen05Emitter::globalAddress(Value buffer) {
  return arith::IndexCastOp::create(
      e.b, e.loc, e.b.getI64Type(),
      memref::ExtractAlignedPointerAsIndexOp::create(e.b, e.loc, buffer));
}

/// Thread 0: k-tile kTile's scale atoms into the stage's atom slots, bulk
/// copies completing on the stage's full barrier: A's rows (m0, or with K
/// in groups aCol, .. + 127) and each B's columns n0 .. n0 + 127 (of the
/// task's expert), at the k-tile's atom column (kBase / 128 + kTile with K
/// in groups); concat's second K-loop reads a2's atoms and B_1's, into the
/// slots of a's and B_0's.
void Tcgen05Emitter::loadExtra(const GemmPhase &p, Value g, Value kTile,
                               const Task &t) {
  if (!p.mx)
    return;
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Value stage = e.rem(g, e.index(kStages));
  Value barrier = LLVM::IntToPtrOp::create(
      b, loc, LLVM::LLVMPointerType::get(ctx, /*shared=*/3),
      nvgpu::MBarrierGetOp::create(b, loc, b.getI32Type(), barriers, stage),
      LLVM::DereferenceableAttr());
  // An atom buffer's [..., row atoms, atom columns, 512] extents.
  auto extent = [](Value scales, int64_t fromEnd) {
    auto type = cast<MemRefType>(scales.getType());
    return type.getDimSize(type.getRank() - fromEnd);
  };
  Value second, kb = kTile;
  if (p.a2) {
    second = e.cmp(arith::CmpIPredicate::sge, kTile, e.index(p.kSplit));
    kb = e.select(second, e.sub(kTile, e.index(p.kSplit)), kTile);
  }
  if (t.kBase)
    kb = e.add(e.div(t.kBase, e.index(kTileKFp8)), kb);
  auto copyAtom = [&](int64_t slot, Value address, Value atom) {
    Value src = LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(ctx, /*global=*/1),
        arith::AddIOp::create(
            b, loc, address,
            arith::IndexCastOp::create(b, loc, b.getI64Type(),
                                       e.mul(atom, e.index(kAtomBytes)))),
        LLVM::DereferenceableAttr());
    Value dst = sharedPointer(
        e.add(mxAtoms, e.add(e.mul(stage, e.index(kMxAtoms * kAtomBytes)),
                             e.index(slot * kAtomBytes))));
    NVVM::CpAsyncBulkGlobalToSharedClusterOp::create(
        b, loc, dst, src, barrier, i32(kAtomBytes), /*multicastMask=*/Value(),
        /*l2CacheHint=*/Value());
  };
  // (concat: both K-loops' buffers have one shape.)
  auto pick = [&](Value first, Value other) {
    Value a = globalAddress(first);
    return second ? e.select(second, globalAddress(other), a) : a;
  };
  Value aRow = e.div(t.aCol ? t.aCol : t.m0, e.index(kMxTileM));
  copyAtom(0, pick(p.aScales, p.a2Scales),
           e.add(e.mul(aRow, e.index(extent(p.aScales, 2))), kb));
  auto bAtom = [&](Value scales) {
    Value row = e.div(t.n0, e.index(kTileN));
    if (t.expert)
      row = e.add(e.mul(t.expert, e.index(extent(scales, 3))), row);
    return e.add(e.mul(row, e.index(extent(scales, 2))), kb);
  };
  if (p.a2) {
    copyAtom(1, pick(p.bScales[0], p.bScales[1]), bAtom(p.bScales[0]));
    return;
  }
  for (auto [j, scales] : llvm::enumerate(p.bScales))
    copyAtom(1 + static_cast<int64_t>(j), globalAddress(scales),
             bAtom(scales));
}

SmallVector<Value> Tcgen05Emitter::accumulateTall(const GemmPhase &p,
                                                  Value it, const Task &t) {
  assert(p.tileM == kMxTileM && p.tileN == kTileN && !p.gatherRows &&
         (!p.fp8 || p.mx) && (!p.mx || (!p.transposeA && !p.transposeB)) &&
         "tcgen05, 128-row tiles: bf16 or K-major MXFP8 128 x 128 tiles only");
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  int64_t kTiles = p.k / p.tileK();
  int64_t numAcc = p.b1 ? 2 : 1;
  Value accBarrier = e.index(kStages);
  Value tasksDone = carried[0];
  Value kTilesV = t.kTiles ? t.kTiles : e.index(kTiles);
  auto cpShape = NVVM::Tcgen05CpShape::SHAPE_32x128b;

  e.ifThen(isThread0, [&] {
    e.loop(kTilesV, [&](Value kt) {
      Value g = e.add(it, kt);
      Value stage = e.rem(g, e.index(kStages));
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, barriers, phaseParity(g),
                                             e.index(10000000), stage);
      fence(NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
      // The stage's atoms into its Tensor Memory columns: the copies and
      // the MMAs after them, issued by this thread, run in order. (The
      // stage's previous MMAs, which read these columns, completed before
      // its refill: `acquire`.)
      Value atomBase =
          e.add(mxAtoms, e.mul(stage, e.index(kMxAtoms * kAtomBytes)));
      Value scaleColumn = arith::AddIOp::create(
          b, loc, tmem,
          arith::AddIOp::create(
              b, loc, i32(kMxScaleColumn),
              arith::MulIOp::create(
                  b, loc,
                  arith::IndexCastOp::create(b, loc, b.getI32Type(), stage),
                  i32(kMxAtoms * 4))));
      SmallVector<Value, 3> scaleAt;
      for (int64_t i = 0; p.mx && i < 1 + numAcc; ++i) {
        Value column =
            arith::AddIOp::create(b, loc, scaleColumn, i32(4 * i));
        scaleAt.push_back(tmemPointer(column));
        // No swizzle: 16-byte rows 16 bytes apart, 8-row groups 128 bytes
        // apart (stride 128 >> 4); one 128-bit column, no leading offset.
        Value address = arith::IndexCastOp::create(
            b, loc, b.getI32Type(), e.add(atomBase, e.index(i * kAtomBytes)));
        Value desc = NVVM::Tcgen05MmaSmemDescOp::create(
            b, loc, b.getI64Type(),
            arith::ShRUIOp::create(b, loc, address, i32(4)), i32(0),
            i32(128 >> 4), arith::ConstantIntOp::create(b, loc, 0, 8),
            arith::ConstantIntOp::create(b, loc, 0, 1),
            arith::ConstantIntOp::create(b, loc, 0, 8));
        NVVM::Tcgen05CpOp::create(b, loc, cpShape, NVVM::CTAGroupKind::CTA_1,
                                  NVVM::Tcgen05CpMulticast::WARPX4,
                                  NVVM::Tcgen05CpSrcFormatAttr(),
                                  scaleAt.back(), desc);
      }
      Value base = stageOffset(g);
      Value notFirstKTile = e.cmp(arith::CmpIPredicate::ne, kt, e.index(0));
      Value yes = arith::ConstantIntOp::create(b, loc, 1, 1);
      // k32 steps (E4M3) or k16 steps (bf16): 32 bytes along the 128-byte
      // swizzled rows of a K-major operand, 16 of the 128-byte K rows of an
      // MN-major one (bf16's dgrad and wgrad forms: two 64-wide MN blocks,
      // the descriptor's leading offset apart, as at M = 64).
      int64_t stepA = p.transposeA ? kK16BytesMN : kK16Bytes;
      int64_t stepB = p.transposeB ? kK16BytesMN : kK16Bytes;
      for (int64_t ks = 0; ks < p.tileK() / (p.mx ? kMxStepK : 16); ++ks) {
        Value aDesc = smemDescriptor(e.add(base, e.index(ks * stepA)),
                                     p.transposeA);
        for (int64_t j = 0; j < numAcc; ++j) {
          Value bDesc = smemDescriptor(
              e.add(base,
                    e.index(p.bytesA() + j * p.bytesB() + ks * stepB)),
              p.transposeB);
          Value d = arith::AddIOp::create(b, loc, tmem, i32(j * kTileN));
          if (!p.mx) {
            mma(d, aDesc, bDesc, ks == 0 ? notFirstKTile : yes, p.transposeA,
                p.transposeB, kMxTileM);
            continue;
          }
          NVVM::Tcgen05MMABlockScaleOp::create(
              b, loc, NVVM::MMABlockScaleKind::MXF8F6F4,
              NVVM::CTAGroupKind::CTA_1, NVVM::Tcgen05MMABlockScale::BLOCK32,
              NVVM::Tcgen05MMACollectorOp::DISCARD, tmemPointer(d), aDesc,
              bDesc,
              i32(static_cast<int32_t>(instrDescMx(kMxTileM, kTileN, ks))),
              ks == 0 ? notFirstKTile : yes, scaleAt[0], scaleAt[1 + j]);
        }
      }
      commit(stage);
      refillBehind(p, g, kt, kTilesV, kTiles, t);
    });
    commit(accBarrier);
  });

  // Both warpgroups wait for the accumulators; Layout D puts tile row r in
  // TMEM lane r, which warp w reaches in its lane quarter w % 4 (rows 32 (w
  // % 4) + l): warpgroup c's 64 rows are its warps 2c and 2c + 1 of the
  // quarter numbering (warps 0, 1 and 6, 7 of the CTA), which read them
  // into the [128][128] shared-memory tiles of the shared epilogue.
  Value accParity =
      e.cmp(arith::CmpIPredicate::ne, e.rem(tasksDone, e.index(2)), e.index(0));
  waitMmaBarrier(accBarrier, accParity);
  fence(NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
  Value warp = e.div(tid, e.index(32)), lane = e.rem(tid, e.index(32));
  Value quarter = e.rem(warp, e.index(4));
  Value reads = e.cmp(arith::CmpIPredicate::eq, e.div(quarter, e.index(2)),
                      e.div(warp, e.index(4)));
  Value row = e.add(e.mul(quarter, e.index(32)), lane);
  Value laneBase = arith::ShLIOp::create(
      b, loc,
      arith::IndexCastOp::create(b, loc, b.getI32Type(),
                                 e.mul(quarter, e.index(32))),
      i32(16));
  Type f32 = b.getF32Type(), i32Type = b.getI32Type();
  auto ldType = VectorType::get({kLdColumns}, i32Type);
  auto f32Vector = VectorType::get({kLdColumns}, f32);
  MemRefType accTile = smemType(ctx, {kMxTileM, kTileN}, f32);
  // A task without k-tiles (an idle expert's weight gradient) issued no
  // MMA: its results are zeros, not what Tensor Memory holds.
  Value anyKTile = t.kTiles
                       ? e.cmp(arith::CmpIPredicate::sgt, t.kTiles, e.index(0))
                       : Value();
  auto ldShape = NVVM::Tcgen05LdStShapeAttr::get(
      ctx, NVVM::Tcgen05LdStShape::SHAPE_32X32B);
  SmallVector<Value> tiles;
  for (int64_t j = 0; j < numAcc; ++j)
    tiles.push_back(
        view(e.add(pad, e.index(j * kMxTileM * kTileN * 4)), accTile));
  e.ifThen(reads, [&] {
    for (int64_t j = 0; j < numAcc; ++j) {
      Value accBase = arith::AddIOp::create(
          b, loc, arith::AddIOp::create(b, loc, tmem, laneBase),
          i32(j * kTileN));
      e.loop(kTileN / kLdColumns, [&](Value chunk) {
        Value column = e.mul(chunk, e.index(kLdColumns));
        Value address = arith::AddIOp::create(
            b, loc, accBase,
            arith::IndexCastOp::create(b, loc, i32Type, column));
        Value bits = NVVM::Tcgen05LdOp::create(b, loc, ldType, UnitAttr(),
                                               ldShape, tmemPointer(address),
                                               /*offset=*/Value());
        NVVM::Tcgen05WaitOp::create(
            b, loc,
            NVVM::Tcgen05WaitKindAttr::get(ctx, NVVM::Tcgen05WaitKind::LOAD));
        Value values = LLVM::BitcastOp::create(b, loc, f32Vector, bits);
        for (int64_t i = 0; i < kLdColumns; ++i) {
          Value v = LLVM::ExtractElementOp::create(
              b, loc, values, arith::ConstantIntOp::create(b, loc, i, 32));
          if (anyKTile)
            v = e.select(anyKTile, v, e.f32(0.0f));
          e.store(v, tiles[j], {row, e.add(column, e.index(i))});
        }
      });
    }
  });
  fence(NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
  syncWarpgroup(p.consumers());
  carried[0] = e.add(tasksDone, e.index(1));
  return tiles;
}

std::unique_ptr<GemmEmitter>
createGemmEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
                  ArrayRef<std::pair<int64_t, int64_t>> prefetch,
                  const WarpRoles &roles, bool mx) {
  return std::make_unique<Tcgen05Emitter>(e, module, tensorMaps, prefetch,
                                          roles, mx);
}

} // namespace mok::conversion::sm100
