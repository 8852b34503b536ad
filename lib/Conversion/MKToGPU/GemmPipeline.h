// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The tensor-core lowering of mk.gemm, everything above the MMA/accumulator
// layer: tiles and tasks, the TMA tensor maps, the shared-memory stage ring
// filled by TMA and completed by mbarriers, and the shared-memory epilogue.
// The MMA layer under it is per chip: wgmma on sm_90a (Hopper.h), tcgen05
// with accumulators in Tensor Memory on sm_100a (Blackwell.h). Private to
// MKToGPU; kept out of MKToGPU.cpp so that only these translation units pay
// for the NVGPU and NVVM headers.
//
#ifndef MOK_LIB_CONVERSION_MKTOGPU_GEMMPIPELINE_H
#define MOK_LIB_CONVERSION_MKTOGPU_GEMMPIPELINE_H

#include "mok/Conversion/Common/ScalarEmitter.h"
#include "mok/Dialect/MK/IR/MKSchedule.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace mok::conversion::gemm {

// The schedule (tile, stages, threads) is the one convert-moe-to-mk plans
// with (mok/Dialect/MK/IR/MKSchedule.h); convert-mk-to-gpu refuses others.
namespace schedule = mok::mk::schedule;
constexpr unsigned kThreads = schedule::kWarpgroup;

/// The shared-memory stage ring: per stage [A tileM x 64 | B_0 tileN x 64 |
/// B_1 tileN x 64] bf16 (at most 48 KiB, kStageBytes), each part
/// 1024-aligned (the 128-byte swizzle atom). kBytesA is one warpgroup's
/// 64 rows of A.
constexpr int64_t kBf16 = 2, kF32 = 4;
constexpr int64_t kBytesA =
    schedule::kTileM * schedule::kTileK * kBf16; // 8 KiB
constexpr int64_t kBytesB =
    schedule::kTileN * schedule::kTileK * kBf16; // 16 KiB
constexpr int64_t kAccBytes =
    schedule::kTileM * schedule::kTileN * kF32; // one accumulator tile
constexpr int64_t kAlign = 1024;                // 128B-swizzle atom
/// One MMA k-step (16 bf16) along a 128-byte swizzled row, in bytes.
constexpr int64_t kK16Bytes = 16 * kBf16;

/// Dynamic shared memory the GEMM phases use, in bytes (stage buffers, reused
/// by the epilogue, plus slack to align them to 1024 bytes; on sm_90a then
/// the register epilogue's staging, kEpilogueStagingBytes).
int64_t dynamicSharedMemoryBytes(bool sm90);

/// The dialects the GEMM phases (of either chip) create ops of.
void insertDialects(mlir::DialectRegistry &registry);

/// A memref in shared memory (workgroup address space).
mlir::MemRefType smemType(mlir::MLIRContext *ctx, mlir::ArrayRef<int64_t> shape,
                          mlir::Type elt);

