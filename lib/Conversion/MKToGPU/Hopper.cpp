// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// sm_90a MMA layer: wgmma (bf16 x bf16 -> f32) on one warpgroup, in the
// nvgpu dialect, under the shared TMA + mbarrier pipeline (GemmPipeline.cpp):
//
//   * every thread of the warpgroup waits for a stage's full barrier;
//   * one nvgpu.warpgroup.mma per m64n128k16 instruction with hand-made
//     descriptor offsets (+32 bytes per k16 step inside the swizzled row;
//     nvgpu's own multi-step B iteration is only right for MN-major B),
//     each followed by nvgpu's default wait (at most 1 group in flight);
//   * every wgmma reading the stage completes (wgmma.wait_group 0) and the
//     warpgroup syncs before thread 0 refills the stage, so the pipeline
//     needs no "empty" barriers;
//   * the register accumulators go to shared memory (nvgpu.warpgroup.mma.store)
//     for the shared epilogue.
//
#include "Hopper.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

using namespace mlir;
using namespace mok::conversion::gemm;

namespace mok::conversion::sm90 {

namespace {

class WgmmaEmitter final : public GemmEmitter {
public:
  WgmmaEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
               ArrayRef<std::pair<int64_t, int64_t>> prefetch)
      : GemmEmitter(e, module, tensorMaps, prefetch) {}

private:
  SmallVector<Value> accumulate(const GemmPhase &p, Value it,
                                const Task &t) override;
};

} // namespace

/// The k-loop of one task: fp32 accumulators in registers (loop-carried),
/// then stored to the shared-memory tiles.
SmallVector<Value> WgmmaEmitter::accumulate(const GemmPhase &p, Value it,
                                            const Task &t) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  int64_t kTiles = p.k / kTileK;
  int64_t numAcc = p.b1 ? 2 : 1;

  auto accType = nvgpu::WarpgroupAccumulatorType::get(
      ctx, VectorType::get({kTileM, kTileN}, f32));
  MemRefType aStep = smemType(ctx, {kTileM, 16}, bf16);
  // K-major B, spelled [K][N] as nvgpu's verifier wants (A.dim1 == B.dim0);
  // without transposeB the instruction reads it K-major.
  MemRefType bStep = smemType(ctx, {16, kTileN}, bf16);
  auto aDesc = nvgpu::WarpgroupMatrixDescriptorType::get(ctx, aStep);
  auto bDesc = nvgpu::WarpgroupMatrixDescriptorType::get(ctx, bStep);
  MemRefType accTile = smemType(ctx, {kTileM, kTileN}, f32);

  SmallVector<Value> init;
  for (int64_t j = 0; j < numAcc; ++j)
    init.push_back(
        nvgpu::WarpgroupMmaInitAccumulatorOp::create(b, loc, accType));
  auto kLoop = scf::ForOp::create(b, loc, e.index(0), e.index(kTiles),
                                  e.index(1), init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(kLoop.getBody());
    Value kt = kLoop.getInductionVar();
    SmallVector<Value> acc(kLoop.getRegionIterArgs());
    Value g = e.add(it, kt);
    Value stageCount = e.index(kStages);
    Value stage = e.rem(g, stageCount);
    Value parity = e.cmp(arith::CmpIPredicate::ne,
                         e.rem(e.div(g, stageCount), e.index(2)), e.index(0));
    nvgpu::MBarrierTryWaitParityOp::create(b, loc, barriers, parity,
                                           e.index(10000000), stage);
    Value base = e.add(pad, e.mul(stage, e.index(kStageBytes)));
    for (int64_t ks = 0; ks < kTileK / 16; ++ks) {
      Value offA = e.add(base, e.index(ks * kK16Bytes));
      Value descA = nvgpu::WarpgroupGenerateDescriptorOp::create(
          b, loc, aDesc, view(offA, aStep), t.mapA);
      for (int64_t j = 0; j < numAcc; ++j) {
        Value map = j == 0 ? t.mapB0 : t.mapB1;
        Value offB =
            e.add(base, e.index(kBytesA + j * kBytesB + ks * kK16Bytes));
        Value descB = nvgpu::WarpgroupGenerateDescriptorOp::create(
            b, loc, bDesc, view(offB, bStep), map);
        acc[j] = nvgpu::WarpgroupMmaOp::create(
            b, loc, accType, descA, descB, /*waitGroup=*/IntegerAttr(),
            /*transposeA=*/UnitAttr(), /*transposeB=*/UnitAttr(), acc[j]);
      }
    }
    // Every wgmma reading the stage is done (and every thread is past its
    // wait) before thread 0 refills it.
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
    syncWarpgroup();
    Value next = e.add(kt, stageCount);
    Value refill = arith::AndIOp::create(
        b, loc, isThread0,
        e.cmp(arith::CmpIPredicate::slt, next, e.index(kTiles)));
    e.ifThen(refill, [&] { load(p, e.add(g, stageCount), next, t); });
    scf::YieldOp::create(b, loc, acc);
  }

  // All loads of the task have completed (each was waited for), so the
  // stage buffers are free for the accumulators.
  SmallVector<Value> tiles;
  for (int64_t j = 0; j < numAcc; ++j) {
    tiles.push_back(view(e.add(pad, e.index(j * kAccBytes)), accTile));
    nvgpu::WarpgroupMmaStoreOp::create(b, loc, kLoop.getResult(j),
                                       tiles.back());
  }
  syncWarpgroup();
  return tiles;
}

std::unique_ptr<GemmEmitter> createGemmEmitter(Emitter &e,
                                               gpu::GPUModuleOp module,
                                               Value tensorMaps,
                                               ArrayRef<std::pair<int64_t, int64_t>> prefetch) {
  return std::make_unique<WgmmaEmitter>(e, module, tensorMaps, prefetch);
}

} // namespace mok::conversion::sm90
