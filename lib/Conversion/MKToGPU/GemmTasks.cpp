// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The tensor-core GEMM's task loops (GemmPipeline.h): the persistent loop
// over a phase's tasks (m-tile, n-tile; grouped raster) run by the consumer
// warpgroups, with the loading thread's prologue, the MMA layer and the
// shared-memory epilogue; with warp roles the producer warpgroup's loop
// over the same tasks; the tasks themselves (tile origin, tensor maps,
// K groups, the gathered rows, cluster pairs).
//
#include "GemmPipeline.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

using namespace mlir;
using namespace mok::mk::schedule;

namespace mok::conversion::gemm {

namespace {
/// Warp roles: the consumers' register decrease before the producer
/// warpgroup's increase.
constexpr int32_t kRegisterBarrier = 2;
} // namespace

void GemmEmitter::emit(const GemmPhase &p) {
  if (roles.producer)
    return emitWarpSpecialized(p);
  OpBuilder &b = e.b;
  Location loc = e.loc;
  SmallVector<Value> state = {iteration};
  state.append(carried);
  Value inGroup =
      e.cmp(arith::CmpIPredicate::ult, tid, e.index(kThreads * p.consumers()));
  SmallVector<Type> types;
  for (Value v : state)
    types.push_back(v.getType());
  auto ifOp = scf::IfOp::create(b, loc, types, inGroup,
                                /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.elseBlock());
    scf::YieldOp::create(b, loc, state);
    b.setInsertionPointToStart(ifOp.thenBlock());
    tasks(p);
    state = {iteration};
    state.append(carried);
    scf::YieldOp::create(b, loc, state);
  }
  iteration = ifOp.getResult(0);
  ValueRange rest = ifOp.getResults().drop_front();
  carried.assign(rest.begin(), rest.end());
}

