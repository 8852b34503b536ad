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
#include "mlir/IR/Matchers.h"

#include <functional>
#include <optional>

namespace mok::conversion {

//===----------------------------------------------------------------------===//
// Emitter: loops, conditionals and bf16/f32 scalar access at one point
//===----------------------------------------------------------------------===//

class Emitter {
public:
  Emitter(mlir::OpBuilder &b, mlir::Location loc) : b(b), loc(loc) {}

  mlir::OpBuilder &b;
  mlir::Location loc;

  mlir::Value index(int64_t v) {
    return mlir::arith::ConstantIndexOp::create(b, loc, v);
  }
  mlir::Value f32(float v) {
    return mlir::arith::ConstantFloatOp::create(b, loc, b.getF32Type(),
                                                mlir::APFloat(v));
  }
  mlir::Value add(mlir::Value x, mlir::Value y) {
    return mlir::isa<mlir::IndexType>(x.getType())
               ? mlir::Value(mlir::arith::AddIOp::create(b, loc, x, y))
               : mlir::Value(mlir::arith::AddFOp::create(b, loc, x, y));
  }
  mlir::Value sub(mlir::Value x, mlir::Value y) {
    return mlir::isa<mlir::IndexType>(x.getType())
               ? mlir::Value(mlir::arith::SubIOp::create(b, loc, x, y))
               : mlir::Value(mlir::arith::SubFOp::create(b, loc, x, y));
  }
  mlir::Value mul(mlir::Value x, mlir::Value y) {
    return mlir::isa<mlir::IndexType>(x.getType())
               ? mlir::Value(mlir::arith::MulIOp::create(b, loc, x, y))
               : mlir::Value(mlir::arith::MulFOp::create(b, loc, x, y));
  }
  mlir::Value div(mlir::Value x, mlir::Value y) {
    return mlir::arith::DivSIOp::create(b, loc, x, y);
  }
  mlir::Value rem(mlir::Value x, mlir::Value y) {
    return mlir::arith::RemSIOp::create(b, loc, x, y);
  }
  mlir::Value cmp(mlir::arith::CmpIPredicate p, mlir::Value x, mlir::Value y) {
    return mlir::arith::CmpIOp::create(b, loc, p, x, y);
  }
  mlir::Value cmpf(mlir::arith::CmpFPredicate p, mlir::Value x, mlir::Value y) {
    return mlir::arith::CmpFOp::create(b, loc, p, x, y);
  }
  mlir::Value isValid(mlir::Value row) { // rows and routes use -1 for "none"
    return cmp(mlir::arith::CmpIPredicate::sge, row, index(0));
  }
  mlir::Value select(mlir::Value c, mlir::Value x, mlir::Value y) {
    return mlir::arith::SelectOp::create(b, loc, c, x, y);
  }
  mlir::Value minf(mlir::Value x, mlir::Value y) {
    return mlir::arith::MinimumFOp::create(b, loc, x, y);
  }
  mlir::Value maxf(mlir::Value x, mlir::Value y) {
    return mlir::arith::MaximumFOp::create(b, loc, x, y);
  }

