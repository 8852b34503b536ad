// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Expert parallelism's exchange between the ranks of a group: the send
// side's routing (mk.route_ranks), the counts (mk.put_counts,
// mk.check_capacity, mk.received_rows), the rows (mk.send_rows,
// mk.return_rows) and the flags that order them (mk.signal, mk.wait).
// Stores into a peer's symmetric buffer go to its address in the peer
// table plus the region's offset; mk.fence_peers makes every thread's
// stores to peers visible before the barrier and the signal that publish
// them.
//
#include "GlobalAccess.h"
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

namespace {

class ExchangeLowering : GridBuilder {
public:
  explicit ExchangeLowering(const GridBuilder &grid) : GridBuilder(grid) {}

  void lower(mk::RouteRanksOp op);
  void lower(mk::PutCountsOp op);
  void lower(mk::SignalOp op);
  void lower(mk::WaitOp op);
  void lower(mk::CheckCapacityOp op);
  void lower(mk::ReceivedRowsOp op);
  void lower(mk::SendRowsOp op);
  void lower(mk::ReturnRowsOp op);
  void lower(mk::TakeRoutesOp op);
  void lower(mk::LaunchEpochOp op);
  void lower(mk::CountLaunchOp op);
  void lower(mk::FencePeersOp op);

private:
  Type i64() { return e.b.getI64Type(); }
  Value c64(int64_t v) {
    return arith::ConstantIntOp::create(e.b, e.loc, v, 64);
  }
  Value i32Of(Value index) {
    return arith::IndexCastOp::create(e.b, e.loc, e.b.getI32Type(), index);
  }
  Value rankIndex(Value rank) {
    return arith::IndexCastOp::create(e.b, e.loc, e.b.getIndexType(), rank);
  }
  /// The address (i64) of rank `d`'s copy of `region` (a memref.view of
  /// the symmetric buffer, checked by the op's verifier): the peer table's
  /// entry plus the region's byte offset in the buffer.
  Value peerBase(Value region, Value peers, Value d) {
    auto view = region.getDefiningOp<memref::ViewOp>();
    Value regionBase = base(region);
    Value bufferBase = base(view.getSource());
    Value offset = arith::SubIOp::create(e.b, e.loc, regionBase, bufferBase);
    Value peer = e.load(peers, {d});
    return arith::AddIOp::create(e.b, e.loc, peer, offset);
  }
  /// Every store this thread made is visible to the whole system before
  /// anything it does next (fence.acq_rel.sys).
  void fenceSystem() {
    LLVM::FenceOp::create(e.b, e.loc, LLVM::AtomicOrdering::acq_rel, "");
  }
  void storeAt(Value v, Value address) {
    int64_t bytes = v.getType().getIntOrFloatBitWidth() / 8;
    LLVM::StoreOp::create(e.b, e.loc, v, toPtr(address), bytes);
  }
  Value toPtr(Value address) {
    return LLVM::IntToPtrOp::create(
        e.b, e.loc, LLVM::LLVMPointerType::get(e.b.getContext(), 1), address,
        LLVM::DereferenceableAttr());
  }
  Value byteOffset(Value address, Value elements, int64_t elementBytes) {
    return arith::AddIOp::create(
        e.b, e.loc, address,
        arith::MulIOp::create(e.b, e.loc, i64Of(elements), c64(elementBytes)));
  }
  /// i64 sum over [0, n) of addend(i).
  Value sumI64(Value n, function_ref<Value(Value)> addend) {
    return e.fold(e.index(0), n, c64(0), [&](Value i, Value acc) {
      return arith::AddIOp::create(e.b, e.loc, acc, addend(i)).getResult();
    });
  }
  /// Copies rows between two global buffers of `h` bf16 columns, a row
  /// `rows` (index) at a time: body(r) gives the source and destination
  /// row addresses (i64) of row r and whether to copy it; 16-byte pieces
  /// when `vector` (h a multiple of 8, both 16-byte aligned), else one
  /// element at a time. `first(r)` runs on the thread of the row's first
  /// piece (the rows' metadata).
  void copyRows(Value rows, int64_t h, bool vector,
                function_ref<std::tuple<Value, Value, Value>(Value)> rowOf,
                function_ref<void(Value, Value)> first);
};

} // namespace

