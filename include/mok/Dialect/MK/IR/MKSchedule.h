// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The megakernel schedules the mk lowering implements: the constants the
// planner (convert-moe-to-mk) plans with and the lowering (convert-mk-to-gpu)
// builds, and the target-support query that says whether a chip's lowering
// implements a GEMM of a given form with a given #mk.gemm_schedule. The
// planner asks the query for every GEMM it plans; the lowering checks every
// GEMM it lowers with the same query, so the two cannot disagree.
//
#ifndef MOK_DIALECT_MK_IR_MKSCHEDULE_H
#define MOK_DIALECT_MK_IR_MKSCHEDULE_H

#include "mok/Dialect/MK/IR/MKOps.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mok::mk {

/// The tensor-core GEMM schedule: output tiles of kTileM rows (tokens /
/// routed rows) by kTileN columns, reduced in k-tiles of kTileK (64 bf16 =
/// one 128-byte swizzle row) through a ring of kStages shared-memory stages,
/// computed by one warpgroup (kWarpgroup threads, the CTA's first) of a
/// kBlock-thread CTA (the others take part in the SIMT phases; with warp
/// roles the CTA has producerBlock(tileM) threads); sm_90a also has
/// 2 * kTileM-row tiles (both warpgroups) and, with one B operand,
/// 2 * kTileN-column tiles.
namespace schedule {
constexpr int64_t kTileM = 64, kTileN = 128, kTileK = 64;
/// FP8 (E4M3) operands: a k-tile of 128 elements, the same 128-byte
/// swizzle row, so the stage ring is the bf16 one byte for byte; it is
/// also the FP8 scales' block, so a k-tile has one scale a row.
constexpr int64_t kTileKFp8 = 128;
/// The K of a k-tile for operands of that kind.
constexpr int64_t tileK(bool fp8) { return fp8 ? kTileKFp8 : kTileK; }
constexpr int64_t kStages = 4;
/// Task order: groups of kGroupM m-tiles, n-tiles outer within a group.
constexpr int64_t kGroupM = 16;
constexpr unsigned kWarpgroup = 128;
/// (On an H200, the SIMT phases of the Qwen3-30B-A3B layer took 9.7 ms with
/// 128 threads per CTA and 6.9 ms with 256.)
constexpr unsigned kBlock = 256;
/// On sm_90a a tile may also have 2 * kTileM rows: two consumer warpgroups,
/// one 64-row half each, sharing every B box of a stage.
constexpr int64_t kMaxConsumers = 2;
/// Dynamic shared memory of a kernel with tensor-core GEMMs, in bytes: the
/// stage ring (room for [A 128x64 | B_0 128x64 | B_1 128x64] bf16 a stage,
/// or [A 128x64 | B 256x64]) plus 1 KiB to align it to the 128-byte-swizzle
/// atom.
constexpr int64_t kStageBytes =
    (kMaxConsumers * kTileM + 2 * kTileN) * kTileK * 2;
constexpr int64_t kDynamicSharedMemory = kStages * kStageBytes + 1024;
/// sm_90a register epilogues: after the ring, each consumer warp stages 16
/// rows x 64 bf16 columns (2 KiB) of its results at a time, so that the
/// stores to global memory are whole 16-byte row pieces.
constexpr int64_t kEpilogueWarpBytes = 16 * 64 * 2;
constexpr int64_t kEpilogueStagingBytes =
    kMaxConsumers * (kWarpgroup / 32) * kEpilogueWarpBytes;
/// The dynamic shared memory of a kernel with tensor-core GEMMs for a chip.
constexpr int64_t dynamicSharedMemory(bool sm90) {
  return kDynamicSharedMemory + (sm90 ? kEpilogueStagingBytes : 0);
}

/// sm_90a warp roles: the consumer warpgroups (one per 64 tile rows) and,
/// after them, one producer warpgroup whose first thread issues the TMA
/// loads. A CTA of `tileM` rows has producerBlock(tileM) threads.
constexpr unsigned producerBlock(int64_t tileM) {
  return static_cast<unsigned>((tileM / kTileM + 1) * kWarpgroup);
}
/// The register file of an SM (32-bit registers); one CTA per SM.
constexpr int64_t kRegisterFile = 65536;
/// The even share of a thread of an n-thread CTA (a multiple of 8, as
/// setmaxnreg counts; at most 248).
constexpr int64_t evenRegisters(unsigned threads) {
  int64_t r = kRegisterFile / threads / 8 * 8;
  return r > 248 ? 248 : r;
}
/// With two consumer warpgroups (384 threads, 168 registers each), the
/// GEMM phases move registers to the consumers (setmaxnreg): their
/// accumulators take 128 of them (two 64 x 128 fp32 fragments, or one
/// 64 x 256); the producer needs few (with 40, ptxas spilled its task
/// raster and map addressing). 2 * 224 + 56 = 3 * 168.
constexpr int64_t kConsumerRegisters = 224, kProducerRegisters = 56;
/// The setmaxnreg split (consumers, producer) of a CTA with warp roles and
/// `tileM` rows: kConsumerRegisters / kProducerRegisters with two
/// consumer warpgroups, none (empty) with one.
inline llvm::SmallVector<int64_t, 2> producerRegisters(int64_t tileM) {
  if (tileM == kMaxConsumers * kTileM)
    return {kConsumerRegisters, kProducerRegisters};
  return {};
}
} // namespace schedule

