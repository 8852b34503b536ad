// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mk.quantize_rows, mk.quantize_columns and mk.quantize_weights:
// block-scaled FP8 of bf16 1 x 128 row blocks, 128 x 1 column blocks
// (stored transposed) and 128 x 128 weight blocks, and MX (E8M0) 1 x 32
// row blocks with their scales in tcgen05's scale-factor layout, bit for
// bit the rules of docs/FP8.md.
//
#include "Lowering.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
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
  void lower(mk::QuantizeColumnsOp op);
  /// With `twin` (the same src quantized transposed, next in the kernel):
  /// both layouts from one pass over each block.
  void lower(mk::QuantizeWeightsOp op, mk::QuantizeWeightsOp twin = {});

private:
  /// The rows a row quantizer takes: `tokens`, `offsets[E]` (grouped) or
  /// all of src's.
  Value rowsOf(mk::QuantizeRowsOp op);
  /// A block's scale from its amax: the divisor s (1 for a zero block),
  /// whether the block is finite, and the scale to store (NaN if not);
  /// for quotientOf, RN(1 / s) and whether s >= 2^-90 (`large`).
  struct Scale {
    Value divisor, finite, stored, reciprocal, large;
  };
  Scale scaleOf(Value amax);
  /// RN(x / s), the IEEE quotient: without a division where s is large.
  Value quotientOf(Value x, const Scale &scale, bool large);
  /// MX (E8M0): 2^-e, the factor the elements are multiplied by (exactly),
  /// whether the block is finite, and the byte to store (e + 127, 0xFF if
  /// not finite).
  struct MxScale {
    Value factor, finite, byte;
  };
  MxScale mxScaleOf(Value amax);
  /// MX rows: one warp quantizes elements blk * 128 .. + 127 of row `r`
  /// of `src` (after the index prefix `lead`), four blocks of 32 (lane l
  /// holds element l + 32 j of block j), into `values` and row r's atoms of
  /// `scales` (lane 0 stores the four bytes).
  void mxQuantize128(Value lane, ArrayRef<Value> lead, Value r, Value blk,
                     Value src, Value values, Value scales);
  /// The offset of row `r`'s scale of 32-block `j` (of the atom's 4) in
  /// its 512-byte atom: tcgen05's scale-factor layout.
  Value mxAtomOffset(Value r, int64_t j);
  void lowerMx(mk::QuantizeRowsOp op);
  void lowerMx(mk::QuantizeWeightsOp op);
  /// MX blocks down a column, stored transposed: a warp takes 32 columns
  /// (a lane one, `c`) of 128 rows from `r0`, four blocks of 32 rows.
  /// `valueAt(r)` is src[r, c]; the codes of rows r0 .. r0 + 127 go to
  /// `values`' flat elements from `valuesOffset` (16 at a time), block j's
  /// scale byte through `storeScale(j, byte)`.
  void mxColumn(Value r0, function_ref<Value(Value)> valueAt, Value values,
                Value valuesOffset,
                function_ref<void(int64_t, Value)> storeScale);
  /// The E4M3 codes of `xs` in a block of MX scale `scale` (NaN codes for
  /// a block that is not finite).
  SmallVector<Value, 16> mxCodes(ArrayRef<Value> xs, const MxScale &scale);
  /// The NaN code of element `x` (0x7F with its sign).
  Value nanCode(Value x);
  /// The E4M3 codes (i8) of `xs` (an even count) in a block of `scale`,
  /// for the element-by-element stores (the 8- and 16-byte ones take
  /// wordsOf's words: the same codes).
  SmallVector<Value, 4> codesOf(ArrayRef<Value> xs, const Scale &scale);
  /// codesOf's codes of `xs` (a multiple of 4) packed: code 4w + j in byte
  /// j of i32 word w. Each cvt's pair of codes goes into its half of a
  /// word as it is (no byte extracts and repacking), and the NaN codes of
  /// a block that is not finite are made on their own branch.
  SmallVector<Value, 4> wordsOf(ArrayRef<Value> xs, const Scale &scale);
  /// Stores wordsOf's words at the 8- or 16-byte aligned global pointer
  /// `ptr` (st.global.v2.b32 or v4).
  void storeWords(ArrayRef<Value> words, Value ptr);
  /// Stores `codes` at `values`' flat elements from `offset` on, byte by
  /// byte (the unaligned path of the 16-byte stores).
  void storeFlatCodes(ArrayRef<Value> codes, Value values, Value offset);
  /// store16Codes for wordsOf's 4 words.
  void store16Words(ArrayRef<Value> words, Value values, Value offset);
  /// Stores code j at `values[at(j)]`.
  void storeCodes(ArrayRef<Value> codes, Value values,
                  function_ref<SmallVector<Value>(int64_t)> at);
  /// Stores the 16 codes of `codes` at `values`' flat element `offset`
  /// and on: one 16-byte store where `values` is 16-byte aligned (offset a
  /// multiple of 16), else byte by byte.
  void store16Codes(ArrayRef<Value> codes, Value values, Value offset);
  /// The warp's NaN-propagating maximum of `v` (a fixed butterfly: every
  /// lane gets the same value).
  Value warpMax(Value v) { return lanesMax(v, {16, 8, 4, 2, 1}); }
  /// The maximum of `v` over the lanes that differ from this one only in
  /// the lane-index bits of `masks` (xor butterflies).
  Value lanesMax(Value v, ArrayRef<int64_t> masks);
  /// max(acc, |x|) over `xs`, NaN-propagating (amax is NaN for a block
  /// with a NaN, +inf for one with an infinity).
  Value absMax(Value acc, ArrayRef<Value> xs);

  // Tiles of 128 rows x 32 columns, quantized down their columns and
  // stored transposed (mk.quantize_columns, transposed weights). Lane l
  // holds the tile's rows 16 (l % 8) + i, i < 16, 8 columns from 8 (l /
  // 8) on: each of its 16-byte loads reads 8 row pieces of 64 bytes
  // across the warp, all 16 in flight at once, and each of its columns'
  // 16 codes is one 16-byte store: 16 consecutive elements of a row of
  // the transposed matrix. The tile is read once: it stays in registers
  // (64 a lane) from the column maxima to the codes.
  /// The lane's 16 row pieces (8 bf16 each): row i's from `rowPtr(i)`,
  /// zero where `valid(i)` is false (a null `valid`: always valid).
  SmallVector<Value, 16> loadPieces(function_ref<Value(int64_t)> rowPtr,
                                    function_ref<Value(int64_t)> valid);
  /// bf16(w * x) of the 8 elements x of `piece` (mk.gather's scaled
  /// rows), rounded two at a time (cvt.rn.bf16x2.f32).
  Value scaledPiece(Value piece, Value w);
  /// A piece of 8 bf16 zeros.
  Value zeroPiece();
  /// Element j of a piece as f32 (its bf16 bits moved up: what extf
  /// gives, in one instruction for either half of a 32-bit word).
  Value pieceElement(Value piece, int64_t j);
  /// The NaN-propagating maxima of |x| of the lane's 8 columns over the
  /// tile's 128 rows (the same in the 8 lanes that share the columns).
  SmallVector<Value, 8> columnMaxima(ArrayRef<Value> pieces);
  /// Quantizes the lane's column j with `scale` and stores its 16 codes at
  /// the 16-byte aligned global pointer `ptr`.
  void storeColumnCodes(ArrayRef<Value> pieces, int64_t j, const Scale &scale,
                        Value ptr);
  /// E4M3 codes of `a` and `b` (cvt.rn.satfinite: nearest, ties to even,
  /// +-448 for larger magnitudes, subnormals and -0 kept) as i8 values.
  std::pair<Value, Value> toE4M3(Value a, Value b);
};

} // namespace