void ExchangeLowering::copyRows(
    Value rows, int64_t h, bool vector,
    function_ref<std::tuple<Value, Value, Value>(Value)> rowOf,
    function_ref<void(Value, Value)> first) {
  // As the dispatch gather: `per` pieces a thread, G apart, all loads
  // first, so that several are in flight.
  int64_t pieceElements = vector ? 8 : 1;
  int64_t pieces = h / pieceElements;
  int64_t per = vector ? gatherPiecesOf(pieces) : 1;
  int64_t strideBytes = 2 * pieceElements * (pieces / per);
  Type piece = vector ? Type(VectorType::get({4}, e.b.getI32Type()))
                      : Type(e.b.getI16Type());
  forAll2(rows, pieces / per, [&](Value r, Value c) {
    auto [src, dst, copy] = rowOf(r);
    e.ifThen(copy, [&] {
      Value col = arith::MulIOp::create(e.b, e.loc, i64Of(c),
                                        c64(2 * pieceElements));
      Value s = arith::AddIOp::create(e.b, e.loc, src, col);
      Value d = arith::AddIOp::create(e.b, e.loc, dst, col);
      SmallVector<Value> values;
      for (int64_t i = 0; i < per; ++i)
        values.push_back(LLVM::LoadOp::create(
            e.b, e.loc, piece,
            toPtr(arith::AddIOp::create(e.b, e.loc, s, c64(strideBytes * i))),
            vector ? 16 : 2));
      for (int64_t i = 0; i < per; ++i)
        LLVM::StoreOp::create(
            e.b, e.loc, values[i],
            toPtr(arith::AddIOp::create(e.b, e.loc, d, c64(strideBytes * i))),
            vector ? 16 : 2);
      if (first)
        e.ifThen(e.cmp(arith::CmpIPredicate::eq, c, e.index(0)),
                 [&] { first(r, dst); });
    });
  });
}

void ExchangeLowering::lower(mk::RouteRanksOp op) {
  Value top = op.getTopExperts(), ranks = op.getRanks();
  Value routeRow = op.getRouteRow();
  int64_t k = size(top, 1), n = op.getEp(), experts = op.getExperts();
  int64_t local = experts / n;
  Value tokens = op.getTokens() ? op.getTokens() : e.index(size(top, 0));
  Value none = arith::ConstantIntOp::create(e.b, e.loc, -1, 32);
  forAll(tokens, [&](Value t) {
    e.loop(n, [&](Value d) { e.store(none, ranks, {t, d}); });
    for (int64_t j = 0; j < k; ++j) {
      Value q = e.add(e.mul(t, e.index(k)), e.index(j));
      Value id = expertOf(top, q, experts);
      Value valid = e.isValid(id);
      e.store(i64Of(e.select(valid, q, e.index(-1))), routeRow, {q});
      e.ifThen(valid, [&] {
        Value d = e.div(id, e.index(local));
        e.store(i32Of(d), ranks, {t, d});
      });
    }
  });
}

void ExchangeLowering::lower(mk::PutCountsOp op) {
  // Thread d of the first CTA: this rank's row of the matrix into rank
  // d's copy (rows to each rank, then routes to each rank).
  Value rows = op.getRows(), routes = op.getRoutes(), matrix = op.getMatrix();
  Value peers = op.getPeers();
  int64_t n = size(peers, 0), local = size(routes, 0) / n;
  Value rank = rankIndex(op.getRank());
  Value block = gpu::BlockIdOp::create(e.b, e.loc, gpu::Dimension::x);
  Value tid = gpu::ThreadIdOp::create(e.b, e.loc, gpu::Dimension::x);
  Value threads = gpu::BlockDimOp::create(e.b, e.loc, gpu::Dimension::x);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, block, e.index(0)), [&] {
    e.loop(tid, e.index(n), threads, [&](Value d) {
      Value row = byteOffset(peerBase(matrix, peers, d),
                             e.mul(rank, e.index(2 * n)), 8);
      e.loop(n, [&](Value to) {
        storeAt(e.load(rows, {to}), byteOffset(row, to, 8));
        Value sum = sumI64(e.index(local), [&](Value i) {
          return e.load(routes, {e.add(e.mul(to, e.index(local)), i)});
        });
        storeAt(sum, byteOffset(row, e.add(to, e.index(n)), 8));
      });
      fenceSystem();
    });
  });
}

