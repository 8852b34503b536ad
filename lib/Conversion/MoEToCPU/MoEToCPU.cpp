// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-cpu: moe functions → scalar loops on memrefs, the
// executable statement of the dialect's semantics.
//
// Each function is rebuilt in destination-passing style: tensor arguments
// become memrefs, tensor results become trailing output memrefs. Inside, every
// tensor value gets a buffer (an argument or a memref.alloc freed before the
// return) and every routing plan a set of index buffers; each moe op is then
// emitted as loops over those buffers. The loops are deliberately plain —
// one accumulator per output element, reduction order fixed — because this
// code defines what "correct" means for the GPU backends.
//
#include "mok/Conversion/MoEToCPU/MoEToCPU.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mok/Conversion/Common/ScalarEmitter.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMOETOCPU
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok::moe;
using namespace mok::conversion;

namespace {

//===----------------------------------------------------------------------===//
// The routing plan
//===----------------------------------------------------------------------===//

/// The run-time form of a plan on the CPU.
struct Plan {
  int64_t topK, experts, padding;
  Value tokens;   // T
  Value rows;     // R, the padded routed row count
  Value offsets;  // [experts + 1] start of each expert's row segment
  Value routeRow; // [T * top_k] row of route t * top_k + k, or -1
  Value rowRoute; // [R] route of each row, or -1 for padding rows
};

static MemRefType indexBuffer(OpBuilder &b, int64_t size = ShapedType::kDynamic) {
  return MemRefType::get({size}, b.getIndexType());
}

/// Builds the plan: counts per expert, padded offsets, then rows assigned in
/// route order (token, then k), so every consumer agrees on row positions.
static Plan emitPlan(Emitter &e, PlanType type, Value topExperts,
                     SmallVectorImpl<Value> &temps) {
  Plan p;
  p.topK = type.getTopK();
  p.experts = type.getLocalExperts();
  p.padding = type.getPadding();
  p.tokens = e.dim(topExperts, 0);
  Value k = e.index(p.topK), numExperts = e.index(p.experts);
  Value zero = e.index(0), one = e.index(1), none = e.index(-1);

  // The local expert of route (t, kk), or -1.
  auto expertOf = [&](Value t, Value kk) {
    Value id = e.toIndex(e.load(topExperts, {t, kk}));
    Value valid = arith::AndIOp::create(
        e.b, e.loc, e.cmp(arith::CmpIPredicate::sge, id, zero),
        e.cmp(arith::CmpIPredicate::slt, id, numExperts));
    return e.select(valid, id, none);
  };

  Value counts = e.alloc(indexBuffer(e.b, p.experts), {});
  temps.push_back(counts);
  e.fill(counts, zero);
  e.loop(p.tokens, [&](Value t) {
    e.loop(p.topK, [&](Value kk) {
      Value ex = expertOf(t, kk);
      e.ifThen(e.isValid(ex), [&] {
        e.store(e.add(e.load(counts, {ex}), one), counts, {ex});
      });
    });
  });

  p.offsets = e.alloc(indexBuffer(e.b, p.experts + 1), {});
  temps.push_back(p.offsets);
  Value pad = e.index(p.padding);
  p.rows = e.fold(zero, numExperts, zero, [&](Value ex, Value start) {
    e.store(start, p.offsets, {ex});
    Value c = e.load(counts, {ex});
    Value padded = e.mul(e.div(e.add(c, e.index(p.padding - 1)), pad), pad);
    return e.add(start, padded);
  });
  e.store(p.rows, p.offsets, {numExperts});

  p.rowRoute = e.alloc(indexBuffer(e.b), {p.rows});
  temps.push_back(p.rowRoute);
  e.fill(p.rowRoute, none);
  p.routeRow = e.alloc(indexBuffer(e.b), {e.mul(p.tokens, k)});
  temps.push_back(p.routeRow);
  e.fill(counts, zero); // now the fill cursor of each expert
  e.loop(p.tokens, [&](Value t) {
    e.loop(p.topK, [&](Value kk) {
      Value route = e.add(e.mul(t, k), kk);
      Value ex = expertOf(t, kk);
      e.ifThen(
          e.isValid(ex),
          [&] {
            Value cursor = e.load(counts, {ex});
            Value row = e.add(e.load(p.offsets, {ex}), cursor);
            e.store(e.add(cursor, one), counts, {ex});
            e.store(row, p.routeRow, {route});
            e.store(route, p.rowRoute, {row});
          },
          [&] { e.store(none, p.routeRow, {route}); });
    });
  });
  return p;
}

/// for ex, r in expert ex's segment: body(ex, r)
static void forEachRow(Emitter &e, const Plan &p,
                       function_ref<void(Value, Value)> body) {
  e.loop(p.experts, [&](Value ex) {
    Value begin = e.load(p.offsets, {ex});
    Value end = e.load(p.offsets, {e.add(ex, e.index(1))});
    e.loop(begin, end, [&](Value r) { body(ex, r); });
  });
}

//===----------------------------------------------------------------------===//
// Forward pieces
//===----------------------------------------------------------------------===//

/// routed_x[r] = x[token of r], zero for padding rows.
static void emitDispatch(Emitter &e, const Plan &p, Value x, Value routedX) {
  Value hidden = e.dim(x, 1);
  e.loop(p.rows, [&](Value r) {
    Value route = e.load(p.rowRoute, {r});
    e.ifThen(
        e.isValid(route),
        [&] {
          Value t = e.div(route, e.index(p.topK));
          e.loop(hidden, [&](Value j) {
            e.store(e.load(x, {t, j}), routedX, {r, j});
          });
        },
        [&] {
          Value zero = arith::ConstantOp::create(
              e.b, e.loc, e.b.getZeroAttr(e.b.getBF16Type()));
          e.loop(hidden, [&](Value j) { e.store(zero, routedX, {r, j}); });
        });
  });
}

/// g, u = bf16(x W_g^T), bf16(x W_u^T) for row `r` of `x` against the [I, H]
/// slice `w[prefix..., i, :]`; stores g, u (when asked) and h.
static void emitGateUpRow(Emitter &e, Value x, Value r, Value wg, Value wu,
                          ValueRange prefix, Limit limit, Value gateOut,
                          Value upOut, Value hiddenOut) {
  int64_t rank = cast<MemRefType>(wg.getType()).getRank();
  Value inter = e.dim(wg, rank - 2), hidden = e.dim(wg, rank - 1);
  e.loop(inter, [&](Value i) {
    auto dot = [&](Value w) {
      return e.roundBF16(e.sum(hidden, [&](Value j) {
        SmallVector<Value> widx(prefix);
        widx.append({i, j});
        return e.mul(e.loadF32(x, {r, j}), e.loadF32(w, widx));
      }));
    };
    Value g = dot(wg), u = dot(wu);
    if (gateOut)
      e.storeRounded(g, gateOut, {r, i});
    if (upOut)
      e.storeRounded(u, upOut, {r, i});
    e.storeRounded(swiglu(e, g, u, limit, SigmoidMath::exact), hiddenOut,
                   {r, i});
  });
}

/// out[r, j] = bf16(sum_i in[r, i] * w[prefix..., j, i]).
static void emitDownRow(Emitter &e, Value in, Value r, Value w,
                        ValueRange prefix, Value out) {
  int64_t rank = cast<MemRefType>(w.getType()).getRank();
  Value hidden = e.dim(w, rank - 2), inter = e.dim(w, rank - 1);
  e.loop(hidden, [&](Value j) {
    Value acc = e.sum(inter, [&](Value i) {
      SmallVector<Value> widx(prefix);
      widx.append({j, i});
      return e.mul(e.loadF32(in, {r, i}), e.loadF32(w, widx));
    });
    e.storeRounded(acc, out, {r, j});
  });
}

static void emitExpertSwiglu(Emitter &e, const Plan &p, Value routedX,
                             Value wg, Value wu, Limit limit, Value gateOut,
                             Value upOut, Value hiddenOut) {
  forEachRow(e, p, [&](Value ex, Value r) {
    emitGateUpRow(e, routedX, r, wg, wu, {ex}, limit, gateOut, upOut,
                  hiddenOut);
  });
}

static void emitExpertDown(Emitter &e, const Plan &p, Value hidden, Value wd,
                           Value routedY) {
  forEachRow(e, p, [&](Value ex, Value r) {
    emitDownRow(e, hidden, r, wd, {ex}, routedY);
  });
}

/// The shared expert on every token; `out` may be null when only the
/// activations are wanted (backward recomputation).
static void emitSharedExpert(Emitter &e, Value x, Value sg, Value su, Value sd,
                             Limit limit, Value gateOut, Value upOut,
                             Value hiddenOut, Value out) {
  Value tokens = e.dim(x, 0);
  e.loop(tokens, [&](Value t) {
    emitGateUpRow(e, x, t, sg, su, {}, limit, gateOut, upOut, hiddenOut);
    if (out)
      emitDownRow(e, hiddenOut, t, sd, {}, out);
  });
}

/// out[t] = bf16(f32(shared[t]) + sum_k w[t,k] * f32(y[row(t,k)])).
static void emitCombine(Emitter &e, const Plan &p, Value routedY,
                        Value routerWeights, Value shared, Value out) {
  Value hidden = e.dim(out, 1), k = e.index(p.topK);
  e.loop(p.tokens, [&](Value t) {
    e.loop(hidden, [&](Value j) {
      Value init = shared ? e.loadF32(shared, {t, j}) : e.f32(0.0f);
      Value acc = e.fold(e.index(0), k, init, [&](Value kk, Value acc) {
        Value row = e.load(p.routeRow, {e.add(e.mul(t, k), kk)});
        Value term = e.ifValue(
            e.isValid(row),
            [&] {
              return e.mul(e.load(routerWeights, {t, kk}),
                           e.loadF32(routedY, {row, j}));
            },
            [&] { return e.f32(0.0f); });
        return e.add(acc, term);
      });
      e.storeRounded(acc, out, {t, j});
    });
  });
}

//===----------------------------------------------------------------------===//
// Function rewriting
//===----------------------------------------------------------------------===//

/// Lowers one moe function in place.
class FunctionLowering {
public:
  explicit FunctionLowering(func::FuncOp func) : func(func) {}

