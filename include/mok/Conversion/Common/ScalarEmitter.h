// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Scalar code emission shared by the moe lowerings (CPU reference, GPU SIMT
// phases): loops, conditionals, bf16/f32 loads and rounded stores, and the
// SwiGLU numerics of the dialect, so every backend computes the activation
// and its derivative with the same operations in the same order.
//
#ifndef MOK_CONVERSION_COMMON_SCALAREMITTER_H
#define MOK_CONVERSION_COMMON_SCALAREMITTER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"

#include <functional>
#include <optional>

namespace mok::conversion {

using namespace mlir;

//===----------------------------------------------------------------------===//
// Emitter: loops, conditionals and bf16/f32 scalar access at one point
//===----------------------------------------------------------------------===//

class Emitter {
public:
  Emitter(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  OpBuilder &b;
  Location loc;

  Value index(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value f32(float v) {
    return arith::ConstantFloatOp::create(b, loc, b.getF32Type(), APFloat(v));
  }
  Value add(Value x, Value y) {
    return isa<IndexType>(x.getType())
               ? Value(arith::AddIOp::create(b, loc, x, y))
               : Value(arith::AddFOp::create(b, loc, x, y));
  }
  Value sub(Value x, Value y) {
    return isa<IndexType>(x.getType())
               ? Value(arith::SubIOp::create(b, loc, x, y))
               : Value(arith::SubFOp::create(b, loc, x, y));
  }
  Value mul(Value x, Value y) {
    return isa<IndexType>(x.getType())
               ? Value(arith::MulIOp::create(b, loc, x, y))
               : Value(arith::MulFOp::create(b, loc, x, y));
  }
  Value div(Value x, Value y) { return arith::DivSIOp::create(b, loc, x, y); }
  Value rem(Value x, Value y) { return arith::RemSIOp::create(b, loc, x, y); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value cmpf(arith::CmpFPredicate p, Value x, Value y) {
    return arith::CmpFOp::create(b, loc, p, x, y);
  }
  Value isValid(Value row) { // rows and routes use -1 for "none"
    return cmp(arith::CmpIPredicate::sge, row, index(0));
  }
  Value select(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, loc, c, x, y);
  }
  Value minf(Value x, Value y) { return arith::MinimumFOp::create(b, loc, x, y); }
  Value maxf(Value x, Value y) { return arith::MaximumFOp::create(b, loc, x, y); }

  /// for iv in [lb, ub) step `step`: body(iv)
  void loop(Value lb, Value ub, Value step, function_ref<void(Value)> body) {
    auto op = scf::ForOp::create(b, loc, lb, ub, step);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.getBody()->getTerminator());
    body(op.getInductionVar());
  }
  /// for iv in [lb, ub): body(iv)
  void loop(Value lb, Value ub, function_ref<void(Value)> body) {
    auto op = scf::ForOp::create(b, loc, lb, ub, index(1));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.getBody()->getTerminator());
    body(op.getInductionVar());
  }
  void loop(Value n, function_ref<void(Value)> body) {
    loop(index(0), n, body);
  }
  void loop(int64_t n, function_ref<void(Value)> body) {
    loop(index(0), index(n), body);
  }

  /// acc = init; for iv in [lb, ub): acc = step(iv, acc); returns acc.
  Value fold(Value lb, Value ub, Value init,
             function_ref<Value(Value, Value)> step) {
    return fold(lb, ub, index(1), init, step);
  }
  /// The same, iv stepping by `stride`.
  Value fold(Value lb, Value ub, Value stride, Value init,
             function_ref<Value(Value, Value)> step) {
    auto op = scf::ForOp::create(b, loc, lb, ub, stride, ValueRange{init});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(op.getBody());
    Value next = step(op.getInductionVar(), op.getRegionIterArgs()[0]);
    scf::YieldOp::create(b, loc, next);
    return op.getResult(0);
  }

  /// fp32 sum over [lb, ub) of addend(iv), in index order.
  Value sum(Value lb, Value ub, function_ref<Value(Value)> addend) {
    return fold(lb, ub, f32(0.0f),
                [&](Value iv, Value acc) { return add(acc, addend(iv)); });
  }
  Value sum(Value n, function_ref<Value(Value)> addend) {
    return sum(index(0), n, addend);
  }
  Value sum(int64_t n, function_ref<Value(Value)> addend) {
    return sum(index(0), index(n), addend);
  }

