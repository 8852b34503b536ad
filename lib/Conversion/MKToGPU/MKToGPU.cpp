// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-mk-to-gpu: checks each megakernel (KernelChecks.cpp), then walks
// its mk ops in order and expands each in place through its op family's
// lowering (Lowering.h: RoutingPlan.cpp, Dispatch.cpp, Gemm.cpp,
// SwigluGrad.cpp, Synchronization.cpp).
//
// The SIMT steps distribute their outermost iterations over all threads of
// the grid (grid-stride loops) and compute each element exactly as the CPU
// reference does, with the same scalar emitter. Tensor-core mk.gemm ops are
// TMA + tensor-core tile loops (GemmPipeline.h) with the same rounding
// points: wgmma on sm_90a (Hopper.h), tcgen05 on sm_100a (Blackwell.h).
//
// A walker rather than conversion patterns: the steps of a kernel share
// state that one op's pattern cannot see (the GEMM phases' one-time setup
// at the kernel's start, what follows the last GEMM, the barrier after
// each GEMM), and their order is the schedule (docs/Rationale.md).
//
#include "mok/Conversion/MKToGPU/MKToGPU.h"
#include "Blackwell.h"
#include "GemmPipeline.h"
#include "Hopper.h"
#include "Lowering.h"

#include "mok/Dialect/MK/IR/MKSchedule.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMKTOGPU
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok;
using namespace mok::conversion;
namespace sched = mok::mk::schedule;