  LogicalResult run();

private:
  func::FuncOp func;
  DenseMap<Value, Value> buffers; // tensor value → memref
  DenseMap<Value, Plan> plans;    // plan value → its buffers
  SmallVector<Value> temps;       // allocations to free before returning

  static MemRefType bufferType(Type tensor) {
    auto t = cast<RankedTensorType>(tensor);
    return MemRefType::get(t.getShape(), t.getElementType());
  }

  /// A fresh buffer for a tensor of `type` whose dynamic dimensions are the
  /// given sizes, in order.
  Value allocFor(Emitter &e, Type type, ValueRange dynSizes) {
    Value m = e.alloc(bufferType(type), dynSizes);
    temps.push_back(m);
    return m;
  }
  /// A buffer for `value` whose dynamic row dimension is R or T.
  Value allocRows(Emitter &e, Value value, Value rows) {
    auto type = cast<RankedTensorType>(value.getType());
    SmallVector<Value> dyn;
    if (type.isDynamicDim(0))
      dyn.push_back(rows);
    return buffers[value] = allocFor(e, type, dyn);
  }

  LogicalResult lowerOp(Emitter &e, Operation *op);
  void lowerLayer(Emitter &e, LayerOp op);
  void lowerLayerGrad(Emitter &e, LayerGradOp op);
  Plan &planFor(Emitter &e, Value top, PlanType type) {
    return plans[top] = emitPlan(e, type, buffers.lookup(top), temps);
  }
};

LogicalResult FunctionLowering::run() {
  if (!func.getBody().hasOneBlock())
    return func.emitError("convert-moe-to-cpu: expected a function body of "
                          "one block");
  // Check everything before changing anything.
  for (Type t : func.getArgumentTypes())
    if (!isa<RankedTensorType>(t))
      return func.emitError() << "convert-moe-to-cpu: argument of type " << t
                              << " is not supported; only ranked tensors";
  for (Type t : func.getResultTypes())
    if (!isa<RankedTensorType>(t))
      return func.emitError() << "convert-moe-to-cpu: result of type " << t
                              << " is not supported; only ranked tensors";
  Block &body = func.getBody().front();
  for (Operation &op : body) {
    if (isa<func::ReturnOp>(op))
      continue;
    if (!isa<MoEDialect>(op.getDialect()))
      return op.emitError() << "convert-moe-to-cpu: '" << op.getName()
                            << "' is not supported in a MoE function";
    PlanType plan;
    if (auto p = dyn_cast<PlanOp>(op))
      plan = p.getPlan().getType();
    else if (auto l = dyn_cast<LayerOp>(op))
      plan = l.getPlanType();
    else if (auto g = dyn_cast<LayerGradOp>(op))
      plan = g.getPlanType();
    if (plan && plan.getEp() != 1)
      return op.emitError()
             << "convert-moe-to-cpu: expert parallelism (ep = " << plan.getEp()
             << ") needs a communicator; the CPU backend runs ep = 1 only";
    if (auto g = dyn_cast<LayerGradOp>(op); g && g.accumulatesMainGrads())
      return op.emitError("convert-moe-to-cpu: main_grads (main_grad + dW) "
                          "is implemented for the GPU targets only");
  }

  // New signature: memrefs for the arguments, then one output per result.
  SmallVector<Type> argTypes;
  for (Type t : func.getArgumentTypes())
    argTypes.push_back(bufferType(t));
  for (Type t : func.getResultTypes())
    argTypes.push_back(bufferType(t));
  unsigned numArgs = func.getNumArguments();
  auto oldReturn = cast<func::ReturnOp>(body.getTerminator());

  // The new body is built in a second block of the region (builders need a
  // parent), then replaces the old one.
  Block *entry = new Block();
  func.getBody().push_back(entry);
  for (Type t : argTypes)
    entry->addArgument(t, func.getLoc());
  for (unsigned i = 0; i < numArgs; ++i)
    buffers[body.getArgument(i)] = entry->getArgument(i);

  OpBuilder b = OpBuilder::atBlockEnd(entry);
  for (Operation &op : body.without_terminator()) {
    Emitter e(b, op.getLoc());
    if (failed(lowerOp(e, &op))) {
      entry->dropAllDefinedValueUses();
      entry->erase();
      return failure();
    }
  }

  // Results: copy each into its output buffer (the routed rows that fit),
  // then free the temporaries.
  Emitter e(b, oldReturn.getLoc());
  for (auto [i, value] : llvm::enumerate(oldReturn.getOperands())) {
    Value src = buffers.lookup(value);
    Value dst = entry->getArgument(numArgs + i);
    auto type = cast<MemRefType>(dst.getType());
    std::function<void(SmallVector<Value>)> copy = [&](SmallVector<Value> idx) {
      if ((int64_t)idx.size() == type.getRank())
        return e.store(e.load(src, idx), dst, idx);
      unsigned d = idx.size();
      Value n = arith::MinSIOp::create(b, e.loc, e.dim(src, d), e.dim(dst, d));
      e.loop(n, [&](Value iv) {
        SmallVector<Value> next = idx;
        next.push_back(iv);
        copy(next);
      });
    };
    copy({});
  }
  for (Value m : temps)
    memref::DeallocOp::create(b, e.loc, m);
  func::ReturnOp::create(b, oldReturn.getLoc());

  // Swap in the new body.
  body.dropAllDefinedValueUses();
  body.erase();
  func.setFunctionType(FunctionType::get(func.getContext(), argTypes, {}));
  func.setAllResultAttrs(ArrayRef<DictionaryAttr>{});
  SmallVector<DictionaryAttr> argAttrs;
  for (unsigned i = 0; i < argTypes.size(); ++i)
    argAttrs.push_back(i < numArgs ? func.getArgAttrDict(i)
                                   : DictionaryAttr::get(func.getContext()));
  func.setAllArgAttrs(argAttrs);
  func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                UnitAttr::get(func.getContext()));
  return success();
}