/// Warp roles: the consumer warpgroups run the task loop (MMAs and the
/// epilogue from registers), the producer thread the same tasks' loads;
/// the producer warpgroup's other threads go on (with `registers`, to
/// named barrier 2). With `registers`, each side moves to its share for the
/// GEMM and back to the even share after it: the consumers give theirs back
/// first, and the whole producer warpgroup waits for that on named barrier
/// 2 before it increases (an idle warp's early increase took registers the
/// consumers' increase needed: a deadlock on the H200). Unless a grid
/// barrier follows, a CTA barrier ends the GEMM: otherwise the consumers'
/// increase for a next GEMM could take the registers the producer
/// warpgroup's increase waits for, which then waits for the end of a GEMM
/// whose loads it has yet to issue (also seen on the H200). (Keeping the
/// split over a run of GEMMs instead made ptxas ignore setmaxnreg and
/// spill.)
void GemmEmitter::emitWarpSpecialized(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  assert(p.consumers() == roles.consumers &&
         "every GEMM of the kernel has the kernel's consumers");
  SmallVector<Value> state = {iteration};
  state.append(carried);
  SmallVector<Type> types;
  for (Value v : state)
    types.push_back(v.getType());
  Value isConsumer =
      e.cmp(arith::CmpIPredicate::ult, tid, e.index(kThreads * p.consumers()));
  auto ifOp = scf::IfOp::create(b, loc, types, isConsumer,
                                /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    if (roles.registers)
      setRegisters(roles.registers->first, /*increase=*/true);
    tasks(p);
    if (roles.registers) {
      // The warps of a warpgroup synchronize between two setmaxnreg (PTX
      // ISA); the task loop has no barrier of its own with a producer.
      syncWarpgroup(p.consumers());
      setRegisters(roles.evenRegisters, /*increase=*/false);
      // Given back: the producer warpgroup may take its share back.
      NVVM::BarrierArriveOp::create(b, loc, i32(kRegisterBarrier),
                                    i32(kThreads * (p.consumers() + 1)));
    }
    SmallVector<Value> next = {iteration};
    next.append(carried);
    scf::YieldOp::create(b, loc, next);

    // The producer branch starts from the same count.
    iteration = state[0];
    carried.assign(state.begin() + 1, state.end());
    b.setInsertionPointToStart(ifOp.elseBlock());
    if (roles.registers)
      setRegisters(roles.registers->second, /*increase=*/false);
    // (Gathered A: every thread of the warpgroup copies rows.)
    Value isProducer =
        p.gatherRows ? arith::ConstantIntOp::create(b, loc, 1, 1).getResult()
                     : e.cmp(arith::CmpIPredicate::eq, tid,
                             e.index(kThreads * p.consumers()));
    auto producer =
        scf::IfOp::create(b, loc, TypeRange{iteration.getType()}, isProducer,
                          /*withElseRegion=*/true);
    Value before = iteration;
    {
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToStart(producer.elseBlock());
      scf::YieldOp::create(b, loc, before);
      b.setInsertionPointToStart(producer.thenBlock());
      producerTasks(p);
      scf::YieldOp::create(b, loc, iteration);
    }
    if (roles.registers) {
      // Every warp of the warpgroup waits for the consumers' decrease: an
      // idle warp's increase could otherwise take registers from the
      // pool before the producer warp's decrease, leaving too few for the
      // consumers' increase (a deadlock, seen on the H200).
      NVVM::BarrierOp::create(b, loc, Type(), i32(kRegisterBarrier),
                              i32(kThreads * (p.consumers() + 1)),
                              NVVM::BarrierReductionAttr(), Value());
      setRegisters(roles.evenRegisters, /*increase=*/true);
    }
    // The producer thread (with a gathered A, every thread of the
    // warpgroup) counted the same k-tiles as the consumers. The others keep
    // the count from before this GEMM: a later gathered GEMM would start
    // them from it, so convert-mk-to-gpu allows a gathered A with a
    // producer in the kernel's first tensor-core GEMM only.
    SmallVector<Value> same = {producer.getResult(0)};
    same.append(state.begin() + 1, state.end());
    scf::YieldOp::create(b, loc, same);
  }
  iteration = ifOp.getResult(0);
  ValueRange rest = ifOp.getResults().drop_front();
  carried.assign(rest.begin(), rest.end());
  // Unless a grid barrier follows, every warpgroup is back to the even
  // share before anything else runs (another GEMM's moves: see above).
  if (roles.registers && !p.gridBarrierFollows)
    gpu::BarrierOp::create(b, loc);
}

Value GemmEmitter::mTiles(const GemmPhase &p) {
  return e.div(e.add(p.rows, e.index(p.tileM - 1)), e.index(p.tileM));
}

Value GemmEmitter::taskCount(const GemmPhase &p) {
  return e.mul(mTiles(p), e.index(p.nTiles()));
}

std::pair<Value, Value> GemmEmitter::tileOf(const GemmPhase &p, Value task) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t nTiles = p.nTiles();
  Value mTiles = this->mTiles(p);
  // Grouped raster (kGroupM m-tiles at a time, n-tiles outer within the
  // group): the CTAs running at once share each weight tile across the
  // group's m-tiles (a group of 16 is about one expert's rows) and the
  // group's A tiles stay in L2 across n-tiles. Row-major order re-read
  // every expert's weights from HBM once per m-tile.
  Value groupSize = e.index(kGroupM * nTiles);
  Value group = e.div(task, groupSize);
  Value inGroup = e.rem(task, groupSize);
  Value firstM = e.mul(group, e.index(kGroupM));
  Value groupRows = arith::MinSIOp::create(
      b, loc, e.index(kGroupM), e.sub(mTiles, firstM)); // the last is short
  Value mTile = e.add(firstM, e.rem(inGroup, groupRows));
  Value nTile = e.div(inGroup, groupRows);
  return {e.mul(mTile, e.index(p.tileM)), e.mul(nTile, e.index(p.tileN))};
}