/// One tensor-core mk.gemm: for each task (m-tile, n-tile),
///   acc_j[r, c] = sum_k A[m0 + r, k] * B_j[n0 + c, k]
/// over k in [0, k), in fp32, for B_0 and, when given, B_1; then
/// `store(row, col, acc_0, acc_1)` for every row < rows, col < n. Operands
/// are read through the CUtensorMap slots of the `tensor_maps` buffer: A at
/// slot `a`; B_j at slot `b_j`, or, grouped, at `b_j + expertOf(m0)` (one
/// slot per expert, each viewing that expert's [N, K] matrix).
struct GemmPhase {
  int64_t a;                 // slot of A ([*, k], rows >= `rows`)
  int64_t b0;                // (first) slot of B_0
  std::optional<int64_t> b1; // (first) slot of B_1
  int64_t k;                 // a multiple of the k-tile (tileK())
  int64_t n;                 // output columns; n-tiles of tileN
  mlir::Value rows;          // A rows to compute (index)
  /// Grouped GEMMs: the expert of the m-tile at A row m0 (uniform in the
  /// tile), index; null otherwise.
  mlir::function_ref<mlir::Value(mlir::Value m0)> expertOf;
  /// Stores one result element (acc_1 is null without B_1).
  mlir::function_ref<void(mlir::Value row, mlir::Value col, mlir::Value acc0,
                          mlir::Value acc1)>
      store;
  /// Stores the result elements (row, col) and (row, col + 1), col even:
  /// acc0 and acc1 hold their two values each (acc1 empty without B_1).
  /// The register epilogue uses it when given (then n is even); with a
  /// producer it must be given.
  mlir::function_ref<void(mlir::Value row, mlir::Value col,
                          mlir::ArrayRef<mlir::Value> acc0,
                          mlir::ArrayRef<mlir::Value> acc1)>
      storePair;
  /// Output columns of a tile: kTileN, or 2 * kTileN with one B operand
  /// (the same stage bytes; sm_90a only).
  int64_t tileN = schedule::kTileN;
  /// Rows of a tile: kTileM (one warpgroup computes it), or 2 * kTileM (two
  /// consumer warpgroups, one half each, sharing the B boxes; sm_90a only).
  int64_t tileM = schedule::kTileM;
  /// Bytes of one B box / of the A box in a stage.
  int64_t bytesB() const { return tileN * schedule::kTileK * kBf16; }
  int64_t bytesA() const { return tileM * schedule::kTileK * kBf16; }
  /// Gathered A: row r of A is row gatherRows[r] / gatherTopK of the bf16
  /// matrix [*, k] at global address gatherSource (i64); a negative entry
  /// (a padding row) is a row of zeros. The consumer threads (with a
  /// producer, the producer warpgroup's) copy the rows with cp.async, 16
  /// bytes at a time, into the 128-byte-swizzled A box (the swizzle done by
  /// hand), so rows must be 16-byte aligned: the map at slot `a` (one-row
  /// boxes), never read on the device, is there for the runtime to check that
  /// when it encodes it. Null otherwise.
  mlir::Value gatherRows;
  mlir::Value gatherSource;
  int64_t gatherTopK = 0;
  /// Grouped: row r is a padding row (results unspecified) when
  /// paddingRows[r] < 0 (i64); padding ends each segment, so a 64-row half
  /// of a tile is all padding when its first row is. The sm_90a MMA layer
  /// skips such a half's MMAs and stores (one B operand, two consumers,
  /// register epilogue after an early prefetch). Null: every row is
  /// computed.
  mlir::Value paddingRows;
  /// Optionally, storePair's form for outputs whose pairs are aligned
  /// (8-byte f32 pairs): the register epilogue stores through it when
  /// `pairsAligned` (i1, uniform) holds, else through storePair, one test
  /// a tile (a test a pair made ptxas spill the accumulators there).
  mlir::function_ref<void(mlir::Value row, mlir::Value col,
                          mlir::ArrayRef<mlir::Value> acc0,
                          mlir::ArrayRef<mlir::Value> acc1)>
      storePairAligned;
  mlir::Value pairsAligned;
  /// The register epilogue's rounding: the results of columns (col, col +
  /// 1) as storePair would store them, two bf16 packed in an i32 (col's in
  /// the low half). With it, n % 8 == 0 and `outAligned16`, the sm_90a
  /// register epilogue stages each warp's results in shared memory and
  /// stores whole 16-byte row pieces (st.global.cs.v4) to the bf16 [*, n]
  /// output at global address `outAddress` (i64); else storePair.
  mlir::function_ref<mlir::Value(mlir::ArrayRef<mlir::Value> acc0,
                                 mlir::ArrayRef<mlir::Value> acc1)>
      packPair;
  mlir::Value outAddress;
  mlir::Value outAligned16; // i1, uniform (and every alsoStaged output's)
  /// More bf16 [*, n] outputs the staged epilogue stores after the first,
  /// each from its own packing of the pairs (the swiglu epilogue's saves:
  /// gate and up). storePair stores them too when the staging is not used.
  struct StagedOutput {
    mlir::function_ref<mlir::Value(mlir::ArrayRef<mlir::Value> acc0,
                                   mlir::ArrayRef<mlir::Value> acc1)>
        pack;
    mlir::Value address;
  };
  mlir::SmallVector<StagedOutput, 2> alsoStaged;
  /// Whether the kernel's next step is a grid barrier (else, with warp
  /// roles that move registers, a CTA barrier ends the GEMM).
  bool gridBarrierFollows = false;
  /// N-major B (the backward's dgrads, mk.gemm's transpose_b): B_j's slots
  /// view [K, N] matrices; a k-tile of B is tileN / 64 boxes of 64 (N) x 64
  /// (K), 8 KiB apart, read by wgmma with imm-trans-b = 1 (the H200-probed
  /// form: leading-dimension offset 8192 between the 64-column blocks,
  /// +2048 bytes a k16 step). sm_90a, one B operand (or concat).
  bool transposeB = false;
  /// One accumulator over two K-loops (mk.gemm's concat): k-tiles
  /// [0, kSplit) read A at slot `a` and B at `b0`, k-tiles [kSplit,
  /// k / 64) read A at slot `*a2` and B at `*b2` (k counts both).
  std::optional<int64_t> a2, b2;
  int64_t kSplit = 0;
  /// M-major A (the weight gradients, mk.gemm's transpose_a): A's slot
  /// views a [K, M] matrix; a k-tile of A is tileM / 64 boxes of 64 (M) x
  /// 64 (K), 8 KiB apart (one a warpgroup), read with imm-trans-a = 1
  /// (the H200-probed form). With transposeB.
  bool transposeA = false;
  /// K in groups (mk.gemm's k_groups): output rows [g * groupRows, (g + 1)
  /// * groupRows) (rows = groups * groupRows, a multiple of tileM) sum over
  /// K rows [kOffsets[g], kOffsets[g + 1]) (i64, multiples of 64) of A and
  /// B, each task its group's k-tiles (none: zeros). `k` is unused.
  mlir::Value kOffsets;
  /// With kOffsets, optionally: group g's rows from kOffsets[g] +
  /// kCounts[g] on are zero padding; its k-tiles stop after the one that
  /// holds the last counted row.
  mlir::Value kCounts;
  /// Without kOffsets, optionally (a kernel for any T; then k = 0): K is
  /// `kRows` rows (index) of A and B, read in whole k-tiles, the rows past
  /// it as zeros (their maps end there).
  mlir::Value kRows;
  int64_t groupRows = 0;
  /// FP8 (sm_90a): A and the B operands are E4M3 (their maps of bytes,
  /// boxes of 128-element rows: a stage holds the same bytes as for bf16),
  /// each k-tile of 128 one block of their f32 scales: `aScales` [K/128, S]
  /// (A row r's at [kt, r]) and one `bScales` a B operand, [E, N/128,
  /// K/128] grouped (the task's expert) or [N/128, K/128]; with K in groups
  /// B's are [K/128, S] too (a scale a column); concat's second K-loop
  /// reads `a2Scales` and bScales[1]. The MMA layer adds each k-tile's
  /// partial sums to the accumulators times the row's and the column's
  /// scales. K-major, no gather.
  bool fp8 = false;
  /// MXFP8 (with fp8; sm_100a tcgen05): the scales are E8M0 atoms of
  /// tcgen05's scale-factor layout, 512 bytes per 128 rows (or columns) and
  /// k-tile: `aScales` [M'/128, K/128, 512], each B's [E, N/128, K/128,
  /// 512] grouped or [N/128, K/128, 512]; the MMA layer loads a k-tile's
  /// atoms with its stage (extraLoadBytes, loadExtra) and the tensor cores
  /// apply them (block-scaled MMA). Tiles of 128 rows, 128 columns an
  /// operand.
  bool mx = false;
  mlir::Value aScales, a2Scales;
  mlir::SmallVector<mlir::Value, 2> bScales;
  /// The K of a k-tile, in elements.
  int64_t tileK() const { return schedule::tileK(fp8); }
  /// n-tiles of the output.
  int64_t nTiles() const { return (n + tileN - 1) / tileN; }
  /// Warpgroups computing a tile (the CTA's first ones).
  int64_t consumers() const { return tileM / schedule::kTileM; }
};