/// i32 `words` as one vector (what an 8- or 16-byte store takes).
static Value wordVector(OpBuilder &b, Location loc, ArrayRef<Value> words) {
  int64_t n = static_cast<int64_t>(words.size());
  Value packed =
      LLVM::UndefOp::create(b, loc, VectorType::get({n}, b.getI32Type()));
  for (int64_t w = 0; w < n; ++w)
    packed = LLVM::InsertElementOp::create(
        b, loc, packed, words[w], arith::ConstantIntOp::create(b, loc, w, 32));
  return packed;
}

/// `codes` (i8, 8 or 16 of them) as a vector of little-endian i32 words:
/// code 4w + j in byte j of word w.
static Value packCodes(OpBuilder &b, Location loc, ArrayRef<Value> codes) {
  Type i32 = b.getI32Type();
  SmallVector<Value, 4> words;
  for (size_t w = 0; w < codes.size() / 4; ++w) {
    Value word = arith::ConstantIntOp::create(b, loc, 0, 32);
    for (int64_t j = 0; j < 4; ++j) {
      Value byte = arith::ExtUIOp::create(b, loc, i32, codes[4 * w + j]);
      if (j)
        byte = arith::ShLIOp::create(
            b, loc, byte, arith::ConstantIntOp::create(b, loc, 8 * j, 32));
      word = arith::OrIOp::create(b, loc, word, byte);
    }
    words.push_back(word);
  }
  return wordVector(b, loc, words);
}

Value QuantizeLowering::absMax(Value acc, ArrayRef<Value> xs) {
  for (Value x : xs) // (arith.maximumf: NaN if either is)
    acc = e.maxf(acc, math::AbsFOp::create(e.b, e.loc, x));
  return acc;
}

Value QuantizeLowering::lanesMax(Value v, ArrayRef<int64_t> masks) {
  Value width = arith::ConstantIntOp::create(e.b, e.loc, 32, 32);
  for (int64_t mask : masks) {
    Value off = arith::ConstantIntOp::create(e.b, e.loc, mask, 32);
    v = e.maxf(v, gpu::ShuffleOp::create(e.b, e.loc, v, off, width,
                                         gpu::ShuffleMode::XOR)
                      .getResult(0));
  }
  return v;
}

SmallVector<Value, 16>
QuantizeLowering::loadPieces(function_ref<Value(int64_t)> rowPtr,
                             function_ref<Value(int64_t)> valid) {
  Type v8 = VectorType::get({8}, e.b.getBF16Type());
  Value zero;
  SmallVector<Value, 16> pieces;
  for (int64_t i = 0; i < 16; ++i) {
    Value piece = load16(v8, rowPtr(i));
    if (valid) {
      if (!zero)
        zero = arith::ConstantOp::create(
            e.b, e.loc, v8,
            DenseElementsAttr::get(cast<ShapedType>(v8),
                                   e.b.getZeroAttr(e.b.getBF16Type())));
      piece = e.select(valid(i), piece, zero);
    }
    pieces.push_back(piece);
  }
  return pieces;
}

Value QuantizeLowering::pieceElement(Value piece, int64_t j) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type();
  Value word = LLVM::ExtractElementOp::create(
      b, loc,
      LLVM::BitcastOp::create(b, loc, VectorType::get({4}, i32), piece),
      arith::ConstantIntOp::create(b, loc, j / 2, 32));
  Value bits =
      j % 2 ? arith::AndIOp::create(
                  b, loc, word,
                  arith::ConstantIntOp::create(b, loc, 0xFFFF0000LL, 32))
                  .getResult()
            : arith::ShLIOp::create(b, loc, word,
                                    arith::ConstantIntOp::create(b, loc, 16, 32))
                  .getResult();
  return arith::BitcastOp::create(b, loc, b.getF32Type(), bits);
}

Value QuantizeLowering::scaledPiece(Value piece, Value w) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type(), f32 = b.getF32Type();
  Type pairF32 = VectorType::get({2}, f32),
       pairBf16 = VectorType::get({2}, b.getBF16Type());
  Value words = LLVM::UndefOp::create(b, loc, VectorType::get({4}, i32));
  for (int64_t p = 0; p < 4; ++p) {
    Value pair = LLVM::UndefOp::create(b, loc, pairF32);
    for (int64_t h = 0; h < 2; ++h)
      pair = LLVM::InsertElementOp::create(
          b, loc, pairF32, pair, e.mul(w, pieceElement(piece, 2 * p + h)),
          arith::ConstantIntOp::create(b, loc, h, 32));
    Value rounded = arith::TruncFOp::create(b, loc, pairBf16, pair);
    words = LLVM::InsertElementOp::create(
        b, loc, words, LLVM::BitcastOp::create(b, loc, i32, rounded),
        arith::ConstantIntOp::create(b, loc, p, 32));
  }
  return LLVM::BitcastOp::create(b, loc, piece.getType(), words);
}

Value QuantizeLowering::zeroPiece() {
  auto type = VectorType::get({8}, e.b.getBF16Type());
  return arith::ConstantOp::create(
      e.b, e.loc, type,
      DenseElementsAttr::get(type, e.b.getZeroAttr(e.b.getBF16Type())));
}

SmallVector<Value, 8> QuantizeLowering::columnMaxima(ArrayRef<Value> pieces) {
  SmallVector<Value, 8> amax(8, e.f32(0.0f));
  // (extf here, not pieceElement's bit operations: with the same
  // operations in both places LLVM kept the 128 f32 values of the tile
  // from the maxima to the codes, instead of its 64 packed registers, and
  // ptxas spilled hundreds of them in each column quantizer's loop.)
  for (Value piece : pieces) {
    SmallVector<Value> xs = unpack8(piece);
    for (int64_t j = 0; j < 8; ++j)
      amax[j] = absMax(amax[j], xs[j]);
  }
  // The 8 lanes of the same columns: lane bits 0, 1 and 2 (l % 8).
  for (Value &m : amax)
    m = lanesMax(m, {1, 2, 4});
  return amax;
}