void ExchangeLowering::lower(mk::SignalOp op) {
  // After the CTA's stores (a CTA barrier), the grid's first thread
  // publishes: a system fence, then epoch into flags[index, rank] of every
  // rank, each a release store at system scope.
  Value flags = op.getFlags(), peers = op.getPeers();
  int64_t n = size(peers, 0);
  Value slot = e.add(e.mul(e.index(op.getIndex()), e.index(n)),
                     rankIndex(op.getRank()));
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    fenceSystem();
    e.loop(n, [&](Value d) {
      Value address = byteOffset(peerBase(flags, peers, d), slot, 8);
      LLVM::InlineAsmOp::create(
          e.b, e.loc, TypeRange{}, ValueRange{address, op.getEpoch()},
          "st.release.sys.global.u64 [$0], $1;", "l,l",
          /*has_side_effects=*/true, /*is_align_stack=*/false,
          LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
          ArrayAttr());
    });
  });
}

void ExchangeLowering::lower(mk::WaitOp op) {
  // The first thread of each CTA spins on each rank's flag (acquire loads
  // at system scope) until it holds this launch's epoch; then the CTA.
  // Bounded (status, timeout_ns): the spin also ends after timeout_ns, or
  // as soon as a CTA recorded a timeout (status[3] set), and the first CTA
  // to time out records the wait.
  Value flags = op.getFlags(), epoch = op.getEpoch(), status = op.getStatus();
  int64_t n = size(flags, 1);
  Type i1 = e.b.getI1Type(), i32 = e.b.getI32Type();
  Value tid = gpu::ThreadIdOp::create(e.b, e.loc, gpu::Dimension::x);
  Value row = byteOffset(base(flags), e.index(op.getIndex() * n), 8);
  Value words = status ? base(status) : Value();
  // The report is host memory: read afresh each time (volatile).
  auto reported = [&] {
    Value w3 = LLVM::LoadOp::create(e.b, e.loc, i32,
                                    toPtr(byteOffset(words, e.index(3), 4)), 4,
                                    /*isVolatile=*/true);
    return arith::CmpIOp::create(e.b, e.loc, arith::CmpIPredicate::ne, w3,
                                 arith::ConstantIntOp::create(e.b, e.loc, 0, 32));
  };
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, tid, e.index(0)), [&] {
    Value start = status ? NVVM::GlobalTimerOp::create(e.b, e.loc, i64())
                         : Value();
    e.loop(n, [&](Value s) {
      Value address = byteOffset(row, s, 8);
      auto spin = scf::WhileOp::create(
          e.b, e.loc, TypeRange{i1},
          ValueRange{arith::ConstantIntOp::create(e.b, e.loc, 1, 1)});
      Block *before = e.b.createBlock(&spin.getBefore());
      before->addArgument(i1, e.loc);
      {
        OpBuilder::InsertionGuard g(e.b);
        e.b.setInsertionPointToEnd(before);
        Value now = LLVM::InlineAsmOp::create(
                        e.b, e.loc, TypeRange{i64()}, ValueRange{address},
                        "ld.acquire.sys.global.u64 $0, [$1];", "=l,l",
                        /*has_side_effects=*/true, /*is_align_stack=*/false,
                        LLVM::tailcallkind::TailCallKind::None,
                        LLVM::AsmDialectAttr(), ArrayAttr())
                        .getResult(0);
        Value missing = arith::CmpIOp::create(
            e.b, e.loc, arith::CmpIPredicate::ne, now, epoch);
        Value waiting = missing;
        if (status) {
          Value elapsed = arith::SubIOp::create(
              e.b, e.loc, NVVM::GlobalTimerOp::create(e.b, e.loc, i64()),
              start);
          Value inTime = arith::CmpIOp::create(e.b, e.loc,
                                               arith::CmpIPredicate::slt,
                                               elapsed, c64(*op.getTimeoutNs()));
          Value goOn = arith::XOrIOp::create(
              e.b, e.loc, reported(),
              arith::ConstantIntOp::create(e.b, e.loc, 1, 1));
          waiting = arith::AndIOp::create(
              e.b, e.loc, waiting,
              arith::AndIOp::create(e.b, e.loc, inTime, goOn));
        }
        scf::ConditionOp::create(e.b, e.loc, waiting, ValueRange{missing});
      }
      Block *after = e.b.createBlock(&spin.getAfter());
      after->addArgument(i1, e.loc);
      {
        OpBuilder::InsertionGuard g(e.b);
        e.b.setInsertionPointToEnd(after);
        scf::YieldOp::create(e.b, e.loc,
                             ValueRange{after->getArgument(0)});
      }
      e.b.setInsertionPointAfter(spin);
      if (status) {
        // Still missing and nobody recorded yet: record this wait.
        Value first = arith::XOrIOp::create(
            e.b, e.loc, reported(),
            arith::ConstantIntOp::create(e.b, e.loc, 1, 1));
        e.ifThen(arith::AndIOp::create(e.b, e.loc, spin.getResult(0), first),
                 [&] {
                   auto put = [&](int64_t w, Value v) {
                     LLVM::StoreOp::create(
                         e.b, e.loc, v, toPtr(byteOffset(words, e.index(w), 4)),
                         4, /*isVolatile=*/true);
                   };
                   put(4, i32Of(s));
                   put(5, arith::ConstantIntOp::create(e.b, e.loc,
                                                       op.getIndex(), 32));
                   put(6, i32Of(gpu::BlockIdOp::create(e.b, e.loc,
                                                       gpu::Dimension::x)));
                   put(7, arith::ConstantIntOp::create(e.b, e.loc, 1, 32));
                   put(3, arith::ConstantIntOp::create(e.b, e.loc,
                                                       *op.getReport() + 1, 32));
                 });
      }
    });
  });
  gpu::BarrierOp::create(e.b, e.loc);
}

