// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The mk dialect: verifiers of the cross-operand shape rules. The checks that
// need the whole kernel (barrier intervals, one MMA engine per kernel, what
// the lowering supports) are convert-mk-to-gpu's.
//
#include "mok/Dialect/MK/IR/MKDialect.h"
#include "mok/Dialect/MK/IR/MKOps.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/CheckedArithmetic.h"

using namespace mlir;
using namespace mok::mk;

#include "mok/Dialect/MK/IR/MKDialect.cpp.inc"
#include "mok/Dialect/MK/IR/MKEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "mok/Dialect/MK/IR/MKAttrs.cpp.inc"

void MKDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "mok/Dialect/MK/IR/MKOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "mok/Dialect/MK/IR/MKAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// #mk.gemm_schedule
//===----------------------------------------------------------------------===//

// <engine (, tile = [M, N, K])? (, stages = S)? (, producer)?
//  (, registers = [c, p])? (, multicast)?>; the parameters after the engine
// in any order, each at most once.
Attribute GemmScheduleAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef engineName;
  if (parser.parseLess() || parser.parseKeyword(&engineName))
    return {};
  std::optional<Engine> engine = symbolizeEngine(engineName);
  if (!engine) {
    parser.emitError(loc) << "expected a GEMM engine (simt, wgmma or "
                             "tcgen05), got '"
                          << engineName << "'";
    return {};
  }
  SmallVector<int64_t> tile, registers;
  int64_t stages = 0;
  bool producer = false, multicast = false;
  llvm::StringSet<> seen;
  auto parseList = [&](SmallVectorImpl<int64_t> &into) {
    return parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
      return parser.parseInteger(into.emplace_back());
    });
  };
  while (succeeded(parser.parseOptionalComma())) {
    SMLoc at = parser.getCurrentLocation();
    StringRef key;
    if (parser.parseKeyword(&key))
      return {};
    if (!seen.insert(key).second) {
      parser.emitError(at) << "'" << key << "' given twice";
      return {};
    }
    if (key == "tile" || key == "registers") {
      if (parser.parseEqual() || parseList(key == "tile" ? tile : registers))
        return {};
    } else if (key == "stages") {
      if (parser.parseEqual() || parser.parseInteger(stages))
        return {};
    } else if (key == "producer") {
      producer = true;
    } else if (key == "multicast") {
      multicast = true;
    } else {
      parser.emitError(at) << "unknown GEMM schedule parameter '" << key
                           << "' (expected tile, stages, producer, registers "
                              "or multicast)";
      return {};
    }
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<GemmScheduleAttr>(loc, parser.getContext(), *engine,
                                             tile, stages, producer, registers,
                                             multicast);
}

void GemmScheduleAttr::print(AsmPrinter &printer) const {
  printer << "<" << stringifyEngine(getEngine());
  auto list = [&](ArrayRef<int64_t> values) {
    printer << "[";
    llvm::interleaveComma(values, printer);
    printer << "]";
  };
  if (!getTile().empty()) {
    printer << ", tile = ";
    list(getTile());
  }
  if (getStages())
    printer << ", stages = " << getStages();
  if (getProducer())
    printer << ", producer";
  if (!getRegisters().empty()) {
    printer << ", registers = ";
    list(getRegisters());
  }
  if (getMulticast())
    printer << ", multicast";
  printer << ">";
}

LogicalResult
GemmScheduleAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                         Engine engine, ArrayRef<int64_t> tile, int64_t stages,
                         bool producer, ArrayRef<int64_t> registers,
                         bool multicast) {
  if (engine == Engine::simt) {
    if (!tile.empty() || stages || producer || !registers.empty() || multicast)
      return emitError() << "the simt engine takes no tile, stages, "
                            "producer, registers or multicast";
    return success();
  }
  if (tile.size() != 3 || llvm::any_of(tile, [](int64_t t) { return t <= 0; }))
    return emitError() << "the " << stringifyEngine(engine)
                       << " engine needs tile = [M, N, K], all positive";
  if (stages <= 0)
    return emitError() << "the " << stringifyEngine(engine)
                       << " engine needs stages = a positive count";
  if (producer && engine != Engine::wgmma)
    return emitError() << "a producer warp is implemented for the wgmma "
                          "engine only, not "
                       << stringifyEngine(engine);
  if (!registers.empty()) {
    if (!producer)
      return emitError() << "registers needs producer (they are moved "
                            "between the consumer and producer warpgroups)";
    if (registers.size() != 2 || llvm::any_of(registers, [](int64_t r) {
          return r < 24 || r > 256 || r % 8;
        }))
      return emitError() << "registers must be [consumer, producer], each a "
                            "multiple of 8 in [24, 256]";
    if (registers[0] < registers[1])
      return emitError() << "registers: the consumers get at least the "
                            "producer's count";
  }
  if (multicast && (engine != Engine::wgmma || producer))
    return emitError() << "multicast is implemented for wgmma GEMMs without "
                          "a producer";
  return success();
}

#define GET_OP_CLASSES
#include "mok/Dialect/MK/IR/MKOps.cpp.inc"