Task GemmEmitter::taskAt(const GemmPhase &p, Value task) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  auto [m0, n0] = tileOf(p, task);
  // Grouped: the m-tile's expert picks the B maps' slots.
  Value expert = p.expertOf ? p.expertOf(m0) : e.index(0);
  // M-major A in 64-row boxes.
  int64_t boxA = p.transposeA ? kTileM : p.tileM;
  // (Clusters load B in 128-row halves, through maps of 128-row boxes;
  // N-major B in 64 x 64 boxes.)
  int64_t boxB = p.transposeB ? kTileK : clusterEmpty ? kTileN : p.tileN;
  Task t{m0,
         n0,
         p.expertOf ? expert : Value(),
         mapAt(e.index(p.a), boxA, p.fp8),
         mapAt(e.add(e.index(p.b0), expert), boxB, p.fp8),
         p.b1 ? mapAt(e.add(e.index(*p.b1), expert), boxB, p.fp8) : Value(),
         p.a2 ? mapAt(e.index(*p.a2), p.tileM, p.fp8) : Value(),
         p.b2 ? mapAt(e.add(e.index(*p.b2), expert), boxB, p.fp8) : Value(),
         {},
         {},
         {},
         {},
         {},
         {},
         {},
         {}};
  // K in groups: the m-tile's group, its K rows and A's column.
  if (p.kOffsets) {
    Value group = e.div(m0, e.index(p.groupRows));
    Value begin = e.toIndex(e.load(p.kOffsets, {group}));
    Value end = e.toIndex(e.load(p.kOffsets, {e.add(group, e.index(1))}));
    t.kBase = begin;
    Value rows = e.sub(end, begin);
    int64_t tileK = p.tileK(); // (FP8: 128 routed rows, a scale block)
    if (p.kCounts) // whole k-tiles over the counted rows
      rows = arith::MinSIOp::create(
          b, loc, rows,
          e.mul(e.div(e.add(e.toIndex(e.load(p.kCounts, {group})),
                            e.index(tileK - 1)),
                      e.index(tileK)),
                e.index(tileK)));
    t.kTiles = e.div(rows, e.index(tileK));
    t.aCol = e.sub(m0, e.mul(group, e.index(p.groupRows)));
  } else if (p.kRows) {
    t.kTiles =
        e.div(e.add(p.kRows, e.index(kTileK - 1)), e.index(kTileK));
  }
  // Gathered A: the consumer threads copy the rows (with a producer, the
  // producer warpgroup does: producerTasks).
  if (p.gatherRows && !roles.producer)
    planGather(p, t, tid, p.consumers() * kThreads);
  return t;
}

void GemmEmitter::planGather(const GemmPhase &p, Task &t, Value index,
                             int64_t threads) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // Thread i of the `threads` copies chunk c = i % 8 of rows i / 8 + j *
  // (threads / 8): a warp covers four whole 128-byte rows (coalesced). In
  // the 128-byte-swizzled box (1024-aligned), chunk c of row r lies at
  // r * 128 + (c ^ (r % 8)) * 16, where TMA would have put it.
  Type i64 = b.getI64Type();
  int64_t rowsPerPass = threads / kGatherChunks;
  assert(threads % kGatherChunks == 0 && p.tileM % rowsPerPass == 0 &&
         "whole rows a pass, whole passes a tile");
  Value chunk = e.rem(index, e.index(kGatherChunks));
  for (int64_t i = 0; i < p.tileM / rowsPerPass; ++i) {
    Value r =
        e.add(e.div(index, e.index(kGatherChunks)), e.index(i * rowsPerPass));
    Value q = e.toIndex(e.load(p.gatherRows, {e.add(t.m0, r)}));
    // A padding row (no route) copies 0 bytes from row 0: zeros.
    Value valid = e.cmp(arith::CmpIPredicate::sge, q, e.index(0));
    Value src = e.select(valid, e.div(q, e.index(p.gatherTopK)), e.index(0));
    Value offset =
        e.mul(e.add(e.mul(src, e.index(p.k)),
                    e.mul(chunk, e.index(kGatherChunkBytes / kBf16))),
              e.index(kBf16));
    t.gatherSrc.push_back(
        arith::AddIOp::create(b, loc, p.gatherSource,
                              arith::IndexCastOp::create(b, loc, i64, offset)));
    t.gatherBytes.push_back(arith::SelectOp::create(
        b, loc, valid, arith::ConstantIntOp::create(b, loc, 16, 32),
        arith::ConstantIntOp::create(b, loc, 0, 32)));
    Value swizzled = arith::XOrIOp::create(b, loc, chunk, e.rem(r, e.index(8)));
    t.gatherDst.push_back(e.add(e.mul(r, e.index(kTileK * kBf16)),
                                e.mul(swizzled, e.index(kGatherChunkBytes))));
  }
}