void ExchangeLowering::lower(mk::CheckCapacityOp op) {
  Value matrix = op.getMatrix(), status = op.getStatus();
  Value verdict = op.getVerdict();
  int64_t n = size(matrix, 0);
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    e.store(c64(0), verdict, {e.index(0)});
    // Backwards, so that the first rank over the capacity is recorded last.
    e.loop(n, [&](Value i) {
      Value d = e.sub(e.index(n - 1), i);
      Value routes = sumI64(e.index(n), [&](Value s) {
        return e.load(matrix, {s, e.add(d, e.index(n))});
      });
      Value over = arith::CmpIOp::create(e.b, e.loc, arith::CmpIPredicate::sgt,
                                         routes, c64(op.getCapacity()));
      e.ifThen(over, [&] {
        Value saturated = arith::MinSIOp::create(e.b, e.loc, routes,
                                                 c64((int64_t(1) << 31) - 1));
        e.store(i32Of(d), status, {e.index(1)});
        e.store(arith::TruncIOp::create(e.b, e.loc, e.b.getI32Type(),
                                        saturated),
                status, {e.index(2)});
        e.store(arith::ConstantIntOp::create(e.b, e.loc, 2, 32), status,
                {e.index(0)});
        e.store(c64(1), verdict, {e.index(0)});
      });
    });
  });
}

void ExchangeLowering::lower(mk::ReceivedRowsOp op) {
  Value matrix = op.getMatrix();
  int64_t n = size(matrix, 0);
  Value rank = rankIndex(op.getRank());
  Value rows = sumI64(e.index(n), [&](Value s) {
    return e.load(matrix, {s, rank});
  });
  Value over = e.cmp(arith::CmpIPredicate::ne,
                     e.toIndex(e.load(op.getVerdict(), {e.index(0)})),
                     e.index(0));
  op.getRows().replaceAllUsesWith(
      e.select(over, e.index(0), e.toIndex(rows)));
}

