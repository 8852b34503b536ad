// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// An expert-parallel layer on the host: one rank's fused layer split at its
// exchanges into three stage functions, which a host runs on every rank of
// the group, moving their buffers between the ranks in between
// (docs/ExpertParallel.md defines the exchange; the stages' signatures are
// in convert-moe-to-cpu's description):
//
//   send     (source rank)  count the rows for every destination rank and
//                           pack each token once per destination rank;
//   experts  (expert rank)  the local experts on the rows received, and
//                           where each routed row's result goes back;
//   combine  (source rank)  the shared expert, and the returned per-route
//                           rows combined with the router weights.
//
// The backward function (moe.layer_grad) splits the same way: send packs
// d_out and the router weights (and x when it recomputes), experts runs the
// routed backward and the local experts' weight gradients, combine the
// shared expert's backward and d_x, d_router_weights from the returned rows.
//
#include "ExpertParallel.h"
#include "LayerEmitters.h"

#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringMap.h"

using namespace mlir;
using namespace mok::moe;
using namespace mok::conversion;
using namespace mok::cpu;

namespace {

/// The static facts of one expert-parallel layer op.
struct EpLayer {
  Operation *op;
  int64_t ranks, local, experts, topK, padding, tokens, hidden, inter;
  int64_t sharedInter = 0; // 0: no shared expert
  Type ids;                // i32 or i64
  Limit limit;
  bool backward, savesContext, recomputes;

  bool hasShared() const { return sharedInter > 0; }
};

/// A stage function's argument: its name (the `moe.buffer` argument
/// attribute) and type.
struct Arg {
  std::string name;
  MemRefType type;
};

/// Builds one stage function: its arguments by name, temporaries freed at
/// the end.
class Stage {
public:
  Stage(func::FuncOp layerFunc, StringRef suffix, ArrayRef<Arg> args)
      : b(layerFunc) {
    MLIRContext *ctx = layerFunc.getContext();
    SmallVector<Type> types;
    for (const Arg &a : args)
      types.push_back(a.type);
    func = func::FuncOp::create(b, layerFunc.getLoc(),
                                (layerFunc.getSymName() + suffix).str(),
                                FunctionType::get(ctx, types, {}));
    func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                  UnitAttr::get(ctx));
    Block *entry = func.addEntryBlock();
    for (auto [i, a] : llvm::enumerate(args)) {
      func.setArgAttr(i, "moe.buffer", StringAttr::get(ctx, a.name));
      values[a.name] = entry->getArgument(i);
    }
    b.setInsertionPointToEnd(entry);
  }

  /// The argument named `name`, or null when the stage has none.
  Value operator[](StringRef name) const { return values.lookup(name); }

  void finish() {
    for (Value m : temps)
      memref::DeallocOp::create(b, func.getLoc(), m);
    func::ReturnOp::create(b, func.getLoc());
  }

  OpBuilder b;
  func::FuncOp func;
  SmallVector<Value> temps;

private:
  llvm::StringMap<Value> values;
};

Value castTo(Emitter &e, Type type, Value v) {
  if (isa<IndexType>(type) || isa<IndexType>(v.getType()))
    return arith::IndexCastOp::create(e.b, e.loc, type, v);
  return arith::ExtSIOp::create(e.b, e.loc, type, v);
}

Value andI(Emitter &e, Value a, Value b) {
  return arith::AndIOp::create(e.b, e.loc, a, b);
}

Value minI(Emitter &e, Value a, Value b) {
  return arith::MinSIOp::create(e.b, e.loc, a, b);
}

Value alloc(Emitter &e, Temps &temps, MemRefType type, ValueRange dyn) {
  Value m = e.alloc(type, dyn);
  temps.push_back(m);
  return m;
}

//===----------------------------------------------------------------------===//
// send: count, then pack every token once per destination rank
//===----------------------------------------------------------------------===//

/// A [T, W] source whose rows travel, and its packed [S, W] destination.
struct Payload {
  Value from, to;
};

