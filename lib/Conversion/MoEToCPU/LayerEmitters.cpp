// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The pieces of a MoE layer as host loops (LayerEmitters.h). The loops are
// deliberately plain — one accumulator per output element, reduction order
// fixed — because this code defines what "correct" means for the GPU
// backends.
//
#include "LayerEmitters.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mok::conversion;
using namespace mok::cpu;

//===----------------------------------------------------------------------===//
// The routing plan
//===----------------------------------------------------------------------===//

MemRefType mok::cpu::indexBuffer(OpBuilder &b, int64_t size) {
  return MemRefType::get({size}, b.getIndexType());
}

Plan mok::cpu::emitPlan(Emitter &e, int64_t topK, int64_t experts,
                        int64_t padding, Value topExperts, Temps &temps) {
  Plan p;
  p.topK = topK;
  p.experts = experts;
  p.padding = padding;
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
void mok::cpu::emitDispatch(Emitter &e, const Plan &p, Value x, Value routedX) {
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

void mok::cpu::emitExpertSwiglu(Emitter &e, const Plan &p, Value routedX,
                             Value wg, Value wu, Limit limit, Value gateOut,
                             Value upOut, Value hiddenOut) {
  forEachRow(e, p, [&](Value ex, Value r) {
    emitGateUpRow(e, routedX, r, wg, wu, {ex}, limit, gateOut, upOut,
                  hiddenOut);
  });
}

void mok::cpu::emitExpertDown(Emitter &e, const Plan &p, Value hidden, Value wd,
                           Value routedY) {
  forEachRow(e, p, [&](Value ex, Value r) {
    emitDownRow(e, hidden, r, wd, {ex}, routedY);
  });
}

/// The shared expert on every token; `out` may be null when only the
/// activations are wanted (backward recomputation).
void mok::cpu::emitSharedExpert(Emitter &e, Value x, Value sg, Value su, Value sd,
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
void mok::cpu::emitCombine(Emitter &e, const Plan &p, Value routedY,
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


Plan mok::cpu::emitRouteRows(Emitter &e, int64_t topK, int64_t experts,
                             Value topExperts, Temps &temps) {
  Plan p;
  p.topK = topK;
  p.experts = experts;
  p.tokens = e.dim(topExperts, 0);
  Value k = e.index(topK), zero = e.index(0), none = e.index(-1);
  p.routeRow = e.alloc(indexBuffer(e.b), {e.mul(p.tokens, k)});
  temps.push_back(p.routeRow);
  e.loop(p.tokens, [&](Value t) {
    e.loop(topK, [&](Value kk) {
      Value route = e.add(e.mul(t, k), kk);
      Value id = e.toIndex(e.load(topExperts, {t, kk}));
      Value valid = arith::AndIOp::create(
          e.b, e.loc, e.cmp(arith::CmpIPredicate::sge, id, zero),
          e.cmp(arith::CmpIPredicate::slt, id, e.index(experts)));
      e.store(e.select(valid, route, none), p.routeRow, {route});
    });
  });
  return p;
}

//===----------------------------------------------------------------------===//
// Backward pieces
//===----------------------------------------------------------------------===//

static MemRefType rowsOf(Value like, int64_t cols) {
  auto type = cast<MemRefType>(like.getType());
  return MemRefType::get({ShapedType::kDynamic, cols}, type.getElementType());
}

/// (dg, du) rows from dh and the saved g, u: the SwiGLU's backward.
static void emitSwigluGrad(Emitter &e, Limit limit, Value rows, Value dh,
                           Value g, Value u, Value dg, Value du) {
  e.loop(rows, [&](Value r) {
    e.loop(e.dim(dh, 1), [&](Value i) {
      auto [vg, vu] =
          swigluGrad(e, e.loadF32(dh, {r, i}), e.loadF32(g, {r, i}),
                     e.loadF32(u, {r, i}), limit, SigmoidMath::exact);
      e.storeRounded(vg, dg, {r, i});
      e.storeRounded(vu, du, {r, i});
    });
  });
}

/// out[r, j] = bf16(sum_i dg[r,i] Wg[.., i, j] + du[r,i] Wu[.., i, j]).
static void emitDgradRow(Emitter &e, Value r, Value dg, Value du,
                         ValueRange prefix, Value g, Value u, Value out) {
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
}

void mok::cpu::emitRoutedGrad(Emitter &e, const Plan &p, Limit limit, Value x,
                              Value dOut, Value rw, Value wg, Value wu,
                              Value wd, RoutedContext saved,
                              Value dRouteWeights, RouteWeightGrads layout,
                              Value dRoutedX, Value dWg, Value dWu, Value dWd,
                              Temps &temps, Fp8Blocks fp8) {
  Value hiddenSize = e.dim(dOut, 1), inter = e.dim(wg, 1);
  // FP8: the quantized-then-dequantized (f32) copy of a GEMM operand.
  auto q = [&](Value src, int64_t rows, int64_t cols) {
    return fp8.on ? emitFakeQuantize(e, src, rows, cols, fp8.mx, temps) : src;
  };
  Value k = e.index(p.topK);
  Type bf16 = cast<MemRefType>(dOut.getType()).getElementType();
  int64_t h = cast<MemRefType>(wg.getType()).getDimSize(2);
  int64_t i = cast<MemRefType>(wg.getType()).getDimSize(1);
  auto alloc = [&](MemRefType type) {
    Value m = e.alloc(type, {p.rows});
    temps.push_back(m);
    return m;
  };
  MemRefType routedI = rowsOf(dOut, i);

  // The context: read it, or recompute it exactly as forward computed it.
  RoutedContext ctx = saved;
  if (!ctx) {
    ctx.routedX = alloc(rowsOf(dOut, h));
    ctx.gate = alloc(routedI);
    ctx.up = alloc(routedI);
    ctx.hidden = alloc(routedI);
    emitDispatch(e, p, x, ctx.routedX);
    emitExpertSwiglu(e, p, ctx.routedX, wg, wu, limit, ctx.gate, ctx.up,
                     ctx.hidden);
  }

  // Down projection: d_hidden (scaled by the router weight), the router
  // weight gradient <d_out, y> = <d_out W_d, h>, and the down weights' grad.
  Value dHidden = alloc(routedI);
  Value dOutQ = q(dOut, 1, fp8.act);                        // per token row
  Value wdQ = q(wd, fp8.weightRowsT, fp8.weightColsT);      // along H
  forEachRow(e, p, [&](Value ex, Value r) {
    Value route = e.load(p.rowRoute, {r});
    e.ifThen(
        e.isValid(route),
        [&] {
          Value t = e.div(route, k), kk = e.rem(route, k);
          Value w = e.load(rw, {t, kk});
          Value dw = e.sum(inter, [&](Value i) {
            Value dhU = e.sum(hiddenSize, [&](Value j) {
              return e.mul(e.loadF32(dOutQ, {t, j}), e.loadF32(wdQ, {ex, j, i}));
            });
            e.storeRounded(e.mul(w, dhU), dHidden, {r, i});
            return e.mul(dhU, e.loadF32(ctx.hidden, {r, i}));
          });
          if (layout == RouteWeightGrads::ByRoute)
            e.store(dw, dRouteWeights, {t, kk});
          else
            e.store(dw, dRouteWeights, {r});
        },
        [&] {
          Value zero = arith::ConstantOp::create(e.b, e.loc,
                                                 e.b.getZeroAttr(bf16));
          e.loop(inter, [&](Value i) { e.store(zero, dHidden, {r, i}); });
        });
  });
  // dW_d[e] = sum over the expert's rows of bf16(w d_out[t])^T h[r]; with
  // fp8, from d_y materialized (0 on padding rows) and h, each quantized in
  // blocks of rows.
  Value dYQ, hiddenQ;
  if (fp8.on) {
    Value dY = alloc(rowsOf(dOut, h));
    forEachRow(e, p, [&](Value ex, Value r) {
      Value route = e.load(p.rowRoute, {r});
      e.loop(hiddenSize, [&](Value j) {
        Value dy = e.ifValue(
            e.isValid(route),
            [&] {
              Value t = e.div(route, k), kk = e.rem(route, k);
              return e.roundBF16(
                  e.mul(e.load(rw, {t, kk}), e.loadF32(dOut, {t, j})));
            },
            [&] { return e.f32(0.0f); });
        e.storeRounded(dy, dY, {r, j});
      });
    });
    dYQ = q(dY, fp8.rows, 1);
    hiddenQ = q(ctx.hidden, fp8.rows, 1);
  }
  e.loop(p.experts, [&](Value ex) {
    Value begin = e.load(p.offsets, {ex});
    Value end = e.load(p.offsets, {e.add(ex, e.index(1))});
    e.loop(hiddenSize, [&](Value j) {
      e.loop(inter, [&](Value i) {
        Value acc = e.sum(begin, end, [&](Value r) {
          if (fp8.on)
            return e.mul(e.loadF32(dYQ, {r, j}), e.loadF32(hiddenQ, {r, i}));
          Value route = e.load(p.rowRoute, {r});
          return e.ifValue(
              e.isValid(route),
              [&] {
                Value t = e.div(route, k), kk = e.rem(route, k);
                Value dy = e.roundBF16(
                    e.mul(e.load(rw, {t, kk}), e.loadF32(dOut, {t, j})));
                return e.mul(dy, e.loadF32(ctx.hidden, {r, i}));
              },
              [&] { return e.f32(0.0f); });
        });
        e.storeRounded(acc, dWd, {ex, j, i});
      });
    });
  });

  // SwiGLU backward, then the fused gate+up dgrad and their weight grads.
  Value dGate = alloc(routedI);
  Value dUp = alloc(routedI);
  emitSwigluGrad(e, limit, p.rows, dHidden, ctx.gate, ctx.up, dGate, dUp);
  {
    Value dGateQ = q(dGate, 1, fp8.act), dUpQ = q(dUp, 1, fp8.act); // along I
    Value wgQ = q(wg, fp8.weightRowsT, fp8.weightColsT);            // along I
    Value wuQ = q(wu, fp8.weightRowsT, fp8.weightColsT);
    forEachRow(e, p, [&](Value ex, Value r) {
      emitDgradRow(e, r, dGateQ, dUpQ, {ex}, wgQ, wuQ, dRoutedX);
    });
  }
  Value dGateR = q(dGate, fp8.rows, 1), dUpR = q(dUp, fp8.rows, 1);
  Value routedXR = q(ctx.routedX, fp8.rows, 1);
  e.loop(p.experts, [&](Value ex) {
    Value begin = e.load(p.offsets, {ex});
    Value end = e.load(p.offsets, {e.add(ex, e.index(1))});
    e.loop(inter, [&](Value i) {
      e.loop(hiddenSize, [&](Value j) {
        for (auto [dAct, dW] : {std::pair(dGateR, dWg), std::pair(dUpR, dWu)}) {
          Value acc = e.sum(begin, end, [&](Value r) {
            return e.mul(e.loadF32(dAct, {r, i}),
                         e.loadF32(routedXR, {r, j}));
          });
          e.storeRounded(acc, dW, {ex, i, j});
        }
      });
    });
  });
}

Value mok::cpu::emitSharedGrad(Emitter &e, Limit limit, Value x, Value dOut,
                               Value sg, Value su, Value sd,
                               SharedContext saved, Value dSg, Value dSu,
                               Value dSd, Temps &temps) {
  Value tokens = e.dim(x, 0), hiddenSize = e.dim(x, 1);
  int64_t is = cast<MemRefType>(sg.getType()).getDimSize(0);
  int64_t h = cast<MemRefType>(x.getType()).getDimSize(1);
  auto alloc = [&](MemRefType type) {
    Value m = e.alloc(type, {tokens});
    temps.push_back(m);
    return m;
  };
  MemRefType sharedI = rowsOf(x, is);
  SharedContext ctx = saved;
  if (!ctx) {
    ctx.gate = alloc(sharedI);
    ctx.up = alloc(sharedI);
    ctx.hidden = alloc(sharedI);
    emitSharedExpert(e, x, sg, su, sd, limit, ctx.gate, ctx.up, ctx.hidden,
                     Value());
  }
  Value sInter = e.dim(sg, 0);
  Value dsHidden = alloc(sharedI);
  e.loop(tokens, [&](Value t) {
    e.loop(sInter, [&](Value i) {
      Value acc = e.sum(hiddenSize, [&](Value j) {
        return e.mul(e.loadF32(dOut, {t, j}), e.loadF32(sd, {j, i}));
      });
      e.storeRounded(acc, dsHidden, {t, i});
    });
  });
  e.loop(hiddenSize, [&](Value j) {
    e.loop(sInter, [&](Value i) {
      Value acc = e.sum(tokens, [&](Value t) {
        return e.mul(e.loadF32(dOut, {t, j}), e.loadF32(ctx.hidden, {t, i}));
      });
      e.storeRounded(acc, dSd, {j, i});
    });
  });
  Value dsGate = alloc(sharedI);
  Value dsUp = alloc(sharedI);
  emitSwigluGrad(e, limit, tokens, dsHidden, ctx.gate, ctx.up, dsGate, dsUp);
  Value dSharedX = alloc(rowsOf(x, h));
  e.loop(tokens, [&](Value t) {
    emitDgradRow(e, t, dsGate, dsUp, {}, sg, su, dSharedX);
  });
  e.loop(sInter, [&](Value i) {
    e.loop(hiddenSize, [&](Value j) {
      for (auto [dAct, dW] : {std::pair(dsGate, dSg), std::pair(dsUp, dSu)}) {
        Value acc = e.sum(tokens, [&](Value t) {
          return e.mul(e.loadF32(dAct, {t, i}), e.loadF32(x, {t, j}));
        });
        e.storeRounded(acc, dW, {i, j});
      }
    });
  });
  return dSharedX;
}

void mok::cpu::emitInputGrad(Emitter &e, const Plan &p, Value dRoutedX,
                             Value dSharedX, Value dX) {
  Value hiddenSize = e.dim(dX, 1), k = e.index(p.topK);
  e.loop(p.tokens, [&](Value t) {
    e.loop(hiddenSize, [&](Value j) {
      Value init = dSharedX ? e.loadF32(dSharedX, {t, j}) : e.f32(0.0f);
      Value acc = e.fold(e.index(0), k, init, [&](Value kk, Value acc) {
        Value row = e.load(p.routeRow, {e.add(e.mul(t, k), kk)});
        Value term = e.ifValue(
            e.isValid(row), [&] { return e.loadF32(dRoutedX, {row, j}); },
            [&] { return e.f32(0.0f); });
        return e.add(acc, term);
      });
      e.storeRounded(acc, dX, {t, j});
    });
  });
}

void mok::cpu::emitCopyPrefix(Emitter &e, Value src, Value dst) {
  auto type = cast<MemRefType>(dst.getType());
  std::function<void(SmallVector<Value>)> copy = [&](SmallVector<Value> idx) {
    if ((int64_t)idx.size() == type.getRank())
      return e.store(e.load(src, idx), dst, idx);
    unsigned d = idx.size();
    Value n = arith::MinSIOp::create(e.b, e.loc, e.dim(src, d), e.dim(dst, d));
    e.loop(n, [&](Value iv) {
      SmallVector<Value> next = idx;
      next.push_back(iv);
      copy(next);
    });
  };
  copy({});
}