void ExchangeLowering::lower(mk::SendRowsOp op) {
  Value x = op.getX(), top = op.getTopExperts(), matrix = op.getMatrix();
  Value peers = op.getPeers(), sendRoute = op.getSendRoute();
  Value sendOffsets = op.getSendOffsets();
  Value recvX = op.getRecvX(), origin = op.getRecvOrigin();
  Value recvExperts = op.getRecvExperts();
  int64_t n = size(peers, 0), k = size(top, 1), h = size(x, 1);
  Value local = e.index(op.getLocalExperts());
  Value rank = rankIndex(op.getRank());
  Value over = e.cmp(arith::CmpIPredicate::ne,
                     e.toIndex(e.load(op.getVerdict(), {e.index(0)})),
                     e.index(0));
  Value rows = e.select(over, e.index(0), routedRows(sendOffsets));
  Value xBase = base(x);
  // Send row r: token t to rank d, into d's row `before + r - offsets[d]`
  // (this rank's rows follow the lower ranks' rows to d).
  auto placeOf = [&](Value r) {
    Value q = e.toIndex(e.load(sendRoute, {r}));
    Value t = e.div(q, e.index(n)), d = e.rem(q, e.index(n));
    Value before = sumI64(rank, [&](Value s) { return e.load(matrix, {s, d}); });
    Value row = e.add(e.toIndex(before),
                      e.sub(r, e.toIndex(e.load(sendOffsets, {d}))));
    return std::tuple<Value, Value, Value>{t, d, row};
  };
  auto body = [&](bool vector) {
    copyRows(
        rows, h, vector,
        [&](Value r) {
          auto [t, d, row] = placeOf(r);
          Value src = byteOffset(xBase, e.mul(t, e.index(h)), 2);
          Value dst = byteOffset(peerBase(recvX, peers, d),
                                 e.mul(row, e.index(h)), 2);
          return std::tuple<Value, Value, Value>{
              src, dst, arith::ConstantIntOp::create(e.b, e.loc, 1, 1)};
        },
        [&](Value r, Value) {
          // The row's metadata: its origin, and each route's local expert
          // on d (-1 for routes elsewhere).
          auto [t, d, row] = placeOf(r);
          Value o = arith::OrIOp::create(
              e.b, e.loc, arith::ShLIOp::create(e.b, e.loc, i64Of(rank), c64(32)),
              i64Of(t));
          storeAt(o, byteOffset(peerBase(origin, peers, d), row, 8));
          Value ids = byteOffset(peerBase(recvExperts, peers, d),
                                 e.mul(row, e.index(k)), 4);
          Value first = e.mul(d, local);
          Value weights = op.getRouterWeights();
          Value recvWeights =
              weights ? byteOffset(peerBase(op.getRecvWeights(), peers, d),
                                   e.mul(row, e.index(k)), 4)
                      : Value();
          for (int64_t j = 0; j < k; ++j) {
            Value id = e.toIndex(e.load(top, {t, e.index(j)}));
            Value mine = arith::AndIOp::create(
                e.b, e.loc, e.cmp(arith::CmpIPredicate::sge, id, first),
                e.cmp(arith::CmpIPredicate::slt, id, e.add(first, local)));
            storeAt(i32Of(e.select(mine, e.sub(id, first), e.index(-1))),
                    byteOffset(ids, e.index(j), 4));
            // The backward: the route's router weight, 0 for routes
            // elsewhere.
            if (weights)
              storeAt(e.select(mine, e.load(weights, {t, e.index(j)}),
                               e.f32(0.0f)),
                      byteOffset(recvWeights, e.index(j), 4));
          }
        });
  };
  if (h % 8)
    body(false);
  else
    e.ifThen(aligned16({x, recvX}), [&] { body(true); },
             [&] { body(false); });
}

