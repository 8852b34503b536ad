// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// sm_90a GEMM phases: TMA loads into 128-byte swizzled shared memory, an
// mbarrier per pipeline stage, and wgmma (bf16 x bf16 -> f32) on one
// warpgroup, in the nvgpu dialect. This is the shape of the H200-verified
// probe (scripts/probe/gemm_sm90.mlir) made persistent:
//
//   * the first warpgroup of each CTA computes; tasks (m-tile, n-tile) are
//     assigned to CTAs round-robin; the warpgroup syncs on named barrier 1;
//   * kStages stage buffers, each [A 64x64 | B_0 128x64 | B_1 128x64] bf16,
//     each part 1024-aligned (the swizzle atom), filled by thread 0's TMA
//     loads and completed by a per-stage mbarrier (arrival count 1 +
//     expect_tx). The warpgroup counts the k-tiles it consumed over all tasks
//     and phases (`iteration`): k-tile g lives in stage g % kStages and
//     completes phase (g / kStages) & 1 of that stage's barrier, so the
//     barriers are initialized once per kernel;
//   * both operands are K-major (A rows and W rows are contiguous in K):
//     one nvgpu.warpgroup.mma per m64n128k16 instruction with hand-made
//     descriptor offsets (+32 bytes per k16 step inside the swizzled row;
//     nvgpu's own multi-step B iteration is only right for MN-major B),
//     each followed by nvgpu's default wait (at most 1 group in flight);
//   * epilogue: the fp32 accumulators go to shared memory (over the stage
//     buffers, whose loads have all completed), then a SIMT loop hands each
//     element to the caller, which rounds and stores it as the scalar path
//     does.
//
#include "Hopper.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/IR/BuiltinOps.h"

using namespace mlir;

namespace mok::conversion::sm90 {

namespace {
constexpr int64_t kBf16 = 2, kF32 = 4;
constexpr int64_t kBytesA = kTileM * kTileK * kBf16; // 8 KiB
constexpr int64_t kBytesB = kTileN * kTileK * kBf16; // 16 KiB
constexpr int64_t kStageBytes = kBytesA + 2 * kBytesB;
constexpr int64_t kAccBytes = kTileM * kTileN * kF32; // one accumulator tile
constexpr int64_t kAlign = 1024;                      // 128B-swizzle atom
constexpr int64_t kK16Bytes = 16 * kBf16; // one wgmma k-step along a row
constexpr const char *kDynSmem = "mok_dyn_smem";
static_assert(kBytesA % kAlign == 0 && kBytesB % kAlign == 0,
              "stage parts must stay 1024-aligned");
static_assert(2 * kAccBytes <= kStages * kStageBytes,
              "the epilogue reuses the stage buffers");
static_assert(kTileN == kThreads, "the epilogue gives each thread a column");
static_assert(kBlock % kThreads == 0 && kBlock >= kThreads,
              "the computing warpgroup is the CTA's first");
constexpr int32_t kNamedBarrier = 1; // 0 is gpu.barrier's
} // namespace

int64_t dynamicSharedMemoryBytes() { return kStages * kStageBytes + kAlign; }

void insertDialects(DialectRegistry &registry) {
  registry.insert<nvgpu::NVGPUDialect, NVVM::NVVMDialect,
                  LLVM::LLVMDialect>();
}

TensorMapSpec operandA(StringRef buffer, int64_t rows, int64_t cols) {
  return {buffer.str(), rows, cols, cols, kTileM, kTileK};
}
TensorMapSpec operandB(StringRef buffer, int64_t rows, int64_t cols) {
  return {buffer.str(), rows, cols, cols, kTileN, kTileK};
}

static Attribute workgroup(MLIRContext *ctx) {
  return gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
}
static MemRefType smemType(MLIRContext *ctx, ArrayRef<int64_t> shape,
                           Type elt) {
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

GemmEmitter::GemmEmitter(Emitter &e, gpu::GPUModuleOp module, Value tensorMaps,
                         ArrayRef<TensorMapSpec> specs)
    : e(e) {
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
    memref::GlobalOp::create(b, loc, kDynSmem, b.getStringAttr("public"),
                             empty, Attribute(), /*constant=*/false,
                             b.getI64IntegerAttr(kAlign));
  }
  int64_t bytes = dynamicSharedMemoryBytes();
  Value dyn0 = memref::GetGlobalOp::create(b, loc, empty, kDynSmem);
  smem = memref::ReinterpretCastOp::create(b, loc, smemType(ctx, {bytes}, i8),
                                           dyn0, /*offset=*/0,
                                           /*sizes=*/{bytes}, /*strides=*/{1});
  // Round the base up to 1024 in case the declared alignment is not
  // honoured (then `pad` is 0).
  Value base = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, smem);
  Value align = e.index(kAlign);
  pad = e.sub(e.mul(arith::DivUIOp::create(
                        b, loc, e.add(base, e.index(kAlign - 1)), align),
                    align),
              base);

