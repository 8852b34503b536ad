// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The routing plan's steps (mk.fill, mk.count_routes, mk.scan_chunks,
// mk.pad_offsets, mk.assign_rows): per-chunk counts, a per-expert scan,
// padded offsets and the deterministic row assignment, on the device. In
// kernels of whole warps each step works a warp at a time (match.sync
// groups, shuffle scans); otherwise a thread at a time. Either way the
// integers are the same.
//
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

namespace {

class RoutingPlanLowering : GridBuilder {
public:
  explicit RoutingPlanLowering(const GridBuilder &grid) : GridBuilder(grid) {}

  void lower(mk::FillOp op);
  void lower(mk::CheckRoutesOp op);
  void lower(mk::CountRoutesOp op);
  void lower(mk::ScanChunksOp op);
  void lower(mk::PadOffsetsOp op);
  void lower(mk::AssignRowsOp op);

private:
  void countRoutesByWarps(mk::CountRoutesOp op);
  void scanChunksByWarps(mk::ScanChunksOp op);
  void padOffsetsByWarp(mk::PadOffsetsOp op);
  void assignRowsByWarps(mk::AssignRowsOp op);

  /// The routes of one 32-route round of a chunk, a route a lane:
  /// route q = c * chunk + round * 32 + lane, `inside` whether the chunk
  /// (and the routes) hold it, its expert (-1: none or outside), the
  /// lanes of the warp whose routes go to the same expert (match.sync) and
  /// those of them on lower lanes.
  struct RouteRound {
    Value q, inside, expert, peers, below;
  };
  /// Whether this lane is the first of its group and the group's expert
  /// valid (`valid`, or computed here when null): the lane that adds the
  /// group's size to the chunk's count of that expert, cc[c, expert]
  /// (addGroupSize, after a warp barrier that orders the count's earlier
  /// stores).
  Value groupFirst(const RouteRound &r, Value valid = Value());
  void addGroupSize(Value first, const RouteRound &r, Value cc, Value c);
  RouteRound routeRound(Value top, Value c, Value round, Value lane,
                        int64_t chunk, Value routes, int64_t experts);
  /// The routes of `top_experts [T, k]`: T * k, or with `tokens` (a
  /// kernel for any T) tokens * k (index).
  Value routesOf(Value top, Value tokens) {
    if (tokens)
      return e.mul(tokens, e.index(size(top, 1)));
    return e.index(size(top, 0) * size(top, 1));
  }
  /// for q over chunk `c`'s routes [c * chunk, min((c + 1) * chunk,
  /// routes)), in order, on this thread.
  void forChunk(Value c, int64_t chunk, Value routes,
                function_ref<void(Value)> body) {
    Value first = e.mul(c, e.index(chunk));
    Value end = e.add(first, e.index(chunk));
    std::optional<int64_t> known = getConstantIntValue(routes);
    if (!known || *known % chunk)
      end = arith::MinSIOp::create(e.b, e.loc, end, routes);
    e.loop(first, end, body);
  }
};

} // namespace

void RoutingPlanLowering::lower(mk::FillOp op) {
  Value v = arith::ConstantIntOp::create(e.b, e.loc, op.getValue(), 64);
  Value buffer = op.getBuffer();
  forAll(e.index(size(buffer, 0)), [&](Value i) { e.store(v, buffer, {i}); });
}

void RoutingPlanLowering::lower(mk::CheckRoutesOp op) {
  Value top = op.getTopExperts(), status = op.getStatus();
  int64_t k = size(top, 1);
  forAll(routesOf(top, op.getTokens()), [&](Value q) {
    Value id = e.toIndex(e.load(top, {e.div(q, e.index(k)), e.rem(q, e.index(k))}));
    // bad = id != -1 and id outside [0, E): unsigned, id >= E covers the
    // negative ids too.
    Value bad = arith::AndIOp::create(
        e.b, e.loc, e.cmp(arith::CmpIPredicate::ne, id, e.index(-1)),
        e.cmp(arith::CmpIPredicate::uge, id, e.index(op.getExperts())));
    // Plain stores: any bad route's words will do (each word one store).
    e.ifThen(bad, [&] {
      auto word = [&](Value v) {
        return arith::IndexCastOp::create(e.b, e.loc, e.b.getI32Type(), v)
            .getResult();
      };
      e.store(word(id), status, {e.index(1)});
      e.store(word(q), status, {e.index(2)});
      e.store(arith::ConstantIntOp::create(e.b, e.loc, 1, 32), status,
              {e.index(0)});
    });
  });
}