LogicalResult FunctionLowering::lowerOp(Emitter &e, Operation *op) {
  return TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](PlanOp op) {
        plans[op.getPlan()] = emitPlan(e, op.getPlan().getType(),
                                       buffers.lookup(op.getTopExperts()),
                                       temps);
        return success();
      })
      .Case([&](DispatchOp op) {
        const Plan &p = plans[op.getPlan()];
        emitDispatch(e, p, buffers.lookup(op.getX()),
                     allocRows(e, op.getRoutedX(), p.rows));
        return success();
      })
      .Case([&](ExpertSwigluOp op) {
        const Plan &p = plans[op.getPlan()];
        emitExpertSwiglu(e, p, buffers.lookup(op.getRoutedX()),
                         buffers.lookup(op.getGateWeights()),
                         buffers.lookup(op.getUpWeights()),
                         getLimit(op.getSwigluLimitAttr()), nullptr, nullptr,
                         allocRows(e, op.getHidden(), p.rows));
        return success();
      })
      .Case([&](ExpertDownOp op) {
        const Plan &p = plans[op.getPlan()];
        emitExpertDown(e, p, buffers.lookup(op.getHidden()),
                       buffers.lookup(op.getDownWeights()),
                       allocRows(e, op.getRoutedY(), p.rows));
        return success();
      })
      .Case([&](SharedExpertOp op) {
        Value x = buffers.lookup(op.getX());
        Value tokens = e.dim(x, 0);
        auto wg = cast<RankedTensorType>(op.getGateWeights().getType());
        auto hiddenType = RankedTensorType::get(
            {ShapedType::kDynamic, wg.getDimSize(0)}, wg.getElementType());
        Value hidden = allocFor(e, hiddenType, {tokens});
        emitSharedExpert(e, x, buffers.lookup(op.getGateWeights()),
                         buffers.lookup(op.getUpWeights()),
                         buffers.lookup(op.getDownWeights()),
                         getLimit(op.getSwigluLimitAttr()), nullptr, nullptr,
                         hidden, allocRows(e, op.getOut(), tokens));
        return success();
      })
      .Case([&](CombineOp op) {
        const Plan &p = plans[op.getPlan()];
        Value shared = op.getSharedOut() ? buffers.lookup(op.getSharedOut())
                                         : Value();
        emitCombine(e, p, buffers.lookup(op.getRoutedY()),
                    buffers.lookup(op.getRouterWeights()), shared,
                    allocRows(e, op.getOut(), p.tokens));
        return success();
      })
      .Case([&](LayerOp op) {
        lowerLayer(e, op);
        return success();
      })
      .Case([&](LayerGradOp op) {
        lowerLayerGrad(e, op);
        return success();
      })
      .Default([&](Operation *op) {
        return op->emitError() << "convert-moe-to-cpu: '" << op->getName()
                               << "' is not supported";
      });
}