/// Fills `rowsOut[d]` (tokens with a route to rank d) and `routesOut[d]`
/// (their routes), then the packed rows: by destination rank, then token;
/// each with its token index, its routes' local expert ids (-1 for routes to
/// other ranks and no route) and, when `weights` is given, the router
/// weights of its routes (0 elsewhere). Rows past an output's size are not
/// written (the counts still say how many there are).
void emitSend(Emitter &e, const EpLayer &l, Value top, Value weights,
              Value weightsOut, ArrayRef<Payload> payloads, Value rowsOut,
              Value routesOut, Value tokenOut, Value idsOut, Temps &temps) {
  Value tokens = e.dim(top, 0);
  Value zero = e.index(0), one = e.index(1);
  Type i32 = e.b.getI32Type(), i64 = e.b.getI64Type();
  Value local = e.index(l.local);
  // Whether route (t, kk) goes to rank d, and its expert id.
  auto routeTo = [&](Value t, Value kk, Value d) -> std::pair<Value, Value> {
    Value id = e.toIndex(e.load(top, {t, kk}));
    Value valid = andI(e, e.cmp(arith::CmpIPredicate::sge, id, zero),
                       e.cmp(arith::CmpIPredicate::slt, id,
                             e.index(l.experts)));
    // (For an invalid id the quotient is meaningless; `valid` masks it.)
    return {andI(e, valid, e.cmp(arith::CmpIPredicate::eq, e.div(id, local), d)),
            id};
  };
  auto routesTo = [&](Value t, Value d) {
    return e.fold(zero, e.index(l.topK), zero, [&](Value kk, Value acc) {
      return e.add(acc, e.select(routeTo(t, kk, d).first, one, zero));
    });
  };

  MemRefType counts = indexBuffer(e.b, l.ranks);
  Value tokenCount = alloc(e, temps, counts, {});
  Value routeCount = alloc(e, temps, counts, {});
  e.fill(tokenCount, zero);
  e.fill(routeCount, zero);
  e.loop(tokens, [&](Value t) {
    e.loop(l.ranks, [&](Value d) {
      Value n = routesTo(t, d);
      e.ifThen(e.cmp(arith::CmpIPredicate::sgt, n, zero), [&] {
        e.store(e.add(e.load(tokenCount, {d}), one), tokenCount, {d});
        e.store(e.add(e.load(routeCount, {d}), n), routeCount, {d});
      });
    });
  });
  e.loop(l.ranks, [&](Value d) {
    e.store(castTo(e, i64, e.load(tokenCount, {d})), rowsOut, {d});
    e.store(castTo(e, i64, e.load(routeCount, {d})), routesOut, {d});
  });

  // The fill cursor of each destination's block: first its start.
  Value cursor = alloc(e, temps, counts, {});
  e.fold(zero, e.index(l.ranks), zero, [&](Value d, Value start) {
    e.store(start, cursor, {d});
    return e.add(start, e.load(tokenCount, {d}));
  });
  auto guarded = [&](Value out, Value row, function_ref<void()> body) {
    e.ifThen(e.cmp(arith::CmpIPredicate::slt, row, e.dim(out, 0)), body);
  };
  e.loop(tokens, [&](Value t) {
    e.loop(l.ranks, [&](Value d) {
      e.ifThen(e.cmp(arith::CmpIPredicate::sgt, routesTo(t, d), zero), [&] {
        Value row = e.load(cursor, {d});
        e.store(e.add(row, one), cursor, {d});
        guarded(tokenOut, row,
                [&] { e.store(castTo(e, i32, t), tokenOut, {row}); });
        guarded(idsOut, row, [&] {
          e.loop(l.topK, [&](Value kk) {
            auto [toD, id] = routeTo(t, kk, d);
            Value localId = castTo(e, i32, e.rem(id, local));
            Value none = arith::ConstantIntOp::create(e.b, e.loc, i32, -1);
            e.store(e.select(toD, localId, none), idsOut, {row, kk});
          });
        });
        if (weights)
          guarded(weightsOut, row, [&] {
            e.loop(l.topK, [&](Value kk) {
              Value toD = routeTo(t, kk, d).first;
              e.store(e.select(toD, e.load(weights, {t, kk}), e.f32(0.0f)),
                      weightsOut, {row, kk});
            });
          });
        for (const Payload &p : payloads)
          guarded(p.to, row, [&] {
            e.loop(e.dim(p.from, 1), [&](Value j) {
              e.store(e.load(p.from, {t, j}), p.to, {row, j});
            });
          });
      });
    });
  });
}