void QuantizeLowering::storeColumnCodes(ArrayRef<Value> pieces, int64_t j,
                                        const Scale &scale, Value ptr) {
  SmallVector<Value, 16> xs;
  for (Value piece : pieces)
    xs.push_back(pieceElement(piece, j));
  storeWords(wordsOf(xs, scale), ptr);
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

QuantizeLowering::Scale QuantizeLowering::scaleOf(Value amax) {
  Value finite = e.cmpf(arith::CmpFPredicate::OLT, amax,
                        e.f32(std::numeric_limits<float>::infinity()));
  Value zero = e.cmpf(arith::CmpFPredicate::OEQ, amax, e.f32(0.0f));
  // IEEE divisions (div.rn.f32, subnormals kept): no fast-math flags.
  Value s = e.select(zero, e.f32(1.0f),
                     arith::DivFOp::create(e.b, e.loc, amax, e.f32(448.0f)));
  Value stored =
      e.select(finite, s, e.f32(std::numeric_limits<float>::quiet_NaN()));
  Value large = e.cmpf(arith::CmpFPredicate::OGE, s, e.f32(0x1p-90f));
  Value reciprocal = arith::DivFOp::create(e.b, e.loc, e.f32(1.0f), s);
  return {s, finite, stored, reciprocal, large};
}

Value QuantizeLowering::quotientOf(Value x, const Scale &scale, bool large) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // A tiny block (amax under 448 * 2^-90): the IEEE division.
  if (!large)
    return arith::DivFOp::create(b, loc, x, scale.divisor);
  // With b = s, y = RN(1 / b) and a = |x|: q0 = RN(a y) is within two ulps
  // of a / b, one Newton step (r0 = fma(-q0, b, a), q1 = fma(r0, y, q0))
  // takes it within one, and then r1 = fma(-q1, b, a) is exact and RN(q1
  // + r1 y) = RN(a / b) (Markstein's theorem: y within half an ulp of 1 /
  // b, q1 within one ulp of a / b, no underflow). Nothing underflows
  // where E4M3 can tell: a quotient under 2^-11 rounds to zero however
  // close it is, and one above it has a >= 2^-101 (b >= 2^-90), so r1 >=
  // 2^-125. The sign is x's (-0 stays -0). A division an element
  // (div.rn.f32, which branches to a slow path) kept ptxas from
  // interleaving the elements' work.
  Value a = math::AbsFOp::create(b, loc, x);
  Value y = scale.reciprocal, d = scale.divisor;
  auto negate = [&](Value v) { return arith::NegFOp::create(b, loc, v); };
  Value q = arith::MulFOp::create(b, loc, a, y);
  for (int step = 0; step < 2; ++step) {
    Value r = LLVM::FMAOp::create(b, loc, negate(q), d, a);
    q = LLVM::FMAOp::create(b, loc, r, y, q);
  }
  // (q >= 0: its bits or'ed with x's sign bit.)
  Type i32 = b.getI32Type();
  Value sign = arith::AndIOp::create(
      b, loc, arith::BitcastOp::create(b, loc, i32, x),
      arith::ConstantIntOp::create(b, loc, 0x80000000LL, 32));
  return arith::BitcastOp::create(
      b, loc, b.getF32Type(),
      arith::OrIOp::create(b, loc, arith::BitcastOp::create(b, loc, i32, q),
                           sign));
}

QuantizeLowering::MxScale QuantizeLowering::mxScaleOf(Value amax) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type(), i8 = b.getI8Type();
  auto c32 = [&](int64_t v) {
    return arith::ConstantIntOp::create(b, loc, v, 32);
  };
  Value finite = e.cmpf(arith::CmpFPredicate::OLT, amax,
                        e.f32(std::numeric_limits<float>::infinity()));
  // amax = 1.m * 2^(E - 127): the smallest e with amax <= 448 * 2^e =
  // 1.75 * 2^(e + 8) is E - 135, plus one when 1.m > 1.75 (mantissa bits
  // above 0x600000); clamped to -127 (zeros and tiny blocks; amax <
  // 2^128 keeps it below 127).
  Value bits = arith::BitcastOp::create(b, loc, i32, amax);
  Value field = arith::ShRUIOp::create(b, loc, bits, c32(23));
  Value mantissa = arith::AndIOp::create(b, loc, bits, c32(0x7FFFFF));
  Value above = arith::ExtUIOp::create(
      b, loc, i32,
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ugt, mantissa,
                            c32(0x600000)));
  Value exponent = arith::MaxSIOp::create(
      b, loc,
      arith::AddIOp::create(b, loc,
                            arith::SubIOp::create(b, loc, field, c32(135)),
                            above),
      c32(-127));
  // 2^-e, e in [-127, 120]: the biased exponent 127 - e in [7, 254].
  Value factor = arith::BitcastOp::create(
      b, loc, b.getF32Type(),
      arith::ShLIOp::create(
          b, loc, arith::SubIOp::create(b, loc, c32(127), exponent), c32(23)));
  Value byte = arith::TruncIOp::create(
      b, loc, i8, arith::AddIOp::create(b, loc, exponent, c32(127)));
  byte = e.select(finite, byte, arith::ConstantIntOp::create(b, loc, 0xFF, 8));
  return {factor, finite, byte};
}

Value QuantizeLowering::nanCode(Value x) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value bits = arith::BitcastOp::create(b, loc, b.getI32Type(), x);
  Value sign = arith::TruncIOp::create(
      b, loc, b.getI8Type(),
      arith::ShRUIOp::create(b, loc, bits,
                             arith::ConstantIntOp::create(b, loc, 24, 32)));
  return arith::OrIOp::create(
      b, loc,
      arith::AndIOp::create(b, loc, sign,
                            arith::ConstantIntOp::create(b, loc, 0x80, 8)),
      arith::ConstantIntOp::create(b, loc, 0x7F, 8));
}

Value QuantizeLowering::mxAtomOffset(Value r, int64_t j) {
  Value inAtom = e.rem(r, e.index(128));
  return e.add(e.add(e.mul(e.rem(inAtom, e.index(32)), e.index(16)),
                     e.mul(e.div(inAtom, e.index(32)), e.index(4))),
               e.index(j));
}

void QuantizeLowering::mxQuantize128(Value lane, ArrayRef<Value> lead,
                                     Value r, Value blk, Value src,
                                     Value values, Value scales) {
  Type f8 = cast<MemRefType>(values.getType()).getElementType();
  Type e8 = cast<MemRefType>(scales.getType()).getElementType();
  Value c0 = e.add(e.mul(blk, e.index(128)), lane);
  auto at = [&](int64_t j) {
    SmallVector<Value> idx(lead);
    idx.append({r, e.add(c0, e.index(32 * j))});
    return idx;
  };
  SmallVector<Value, 4> xs, scaled;
  SmallVector<MxScale, 4> blockScales;
  for (int64_t j = 0; j < 4; ++j) {
    xs.push_back(e.loadF32(src, at(j)));
    // amax is NaN for a block with a NaN, +inf for one with an infinity.
    blockScales.push_back(
        mxScaleOf(warpMax(math::AbsFOp::create(e.b, e.loc, xs.back()))));
    // x * 2^-e is exact (or far below E4M3's smallest, rounding to zero
    // either way) and at most 448: E4M3's rounding is the only one.
    scaled.push_back(
        arith::MulFOp::create(e.b, e.loc, xs[j], blockScales[j].factor));
  }
  auto storeCode = [&](int64_t j, Value code) {
    e.store(arith::BitcastOp::create(e.b, e.loc, f8, code), values, at(j));
  };
  for (int64_t j = 0; j < 4; j += 2) {
    auto [hi, lo] = toE4M3(scaled[j], scaled[j + 1]);
    storeCode(j, e.select(blockScales[j].finite, hi, nanCode(xs[j])));
    storeCode(j + 1,
              e.select(blockScales[j + 1].finite, lo, nanCode(xs[j + 1])));
  }
  e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)), [&] {
    for (int64_t j = 0; j < 4; ++j) {
      SmallVector<Value> idx(lead);
      idx.append({e.div(r, e.index(128)), blk, mxAtomOffset(r, j)});
      e.store(arith::BitcastOp::create(e.b, e.loc, e8, blockScales[j].byte),
              scales, idx);
    }
  });
}

