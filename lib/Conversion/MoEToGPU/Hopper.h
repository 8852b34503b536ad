// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The sm_90a GEMM phases of the persistent MoE kernel: TMA + mbarrier +
// wgmma tile loops, emitted with the nvgpu dialect. Private to MoEToGPU; kept
// in its own translation unit so that only it pays for the NVGPU and NVVM
// headers.
//
#ifndef MOK_LIB_CONVERSION_MOETOGPU_HOPPER_H
#define MOK_LIB_CONVERSION_MOETOGPU_HOPPER_H

#include "mok/Conversion/Common/ScalarEmitter.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"

#include <optional>
#include <string>

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace mok::conversion::sm90 {

/// The tile of one task: kTileM rows of A (the tokens / routed rows) by
/// kTileN output columns, reduced in steps of kTileK (64 bf16 = one 128-byte
/// swizzle row). One warpgroup (kThreads threads, the CTA's first) computes
/// a task.
constexpr int64_t kTileM = 64, kTileN = 128, kTileK = 64;
constexpr unsigned kThreads = 128;
/// Threads per CTA of a kernel with GEMM phases: the SIMT phases (plan,
/// dispatch, combine) use them all; the second warpgroup idles in the GEMM
/// phases. (On an H200, the SIMT phases of the Qwen3-30B-A3B layer took
/// 9.7 ms with 128 threads per CTA and 6.9 ms with 256.)
constexpr unsigned kBlock = 256;
/// TMA pipeline depth (k-tiles in flight per CTA).
constexpr int64_t kStages = 4;

/// Dynamic shared memory the GEMM phases use, in bytes (stage buffers, reused
/// by the epilogue, plus slack to align them to 1024 bytes).
int64_t dynamicSharedMemoryBytes();

/// The dialects the GEMM phases create ops of.
void insertDialects(DialectRegistry &registry);

/// A 2-D bf16 view of a kernel buffer, as the runtime encodes it with
/// cuTensorMapEncodeTiled (SWIZZLE_128B, OOB zero fill).
struct TensorMapSpec {
  std::string buffer;
  int64_t rows, cols, rowStride, boxRows, boxCols;
};

/// An A operand map: boxes of kTileM rows; a B operand map: kTileN rows.
TensorMapSpec operandA(StringRef buffer, int64_t rows, int64_t cols);
TensorMapSpec operandB(StringRef buffer, int64_t rows, int64_t cols);

/// One GEMM phase: for each task (m-tile, n-tile),
///   acc_j[r, c] = sum_k A[m0 + r, k] * B_j[bRow0(m0) + n0 + c, k]
/// over k in [0, k), in fp32, for B_0 and, when given, B_1 (same rows); then
/// `store(row, col, acc_0, acc_1)` for every row < rows, col < n.
struct GemmPhase {
  unsigned a;                 // map index of A ([*, k], rows >= `rows`)
  unsigned b0;                // map index of B_0 ([*, k])
  std::optional<unsigned> b1; // map index of B_1, same rows as B_0
  int64_t k;                  // a multiple of kTileK
  int64_t n;                  // output columns; n-tiles of kTileN
  Value rows;                 // A rows to compute (index)
  /// The first B row of the tile at A row m0 (uniform in the tile), index.
  function_ref<Value(Value m0)> bRowBase;
  /// Stores one result element (acc_1 is null without B_1).
  function_ref<void(Value row, Value col, Value acc0, Value acc1)> store;
};

/// Emits the GEMM phases of one kernel. The constructor emits the one-time
/// setup at the builder's insertion point (mbarrier init, tensor map
/// pointers): call it at the start of the kernel body, in uniform control
/// flow. The kernel must run with kBlock threads per CTA.
class GemmEmitter {
public:
  GemmEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
              ArrayRef<TensorMapSpec> maps);

  /// Emits a persistent loop over the phase's tasks, round-robin over the
  /// CTAs of the grid, run by the CTA's first warpgroup, at the builder's
  /// insertion point (uniform control flow, every thread of the CTA). The
  /// warpgroup synchronizes on its own named barrier, so the other threads
  /// go on (to the grid barrier that ends the phase).
  void emit(const GemmPhase &phase);

private:
  Emitter &e;
  SmallVector<Value> maps;    // !nvgpu.tensormap.descriptor, one a map
  SmallVector<int64_t> boxRows;
  Value smem, pad, barriers, tid, isThread0;
  Value iteration;            // k-tiles this CTA has consumed so far

  void load(const GemmPhase &p, Value g, Value kTile, Value m0, Value bRow);
  void syncWarpgroup();
  void tasks(const GemmPhase &p);
  Value view(Value byteOffset, MemRefType type);
};

} // namespace mok::conversion::sm90

#endif // MOK_LIB_CONVERSION_MOETOGPU_HOPPER_H