//===----------------------------------------------------------------------===//
// experts: the local experts on the received rows
//===----------------------------------------------------------------------===//

/// The source rank of every received row ([rows] index; -1 for rows the
/// counts do not cover): source s's rows follow those of ranks < s.
Value emitSources(Emitter &e, const EpLayer &l, Value recvRows, Value rows,
                  Temps &temps) {
  Value sources = alloc(e, temps, indexBuffer(e.b), {rows});
  e.fill(sources, e.index(-1));
  e.fold(e.index(0), e.index(l.ranks), e.index(0), [&](Value s, Value start) {
    Value end = e.add(start, e.toIndex(e.load(recvRows, {s})));
    e.loop(minI(e, start, rows), minI(e, end, rows),
           [&](Value i) { e.store(s, sources, {i}); });
    return end;
  });
  return sources;
}

/// Where each routed row's result goes back: destRank[r] (the source rank)
/// and destRow[r] (token * top_k + k on that rank); -1 for padding rows and
/// rows past R.
void emitDestinations(Emitter &e, const Plan &p, Value sources, Value token,
                      Value destRank, Value destRow) {
  Type i32 = e.b.getI32Type();
  Value none = arith::ConstantIntOp::create(e.b, e.loc, i32, -1);
  e.fill(destRank, none);
  e.fill(destRow, none);
  Value k = e.index(p.topK);
  Value n = minI(e, p.rows, minI(e, e.dim(destRank, 0), e.dim(destRow, 0)));
  e.loop(n, [&](Value r) {
    Value route = e.load(p.rowRoute, {r});
    e.ifThen(e.isValid(route), [&] {
      Value i = e.div(route, k), kk = e.rem(route, k);
      Value t = e.toIndex(e.load(token, {i}));
      e.store(castTo(e, i32, e.load(sources, {i})), destRank, {r});
      e.store(castTo(e, i32, e.add(e.mul(t, k), kk)), destRow, {r});
    });
  });
}

//===----------------------------------------------------------------------===//
// The stage functions
//===----------------------------------------------------------------------===//

class StageLowering {
public:
  StageLowering(func::FuncOp func, const EpLayer &l) : func(func), l(l) {
    MLIRContext *ctx = func.getContext();
    bf16 = BFloat16Type::get(ctx);
    f32 = Float32Type::get(ctx);
    i32 = IntegerType::get(ctx, 32);
    i64 = IntegerType::get(ctx, 64);
  }

  void build() {
    if (l.backward)
      buildBackward();
    else
      buildForward();
  }

private:
  func::FuncOp func;
  const EpLayer &l;
  Type bf16, f32, i32, i64;

  static constexpr int64_t dyn = ShapedType::kDynamic;
  MemRefType tokenRows(int64_t cols, Type elt) const {
    return MemRefType::get({l.tokens, cols}, elt);
  }
  MemRefType rows(int64_t cols, Type elt) const {
    return MemRefType::get({dyn, cols}, elt);
  }
  MemRefType vec(Type elt, int64_t n = dyn) const {
    return MemRefType::get({n}, elt);
  }
  MemRefType weights3(int64_t a, int64_t b) const {
    return MemRefType::get({l.local, a, b}, bf16);
  }

