// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The grid-wide building blocks of convert-mk-to-gpu's op families.
//
#include "GridBuilder.h"
#include "GlobalAccess.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

using namespace mlir;
using namespace mok::conversion;

GridBuilder GridBuilder::atKernelStart(gpu::GPUFuncOp func, Emitter &e,
                                       const SimtTuning &tuning) {
  GridBuilder g(func, e, tuning);
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value bdim = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  g.numBlocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  g.globalId = e.add(e.mul(bid, bdim), tid);
  g.spreadId = e.add(e.mul(tid, g.numBlocks), bid);
  g.gridThreads = e.mul(g.numBlocks, bdim);
  return g;
}

bool GridBuilder::wholeWarps() const {
  std::optional<ArrayRef<int32_t>> block =
      const_cast<gpu::GPUFuncOp &>(func).getKnownBlockSize();
  return block && (*block)[0] % 32 == 0 && (*block)[1] == 1 && (*block)[2] == 1;
}

GridBuilder::WarpSlots GridBuilder::warpSlots() {
  Value tid = gpu::ThreadIdOp::create(e.b, e.loc, gpu::Dimension::x);
  Value first = e.add(e.mul(e.div(tid, e.index(32)), numBlocks),
                      gpu::BlockIdOp::create(e.b, e.loc, gpu::Dimension::x));
  // The lane from %laneid (tid % 32 in a block of whole warps). A tid %
  // 32 here, at the top of the kernel, was merged with the GEMM
  // epilogues' tid % 32 and kept live through the GEMMs: ptxas spilled
  // 4-8 bytes in two small training forwards.
  Value lane = arith::IndexCastOp::create(
      e.b, e.loc, e.b.getIndexType(),
      NVVM::LaneIdOp::create(e.b, e.loc, e.b.getI32Type()));
  return {first, e.div(gridThreads, e.index(32)), lane};
}

void GridBuilder::forAllWarps(Value n, function_ref<void(Value, Value)> body) {
  WarpSlots w = warpSlots();
  e.loop(w.first, n, w.stride, [&](Value i) { body(i, w.lane); });
}

void GridBuilder::forAllWarpsPrefetched(
    Value n, function_ref<SmallVector<Value>(Value, Value)> fetch,
    function_ref<void(Value, Value, ValueRange)> body) {
  WarpSlots w = warpSlots();
  auto orElse = [&](Value i, Value other) {
    return e.select(e.cmp(arith::CmpIPredicate::slt, i, n), i, other);
  };
  auto loop = scf::ForOp::create(e.b, e.loc, w.first, n, w.stride,
                                 fetch(orElse(w.first, e.index(0)), w.lane));
  OpBuilder::InsertionGuard guard(e.b);
  e.b.setInsertionPointToStart(loop.getBody());
  Value i = loop.getInductionVar();
  SmallVector<Value> next = fetch(orElse(e.add(i, w.stride), i), w.lane);
  body(i, w.lane, loop.getRegionIterArgs());
  scf::YieldOp::create(e.b, e.loc, next);
}

Value GridBuilder::shuffle64(Value v, int64_t offset, gpu::ShuffleMode mode) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type(), i64 = b.getI64Type();
  Value off = arith::ConstantIntOp::create(b, loc, offset, 32);
  Value width = arith::ConstantIntOp::create(b, loc, 32, 32);
  Value shift = arith::ConstantIntOp::create(b, loc, 32, 64);
  Value lo = arith::TruncIOp::create(b, loc, i32, v);
  Value hi = arith::TruncIOp::create(b, loc, i32,
                                     arith::ShRUIOp::create(b, loc, v, shift));
  Value lo2 = gpu::ShuffleOp::create(b, loc, lo, off, width, mode).getResult(0);
  Value hi2 = gpu::ShuffleOp::create(b, loc, hi, off, width, mode).getResult(0);
  return arith::OrIOp::create(
      b, loc, arith::ExtUIOp::create(b, loc, i64, lo2),
      arith::ShLIOp::create(b, loc, arith::ExtUIOp::create(b, loc, i64, hi2),
                            shift));
}