Task GemmEmitter::taskOfRound(const GemmPhase &p, Value first, Value tasks) {
  if (!clusterEmpty)
    return taskAt(p, first);
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // The pair's tasks first and first + 1; rank r runs first + r, or, past
  // the last task, first again without storing it.
  auto orFirst = [&](Value task) {
    return e.select(e.cmp(arith::CmpIPredicate::slt, task, tasks), task, first);
  };
  Value mine = e.add(first, rank);
  Value other = e.add(first, e.sub(e.index(1), rank));
  Task t = taskAt(p, orFirst(mine));
  t.live = e.cmp(arith::CmpIPredicate::slt, mine, tasks);
  // One expert and one n-tile: the same B boxes.
  auto [m0, n0] = tileOf(p, orFirst(other));
  t.multicast = e.cmp(arith::CmpIPredicate::eq, n0, t.n0);
  if (p.expertOf)
    t.multicast = arith::AndIOp::create(
        b, loc, t.multicast,
        e.cmp(arith::CmpIPredicate::eq, p.expertOf(m0), p.expertOf(t.m0)));
  return t;
}

void GemmEmitter::producerTasks(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t kTiles = p.k / p.tileK();
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value grid = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  // Gathered A: the warpgroup's threads copy the rows, its first thread
  // issues the TMA loads.
  Value rank = e.sub(tid, e.index(kThreads * p.consumers()));
  Value isLoader = e.cmp(arith::CmpIPredicate::eq, rank, e.index(0));
  auto taskLoop = scf::ForOp::create(b, loc, bid, taskCount(p), grid,
                                     ValueRange{iteration});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(taskLoop.getBody());
    Value it = taskLoop.getRegionIterArgs()[0];
    Task t = taskAt(p, taskLoop.getInductionVar());
    if (p.gatherRows)
      planGather(p, t, rank, kThreads);
    // (K in groups or the call's rows: the task's own k-tile count, which
    // may be 0.)
    Value count = t.kTiles ? t.kTiles : e.index(kTiles);
    e.loop(count, [&](Value kt) {
      Value g = e.add(it, kt);
      // k-tile g reuses the stage s of k-tile g - kStages: wait until the
      // consumers released it. They release every k-tile once (see
      // GemmEmitter::release), so that takes c = g / kStages completions
      // of the stage's empty barrier; the c-th completes its phase c - 1,
      // of parity (c - 1) & 1. With c = 0 (the first round) the parity is
      // 1, which a fresh barrier (in its phase 0) reports complete at once.
      Value s = e.rem(g, e.index(kStages));
      Value c = e.div(g, e.index(kStages));
      Value parity =
          e.cmp(arith::CmpIPredicate::eq, e.rem(c, e.index(2)), e.index(0));
      nvgpu::MBarrierTryWaitParityOp::create(b, loc, emptyBarriers, parity,
                                             e.index(10000000), s);
      if (!p.gatherRows)
        return load(p, g, kt, t);
      // Gathered A: each thread's copies complete on the stage's gather
      // barrier (cp.async.mbarrier.arrive.noinc: the arrival, when the
      // copies land, is one of the kThreads the barrier expects), which
      // the consumers wait on besides the full barrier (B's bytes, the
      // loader's arrive.expect_tx). An arrival that raised the full
      // barrier's pending count instead (without .noinc) is what
      // compute-sanitizer's synccheck reports as a barrier overflow.
      loadGatheredRows(p, g, kt, t);
      Value gathered = nvgpu::MBarrierGetOp::create(b, loc, b.getI32Type(),
                                                    gatherBarriers, s);
      NVVM::CpAsyncMBarrierArriveOp::create(
          b, loc,
          LLVM::IntToPtrOp::create(
              b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3), gathered,
              LLVM::DereferenceableAttr()),
          /*noinc=*/true);
      e.ifThen(isLoader, [&] { load(p, g, kt, t); });
    });
    scf::YieldOp::create(b, loc, ValueRange{e.add(it, count)});
  }
  iteration = taskLoop.getResult(0);
}