/// What an mk.gemm computes, as far as the lowering tells GEMMs apart: the
/// part of its form that decides whether a schedule implements it.
struct GemmForm {
  Epilogue epilogue = Epilogue::store;
  unsigned bOperands = 1;
  bool grouped = false;
  bool transposeA = false, transposeB = false;
  /// concat(%a2): one accumulator over two K-loops.
  bool concat = false;
  /// k_groups: out is [E, M, N], one product per K group.
  bool kGroups = false;
  /// An f32 out (the accumulators unrounded; accumulate adds into it).
  bool f32Out = false;
  /// saves(%gate, %up): the swiglu epilogue also stores its inputs.
  bool saves = false;
  /// gather(%rows): A's rows gathered from the layer's x.
  bool gathered = false;
  /// FP8 E4M3 operands with block scales; `mx`: E8M0 scales (MXFP8).
  bool fp8 = false, mx = false;
  /// Output columns (N), and with k_groups out's M.
  int64_t columns = 0, groupRows = 0;

  static GemmForm of(GemmOp op);
};

/// What convert-mk-to-gpu implements on one chip: the target-support query.
class TargetSupport {
public:
  /// The support of `chip` ("sm_90a" or "sm_100a"); none for other chips.
  static std::optional<TargetSupport> forChip(llvm::StringRef chip);

  llvm::StringRef chip() const { return sm90 ? "sm_90a" : "sm_100a"; }
  /// The chip's tensor-core engine: wgmma on sm_90a, tcgen05 on sm_100a.
  Engine tensorCoreEngine() const {
    return sm90 ? Engine::wgmma : Engine::tcgen05;
  }
  /// Why this chip's lowering does not implement a GEMM of `form` with
  /// `schedule`, as a diagnostic's text; empty when it does. Covers what
  /// one GEMM decides; what must hold across a kernel's GEMMs (one engine,
  /// tile height, warp roles, tensor-map buffer, the launch) is the
  /// lowering's kernel check.
  std::string whyNot(const GemmForm &form, GemmScheduleAttr schedule) const;
  /// Threads per CTA of a kernel whose tensor-core GEMMs have `schedule`.
  unsigned blockSize(GemmScheduleAttr schedule) const;
  /// Dynamic shared memory (bytes) of a kernel with tensor-core GEMMs.
  int64_t dynamicSharedMemory() const {
    return schedule::dynamicSharedMemory(sm90);
  }

private:
  explicit TargetSupport(bool sm90) : sm90(sm90) {}
  bool sm90;
};

} // namespace mok::mk

#endif // MOK_DIALECT_MK_IR_MKSCHEDULE_H
