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

private:
  Type i1() { return e.b.getI1Type(); }
  Value trueValue() {
    return arith::ConstantIntOp::create(e.b, e.loc, 1, 1);
  }
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
          // Bounded (status and timeout_ns): the wait also ends when
          // another CTA gave up (status[3] set) or after timeout_ns.
          Value status = op.getStatus();
          Value start, words;
          Type i32 = b.getI32Type(), i64 = b.getI64Type();
          auto word = [&](int64_t i) { return at(words, e.index(i), 4); };
          if (status) {
            words = base(status);
            start = NVVM::GlobalTimerOp::create(b, loc, i64);
          }
          auto spin = scf::WhileOp::create(b, loc, TypeRange{i1()},
                                           ValueRange{trueValue()});
          Block *before = b.createBlock(&spin.getBefore());
          before->addArgument(i1(), loc);
          {
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToEnd(before);
            Value now = memref::AtomicRMWOp::create(
                b, loc, arith::AtomicRMWKind::addi, zero, bar, ValueRange{c1});
            Value same = e.cmp(arith::CmpIPredicate::eq, now, gen);
            Value waiting = same;
            if (status) {
              // The report is host memory the kernel does not own: read
              // it afresh each time (volatile).
              Value gaveUp = e.cmp(
                  arith::CmpIPredicate::ne,
                  e.toIndex(LLVM::LoadOp::create(b, loc, i32, word(3), 4,
                                                 /*isVolatile=*/true)),
                  e.index(0));
              Value elapsed = arith::SubIOp::create(
                  b, loc, NVVM::GlobalTimerOp::create(b, loc, i64), start);
              Value inTime = arith::CmpIOp::create(
                  b, loc, arith::CmpIPredicate::slt, elapsed,
                  arith::ConstantIntOp::create(b, loc, *op.getTimeoutNs(), 64));
              waiting = arith::AndIOp::create(
                  b, loc, waiting,
                  arith::AndIOp::create(
                      b, loc, inTime,
                      arith::XOrIOp::create(b, loc, gaveUp, trueValue())));
            }
            scf::ConditionOp::create(b, loc, waiting, ValueRange{same});
          }
          Block *after = b.createBlock(&spin.getAfter());
          after->addArgument(i1(), loc);
          {
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToEnd(after);
            scf::YieldOp::create(b, loc, ValueRange{trueValue()});
          }
          b.setInsertionPointAfter(spin);
          if (status) {
            // Still the same generation: record this barrier, unless a CTA
            // already recorded one.
            Value stuck = spin.getResult(0);
            Value first = e.cmp(
                arith::CmpIPredicate::eq,
                e.toIndex(LLVM::LoadOp::create(b, loc, i32, word(3), 4,
                                               /*isVolatile=*/true)),
                e.index(0));
            e.ifThen(arith::AndIOp::create(b, loc, stuck, first), [&] {
              Value arrivedNow = memref::AtomicRMWOp::create(
                  b, loc, arith::AtomicRMWKind::addi, zero, bar,
                  ValueRange{c0});
              auto put = [&](int64_t i, Value v) {
                LLVM::StoreOp::create(b, loc, v, word(i), 4,
                                      /*isVolatile=*/true);
              };
              put(4, arrivedNow);
              put(5, arith::IndexCastOp::create(b, loc, i32, numBlocks));
              put(6, arith::IndexCastOp::create(
                         b, loc, i32,
                         gpu::BlockIdOp::create(b, loc, gpu::Dimension::x)));
              put(3, arith::ConstantIntOp::create(b, loc, *op.getIndex() + 1,
                                                  32));
            });
          }
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