/// Who does what in a kernel's GEMM phases (the same for all of them).
struct WarpRoles {
  /// Warpgroups computing a tile (tile rows / 64).
  int64_t consumers = 1;
  /// One thread of the warpgroup after the consumers issues every TMA load
  /// (per-stage empty barriers hand stages back); otherwise the first
  /// thread loads between its MMAs.
  bool producer = false;
  /// setmaxnreg for the phases: [consumer, producer] registers, and the
  /// even share the kernel is compiled for (restored after each phase).
  std::optional<std::pair<int64_t, int64_t>> registers;
  int64_t evenRegisters = 0;
  /// CTAs per cluster (sm_90a without a producer, register epilogues): 1,
  /// or 2: the CTAs of a pair take two tasks of a phase at once and, when
  /// both tasks read the same B boxes (one expert, one n-tile), each loads
  /// one half of them for both (TMA multicast); a per-stage "empty" barrier
  /// of each CTA counts both CTAs' releases.
  int64_t cluster = 1;
};

/// One task of a phase: its tile origin and its operands' tensor maps.
struct Task {
  mlir::Value m0, n0;
  /// Grouped: the m-tile's expert (index); null otherwise.
  mlir::Value expert;
  mlir::Value mapA, mapB0,
      mapB1;                // !nvgpu.tensormap.descriptor (mapB1 may be null)
  mlir::Value mapA2, mapB2; // concat's second pair (null without)
  /// K in groups: the task's k-tiles and first K row (index), and A's M
  /// coordinate (m0 within the group). Null otherwise (k / 64 k-tiles from
  /// row 0; A at m0).
  mlir::Value kTiles, kBase, aCol;
  /// Gathered A: per pass i (planGather), this thread's 16-byte
  /// chunk of its tile row: the source address at k-tile 0 (i64), the bytes
  /// to copy (i32: 16, or 0 for a padding row, which cp.async fills with
  /// zeros) and the destination's byte offset in the stage's A box (index).
  mlir::SmallVector<mlir::Value, 4> gatherSrc, gatherBytes, gatherDst;
  /// Clusters of 2: whether the pair's two tasks read the same B boxes
  /// (i1: each CTA then multicasts one half), and whether this task's
  /// results are stored (i1: false for the copy of its partner's task that
  /// a CTA runs when the phase has no task left for it, which keeps the
  /// pair's k-tile counts equal).
  mlir::Value multicast, live;
};