void RoutingPlanLowering::lower(mk::CountRoutesOp op) {
  if (wholeWarps())
    return countRoutesByWarps(op);
  Value top = op.getTopExperts(), cc = op.getChunkCounts();
  int64_t experts = size(cc, 1), chunk = op.getChunk();
  Value routes = routesOf(top, op.getTokens());
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  Value one = arith::ConstantIntOp::create(e.b, e.loc, 1, 64);
  // One thread a chunk: zero its row, then count its routes in order.
  forAllSpread(e.index(size(cc, 0)), [&](Value c) {
    e.loop(e.index(0), e.index(experts), [&](Value ex) {
      e.store(zero, cc, {c, ex});
    });
    forChunk(c, chunk, routes, [&](Value q) {
      Value ex = expertOf(top, q, experts);
      e.ifThen(e.isValid(ex), [&] {
        Value n = e.load(cc, {c, ex});
        e.store(arith::AddIOp::create(e.b, e.loc, n, one), cc, {c, ex});
      });
    });
  });
}

RoutingPlanLowering::RouteRound
RoutingPlanLowering::routeRound(Value top, Value c, Value round, Value lane,
                                int64_t chunk, Value routes,
                                int64_t experts) {
  Value j = e.add(e.mul(round, e.index(32)), lane);
  Value q = e.add(e.mul(c, e.index(chunk)), j);
  Value inside = arith::AndIOp::create(
      e.b, e.loc, e.cmp(arith::CmpIPredicate::slt, j, e.index(chunk)),
      e.cmp(arith::CmpIPredicate::slt, q, routes));
  // Lanes past the chunk read the last route (the first, when there are
  // none: an expert-parallel rank may receive no rows) and drop it.
  Value read = arith::MaxSIOp::create(
      e.b, e.loc,
      arith::MinSIOp::create(e.b, e.loc, q, e.sub(routes, e.index(1))),
      e.index(0));
  Value ex = e.select(inside, expertOf(top, read, experts), e.index(-1));
  Value peers = NVVM::MatchSyncOp::create(
      e.b, e.loc, e.b.getI32Type(),
      arith::ConstantIntOp::create(e.b, e.loc, -1, 32),
      arith::IndexCastOp::create(e.b, e.loc, e.b.getI32Type(), ex),
      NVVM::MatchSyncKind::any);
  Value below = arith::AndIOp::create(
      e.b, e.loc, peers,
      NVVM::LaneMaskLtOp::create(e.b, e.loc, e.b.getI32Type()));
  return {q, inside, ex, peers, below};
}

Value RoutingPlanLowering::groupFirst(const RouteRound &r, Value valid) {
  Value noneBelow = e.cmp(arith::CmpIPredicate::eq, r.below,
                          arith::ConstantIntOp::create(e.b, e.loc, 0, 32));
  if (!valid)
    valid = e.isValid(r.expert);
  return arith::AndIOp::create(e.b, e.loc, valid, noneBelow);
}

void RoutingPlanLowering::addGroupSize(Value first, const RouteRound &r,
                                       Value cc, Value c) {
  e.ifThen(first, [&] {
    Value n =
        arith::ExtUIOp::create(e.b, e.loc, e.b.getI64Type(), popc(r.peers));
    e.store(arith::AddIOp::create(e.b, e.loc, e.load(cc, {c, r.expert}), n), cc,
            {c, r.expert});
  });
}

/// One warp a chunk, 32 routes a round: match.sync groups the lanes whose
/// routes go to the same expert, and the group's first lane adds its size
/// to the chunk's counter. The counters hold the same integers as one
/// thread walking the chunk; only the order of the additions differs. On
/// the H200 one thread a chunk took 13 us of qwen3-30b's plan (32 routes
/// a thread, each a read-modify-write in memory after the last).
void RoutingPlanLowering::countRoutesByWarps(mk::CountRoutesOp op) {
  Value top = op.getTopExperts(), cc = op.getChunkCounts();
  int64_t experts = size(cc, 1), chunk = op.getChunk();
  Value routes = routesOf(top, op.getTokens());
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  forAllWarps(e.index(size(cc, 0)), [&](Value c, Value lane) {
    e.loop(lane, e.index(experts), e.index(32), [&](Value ex) {
      e.store(zero, cc, {c, ex});
    });
    e.loop((chunk + 31) / 32, [&](Value round) {
      RouteRound r = routeRound(top, c, round, lane, chunk, routes, experts);
      Value first = groupFirst(r);
      // The row's zeros and the last round's additions, stored by other
      // lanes, are visible after the warp barrier.
      syncWarp();
      addGroupSize(first, r, cc, c);
    });
  });
}