  void appendShared(SmallVectorImpl<Arg> &args, StringRef prefix) const {
    if (!l.hasShared())
      return;
    args.push_back({(prefix + "shared_gate_weights").str(),
                    MemRefType::get({l.sharedInter, l.hidden}, bf16)});
    args.push_back({(prefix + "shared_up_weights").str(),
                    MemRefType::get({l.sharedInter, l.hidden}, bf16)});
    args.push_back({(prefix + "shared_down_weights").str(),
                    MemRefType::get({l.hidden, l.sharedInter}, bf16)});
  }
  void appendSharedContext(SmallVectorImpl<Arg> &args) const {
    if (!l.hasShared())
      return;
    for (const char *n : {"shared_gate", "shared_up", "shared_hidden"})
      args.push_back({n, tokenRows(l.sharedInter, bf16)});
  }
  void appendRoutedContext(SmallVectorImpl<Arg> &args) const {
    args.push_back({"routed_x", rows(l.hidden, bf16)});
    for (const char *n : {"gate", "up", "hidden"})
      args.push_back({n, rows(l.inter, bf16)});
  }
  void appendLocalWeights(SmallVectorImpl<Arg> &args, StringRef prefix) const {
    args.push_back({(prefix + "gate_weights").str(),
                    weights3(l.inter, l.hidden)});
    args.push_back({(prefix + "up_weights").str(), weights3(l.inter, l.hidden)});
    args.push_back({(prefix + "down_weights").str(),
                    weights3(l.hidden, l.inter)});
  }
  /// What the send stage reports and packs, beyond its payloads.
  void appendSendOutputs(SmallVectorImpl<Arg> &args) const {
    args.push_back({"send_rows", vec(i64, l.ranks)});
    args.push_back({"send_routes", vec(i64, l.ranks)});
    args.push_back({"token", vec(i32)});
    args.push_back({"expert_ids", rows(l.topK, i32)});
  }
  /// What the experts stage reads of the received rows, beyond payloads.
  void appendReceived(SmallVectorImpl<Arg> &args) const {
    args.push_back({"recv_rows", vec(i64, l.ranks)});
    args.push_back({"token", vec(i32)});
    args.push_back({"expert_ids", rows(l.topK, i32)});
  }

  void buildForward();
  void buildBackward();
};

void StageLowering::buildForward() {
  // send(top_experts, x) -> (send_rows, send_routes, token, expert_ids, x_rows)
  {
    SmallVector<Arg> args = {{"top_experts", tokenRows(l.topK, l.ids)},
                             {"x", tokenRows(l.hidden, bf16)}};
    appendSendOutputs(args);
    args.push_back({"x_rows", rows(l.hidden, bf16)});
    Stage s(func, "__ep_send", args);
    Emitter e(s.b, func.getLoc());
    emitSend(e, l, s["top_experts"], Value(), Value(),
             {{s["x"], s["x_rows"]}}, s["send_rows"], s["send_routes"],
             s["token"], s["expert_ids"], s.temps);
    s.finish();
  }
  // experts(recv_rows, token, expert_ids, x_rows, gate, up, down)
  //   -> (routed_y, dest_rank, dest_row[, routed_x, gate, up, hidden])
  {
    SmallVector<Arg> args;
    appendReceived(args);
    args.push_back({"x_rows", rows(l.hidden, bf16)});
    appendLocalWeights(args, "");
    args.push_back({"routed_y", rows(l.hidden, bf16)});
    args.push_back({"dest_rank", vec(i32)});
    args.push_back({"dest_row", vec(i32)});
    if (l.savesContext)
      appendRoutedContext(args);
    Stage s(func, "__ep_experts", args);
    Emitter e(s.b, func.getLoc());
    Plan p = emitPlan(e, l.topK, l.local, l.padding, s["expert_ids"], s.temps);
    Value sources = emitSources(e, l, s["recv_rows"], p.tokens, s.temps);
    auto routed = [&](int64_t cols) {
      return alloc(e, s.temps, rows(cols, bf16), {p.rows});
    };
    Value routedX = routed(l.hidden), hidden = routed(l.inter);
    Value gate = l.savesContext ? routed(l.inter) : Value();
    Value up = l.savesContext ? routed(l.inter) : Value();
    Value routedY = routed(l.hidden);
    emitDispatch(e, p, s["x_rows"], routedX);
    emitExpertSwiglu(e, p, routedX, s["gate_weights"], s["up_weights"],
                     l.limit, gate, up, hidden);
    emitExpertDown(e, p, hidden, s["down_weights"], routedY);
    emitDestinations(e, p, sources, s["token"], s["dest_rank"],
                     s["dest_row"]);
    emitCopyPrefix(e, routedY, s["routed_y"]);
    if (l.savesContext) {
      emitCopyPrefix(e, routedX, s["routed_x"]);
      emitCopyPrefix(e, gate, s["gate"]);
      emitCopyPrefix(e, up, s["up"]);
      emitCopyPrefix(e, hidden, s["hidden"]);
    }
    s.finish();
  }
  // combine(x, top_experts, router_weights[, shared weights], returned_y)
  //   -> (out[, shared_gate, shared_up, shared_hidden])
  {
    SmallVector<Arg> args = {{"x", tokenRows(l.hidden, bf16)},
                             {"top_experts", tokenRows(l.topK, l.ids)},
                             {"router_weights", tokenRows(l.topK, f32)}};
    appendShared(args, "");
    args.push_back({"returned_y", rows(l.hidden, bf16)});
    args.push_back({"out", tokenRows(l.hidden, bf16)});
    if (l.savesContext)
      appendSharedContext(args);
    Stage s(func, "__ep_combine", args);
    Emitter e(s.b, func.getLoc());
    Plan p = emitRouteRows(e, l.topK, l.experts, s["top_experts"], s.temps);
    Value sharedOut;
    if (l.hasShared()) {
      Value x = s["x"];
      MemRefType sharedI = rows(l.sharedInter, bf16);
      Value hidden = l.savesContext
                         ? s["shared_hidden"]
                         : alloc(e, s.temps, sharedI, {e.dim(x, 0)});
      sharedOut = alloc(e, s.temps, rows(l.hidden, bf16), {e.dim(x, 0)});
      emitSharedExpert(e, x, s["shared_gate_weights"], s["shared_up_weights"],
                       s["shared_down_weights"], l.limit, s["shared_gate"],
                       s["shared_up"], hidden, sharedOut);
    }
    emitCombine(e, p, s["returned_y"], s["router_weights"], sharedOut,
                s["out"]);
    s.finish();
  }
}