/// Gathered A: a tile row's k-tile is 128 bytes, 8 chunks of 16 bytes; the
/// copying threads (the consumers, 128 per 64 rows, or the producer
/// warpgroup) copy a tile in passes of threads / 8 rows.
constexpr int64_t kGatherChunkBytes = 16;
constexpr int64_t kGatherChunks = schedule::kTileK * kBf16 / kGatherChunkBytes;

/// Emits the GEMM phases of one kernel. Construction (through a chip's
/// factory, sm90::createGemmEmitter or sm100::createGemmEmitter) emits the
/// one-time setup at the builder's insertion point (mbarrier init, tensor
/// map pointers, and what the MMA layer needs): do it at the start of the
/// kernel body, in uniform control flow. The kernel must run with kBlock
/// threads per CTA.
///
/// This class is the part shared by the chips: the persistent task loop,
/// the TMA loads into the stage ring, the full barriers (one per stage,
/// arrival count 1 + expect_tx) and the shared-memory epilogue. A subclass
/// provides the MMA/accumulator layer (`accumulate`).
class GemmEmitter {
public:
  virtual ~GemmEmitter();

  /// Emits a persistent loop over the phase's tasks, round-robin over the
  /// CTAs of the grid, run by the CTA's first p.consumers() warpgroups, at
  /// the builder's insertion point (uniform control flow, every thread of
  /// the CTA). They synchronize on their own named barrier, so the other
  /// threads go on (to the grid barrier that ends the phase). Every
  /// tensor-core GEMM of a kernel must have the same consumers (the threads
  /// that count k-tiles; convert-mk-to-gpu checks it).
  void emit(const GemmPhase &phase);

  /// Emits what must follow the last GEMM phase, right after a CTA-wide
  /// barrier, in uniform control flow (sm_100a: the Tensor Memory
  /// deallocation; sm_90a with clusters: a cluster barrier).
  virtual void finish() {}

protected:
  /// `prefetch`: (slot, box rows) of the maps to prefetch once.
  GemmEmitter(Emitter &e, mlir::gpu::GPUModuleOp module, mlir::Value tensorMaps,
              mlir::ArrayRef<std::pair<int64_t, int64_t>> prefetch,
              const WarpRoles &roles, bool sm90);

  Emitter &e;
  WarpRoles roles;
  mlir::Value
      emptyBarriers;    // with a producer: one per stage, consumer warps arrive
  mlir::Value mapsBase; // address of the tensor map slots (i64)
  mlir::Value smem;     // the dynamic shared memory, i8
  mlir::Value smemBase; // its shared-window address (index)
  mlir::Value pad;      // bytes from smemBase to the 1024-aligned ring
  /// sm_90a: byte offset (from smem) of the register epilogue's staging
  /// (kEpilogueWarpBytes per consumer warp), after the ring.
  mlir::Value staging;
  mlir::Value barriers; // the full barriers, one per stage
  /// With a producer: one per stage, on which the producer warpgroup's
  /// threads' copies of a gathered A complete (cp.async.mbarrier.arrive
  /// .noinc, arrival count kThreads).
  mlir::Value gatherBarriers;
  mlir::Value tid, isThread0;
  /// Clusters of 2: the shared-window address (index) of the per-stage
  /// empty barriers (i64 each; arrival count 2), this CTA's rank in the
  /// cluster (index) and the partner's (i32).
  mlir::Value clusterEmpty, rank, peer;
  mlir::Value iteration; // k-tiles this CTA has consumed so far
  /// The consumers' `iteration` at the start of the phase being emitted
  /// (its first k-tile's number, if it has any).
  mlir::Value phaseStart;
  /// Values of the MMA layer carried across tasks and phases along with
  /// `iteration` (yielded by the task loops and the warpgroup's scf.if).
  mlir::SmallVector<mlir::Value> carried;