void FunctionLowering::lowerLayer(Emitter &e, LayerOp op) {
  Plan p = emitPlan(e, op.getPlanType(), buffers.lookup(op.getTopExperts()),
                    temps);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  auto x = cast<RankedTensorType>(op.getX().getType());
  auto wg = cast<RankedTensorType>(op.getGateWeights().getType());
  Type bf16 = x.getElementType();
  int64_t dyn = ShapedType::kDynamic;
  auto routedH = RankedTensorType::get({dyn, x.getDimSize(1)}, bf16);
  auto routedI = RankedTensorType::get({dyn, wg.getDimSize(1)}, bf16);

  // The context tensors are the layer's own intermediates.
  auto saved = [&](unsigned i, Type type, Value rows) {
    Value m = allocFor(e, type, {rows});
    if (op.savesContext())
      buffers[op.getSaved()[i]] = m;
    return m;
  };
  Value routedX = saved(0, routedH, p.rows);
  Value gate = op.savesContext() ? saved(1, routedI, p.rows) : Value();
  Value up = op.savesContext() ? saved(2, routedI, p.rows) : Value();
  Value hidden = saved(3, routedI, p.rows);
  emitDispatch(e, p, buffers.lookup(op.getX()), routedX);
  emitExpertSwiglu(e, p, routedX, buffers.lookup(op.getGateWeights()),
                   buffers.lookup(op.getUpWeights()), limit, gate, up, hidden);
  Value routedY = allocFor(e, routedH, {p.rows});
  emitExpertDown(e, p, hidden, buffers.lookup(op.getDownWeights()), routedY);

  Value sharedOut;
  if (op.hasSharedExpert()) {
    auto sg = cast<RankedTensorType>(op.getSharedGate().getType());
    auto sharedI = RankedTensorType::get({dyn, sg.getDimSize(0)}, bf16);
    Value sGate = op.savesContext() ? saved(4, sharedI, p.tokens) : Value();
    Value sUp = op.savesContext() ? saved(5, sharedI, p.tokens) : Value();
    Value sHidden = saved(6, sharedI, p.tokens);
    sharedOut = allocFor(e, RankedTensorType::get({dyn, x.getDimSize(1)}, bf16),
                         {p.tokens});
    emitSharedExpert(e, buffers.lookup(op.getX()),
                     buffers.lookup(op.getSharedGate()),
                     buffers.lookup(op.getSharedUp()),
                     buffers.lookup(op.getSharedDown()), limit, sGate, sUp,
                     sHidden, sharedOut);
  }
  emitCombine(e, p, routedY, buffers.lookup(op.getRouterWeights()), sharedOut,
              allocRows(e, op.getOut(), p.tokens));
}