void StageLowering::buildBackward() {
  // send(top_experts, d_out, router_weights[, x])
  //   -> (send_rows, send_routes, token, expert_ids, d_out_rows, weights[, x_rows])
  {
    SmallVector<Arg> args = {{"top_experts", tokenRows(l.topK, l.ids)},
                             {"d_out", tokenRows(l.hidden, bf16)},
                             {"router_weights", tokenRows(l.topK, f32)}};
    if (l.recomputes)
      args.push_back({"x", tokenRows(l.hidden, bf16)});
    appendSendOutputs(args);
    args.push_back({"d_out_rows", rows(l.hidden, bf16)});
    args.push_back({"weights", rows(l.topK, f32)});
    if (l.recomputes)
      args.push_back({"x_rows", rows(l.hidden, bf16)});
    Stage s(func, "__ep_send", args);
    Emitter e(s.b, func.getLoc());
    SmallVector<Payload> payloads = {{s["d_out"], s["d_out_rows"]}};
    if (l.recomputes)
      payloads.push_back({s["x"], s["x_rows"]});
    emitSend(e, l, s["top_experts"], s["router_weights"], s["weights"],
             payloads, s["send_rows"], s["send_routes"], s["token"],
             s["expert_ids"], s.temps);
    s.finish();
  }
  // experts(recv_rows, token, expert_ids, d_out_rows, weights[, x_rows],
  //         gate, up, down[, routed_x, gate, up, hidden])
  //   -> (d_routed_x, d_route_weights, dest_rank, dest_row,
  //       d_gate_weights, d_up_weights, d_down_weights)
  {
    SmallVector<Arg> args;
    appendReceived(args);
    args.push_back({"d_out_rows", rows(l.hidden, bf16)});
    args.push_back({"weights", rows(l.topK, f32)});
    if (l.recomputes)
      args.push_back({"x_rows", rows(l.hidden, bf16)});
    appendLocalWeights(args, "");
    if (!l.recomputes)
      appendRoutedContext(args);
    args.push_back({"d_routed_x", rows(l.hidden, bf16)});
    args.push_back({"d_route_weights", vec(f32)});
    args.push_back({"dest_rank", vec(i32)});
    args.push_back({"dest_row", vec(i32)});
    appendLocalWeights(args, "d_");
    Stage s(func, "__ep_experts", args);
    Emitter e(s.b, func.getLoc());
    Plan p = emitPlan(e, l.topK, l.local, l.padding, s["expert_ids"], s.temps);
    Value sources = emitSources(e, l, s["recv_rows"], p.tokens, s.temps);
    RoutedContext saved;
    if (!l.recomputes)
      saved = {s["routed_x"], s["gate"], s["up"], s["hidden"]};
    Value dRouteWeights = alloc(e, s.temps, vec(f32), {p.rows});
    e.fill(dRouteWeights, e.f32(0.0f));
    Value dRoutedX = alloc(e, s.temps, rows(l.hidden, bf16), {p.rows});
    emitRoutedGrad(e, p, l.limit, s["x_rows"], s["d_out_rows"], s["weights"],
                   s["gate_weights"], s["up_weights"], s["down_weights"], saved,
                   dRouteWeights, RouteWeightGrads::ByRow, dRoutedX,
                   s["d_gate_weights"], s["d_up_weights"],
                   s["d_down_weights"], s.temps);
    emitDestinations(e, p, sources, s["token"], s["dest_rank"],
                     s["dest_row"]);
    emitCopyPrefix(e, dRoutedX, s["d_routed_x"]);
    emitCopyPrefix(e, dRouteWeights, s["d_route_weights"]);
    s.finish();
  }
  // combine(x, top_experts[, shared weights][, shared context], d_out,
  //         returned_dx, returned_dw)
  //   -> (d_x, d_router_weights[, d_shared_gate_weights, d_shared_up_weights,
  //       d_shared_down_weights])
  {
    SmallVector<Arg> args = {{"x", tokenRows(l.hidden, bf16)},
                             {"top_experts", tokenRows(l.topK, l.ids)}};
    appendShared(args, "");
    if (!l.recomputes)
      appendSharedContext(args);
    args.push_back({"d_out", tokenRows(l.hidden, bf16)});
    args.push_back({"returned_dx", rows(l.hidden, bf16)});
    args.push_back({"returned_dw", vec(f32)});
    args.push_back({"d_x", tokenRows(l.hidden, bf16)});
    args.push_back({"d_router_weights", tokenRows(l.topK, f32)});
    appendShared(args, "d_");
    Stage s(func, "__ep_combine", args);
    Emitter e(s.b, func.getLoc());
    Plan p = emitRouteRows(e, l.topK, l.experts, s["top_experts"], s.temps);
    Value dSharedX;
    if (l.hasShared()) {
      SharedContext saved;
      if (!l.recomputes)
        saved = {s["shared_gate"], s["shared_up"], s["shared_hidden"]};
      dSharedX = emitSharedGrad(
          e, l.limit, s["x"], s["d_out"], s["shared_gate_weights"],
          s["shared_up_weights"], s["shared_down_weights"], saved,
          s["d_shared_gate_weights"], s["d_shared_up_weights"],
          s["d_shared_down_weights"], s.temps);
    }
    emitInputGrad(e, p, s["returned_dx"], dSharedX, s["d_x"]);
    Value k = e.index(l.topK), returnedDw = s["returned_dw"];
    e.loop(p.tokens, [&](Value t) {
      e.loop(l.topK, [&](Value kk) {
        Value row = e.load(p.routeRow, {e.add(e.mul(t, k), kk)});
        Value dw = e.ifValue(
            e.isValid(row), [&] { return e.load(returnedDw, {row}); },
            [&] { return e.f32(0.0f); });
        e.store(dw, s["d_router_weights"], {t, kk});
      });
    });
    s.finish();
  }
}