  barriers = nvgpu::MBarrierCreateOp::create(
      b, loc, nvgpu::MBarrierGroupType::get(ctx, workgroup(ctx), kStages));

  // The tensor maps: 128-byte CUtensorMaps, back to back in global memory.
  Value mapsBase = arith::IndexCastOp::create(
      b, loc, i64,
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, tensorMaps));
  auto ptrType = LLVM::LLVMPointerType::get(ctx);
  for (auto [i, spec] : llvm::enumerate(specs)) {
    Value offset = arith::ConstantIntOp::create(b, loc, 128 * i, 64);
    Value ptr = LLVM::IntToPtrOp::create(
        b, loc, ptrType, arith::AddIOp::create(b, loc, mapsBase, offset),
        LLVM::DereferenceableAttr());
    maps.push_back(UnrealizedConversionCastOp::create(
                       b, loc, TypeRange{tensorMapType(ctx, spec.boxRows)},
                       ValueRange{ptr})
                       .getResult(0));
    boxRows.push_back(spec.boxRows);
  }

  tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  isThread0 = e.cmp(arith::CmpIPredicate::eq, tid, e.index(0));
  e.ifThen(isThread0, [&] {
    for (int64_t s = 0; s < kStages; ++s)
      nvgpu::MBarrierInitOp::create(b, loc, barriers, e.index(1), e.index(s),
                                    Value());
    NVVM::FenceMbarrierInitOp::create(b, loc);
    for (Value map : maps)
      nvgpu::TmaPrefetchOp::create(b, loc, map, Value());
  });
  gpu::BarrierOp::create(b, loc);
  iteration = e.index(0);
}

Value GemmEmitter::view(Value byteOffset, MemRefType type) {
  return memref::ViewOp::create(e.b, e.loc, type, smem, byteOffset,
                                ValueRange{});
}

/// Thread 0: k-tile `kTile` of the task into the stage of k-tile number `g`.
void GemmEmitter::load(const GemmPhase &p, Value g, Value kTile, Value m0,
                       Value bRow) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type bf16 = b.getBF16Type();
  int64_t numB = p.b1 ? 2 : 1;
  Value stage = e.rem(g, e.index(kStages));
  Value base = e.add(pad, e.mul(stage, e.index(kStageBytes)));
  nvgpu::MBarrierArriveExpectTxOp::create(
      b, loc, barriers, e.index(kBytesA + numB * kBytesB), stage, Value());
  Value kc = e.mul(kTile, e.index(kTileK));
  auto tma = [&](unsigned map, Value offset, Value row) {
    nvgpu::TmaAsyncLoadOp::create(
        b, loc, view(offset, smemType(ctx, {boxRows[map], kTileK}, bf16)),
        barriers, maps[map], ValueRange{kc, row}, stage, Value(), Value());
  };
  tma(p.a, base, m0);
  tma(p.b0, e.add(base, e.index(kBytesA)), bRow);
  if (p.b1)
    tma(*p.b1, e.add(base, e.index(kBytesA + kBytesB)), bRow);
}

void GemmEmitter::syncWarpgroup() {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  NVVM::BarrierOp::create(
      b, loc, Type(), arith::ConstantIntOp::create(b, loc, kNamedBarrier, 32),
      arith::ConstantIntOp::create(b, loc, kThreads, 32),
      NVVM::BarrierReductionAttr(), Value());
}

void GemmEmitter::emit(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value inGroup = e.cmp(arith::CmpIPredicate::ult, tid, e.index(kThreads));
  auto ifOp = scf::IfOp::create(b, loc, TypeRange{b.getIndexType()}, inGroup,
                                /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.elseBlock());
    scf::YieldOp::create(b, loc, iteration);
    b.setInsertionPointToStart(ifOp.thenBlock());
    tasks(p);
    scf::YieldOp::create(b, loc, iteration);
  }
  iteration = ifOp.getResult(0);
}