SmallVector<Value, 16> QuantizeLowering::mxCodes(ArrayRef<Value> xs,
                                                const MxScale &scale) {
  SmallVector<Value, 16> codes;
  for (size_t j = 0; j < xs.size(); j += 2) {
    auto [hi, lo] = toE4M3(
        arith::MulFOp::create(e.b, e.loc, xs[j], scale.factor),
        arith::MulFOp::create(e.b, e.loc, xs[j + 1], scale.factor));
    codes.push_back(e.select(scale.finite, hi, nanCode(xs[j])));
    codes.push_back(e.select(scale.finite, lo, nanCode(xs[j + 1])));
  }
  return codes;
}

void QuantizeLowering::mxColumn(
    Value r0, function_ref<Value(Value)> valueAt, Value values,
    Value valuesOffset, function_ref<void(int64_t, Value)> storeScale) {
  for (int64_t j = 0; j < 4; ++j) {
    Value first = e.add(r0, e.index(32 * j));
    Value amax = e.fold(e.index(0), e.index(32), e.f32(0.0f),
                        [&](Value r, Value acc) {
                          return e.maxf(acc,
                                        math::AbsFOp::create(
                                            e.b, e.loc,
                                            valueAt(e.add(first, r))));
                        });
    MxScale scale = mxScaleOf(amax);
    for (int64_t half = 0; half < 2; ++half) {
      SmallVector<Value, 16> xs;
      for (int64_t i = 0; i < 16; ++i)
        xs.push_back(valueAt(e.add(first, e.index(16 * half + i))));
      store16Codes(mxCodes(xs, scale), values,
                   e.add(valuesOffset, e.index(32 * j + 16 * half)));
    }
    storeScale(j, scale.byte);
  }
}

Value QuantizeLowering::rowsOf(mk::QuantizeRowsOp op) {
  if (op.getTokens())
    return op.getTokens();
  if (Value offsets = op.getOffsets())
    return e.toIndex(e.load(offsets, {e.index(size(offsets, 0) - 1)}));
  return e.index(size(op.getSrc(), 0));
}

void QuantizeLowering::lowerMx(mk::QuantizeRowsOp op) {
  Value src = op.getSrc();
  int64_t blocks = size(src, 1) / 128;
  forAllWarps(e.mul(rowsOf(op), e.index(blocks)), [&](Value i, Value lane) {
    mxQuantize128(lane, {}, e.div(i, e.index(blocks)),
                  e.rem(i, e.index(blocks)), src, op.getValues(),
                  op.getScales());
  });
}

void QuantizeLowering::lowerMx(mk::QuantizeWeightsOp op) {
  Value src = op.getSrc(), values = op.getValues(), scales = op.getScales();
  int64_t n = size(src, 1), blocks = size(src, 2) / 128;
  Type e8 = cast<MemRefType>(scales.getType()).getElementType();
  if (op.getTransposed()) {
    // values[x, k, n] (blocks of 32 along N): a warp takes 32 of src's
    // columns k (a lane one, reading src's rows: contiguous across the
    // warp) and 128 of its rows n, as mk.quantize_columns does.
    int64_t k = size(src, 2), groups = k / 32, nBlocks = n / 128;
    forAllWarps(e.index(size(src, 0) * nBlocks * groups),
                [&](Value i, Value lane) {
                  Value x = e.div(i, e.index(nBlocks * groups));
                  Value nb = e.rem(e.div(i, e.index(groups)),
                                   e.index(nBlocks));
                  Value col = e.add(
                      e.mul(e.rem(i, e.index(groups)), e.index(32)), lane);
                  Value row = e.add(e.mul(x, e.index(k)), col);
                  mxColumn(
                      e.mul(nb, e.index(128)),
                      [&](Value r) { return e.loadF32(src, {x, r, col}); },
                      values,
                      e.add(e.mul(row, e.index(n)), e.mul(nb, e.index(128))),
                      [&](int64_t j, Value byte) {
                        e.store(arith::BitcastOp::create(e.b, e.loc, e8, byte),
                                scales,
                                {x, e.div(col, e.index(128)), nb,
                                 mxAtomOffset(col, j)});
                      });
                });
    return;
  }
  // Each expert's rows as mk.quantize_rows' (blocks of 32 along K).
  forAllWarps(e.index(size(src, 0) * n * blocks), [&](Value i, Value lane) {
    mxQuantize128(lane, {e.div(i, e.index(n * blocks))},
                  e.rem(e.div(i, e.index(blocks)), e.index(n)),
                  e.rem(i, e.index(blocks)), src, values, scales);
  });
}

SmallVector<Value, 4> QuantizeLowering::codesOf(ArrayRef<Value> xs,
                                                const Scale &scale) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i8 = b.getI8Type();
  // (Uniform over the block: the branch on its scale.)
  auto codesWith = [&](bool large) {
    SmallVector<Value> codes;
    for (size_t j = 0; j < xs.size(); j += 2) {
      Value first = quotientOf(xs[j], scale, large);
      Value second = quotientOf(xs[j + 1], scale, large);
      auto [hi, lo] = toE4M3(first, second);
      codes.push_back(hi);
      codes.push_back(lo);
    }
    return codes;
  };
  auto ifOp = scf::IfOp::create(b, loc, SmallVector<Type>(xs.size(), i8),
                                scale.large, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    scf::YieldOp::create(b, loc, codesWith(true));
    b.setInsertionPointToStart(ifOp.elseBlock());
    scf::YieldOp::create(b, loc, codesWith(false));
  }
  SmallVector<Value, 4> codes(ifOp.getResults().begin(), ifOp.getResults().end());
  for (size_t j = 0; j < xs.size(); ++j) // a non-finite block: NaN codes
    codes[j] = e.select(scale.finite, codes[j], nanCode(xs[j]));
  return codes;
}