  /// for iv in [lb, ub) step `step`: body(iv)
  void loop(mlir::Value lb, mlir::Value ub, mlir::Value step,
            mlir::function_ref<void(mlir::Value)> body) {
    auto op = mlir::scf::ForOp::create(b, loc, lb, ub, step);
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.getBody()->getTerminator());
    body(op.getInductionVar());
  }
  /// for iv in [lb, ub): body(iv)
  void loop(mlir::Value lb, mlir::Value ub,
            mlir::function_ref<void(mlir::Value)> body) {
    auto op = mlir::scf::ForOp::create(b, loc, lb, ub, index(1));
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.getBody()->getTerminator());
    body(op.getInductionVar());
  }
  void loop(mlir::Value n, mlir::function_ref<void(mlir::Value)> body) {
    loop(index(0), n, body);
  }
  void loop(int64_t n, mlir::function_ref<void(mlir::Value)> body) {
    loop(index(0), index(n), body);
  }

  /// acc = init; for iv in [lb, ub): acc = step(iv, acc); returns acc.
  mlir::Value
  fold(mlir::Value lb, mlir::Value ub, mlir::Value init,
       mlir::function_ref<mlir::Value(mlir::Value, mlir::Value)> step) {
    return fold(lb, ub, index(1), init, step);
  }
  /// The same, iv stepping by `stride`.
  mlir::Value
  fold(mlir::Value lb, mlir::Value ub, mlir::Value stride, mlir::Value init,
       mlir::function_ref<mlir::Value(mlir::Value, mlir::Value)> step) {
    auto op = mlir::scf::ForOp::create(b, loc, lb, ub, stride,
                                       mlir::ValueRange{init});
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(op.getBody());
    mlir::Value next = step(op.getInductionVar(), op.getRegionIterArgs()[0]);
    mlir::scf::YieldOp::create(b, loc, next);
    return op.getResult(0);
  }

  /// fp32 sum over [lb, ub) of addend(iv), in index order.
  mlir::Value sum(mlir::Value lb, mlir::Value ub,
                  mlir::function_ref<mlir::Value(mlir::Value)> addend) {
    return fold(lb, ub, f32(0.0f), [&](mlir::Value iv, mlir::Value acc) {
      return add(acc, addend(iv));
    });
  }
  mlir::Value sum(mlir::Value n,
                  mlir::function_ref<mlir::Value(mlir::Value)> addend) {
    return sum(index(0), n, addend);
  }
  mlir::Value sum(int64_t n,
                  mlir::function_ref<mlir::Value(mlir::Value)> addend) {
    return sum(index(0), index(n), addend);
  }

  /// if (cond) then() else otherwise(); a constant `cond` emits only the
  /// side it takes.
  void ifThen(mlir::Value cond, mlir::function_ref<void()> then,
              mlir::function_ref<void()> otherwise = nullptr) {
    llvm::APInt known;
    if (mlir::matchPattern(cond, mlir::m_ConstantInt(&known))) {
      if (!known.isZero())
        then();
      else if (otherwise)
        otherwise();
      return;
    }
    auto op = mlir::scf::IfOp::create(b, loc, cond,
                                      /*withElseRegion=*/bool(otherwise));
    mlir::OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.thenBlock()->getTerminator());
    then();
    if (otherwise) {
      b.setInsertionPoint(op.elseBlock()->getTerminator());
      otherwise();
    }
  }

  /// cond ? then() : otherwise(), evaluating only the chosen side (the other
  /// may index out of bounds).
  mlir::Value ifValue(mlir::Value cond, mlir::function_ref<mlir::Value()> then,
                      mlir::function_ref<mlir::Value()> otherwise) {
    mlir::OpBuilder::InsertionGuard guard(b);
    auto op =
        mlir::scf::IfOp::create(b, loc, mlir::TypeRange{b.getF32Type()}, cond,
                                /*withElseRegion=*/true);
    b.setInsertionPointToEnd(op.thenBlock());
    mlir::scf::YieldOp::create(b, loc, then());
    b.setInsertionPointToEnd(op.elseBlock());
    mlir::scf::YieldOp::create(b, loc, otherwise());
    return op.getResult(0);
  }

  /// Element loads and stores say their natural alignment (the element's
  /// size): without it LLVM takes the default data layout's, where an i64
  /// is 4-aligned, and the NVPTX backend splits every i64 access in two.
  mlir::Value load(mlir::Value m, mlir::ValueRange idx) {
    auto op = mlir::memref::LoadOp::create(b, loc, m, idx);
    if (mlir::IntegerAttr align = naturalAlignment(m))
      op.setAlignmentAttr(align);
    return op;
  }
  void store(mlir::Value v, mlir::Value m, mlir::ValueRange idx) {
    auto op = mlir::memref::StoreOp::create(b, loc, v, m, idx);
    if (mlir::IntegerAttr align = naturalAlignment(m))
      op.setAlignmentAttr(align);
  }
  mlir::IntegerAttr naturalAlignment(mlir::Value m) {
    mlir::Type elt = mlir::cast<mlir::MemRefType>(m.getType()).getElementType();
    if (!elt.isIntOrFloat() || elt.getIntOrFloatBitWidth() % 8)
      return {};
    return b.getI64IntegerAttr(elt.getIntOrFloatBitWidth() / 8);
  }
  /// Loads an element as f32 (bf16 widened exactly).
  mlir::Value loadF32(mlir::Value m, mlir::ValueRange idx) {
    mlir::Value v = load(m, idx);
    if (v.getType().isF32())
      return v;
    return mlir::arith::ExtFOp::create(b, loc, b.getF32Type(), v);
  }
  /// Stores an f32 value, rounded (to nearest even) to the buffer's type.
  void storeRounded(mlir::Value v, mlir::Value m, mlir::ValueRange idx) {
    mlir::Type elt = mlir::cast<mlir::MemRefType>(m.getType()).getElementType();
    if (elt != v.getType())
      v = mlir::arith::TruncFOp::create(b, loc, elt, v);
    store(v, m, idx);
  }
  /// Rounds an f32 value to bf16 and back: what a bf16 store-and-load does.
  mlir::Value roundBF16(mlir::Value v) {
    mlir::Value r = mlir::arith::TruncFOp::create(b, loc, b.getBF16Type(), v);
    return mlir::arith::ExtFOp::create(b, loc, b.getF32Type(), r);
  }
  mlir::Value dim(mlir::Value m, int64_t d) {
    return mlir::memref::DimOp::create(b, loc, m, d);
  }
  mlir::Value toIndex(mlir::Value v) {
    return mlir::arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
  }

  mlir::Value alloc(mlir::MemRefType type, mlir::ValueRange dynSizes) {
    return mlir::memref::AllocOp::create(b, loc, type, dynSizes);
  }
  void fill(mlir::Value m, mlir::Value v) {
    auto type = mlir::cast<mlir::MemRefType>(m.getType());
    std::function<void(mlir::SmallVector<mlir::Value>)> rec =
        [&](mlir::SmallVector<mlir::Value> idx) {
          if ((int64_t)idx.size() == type.getRank())
            return store(v, m, idx);
          loop(dim(m, idx.size()), [&](mlir::Value i) {
            mlir::SmallVector<mlir::Value> next = idx;
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

inline Limit getLimit(mlir::FloatAttr attr) {
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

inline mlir::Value sigmoid(Emitter &e, mlir::Value x, SigmoidMath math) {
  auto flags = math == SigmoidMath::fast
                   ? mlir::arith::FastMathFlags::afn
                   : mlir::arith::FastMathFlags::none;
  mlir::Value negX = mlir::arith::NegFOp::create(e.b, e.loc, x);
  mlir::Value ex = mlir::math::ExpOp::create(e.b, e.loc, negX, flags);
  return mlir::arith::DivFOp::create(e.b, e.loc, e.f32(1.0f),
                                     e.add(e.f32(1.0f), ex), flags);
}

/// h = silu(min(g, L)) * clamp(u, -L, L), in f32 from bf16-valued g and u.
inline mlir::Value swiglu(Emitter &e, mlir::Value g, mlir::Value u, Limit limit,
                          SigmoidMath math) {
  if (limit) {
    g = e.minf(g, e.f32(*limit));
    u = e.maxf(e.minf(u, e.f32(*limit)), e.f32(-*limit));
  }
  return e.mul(e.mul(g, sigmoid(e, g, math)), u);
}

/// (d_g, d_u) of the clamped SwiGLU, in f32.
inline std::pair<mlir::Value, mlir::Value>
swigluGrad(Emitter &e, mlir::Value dh, mlir::Value g, mlir::Value u,
           Limit limit, SigmoidMath math) {
  mlir::Value gc = g, uc = u;
  if (limit) {
    gc = e.minf(g, e.f32(*limit));
    uc = e.maxf(e.minf(u, e.f32(*limit)), e.f32(-*limit));
  }
  mlir::Value s = sigmoid(e, gc, math);
  mlir::Value silu = e.mul(gc, s);
  mlir::Value dsilu = e.add(s, e.mul(silu, e.sub(e.f32(1.0f), s)));
  mlir::Value dg = e.mul(e.mul(dh, uc), dsilu);
  mlir::Value du = e.mul(dh, silu);
  if (limit) {
    mlir::Value zero = e.f32(0.0f), l = e.f32(*limit), negL = e.f32(-*limit);
    dg = e.select(e.cmpf(mlir::arith::CmpFPredicate::OLE, g, l), dg, zero);
    mlir::Value inRange = mlir::arith::AndIOp::create(
        e.b, e.loc, e.cmpf(mlir::arith::CmpFPredicate::OGE, u, negL),
        e.cmpf(mlir::arith::CmpFPredicate::OLE, u, l));
    du = e.select(inRange, du, zero);
  }
  return {dg, du};
}

} // namespace mok::conversion

#endif // MOK_CONVERSION_COMMON_SCALAREMITTER_H
