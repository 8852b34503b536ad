// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mk.gemm: simt GEMMs as grid-stride loops over output elements (the CPU
// reference's emitters and rounding points), and tensor-core GEMMs through
// the chip's GemmEmitter (GemmPipeline.h), for which this file assembles
// the epilogue: rounding, the SwiGLU, packed and streaming stores, and
// main_grad's reductions in L2.
//
#include "GemmPipeline.h"
#include "GlobalAccess.h"
#include "Lowering.h"

#include "mok/Dialect/MK/IR/MKSchedule.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

using namespace mlir;
using namespace mok;
using namespace mok::conversion;
namespace sched = mok::mk::schedule;

namespace {

class GemmLowering : GridBuilder {
public:
  /// `tensorCores`: the kernel's GEMM emitter (null without tensor-core
  /// GEMMs); `gridBarrierFollows`: the kernel's next step is a grid barrier.
  GemmLowering(const GridBuilder &grid, gemm::GemmEmitter *tensorCores,
               bool gridBarrierFollows)
      : GridBuilder(grid), tensorCores(tensorCores),
        gridBarrierFollows(gridBarrierFollows) {}

  void lower(mk::GemmOp op);

private:
  void lowerSimt(mk::GemmOp op);
  void lowerTensorCores(mk::GemmOp op);

  gemm::GemmEmitter *tensorCores;
  bool gridBarrierFollows;
};

} // namespace

void GemmLowering::lower(mk::GemmOp op) {
  if (op.usesTensorCores())
    lowerTensorCores(op);
  else
    lowerSimt(op);
}