namespace {
int64_t dim(Value v, unsigned i) {
  return cast<MemRefType>(v.getType()).getDimSize(i);
}
/// Sums and products of dimension sizes: dynamic when an operand is, or
/// when the result does not fit in int64_t (the check it feeds is then
/// left to the shapes that are known).
int64_t dimAdd(int64_t a, int64_t b) {
  if (ShapedType::isDynamic(a) || ShapedType::isDynamic(b))
    return ShapedType::kDynamic;
  return llvm::checkedAdd(a, b).value_or(ShapedType::kDynamic);
}
int64_t dimMul(int64_t a, int64_t b) {
  if (ShapedType::isDynamic(a) || ShapedType::isDynamic(b))
    return ShapedType::kDynamic;
  return llvm::checkedMul(a, b).value_or(ShapedType::kDynamic);
}
/// Checks that operand `what`'s dimension `i` is `expected` (both static),
/// naming what it should match.
LogicalResult expectDim(Operation *op, Value v, StringRef what, unsigned i,
                        int64_t expected, StringRef meaning) {
  int64_t got = dim(v, i);
  if (ShapedType::isDynamic(got) || ShapedType::isDynamic(expected) ||
      got == expected)
    return success();
  return op->emitOpError() << what << " dimension " << i << " must be "
                           << expected << " (" << meaning << "), got " << got;
}
/// MX scales (E8M0 bytes, tcgen05's scale-factor layout) of a matrix of
/// `rows` x `cols` quantized along its columns, after the leading
/// dimensions `lead` (an expert count): [lead..., ceil(rows / 128), cols /
/// 128, 512], cols a multiple of 128.
LogicalResult expectMxScales(Operation *op, Value scales, StringRef what,
                             ArrayRef<int64_t> lead, int64_t rows,
                             int64_t cols) {
  unsigned rank = cast<MemRefType>(scales.getType()).getRank();
  if (rank != lead.size() + 3)
    return op->emitOpError()
           << what << ": E8M0 scales must be "
           << (lead.empty() ? "" : "[E, ") << (lead.empty() ? "[" : "")
           << "rows / 128, columns / 128, 512] (tcgen05's scale-factor "
              "atoms), got rank "
           << rank;
  for (auto [i, extent] : llvm::enumerate(lead))
    if (failed(expectDim(op, scales, what, i, extent, "the experts")))
      return failure();
  unsigned at = lead.size();
  if (!ShapedType::isDynamic(cols) && cols % 128)
    return op->emitOpError()
           << what << ": MX operands of " << cols
           << " columns; the scale atoms need a multiple of 128";
  int64_t rowAtoms =
      ShapedType::isDynamic(rows) ? rows : (rows + 127) / 128;
  int64_t colAtoms = ShapedType::isDynamic(cols) ? cols : cols / 128;
  return failure(
      failed(expectDim(op, scales, what, at, rowAtoms,
                       "the rows / 128, rounded up")) ||
      failed(expectDim(op, scales, what, at + 1, colAtoms,
                       "the columns / 128")) ||
      failed(expectDim(op, scales, what, at + 2, 512,
                       "an atom's 512 bytes")));
}
} // namespace

LogicalResult PadOffsetsOp::verify() {
  return expectDim(*this, getOffsets(), "offsets", 0,
                   dimAdd(dim(getCounts(), 0), 1), "experts + 1");
}

/// chunk_counts must be [ceil(routes / chunk), experts].
static LogicalResult checkChunks(Operation *op, Value top, Value chunkCounts,
                                 int64_t chunk) {
  int64_t routes = dimMul(dim(top, 0), dim(top, 1));
  if (ShapedType::isDynamic(routes))
    return success();
  return expectDim(op, chunkCounts, "chunk_counts", 0,
                   routes / chunk + (routes % chunk != 0),
                   "ceil(tokens * top_k / chunk)");
}

LogicalResult CountRoutesOp::verify() {
  return checkChunks(*this, getTopExperts(), getChunkCounts(), getChunk());
}

LogicalResult ScanChunksOp::verify() {
  return expectDim(*this, getChunkCounts(), "chunk_counts", 1,
                   dim(getCounts(), 0), "experts, the size of counts");
}

LogicalResult AssignRowsOp::verify() {
  Value top = getTopExperts();
  if (failed(expectDim(*this, getRouteRow(), "route_row", 0,
                       dimMul(dim(top, 0), dim(top, 1)), "tokens * top_k")) ||
      failed(expectDim(*this, getRowExpert(), "row_expert", 0,
                       dim(getRowRoute(), 0), "the size of row_route")) ||
      failed(checkChunks(*this, top, getChunkCounts(), getChunk())) ||
      failed(expectDim(*this, getChunkCounts(), "chunk_counts", 1,
                       dimAdd(dim(getOffsets(), 0), -1),
                       "experts, offsets - 1")))
    return failure();
  if (!ShapedType::isDynamic(dim(getOffsets(), 0)) && dim(getOffsets(), 0) < 2)
    return emitOpError("offsets must hold experts + 1 >= 2 entries");
  return success();
}

LogicalResult QuantizeRowsOp::verify() {
  Value src = getSrc();
  int64_t rows = dim(src, 0), cols = dim(src, 1);
  if (failed(expectDim(*this, getValues(), "values", 0, rows, "src's rows")) ||
      failed(expectDim(*this, getValues(), "values", 1, cols, "src's columns")))
    return failure();
  if (getTokens() && getOffsets())
    return emitOpError("takes tokens (token rows) or grouped (routed rows), "
                       "not both");
  if (isMx())
    return expectMxScales(*this, getScales(), "scales", {}, rows, cols);
  if (ShapedType::isDynamic(cols))
    return success();
  if (cols % 128)
    return emitOpError() << "src's columns (" << cols
                         << ") must be a multiple of 128, the block";
  if (failed(expectDim(*this, getScales(), "scales", 0, cols / 128,
                       "src's columns / 128, one row of scales a block")))
    return failure();
  int64_t width = dim(getScales(), 1);
  if (ShapedType::isDynamic(width) || ShapedType::isDynamic(rows))
    return success();
  if (width < rows || width % 4)
    return emitOpError() << "scales dimension 1 must be at least src's rows ("
                         << rows << ") and a multiple of 4 (16-byte rows), got "
                         << width;
  return success();
}