void ExchangeLowering::lower(mk::ReturnRowsOp op) {
  Value routedY = op.getRoutedY(), rowRoute = op.getRowRoute();
  Value origin = op.getRecvOrigin(), ret = op.getRet(), peers = op.getPeers();
  int64_t k = op.getTopK(), h = size(routedY, 1);
  Value rows = routedRows(op.getOffsets());
  Value yBase = base(routedY);
  // Routed row r: its route (received row i, slot j), whether it has one,
  // its source s and the source's token t (s and t only meaningful then).
  struct Route {
    Value valid, i, j, s, t;
  };
  auto routeOf = [&](Value r) {
    Value q = e.toIndex(e.load(rowRoute, {r}));
    Value valid = e.isValid(q);
    Value safe = e.select(valid, q, e.index(0));
    Value i = e.div(safe, e.index(k)), j = e.rem(safe, e.index(k));
    Value o = e.load(origin, {i});
    Value s = e.toIndex(arith::ShRUIOp::create(e.b, e.loc, o, c64(32)));
    Value t =
        e.toIndex(arith::AndIOp::create(e.b, e.loc, o, c64(0xffffffffLL)));
    return Route{valid, i, j, e.select(valid, s, e.index(0)), t};
  };
  Value values = op.getValues();
  auto body = [&](bool vector) {
    copyRows(
        rows, h, vector,
        [&](Value r) {
          Route route = routeOf(r);
          Value src = byteOffset(yBase, e.mul(r, e.index(h)), 2);
          Value dst = byteOffset(
              peerBase(ret, peers, route.s),
              e.mul(e.add(e.mul(route.t, e.index(k)), route.j), e.index(h)),
              2);
          return std::tuple<Value, Value, Value>{src, dst, route.valid};
        },
        values ? function_ref<void(Value, Value)>([&](Value r, Value) {
          // The route's scalar (the backward's router-weight gradient).
          Route route = routeOf(r);
          storeAt(e.load(values, {route.i, route.j}),
                  byteOffset(peerBase(op.getRetValues(), peers, route.s),
                             e.add(e.mul(route.t, e.index(k)), route.j), 4));
        })
               : function_ref<void(Value, Value)>());
  };
  if (h % 8)
    body(false);
  else
    e.ifThen(aligned16({routedY, ret}), [&] { body(true); },
             [&] { body(false); });
}

void ExchangeLowering::lower(mk::FencePeersOp) { fenceSystem(); }

void ExchangeLowering::lower(mk::LaunchEpochOp op) {
  op.getEpoch().replaceAllUsesWith(e.load(op.getLaunches(), {e.index(0)}));
}

void ExchangeLowering::lower(mk::CountLaunchOp op) {
  Value launches = op.getLaunches();
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    Value count = e.load(launches, {e.index(0)});
    e.store(arith::AddIOp::create(e.b, e.loc, count, c64(1)).getResult(),
            launches, {e.index(0)});
  });
}

void ExchangeLowering::lower(mk::TakeRoutesOp op) {
  Value values = op.getValues(), routeRow = op.getRouteRow(), out = op.getOut();
  int64_t k = size(out, 1);
  Value tokens = op.getTokens() ? op.getTokens() : e.index(size(out, 0));
  // Poisoned (an exchange past the capacity): NaN for every route.
  Value poisoned =
      op.getPoison()
          ? e.cmp(arith::CmpIPredicate::ne,
                  e.toIndex(e.load(op.getPoison(), {e.index(0)})), e.index(0))
          : arith::ConstantIntOp::create(e.b, e.loc, 0, 1).getResult();
  Value nan = arith::ConstantOp::create(
      e.b, e.loc,
      e.b.getF32FloatAttr(std::numeric_limits<float>::quiet_NaN()));
  forAll(e.mul(tokens, e.index(k)), [&](Value q) {
    Value row = e.toIndex(e.load(routeRow, {q}));
    Value v = e.ifValue(
        e.isValid(row), [&] { return e.load(values, {row}); },
        [&] { return e.f32(0.0f); });
    e.store(e.select(poisoned, nan, v), out,
            {e.div(q, e.index(k)), e.rem(q, e.index(k))});
  });
}

void mok::conversion::lowerExchange(const GridBuilder &grid,
                                    Operation *op) {
  ExchangeLowering lowering(grid);
  TypeSwitch<Operation *>(op)
      .Case<mk::RouteRanksOp, mk::PutCountsOp, mk::SignalOp, mk::WaitOp,
            mk::CheckCapacityOp, mk::ReceivedRowsOp, mk::SendRowsOp,
            mk::ReturnRowsOp, mk::TakeRoutesOp, mk::LaunchEpochOp,
            mk::CountLaunchOp, mk::FencePeersOp>(
          [&](auto o) { lowering.lower(o); });
}
