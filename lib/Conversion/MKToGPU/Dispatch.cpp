// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Moving routed rows: the dispatch gather (mk.gather: x's rows into their
// experts' segments, or d_out's scaled by the router weight) and the
// combine (mk.combine: each token's routed rows, weighted, plus the shared
// expert's). Memory-bound: 16-byte accesses with several loads in flight
// a thread when the rows are whole 16-byte pieces and the buffers aligned,
// else one element at a time, with the same rounding either way.
//
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

#include <limits>

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

namespace {

class DispatchLowering : GridBuilder {
public:
  explicit DispatchLowering(const GridBuilder &grid) : GridBuilder(grid) {}

  void lower(mk::GatherOp op);
  void lower(mk::CombineOp op);

private:
  void gatherScalar(mk::GatherOp op);
  void gatherVector(mk::GatherOp op);
  /// FP8 rows: routed_scales[b, r] from x_scales (1 for a padding row).
  void gatherBlockScales(mk::GatherOp op);
  /// Bytes of an element of the rows gathered (bf16 2, FP8 1).
  static int64_t elementBytes(mk::GatherOp op) {
    return cast<MemRefType>(op.getX().getType())
               .getElementType()
               .getIntOrFloatBitWidth() /
           8;
  }
  void gatherScaledVector(mk::GatherOp op);
  void combineScalar(mk::CombineOp op);
  /// With `poison(%verdict)`: whether verdict[0] is set (i1), and the NaN
  /// every element then becomes (selected in, no branch); else null.
  std::pair<Value, Value> poisonOf(mk::CombineOp op) {
    Value verdict = op.getPoison();
    if (!verdict)
      return {};
    Value set = e.cmp(arith::CmpIPredicate::ne,
                      e.toIndex(e.load(verdict, {e.index(0)})), e.index(0));
    Value nan = arith::ConstantOp::create(
        e.b, e.loc,
        e.b.getF32FloatAttr(std::numeric_limits<float>::quiet_NaN()));
    return {set, nan};
  }
  Value tokensOf(mk::CombineOp op);
  void combineVector(mk::CombineOp op);
  /// The routes a token has in a combine: router_weights' columns, or
  /// (unweighted) route_row's size over the tokens.
  static int64_t topKOf(mk::CombineOp op) {
    if (Value w = op.getRouterWeights())
      return size(w, 1);
    return size(op.getRouteRow(), 0) / size(op.getOut(), 0);
  }
};

} // namespace

void DispatchLowering::lower(mk::GatherOp op) {
  // FP8 rows: their block scales too.
  if (op.getXScales())
    gatherBlockScales(op);
  // Rows of whole 16-byte pieces (8 bf16, 16 FP8) are copied 16 bytes at
  // a time when every buffer is 16-byte aligned (the same bits either way;
  // scaled, the same rounding of w * x per element).
  if (size(op.getX(), 1) * elementBytes(op) % 16)
    return gatherScalar(op);
  e.ifThen(
      aligned16({op.getX(), op.getRoutedX()}),
      [&] {
        if (op.getScale())
          gatherScaledVector(op);
        else
          gatherVector(op);
      },
      [&] { gatherScalar(op); });
}

void DispatchLowering::gatherBlockScales(mk::GatherOp op) {
  Value rowRoute = op.getRowRoute(), from = op.getXScales();
  Value to = op.getRoutedScales();
  Value k = e.index(op.getTopK());
  // Rows fastest: a warp's stores into routed_scales[b, r] are contiguous.
  Value rows = routedRows(op.getOffsets());
  forAll(e.mul(rows, e.index(size(from, 0))), [&](Value i) {
    Value b = e.div(i, rows), r = e.rem(i, rows);
    Value route = e.toIndex(e.load(rowRoute, {r}));
    // A padding row's zeros: scale 1, as quantizing them gives.
    Value s = e.ifValue(
        e.isValid(route), [&] { return e.load(from, {b, e.div(route, k)}); },
        [&] { return e.f32(1.0f); });
    e.store(s, to, {b, r});
  });
}