Value GridBuilder::warpInclusiveSum(Value v, Value lane) {
  Value zero = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  for (int64_t d = 1; d < 32; d *= 2) {
    Value up = shuffle64(v, d, gpu::ShuffleMode::UP);
    Value take = e.cmp(arith::CmpIPredicate::sge, lane, e.index(d));
    v = arith::AddIOp::create(e.b, e.loc, v, e.select(take, up, zero));
  }
  return v;
}

void GridBuilder::syncWarp() {
  NVVM::SyncWarpOp::create(e.b, e.loc,
                           arith::ConstantIntOp::create(e.b, e.loc, -1, 32));
}

Value GridBuilder::popc(Value mask) {
  return LLVM::CtPopOp::create(e.b, e.loc, mask);
}

Value GridBuilder::i64Of(Value index) {
  return arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(), index);
}

Value GridBuilder::routedRows(Value offsets) {
  int64_t experts = cast<MemRefType>(offsets.getType()).getDimSize(0) - 1;
  return e.toIndex(e.load(offsets, {e.index(experts)}));
}

Value GridBuilder::expertOf(Value top, Value q, int64_t experts) {
  Value k = e.index(cast<MemRefType>(top.getType()).getDimSize(1));
  Value id = e.toIndex(e.load(top, {e.div(q, k), e.rem(q, k)}));
  Value valid = arith::AndIOp::create(
      e.b, e.loc, e.cmp(arith::CmpIPredicate::sge, id, e.index(0)),
      e.cmp(arith::CmpIPredicate::slt, id, e.index(experts)));
  return e.select(valid, id, e.index(-1));
}

Value GridBuilder::base(Value m) {
  return arith::IndexCastOp::create(
      e.b, e.loc, e.b.getI64Type(),
      memref::ExtractAlignedPointerAsIndexOp::create(e.b, e.loc, m));
}

Value GridBuilder::at(Value base, Value elements, int64_t elementBytes) {
  Value bytes = arith::MulIOp::create(
      e.b, e.loc,
      arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(), elements),
      arith::ConstantIntOp::create(e.b, e.loc, elementBytes, 64));
  return LLVM::IntToPtrOp::create(
      e.b, e.loc, LLVM::LLVMPointerType::get(e.b.getContext(), 1),
      arith::AddIOp::create(e.b, e.loc, base, bytes),
      LLVM::DereferenceableAttr());
}

Value GridBuilder::load16(Type type, Value ptr) {
  return LLVM::LoadOp::create(e.b, e.loc, type, ptr, /*alignment=*/16);
}

void GridBuilder::store16(Value v, Value ptr) {
  LLVM::StoreOp::create(e.b, e.loc, v, ptr, /*alignment=*/16);
}

void GridBuilder::store16Streaming(Value v, Value ptr) {
  storeGlobalStreaming16(
      e.b, e.loc, LLVM::PtrToIntOp::create(e.b, e.loc, e.b.getI64Type(), ptr),
      v);
}

int64_t GridBuilder::guaranteedAlignment(Value buffer) const {
  auto arg = dyn_cast<BlockArgument>(buffer);
  gpu::GPUFuncOp kernel = func;
  if (!arg || arg.getOwner() != &kernel.getBody().front())
    return 0;
  return kernelParamAlignment(buffer);
}

int64_t mok::conversion::kernelParamAlignment(Value buffer) {
  auto arg = dyn_cast<BlockArgument>(buffer);
  auto kernel =
      arg ? dyn_cast<gpu::GPUFuncOp>(arg.getOwner()->getParentOp()) : nullptr;
  if (!kernel || arg.getOwner() != &kernel.getBody().front())
    return 0;
  auto desc = kernel->getAttrOfType<DictionaryAttr>("mok.kernel");
  auto params = desc ? desc.getAs<ArrayAttr>("params") : ArrayAttr();
  if (!params || arg.getArgNumber() >= params.size())
    return 0;
  auto param = dyn_cast<DictionaryAttr>(params[arg.getArgNumber()]);
  auto align = param ? param.getAs<IntegerAttr>("align") : IntegerAttr();
  return align ? align.getInt() : 0;
}

