// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// What every op family of convert-mk-to-gpu builds its grid-wide step
// from: the kernel's grid indices, grid-stride and warp-per-item loops,
// warp scans, 16-byte global accesses, and the kernel-wide choices of the
// SIMT steps' code shape. One GridBuilder a kernel, made by the driver
// (MKToGPU.cpp) at the kernel's start; each family's lowering copies it.
// Private to MKToGPU.
//
#ifndef MOK_LIB_CONVERSION_MKTOGPU_GRIDBUILDER_H
#define MOK_LIB_CONVERSION_MKTOGPU_GRIDBUILDER_H

#include "mok/Conversion/Common/ScalarEmitter.h"
#include "mok/Dialect/MK/IR/MKOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"

namespace mok::conversion {

/// The kernel-wide choices of the SIMT steps' code shape: more work in
/// flight per thread where registers allow it (set once a kernel by the
/// driver: warp roles and clusters leave fewer registers).
struct SimtTuning {
  /// Items (8 columns of a token) a thread of the vector combine works on
  /// at once: on the H200, 4 took the dsv3-shard combine from 0.181 to
  /// 0.177 ms and qwen3-30b's from 0.102 to 0.095 ms (2: 0.177-0.182 and
  /// 0.093).
  int64_t combineItems = 4;
  /// 16-byte pieces of a row a thread of the vector gathers copies at once
  /// (the most that divides the row's pieces): on the H200 4 left the
  /// dsv3-shard reverse combine at 0.36 ms and qwen3-30b's at 0.19 ms
  /// (about 1.5 TB/s: a route load, then the row loads, in flight per
  /// thread), before the pieces were spread (gatherVector).
  int64_t gatherPieces = 16;
  /// 16-byte pieces of a row a lane of the vector SwiGLU backward loads
  /// before it computes any (fewer when the row has fewer per lane).
  int64_t rowPieces = 4;
  /// The SwiGLU's sigmoid in fast math (ScalarEmitter.h): the IEEE
  /// reciprocal's range check and slow-path call per element cost a tenth
  /// of qwen3-30b's gate/up GEMM phase on the H200. Not in kernels with
  /// warp roles or clusters, nor for a clamped SwiGLU (sigmoidFor): without
  /// the branches ptxas keeps more of the epilogue in flight, and there it
  /// spilled (4-60 bytes on the benchmark shapes with warp roles or
  /// clusters; up to 232 bytes in the clamped test layers, none before).
  /// The CPU reference stays exact.
  SigmoidMath sigmoidMath = SigmoidMath::fast;
};

class GridBuilder : protected SimtTuning {
public:
  /// Emits the grid indices at the builder's insertion point (the start of
  /// `func`'s body) and remembers them.
  static GridBuilder atKernelStart(mlir::gpu::GPUFuncOp func, Emitter &e,
                                   const SimtTuning &tuning);

  GridBuilder(const GridBuilder &) = default;

protected:
  mlir::gpu::GPUFuncOp func;
  Emitter &e;
  mlir::Value gridThreads, globalId, spreadId, numBlocks;

  SigmoidMath sigmoidFor(Limit limit) const {
    return limit ? SigmoidMath::exact : sigmoidMath;
  }
  int64_t gatherPiecesOf(int64_t pieces) const {
    int64_t per = gatherPieces;
    while (pieces % per)
      per /= 2;
    return per;
  }

  /// for i in [0, n) over the grid, one thread an i (grid-stride).
  void forAll(mlir::Value n, mlir::function_ref<void(mlir::Value)> body) {
    e.loop(globalId, n, gridThreads, body);
  }
  /// for (r, c) in [0, rows) x [0, cols), distributed over the grid.
  void forAll2(mlir::Value rows, int64_t cols,
               mlir::function_ref<void(mlir::Value, mlir::Value)> body) {
    mlir::Value c = e.index(cols);
    forAll(e.mul(rows, c),
           [&](mlir::Value i) { body(e.div(i, c), e.rem(i, c)); });
  }
  /// for i in [0, n) over the grid, spread CTA-first (thread t of CTA b
  /// takes i = t * CTAs + b, ...): for loops of few, long iterations (one a
  /// chunk of routes or an expert), which would otherwise all land on the
  /// first CTAs' SMs.
  void forAllSpread(mlir::Value n, mlir::function_ref<void(mlir::Value)> body) {
    e.loop(spreadId, n, gridThreads, body);
  }
  /// Whether the kernel's block is known and whole warps: the warp-wide
  /// lowerings (shuffles, match.sync, warp barriers over all 32 lanes)
  /// need every lane of a warp present.
  bool wholeWarps() const;
  /// for i in [0, n), one warp an i over the grid, spread CTA-first as
  /// forAllSpread spreads threads; body(i, lane). The loop is uniform over
  /// each warp, so warp-wide operations inside see all 32 lanes.
  void forAllWarps(mlir::Value n,
                   mlir::function_ref<void(mlir::Value, mlir::Value)> body);
  /// forAllWarps with each warp's next item loaded while it works on the
  /// current one: fetch(i, lane) issues item i's loads and returns their
  /// values, body(i, lane, fetched) consumes them. The loop carries the
  /// values: item i + stride's loads are issued before body(i), the
  /// warp's first item's before the loop. fetch must be safe to call with
  /// any item in [0, n) and with item 0 whatever n is (a warp without
  /// items fetches item 0; the last fetches its own item again).
  void forAllWarpsPrefetched(
      mlir::Value n,
      mlir::function_ref<llvm::SmallVector<mlir::Value>(mlir::Value,
                                                        mlir::Value)>
          fetch,
      mlir::function_ref<void(mlir::Value, mlir::Value, mlir::ValueRange)>
          body);