  /// The tensor map in slot `slot` (index), typed for boxes of `boxRows`.
  mlir::Value mapAt(mlir::Value slot, int64_t boxRows, bool fp8 = false);
  /// Thread 0: k-tile `kTile` of the task into the stage of k-tile number
  /// `g` (arrive.expect_tx on its full barrier, then the TMA loads). With
  /// clusters of 2 it first waits until both CTAs released the stage's
  /// previous k-tile, and loads the B boxes as two 128-row halves: with
  /// t.multicast, half `rank` only, into both CTAs.
  void load(const GemmPhase &p, mlir::Value g, mlir::Value kTile,
            const Task &t);
  /// Gathered A: plans this thread's chunks of task `t`'s rows (t.gatherSrc,
  /// gatherBytes, gatherDst), one pass per threads / 8 rows, for the
  /// `threads` threads that copy them, `index` (index) its rank among them.
  void planGather(const GemmPhase &p, Task &t, mlir::Value index,
                  int64_t threads);
  /// Gathered A: every copying thread starts copying its chunks of k-tile
  /// `kTile` into the stage of k-tile number `g` (cp.async, not yet
  /// committed). The loading thread's `load` of the same k-tile expects
  /// B's bytes only; the consumers' copies are waited for with
  /// `gatheredRowsLanded`, the producer warpgroup's complete on the stage's
  /// full barrier (producerTasks).
  void loadGatheredRows(const GemmPhase &p, mlir::Value g, mlir::Value kTile,
                        const Task &t);
  /// Gathered A: this thread's copies are complete but for its `pending`
  /// most recent cp.async groups, and visible to the async proxy (wgmma):
  /// a consumer barrier after it makes every thread's rows ready.
  void gatheredRowsLanded(int64_t pending);
  /// fence.proxy.async.shared::cta: this thread's view of shared memory
  /// (generic-proxy writes it made or observed) ordered before its later
  /// async-proxy accesses (wgmma, TMA).
  void fenceAsyncShared();
  /// An LLVM pointer (shared address space) to shared-window address
  /// `address` (index; smemBase plus a byte offset).
  mlir::Value sharedPointer(mlir::Value address);
  /// bar.sync on named barrier 1 for the first `warpgroups` warpgroups.
  void syncWarpgroup(int64_t warpgroups = 1);
  /// While set, the consumer warpgroups run separate k-loops (a warpgroup
  /// of padding rows skips its MMAs) and syncWarpgroup emits the barrier
  /// without .aligned.
  bool splitWarpgroups = false;
  /// A view of the dynamic shared memory at `byteOffset` (from smem).
  mlir::Value view(mlir::Value byteOffset, mlir::MemRefType type);
  /// The byte offset of the stage of k-tile number `g` (from smem).
  mlir::Value stageOffset(mlir::Value g);
  /// The parity of the phase of the stage barrier that k-tile number `g`
  /// completes (each stage barrier completes once per kStages k-tiles).
  mlir::Value phaseParity(mlir::Value g);

  /// Clusters of 2, thread 0: this CTA is done with the stage of k-tile
  /// number `g` (every consumer warp's MMAs reading it are complete): an
  /// arrival on this CTA's and on the partner's empty barrier of the stage.
  /// Every k-tile is released once, in order.
  void clusterRelease(mlir::Value g);
  /// Clusters: every thread of both CTAs of the pair meets (a CTA-wide
  /// barrier too).
  void clusterBarrier();
  /// The k-tiles of a task (of `kTiles`) thread 0 loads in its prologue:
  /// kStages, or with clusters kStages - 1 (the last stage then holds the
  /// previous task's last k-tile, which the partner may still be reading;
  /// the MMA layer loads that one a k-tile into the task).
  int64_t prologueLoads(int64_t kTiles) const;