void RoutingPlanLowering::lower(mk::ScanChunksOp op) {
  if (wholeWarps())
    return scanChunksByWarps(op);
  Value cc = op.getChunkCounts(), counts = op.getCounts();
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  // One thread an expert: exclusive prefix over the chunks, then the total.
  forAllSpread(e.index(size(cc, 1)), [&](Value ex) {
    Value total = e.fold(
        e.index(0), e.index(size(cc, 0)), zero, [&](Value c, Value running) {
          Value n = e.load(cc, {c, ex});
          e.store(running, cc, {c, ex});
          return arith::AddIOp::create(e.b, e.loc, running, n).getResult();
        });
    e.store(total, counts, {ex});
  });
}

/// Chunks a lane of the warp scan reads at once, at most.
static constexpr int64_t kScanGroup = 32;

/// The scan with one warp an expert (whole warps: a known block size that
/// is a multiple of 32): lane l takes chunks [l * per, (l + 1) * per), sums
/// them, an inclusive shuffle scan over the lanes gives each lane its
/// start, and a second pass writes the exclusive prefixes. The same sums
/// as the one-thread scan (integers). One thread walking 1024 chunks took
/// 45 us on the H200 (qwen3-30b); one warp over 2048 chunks, a chunk at a
/// time, 34 us (and 32 us on dsv3-shard, where one thread had 512 chunks
/// in 23 us); in groups of 8 loads, 21-22 us on both. A lane now issues up
/// to 32 loads at once, and with a single group (per <= 32) the second
/// pass reuses the values of the first.
void RoutingPlanLowering::scanChunksByWarps(mk::ScanChunksOp op) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value cc = op.getChunkCounts(), counts = op.getCounts();
  int64_t chunks = size(cc, 0), experts = size(cc, 1);
  int64_t per = (chunks + 31) / 32;
  const int64_t group = std::min(per, kScanGroup);
  const int64_t groups = (per + group - 1) / group;
  Value zero = arith::ConstantIntOp::create(b, loc, 0, 64);
  forAllWarps(e.index(experts), [&](Value ex, Value lane) {
    Value first = arith::MinSIOp::create(b, loc, e.mul(lane, e.index(per)),
                                         e.index(chunks));
    Value end = arith::MinSIOp::create(b, loc, e.add(first, e.index(per)),
                                       e.index(chunks));
    // A group of a lane's chunks, all its loads issued before they are
    // used (unrolled; past `end`, chunk chunks - 1 is read and dropped).
    struct Group {
      SmallVector<Value> inside, at, values;
    };
    auto groupLoads = [&](Value g) {
      Group out;
      for (int64_t j = 0; j < group; ++j) {
        Value c = e.add(first, e.add(e.mul(g, e.index(group)), e.index(j)));
        out.inside.push_back(e.cmp(arith::CmpIPredicate::slt, c, end));
        out.at.push_back(c);
        Value read = arith::MinSIOp::create(b, loc, c, e.index(chunks - 1));
        out.values.push_back(e.load(cc, {read, ex}));
      }
      return out;
    };
    auto addGroup = [&](const Group &grp, Value acc, bool store) {
      for (int64_t j = 0; j < group; ++j) {
        if (store) {
          Value here = acc;
          e.ifThen(grp.inside[j], [&] { e.store(here, cc, {grp.at[j], ex}); });
        }
        acc = arith::AddIOp::create(
            b, loc, acc, e.select(grp.inside[j], grp.values[j], zero));
      }
      return acc;
    };
    std::optional<Group> only;
    Value local;
    if (groups == 1) {
      only = groupLoads(e.index(0));
      local = addGroup(*only, zero, /*store=*/false);
    } else {
      local =
          e.fold(e.index(0), e.index(groups), zero, [&](Value g, Value acc) {
            return addGroup(groupLoads(g), acc, /*store=*/false);
          });
    }
    Value inclusive = warpInclusiveSum(local, lane);
    Value start = arith::SubIOp::create(b, loc, inclusive, local);
    if (only)
      addGroup(*only, start, /*store=*/true);
    else
      e.fold(e.index(0), e.index(groups), start, [&](Value g, Value running) {
        return addGroup(groupLoads(g), running, /*store=*/true);
      });
    Value total = shuffle64(inclusive, 31, gpu::ShuffleMode::IDX);
    e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)),
             [&] { e.store(total, counts, {ex}); });
  });
}