LogicalResult QuantizeColumnsOp::verify() {
  Value src = getSrc(), values = getValues(), scales = getScales();
  Value weights = getRouterWeights();
  if (weights && !getRowRoute())
    return emitOpError("gathered needs routed (row_route and offsets)");
  // (Gathered: the rows are row_route's, src's are the token rows.)
  int64_t rows = quantizedRows(), cols = dim(src, 1);
  StringRef rowsName = weights ? "row_route's length" : "src's rows";
  if (failed(expectDim(*this, values, "values", 0, cols, "src's columns")))
    return failure();
  int64_t padded = dim(values, 1);
  if (isMx()) {
    if (!ShapedType::isDynamic(padded) &&
        (padded % 128 || (!ShapedType::isDynamic(rows) && padded < rows)))
      return emitOpError() << "values dimension 1 (" << padded
                           << ") must be " << rowsName << " (" << rows
                           << ") or more, a multiple of 128 (the scale atoms)";
    if (failed(expectMxScales(*this, scales, "scales", {}, cols, padded)))
      return failure();
  } else if (!ShapedType::isDynamic(padded)) {
    if (padded % 128 || (!ShapedType::isDynamic(rows) && padded < rows))
      return emitOpError() << "values dimension 1 (" << padded
                           << ") must be " << rowsName << " (" << rows
                           << ") or more, a multiple of 128, the block";
    if (failed(expectDim(*this, scales, "scales", 0, padded / 128,
                         "values' columns / 128, one row of scales a block")))
      return failure();
  }
  int64_t width = dim(scales, 1);
  if (!isMx() && !ShapedType::isDynamic(width) &&
      !ShapedType::isDynamic(cols) && (width < cols || width % 4))
    return emitOpError() << "scales dimension 1 must be at least src's "
                            "columns ("
                         << cols << ") and a multiple of 4, got " << width;
  if (!ShapedType::isDynamic(cols) && cols % 32)
    return emitOpError() << "src's columns (" << cols
                         << ") must be a multiple of 32 (a warp's lanes)";
  if (static_cast<bool>(getRowRoute()) != static_cast<bool>(getOffsets()))
    return emitOpError("routed needs both row_route and offsets");
  if (Value rowRoute = getRowRoute(); rowRoute && !weights)
    if (failed(expectDim(*this, rowRoute, "row_route", 0, rows, "src's rows")))
      return failure();
  if (weights) {
    if (failed(expectDim(*this, weights, "router_weights", 0, dim(src, 0),
                         "src's rows, the tokens")))
      return failure();
    if (ShapedType::isDynamic(dim(weights, 1)))
      return emitOpError("router_weights' columns (top_k) must be static");
  }
  return success();
}

LogicalResult QuantizeWeightsOp::verify() {
  Value src = getSrc();
  // (transposed: values and scales [E, K, N], src's dimensions 0, 2, 1.)
  unsigned from[3] = {0, 1, 2};
  if (getTransposed())
    std::swap(from[1], from[2]);
  for (unsigned i = 0; i < 3; ++i)
    if (failed(expectDim(*this, getValues(), "values", i, dim(src, from[i]),
                         getTransposed() ? "src's, transposed" : "src's")))
      return failure();
  if (isMx()) {
    // (transposed: the scales of [E, K, N], blocks along N.)
    int64_t rows = dim(src, from[1]), cols = dim(src, from[2]);
    if (!ShapedType::isDynamic(rows) && rows % 128)
      return emitOpError() << "src dimension " << from[1] << " (" << rows
                           << ") must be a multiple of 128 (the scale atoms)";
    return expectMxScales(*this, getScales(), "scales", {dim(src, 0)}, rows,
                          cols);
  }
  int64_t blocks[3] = {dim(src, from[0]), dim(src, from[1]),
                       dim(src, from[2])};
  for (unsigned i = 1; i < 3; ++i) {
    if (ShapedType::isDynamic(blocks[i]))
      continue;
    if (blocks[i] % 128)
      return emitOpError() << "src dimension " << from[i] << " ("
                           << blocks[i]
                           << ") must be a multiple of 128, the block";
    blocks[i] /= 128;
  }
  for (unsigned i = 0; i < 3; ++i)
    if (failed(expectDim(*this, getScales(), "scales", i, blocks[i],
                         i ? "one scale a 128 x 128 block" : "src's experts")))
      return failure();
  return success();
}