  /// With a producer: lane 0 of each consumer warp hands the stage of
  /// k-tile number `g` back (its MMAs reading it are complete). Each task
  /// releases each of its k-tiles once, in order: bf16 k-tile g - 1 after
  /// issuing k-tile g and the last after the task's final wait; FP8 each
  /// k-tile right after its own wait (the promotion reads registers only).
  void release(mlir::Value g);

  /// Whether the MMA layer calls `onStagesFree` (when set) once a task's
  /// MMAs are complete, all consumers past them, and then stores the
  /// epilogue from registers (with p.storePair), leaving the stages alone.
  virtual bool prefetchesEarly() const { return false; }
  /// Set by the task loop around `accumulate` (empty otherwise): starts the
  /// next task's loads into the free stages.
  std::function<void()> onStagesFree;

  /// Bytes the MMA layer loads with each k-tile besides the operand boxes
  /// (completing on the stage's full barrier: `loadExtra`).
  virtual int64_t extraLoadBytes(const GemmPhase &p) const { return 0; }
  /// Thread 0, in `load` after the stage's arrive.expect_tx: the MMA
  /// layer's own copies for k-tile `kTile` of task `t` (k-tile number `g`).
  virtual void loadExtra(const GemmPhase &p, mlir::Value g, mlir::Value kTile,
                         const Task &t) {}

  /// Thread 0, before it loads k-tile number `g` into its stage: wait until
  /// the stage is free. The default does nothing (the MMA layer leaves every
  /// stage it consumed free).
  virtual void acquire(mlir::Value g) {}

  /// The MMA/accumulator layer: run by the consumer warpgroups for task `t`,
  /// whose k-tiles are numbered from `it` and whose first
  /// min(kStages, k-tiles) k-tiles thread 0 (and, gathered, every consumer
  /// thread: `loadGatheredRows`) has already started loading; with a
  /// gathered A, k-tile 0's rows have landed. It must consume every k-tile
  /// (loading the rest), and either leave the fp32 accumulators of B_0
  /// (and B_1) in shared-memory tiles [tileM][tileN] at byte pad + j *
  /// tileM * tileN * 4, returned, with the consumers synchronized (the
  /// shared epilogue follows), or store every element itself (`p.store` or
  /// `p.storePair`; then call `onStagesFree` first when it is set) and
  /// return nothing. It may update `carried`.
  virtual mlir::SmallVector<mlir::Value>
  accumulate(const GemmPhase &p, mlir::Value it, const Task &t) = 0;
  /// The consumers, after the phase's task loop (`iteration` past its
  /// k-tiles): what the MMA layer still owes the pipeline (with a
  /// producer, releases). The default does nothing.
  virtual void phaseDone(const GemmPhase &p) {}

private:
  void tasks(const GemmPhase &p);
  /// With a producer: the producer thread's loop over the same tasks,
  /// loading every k-tile once its stage is free; with a gathered A the
  /// whole producer warpgroup runs it and copies the rows.
  void producerTasks(const GemmPhase &p);
  void emitWarpSpecialized(const GemmPhase &p);
  /// The phase's m-tiles (index) and tasks (m-tiles x n-tiles).
  mlir::Value mTiles(const GemmPhase &p);
  mlir::Value taskCount(const GemmPhase &p);
  /// Task number `task` of the phase (the grouped raster).
  Task taskAt(const GemmPhase &p, mlir::Value task);
  /// The tile origin (m0, n0) of task number `task`.
  std::pair<mlir::Value, mlir::Value> tileOf(const GemmPhase &p,
                                             mlir::Value task);
  /// The task a CTA runs in the round of the task loop at `first` (its
  /// induction variable; `tasks` the phase's taskCount): task `first`
  /// itself, or with clusters of 2 the pair's task first + rank (or, past
  /// the last task, a copy of task `first` that stores nothing), with
  /// `multicast` set.
  Task taskOfRound(const GemmPhase &p, mlir::Value first, mlir::Value tasks);
  /// The empty barrier of stage `stage` (index), a shared pointer.
  mlir::Value emptyBarrier(mlir::Value stage);
  mlir::Value i32(int64_t v);
  /// setmaxnreg (increase or decrease) to `count` registers.
  void setRegisters(int64_t count, bool increase);
};

} // namespace mok::conversion::gemm

#endif // MOK_LIB_CONVERSION_MKTOGPU_GEMMPIPELINE_H