void RoutingPlanLowering::lower(mk::PadOffsetsOp op) {
  if (wholeWarps())
    return padOffsetsByWarp(op);
  Value counts = op.getCounts(), offsets = op.getOffsets();
  int64_t experts = size(counts, 0), padding = op.getPadding();
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, globalId, e.index(0)), [&] {
    Value pad = e.index(padding);
    Value total = e.fold(
        e.index(0), e.index(experts), e.index(0), [&](Value ex, Value start) {
          e.store(i64Of(start), offsets, {ex});
          Value c = e.toIndex(e.load(counts, {ex}));
          Value padded = e.mul(e.div(e.add(c, e.index(padding - 1)), pad), pad);
          return e.add(start, padded);
        });
    e.store(i64Of(total), offsets, {e.index(experts)});
  });
}

void RoutingPlanLowering::lower(mk::AssignRowsOp op) {
  if (wholeWarps())
    return assignRowsByWarps(op);
  Value top = op.getTopExperts(), offsets = op.getOffsets(),
        cc = op.getChunkCounts();
  Value routeRow = op.getRouteRow(), rowRoute = op.getRowRoute(),
        rowExpert = op.getRowExpert();
  int64_t experts = size(offsets, 0) - 1, chunk = op.getChunk();
  Value routes = op.getTokens() ? routesOf(top, op.getTokens())
                                : e.index(size(routeRow, 0));
  Value none = arith::ConstantIntOp::create(e.b, e.loc, -1, 64);
  Value one = arith::ConstantIntOp::create(e.b, e.loc, 1, 64);
  // One thread a chunk walks its routes in order; chunk_counts holds the
  // rank of the chunk's next route to each expert.
  forAllSpread(e.index(size(cc, 0)), [&](Value c) {
    forChunk(c, chunk, routes, [&](Value q) {
      Value ex = expertOf(top, q, experts);
      e.ifThen(
          e.isValid(ex),
          [&] {
            Value rank = e.load(cc, {c, ex});
            e.store(arith::AddIOp::create(e.b, e.loc, rank, one), cc, {c, ex});
            Value row =
                arith::AddIOp::create(e.b, e.loc, e.load(offsets, {ex}), rank);
            e.store(row, routeRow, {q});
            e.store(i64Of(q), rowRoute, {e.toIndex(row)});
          },
          [&] { e.store(none, routeRow, {q}); });
    });
  });
  // One thread an expert labels its segment, padding rows included.
  forAllSpread(e.index(experts), [&](Value ex) {
    Value start = e.toIndex(e.load(offsets, {ex}));
    Value end = e.toIndex(e.load(offsets, {e.add(ex, e.index(1))}));
    e.loop(start, end, [&](Value r) { e.store(i64Of(ex), rowExpert, {r}); });
  });
}