LogicalResult GatherOp::verify() {
  Type elt = cast<MemRefType>(getX().getType()).getElementType();
  if (elt != cast<MemRefType>(getRoutedX().getType()).getElementType())
    return emitOpError("x and routed_x must have one element type");
  bool fp8 = isa<Float8E4M3FNType>(elt);
  if (static_cast<bool>(getXScales()) != static_cast<bool>(getRoutedScales()))
    return emitOpError("block_scales needs both x's and routed_x's scales");
  if (fp8 != static_cast<bool>(getXScales()))
    return emitOpError("block_scales go with f8E4M3FN rows, and f8E4M3FN "
                       "rows with block_scales");
  if (fp8 && getScale())
    return emitOpError("scale (the router weights) applies to bf16 rows, not "
                       "FP8 ones");
  if (fp8) {
    int64_t h = dim(getX(), 1);
    if (!ShapedType::isDynamic(h) && h % 128)
      return emitOpError() << "FP8 rows of " << h
                           << " elements: a multiple of 128, the block";
    int64_t blocks = ShapedType::isDynamic(h) ? h : h / 128;
    for (auto [what, scales, rows] :
         {std::tuple<StringRef, Value, int64_t>{"x_scales", getXScales(),
                                                dim(getX(), 0)},
          {"routed_scales", getRoutedScales(), dim(getRoutedX(), 0)}}) {
      if (failed(expectDim(*this, scales, what, 0, blocks,
                           "the hidden size / 128")))
        return failure();
      int64_t width = dim(scales, 1);
      if (!ShapedType::isDynamic(width) && !ShapedType::isDynamic(rows) &&
          (width < rows || width % 4))
        return emitOpError() << what << " dimension 1 must be at least its "
                             << "rows (" << rows
                             << ") and a multiple of 4, got " << width;
    }
  }
  if (Value w = getScale())
    if (failed(expectDim(*this, w, "scale", 0, dim(getX(), 0),
                         "tokens, x's rows")) ||
        failed(expectDim(*this, w, "scale", 1, getTopK(), "top_k")))
      return failure();
  return failure(
      failed(expectDim(*this, getRoutedX(), "routed_x", 1, dim(getX(), 1),
                       "the hidden size of x")) ||
      failed(expectDim(*this, getRoutedX(), "routed_x", 0,
                       dim(getRowRoute(), 0), "the size of row_route")));
}

LogicalResult GemmOp::verifyFp8(int64_t m, int64_t k, int64_t n) {
  auto eltOf = [](Value v) {
    return cast<MemRefType>(v.getType()).getElementType();
  };
  bool fp8 = isFp8();
  SmallVector<Value> operands = {getA()};
  if (Value a2 = getA2())
    operands.push_back(a2);
  llvm::append_range(operands, getB());
  for (Value v : operands)
    if (eltOf(v) != eltOf(getA()))
      return emitOpError("a, a2 and the B operands must all be bf16 or all "
                         "f8E4M3FN");
  ValueRange scales = getScales();
  if (!fp8) {
    if (!scales.empty())
      return emitOpError("scales are for FP8 (f8E4M3FN) operands; bf16 "
                         "operands take none");
    return success();
  }
  if (getTransposeA() || getTransposeB() || getGatherRows())
    return emitOpError("FP8 operands are K-major (A [M, K], B [N, K]): no "
                       "transpose_a, transpose_b or gathered A");
  if (scales.size() != operands.size())
    return emitOpError() << "FP8 operands need one scale buffer each (a, "
                            "a2, then each B): expected "
                         << operands.size() << ", got " << scales.size();
  // MXFP8: every operand's scales E8M0 atoms (blocks of 32 along K).
  bool mx = isa<Float8E8M0FNUType>(eltOf(scales[0]));
  for (Value s : scales)
    if (isa<Float8E8M0FNUType>(eltOf(s)) != mx)
      return emitOpError("FP8 scales must be all f32 or all E8M0 (f8E8M0FNU)");
  if (mx) {
    // (k_groups: A [M, K] and B [N, K] with K the routed rows, each group's
    // K range starting on an atom column.)
    unsigned activations = getA2() ? 2 : 1;
    for (unsigned i = 0; i < activations; ++i)
      if (failed(expectMxScales(*this, scales[i], "A scales", {}, m, k)))
        return failure();
    SmallVector<int64_t, 1> lead;
    if (isGrouped())
      lead.push_back(dim(getB()[0], 0));
    if (!ShapedType::isDynamic(n) && n % 128)
      return emitOpError() << "MX: N = " << n
                           << " must be a multiple of 128 (the scale atoms)";
    for (Value s : scales.drop_front(activations))
      if (failed(expectMxScales(*this, s, "B scales", lead, n, k)))
        return failure();
    return success();
  }
  for (auto [what, extent] : {std::pair<StringRef, int64_t>{"K", k}, {"N", n}})
    if (!ShapedType::isDynamic(extent) && extent % 128)
      return emitOpError() << "FP8: " << what << " = " << extent
                           << " must be a multiple of 128, the block";
  int64_t kBlocks = ShapedType::isDynamic(k) ? k : k / 128;
  int64_t nBlocks = ShapedType::isDynamic(n) ? n : n / 128;
  unsigned activations = getA2() ? 2 : 1;
  for (unsigned i = 0; i < activations; ++i) {
    Value s = scales[i];
    if (cast<MemRefType>(s.getType()).getRank() != 2)
      return emitOpError() << "scales #" << i
                           << " (of an A operand) must be [K/128, S]";
    if (failed(expectDim(*this, s, "A scales", 0, kBlocks,
                         "K / 128, one row of scales a block")))
      return failure();
    int64_t width = dim(s, 1);
    if (!ShapedType::isDynamic(width) && !ShapedType::isDynamic(m) &&
        (width < m || width % 4))
      return emitOpError() << "A scales dimension 1 must be at least a's rows ("
                           << m << ") and a multiple of 4, got " << width;
  }
  // k_groups (a weight gradient, K the routed rows): both operands'
  // blocks run along K, so B's scales are [K/128, S >= N] as A's.
  if (getKOffsets()) {
    Value s = scales[activations];
    if (cast<MemRefType>(s.getType()).getRank() != 2)
      return emitOpError("with k_groups the B operand's scales are "
                         "[K/128, S], S >= N");
    if (failed(expectDim(*this, s, "B scales", 0, kBlocks,
                         "K / 128, one row of scales a block")))
      return failure();
    int64_t width = dim(s, 1);
    if (!ShapedType::isDynamic(width) && !ShapedType::isDynamic(n) &&
        (width < n || width % 4))
      return emitOpError() << "B scales dimension 1 must be at least N (" << n
                           << ") and a multiple of 4, got " << width;
    return success();
  }
  bool grouped = isGrouped();
  for (unsigned i = activations; i < scales.size(); ++i) {
    Value s = scales[i];
    unsigned rank = grouped ? 3 : 2;
    if (cast<MemRefType>(s.getType()).getRank() != rank)
      return emitOpError() << "scales #" << i << " (of a B operand) must be "
                           << (grouped ? "[E, N/128, K/128]"
                                       : "[N/128, K/128]");
    if ((grouped && failed(expectDim(*this, s, "B scales", 0,
                                     dim(getB()[0], 0), "E, B's experts"))) ||
        failed(expectDim(*this, s, "B scales", rank - 2, nBlocks, "N / 128")) ||
        failed(expectDim(*this, s, "B scales", rank - 1, kBlocks, "K / 128")))
      return failure();
  }
  return success();
}