namespace {

bool isTensorCoreGemm(Operation *op) {
  auto g = dyn_cast<mk::GemmOp>(op);
  return g && g.usesTensorCores();
}

/// Lowers the checked kernel `func`, whose tensor-core GEMMs (if any) run
/// on `engine`.
void lowerKernel(gpu::GPUFuncOp func, std::optional<mk::Engine> engine) {
  OpBuilder b(func.getContext());
  Emitter e(b, func.getLoc());
  Location loc = e.loc;
  Block &body = func.getBody().front();

  SmallVector<Operation *> ops;
  Operation *lastTensorCoreGemm = nullptr;
  // Tensor-core GEMMs whose next mk op is an mk.grid_barrier.
  llvm::SmallPtrSet<Operation *, 4> beforeGridBarrier;
  for (Operation &op : body)
    if (isa<mk::MKDialect>(op.getDialect())) {
      if (isa<mk::GridBarrierOp>(op) && !ops.empty() &&
          isTensorCoreGemm(ops.back()))
        beforeGridBarrier.insert(ops.back());
      ops.push_back(&op);
      if (isTensorCoreGemm(&op))
        lastTensorCoreGemm = &op;
    }

  // The tensor-core GEMMs' warp roles and the maps every task reads (the
  // same roles in every tensor-core GEMM: checkKernel), and the SIMT steps'
  // code shape under them.
  SimtTuning tuning;
  SmallVector<std::pair<int64_t, int64_t>> prefetch;
  Value maps;
  gemm::WarpRoles roles;
  bool mx = false;
  if (engine)
    for (auto g : body.getOps<mk::GemmOp>()) {
      if (!g.usesTensorCores())
        continue;
      mx |= g.isMx();
      mk::GemmScheduleAttr schedule = g.getSchedule();
      roles.consumers = schedule.tileM() / sched::kTileM;
      roles.producer = schedule.getProducer();
      roles.cluster = schedule.getMulticast() ? 2 : 1;
      // Under the producer's register split, four combine items spilled
      // (the SwiGLU backward's pieces: one, the gathers' four, the same
      // caution).
      if (roles.producer) {
        tuning.combineItems = 2;
        tuning.rowPieces = 1;
        tuning.gatherPieces = 4;
      }
      if (roles.producer || roles.cluster > 1)
        tuning.sigmoidMath = SigmoidMath::exact;
      if (ArrayRef<int64_t> r = schedule.getRegisters(); !r.empty()) {
        roles.registers = {r[0], r[1]};
        roles.evenRegisters = sched::evenRegisters(
            static_cast<unsigned>((*func.getKnownBlockSize())[0]));
      }
      maps = g.getTensorMaps();
      ArrayRef<int64_t> slots = *g.getMaps();
      prefetch.push_back({slots[0], schedule.tileM()});
      if (!g.isGrouped())
        for (int64_t s : slots.drop_front())
          prefetch.push_back({s, schedule.tileN()});
    }

  b.setInsertionPointToStart(&body);
  GridBuilder grid = GridBuilder::atKernelStart(func, e, tuning);
  // The tensor-core GEMMs' one-time setup (mbarriers, the prefetch of the
  // maps every task reads; sm_100a: Tensor Memory), in uniform control flow
  // at the start of the kernel.
  std::unique_ptr<gemm::GemmEmitter> tensorCores;
  if (engine) {
    auto module = func->getParentOfType<gpu::GPUModuleOp>();
    tensorCores =
        *engine == mk::Engine::tcgen05
            ? sm100::createGemmEmitter(e, module, maps, prefetch, roles, mx)
            : sm90::createGemmEmitter(e, module, maps, prefetch, roles);
    // setmaxnreg needs the kernel's register count fixed (.maxnreg): the
    // even share, which the phases move between the roles and restore.
    if (roles.registers)
      func->setAttr("nvvm.maxnreg", b.getI32IntegerAttr(static_cast<int32_t>(
                                        roles.evenRegisters)));
  }

  bool finished = !engine;
  bool afterLastGemm = false;
  for (auto [index, op] : llvm::enumerate(ops)) {
    if (!op) // (lowered with the op before it)
      continue;
    b.setInsertionPoint(op);
    // A weight quantized in both layouts by two ops in a row: one pass.
    if (auto q = dyn_cast<mk::QuantizeWeightsOp>(op);
        q && index + 1 < ops.size() && ops[index + 1] == op->getNextNode() &&
        isTransposedTwin(q, ops[index + 1])) {
      auto twin = cast<mk::QuantizeWeightsOp>(ops[index + 1]);
      lowerQuantizeWeightsPair(grid, q, twin);
      twin->erase();
      ops[index + 1] = nullptr;
      op->erase();
      continue;
    }
    TypeSwitch<Operation *>(op)
        .Case<mk::FillOp, mk::CheckRoutesOp, mk::CountRoutesOp,
              mk::ScanChunksOp, mk::PadOffsetsOp, mk::AssignRowsOp>(
            [&](Operation *step) { lowerRoutingPlanStep(grid, step); })
        .Case([&](mk::GatherOp gather) { lowerGather(grid, gather); })
        .Case([&](mk::GemmOp gemm) {
          lowerGemm(grid, gemm, tensorCores.get(),
                    beforeGridBarrier.contains(gemm));
        })
        .Case([&](mk::CombineOp combine) { lowerCombine(grid, combine); })
        .Case([&](mk::SwigluGradOp grad) { lowerSwigluGrad(grid, grad); })
        .Case<mk::QuantizeRowsOp, mk::QuantizeColumnsOp,
              mk::QuantizeWeightsOp>(
            [&](Operation *q) { lowerQuantize(grid, q); })
        .Case([&](mk::GridBarrierOp barrier) {
          lowerGridBarrier(grid, barrier, static_cast<bool>(tensorCores));
        })
        .Case([&](mk::TimestampOp stamp) { lowerTimestamp(grid, stamp); })
        .Case<mk::RouteRanksOp, mk::PutCountsOp, mk::SignalOp, mk::WaitOp,
              mk::CheckCapacityOp, mk::ReceivedRowsOp, mk::SendRowsOp,
              mk::ReturnRowsOp, mk::TakeRoutesOp, mk::LaunchEpochOp,
              mk::CountLaunchOp, mk::FencePeersOp>(
            [&](Operation *step) { lowerExchange(grid, step); });
    if (op == lastTensorCoreGemm)
      afterLastGemm = true;
    // What follows the last tensor-core GEMM and a CTA-wide barrier
    // (sm_100a: frees Tensor Memory): after the next grid barrier.
    if (!finished && afterLastGemm && isa<mk::GridBarrierOp>(op)) {
      tensorCores->finish();
      finished = true;
    }
    op->erase();
  }
  if (!finished) {
    b.setInsertionPoint(body.getTerminator());
    gpu::BarrierOp::create(b, loc);
    tensorCores->finish();
  }
}

struct ConvertMKToGPUPass
    : public mok::impl::ConvertMKToGPUBase<ConvertMKToGPUPass> {
  using ConvertMKToGPUBase::ConvertMKToGPUBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    ConvertMKToGPUBase::getDependentDialects(registry);
    gemm::insertDialects(registry);
  }

  void runOnOperation() override {
    SmallVector<std::pair<gpu::GPUFuncOp, std::optional<mk::Engine>>> kernels;
    WalkResult walk = getOperation().walk([&](gpu::GPUFuncOp func) {
      bool hasMK = llvm::any_of(func.getBody(), [](Block &block) {
        return llvm::any_of(block, [](Operation &op) {
          return isa<mk::MKDialect>(op.getDialect());
        });
      });
      if (!hasMK)
        return WalkResult::advance();
      FailureOr<std::optional<mk::Engine>> engine = checkKernel(func);
      if (failed(engine))
        return WalkResult::interrupt();
      kernels.push_back({func, *engine});
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();
    for (auto [func, engine] : kernels)
      lowerKernel(func, engine);
  }
};

} // namespace