void GemmLowering::lowerSimt(mk::GemmOp op) {
  Value a = op.getA(), out = op.getOut();
  ValueRange bs = op.getB();
  bool ta = op.getTransposeA(), tb = op.getTransposeB();
  int64_t k = size(a, ta ? 0 : 1);
  // FP8: each operand's value is its E4M3 value times its block's scale
  // (scales: a's, a2's, then each B's), an f32 product.
  bool fp8 = op.isFp8();
  ValueRange scales = op.getScales();
  unsigned bScales = op.getA2() ? 2 : 1;
  Value block = e.index(128);
  // MXFP8: E8M0 scales in tcgen05's scale-factor atoms, 2^(byte - 127):
  // row (or column) r's block of 32 holding k, after the index prefix.
  bool mx = op.isMx();
  auto mxScale = [&](Value scaleBuffer, SmallVector<Value> idx, Value r,
                     Value j) {
    Value inAtom = e.rem(r, block);
    idx.append({e.div(r, block), e.div(j, block),
                e.add(e.add(e.mul(e.rem(inAtom, e.index(32)), e.index(16)),
                            e.mul(e.div(inAtom, e.index(32)), e.index(4))),
                      e.div(e.rem(j, block), e.index(32)))});
    return decodeE8M0(e.load(scaleBuffer, idx));
  };
  // A(r, j) of `a` (second: a2) and B_i(c, j) in either operand form.
  auto aAt = [&](bool second, Value r, Value j) {
    Value src = second ? op.getA2() : a;
    if (mx)
      return e.mul(decodeE4M3(e.load(src, {r, j})),
                   mxScale(scales[second ? 1 : 0], {}, r, j));
    if (fp8)
      return e.mul(decodeE4M3(e.load(src, {r, j})),
                   e.load(scales[second ? 1 : 0], {e.div(j, block), r}));
    return ta ? e.loadF32(src, {j, r}) : e.loadF32(src, {r, j});
  };
  auto bAt = [&](unsigned i, ArrayRef<Value> prefix, Value c, Value j) {
    SmallVector<Value> idx(prefix);
    if (mx) {
      idx.append({c, j});
      return e.mul(decodeE4M3(e.load(bs[i], idx)),
                   mxScale(scales[bScales + i], SmallVector<Value>(prefix), c,
                           j));
    }
    if (fp8) {
      SmallVector<Value> blockIdx(prefix);
      if (op.getKOffsets()) // blocks along K (the routed rows) per column
        blockIdx.append({e.div(j, block), c});
      else
        blockIdx.append({e.div(c, block), e.div(j, block)});
      idx.append({c, j});
      return e.mul(decodeE4M3(e.load(bs[i], idx)),
                   e.load(scales[bScales + i], blockIdx));
    }
    if (tb)
      idx.append({j, c});
    else
      idx.append({c, j});
    return e.loadF32(bs[i], idx);
  };
  // Weight gradients: out[g] sums over group g's K range, in k order.
  if (Value kOffsets = op.getKOffsets()) {
    int64_t m = size(out, 1), n = size(out, 2);
    Value mm = e.index(m);
    forAll2(e.index(size(out, 0) * m), n, [&](Value gr, Value c) {
      Value g = e.div(gr, mm), r = e.rem(gr, mm);
      Value begin = e.toIndex(e.load(kOffsets, {g}));
      Value end = e.toIndex(e.load(kOffsets, {e.add(g, e.index(1))}));
      if (Value counts = op.getKCounts()) // the rows past it add zeros
        end = arith::MinSIOp::create(
            e.b, e.loc, end, e.add(begin, e.toIndex(e.load(counts, {g}))));
      Value acc = e.sum(begin, end, [&](Value j) {
        return e.mul(aAt(false, r, j), bAt(0, {}, c, j));
      });
      if (op.getAccumulate()) // out += acc (f32)
        acc = e.add(e.load(out, {g, r, c}), acc);
      e.storeRounded(acc, out, {g, r, c});
    });
    return;
  }
  int64_t n = size(out, 1);
  // Any T (`tokens`): a's token rows are the call's: the rows computed, or
  // with transpose_a the K rows summed.
  Value tokens = op.getTokens();
  Value rows = op.isGrouped()  ? routedRows(op.getOffsets())
               : tokens && !ta ? tokens
                               : e.index(size(a, ta ? 1 : 0));
  Value kEnd = tokens && ta ? tokens : e.index(k);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  bool swigluEpilogue = op.getEpilogue() == mk::Epilogue::swiglu;
  forAll2(rows, n, [&](Value r, Value c) {
    // Grouped: the row's expert (padding rows have their segment's: their
    // A row is zero, so they compute zeros, as on the CPU).
    SmallVector<Value> prefix;
    if (op.isGrouped())
      prefix.push_back(e.toIndex(e.load(op.getRowExpert(), {r})));
    auto dot = [&](bool second, unsigned i, Value init) {
      return e.fold(e.index(0), kEnd, init, [&](Value j, Value acc) {
        return e.add(acc, e.mul(aAt(second, r, j), bAt(i, prefix, c, j)));
      });
    };
    if (swigluEpilogue) {
      Value g = e.roundBF16(dot(false, 0, e.f32(0.0f)));
      Value u = e.roundBF16(dot(false, 1, e.f32(0.0f)));
      if (!op.getSaves().empty()) {
        e.storeRounded(g, op.getSaves()[0], {r, c});
        e.storeRounded(u, op.getSaves()[1], {r, c});
      }
      e.storeRounded(swiglu(e, g, u, limit, sigmoidFor(limit)), out, {r, c});
      return;
    }
    // concat: one accumulator over both K-loops.
    Value v = dot(false, 0, e.f32(0.0f));
    if (op.getA2())
      v = dot(true, 1, v);
    if (op.getAccumulate()) // out += v (f32)
      v = e.add(e.load(out, {r, c}), v);
    e.storeRounded(v, out, {r, c});
  });
}