LogicalResult GemmOp::verify() {
  unsigned numB = getB().size();
  if (getEpilogue() == Epilogue::swiglu && numB != 2)
    return emitOpError() << "the swiglu epilogue takes 2 B operand(s), got "
                         << numB;
  if (getSwigluLimit() && getEpilogue() != Epilogue::swiglu)
    return emitOpError("swiglu_limit needs the swiglu epilogue");
  if (static_cast<bool>(getRowExpert()) != static_cast<bool>(getOffsets()))
    return emitOpError("grouped needs both row_expert and offsets");
  bool ta = getTransposeA(), tb = getTransposeB();
  Value a = getA(), out = getOut();
  bool f32Out = cast<MemRefType>(out.getType()).getElementType().isF32();
  if (f32Out && getEpilogue() != Epilogue::store)
    return emitOpError("an f32 out needs the store epilogue");
  if (getAccumulate() && !f32Out)
    return emitOpError("accumulate needs an f32 out (out += the fp32 "
                       "accumulators)");
  if (Value a2 = getA2()) {
    if (getEpilogue() != Epilogue::store || numB != 2)
      return emitOpError("concat needs the store epilogue and two B operands "
                         "(a with the first, a2 with the second)");
    if (a2.getType() != a.getType())
      return emitOpError("concat: a2 must have a's type");
  } else if (getEpilogue() == Epilogue::store && numB != 1) {
    return emitOpError() << "the store epilogue takes 1 B operand(s) (2 with "
                            "concat), got "
                         << numB;
  }
  if (!getSaves().empty()) {
    if (getEpilogue() != Epilogue::swiglu || getSaves().size() != 2)
      return emitOpError("saves needs the swiglu epilogue and two buffers "
                         "(gate, up)");
    for (Value v : getSaves())
      if (v.getType() != out.getType())
        return emitOpError("saves: each buffer must have out's type");
  }
  bool kGroups = static_cast<bool>(getKOffsets());
  if (getTokens() && (isGrouped() || kGroups))
    return emitOpError("tokens (a's token rows) applies to a GEMM over token "
                       "rows: not grouped, no k_groups (their rows come from "
                       "the routing plan)");
  // (FP8: K-major operands, A [M, K] and B [N, K]; verifyFp8 refuses the
  // transposes.)
  if (kGroups && ((!isFp8() && (!ta || !tb)) || isGrouped()))
    return emitOpError("k_groups needs transpose_a and transpose_b (A [K, M] "
                       "and B [K, N], K over the routed rows; FP8: A [M, K] "
                       "and B [N, K]) and no grouped");
  if (kGroups && (getEpilogue() != Epilogue::store || numB != 1))
    return emitOpError("k_groups needs the store epilogue with one B operand "
                       "(no concat)");
  // a is [M, K], or [K, M] transposed.
  int64_t k = dim(a, ta ? 0 : 1), m = dim(a, ta ? 1 : 0);
  unsigned bRank = isGrouped() ? 3 : 2;
  // The ranks first: N is read from the first B operand's shape.
  for (Value b : getB()) {
    if (cast<MemRefType>(b.getType()).getRank() != bRank)
      return emitOpError() << "B operands must be "
                           << (isGrouped()
                                   ? (tb ? "[E, K, N] (grouped, "
                                           "transposed)"
                                         : "[E, N, K] (grouped)")
                                   : (tb ? "[K, N] (transposed)" : "[N, K]"))
                           << ", got rank "
                           << cast<MemRefType>(b.getType()).getRank();
    if (b.getType() != getB()[0].getType())
      return emitOpError("B operands must have one type");
  }
  int64_t n = dim(getB()[0], tb ? bRank - 1 : bRank - 2);
  for (Value b : getB()) {
    if (failed(expectDim(*this, b, "B", tb ? bRank - 2 : bRank - 1, k,
                         ta ? "K, a's rows" : "K, a's columns")) ||
        failed(expectDim(*this, b, "B", tb ? bRank - 1 : bRank - 2, n,
                         "N, the first B's")))
      return failure();
  }
  if (getKCounts() && !kGroups)
    return emitOpError("k_counts needs k_groups (it counts each K group's "
                       "rows)");
  if (kGroups) {
    int64_t groups = dimAdd(dim(getKOffsets(), 0), -1);
    if (Value counts = getKCounts())
      if (failed(expectDim(*this, counts, "k_counts", 0, groups,
                           "E, offsets - 1")))
        return failure();
    if (cast<MemRefType>(out.getType()).getRank() != 3)
      return emitOpError("k_groups: out must be [E, M, N]");
    if (failed(expectDim(*this, out, "out", 0, groups, "E, offsets - 1")) ||
        failed(expectDim(*this, out, "out", 1, m, "M, a's columns")) ||
        failed(expectDim(*this, out, "out", 2, n, "N, B's columns")))
      return failure();
  } else {
    if (cast<MemRefType>(out.getType()).getRank() != 2)
      return emitOpError("out must be [M, N] (rank 3 needs k_groups)");
    // Gathered, A's rows are out's (a holds the rows they are taken from).
    bool gathered = static_cast<bool>(getGatherRows());
    if (failed(expectDim(*this, out, "out", 1, n,
                         tb ? "N, B's columns" : "N, B's rows")) ||
        (!gathered && failed(expectDim(*this, out, "out", 0, m,
                                       ta ? "M, a's columns" : "a's rows"))))
      return failure();
  }
  if (isGrouped()) {
    int64_t experts = dim(getB()[0], 0);
    if (failed(expectDim(*this, getOffsets(), "offsets", 0, dimAdd(experts, 1),
                         "experts + 1")) ||
        failed(expectDim(*this, getRowExpert(), "row_expert", 0, dim(out, 0),
                         "out's rows")))
      return failure();
  }

  if (getGatherRows() || getGatherTopK()) {
    if (!getGatherRows() || !getGatherTopK())
      return emitOpError("gather needs both gather_rows and gather_top_k");
    if (getEngine() != Engine::wgmma)
      return emitOpError("a gathered A operand is implemented for the wgmma "
                         "engine only");
    if (!isGrouped())
      return emitOpError("a gathered A operand needs a grouped GEMM (its "
                         "rows are routed rows)");
    if (failed(expectDim(*this, getGatherRows(), "gather_rows", 0,
                         dim(getOut(), 0), "out's rows")))
      return failure();
  }
  if (Value padding = getPaddingRows()) {
    if (!isGrouped())
      return emitOpError("padding rows need a grouped GEMM (padding ends "
                         "each expert's segment)");
    if (failed(expectDim(*this, padding, "padding_rows", 0, dim(getOut(), 0),
                         "out's rows")))
      return failure();
  }
  if (failed(verifyFp8(m, k, n)))
    return failure();
  bool tc = usesTensorCores();
  if (!tc) {
    if (getMaps() || getTensorMaps())
      return emitOpError("the simt engine takes no maps or tensor_maps");
    return success();
  }
  if (!getMaps() || !getTensorMaps())
    return emitOpError() << "the " << stringifyEngine(getEngine())
                         << " engine needs maps and tensor_maps";
  ArrayRef<int64_t> tile = getSchedule().getTile();
  // (Transposed A: K runs over A's rows, a ragged last k-tile reads zeros.)
  if (!ShapedType::isDynamic(k) && k < tile[2] && !ta)
    return emitOpError() << "K = " << k << " is less than the tile's K ("
                         << tile[2] << "): nothing to accumulate";
  if (!ShapedType::isDynamic(k) && k % tile[2] && !ta)
    return emitOpError() << "K = " << k
                         << " must be a multiple of the tile's K (" << tile[2]
                         << ")";
  unsigned wantMaps = 1 + numB + (getA2() ? 1 : 0);
  if (getMaps()->size() != wantMaps)
    return emitOpError() << "maps must give " << wantMaps
                         << (getA2() ? " slots (a, then each B, then a2), got "
                                     : " slots (a, then each B), got ")
                         << getMaps()->size();
  if (llvm::any_of(*getMaps(), [](int64_t s) { return s < 0; }))
    return emitOpError("map slots must be >= 0");
  return success();
}