SmallVector<Value, 4> QuantizeLowering::wordsOf(ArrayRef<Value> xs,
                                                const Scale &scale) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type(), i16 = b.getI16Type();
  Type pairs = VectorType::get({2}, i16);
  const int64_t words = static_cast<int64_t>(xs.size()) / 4;
  auto c32 = [&](int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 32); };
  // Codes 4w .. 4w + 3 as word w: cvt puts its first operand in the upper
  // byte of its pair, and the pair of codes 4w + 2, 4w + 3 is the word's
  // upper half.
  auto wordsWith = [&](bool large) {
    SmallVector<Value> out;
    for (int64_t w = 0; w < words; ++w) {
      Value word = LLVM::UndefOp::create(b, loc, pairs);
      for (int64_t h = 0; h < 2; ++h) {
        Value pair = NVVM::ConvertF32x2ToF8x2Op::create(
            b, loc, i16, quotientOf(xs[4 * w + 2 * h + 1], scale, large),
            quotientOf(xs[4 * w + 2 * h], scale, large),
            NVVM::FPRoundingMode::RN, NVVM::SaturationMode::SATFINITE,
            /*relu=*/false, b.getType<Float8E4M3FNType>());
        word = LLVM::InsertElementOp::create(b, loc, pairs, word, pair, c32(h));
      }
      out.push_back(LLVM::BitcastOp::create(b, loc, i32, word));
    }
    return out;
  };
  // A block that is not finite: every code is its element's NaN code.
  auto nanWords = [&] {
    SmallVector<Value> out;
    for (int64_t w = 0; w < words; ++w) {
      Value word = c32(0);
      for (int64_t j = 0; j < 4; ++j) {
        Value byte =
            arith::ExtUIOp::create(b, loc, i32, nanCode(xs[4 * w + j]));
        if (j)
          byte = arith::ShLIOp::create(b, loc, byte, c32(8 * j));
        word = arith::OrIOp::create(b, loc, word, byte);
      }
      out.push_back(word);
    }
    return out;
  };
  SmallVector<Type> types(words, i32);
  auto finite = scf::IfOp::create(b, loc, types, scale.finite,
                                  /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(finite.thenBlock());
    // (Uniform over the block: the branch on its scale.)
    auto ifLarge = scf::IfOp::create(b, loc, types, scale.large,
                                     /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToStart(ifLarge.thenBlock());
      scf::YieldOp::create(b, loc, wordsWith(true));
      b.setInsertionPointToStart(ifLarge.elseBlock());
      scf::YieldOp::create(b, loc, wordsWith(false));
    }
    scf::YieldOp::create(b, loc, ifLarge.getResults());
    b.setInsertionPointToStart(finite.elseBlock());
    scf::YieldOp::create(b, loc, nanWords());
  }
  return SmallVector<Value, 4>(finite.getResults().begin(),
                               finite.getResults().end());
}

void QuantizeLowering::storeWords(ArrayRef<Value> words, Value ptr) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value packed = wordVector(b, loc, words);
  if (words.size() == 4) {
    store16(packed, ptr);
    return;
  }
  LLVM::StoreOp::create(b, loc, packed, ptr, /*alignment=*/8);
}

void QuantizeLowering::store16Words(ArrayRef<Value> words, Value values,
                                    Value offset) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  e.ifThen(
      aligned({values}, 16),
      [&] { storeWords(words, at(base(values), offset, /*elementBytes=*/1)); },
      [&] {
        // (Unaligned: byte by byte.)
        Type i8 = b.getI8Type();
        SmallVector<Value, 16> codes;
        for (Value word : words)
          for (int64_t j = 0; j < 4; ++j)
            codes.push_back(arith::TruncIOp::create(
                b, loc, i8,
                arith::ShRUIOp::create(
                    b, loc, word,
                    arith::ConstantIntOp::create(b, loc, 8 * j, 32))));
        storeFlatCodes(codes, values, offset);
      });
}

void QuantizeLowering::storeCodes(ArrayRef<Value> codes, Value values,
                                  function_ref<SmallVector<Value>(int64_t)> at) {
  Type f8 = cast<MemRefType>(values.getType()).getElementType();
  for (auto [j, code] : llvm::enumerate(codes))
    e.store(arith::BitcastOp::create(e.b, e.loc, f8, code), values, at(j));
}

void QuantizeLowering::lower(mk::QuantizeRowsOp op) {
  if (op.isMx())
    return lowerMx(op);
  Value src = op.getSrc(), values = op.getValues(), scales = op.getScales();
  int64_t cols = size(src, 1), blocks = cols / 128;
  Value rows = rowsOf(op);
  Value count = e.mul(rows, e.index(blocks));
  // 16-byte aligned buffers: a half-warp a block, lane l holding its
  // elements 8 (l % 16) .. + 7 (one 16-byte load, one 8-byte store of
  // codes), a warp 16 consecutive blocks a step, blocks 2 u + l / 16 (u <
  // 8) of them: eight loads of a lane in flight at once. (A warp a block,
  // 2-byte loads, left the 8 warps of an SM waiting out their loads'
  // latency: 1.3 ms for dsv3-shard's routed rows of x on the H100, 0.8 GB
  // moved.)
  constexpr int64_t kBlocksPerStep = 16;
  auto vectorSteps = [&] {
    Type v8 = VectorType::get({8}, e.b.getBF16Type());
    forAllWarps(
        e.div(e.add(count, e.index(kBlocksPerStep - 1)),
              e.index(kBlocksPerStep)),
        [&](Value g, Value lane) {
          Value half = e.div(lane, e.index(16)),
                piece = e.rem(lane, e.index(16));
          Value srcBase = base(src), valuesBase = base(values);
          SmallVector<Value, 8> valid, r, blk, flat, xs8;
          for (int64_t u = 0; u < kBlocksPerStep / 2; ++u) {
            Value i = e.add(e.mul(g, e.index(kBlocksPerStep)),
                            e.add(e.index(2 * u), half));
            valid.push_back(e.cmp(arith::CmpIPredicate::slt, i, count));
            Value safe = e.select(valid.back(), i, e.index(0));
            r.push_back(e.div(safe, e.index(blocks)));
            blk.push_back(e.rem(safe, e.index(blocks)));
            flat.push_back(e.add(e.mul(r.back(), e.index(cols)),
                                 e.add(e.mul(blk.back(), e.index(128)),
                                       e.mul(piece, e.index(8)))));
            xs8.push_back(load16(v8, at(srcBase, flat.back())));
          }
          for (int64_t u = 0; u < kBlocksPerStep / 2; ++u) {
            SmallVector<Value> x = unpack8(xs8[u]);
            // The half-warp's 16 lanes: lane bits 0 to 3.
            Scale scale =
                scaleOf(lanesMax(absMax(e.f32(0.0f), x), {1, 2, 4, 8}));
            e.ifThen(valid[u], [&] {
              storeWords(wordsOf(x, scale),
                         at(valuesBase, flat[u], /*elementBytes=*/1));
              e.ifThen(e.cmp(arith::CmpIPredicate::eq, piece, e.index(0)), [&] {
                e.store(scale.stored, scales, {blk[u], r[u]});
              });
            });
          }
        });
  };
  // Otherwise one warp a block; lane l holds the block's elements l, l +
  // 32, l + 64 and l + 96, so that each load and store of the warp is
  // contiguous.
  auto scalarBlocks = [&] {
    forAllWarps(count, [&](Value i, Value lane) {
      Value r = e.div(i, e.index(blocks)), blk = e.rem(i, e.index(blocks));
      Value c0 = e.add(e.mul(blk, e.index(128)), lane);
      auto at = [&](int64_t j) {
        return SmallVector<Value>{r, e.add(c0, e.index(32 * j))};
      };
      SmallVector<Value, 4> xs;
      for (int64_t j = 0; j < 4; ++j)
        xs.push_back(e.loadF32(src, at(j)));
      Scale scale = scaleOf(warpMax(absMax(e.f32(0.0f), xs)));
      storeCodes(codesOf(xs, scale), values, at);
      e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)), [&] {
        e.store(scale.stored, scales, {blk, r});
      });
    });
  };
  e.ifThen(aligned({src, values}, 16), vectorSteps, scalarBlocks);
}