/// The consumer warpgroups' task loop; advances `iteration` (and
/// `carried`).
void GemmEmitter::tasks(const GemmPhase &p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *ctx = b.getContext();
  assert(p.k % p.tileK() == 0 && "k must be a multiple of the k-tile");
  int64_t kTiles = p.k / p.tileK();
  // (The shared-memory epilogue, one B operand, stores a column a thread;
  // two B operands store from registers, as FP8's gate/up tiles of 64
  // columns each do.)
  assert((p.tileN % kThreads == 0 || p.b1) &&
         p.bytesA() + (p.b1 ? 2 : 1) * p.bytesB() <= kStageBytes &&
         p.consumers() * kThreads <= kBlock &&
         "the tile's boxes must fit a stage, its warpgroups the CTA");
  int64_t numAcc = p.b1 ? 2 : 1;

  Value tasks = taskCount(p);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value grid = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);

  // Prologue (without a producer): the first stages of task `t`, whose
  // k-tiles are numbered from `it`: thread 0's TMA loads and, gathered,
  // every consumer thread's cp.async copies (one group per k-tile).
  int64_t first = std::min(kStages, kTiles);
  auto prologue = [&](const Task &t, Value it) {
    e.ifThen(isThread0, [&] {
      if (t.kTiles) { // K in groups: up to kStages of the task's k-tiles
        for (int64_t kt = 0; kt < kStages; ++kt)
          e.ifThen(e.cmp(arith::CmpIPredicate::slt, e.index(kt), t.kTiles),
                   [&] {
                     Value g = e.add(it, e.index(kt));
                     acquire(g);
                     load(p, g, e.index(kt), t);
                   });
        return;
      }
      for (int64_t kt = 0; kt < prologueLoads(kTiles); ++kt) {
        Value g = e.add(it, e.index(kt));
        acquire(g);
        load(p, g, e.index(kt), t);
      }
    });
    if (p.gatherRows)
      for (int64_t kt = 0; kt < first; ++kt) {
        loadGatheredRows(p, e.add(it, e.index(kt)), e.index(kt), t);
        NVVM::CpAsyncCommitGroupOp::create(b, loc);
      }
  };
  // Early prefetch: the MMA layer calls onStagesFree once the task's MMAs
  // are complete and the consumers synchronized, before its epilogue (from
  // registers, leaving the stages alone); the next task's prologue starts
  // there, so its loads overlap this task's stores. (Otherwise each task
  // loads its own first stages after the previous epilogue.)
  bool early = !roles.producer && p.storePair && prefetchesEarly();
  // (convert-mk-to-gpu checks it: clusters need even N, so the register
  // epilogue. Without the early path each task's last k-tile would never be
  // released and the pair would deadlock, so it is an error in every build.)
  if (clusterEmpty && !early)
    llvm::report_fatal_error("clusters of CTAs need the early-prefetch "
                             "register epilogue");
  // The task loop's rounds: task `bid` first, or with clusters of 2 the
  // pair's first task (bid - rank; the grid is whole clusters).
  Value firstTask = clusterEmpty ? e.sub(bid, rank) : bid;
  if (early)
    e.ifThen(e.cmp(arith::CmpIPredicate::slt, firstTask, tasks),
             [&] { prologue(taskOfRound(p, firstTask, tasks), iteration); });

  phaseStart = iteration;
  SmallVector<Value> init = {iteration};
  init.append(carried);
  auto taskLoop = scf::ForOp::create(b, loc, firstTask, tasks, grid, init);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(taskLoop.getBody());
    Value task = taskLoop.getInductionVar();
    Value it = taskLoop.getRegionIterArgs()[0];
    ValueRange args = taskLoop.getRegionIterArgs().drop_front();
    carried.assign(args.begin(), args.end());
    Task t = taskOfRound(p, task, tasks);
    Value m0 = t.m0, n0 = t.n0;

    // Prologue (without a producer, unless started early): the first
    // stages of the task. The previous task consumed all the k-tiles it
    // loaded and its epilogue ended with a warpgroup barrier; `acquire`
    // waits for what the MMA layer may still read.
    if (!roles.producer && !early)
      prologue(t, it);
    // Gathered A: k-tile 0's rows ready before the MMA layer starts (it
    // waits for later k-tiles' itself; the prologue's groups are the last
    // committed).
    if (!roles.producer && p.gatherRows) {
      gatheredRowsLanded(first - 1);
      syncWarpgroup(p.consumers());
    }

    // The MMA layer: accumulators into shared memory, or (empty result) the
    // epilogue done from registers.
    std::function<void()> startNext;
    if (early)
      startNext = [&, it, task] {
        // Clusters: the task's last k-tile is released here (the others
        // were in the MMA layer's loop), whether a next task follows or not.
        if (clusterEmpty)
          e.ifThen(isThread0,
                   [&] { clusterRelease(e.add(it, e.index(kTiles - 1))); });
        Value next = e.add(task, grid);
        e.ifThen(e.cmp(arith::CmpIPredicate::slt, next, tasks), [&] {
          prologue(taskOfRound(p, next, tasks),
                   e.add(it, t.kTiles ? t.kTiles : e.index(kTiles)));
        });
      };
    onStagesFree = startNext;
    SmallVector<Value> tiles = accumulate(p, it, t);
    onStagesFree = nullptr;
    assert((!early || tiles.empty()) &&
           "an early prefetch needs the epilogue from registers");
    assert(tiles.empty() || static_cast<int64_t>(tiles.size()) == numAcc);

    // Epilogue through shared memory: each warpgroup its 64 rows, each
    // thread a column (tileN / 128 of them), rows in turn, so each row is
    // written whole.
    Value wgRow = e.mul(e.div(tid, e.index(kThreads)), e.index(kTileM));
    Value wgTid = e.rem(tid, e.index(kThreads));
    for (int64_t cc = 0; !tiles.empty() && cc < p.tileN / kThreads; ++cc) {
      Value local = e.add(wgTid, e.index(cc * kThreads));
      Value col = e.add(n0, local);
      auto body = [&] {
        e.loop(kTileM, [&](Value rr) {
          Value r = e.add(wgRow, rr);
          Value row = e.add(m0, r);
          e.ifThen(e.cmp(arith::CmpIPredicate::slt, row, p.rows), [&] {
            Value v0 = e.load(tiles[0], {r, local});
            Value v1 = numAcc > 1 ? e.load(tiles[1], {r, local}) : Value();
            p.store(row, col, v0, v1);
          });
        });
      };
      if (p.n % p.tileN)
        e.ifThen(e.cmp(arith::CmpIPredicate::slt, col, e.index(p.n)), body);
      else
        body();
    }
    // The next task's TMA (async proxy) overwrites what this epilogue wrote
    // and read through the generic proxy. (A producer's stages are never
    // written by the consumers: the epilogue is from registers.)
    assert((!roles.producer || tiles.empty()) &&
           "with a producer the epilogue leaves the stages alone");
    if (!roles.producer && !early) {
      fenceAsyncShared();
      syncWarpgroup(p.consumers());
    }
    SmallVector<Value> next = {
        e.add(it, t.kTiles ? t.kTiles : e.index(kTiles))};
    next.append(carried);
    scf::YieldOp::create(b, loc, next);
  }
  iteration = taskLoop.getResult(0);
  ValueRange results = taskLoop.getResults().drop_front();
  carried.assign(results.begin(), results.end());
  phaseDone(p);
}

} // namespace mok::conversion::gemm
