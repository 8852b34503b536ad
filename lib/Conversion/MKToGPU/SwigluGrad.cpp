// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mk.swiglu_grad: the SwiGLU's backward a row at a time (one warp a row),
// and the router weights' gradient as each row's fixed-order sum.
//
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

namespace {

class SwigluGradLowering : GridBuilder {
public:
  explicit SwigluGradLowering(const GridBuilder &grid) : GridBuilder(grid) {}

  void lower(mk::SwigluGradOp op);

private:
  void swigluGradVector(mk::SwigluGradOp op);
  void swigluGradScalar(mk::SwigluGradOp op);
  /// mk.swiglu_grad's row loop: one warp a row (warps spread over the
  /// blocks first); `row(r, lane, scale)` does row r (scale: its route's
  /// weight, 1 shared) and returns the lane's partial of d_w, which a
  /// fixed butterfly sums and lane 0 stores; routed, a padding row's
  /// `zeros(r, lane)` stores its zero d_gate and d_up instead; then the
  /// routes without a row get zeros.
  void swigluGradRows(mk::SwigluGradOp op,
                      function_ref<Value(Value, Value, Value)> row,
                      function_ref<void(Value, Value)> zeros);
};

} // namespace

void SwigluGradLowering::lower(mk::SwigluGradOp op) {
  // 8 columns a lane (16-byte accesses) when the rows are whole 16-byte
  // pieces and every buffer is aligned; else one column a lane.
  if (size(op.getDHiddenU(), 1) % 8 == 0) {
    SmallVector<Value> buffers = {op.getDHiddenU(), op.getGate(), op.getUp(),
                                  op.getDGate(), op.getDUp()};
    if (op.getRowRoute())
      buffers.push_back(op.getHidden());
    e.ifThen(
        aligned16(buffers), [&] { swigluGradVector(op); },
        [&] { swigluGradScalar(op); });
    return;
  }
  swigluGradScalar(op);
}

void SwigluGradLowering::swigluGradRows(
    mk::SwigluGradOp op, function_ref<Value(Value, Value, Value)> row,
    function_ref<void(Value, Value)> zeros) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value dh = op.getDHiddenU(), rowRoute = op.getRowRoute();
  Value w = op.getRouterWeights(), dw = op.getDRouterWeights();
  bool routed = static_cast<bool>(rowRoute);
  // (Any T: the shared expert's rows are the call's tokens.)
  Value tokens = op.getTokens();
  Value rows = routed   ? routedRows(op.getOffsets())
               : tokens ? tokens
                        : e.index(size(dh, 0));
  Value k = routed ? e.index(size(w, 1)) : Value();
  // One warp a row, warps spread over the blocks first.
  Value width = arith::ConstantIntOp::create(b, loc, 32, 32);
  forAllWarps(rows, [&](Value r, Value lane) {
    if (!routed) {
      row(r, lane, e.f32(1.0f));
      return;
    }
    Value q = e.toIndex(e.load(rowRoute, {r}));
    // A padding row (no route; its warp is uniform) reads nothing: what the
    // GEMMs left in its d_hidden_u, gate and up rows was never written, and
    // its d_gate and d_up rows are zeros for the weight gradients' sums.
    e.ifThen(
        e.isValid(q),
        [&] {
          Value t = e.div(q, k), kk = e.rem(q, k);
          Value partial = row(r, lane, e.load(w, {t, kk}));
          // The row sum: a fixed butterfly over the lanes.
          for (int64_t d = 16; d >= 1; d /= 2) {
            Value off = arith::ConstantIntOp::create(b, loc, d, 32);
            Value other = gpu::ShuffleOp::create(b, loc, partial, off, width,
                                                 gpu::ShuffleMode::XOR)
                              .getResult(0);
            partial = e.add(partial, other);
          }
          e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)),
                   [&] { e.store(partial, dw, {t, kk}); });
        },
        [&] { zeros(r, lane); });
  });
  if (!routed)
    return;
  // Routes without a row: a zero gradient.
  Value routeRow = op.getRouteRow();
  forAll(tokens ? e.mul(tokens, k) : e.index(size(routeRow, 0)), [&](Value q) {
    e.ifThen(e.cmp(arith::CmpIPredicate::slt, e.toIndex(e.load(routeRow, {q})),
                   e.index(0)),
             [&] {
               e.store(e.f32(0.0f), dw, {e.div(q, k), e.rem(q, k)});
             });
  });
}