void QuantizeLowering::store16Codes(ArrayRef<Value> codes, Value values,
                                    Value offset) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  e.ifThen(
      aligned({values}, 16),
      [&] {
        store16(packCodes(b, loc, codes),
                at(base(values), offset, /*elementBytes=*/1));
      },
      [&] { storeFlatCodes(codes, values, offset); });
}

void QuantizeLowering::storeFlatCodes(ArrayRef<Value> codes, Value values,
                                      Value offset) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  auto type = cast<MemRefType>(values.getType());
  int64_t cols = type.getDimSize(type.getRank() - 1);
  for (auto [j, code] : llvm::enumerate(codes)) {
    Value flat = e.add(offset, e.index(j));
    SmallVector<Value> idx;
    if (type.getRank() == 3) {
      int64_t plane = type.getDimSize(1) * cols;
      idx = {e.div(flat, e.index(plane)),
             e.div(e.rem(flat, e.index(plane)), e.index(cols)),
             e.rem(flat, e.index(cols))};
    } else {
      idx = {e.div(flat, e.index(cols)), e.rem(flat, e.index(cols))};
    }
    e.store(arith::BitcastOp::create(b, loc, type.getElementType(), code),
            values, idx);
  }
}

void QuantizeLowering::lower(mk::QuantizeColumnsOp op) {
  Value src = op.getSrc(), values = op.getValues(), scales = op.getScales();
  int64_t rows = op.quantizedRows(), cols = size(src, 1),
          padded = size(values, 1);
  Value rowRoute = op.getRowRoute();
  // Gathered: routed row r is bf16(w * src[t]) for its route q = t k + j.
  Value weights = op.getRouterWeights();
  Value topK = weights ? e.index(size(weights, 1)) : Value();
  // The blocks written: all, or those holding the plan's routed rows.
  Value rowBlocks = e.index(padded / 128);
  Value limit = e.index(rows);
  if (rowRoute) {
    Value routed = routedRows(op.getOffsets());
    limit = arith::MinSIOp::create(e.b, e.loc, routed, limit);
    // (At most values' blocks, whatever offsets[E] holds.)
    rowBlocks = arith::MinSIOp::create(
        e.b, e.loc, e.div(e.add(limit, e.index(127)), e.index(128)),
        rowBlocks);
  }
  int64_t groups = cols / 32;
  // Below the rows: the row itself, else row 0 (safe to read).
  auto safeRow = [&](Value r) {
    return e.select(e.cmp(arith::CmpIPredicate::slt, r, limit), r,
                    e.index(0));
  };
  // Whether row r is quantized (below the rows, not padding), and r where
  // it is, else 0 (a row safe to read); gathered, also its route (0 where
  // not valid).
  struct RowCheck {
    Value valid, safe, route;
  };
  auto rowCheck = [&](Value r) -> RowCheck {
    Value valid = e.cmp(arith::CmpIPredicate::slt, r, limit);
    Value safe = safeRow(r);
    if (!rowRoute)
      return {valid, safe, Value()};
    Value route = e.toIndex(e.load(rowRoute, {safe}));
    valid = arith::AndIOp::create(e.b, e.loc, valid, e.isValid(route));
    return {valid, safe, e.select(valid, route, e.index(0))};
  };
  // Gathered: route q's token row t = q / k of src and its weight.
  auto tokenOf = [&](Value q) { return e.div(q, topK); };
  auto weightOf = [&](Value q) {
    return e.load(weights, {tokenOf(q), e.rem(q, topK)});
  };

  // One warp a block of 128 rows x 32 columns. 16-byte aligned buffers:
  // the tile in registers (loadPieces); each lane's 16 codes of a column
  // start 16-byte aligned, the values' rows being `padded` (a multiple of
  // 128) long. A warp's tiles in turn, the next one's loads in flight
  // while it quantizes the current one (forAllWarpsPrefetched), so that
  // the 8 warps of an SM keep loads in flight while they compute.
  // Otherwise, and for MX, a lane a column: the block's amax (a warp
  // reads 64 contiguous bytes a row), then the quantizing pass. (On the
  // H100 the scalar form took 3.6 ms for dsv3-shard's d_y.)
  Value tiles = e.mul(rowBlocks, e.index(groups));
  // (With more than 256 threads a CTA, as with a producer warpgroup, a
  // thread has 168 registers outside the GEMMs: too few to carry a block
  // beside the one it quantizes. One block at a time there.)
  // (Gathered: a tile's loads wait for its routes anyway; one at a time.)
  DenseI32ArrayAttr block = func.getKnownBlockSizeAttr();
  bool prefetch = block && block[0] <= 256 && !weights;
  auto vectorTiles = [&] {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value srcBase = base(src), valuesBase = base(values);
    Type v8 = VectorType::get({8}, b.getBF16Type());
    // Tile i: its row block and first row, and this lane's first column,
    // its rows' sixteenth h of the tile and their first.
    struct Tile {
      Value rb, r0, c0, h, first;
    };
    auto tileAt = [&](Value i, Value lane) {
      Value q = e.div(lane, e.index(8));
      Tile t;
      t.h = e.rem(lane, e.index(8));
      t.rb = e.div(i, e.index(groups));
      t.r0 = e.mul(t.rb, e.index(128));
      t.c0 = e.add(e.mul(e.rem(i, e.index(groups)), e.index(32)),
                   e.mul(q, e.index(8)));
      t.first = e.add(t.r0, e.mul(t.h, e.index(16)));
      return t;
    };
    // The loads of tile i: the lane's 16 row pieces, then (routed) the
    // row_route entries of the tile's rows r0 + 4 lane + k, k < 4.
    auto fetch = [&](Value i, Value lane) {
      Tile t = tileAt(i, lane);
      if (weights) {
        // Gathered: the lane's 16 rows' routes, then their token rows'
        // pieces and weights; bf16(w * x) (mk.gather's scaled rows), zeros
        // for the rows not quantized.
        SmallVector<RowCheck, 16> rowChecks;
        for (int64_t j = 0; j < 16; ++j)
          rowChecks.push_back(rowCheck(e.add(t.first, e.index(j))));
        SmallVector<Value> pieces;
        for (const RowCheck &row : rowChecks) {
          Value piece = load16(
              v8, at(srcBase, e.add(e.mul(tokenOf(row.route), e.index(cols)),
                                    t.c0)));
          Value w = weightOf(row.route);
          pieces.push_back(
              e.select(row.valid, scaledPiece(piece, w), zeroPiece()));
        }
        return pieces;
      }
      // (Zeroed where not routed once the routes have come: quantize.)
      SmallVector<Value> loaded(loadPieces(
          [&](int64_t j) {
            return at(srcBase,
                      e.add(e.mul(safeRow(e.add(t.first, e.index(j))),
                                  e.index(cols)),
                            t.c0));
          },
          /*valid=*/nullptr));
      if (rowRoute)
        for (int64_t k = 0; k < 4; ++k)
          loaded.push_back(e.load(
              rowRoute,
              {safeRow(e.add(t.r0, e.add(e.mul(lane, e.index(4)),
                                         e.index(k))))}));
      return loaded;
    };
    // Quantizes tile i from its loads.
    auto quantize = [&](Value i, Value lane, ValueRange loaded) {
      Tile t = tileAt(i, lane);
      // Routed: whether row r0 + 4 l + k is a routed row, bit l of
      // ballot k; row 16 h + j of the tile is bit 4 h + j / 4 of ballot
      // j % 4.
      SmallVector<Value, 4> ballots;
      if (rowRoute && !weights)
        for (int64_t k = 0; k < 4; ++k) {
          Value r = e.add(t.r0, e.add(e.mul(lane, e.index(4)), e.index(k)));
          Value routed = arith::AndIOp::create(
              b, loc, e.cmp(arith::CmpIPredicate::slt, r, limit),
              e.isValid(e.toIndex(loaded[16 + k])));
          ballots.push_back(NVVM::VoteSyncOp::create(
              b, loc, b.getI32Type(),
              arith::ConstantIntOp::create(b, loc, -1, 32), routed,
              NVVM::VoteSyncKind::ballot));
        }
      Type i32 = b.getI32Type();
      Value h4 = arith::IndexCastOp::create(b, loc, i32,
                                            e.mul(t.h, e.index(4)));
      SmallVector<Value, 16> pieces(loaded.take_front(16));
      Value zero = arith::ConstantOp::create(
          b, loc, v8,
          DenseElementsAttr::get(cast<ShapedType>(v8),
                                 b.getZeroAttr(b.getBF16Type())));
      // (Gathered: zeroed by fetch.)
      for (int64_t j = 0; j < 16 && !weights; ++j) {
        Value valid;
        if (rowRoute) {
          Value bit = arith::ShRUIOp::create(
              b, loc, ballots[j % 4],
              arith::AddIOp::create(
                  b, loc, h4, arith::ConstantIntOp::create(b, loc, j / 4, 32)));
          valid = arith::TruncIOp::create(b, loc, b.getI1Type(), bit);
        } else {
          valid = e.cmp(arith::CmpIPredicate::slt,
                        e.add(t.first, e.index(j)), limit);
        }
        pieces[j] = e.select(valid, pieces[j], zero);
      }
      SmallVector<Value, 8> amax = columnMaxima(pieces);
      for (int64_t j = 0; j < 8; ++j) {
        Value col = e.add(t.c0, e.index(j));
        Scale scale = scaleOf(amax[j]);
        storeColumnCodes(pieces, j, scale,
                         at(valuesBase,
                            e.add(e.mul(col, e.index(padded)), t.first),
                            /*elementBytes=*/1));
        e.ifThen(e.cmp(arith::CmpIPredicate::eq, t.h, e.index(0)), [&] {
          e.store(scale.stored, scales, {t.rb, col});
        });
      }
    };
    // (Tile 0 is safe to read whatever `tiles` is.)
    if (prefetch)
      forAllWarpsPrefetched(tiles, fetch, quantize);
    else
      forAllWarps(tiles, [&](Value i, Value lane) {
        SmallVector<Value> loaded = fetch(i, lane);
        quantize(i, lane, loaded);
      });
  };
  auto scalarColumns = [&] {
    forAllWarps(tiles, [&](Value i, Value lane) {
      Value rb = e.div(i, e.index(groups));
      Value c = e.add(e.mul(e.rem(i, e.index(groups)), e.index(32)), lane);
      Value r0 = e.mul(rb, e.index(128));
      // src[r, c] (gathered: bf16(w * src[t, c]), as mk.gather's scaled
      // rows), zero past the rows and for padding rows.
      auto valueAt = [&](Value r) {
        RowCheck row = rowCheck(r);
        if (!weights)
          return e.select(row.valid, e.loadF32(src, {row.safe, c}),
                          e.f32(0.0f));
        Value x = e.loadF32(src, {tokenOf(row.route), c});
        return e.select(row.valid, e.roundBF16(e.mul(weightOf(row.route), x)),
                        e.f32(0.0f));
      };
      // MX: four blocks of 32 rows, their bytes in row c's atoms.
      if (op.isMx()) {
        Type e8 = cast<MemRefType>(scales.getType()).getElementType();
        mxColumn(r0, valueAt, values, e.add(e.mul(c, e.index(padded)), r0),
                 [&](int64_t j, Value byte) {
                   e.store(arith::BitcastOp::create(e.b, e.loc, e8, byte),
                           scales,
                           {e.div(c, e.index(128)), rb, mxAtomOffset(c, j)});
                 });
        return;
      }
      // (16 rows a step: their loads independent. One row a step left a
      // warp waiting out each load's latency in turn, with 8 warps an SM.)
      Value amax = e.fold(
          e.index(0), e.index(128), e.index(16), e.f32(0.0f),
          [&](Value r, Value acc) {
            for (int64_t j = 0; j < 16; ++j)
              acc = e.maxf(acc, math::AbsFOp::create(
                                    e.b, e.loc,
                                    valueAt(e.add(r0, e.add(r, e.index(j))))));
            return acc;
          });
      Scale scale = scaleOf(amax);
      e.loop(e.index(8), [&](Value chunk) {
        Value first = e.add(r0, e.mul(chunk, e.index(16)));
        SmallVector<Value, 16> xs;
        for (int64_t j = 0; j < 16; ++j)
          xs.push_back(valueAt(e.add(first, e.index(j))));
        store16Words(wordsOf(xs, scale), values,
                     e.add(e.mul(c, e.index(padded)), first));
      });
      e.store(scale.stored, scales, {rb, c});
    });
  };
  if (op.isMx())
    scalarColumns();
  else
    e.ifThen(aligned({src, values}, 16), vectorTiles, scalarColumns);
}

