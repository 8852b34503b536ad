// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Quantize.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mok::conversion;

namespace {

/// Integer and f32 helpers on top of the emitter.
struct Bits {
  Emitter &e;
  OpBuilder &b;
  Location loc;
  explicit Bits(Emitter &e) : e(e), b(e.b), loc(e.loc) {}

  Value i32(int64_t v) {
    return arith::ConstantIntOp::create(b, loc, b.getI32Type(), v);
  }
  Value toBits(Value f) {
    return arith::BitcastOp::create(b, loc, b.getI32Type(), f);
  }
  Value toF32(Value i) {
    return arith::BitcastOp::create(b, loc, b.getF32Type(), i);
  }
  Value shl(Value x, Value s) { return arith::ShLIOp::create(b, loc, x, s); }
  Value shr(Value x, Value s) { return arith::ShRUIOp::create(b, loc, x, s); }
  Value band(Value x, Value y) { return arith::AndIOp::create(b, loc, x, y); }
  Value bor(Value x, Value y) { return arith::OrIOp::create(b, loc, x, y); }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value maxs(Value x, Value y) { return arith::MaxSIOp::create(b, loc, x, y); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  /// 2^k as an f32, for a run-time k in the normal range [-126, 127].
  Value pow2(Value k) { return toF32(shl(add(k, i32(127)), i32(23))); }
  Value nan() {
    return arith::ConstantFloatOp::create(b, loc, b.getF32Type(),
                                          APFloat::getQNaN(APFloat::IEEEsingle()));
  }
  Value inf() {
    return arith::ConstantFloatOp::create(b, loc, b.getF32Type(),
                                          APFloat::getInf(APFloat::IEEEsingle()));
  }
  /// The low byte of an i32 as the 8-bit float type `type`.
  Value byteAs(Value i, Type type) {
    Value byte = arith::TruncIOp::create(b, loc, b.getI8Type(), i);
    return arith::BitcastOp::create(b, loc, type, byte);
  }
  /// An 8-bit float's bits as an i32 in [0, 256).
  Value byteOf(Value f8) {
    Value byte = arith::BitcastOp::create(b, loc, b.getI8Type(), f8);
    return arith::ExtUIOp::create(b, loc, b.getI32Type(), byte);
  }

  /// E4M3(v) (f8E4M3FN bits in an i32): the nearest value, ties to an even
  /// mantissa, sign kept, |v| >= 448 saturated to 448, NaN to 0x7F with
  /// v's sign. With q = |v| clamped to 448 and its exponent
  /// p = max(floor(log2 q), -6) (-6: the subnormals share the smallest
  /// normal's spacing 2^-9), the code is roundeven(q * 2^(3 - p)) + 8 (p + 6):
  /// the rounded mantissa counts in units of the spacing 2^(p - 3), and a
  /// carry into the next binade lands on the next exponent's code.
  Value encodeE4M3(Value v) {
    Value sign = shl(shr(toBits(v), i32(31)), i32(7));
    Value q = math::AbsFOp::create(b, loc, v);
    q = arith::MinimumFOp::create(
        b, loc, q,
        arith::ConstantFloatOp::create(b, loc, b.getF32Type(), APFloat(448.0f)));
    Value exponent = sub(shr(toBits(q), i32(23)), i32(127));
    Value p = maxs(exponent, i32(-6));
    Value scaled = arith::MulFOp::create(b, loc, q, pow2(sub(i32(3), p)));
    Value rounded = math::RoundEvenOp::create(b, loc, scaled);
    Value units = arith::FPToSIOp::create(b, loc, b.getI32Type(), rounded);
    Value code = add(units, mul(i32(8), add(p, i32(6))));
    Value isNaN = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, v, v);
    code = arith::SelectOp::create(b, loc, isNaN, i32(0x7F), code);
    return bor(code, sign);
  }