/// The first warpgroup's task loop; advances `iteration`.
void GemmEmitter::tasks(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  assert(p.k % kTileK == 0 && "k must be a multiple of kTileK");
  assert(boxRows[p.a] == kTileM && boxRows[p.b0] == kTileN);
  int64_t kTiles = p.k / kTileK;
  int64_t nTiles = (p.n + kTileN - 1) / kTileN;
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

  Value mTiles = e.div(e.add(p.rows, e.index(kTileM - 1)), e.index(kTileM));
  Value tasks = e.mul(mTiles, e.index(nTiles));
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value grid = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  auto taskLoop =
      scf::ForOp::create(b, loc, bid, tasks, grid, ValueRange{iteration});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(taskLoop.getBody());
    Value task = taskLoop.getInductionVar();
    Value it = taskLoop.getRegionIterArgs()[0];
    Value m0 = e.mul(e.div(task, e.index(nTiles)), e.index(kTileM));
    Value n0 = e.mul(e.rem(task, e.index(nTiles)), e.index(kTileN));
    Value bRow = e.add(p.bRowBase(m0), n0);

    // Prologue: the first stages of the task. Every stage is free: the
    // previous task consumed all the k-tiles it loaded, and its epilogue
    // ended with a CTA barrier.
    e.ifThen(isThread0, [&] {
      for (int64_t kt = 0; kt < std::min(kStages, kTiles); ++kt)
        load(p, e.add(it, e.index(kt)), e.index(kt), m0, bRow);
    });

    SmallVector<Value> init;
    for (int64_t j = 0; j < numAcc; ++j)
      init.push_back(nvgpu::WarpgroupMmaInitAccumulatorOp::create(b, loc,
                                                                  accType));
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
                           e.rem(e.div(g, stageCount), e.index(2)),
                           e.index(0));
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, barriers, parity,
                                             e.index(10000000), stage);
      Value base = e.add(pad, e.mul(stage, e.index(kStageBytes)));
      for (int64_t ks = 0; ks < kTileK / 16; ++ks) {
        Value offA = e.add(base, e.index(ks * kK16Bytes));
        Value descA = nvgpu::WarpgroupGenerateDescriptorOp::create(
            b, loc, aDesc, view(offA, aStep), maps[p.a]);
        for (int64_t j = 0; j < numAcc; ++j) {
          unsigned map = j == 0 ? p.b0 : *p.b1;
          Value offB =
              e.add(base, e.index(kBytesA + j * kBytesB + ks * kK16Bytes));
          Value descB = nvgpu::WarpgroupGenerateDescriptorOp::create(
              b, loc, bDesc, view(offB, bStep), maps[map]);
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
      e.ifThen(refill, [&] { load(p, e.add(g, stageCount), next, m0, bRow); });
      scf::YieldOp::create(b, loc, acc);
    }

    // Epilogue through shared memory. All loads of the task have completed
    // (each was waited for), so the stage buffers are free.
    SmallVector<Value> tiles;
    for (int64_t j = 0; j < numAcc; ++j) {
      tiles.push_back(view(e.add(pad, e.index(j * kAccBytes)), accTile));
      nvgpu::WarpgroupMmaStoreOp::create(b, loc, kLoop.getResult(j),
                                         tiles.back());
    }
    syncWarpgroup();
    Value col = e.add(n0, tid);
    auto body = [&] {
      e.loop(kTileM, [&](Value r) {
        Value row = e.add(m0, r);
        e.ifThen(e.cmp(arith::CmpIPredicate::slt, row, p.rows), [&] {
          Value v0 = e.load(tiles[0], {r, tid});
          Value v1 = numAcc > 1 ? e.load(tiles[1], {r, tid}) : Value();
          p.store(row, col, v0, v1);
        });
      });
    };
    if (p.n % kTileN)
      e.ifThen(e.cmp(arith::CmpIPredicate::slt, col, e.index(p.n)), body);
    else
      body();
    // The next task's TMA (async proxy) overwrites what this epilogue wrote
    // and read through the generic proxy.
    NVVM::FenceProxyOp::create(
        b, loc, NVVM::ProxyKind::async_shared,
        NVVM::SharedSpaceAttr::get(ctx, NVVM::SharedSpace::shared_cta));
    syncWarpgroup();
    scf::YieldOp::create(b, loc, e.add(it, e.index(kTiles)));
  }
  iteration = taskLoop.getResult(0);
}

} // namespace mok::conversion::sm90