void QuantizeLowering::lower(mk::QuantizeWeightsOp op,
                             mk::QuantizeWeightsOp twin) {
  if (op.isMx())
    return lowerMx(op);
  Value src = op.getSrc();
  int64_t n = size(src, 1), k = size(src, 2);
  int64_t nBlocks = n / 128, kBlocks = k / 128;
  int64_t blocks = size(src, 0) * nBlocks * kBlocks;
  // The layouts a block is quantized into: op's, and with a twin its
  // transposed one too, from the same amax (the block's second and third
  // reads then come from the caches: one read of src from memory instead
  // of two).
  struct Layout {
    Value values, scales;
    bool transposed;
  };
  SmallVector<Layout, 2> layouts = {
      {op.getValues(), op.getScales(), op.getTransposed()}};
  if (twin)
    layouts.push_back({twin.getValues(), twin.getScales(), true});
  // One warp a 128 x 128 block: a pass for its amax, then one that
  // quantizes (a layout).
  //
  // 16-byte aligned weights (K is a multiple of 128): lane l holds 8
  // consecutive columns, 8 (l % 16) .. + 7, of the block's rows r with r %
  // 2 = l / 16, so that each load of the warp is two whole 256-byte rows
  // (ld.global.v4), eight row pairs a step, their loads independent; the
  // normal layout's pass stores each lane's 8 codes at once
  // (st.global.v2). (A lane a column read 64 bytes a warp load and stored
  // a byte a lane: the weights' quantization took 4.9 ms of dsv3-shard's
  // FP8 forward on the H200.) Otherwise row by row, lane l holding the
  // row's columns l, l + 32, l + 64 and l + 96 of the block. The
  // transposed layout's pass goes down the columns: the aligned form a 128
  // x 32 tile at a time (loadPieces), the other a lane a column.
  Type v8 = VectorType::get({8}, e.b.getBF16Type());
  // (Row pairs a step: eight in the amax pass, four in the quantizing one,
  // whose quotients hold more registers: with eight, a kernel with a
  // producer warpgroup, 168 registers a thread outside its GEMMs, spilled.)
  constexpr int64_t kUnroll = 8, kQuantizeUnroll = 4;
  auto quantizeBlock = [&](Value i, Value lane, bool vector) {
    Value x = e.div(i, e.index(nBlocks * kBlocks));
    Value nb = e.rem(e.div(i, e.index(kBlocks)), e.index(nBlocks));
    Value kb = e.rem(i, e.index(kBlocks));
    Value n0 = e.mul(nb, e.index(128));
    Value k0 = e.add(e.mul(kb, e.index(128)), lane);
    // The vector form: the flat element of (x, n0 + row, 128 kb + 8 (l %
    // 16)) for rows 2 (pair + u) + l / 16.
    Value srcBase, first, half;
    if (vector) {
      srcBase = base(src);
      first = e.add(
          e.mul(e.add(e.mul(x, e.index(n)), n0), e.index(k)),
          e.add(e.mul(kb, e.index(128)),
                e.mul(e.rem(lane, e.index(16)), e.index(8))));
      half = e.div(lane, e.index(16));
    }
    auto flat = [&](Value pair, int64_t u) {
      Value row = e.add(e.mul(e.add(pair, e.index(u)), e.index(2)), half);
      return e.add(first, e.mul(row, e.index(k)));
    };
    auto loadRowPiece = [&](Value pair, int64_t u) {
      return unpack8(load16(v8, at(srcBase, flat(pair, u))));
    };
    // The scalar form: element j of row `row` (column k0 + 32 j).
    auto elementAt = [&](Value row, int64_t j) {
      return SmallVector<Value>{x, e.add(n0, row),
                                e.add(k0, e.index(32 * j))};
    };
    auto rowValues = [&](Value row) {
      SmallVector<Value, 4> xs;
      for (int64_t j = 0; j < 4; ++j)
        xs.push_back(e.loadF32(src, elementAt(row, j)));
      return xs;
    };
    Value amax =
        vector ? e.fold(e.index(0), e.index(64), e.index(kUnroll), e.f32(0.0f),
                        [&](Value pair, Value acc) {
                          for (int64_t u = 0; u < kUnroll; ++u)
                            acc = absMax(acc, loadRowPiece(pair, u));
                          return acc;
                        })
               : e.fold(e.index(0), e.index(128), e.f32(0.0f),
                        [&](Value row, Value acc) {
                          return absMax(acc, rowValues(row));
                        });
    Scale scale = scaleOf(warpMax(amax));
    for (const Layout &layout : layouts) {
      Value values = layout.values, scales = layout.scales;
      bool transposed = layout.transposed;
      if (transposed && vector) {
        // values[x, k, n]: the block's four tiles of 32 columns (loadPieces).
        Value valuesBase = base(values);
        Value q = e.div(lane, e.index(8));
        Value rowFirst = e.add(n0, e.mul(e.rem(lane, e.index(8)), e.index(16)));
        e.loop(e.index(4), [&](Value tile) {
          Value col0 =
              e.add(e.mul(kb, e.index(128)),
                    e.add(e.mul(tile, e.index(32)), e.mul(q, e.index(8))));
          SmallVector<Value, 16> pieces = loadPieces(
              [&](int64_t j) {
                Value row =
                    e.add(e.mul(x, e.index(n)), e.add(rowFirst, e.index(j)));
                return at(srcBase, e.add(e.mul(row, e.index(k)), col0));
              },
              nullptr);
          for (int64_t j = 0; j < 8; ++j) {
            Value row = e.add(e.mul(x, e.index(k)), e.add(col0, e.index(j)));
            storeColumnCodes(pieces, j, scale,
                             at(valuesBase,
                                e.add(e.mul(row, e.index(n)), rowFirst),
                                /*elementBytes=*/1));
          }
        });
      } else if (transposed) {
        // values[x, k, n]: lane l quantizes the block's columns l + 32 j of
        // src, 16 rows at a time, into one 16-byte store of their row of
        // values.
        e.loop(e.index(4 * 8), [&](Value jc) {
          Value col = e.add(k0, e.mul(e.div(jc, e.index(8)), e.index(32)));
          Value row0 = e.add(n0, e.mul(e.rem(jc, e.index(8)), e.index(16)));
          SmallVector<Value, 16> xs;
          for (int64_t j = 0; j < 16; ++j)
            xs.push_back(e.loadF32(src, {x, e.add(row0, e.index(j)), col}));
          Value row = e.add(e.mul(x, e.index(k)), col);
          store16Words(wordsOf(xs, scale), values,
                       e.add(e.mul(row, e.index(n)), row0));
        });
      } else if (vector) {
        Value valuesBase = base(values);
        e.loop(e.index(0), e.index(64), e.index(kQuantizeUnroll),
               [&](Value pair) {
          for (int64_t u = 0; u < kQuantizeUnroll; ++u)
            storeWords(wordsOf(loadRowPiece(pair, u), scale),
                       at(valuesBase, flat(pair, u), /*elementBytes=*/1));
        });
      } else {
        e.loop(e.index(128), [&](Value row) {
          storeCodes(codesOf(rowValues(row), scale), values,
                     [&](int64_t j) { return elementAt(row, j); });
        });
      }
      e.ifThen(e.cmp(arith::CmpIPredicate::eq, lane, e.index(0)), [&] {
        e.store(scale.stored, scales,
                transposed ? SmallVector<Value>{x, kb, nb}
                           : SmallVector<Value>{x, nb, kb});
      });
    }
  };
  SmallVector<Value, 3> buffers = {src};
  for (const Layout &layout : layouts)
    buffers.push_back(layout.values);
  forAllWarps(e.index(blocks), [&](Value i, Value lane) {
    e.ifThen(
        aligned(buffers, 16), [&] { quantizeBlock(i, lane, true); },
        [&] { quantizeBlock(i, lane, false); });
  });
}

bool mok::conversion::isTransposedTwin(mk::QuantizeWeightsOp op,
                                       Operation *next) {
  auto twin = dyn_cast_or_null<mk::QuantizeWeightsOp>(next);
  return twin && !op.isMx() && !op.getTransposed() && !twin.isMx() &&
         twin.getTransposed() && twin.getSrc() == op.getSrc();
}

void mok::conversion::lowerQuantizeWeightsPair(const GridBuilder &grid,
                                               mk::QuantizeWeightsOp op,
                                               mk::QuantizeWeightsOp twin) {
  QuantizeLowering(grid).lower(op, twin);
}

void mok::conversion::lowerQuantize(const GridBuilder &grid, Operation *op) {
  QuantizeLowering lowering(grid);
  if (auto rows = dyn_cast<mk::QuantizeRowsOp>(op))
    lowering.lower(rows);
  else if (auto columns = dyn_cast<mk::QuantizeColumnsOp>(op))
    lowering.lower(columns);
  else
    lowering.lower(cast<mk::QuantizeWeightsOp>(op));
}