Value GridBuilder::aligned(ArrayRef<Value> buffers, int64_t bytes) {
  // Parameters the runtime aligns (`align` in the kernel's description):
  // known here, so the branches for unaligned buffers are not emitted.
  if (llvm::all_of(buffers, [&](Value m) {
        return guaranteedAlignment(m) >= bytes;
      }))
    return arith::ConstantIntOp::create(e.b, e.loc, 1, 1);
  Value bits = arith::ConstantIntOp::create(e.b, e.loc, 0, 64);
  for (Value m : buffers)
    bits = arith::OrIOp::create(e.b, e.loc, bits, base(m));
  Value low = arith::AndIOp::create(
      e.b, e.loc, bits,
      arith::ConstantIntOp::create(e.b, e.loc, bytes - 1, 64));
  return e.cmp(arith::CmpIPredicate::eq, low,
               arith::ConstantIntOp::create(e.b, e.loc, 0, 64));
}

SmallVector<Value> GridBuilder::unpack8(Value vec) {
  SmallVector<Value> xs;
  for (int64_t i = 0; i < 8; ++i) {
    Value lane = arith::ConstantIntOp::create(e.b, e.loc, i, 32);
    Value x = LLVM::ExtractElementOp::create(e.b, e.loc, vec, lane);
    xs.push_back(arith::ExtFOp::create(e.b, e.loc, e.b.getF32Type(), x));
  }
  return xs;
}

Value GridBuilder::pack8(ArrayRef<Value> xs) {
  Type bf16 = e.b.getBF16Type();
  Value packed = LLVM::UndefOp::create(e.b, e.loc, VectorType::get({8}, bf16));
  for (int64_t i = 0; i < 8; ++i)
    packed = LLVM::InsertElementOp::create(
        e.b, e.loc, packed, arith::TruncFOp::create(e.b, e.loc, bf16, xs[i]),
        arith::ConstantIntOp::create(e.b, e.loc, i, 32));
  return packed;
}

Value GridBuilder::decodeE8M0(Value e8) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i32 = b.getI32Type();
  auto c32 = [&](int64_t v) {
    return arith::ConstantIntOp::create(b, loc, v, 32);
  };
  Value byte = arith::ExtUIOp::create(
      b, loc, i32, arith::BitcastOp::create(b, loc, b.getI8Type(), e8));
  // The byte is the f32 biased exponent; 0 is 2^-127 (mantissa bit 22),
  // 0xFF (f32's infinity pattern) is a NaN scale.
  Value bits = arith::ShLIOp::create(b, loc, byte, c32(23));
  bits = arith::SelectOp::create(
      b, loc,
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, byte, c32(0)),
      c32(0x400000), bits);
  bits = arith::SelectOp::create(
      b, loc,
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, byte, c32(255)),
      c32(0x7FC00000), bits);
  return arith::BitcastOp::create(b, loc, b.getF32Type(), bits);
}

Value GridBuilder::decodeE4M3(Value f8) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value byte = arith::BitcastOp::create(b, loc, b.getI8Type(), f8);
  // The byte in both lanes of the pair: either half is its value.
  auto pairType = VectorType::get({2}, b.getI8Type());
  Value pair = LLVM::PoisonOp::create(b, loc, pairType);
  for (int64_t i = 0; i < 2; ++i)
    pair = LLVM::InsertElementOp::create(
        b, loc, pair, byte, arith::ConstantIntOp::create(b, loc, i, 32));
  Value halves = NVVM::ConvertF8x2ToF16x2Op::create(
      b, loc, VectorType::get({2}, b.getF16Type()), pair,
      /*relu=*/false, f8.getType());
  Value half = LLVM::ExtractElementOp::create(
      b, loc, halves, arith::ConstantIntOp::create(b, loc, 0, 32));
  return arith::ExtFOp::create(b, loc, b.getF32Type(), half);
}