  // Warp primitives.
  /// A gpu.shuffle of an i64 (two i32 halves) over the whole warp.
  mlir::Value shuffle64(mlir::Value v, int64_t offset,
                        mlir::gpu::ShuffleMode mode);
  /// The inclusive prefix sum of an i64 over the lanes of a warp.
  mlir::Value warpInclusiveSum(mlir::Value v, mlir::Value lane);
  /// bar.warp.sync over all 32 lanes.
  void syncWarp();
  mlir::Value popc(mlir::Value mask);

  // The routing plan's buffers.
  mlir::Value i64Of(mlir::Value index);
  /// R, the padded routed row count of the plan.
  mlir::Value routedRows(mlir::Value offsets);
  /// The expert of route q of `top` [T, k] in [0, experts), or -1.
  mlir::Value expertOf(mlir::Value top, mlir::Value q, int64_t experts);
  static int64_t size(mlir::Value v, unsigned i) {
    return mlir::cast<mlir::MemRefType>(v.getType()).getDimSize(i);
  }

  // 16-byte accesses (ld/st.global.v4) for the memory-bound SIMT steps.
  /// The global address (i64) of a buffer's first element.
  mlir::Value base(mlir::Value m);
  /// A global pointer `elements` (index) elements of `elementBytes` bytes
  /// past `base`.
  mlir::Value at(mlir::Value base, mlir::Value elements,
                 int64_t elementBytes = 2);
  mlir::Value load16(mlir::Type type, mlir::Value ptr);
  void store16(mlir::Value v, mlir::Value ptr);
  /// A 16-byte streaming store (st.global.cs: evict-first in L1 and L2),
  /// as the GEMM epilogues store: for the memory-bound steps' routed
  /// outputs (hundreds of MB on the benchmark shapes), read once by the
  /// next phase, so that they do not push out of L2 what is re-read (the
  /// rows of x and d_out, gathered k times).
  void store16Streaming(mlir::Value v, mlir::Value ptr);
  /// Whether all of `buffers` start 16-byte aligned (uniform over the grid;
  /// the runtime's workspace is, caller tensors usually are).
  mlir::Value aligned16(llvm::ArrayRef<mlir::Value> buffers) {
    return aligned(buffers, 16);
  }
  /// Whether all of `buffers` start `bytes`-aligned (a power of two): the
  /// constant true when the runtime guarantees it for every one of them
  /// (guaranteedAlignment), else the check of their addresses.
  mlir::Value aligned(llvm::ArrayRef<mlir::Value> buffers, int64_t bytes);
  /// The alignment in bytes the runtime guarantees for `buffer`
  /// (kernelParamAlignment, for this kernel's arguments).
  int64_t guaranteedAlignment(mlir::Value buffer) const;
  /// The f32 value of an f8E4M3FN element (exact: cvt.rn.f16x2.e4m3x2,
  /// then f16 to f32; NaN stays NaN).
  mlir::Value decodeE4M3(mlir::Value f8);
  /// The f32 value 2^(byte - 127) of an f8E8M0FNU scale: exact for bytes 1
  /// to 254, 2^-127 (an f32 subnormal) for 0, NaN for 0xFF.
  mlir::Value decodeE8M0(mlir::Value e8);
  /// The 8 bf16 lanes of a 16-byte vector as f32, and back (rounded).
  llvm::SmallVector<mlir::Value> unpack8(mlir::Value vec);
  mlir::Value pack8(llvm::ArrayRef<mlir::Value> xs);

private:
  /// A warp's first item of forAllWarps' spread, the stride between its
  /// items, and its lane.
  struct WarpSlots {
    mlir::Value first, stride, lane;
  };
  WarpSlots warpSlots();

  GridBuilder(mlir::gpu::GPUFuncOp func, Emitter &e, const SimtTuning &tuning)
      : SimtTuning(tuning), func(func), e(e) {}
};

/// The alignment in bytes the runtime guarantees for `buffer`: its
/// parameter's `align` in its kernel's `mok.kernel` description when it is
/// an argument of a gpu.func, else 0.
int64_t kernelParamAlignment(mlir::Value buffer);

} // namespace mok::conversion

#endif // MOK_LIB_CONVERSION_MKTOGPU_GRIDBUILDER_H