void DispatchLowering::gatherScalar(mk::GatherOp op) {
  Value x = op.getX(), rowRoute = op.getRowRoute(), out = op.getRoutedX();
  Value k = e.index(op.getTopK());
  if (elementBytes(op) == 1) { // FP8: the bytes as they are
    Type elt = cast<MemRefType>(x.getType()).getElementType();
    Type i8 = e.b.getI8Type();
    forAll2(routedRows(op.getOffsets()), size(out, 1), [&](Value r, Value j) {
      Value route = e.toIndex(e.load(rowRoute, {r}));
      Value valid = e.isValid(route);
      // (A padding row reads row 0 and stores zeros.)
      Value t = e.div(e.select(valid, route, e.index(0)), k);
      Value byte = arith::BitcastOp::create(e.b, e.loc, i8, e.load(x, {t, j}));
      byte = e.select(valid, byte,
                      arith::ConstantIntOp::create(e.b, e.loc, 0, 8));
      e.store(arith::BitcastOp::create(e.b, e.loc, elt, byte), out, {r, j});
    });
    return;
  }
  forAll2(routedRows(op.getOffsets()), size(out, 1), [&](Value r, Value j) {
    Value route = e.toIndex(e.load(rowRoute, {r}));
    Value v = e.ifValue(
        e.isValid(route),
        [&] {
          Value t = e.div(route, k);
          Value v = e.loadF32(x, {t, j});
          if (Value w = op.getScale())
            v = e.mul(e.load(w, {t, e.rem(route, k)}), v);
          return v;
        },
        [&] { return e.f32(0.0f); });
    e.storeRounded(v, out, {r, j});
  });
}

void DispatchLowering::gatherVector(mk::GatherOp op) {
  // A thread copies `per` 16-byte pieces of a row, c, c + G, c + 2G, ...
  // (G = pieces / per, the threads of a row): all loads first, then all
  // stores, so that several loads are in flight (the compiler may not move
  // a load above a store to another buffer it cannot tell apart), and each
  // load or store instruction of a warp covers consecutive pieces. (With
  // each thread's pieces adjacent instead, a warp's instruction touched 32
  // pieces 16 * per bytes apart: at 16 pieces a thread the dsv3-shard
  // dispatch copy took 0.61 ms, at 4 0.31 ms.)
  Value rowRoute = op.getRowRoute();
  Value k = e.index(op.getTopK());
  int64_t h = size(op.getX(), 1), bytes = elementBytes(op);
  int64_t perPiece = 16 / bytes; // elements in a 16-byte piece
  int64_t pieces = h / perPiece, per = gatherPiecesOf(pieces);
  Value xBase = base(op.getX()), outBase = base(op.getRoutedX());
  auto v4 = VectorType::get({4}, e.b.getI32Type());
  Value zero = arith::ConstantOp::create(
      e.b, e.loc, v4, DenseElementsAttr::get(v4, int32_t(0)));
  // Elements between a thread's pieces.
  int64_t stride = perPiece * (pieces / per);
  forAll2(routedRows(op.getOffsets()), pieces / per, [&](Value r, Value c) {
    Value col = e.mul(c, e.index(perPiece));
    Value route = e.toIndex(e.load(rowRoute, {r}));
    Value valid = e.isValid(route);
    // Padding rows (no route) read row 0 of x and store zeros instead.
    Value token = e.select(valid, e.div(route, k), e.index(0));
    Value src = e.add(e.mul(token, e.index(h)), col);
    Value dst = e.add(e.mul(r, e.index(h)), col);
    SmallVector<Value> values;
    for (int64_t i = 0; i < per; ++i)
      values.push_back(e.select(
          valid,
          load16(v4, at(xBase, e.add(src, e.index(stride * i)), bytes)),
          zero));
    for (int64_t i = 0; i < per; ++i)
      store16Streaming(values[i],
                       at(outBase, e.add(dst, e.index(stride * i)), bytes));
  });
}

