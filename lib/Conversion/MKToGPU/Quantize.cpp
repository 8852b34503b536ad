// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mk.quantize_rows: block-scaled FP8 of a bf16 matrix's 1 x 128 row blocks,
// one warp a block, bit for bit the rule of docs/FP8.md.
//
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mok;
using namespace mok::conversion;

namespace {

class QuantizeLowering : GridBuilder {
public:
  explicit QuantizeLowering(const GridBuilder &grid) : GridBuilder(grid) {}

  void lower(mk::QuantizeRowsOp op);

private:
  /// The warp's NaN-propagating maximum of `v` (a fixed butterfly: every
  /// lane gets the same value).
  Value warpMax(Value v);
  /// E4M3 codes of `a` and `b` (cvt.rn.satfinite: nearest, ties to even,
  /// +-448 for larger magnitudes, subnormals and -0 kept) as i8 values.
  std::pair<Value, Value> toE4M3(Value a, Value b);
};

} // namespace

Value QuantizeLowering::warpMax(Value v) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value width = arith::ConstantIntOp::create(b, loc, 32, 32);
  for (int64_t d = 16; d >= 1; d /= 2) {
    Value off = arith::ConstantIntOp::create(b, loc, d, 32);
    Value other =
        gpu::ShuffleOp::create(b, loc, v, off, width, gpu::ShuffleMode::XOR)
            .getResult(0);
    v = e.maxf(v, other); // arith.maximumf: NaN if either is
  }
  return v;
}

std::pair<Value, Value> QuantizeLowering::toE4M3(Value a, Value b) {
  OpBuilder &ob = e.b;
  Location loc = e.loc;
  Type i8 = ob.getI8Type(), i16 = ob.getI16Type();
  // `a` lands in the upper byte of the pair.
  Value pair = NVVM::ConvertF32x2ToF8x2Op::create(
      ob, loc, i16, a, b, NVVM::FPRoundingMode::RN,
      NVVM::SaturationMode::SATFINITE, /*relu=*/false,
      ob.getType<Float8E4M3FNType>());
  Value hi = arith::TruncIOp::create(
      ob, loc, i8,
      arith::ShRUIOp::create(ob, loc, pair,
                             arith::ConstantIntOp::create(ob, loc, 8, 16)));
  Value lo = arith::TruncIOp::create(ob, loc, i8, pair);
  return {hi, lo};
}

void QuantizeLowering::lower(mk::QuantizeRowsOp op) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value src = op.getSrc(), values = op.getValues(), scales = op.getScales();
  int64_t blocks = size(src, 1) / 128;
  Value rows = op.getTokens() ? op.getTokens() : e.index(size(src, 0));
  Type i8 = b.getI8Type(), i32 = b.getI32Type();
  Type f8 = cast<MemRefType>(values.getType()).getElementType();
  // One warp a block; lane l holds the block's elements l, l + 32, l + 64
  // and l + 96, so that each load and store of the warp is contiguous.
  forAllWarps(e.mul(rows, e.index(blocks)), [&](Value i, Value lane) {
    Value r = e.div(i, e.index(blocks)), blk = e.rem(i, e.index(blocks));
    Value c0 = e.add(e.mul(blk, e.index(128)), lane);
    SmallVector<Value, 4> cols, xs;
    Value amax = e.f32(0.0f);
    for (int64_t j = 0; j < 4; ++j) {
      cols.push_back(e.add(c0, e.index(32 * j)));
      xs.push_back(e.loadF32(src, {r, cols.back()}));
      amax = e.maxf(amax, math::AbsFOp::create(b, loc, xs.back()));
    }
    // amax is NaN for a block with a NaN, +inf for one with an infinity.
    amax = warpMax(amax);
    Value finite = e.cmpf(arith::CmpFPredicate::OLT, amax,
                          e.f32(std::numeric_limits<float>::infinity()));
    Value zero = e.cmpf(arith::CmpFPredicate::OEQ, amax, e.f32(0.0f));
    // IEEE divisions (div.rn.f32, subnormals kept): no fast-math flags.
    Value s = e.select(zero, e.f32(1.0f),
                       arith::DivFOp::create(b, loc, amax, e.f32(448.0f)));
    SmallVector<Value, 4> codes;
    for (int64_t j = 0; j < 4; j += 2) {
      Value first = arith::DivFOp::create(b, loc, xs[j], s);
      Value second = arith::DivFOp::create(b, loc, xs[j + 1], s);
      auto [hi, lo] = toE4M3(first, second);
      codes.push_back(hi);
      codes.push_back(lo);
    }
    for (int64_t j = 0; j < 4; ++j) {
      // A non-finite block: NaN (0x7F) with the element's sign.
      Value bits = arith::BitcastOp::create(b, loc, i32, xs[j]);
      Value sign = arith::TruncIOp::create(
          b, loc, i8,
          arith::ShRUIOp::create(b, loc, bits,
                                 arith::ConstantIntOp::create(b, loc, 24, 32)));
      Value nan = arith::OrIOp::create(
          b, loc, arith::AndIOp::create(b, loc, sign,
                                        arith::ConstantIntOp::create(
                                            b, loc, 0x80, 8)),
          arith::ConstantIntOp::create(b, loc, 0x7F, 8));
      Value code = e.select(finite, codes[j], nan);
      e.store(arith::BitcastOp::create(b, loc, f8, code), values,
              {r, cols[j]});
    }
    Value scale = e.select(
        finite, s, e.f32(std::numeric_limits<float>::quiet_NaN()));
    e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)),
             [&] { e.store(scale, scales, {blk, r}); });
  });
}

void mok::conversion::lowerQuantize(const GridBuilder &grid,
                                    mk::QuantizeRowsOp op) {
  QuantizeLowering(grid).lower(op);
}