void GemmLowering::lowerTensorCores(mk::GemmOp op) {
  Value out = op.getOut();
  ArrayRef<int64_t> slots = *op.getMaps();
  Limit limit = getLimit(op.getSwigluLimitAttr());
  bool ta = op.getTransposeA();
  Value kOffsets = op.getKOffsets();
  // K in groups: out [E, M, N] as [E * M, N] rows.
  int64_t groupRows = kOffsets ? size(out, 1) : 0;
  // Any T (`tokens`): a's token rows are the call's (with transpose_a, K).
  Value tokens = op.getTokens();
  Value rows = op.isGrouped()  ? routedRows(op.getOffsets())
               : kOffsets      ? e.index(size(out, 0) * groupRows)
               : tokens && !ta ? tokens
                               : e.index(size(op.getA(), ta ? 1 : 0));
  // The output element of (flattened) row `row`.
  auto outAt = [&](Value row, Value col) -> SmallVector<Value> {
    if (!kOffsets)
      return {row, col};
    Value m = e.index(groupRows);
    return {e.div(row, m), e.rem(row, m), col};
  };
  // An m-tile lies in one expert's segment (segments are whole multiples of
  // the padding, itself a multiple of the tile): its first row's expert.
  auto expertOf = [&](Value m0) {
    return e.toIndex(e.load(op.getRowExpert(), {m0}));
  };
  ValueRange saves = op.getSaves();
  auto storeSwiglu = [&](Value row, Value col, Value g, Value u) {
    // gate and up are each rounded to bf16, then the SwiGLU in f32.
    e.storeRounded(
        swiglu(e, e.roundBF16(g), e.roundBF16(u), limit, sigmoidFor(limit)),
        out, {row, col});
    if (!saves.empty()) { // the activation's inputs, as rounded
      e.storeRounded(g, saves[0], {row, col});
      e.storeRounded(u, saves[1], {row, col});
    }
  };
  bool accumulate = op.getAccumulate();
  // Two adjacent columns at once: one 4-byte store of both bf16 values
  // when the buffer is 4-byte aligned (uniform; the runtime's workspace
  // is), else the two scalar stores. The same rounding either way.
  int64_t n = size(out, kOffsets ? 2 : 1);
  Value outBase = base(out);
  Value aligned4 = aligned({out}, 4);
  // Two results rounded to bf16, packed (col's first).
  auto packTwo = [&](Value v0, Value v1) -> Value {
    Type bf16 = e.b.getBF16Type();
    Value packed =
        LLVM::UndefOp::create(e.b, e.loc, VectorType::get({2}, bf16));
    Value values[2] = {v0, v1};
    for (int64_t i = 0; i < 2; ++i)
      packed = LLVM::InsertElementOp::create(
          e.b, e.loc, packed,
          arith::TruncFOp::create(e.b, e.loc, bf16, values[i]),
          arith::ConstantIntOp::create(e.b, e.loc, i, 32));
    return packed;
  };
  auto word = [&](Value packed) -> Value {
    return LLVM::BitcastOp::create(e.b, e.loc, e.b.getI32Type(), packed);
  };
  auto storeTwoIn = [&](Value buffer, Value bufferBase, Value bufferAligned4,
                        Value row, Value col, Value v0, Value v1) {
    e.ifThen(
        bufferAligned4,
        [&] {
          Value packed = packTwo(v0, v1);
          // A streaming store (.cs: evict-first in L1 and L2): the GEMM
          // outputs (hundreds of MB on the benchmark shapes) are read
          // once, by the next phase, long after; keeping them out of L2's
          // way of the re-read A and weight tiles made dsv3-shard 2 %
          // faster on the H200. (The staged epilogue's 16-byte stores,
          // Hopper.cpp, are the same kind; this pair store is its
          // fallback for unaligned outputs.)
          Value ptr = at(bufferBase, e.add(e.mul(row, e.index(n)), col));
          Value address =
              LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr);
          storeGlobalStreaming(e.b, e.loc, address, {word(packed)});
        },
        [&] {
          e.storeRounded(v0, buffer, outAt(row, col));
          e.storeRounded(v1, buffer, outAt(row, e.add(col, e.index(1))));
        });
  };
  auto storeTwo = [&](Value row, Value col, Value v0, Value v1) {
    storeTwoIn(out, outBase, aligned4, row, col, v0, v1);
  };
  // saves: the gate and up pairs, rounded to bf16, to their buffers.
  SmallVector<std::pair<Value, Value>> saveBases;
  for (Value v : saves)
    saveBases.push_back({base(v), aligned({v}, 4)});
  // The SwiGLU of element i of a column pair: gate and up each rounded to
  // bf16, then the SwiGLU in f32.
  auto act = [&](ArrayRef<Value> g, ArrayRef<Value> u, int i) {
    return swiglu(e, e.roundBF16(g[i]), e.roundBF16(u[i]), limit,
                  sigmoidFor(limit));
  };
  auto pairSwiglu = [&](Value row, Value col, ArrayRef<Value> g,
                        ArrayRef<Value> u) {
    // (The second element first: the order the H200-verified kernels
    // were emitted in.)
    Value a1 = act(g, u, 1);
    storeTwo(row, col, act(g, u, 0), a1);
    if (!saves.empty()) {
      storeTwoIn(saves[0], saveBases[0].first, saveBases[0].second, row, col,
                 g[0], g[1]);
      storeTwoIn(saves[1], saveBases[1].first, saveBases[1].second, row, col,
                 u[0], u[1]);
    }
  };
  bool f32Out = cast<MemRefType>(out.getType()).getElementType().isF32();
  Value aligned8 = f32Out ? aligned({out}, 8) : Value();
  auto pairPlain = [&](Value row, Value col, ArrayRef<Value> y,
                       ArrayRef<Value>) {
    if (f32Out) { // the fp32 accumulators as they are
      // One 8-byte streaming store of the pair when out is 8-byte aligned
      // (col is even): a warp store then writes whole 32-byte sectors of
      // eight rows, where two 4-byte stores each wrote half of every
      // sector. (k_groups: row is the flattened [E * M] row, which is how
      // out's rows lie in memory.)
      e.ifThen(
          aligned8,
          [&] {
            Value ptr = at(outBase, e.add(e.mul(row, e.index(n)), col),
                           /*elementBytes=*/4);
            Value address =
                LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr);
            SmallVector<Value> words;
            for (Value v : y.take_front(2))
              words.push_back(
                  LLVM::BitcastOp::create(e.b, e.loc, e.b.getI32Type(), v));
            storeGlobalStreaming(e.b, e.loc, address, words);
          },
          [&] {
            for (int64_t i = 0; i < 2; ++i)
              e.store(y[i], out, outAt(row, i ? e.add(col, e.index(1)) : col));
          });
      return;
    }
    storeTwo(row, col, y[0], y[1]);
  };
  // accumulate (f32 out): the pair added to out's by reductions in L2
  // (red.global.add.f32): nothing is loaded into the SM, so the epilogue
  // does not wait on memory. Each element gets exactly one addition per
  // kernel, so the sums are a load-add-store's, bit for bit (but for
  // subnormals, which red's f32 add flushes to zero). One 8-byte
  // reduction of the pair when out is 8-byte aligned (pairReduce8, chosen
  // once a tile by the register epilogue), else two 4-byte ones.
  auto reduceAt = [&](Value row, Value col, ValueRange y) {
    Value ptr = at(outBase, e.add(e.mul(row, e.index(n)), col),
                   /*elementBytes=*/4);
    reduceAddGlobalF32(
        e.b, e.loc, LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr),
        y);
  };
  // One result (the shared-memory epilogue's): stored rounded, or with
  // accumulate added to out's by a reduction.
  auto storePlain = [&](Value row, Value col, Value y, Value) {
    if (accumulate)
      return reduceAt(row, col, y);
    e.storeRounded(y, out, outAt(row, col));
  };
  auto pairReduce8 = [&](Value row, Value col, ArrayRef<Value> y,
                         ArrayRef<Value>) {
    reduceAt(row, col, y.take_front(2));
  };
  auto pairReduce4 = [&](Value row, Value col, ArrayRef<Value> y,
                         ArrayRef<Value>) {
    reduceAt(row, col, y[0]);
    reduceAt(row, e.add(col, e.index(1)), y[1]);
  };
  // The same pairs rounded and packed (the staged epilogue's).
  auto packSwiglu = [&](ArrayRef<Value> g, ArrayRef<Value> u) -> Value {
    Value a1 = act(g, u, 1);
    return word(packTwo(act(g, u, 0), a1));
  };
  auto packPlain = [&](ArrayRef<Value> y, ArrayRef<Value>) -> Value {
    return word(packTwo(y[0], y[1]));
  };
  // saves: the gate and the up pairs as they are (rounded to bf16).
  auto packGate = [&](ArrayRef<Value> g, ArrayRef<Value>) -> Value {
    return word(packTwo(g[0], g[1]));
  };
  auto packUp = [&](ArrayRef<Value>, ArrayRef<Value> u) -> Value {
    return word(packTwo(u[0], u[1]));
  };
  using PairFn =
      function_ref<void(Value, Value, ArrayRef<Value>, ArrayRef<Value>)>;
  bool swigluEpilogue = op.getEpilogue() == mk::Epilogue::swiglu;
  bool concat = static_cast<bool>(op.getA2());
  gemm::GemmPhase phase{
      slots[0], slots[1],
      swigluEpilogue ? std::optional<int64_t>(slots[2]) : std::nullopt,
      // (Transposed A: K rows past the matrix read as zeros: whole k-tiles.)
      concat ? 2 * size(op.getA(), 1)
      : ta   ? (size(op.getA(), 0) + sched::kTileK - 1) / sched::kTileK *
                 sched::kTileK
           : size(op.getA(), 1),
      n, rows, op.isGrouped() ? function_ref<Value(Value)>(expertOf) : nullptr,
      swigluEpilogue
          ? function_ref<void(Value, Value, Value, Value)>(storeSwiglu)
          : function_ref<void(Value, Value, Value, Value)>(storePlain),
      n % 2            ? PairFn()
      : swigluEpilogue ? PairFn(pairSwiglu)
      : accumulate     ? PairFn(pairReduce4)
                       : PairFn(pairPlain),
      op.getSchedule().tileN(), op.getSchedule().tileM()};
  phase.gridBarrierFollows = gridBarrierFollows;
  phase.paddingRows = op.getPaddingRows();
  if (op.isFp8()) { // scales: a's (and a2's), then each B's
    phase.fp8 = true;
    phase.mx = op.isMx();
    ValueRange scales = op.getScales();
    phase.aScales = scales[0];
    if (concat)
      phase.a2Scales = scales[1];
    for (Value s : scales.drop_front(concat ? 2 : 1))
      phase.bScales.push_back(s);
  }
  phase.transposeB = op.getTransposeB();
  phase.transposeA = ta;
  if (kOffsets) {
    phase.kOffsets = kOffsets;
    phase.kCounts = op.getKCounts();
    phase.groupRows = groupRows;
    phase.k = 0;
  }
  if (tokens && ta) { // K = the call's T, in whole k-tiles (zeros past T)
    phase.kRows = tokens;
    phase.k = 0;
  }
  if (concat) { // maps = [a, b_0, b_1, a2]
    phase.b2 = slots[2];
    phase.a2 = slots[3];
    phase.kSplit = size(op.getA(), 1) / phase.tileK();
  }
  if (accumulate && !(n % 2)) {
    phase.storePairAligned = pairReduce8;
    phase.pairsAligned = aligned8;
  }
  if (n % 8 == 0 && !f32Out) {
    phase.packPair =
        swigluEpilogue
            ? function_ref<Value(ArrayRef<Value>, ArrayRef<Value>)>(packSwiglu)
            : function_ref<Value(ArrayRef<Value>, ArrayRef<Value>)>(packPlain);
    phase.outAddress = outBase;
    SmallVector<Value> staged = {out};
    if (!saves.empty()) { // gate and up staged after the activation
      phase.alsoStaged.push_back({packGate, saveBases[0].first});
      phase.alsoStaged.push_back({packUp, saveBases[1].first});
      staged.append(saves.begin(), saves.end());
    }
    phase.outAligned16 = aligned(staged, 16);
  }
  if (Value rows = op.getGatherRows()) {
    phase.gatherRows = rows;
    phase.gatherSource = base(op.getA());
    phase.gatherTopK = *op.getGatherTopK();
  }
  tensorCores->emit(phase);
}

void mok::conversion::lowerGemm(const GridBuilder &grid, mk::GemmOp op,
                                gemm::GemmEmitter *tensorCores,
                                bool gridBarrierFollows) {
  GemmLowering(grid, tensorCores, gridBarrierFollows).lower(op);
}