void SwigluGradLowering::swigluGradScalar(mk::SwigluGradOp op) {
  Value dh = op.getDHiddenU(), gate = op.getGate(), up = op.getUp();
  Value hidden = op.getHidden();
  bool routed = static_cast<bool>(op.getRowRoute());
  int64_t cols = size(dh, 1);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  swigluGradRows(op, [&](Value r, Value lane, Value scale) {
    return e.fold(
        lane, e.index(cols), e.index(32), e.f32(0.0f), [&](Value i, Value acc) {
          Value dhU = e.loadF32(dh, {r, i});
          auto [dg, du] = swigluGrad(
              e, e.roundBF16(e.mul(scale, dhU)), e.loadF32(gate, {r, i}),
              e.loadF32(up, {r, i}), limit, sigmoidFor(limit));
          e.storeRounded(dg, op.getDGate(), {r, i});
          e.storeRounded(du, op.getDUp(), {r, i});
          return routed ? e.add(acc, e.mul(dhU, e.loadF32(hidden, {r, i})))
                        : acc;
        });
  }, [&](Value r, Value lane) {
    e.loop(lane, e.index(cols), e.index(32), [&](Value i) {
      e.storeRounded(e.f32(0.0f), op.getDGate(), {r, i});
      e.storeRounded(e.f32(0.0f), op.getDUp(), {r, i});
    });
  });
}

void SwigluGradLowering::swigluGradVector(mk::SwigluGradOp op) {
  // The scalar form's arithmetic, 8 columns a lane: 16-byte loads and
  // stores (d_hidden_u's 8 floats in two), the lane's partial of d_w
  // summed in column order within each piece. A lane loads `per` pieces
  // (c, c + 32, ...) before it computes any, so that several are in flight;
  // its partial still sums them in the order c, c + 32, ...
  bool routed = static_cast<bool>(op.getRowRoute());
  int64_t cols = size(op.getDHiddenU(), 1), pieces = cols / 8;
  int64_t per = std::min<int64_t>(rowPieces, (pieces + 31) / 32);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  Value dhBase = base(op.getDHiddenU()), gBase = base(op.getGate());
  Value uBase = base(op.getUp()), hBase = base(op.getHidden());
  Value dgBase = base(op.getDGate()), duBase = base(op.getDUp());
  auto v8 = VectorType::get({8}, e.b.getBF16Type());
  auto f4 = VectorType::get({4}, e.b.getF32Type());
  struct Piece {
    Value at0, inRange;
    SmallVector<Value, 2> dh;
    Value g, u, h;
  };
  swigluGradRows(op, [&](Value r, Value lane, Value scale) {
    return e.fold(
        lane, e.index(pieces), e.index(32 * per), e.f32(0.0f),
        [&](Value c0, Value acc) {
          // Loads of every piece first (a piece past the row's end loads
          // the last piece again and is not used).
          SmallVector<Piece> loaded;
          for (int64_t i = 0; i < per; ++i) {
            Piece p;
            Value c = e.add(c0, e.index(32 * i));
            p.inRange = e.cmp(arith::CmpIPredicate::slt, c, e.index(pieces));
            c = arith::MinSIOp::create(e.b, e.loc, c, e.index(pieces - 1));
            p.at0 = e.add(e.mul(r, e.index(cols)), e.mul(c, e.index(8)));
            for (int64_t half = 0; half < 2; ++half)
              p.dh.push_back(
                  load16(f4, at(dhBase, e.add(p.at0, e.index(4 * half)), 4)));
            p.g = load16(v8, at(gBase, p.at0));
            p.u = load16(v8, at(uBase, p.at0));
            if (routed)
              p.h = load16(v8, at(hBase, p.at0));
            loaded.push_back(p);
          }
          for (const Piece &p : loaded) {
            SmallVector<Value> dhU;
            for (Value v : p.dh)
              for (int64_t i = 0; i < 4; ++i)
                dhU.push_back(LLVM::ExtractElementOp::create(
                    e.b, e.loc, v,
                    arith::ConstantIntOp::create(e.b, e.loc, i, 32)));
            SmallVector<Value> g = unpack8(p.g), u = unpack8(p.u), h;
            if (routed)
              h = unpack8(p.h);
            SmallVector<Value> dgs, dus;
            Value partial = acc;
            for (int64_t i = 0; i < 8; ++i) {
              auto [dg, du] = swigluGrad(e, e.roundBF16(e.mul(scale, dhU[i])),
                                         g[i], u[i], limit, sigmoidFor(limit));
              if (routed)
                partial = e.add(partial, e.mul(dhU[i], h[i]));
              dgs.push_back(dg);
              dus.push_back(du);
            }
            bool whole = pieces % (32 * per) == 0;
            auto store = [&] {
              store16Streaming(pack8(dgs), at(dgBase, p.at0));
              store16Streaming(pack8(dus), at(duBase, p.at0));
            };
            if (whole) {
              store();
              acc = partial;
            } else {
              e.ifThen(p.inRange, store);
              acc = e.select(p.inRange, partial, acc);
            }
          }
          return acc;
        });
  }, [&](Value r, Value lane) {
    SmallVector<Value> zero(8, e.f32(0.0f));
    Value z = pack8(zero);
    e.loop(lane, e.index(pieces), e.index(32), [&](Value c) {
      Value at0 = e.add(e.mul(r, e.index(cols)), e.mul(c, e.index(8)));
      store16Streaming(z, at(dgBase, at0));
      store16Streaming(z, at(duBase, at0));
    });
  });
}

void mok::conversion::lowerSwigluGrad(const GridBuilder &grid,
                                      mk::SwigluGradOp op) {
  SwigluGradLowering(grid).lower(op);
}
