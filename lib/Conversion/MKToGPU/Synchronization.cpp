// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Synchronization and profiling steps: mk.grid_barrier (a generation
// barrier over the whole grid) and mk.timestamp.
//
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

namespace {

class SyncLowering : GridBuilder {
public:
  explicit SyncLowering(const GridBuilder &grid) : GridBuilder(grid) {}

  /// `tensorCores`: the kernel has tensor-core GEMMs (TMA reads what the
  /// threads wrote before the barrier).
  void lower(mk::GridBarrierOp op, bool tensorCores);
  void lower(mk::TimestampOp op);
};

} // namespace

void mok::conversion::lowerGridBarrier(const GridBuilder &grid,
                                       mk::GridBarrierOp op, bool tensorCores) {
  SyncLowering(grid).lower(op, tensorCores);
}

void SyncLowering::lower(mk::GridBarrierOp op, bool tensorCores) {
  // Sense-free generation barrier: the last CTA to arrive resets the count
  // and bumps the generation the others spin on. Thread 0 of each CTA
  // arrives after a CTA barrier, with release/acquire fences at GPU scope
  // around it (fence.acq_rel.gpu: the CTAs of one kernel on one GPU; the
  // system scope, MEMBAR.SYS, also drained to host coherence), so every
  // thread's writes of the phase are visible to every thread of the next.
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value bar = op.getState();
  // What this thread wrote with ordinary stores may be read by TMA (the
  // async proxy) after the barrier: order it for that proxy first.
  if (tensorCores)
    NVVM::FenceProxyOp::create(b, loc, NVVM::ProxyKind::async_global,
                               NVVM::SharedSpaceAttr());
  gpu::BarrierOp::create(b, loc);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, tid, e.index(0)), [&] {
    Value zero = arith::ConstantIntOp::create(b, loc, 0, 32);
    Value one = arith::ConstantIntOp::create(b, loc, 1, 32);
    Value c0 = e.index(0), c1 = e.index(1);
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel, "device");
    Value gen = memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi,
                                            zero, bar, ValueRange{c1});
    Value arrived = memref::AtomicRMWOp::create(
        b, loc, arith::AtomicRMWKind::addi, one, bar, ValueRange{c0});
    Value blocks =
        arith::IndexCastOp::create(b, loc, b.getI32Type(), numBlocks);
    Value last = e.cmp(arith::CmpIPredicate::eq,
                       arith::AddIOp::create(b, loc, arrived, one), blocks);
    e.ifThen(
        last,
        [&] {
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::assign,
                                      zero, bar, ValueRange{c0});
          LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel,
                                "device");
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                      bar, ValueRange{c1});
        },
        [&] {
          auto spin = scf::WhileOp::create(b, loc, TypeRange{}, ValueRange{});
          Block *before = b.createBlock(&spin.getBefore());
          {
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToEnd(before);
            Value now = memref::AtomicRMWOp::create(
                b, loc, arith::AtomicRMWKind::addi, zero, bar, ValueRange{c1});
            Value same = e.cmp(arith::CmpIPredicate::eq, now, gen);
            scf::ConditionOp::create(b, loc, same, ValueRange{});
          }
          Block *after = b.createBlock(&spin.getAfter());
          {
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToEnd(after);
            scf::YieldOp::create(b, loc);
          }
          b.setInsertionPointAfter(spin);
        });
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::acq_rel, "device");
  });
  gpu::BarrierOp::create(b, loc);
}

void mok::conversion::lowerTimestamp(const GridBuilder &grid,
                                     mk::TimestampOp op) {
  SyncLowering(grid).lower(op);
}

void SyncLowering::lower(mk::TimestampOp op) {
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    Value now = NVVM::GlobalTimerOp::create(e.b, e.loc, e.b.getI64Type());
    e.store(now, op.getClock(), {e.index(op.getIndex())});
    if (Value cycles = op.getCycles())
      e.store(NVVM::Clock64Op::create(e.b, e.loc, e.b.getI64Type()), cycles,
              {e.index(op.getIndex())});
  });
}