void DispatchLowering::gatherScaledVector(mk::GatherOp op) {
  // gatherVector's shape (`per` 16-byte pieces of a row a thread, G apart,
  // all loads first), then bf16(w * x) per element; padding rows store
  // zeros. One piece a thread took the dsv3-shard reverse combine 0.69 ms
  // on the H200 (a route, a weight and one load in flight per thread); four
  // adjacent ones 0.36 ms, sixteen adjacent ones 0.60 ms.
  Value rowRoute = op.getRowRoute(), w = op.getScale();
  Value k = e.index(op.getTopK());
  int64_t h = size(op.getX(), 1);
  int64_t pieces = h / 8, per = gatherPiecesOf(pieces);
  Value xBase = base(op.getX()), outBase = base(op.getRoutedX());
  auto v8 = VectorType::get({8}, e.b.getBF16Type());
  int64_t stride = 8 * (pieces / per);
  forAll2(routedRows(op.getOffsets()), pieces / per, [&](Value r, Value c) {
    Value col = e.mul(c, e.index(8));
    Value route = e.toIndex(e.load(rowRoute, {r}));
    Value valid = e.isValid(route);
    Value q = e.select(valid, route, e.index(0));
    Value t = e.div(q, k);
    Value scale = e.select(valid, e.load(w, {t, e.rem(q, k)}), e.f32(0.0f));
    Value src = e.add(e.mul(t, e.index(h)), col);
    Value dst = e.add(e.mul(r, e.index(h)), col);
    SmallVector<Value> loaded;
    for (int64_t i = 0; i < per; ++i)
      loaded.push_back(load16(v8, at(xBase, e.add(src, e.index(stride * i)))));
    for (int64_t i = 0; i < per; ++i) {
      SmallVector<Value> xs = unpack8(loaded[i]);
      // (Padding rows: zeros, whatever row 0 of x holds.)
      for (Value &x : xs)
        x = e.select(valid, e.mul(scale, x), e.f32(0.0f));
      store16Streaming(pack8(xs), at(outBase, e.add(dst, e.index(stride * i))));
    }
  });
}

/// The tokens a combine sums: out's rows, or the call's T (any T).
Value DispatchLowering::tokensOf(mk::CombineOp op) {
  if (Value t = op.getTokens())
    return t;
  return e.index(size(op.getOut(), 0));
}

void DispatchLowering::lower(mk::CombineOp op) {
  if (size(op.getOut(), 1) % 8)
    return combineScalar(op);
  SmallVector<Value> buffers = {op.getRoutedY(), op.getOut()};
  if (Value shared = op.getSharedOut())
    buffers.push_back(shared);
  e.ifThen(
      aligned16(buffers), [&] { combineVector(op); },
      [&] { combineScalar(op); });
}

void DispatchLowering::combineScalar(mk::CombineOp op) {
  Value out = op.getOut(), w = op.getRouterWeights(), y = op.getRoutedY();
  Value routeRow = op.getRouteRow(), shared = op.getSharedOut();
  Value k = e.index(topKOf(op));
  auto [poisoned, nan] = poisonOf(op);
  forAll2(tokensOf(op), size(out, 1), [&](Value t, Value j) {
    Value init = shared ? e.loadF32(shared, {t, j}) : e.f32(0.0f);
    Value acc = e.fold(e.index(0), k, init, [&](Value kk, Value acc) {
      Value row = e.toIndex(e.load(routeRow, {e.add(e.mul(t, k), kk)}));
      Value term = e.ifValue(
          e.isValid(row),
          [&] {
            Value v = e.loadF32(y, {row, j});
            return w ? e.mul(e.load(w, {t, kk}), v) : v;
          },
          [&] { return e.f32(0.0f); });
      return e.add(acc, term);
    });
    if (poisoned)
      acc = e.select(poisoned, nan, acc);
    e.storeRounded(acc, out, {t, j});
  });
}