/// The layer op of an expert-parallel function and its facts, or an error
/// at what is in the way.
FailureOr<EpLayer> analyze(func::FuncOp func) {
  auto fail = [](Operation *op) {
    return op->emitError()
           << "convert-moe-to-cpu: an expert-parallel function (ep > 1) must "
              "be one fused moe.layer or moe.layer_grad returning its "
              "results; fuse the chain first (--moe-fuse-layer)";
  };
  if (!func.getBody().hasOneBlock())
    return fail(func);
  Block &body = func.getBody().front();
  Operation *layerOp = nullptr;
  for (Operation &op : body.without_terminator()) {
    if (layerOp || !isa<LayerOp, LayerGradOp>(op))
      return fail(&op);
    layerOp = &op;
  }
  if (!layerOp)
    return fail(func);
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  if (!llvm::equal(ret.getOperands(), layerOp->getResults()))
    return fail(ret);
  if (auto g = dyn_cast<LayerGradOp>(layerOp); g && g.accumulatesMainGrads())
    return layerOp->emitError("convert-moe-to-cpu: main_grads (main_grad + "
                              "dW) is implemented for the GPU targets only");
  if (!SymbolTable::symbolKnownUseEmpty(func, func->getParentOp()))
    return func.emitError()
           << "convert-moe-to-cpu: @" << func.getSymName()
           << " is an expert-parallel layer and is called; its stages run on "
              "the host, between the ranks' exchanges, and cannot be called "
              "as one function";
  for (StringRef suffix : {"__ep_send", "__ep_experts", "__ep_combine"})
    if (SymbolTable::lookupSymbolIn(func->getParentOp(),
                                    (func.getSymName() + suffix).str()))
      return func.emitError()
             << "convert-moe-to-cpu: the stage function @"
             << func.getSymName() << suffix << " already exists";

  EpLayer l;
  l.op = layerOp;
  PlanType plan;
  Value x, gate;
  ValueRange shared;
  FloatAttr limit;
  if (auto layer = dyn_cast<LayerOp>(layerOp)) {
    if (layer.getPrecision())
      return layer.emitError()
             << "convert-moe-to-cpu: an expert-parallel FP8 layer (precision "
                "= \""
             << *layer.getPrecision() << "\") is not supported yet";
    plan = layer.getPlanType();
    x = layer.getX();
    gate = layer.getGateWeights();
    shared = layer.getSharedWeights();
    limit = layer.getSwigluLimitAttr();
    l.backward = false;
    l.savesContext = layer.savesContext();
    l.recomputes = false;
    l.ids = cast<RankedTensorType>(layer.getTopExperts().getType())
                .getElementType();
  } else {
    auto grad = cast<LayerGradOp>(layerOp);
    if (grad.getPrecision())
      return grad.emitError()
             << "convert-moe-to-cpu: an expert-parallel FP8 layer (precision "
                "= \""
             << *grad.getPrecision() << "\") is not supported yet";
    plan = grad.getPlanType();
    x = grad.getX();
    gate = grad.getGateWeights();
    shared = grad.getSharedWeights();
    limit = grad.getSwigluLimitAttr();
    l.backward = true;
    l.savesContext = false;
    l.recomputes = grad.recomputes();
    l.ids = cast<RankedTensorType>(grad.getTopExperts().getType())
                .getElementType();
  }
  auto xType = cast<RankedTensorType>(x.getType());
  auto gateType = cast<RankedTensorType>(gate.getType());
  l.ranks = plan.getEp();
  l.local = plan.getLocalExperts();
  l.experts = plan.getExperts();
  l.topK = plan.getTopK();
  l.padding = plan.getPadding();
  l.tokens = xType.getDimSize(0);
  l.hidden = xType.getDimSize(1);
  l.inter = gateType.getDimSize(1);
  if (shared.size() == 3)
    l.sharedInter =
        cast<RankedTensorType>(shared[0].getType()).getDimSize(0);
  l.limit = getLimit(limit);
  return l;
}

} // namespace

bool mok::cpu::isExpertParallel(func::FuncOp func) {
  bool found = false;
  func.walk([&](Operation *op) {
    PlanType plan;
    if (auto p = dyn_cast<PlanOp>(op))
      plan = p.getPlan().getType();
    else if (auto l = dyn_cast<LayerOp>(op))
      plan = l.getPlanType();
    else if (auto g = dyn_cast<LayerGradOp>(op))
      plan = g.getPlanType();
    found |= plan && plan.getEp() > 1;
  });
  return found;
}

LogicalResult mok::cpu::lowerExpertParallel(func::FuncOp func) {
  FailureOr<EpLayer> layer = analyze(func);
  if (failed(layer))
    return failure();
  StageLowering(func, *layer).build();
  func.erase();
  return success();
}