LogicalResult CombineOp::verify() {
  Value out = getOut();
  if (Value w = getRouterWeights()) {
    if (failed(expectDim(*this, w, "router_weights", 0, dim(out, 0),
                         "tokens, out's rows")) ||
        failed(expectDim(*this, getRouteRow(), "route_row", 0,
                         dimMul(dim(w, 0), dim(w, 1)), "tokens * top_k")))
      return failure();
  } else {
    int64_t routes = dim(getRouteRow(), 0), tokens = dim(out, 0);
    if (!ShapedType::isDynamic(routes) && !ShapedType::isDynamic(tokens) &&
        (tokens == 0 || routes % tokens))
      return emitOpError() << "route_row's " << routes
                           << " routes must be a multiple of out's " << tokens
                           << " rows (tokens * top_k)";
  }
  if (failed(expectDim(*this, getRoutedY(), "routed_y", 1, dim(out, 1),
                       "the hidden size of out")))
    return failure();
  if (Value shared = getSharedOut())
    if (shared.getType() != out.getType())
      return emitOpError("shared must have out's type");
  return success();
}

LogicalResult SwigluGradOp::verify() {
  Value dh = getDHiddenU();
  for (auto [v, what] :
       {std::pair(getGate(), "gate"), std::pair(getUp(), "up"),
        std::pair(getDGate(), "d_gate"), std::pair(getDUp(), "d_up")})
    if (failed(expectDim(*this, v, what, 0, dim(dh, 0), "d_hidden_u's rows")) ||
        failed(
            expectDim(*this, v, what, 1, dim(dh, 1), "d_hidden_u's columns")))
      return failure();
  int routeOperands =
      static_cast<bool>(getRowRoute()) + static_cast<bool>(getRouteRow()) +
      static_cast<bool>(getRouterWeights()) + static_cast<bool>(getOffsets()) +
      static_cast<bool>(getDRouterWeights());
  if (routeOperands != 0 && routeOperands != 5)
    return emitOpError("the routed form needs all of row_route, route_row, "
                       "router_weights, offsets and d_router_weights (the "
                       "shared form none)");
  if (!getRowRoute())
    return success();
  Value w = getRouterWeights();
  if (failed(expectDim(*this, getHidden(), "hidden", 0, dim(dh, 0),
                       "d_hidden_u's rows")) ||
      failed(expectDim(*this, getHidden(), "hidden", 1, dim(dh, 1),
                       "d_hidden_u's columns")) ||
      failed(expectDim(*this, getRowRoute(), "row_route", 0, dim(dh, 0),
                       "d_hidden_u's rows")) ||
      failed(expectDim(*this, getRouteRow(), "route_row", 0,
                       dimMul(dim(w, 0), dim(w, 1)), "tokens * top_k")))
    return failure();
  if (getDRouterWeights().getType() != w.getType())
    return emitOpError("d_router_weights must have router_weights' type");
  return success();
}

