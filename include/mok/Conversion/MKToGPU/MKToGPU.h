// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_MKTOGPU_MKTOGPU_H
#define MOK_CONVERSION_MKTOGPU_MKTOGPU_H

#include "mlir/Pass/Pass.h"

#include <cstdint>

namespace mok {

#define GEN_PASS_DECL_CONVERTMKTOGPU
#include "mok/Conversion/Passes.h.inc"

/// The tensor-core GEMM schedule convert-mk-to-gpu implements, which
/// convert-moe-to-mk plans with: output tiles of kTileM rows (tokens /
/// routed rows) by kTileN columns, reduced in k-tiles of kTileK (64 bf16 =
/// one 128-byte swizzle row) through a ring of kStages shared-memory stages,
/// computed by one warpgroup (kWarpgroup threads, the CTA's first) of a
/// kBlock-thread CTA (the others take part in the SIMT phases; with warp
/// roles the CTA has producerBlock(tileM) threads); sm_90a also
/// has 2 * kTileM-row tiles (both warpgroups) and, with one B operand,
/// 2 * kTileN-column tiles.
namespace mk_schedule {
constexpr int64_t kTileM = 64, kTileN = 128, kTileK = 64;
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
} // namespace mk_schedule

} // namespace mok

#endif // MOK_CONVERSION_MKTOGPU_MKTOGPU_H