/// The first warp of the grid: lane l takes experts [l * per, (l + 1) *
/// per), loads their counts at once, and a shuffle scan over the lanes of
/// their padded sizes gives each lane its first offset. One thread walking
/// the 128 experts of qwen3-30b took 11 us on the H200 (a load after each
/// store).
void RoutingPlanLowering::padOffsetsByWarp(mk::PadOffsetsOp op) {
  Value counts = op.getCounts(), offsets = op.getOffsets();
  int64_t experts = size(counts, 0), padding = op.getPadding();
  int64_t per = (experts + 31) / 32;
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  e.ifThen(e.cmp(arith::CmpIPredicate::slt, globalId, e.index(32)), [&] {
    Value lane = globalId;
    Value pad = e.index(padding);
    SmallVector<Value> inside, sizes;
    Value local = zero;
    for (int64_t j = 0; j < per; ++j) {
      Value ex = e.add(e.mul(lane, e.index(per)), e.index(j));
      inside.push_back(e.cmp(arith::CmpIPredicate::slt, ex, e.index(experts)));
      Value read = arith::MinSIOp::create(e.b, e.loc, ex, e.index(experts - 1));
      Value c = e.toIndex(e.load(counts, {read}));
      Value padded = e.mul(e.div(e.add(c, e.index(padding - 1)), pad), pad);
      sizes.push_back(e.select(inside.back(), i64Of(padded), zero));
      local = arith::AddIOp::create(e.b, e.loc, local, sizes.back());
    }
    Value inclusive = warpInclusiveSum(local, lane);
    Value running = arith::SubIOp::create(e.b, e.loc, inclusive, local);
    for (int64_t j = 0; j < per; ++j) {
      Value ex = e.add(e.mul(lane, e.index(per)), e.index(j));
      Value here = running;
      e.ifThen(inside[j], [&] { e.store(here, offsets, {ex}); });
      running = arith::AddIOp::create(e.b, e.loc, running, sizes[j]);
    }
    e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(31)),
             [&] { e.store(inclusive, offsets, {e.index(experts)}); });
  });
}

/// One warp a chunk, 32 routes a round: a route's rank in its expert is
/// the chunk's scanned count, plus the routes of its match.sync group on
/// lower lanes; with several rounds the group's first lane then moves the
/// chunk's count on. The same rows as one thread walking the chunk (route
/// order within each expert). One warp an expert labels its segment.
/// On the H200 one thread a chunk took 27 us of qwen3-30b's plan.
void RoutingPlanLowering::assignRowsByWarps(mk::AssignRowsOp op) {
  Value top = op.getTopExperts(), offsets = op.getOffsets(),
        cc = op.getChunkCounts();
  Value routeRow = op.getRouteRow(), rowRoute = op.getRowRoute(),
        rowExpert = op.getRowExpert();
  int64_t experts = size(offsets, 0) - 1, chunk = op.getChunk();
  Value routes = op.getTokens() ? routesOf(top, op.getTokens())
                                : e.index(size(routeRow, 0));
  int64_t rounds = (chunk + 31) / 32;
  Type i32 = e.b.getI32Type(), i64 = e.b.getI64Type();
  Value none = arith::ConstantIntOp::create(e.b, e.loc, -1, 64);
  forAllWarps(e.index(size(cc, 0)), [&](Value c, Value lane) {
    e.loop(rounds, [&](Value round) {
      RouteRound r = routeRound(top, c, round, lane, chunk, routes, experts);
      Value valid = e.isValid(r.expert);
      Value rank = arith::ExtUIOp::create(e.b, e.loc, i64, popc(r.below));
      e.ifThen(r.inside, [&] {
        e.ifThen(
            valid,
            [&] {
              Value row = arith::AddIOp::create(
                  e.b, e.loc,
                  arith::AddIOp::create(e.b, e.loc, e.load(offsets, {r.expert}),
                                        e.load(cc, {c, r.expert})),
                  rank);
              e.store(row, routeRow, {r.q});
              e.store(i64Of(r.q), rowRoute, {e.toIndex(row)});
            },
            [&] { e.store(none, routeRow, {r.q}); });
      });
      if (rounds == 1)
        return;
      // Every lane has read the chunk's count before the group's first
      // lane moves it on for the next round, and the next round reads it
      // after.
      syncWarp();
      addGroupSize(groupFirst(r, valid), r, cc, c);
      syncWarp();
    });
  });
  forAllWarps(e.index(experts), [&](Value ex, Value lane) {
    Value start = e.toIndex(e.load(offsets, {ex}));
    Value end = e.toIndex(e.load(offsets, {e.add(ex, e.index(1))}));
    e.loop(e.add(start, lane), end, e.index(32),
           [&](Value row) { e.store(i64Of(ex), rowExpert, {row}); });
  });
}

void mok::conversion::lowerRoutingPlanStep(const GridBuilder &grid,
                                           Operation *op) {
  RoutingPlanLowering plan(grid);
  TypeSwitch<Operation *>(op)
      .Case<mk::FillOp, mk::CheckRoutesOp, mk::CountRoutesOp,
            mk::ScanChunksOp, mk::PadOffsetsOp, mk::AssignRowsOp>(
          [&](auto typed) { plan.lower(typed); });
}