void DispatchLowering::combineVector(mk::CombineOp op) {
  // The scalar combine, 8 columns a thread: the same operations in the same
  // order per element (a route without a row adds +0.0), with 16-byte
  // loads and stores. Straight-line over the k routes, with selects instead
  // of branches, so that all the row loads are in flight at once; a route
  // without a row loads row 0 and selects the value away.
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value w = op.getRouterWeights(), routeRow = op.getRouteRow();
  Value shared = op.getSharedOut();
  int64_t h = size(op.getOut(), 1), topK = topKOf(op);
  Value yBase = base(op.getRoutedY()), outBase = base(op.getOut());
  Value sharedBase = shared ? base(shared) : Value();
  auto [poisoned, nan] = poisonOf(op);
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  auto v8 = VectorType::get({8}, bf16);
  auto unpack = [&](Value vec) {
    SmallVector<Value> xs;
    for (int64_t i = 0; i < 8; ++i) {
      Value lane = arith::ConstantIntOp::create(b, loc, i, 32);
      Value x = LLVM::ExtractElementOp::create(b, loc, vec, lane);
      xs.push_back(arith::ExtFOp::create(b, loc, f32, x));
    }
    return xs;
  };
  // One item: token t's 8 columns from 8 * c8, its loads issued.
  struct Item {
    Value offset;
    SmallVector<Value> valid, weights, loaded;
    Value shared;
  };
  Value cols = e.index(h / 8);
  auto issue = [&](Value i) {
    Item it;
    Value t = e.div(i, cols);
    Value col = e.mul(e.rem(i, cols), e.index(8));
    it.offset = e.add(e.mul(t, e.index(h)), col);
    SmallVector<Value> rows;
    for (int64_t kk = 0; kk < topK; ++kk) {
      Value row = e.toIndex(
          e.load(routeRow, {e.add(e.mul(t, e.index(topK)), e.index(kk))}));
      it.valid.push_back(e.isValid(row));
      rows.push_back(e.select(it.valid.back(), row, e.index(0)));
      if (w)
        it.weights.push_back(e.load(w, {t, e.index(kk)}));
    }
    for (int64_t kk = 0; kk < topK; ++kk)
      it.loaded.push_back(
          load16(v8, at(yBase, e.add(e.mul(rows[kk], e.index(h)), col))));
    if (shared)
      it.shared = load16(v8, at(sharedBase, it.offset));
    return it;
  };
  auto finish = [&](const Item &it) {
    SmallVector<Value> acc =
        shared ? unpack(it.shared) : SmallVector<Value>(8, e.f32(0.0f));
    for (int64_t kk = 0; kk < topK; ++kk) {
      SmallVector<Value> ys = unpack(it.loaded[kk]);
      for (int64_t i = 0; i < 8; ++i) {
        Value y = w ? e.mul(it.weights[kk], ys[i]) : ys[i];
        Value term = e.select(it.valid[kk], y, e.f32(0.0f));
        acc[i] = e.add(acc[i], term);
      }
    }
    Value packed = LLVM::UndefOp::create(b, loc, v8);
    for (int64_t i = 0; i < 8; ++i) {
      Value lane = arith::ConstantIntOp::create(b, loc, i, 32);
      if (poisoned)
        acc[i] = e.select(poisoned, nan, acc[i]);
      Value r = arith::TruncFOp::create(b, loc, bf16, acc[i]);
      packed = LLVM::InsertElementOp::create(b, loc, packed, r, lane);
    }
    store16(packed, at(outBase, it.offset));
  };
  // combineItems items a thread per iteration (i, i + G, ...; G the grid's
  // threads), all their loads issued before any item is summed and stored:
  // an item's loads wait on its route rows, then on the routed rows, and
  // the stores keep LLVM from moving the next iteration's loads up. An
  // item past the end loads the last item again and stores nothing.
  Value n = e.mul(tokensOf(op), cols);
  Value last = e.sub(n, e.index(1));
  e.loop(globalId, n, e.mul(gridThreads, e.index(combineItems)), [&](Value i) {
    SmallVector<Value> items = {i};
    for (int64_t u = 1; u < combineItems; ++u)
      items.push_back(e.add(i, e.mul(gridThreads, e.index(u))));
    SmallVector<Item> issued;
    for (Value item : items)
      issued.push_back(
          issue(arith::MinSIOp::create(b, loc, item, last).getResult()));
    finish(issued[0]);
    for (int64_t u = 1; u < combineItems; ++u)
      e.ifThen(e.cmp(arith::CmpIPredicate::slt, items[u], n),
               [&] { finish(issued[u]); });
  });
}

void mok::conversion::lowerGather(const GridBuilder &grid, mk::GatherOp op) {
  DispatchLowering(grid).lower(op);
}

void mok::conversion::lowerCombine(const GridBuilder &grid, mk::CombineOp op) {
  DispatchLowering(grid).lower(op);
}