void FunctionLowering::lowerLayerGrad(Emitter &e, LayerGradOp op) {
  Plan p = emitPlan(e, op.getPlanType(), buffers.lookup(op.getTopExperts()),
                    temps);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  auto xType = cast<RankedTensorType>(op.getX().getType());
  auto wgType = cast<RankedTensorType>(op.getGateWeights().getType());
  Type bf16 = xType.getElementType();
  int64_t dyn = ShapedType::kDynamic;
  auto routedH = RankedTensorType::get({dyn, xType.getDimSize(1)}, bf16);
  auto routedI = RankedTensorType::get({dyn, wgType.getDimSize(1)}, bf16);
  Value x = buffers.lookup(op.getX()), dOut = buffers.lookup(op.getDOut());
  Value rw = buffers.lookup(op.getRouterWeights());
  Value wg = buffers.lookup(op.getGateWeights());
  Value wu = buffers.lookup(op.getUpWeights());
  Value wd = buffers.lookup(op.getDownWeights());
  Value hiddenSize = e.dim(x, 1), inter = e.dim(wg, 1);
  Value k = e.index(p.topK);

  // The context: read it, or recompute it exactly as forward computed it.
  Value routedX, gate, up, hidden;
  if (!op.recomputes()) {
    routedX = buffers.lookup(op.getSaved()[0]);
    gate = buffers.lookup(op.getSaved()[1]);
    up = buffers.lookup(op.getSaved()[2]);
    hidden = buffers.lookup(op.getSaved()[3]);
  } else {
    routedX = allocFor(e, routedH, {p.rows});
    gate = allocFor(e, routedI, {p.rows});
    up = allocFor(e, routedI, {p.rows});
    hidden = allocFor(e, routedI, {p.rows});
    emitDispatch(e, p, x, routedX);
    emitExpertSwiglu(e, p, routedX, wg, wu, limit, gate, up, hidden);
  }

  // Down projection: d_hidden (scaled by the router weight), the router
  // weight gradient <d_out, y> = <d_out W_d, h>, and the down weights' grad.
  Value dRouterWeights = allocRows(e, op.getDRouterWeights(), p.tokens);
  e.fill(dRouterWeights, e.f32(0.0f));
  Value dHidden = allocFor(e, routedI, {p.rows});
  forEachRow(e, p, [&](Value ex, Value r) {
    Value route = e.load(p.rowRoute, {r});
    e.ifThen(
        e.isValid(route),
        [&] {
          Value t = e.div(route, k), kk = e.rem(route, k);
          Value w = e.load(rw, {t, kk});
          Value dw = e.sum(inter, [&](Value i) {
            Value dhU = e.sum(hiddenSize, [&](Value j) {
              return e.mul(e.loadF32(dOut, {t, j}), e.loadF32(wd, {ex, j, i}));
            });
            e.storeRounded(e.mul(w, dhU), dHidden, {r, i});
            return e.mul(dhU, e.loadF32(hidden, {r, i}));
          });
          e.store(dw, dRouterWeights, {t, kk});
        },
        [&] {
          Value zero = arith::ConstantOp::create(e.b, e.loc,
                                                 e.b.getZeroAttr(bf16));
          e.loop(inter, [&](Value i) { e.store(zero, dHidden, {r, i}); });
        });
  });
  Value dDown = allocRows(e, op.getDDownWeights(), Value());
  e.loop(p.experts, [&](Value ex) {
    Value begin = e.load(p.offsets, {ex});
    Value end = e.load(p.offsets, {e.add(ex, e.index(1))});
    e.loop(hiddenSize, [&](Value j) {
      e.loop(inter, [&](Value i) {
        Value acc = e.sum(begin, end, [&](Value r) {
          Value route = e.load(p.rowRoute, {r});
          return e.ifValue(
              e.isValid(route),
              [&] {
                Value t = e.div(route, k), kk = e.rem(route, k);
                Value dy = e.roundBF16(
                    e.mul(e.load(rw, {t, kk}), e.loadF32(dOut, {t, j})));
                return e.mul(dy, e.loadF32(hidden, {r, i}));
              },
              [&] { return e.f32(0.0f); });
        });
        e.storeRounded(acc, dDown, {ex, j, i});
      });
    });
  });

  // SwiGLU backward, then the fused gate+up dgrad and their weight grads.
  Value dGate = allocFor(e, routedI, {p.rows});
  Value dUp = allocFor(e, routedI, {p.rows});
  auto emitSwigluGrad = [&](Value rows, Value dh, Value g, Value u, Value dg,
                            Value du) {
    e.loop(rows, [&](Value r) {
      e.loop(e.dim(dh, 1), [&](Value i) {
        auto [vg, vu] =
            swigluGrad(e, e.loadF32(dh, {r, i}), e.loadF32(g, {r, i}),
                       e.loadF32(u, {r, i}), limit, SigmoidMath::exact);
        e.storeRounded(vg, dg, {r, i});
        e.storeRounded(vu, du, {r, i});
      });
    });
  };
  emitSwigluGrad(p.rows, dHidden, gate, up, dGate, dUp);

  // d_in[r, j] = bf16(sum_i dg[r,i] Wg[.., i, j] + du[r,i] Wu[.., i, j]).
  auto emitDgradRow = [&](Value r, Value dg, Value du, ValueRange prefix,
                          Value g, Value u, Value out) {
    int64_t rank = cast<MemRefType>(g.getType()).getRank();
    Value n = e.dim(g, rank - 2);
    e.loop(e.dim(g, rank - 1), [&](Value j) {
      Value acc = e.sum(n, [&](Value i) {
        SmallVector<Value> idx(prefix);
        idx.append({i, j});
        return e.add(e.mul(e.loadF32(dg, {r, i}), e.loadF32(g, idx)),
                     e.mul(e.loadF32(du, {r, i}), e.loadF32(u, idx)));
      });
      e.storeRounded(acc, out, {r, j});
    });
  };
  Value dRoutedX = allocFor(e, routedH, {p.rows});
  forEachRow(e, p, [&](Value ex, Value r) {
    emitDgradRow(r, dGate, dUp, {ex}, wg, wu, dRoutedX);
  });
  Value dWg = allocRows(e, op.getDGateWeights(), Value());
  Value dWu = allocRows(e, op.getDUpWeights(), Value());
  e.loop(p.experts, [&](Value ex) {
    Value begin = e.load(p.offsets, {ex});
    Value end = e.load(p.offsets, {e.add(ex, e.index(1))});
    e.loop(inter, [&](Value i) {
      e.loop(hiddenSize, [&](Value j) {
        for (auto [dAct, dW] : {std::pair(dGate, dWg), std::pair(dUp, dWu)}) {
          Value acc = e.sum(begin, end, [&](Value r) {
            return e.mul(e.loadF32(dAct, {r, i}), e.loadF32(routedX, {r, j}));
          });
          e.storeRounded(acc, dW, {ex, i, j});
        }
      });
    });
  });

  // The shared expert: the same with weight 1 on every token.
  Value dSharedX;
  if (op.hasSharedExpert()) {
    Value sg = buffers.lookup(op.getSharedWeights()[0]);
    Value su = buffers.lookup(op.getSharedWeights()[1]);
    Value sd = buffers.lookup(op.getSharedWeights()[2]);
    auto sgType = cast<RankedTensorType>(op.getSharedWeights()[0].getType());
    auto sharedI = RankedTensorType::get({dyn, sgType.getDimSize(0)}, bf16);
    Value sGate, sUp, sHidden;
    if (!op.recomputes()) {
      sGate = buffers.lookup(op.getSaved()[4]);
      sUp = buffers.lookup(op.getSaved()[5]);
      sHidden = buffers.lookup(op.getSaved()[6]);
    } else {
      sGate = allocFor(e, sharedI, {p.tokens});
      sUp = allocFor(e, sharedI, {p.tokens});
      sHidden = allocFor(e, sharedI, {p.tokens});
      emitSharedExpert(e, x, sg, su, sd, limit, sGate, sUp, sHidden, Value());
    }
    Value sInter = e.dim(sg, 0);
    Value dsHidden = allocFor(e, sharedI, {p.tokens});
    e.loop(p.tokens, [&](Value t) {
      e.loop(sInter, [&](Value i) {
        Value acc = e.sum(hiddenSize, [&](Value j) {
          return e.mul(e.loadF32(dOut, {t, j}), e.loadF32(sd, {j, i}));
        });
        e.storeRounded(acc, dsHidden, {t, i});
      });
    });
    ValueRange dShared = op.getDSharedWeights();
    Value dSg = allocRows(e, dShared[0], Value());
    Value dSu = allocRows(e, dShared[1], Value());
    Value dSd = allocRows(e, dShared[2], Value());
    e.loop(hiddenSize, [&](Value j) {
      e.loop(sInter, [&](Value i) {
        Value acc = e.sum(p.tokens, [&](Value t) {
          return e.mul(e.loadF32(dOut, {t, j}), e.loadF32(sHidden, {t, i}));
        });
        e.storeRounded(acc, dSd, {j, i});
      });
    });
    Value dsGate = allocFor(e, sharedI, {p.tokens});
    Value dsUp = allocFor(e, sharedI, {p.tokens});
    emitSwigluGrad(p.tokens, dsHidden, sGate, sUp, dsGate, dsUp);
    dSharedX = allocFor(e, RankedTensorType::get({dyn, xType.getDimSize(1)}, bf16),
                        {p.tokens});
    e.loop(p.tokens, [&](Value t) {
      emitDgradRow(t, dsGate, dsUp, {}, sg, su, dSharedX);
    });
    e.loop(sInter, [&](Value i) {
      e.loop(hiddenSize, [&](Value j) {
        for (auto [dAct, dW] : {std::pair(dsGate, dSg), std::pair(dsUp, dSu)}) {
          Value acc = e.sum(p.tokens, [&](Value t) {
            return e.mul(e.loadF32(dAct, {t, i}), e.loadF32(x, {t, j}));
          });
          e.storeRounded(acc, dW, {i, j});
        }
      });
    });
  }

  // d_x[t] = bf16(f32(d_x_shared[t]) + sum_k f32(d_routed_x[row(t, k)])).
  Value dX = allocRows(e, op.getDX(), p.tokens);
  e.loop(p.tokens, [&](Value t) {
    e.loop(hiddenSize, [&](Value j) {
      Value init = dSharedX ? e.loadF32(dSharedX, {t, j}) : e.f32(0.0f);
      Value acc = e.fold(e.index(0), k, init, [&](Value kk, Value acc) {
        Value row = e.load(p.routeRow, {e.add(e.mul(t, k), kk)});
        Value term =
            e.ifValue(e.isValid(row), [&] { return e.loadF32(dRoutedX, {row, j}); },
                      [&] { return e.f32(0.0f); });
        return e.add(acc, term);
      });
      e.storeRounded(acc, dX, {t, j});
    });
  });
}

struct ConvertMoEToCPUPass
    : public mok::impl::ConvertMoEToCPUBase<ConvertMoEToCPUPass> {
  void runOnOperation() override {
    SmallVector<func::FuncOp> funcs;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isDeclaration())
        continue;
      bool hasMoE = false;
      func.walk([&](Operation *op) {
        hasMoE |= isa<MoEDialect>(op->getDialect());
      });
      if (hasMoE)
        funcs.push_back(func);
    }
    for (func::FuncOp func : funcs)
      if (failed(FunctionLowering(func).run()))
        return signalPassFailure();
  }
};

} // namespace