/// The kernel's report to the runtime: 8 words.
static LogicalResult checkStatus(Operation *op, Value status) {
  return expectDim(op, status, "status", 0, 8, "the kernel's report words");
}

LogicalResult CheckRoutesOp::verify() { return checkStatus(*this, getStatus()); }

LogicalResult GridBarrierOp::verify() {
  if (failed(expectDim(*this, getState(), "state", 0, 2,
                       "[arrived CTAs, generation]")))
    return failure();
  bool bounded = getTimeoutNs().has_value();
  if (static_cast<bool>(getStatus()) != bounded)
    return emitOpError("a bounded wait needs both status and timeout_ns");
  if (getIndex().has_value() != bounded)
    return emitOpError("index names a bounded wait's barrier: it needs "
                       "status and timeout_ns, and they need it");
  return bounded ? checkStatus(*this, getStatus()) : success();
}

LogicalResult TimestampOp::verify() {
  int64_t n = dim(getClock(), 0);
  if (!ShapedType::isDynamic(n) && getIndex() >= n)
    return emitOpError() << "index " << getIndex()
                         << " is out of the clock buffer's " << n << " entries";
  if (Value cycles = getCycles())
    if (failed(expectDim(*this, cycles, "cycles", 0, n, "the clock's entries")))
      return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

/// A region of the kernel's symmetric buffer: a memref.view of an i8
/// argument of the gpu.func (its peers' copies are at the same offset).
static LogicalResult checkRegion(Operation *op, Value region, StringRef what) {
  auto view = region.getDefiningOp<memref::ViewOp>();
  auto arg = view ? dyn_cast<BlockArgument>(view.getSource()) : BlockArgument();
  if (!arg || !isa<gpu::GPUFuncOp>(arg.getOwner()->getParentOp()))
    return op->emitOpError()
           << what
           << " must be a region of the kernel's symmetric buffer (a "
              "memref.view of its i8 argument): its peers' copies are at "
              "the same offset from their addresses in the peer table";
  return success();
}

/// The group size of an exchange op: the peer table's entries.
static int64_t groupSize(Value peers) { return dim(peers, 0); }

static LogicalResult checkMatrix(Operation *op, Value matrix, int64_t ep) {
  if (failed(expectDim(op, matrix, "matrix", 0, ep, "ranks, the peers")) ||
      failed(expectDim(op, matrix, "matrix", 1, dimMul(ep, 2),
                       "2 * ranks: rows, then routes, to each rank")))
    return failure();
  return success();
}

LogicalResult RouteRanksOp::verify() {
  Value top = getTopExperts();
  if (getExperts() % getEp())
    return emitOpError() << "experts (" << getExperts()
                         << ") must be divisible by ep (" << getEp() << ")";
  return failure(
      failed(expectDim(*this, getRanks(), "ranks", 0, dim(top, 0),
                       "tokens, top_experts' rows")) ||
      failed(expectDim(*this, getRanks(), "ranks", 1, getEp(), "ep")) ||
      failed(expectDim(*this, getRouteRow(), "route_row", 0,
                       dimMul(dim(top, 0), dim(top, 1)), "tokens * top_k")));
}

LogicalResult PutCountsOp::verify() {
  int64_t ep = groupSize(getPeers());
  if (failed(checkRegion(*this, getMatrix(), "matrix")) ||
      failed(checkMatrix(*this, getMatrix(), ep)) ||
      failed(expectDim(*this, getRows(), "rows", 0, ep, "ranks, the peers")))
    return failure();
  int64_t experts = dim(getRoutes(), 0);
  if (!ShapedType::isDynamic(experts) && !ShapedType::isDynamic(ep) &&
      experts % ep)
    return emitOpError() << "routes' " << experts
                         << " experts must be divisible by the " << ep
                         << " ranks";
  return success();
}

LogicalResult SignalOp::verify() {
  if (failed(checkRegion(*this, getFlags(), "flags")) ||
      failed(expectDim(*this, getFlags(), "flags", 1, groupSize(getPeers()),
                       "ranks, the peers")))
    return failure();
  int64_t n = dim(getFlags(), 0);
  if (!ShapedType::isDynamic(n) && getIndex() >= n)
    return emitOpError() << "index " << getIndex() << " is out of flags' " << n
                         << " rows";
  return success();
}

LogicalResult WaitOp::verify() {
  if (failed(checkRegion(*this, getFlags(), "flags")))
    return failure();
  bool bounded = getTimeoutNs().has_value();
  if (static_cast<bool>(getStatus()) != bounded ||
      getReport().has_value() != bounded)
    return emitOpError("a bounded wait needs status, timeout_ns and report, "
                       "each with the others");
  if (bounded && failed(checkStatus(*this, getStatus())))
    return failure();
  int64_t n = dim(getFlags(), 0);
  if (!ShapedType::isDynamic(n) && getIndex() >= n)
    return emitOpError() << "index " << getIndex() << " is out of flags' " << n
                         << " rows";
  return success();
}

LogicalResult CheckCapacityOp::verify() {
  if (failed(checkRegion(*this, getMatrix(), "matrix")) ||
      failed(checkMatrix(*this, getMatrix(), dim(getMatrix(), 0))) ||
      failed(expectDim(*this, getVerdict(), "verdict", 0, 1, "one word")))
    return failure();
  return checkStatus(*this, getStatus());
}

LogicalResult ReceivedRowsOp::verify() {
  if (failed(checkRegion(*this, getMatrix(), "matrix")) ||
      failed(expectDim(*this, getVerdict(), "verdict", 0, 1, "one word")))
    return failure();
  return checkMatrix(*this, getMatrix(), dim(getMatrix(), 0));
}

LogicalResult SendRowsOp::verify() {
  int64_t ep = groupSize(getPeers());
  Value top = getTopExperts(), x = getX();
  for (auto [v, what] : {std::pair(getMatrix(), "matrix"),
                         std::pair(getRecvX(), "recv_x"),
                         std::pair(getRecvOrigin(), "recv_origin"),
                         std::pair(getRecvExperts(), "recv_experts")})
    if (failed(checkRegion(*this, v, what)))
      return failure();
  int64_t capacity = dim(getRecvX(), 0);
  if (static_cast<bool>(getRouterWeights()) !=
      static_cast<bool>(getRecvWeights()))
    return emitOpError("weights need both router_weights and recv_weights");
  if (Value w = getRouterWeights())
    if (failed(checkRegion(*this, getRecvWeights(), "recv_weights")) ||
        failed(expectDim(*this, w, "router_weights", 0, dim(x, 0),
                         "tokens, x's rows")) ||
        failed(expectDim(*this, w, "router_weights", 1, dim(top, 1),
                         "top_k")) ||
        failed(expectDim(*this, getRecvWeights(), "recv_weights", 0, capacity,
                         "recv_x's rows")) ||
        failed(expectDim(*this, getRecvWeights(), "recv_weights", 1,
                         dim(top, 1), "top_k")))
      return failure();
  return failure(
      failed(checkMatrix(*this, getMatrix(), ep)) ||
      failed(expectDim(*this, getVerdict(), "verdict", 0, 1, "one word")) ||
      failed(expectDim(*this, top, "top_experts", 0, dim(x, 0),
                       "tokens, x's rows")) ||
      failed(expectDim(*this, getSendOffsets(), "send_offsets", 0,
                       dimAdd(ep, 1), "ranks + 1")) ||
      failed(expectDim(*this, getSendRoute(), "send_route", 0,
                       dimMul(dim(x, 0), ep), "tokens * ranks")) ||
      failed(expectDim(*this, getRecvX(), "recv_x", 1, dim(x, 1),
                       "the hidden size of x")) ||
      failed(expectDim(*this, getRecvOrigin(), "recv_origin", 0, capacity,
                       "recv_x's rows")) ||
      failed(expectDim(*this, getRecvExperts(), "recv_experts", 0, capacity,
                       "recv_x's rows")) ||
      failed(expectDim(*this, getRecvExperts(), "recv_experts", 1,
                       dim(top, 1), "top_k")));
}

/// The launch count: one word, a region of the symmetric buffer.
static LogicalResult checkLaunches(Operation *op, Value launches) {
  if (failed(checkRegion(op, launches, "launches")))
    return failure();
  return expectDim(op, launches, "launches", 0, 1, "one count");
}

LogicalResult LaunchEpochOp::verify() {
  return checkLaunches(*this, getLaunches());
}

LogicalResult CountLaunchOp::verify() {
  return checkLaunches(*this, getLaunches());
}

LogicalResult TakeRoutesOp::verify() {
  Value out = getOut();
  return expectDim(*this, getRouteRow(), "route_row", 0,
                   dimMul(dim(out, 0), dim(out, 1)), "out's tokens * top_k");
}

LogicalResult ReturnRowsOp::verify() {
  if (failed(checkRegion(*this, getRet(), "ret")))
    return failure();
  if (static_cast<bool>(getValues()) != static_cast<bool>(getRetValues()))
    return emitOpError("scalars need both values and ret_values");
  if (Value v = getValues()) {
    if (failed(checkRegion(*this, getRetValues(), "ret_values")) ||
        failed(expectDim(*this, v, "values", 0, dim(getRecvOrigin(), 0),
                         "recv_origin's rows")) ||
        failed(expectDim(*this, v, "values", 1, getTopK(), "top_k")) ||
        failed(expectDim(*this, getRetValues(), "ret_values", 0,
                         dim(getRet(), 0), "ret's rows")))
      return failure();
  }
  return failure(
      failed(expectDim(*this, getRoutedY(), "routed_y", 0,
                       dim(getRowRoute(), 0), "the size of row_route")) ||
      failed(expectDim(*this, getRet(), "ret", 1, dim(getRoutedY(), 1),
                       "the hidden size of routed_y")));
}