  /// The f32 value of f8E4M3FN bits `code` (an i32 in [0, 256)).
  Value decodeE4M3(Value code) {
    Value mag = band(code, i32(0x7F));
    Value exponent = shr(mag, i32(3));
    Value mantissa = band(mag, i32(7));
    Value normal = cmp(arith::CmpIPredicate::ne, exponent, i32(0));
    // (8 + m) * 2^(e - 10) for a normal, m * 2^-9 for a subnormal.
    Value units = arith::SelectOp::create(b, loc, normal, add(mantissa, i32(8)),
                                          mantissa);
    Value step = pow2(sub(maxs(exponent, i32(1)), i32(10)));
    Value value = arith::MulFOp::create(
        b, loc, arith::SIToFPOp::create(b, loc, b.getF32Type(), units), step);
    Value isNaN = cmp(arith::CmpIPredicate::eq, mag, i32(0x7F));
    value = arith::SelectOp::create(b, loc, isNaN, nan(), value);
    Value negative = cmp(arith::CmpIPredicate::ne, band(code, i32(0x80)), i32(0));
    return arith::SelectOp::create(b, loc, negative,
                                   arith::NegFOp::create(b, loc, value), value);
  }

  /// The f32 value of an E8M0 scale byte (an i32 in [0, 256)): 2^(b - 127),
  /// NaN for 0xFF, the subnormal 2^-127 for 0.
  Value decodeE8M0(Value byte) {
    Value normal = toF32(shl(byte, i32(23)));
    Value tiny = toF32(i32(0x00400000));
    Value v = arith::SelectOp::create(
        b, loc, cmp(arith::CmpIPredicate::eq, byte, i32(0)), tiny, normal);
    return arith::SelectOp::create(
        b, loc, cmp(arith::CmpIPredicate::eq, byte, i32(0xFF)), nan(), v);
  }
};

/// Loops over every index of `m`'s first `rank` dimensions.
void forEachIndex(Emitter &e, Value m, int64_t rank,
                  function_ref<void(ArrayRef<Value>)> body) {
  std::function<void(SmallVector<Value>)> rec = [&](SmallVector<Value> idx) {
    if ((int64_t)idx.size() == rank)
      return body(idx);
    e.loop(e.dim(m, idx.size()), [&](Value i) {
      SmallVector<Value> next = idx;
      next.push_back(i);
      rec(next);
    });
  };
  rec({});
}

} // namespace

void mok::cpu::emitQuantize(Emitter &e, Value input, Value values, Value scales,
                            int64_t rows, int64_t cols, bool transpose) {
  Bits bits(e);
  auto scaleType = cast<MemRefType>(scales.getType());
  Type scaleElt = scaleType.getElementType();
  Type valueElt = cast<MemRefType>(values.getType()).getElementType();
  bool mx = !scaleElt.isF32();
  int64_t rank = scaleType.getRank();
  forEachIndex(e, scales, rank, [&](ArrayRef<Value> block) {
    // The element (i, j) of the block: its index in the data quantized
    // (values), and in the input (transposed: the last two swapped).
    auto at = [&](Value i, Value j) {
      SmallVector<Value> idx(block.begin(), block.end());
      idx[rank - 2] = e.add(e.mul(idx[rank - 2], e.index(rows)), i);
      idx[rank - 1] = e.add(e.mul(idx[rank - 1], e.index(cols)), j);
      return idx;
    };
    auto inputAt = [&](Value i, Value j) {
      SmallVector<Value> idx = at(i, j);
      if (transpose)
        std::swap(idx[rank - 2], idx[rank - 1]);
      return idx;
    };
    auto overBlock = [&](Value init, function_ref<Value(Value, Value)> step) {
      return e.fold(e.index(0), e.index(rows), init, [&](Value i, Value acc) {
        return e.fold(e.index(0), e.index(cols), acc, [&](Value j, Value acc2) {
          return step(e.loadF32(input, inputAt(i, j)), acc2);
        });
      });
    };
    // amax: NaN if the block holds a NaN, +inf if an infinity.
    Value amax = overBlock(e.f32(0.0f), [&](Value x, Value acc) {
      return e.maxf(acc, math::AbsFOp::create(e.b, e.loc, x));
    });
    Value finite = e.cmpf(arith::CmpFPredicate::OLT, amax, bits.inf());

    Value multiplier, divisor, scaleValue;
    if (mx) {
      // e = the smallest integer with amax <= 448 * 2^e. With
      // amax = m * 2^k (m in [1, 2)) and 448 = 1.75 * 2^8: e = k - 8, plus
      // one when m > 1.75 (mantissa bits above 0x600000); a zero or
      // subnormal amax, or e below -127, gives -127.
      Value a = bits.toBits(amax);
      Value field = bits.shr(a, bits.i32(23));
      Value bump = arith::ExtUIOp::create(
          e.b, e.loc, e.b.getI32Type(),
          bits.cmp(arith::CmpIPredicate::ugt, bits.band(a, bits.i32(0x7FFFFF)),
                   bits.i32(0x600000)));
      Value exp = bits.add(bits.sub(field, bits.i32(127 + 8)), bump);
      exp = bits.maxs(exp, bits.i32(-127));
      exp = arith::SelectOp::create(
          e.b, e.loc, bits.cmp(arith::CmpIPredicate::eq, field, bits.i32(0)),
          bits.i32(-127), exp);
      multiplier = bits.pow2(bits.sub(bits.i32(0), exp));
      Value byte = arith::SelectOp::create(e.b, e.loc, finite,
                                           bits.add(exp, bits.i32(127)),
                                           bits.i32(0xFF));
      scaleValue = bits.byteAs(byte, scaleElt);
    } else {
      Value zero = e.cmpf(arith::CmpFPredicate::OEQ, amax, e.f32(0.0f));
      divisor = e.select(zero, e.f32(1.0f),
                         arith::DivFOp::create(e.b, e.loc, amax, e.f32(448.0f)));
      scaleValue = e.select(finite, divisor, bits.nan());
    }
    e.store(scaleValue, scales, block);

    e.loop(e.index(rows), [&](Value i) {
      e.loop(e.index(cols), [&](Value j) {
        SmallVector<Value> idx = at(i, j);
        Value x = e.loadF32(input, inputAt(i, j));
        Value y = mx ? arith::MulFOp::create(e.b, e.loc, x, multiplier).getResult()
                     : arith::DivFOp::create(e.b, e.loc, x, divisor).getResult();
        Value code = bits.encodeE4M3(y);
        Value nanCode = bits.bor(bits.i32(0x7F),
                                 bits.shl(bits.shr(bits.toBits(x), bits.i32(31)),
                                          bits.i32(7)));
        code = arith::SelectOp::create(e.b, e.loc, finite, code, nanCode);
        e.store(bits.byteAs(code, valueElt), values, idx);
      });
    });
  });
}