  void ifThen(Value cond, function_ref<void()> then,
              function_ref<void()> otherwise = nullptr) {
    auto op = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/bool(otherwise));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.thenBlock()->getTerminator());
    then();
    if (otherwise) {
      b.setInsertionPoint(op.elseBlock()->getTerminator());
      otherwise();
    }
  }

  /// cond ? then() : otherwise(), evaluating only the chosen side (the other
  /// may index out of bounds).
  Value ifValue(Value cond, function_ref<Value()> then,
                function_ref<Value()> otherwise) {
    OpBuilder::InsertionGuard guard(b);
    auto op = scf::IfOp::create(b, loc, TypeRange{b.getF32Type()}, cond,
                                /*withElseRegion=*/true);
    b.setInsertionPointToEnd(op.thenBlock());
    scf::YieldOp::create(b, loc, then());
    b.setInsertionPointToEnd(op.elseBlock());
    scf::YieldOp::create(b, loc, otherwise());
    return op.getResult(0);
  }

  /// Element loads and stores say their natural alignment (the element's
  /// size): without it LLVM takes the default data layout's, where an i64
  /// is 4-aligned, and the NVPTX backend splits every i64 access in two.
  Value load(Value m, ValueRange idx) {
    auto op = memref::LoadOp::create(b, loc, m, idx);
    if (IntegerAttr align = naturalAlignment(m))
      op.setAlignmentAttr(align);
    return op;
  }
  void store(Value v, Value m, ValueRange idx) {
    auto op = memref::StoreOp::create(b, loc, v, m, idx);
    if (IntegerAttr align = naturalAlignment(m))
      op.setAlignmentAttr(align);
  }
  IntegerAttr naturalAlignment(Value m) {
    Type elt = cast<MemRefType>(m.getType()).getElementType();
    if (!elt.isIntOrFloat() || elt.getIntOrFloatBitWidth() % 8)
      return {};
    return b.getI64IntegerAttr(elt.getIntOrFloatBitWidth() / 8);
  }
  /// Loads an element as f32 (bf16 widened exactly).
  Value loadF32(Value m, ValueRange idx) {
    Value v = load(m, idx);
    if (v.getType().isF32())
      return v;
    return arith::ExtFOp::create(b, loc, b.getF32Type(), v);
  }
  /// Stores an f32 value, rounded (to nearest even) to the buffer's type.
  void storeRounded(Value v, Value m, ValueRange idx) {
    Type elt = cast<MemRefType>(m.getType()).getElementType();
    if (elt != v.getType())
      v = arith::TruncFOp::create(b, loc, elt, v);
    store(v, m, idx);
  }
  /// Rounds an f32 value to bf16 and back: what a bf16 store-and-load does.
  Value roundBF16(Value v) {
    Value r = arith::TruncFOp::create(b, loc, b.getBF16Type(), v);
    return arith::ExtFOp::create(b, loc, b.getF32Type(), r);
  }
  Value dim(Value m, int64_t d) { return memref::DimOp::create(b, loc, m, d); }
  Value toIndex(Value v) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
  }

  Value alloc(MemRefType type, ValueRange dynSizes) {
    return memref::AllocOp::create(b, loc, type, dynSizes);
  }
  void fill(Value m, Value v) {
    auto type = cast<MemRefType>(m.getType());
    std::function<void(SmallVector<Value>)> rec = [&](SmallVector<Value> idx) {
      if ((int64_t)idx.size() == type.getRank())
        return store(v, m, idx);
      loop(dim(m, idx.size()), [&](Value i) {
        SmallVector<Value> next = idx;
        next.push_back(i);
        rec(next);
      });
    };
    rec({});
  }
};

//===----------------------------------------------------------------------===//
// Numerics shared by forward and backward
//===----------------------------------------------------------------------===//

/// The clamp of the clamped SwiGLU, absent when unclamped.
using Limit = std::optional<float>;

inline Limit getLimit(FloatAttr attr) {
  if (!attr || attr.getValue().isInfinity())
    return std::nullopt;
  return attr.getValue().convertToFloat();
}

/// How the sigmoid 1 / (1 + e^-x) computes its exponential and division.
enum class SigmoidMath {
  /// expf and IEEE division (the CPU reference).
  exact,
  /// Fast-math `afn` on both: on the GPU __nv_fast_expf (ex2.approx.ftz of
  /// x log2(e), a relative error near 1e-6 where the sigmoid is not yet 0
  /// or 1, against bf16's 4e-3) and rcp.approx.f32 (within an ulp). The
  /// IEEE rcp.rn.f32 costs a range check and a slow-path call per element
  /// and the accurate expf ten instructions: in the SwiGLU epilogue of the
  /// gate/up GEMM they cost a tenth of qwen3-30b's gate/up phase on the
  /// H200.
  fast,
};

inline Value sigmoid(Emitter &e, Value x, SigmoidMath math) {
  auto flags = math == SigmoidMath::fast ? arith::FastMathFlags::afn
                                         : arith::FastMathFlags::none;
  Value negX = arith::NegFOp::create(e.b, e.loc, x);
  Value ex = math::ExpOp::create(e.b, e.loc, negX, flags);
  return arith::DivFOp::create(e.b, e.loc, e.f32(1.0f), e.add(e.f32(1.0f), ex),
                               flags);
}

/// h = silu(min(g, L)) * clamp(u, -L, L), in f32 from bf16-valued g and u.
inline Value swiglu(Emitter &e, Value g, Value u, Limit limit,
                    SigmoidMath math) {
  if (limit) {
    g = e.minf(g, e.f32(*limit));
    u = e.maxf(e.minf(u, e.f32(*limit)), e.f32(-*limit));
  }
  return e.mul(e.mul(g, sigmoid(e, g, math)), u);
}

/// (d_g, d_u) of the clamped SwiGLU, in f32.
inline std::pair<Value, Value> swigluGrad(Emitter &e, Value dh, Value g,
                                          Value u, Limit limit,
                                          SigmoidMath math) {
  Value gc = g, uc = u;
  if (limit) {
    gc = e.minf(g, e.f32(*limit));
    uc = e.maxf(e.minf(u, e.f32(*limit)), e.f32(-*limit));
  }
  Value s = sigmoid(e, gc, math);
  Value silu = e.mul(gc, s);
  Value dsilu = e.add(s, e.mul(silu, e.sub(e.f32(1.0f), s)));
  Value dg = e.mul(e.mul(dh, uc), dsilu);
  Value du = e.mul(dh, silu);
  if (limit) {
    Value zero = e.f32(0.0f), l = e.f32(*limit), negL = e.f32(-*limit);
    dg = e.select(e.cmpf(arith::CmpFPredicate::OLE, g, l), dg, zero);
    Value inRange =
        arith::AndIOp::create(e.b, e.loc,
                              e.cmpf(arith::CmpFPredicate::OGE, u, negL),
                              e.cmpf(arith::CmpFPredicate::OLE, u, l));
    du = e.select(inRange, du, zero);
  }
  return {dg, du};
}

} // namespace mok::conversion

#endif // MOK_CONVERSION_COMMON_SCALAREMITTER_H