void mok::cpu::emitDequantize(Emitter &e, Value values, Value scales,
                              Value output, int64_t rows, int64_t cols) {
  Bits bits(e);
  Type scaleElt = cast<MemRefType>(scales.getType()).getElementType();
  int64_t rank = cast<MemRefType>(values.getType()).getRank();
  forEachIndex(e, values, rank, [&](ArrayRef<Value> idx) {
    SmallVector<Value> block(idx.begin(), idx.end());
    block[rank - 2] = e.div(idx[rank - 2], e.index(rows));
    block[rank - 1] = e.div(idx[rank - 1], e.index(cols));
    Value s = e.load(scales, block);
    Value scale = scaleElt.isF32() ? s : bits.decodeE8M0(bits.byteOf(s));
    Value v = bits.decodeE4M3(bits.byteOf(e.load(values, idx)));
    e.storeRounded(arith::MulFOp::create(e.b, e.loc, v, scale), output, idx);
  });
}

Value mok::cpu::emitFakeQuantize(Emitter &e, Value src, int64_t rows,
                                 int64_t cols, bool mx,
                                 SmallVectorImpl<Value> &temps) {
  auto type = cast<MemRefType>(src.getType());
  int64_t rank = type.getRank();
  SmallVector<int64_t> scaleShape(type.getShape());
  SmallVector<Value> dyn, scaleDyn;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t block = d == rank - 2 ? rows : d == rank - 1 ? cols : 1;
    if (type.isDynamicDim(d)) {
      dyn.push_back(e.dim(src, d));
      scaleDyn.push_back(e.div(dyn.back(), e.index(block)));
    } else {
      scaleShape[d] /= block;
    }
  }
  Type scaleElt =
      mx ? Type(e.b.getType<Float8E8M0FNUType>()) : Type(e.b.getF32Type());
  auto alloc = [&](ArrayRef<int64_t> shape, Type elt, ValueRange sizes) {
    Value m = e.alloc(MemRefType::get(shape, elt), sizes);
    temps.push_back(m);
    return m;
  };
  Value values =
      alloc(type.getShape(), e.b.getType<Float8E4M3FNType>(), dyn);
  Value scales = alloc(scaleShape, scaleElt, scaleDyn);
  Value out = alloc(type.getShape(), e.b.getF32Type(), dyn);
  emitQuantize(e, src, values, scales, rows, cols);
  emitDequantize(e, values, scales, out, rows, cols);
  return out;
}
