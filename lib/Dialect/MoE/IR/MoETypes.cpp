// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "mok/Dialect/MoE/IR/MoETypes.h"
#include "mok/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mok::moe;

/// `?` or an integer, for the dimensions that may be dynamic.
static ParseResult parseDynamicDim(AsmParser &parser, int64_t &dim) {
  if (succeeded(parser.parseOptionalQuestion())) {
    dim = ShapedType::kDynamic;
    return success();
  }
  return parser.parseInteger(dim);
}

static void printDynamicDim(AsmPrinter &printer, int64_t dim) {
  if (ShapedType::isDynamic(dim))
    printer << '?';
  else
    printer << dim;
}

/// The plan's tail: `padding = P`, then its optional capacities, each
/// `, name = N` when non-zero, in this order: max_tokens, recv_capacity;
/// then the closing `>`.
static ParseResult parsePaddingAndCapacities(AsmParser &parser,
                                             int64_t &padding,
                                             int64_t &maxTokens,
                                             int64_t &recvCapacity) {
  maxTokens = recvCapacity = 0;
  if (parser.parseKeyword("padding") || parser.parseEqual() ||
      parser.parseInteger(padding))
    return failure();
  bool seenMax = false, seenRecv = false;
  while (succeeded(parser.parseOptionalComma())) {
    SMLoc loc = parser.getCurrentLocation();
    StringRef key;
    if (parser.parseKeyword(&key))
      return failure();
    bool isMax = key == "max_tokens";
    if ((!isMax && key != "recv_capacity") || (isMax && (seenMax || seenRecv)) ||
        (!isMax && seenRecv))
      return parser.emitError(loc)
             << "expected 'max_tokens' or 'recv_capacity' (each at most "
                "once, in that order), got '"
             << key << "'";
    (isMax ? seenMax : seenRecv) = true;
    if (parser.parseEqual() ||
        parser.parseInteger(isMax ? maxTokens : recvCapacity))
      return failure();
  }
  return parser.parseGreater();
}

static void printPaddingAndCapacities(AsmPrinter &printer, int64_t padding,
                                      int64_t maxTokens, int64_t recvCapacity) {
  printer << "padding = " << padding;
  if (maxTokens)
    printer << ", max_tokens = " << maxTokens;
  if (recvCapacity)
    printer << ", recv_capacity = " << recvCapacity;
  printer << ">";
}

#define GET_TYPEDEF_CLASSES
#include "mok/Dialect/MoE/IR/MoETypes.cpp.inc"

LogicalResult PlanType::verify(function_ref<InFlightDiagnostic()> emitError,
                               int64_t tokens, int64_t topK, int64_t experts,
                               int64_t ep, int64_t padding,
                               int64_t maxTokens, int64_t recvCapacity) {
  if (!ShapedType::isDynamic(tokens) && tokens < 0)
    return emitError() << "moe.plan: tokens must be non-negative or '?', got "
                       << tokens;
  if (experts < 1)
    return emitError() << "moe.plan: experts must be positive, got " << experts;
  if (ep < 1)
    return emitError() << "moe.plan: ep must be positive, got " << ep;
  if (experts % ep != 0)
    return emitError() << "moe.plan: experts (" << experts
                       << ") must be divisible by ep (" << ep << ")";
  if (topK < 1 || topK > experts)
    return emitError() << "moe.plan: top_k must be in [1, experts = "
                       << experts << "], got " << topK;
  if (padding < 1 || !llvm::isPowerOf2_64(padding))
    return emitError() << "moe.plan: padding must be a power of two, got "
                       << padding;
  if (maxTokens < 0)
    return emitError() << "moe.plan: max_tokens must be positive, got "
                       << maxTokens;
  if (maxTokens && !ShapedType::isDynamic(tokens))
    return emitError() << "moe.plan: max_tokens (" << maxTokens
                       << ") is the capacity of a dynamic token count; "
                          "tokens = "
                       << tokens << " is static";
  // The routes and the routed rows at the capacity, in the compiler's
  // index arithmetic (as LayerSpec and the GPU plans bound them).
  constexpr __int128 kMaxRows = (int64_t(1) << 31) - 1;
  if (maxTokens && static_cast<__int128>(maxTokens) * topK +
                           static_cast<__int128>(experts / ep) * (padding - 1) >
                       kMaxRows)
    return emitError() << "moe.plan: max_tokens = " << maxTokens
                       << " makes the routed rows, max_tokens * top_k + "
                          "(experts / ep) * (padding - 1), exceed 2^31 - 1";
  if (recvCapacity < 0)
    return emitError() << "moe.plan: recv_capacity must be positive, got "
                       << recvCapacity;
  if (recvCapacity && ep == 1)
    return emitError() << "moe.plan: recv_capacity (" << recvCapacity
                       << ") is the receive capacity of an expert-parallel "
                          "rank; ep = 1 exchanges nothing";
  // The routed rows a rank's experts may receive, in the same arithmetic.
  if (recvCapacity && static_cast<__int128>(recvCapacity) +
                              static_cast<__int128>(experts / ep) *
                                  (padding - 1) >
                          kMaxRows)
    return emitError() << "moe.plan: recv_capacity = " << recvCapacity
                       << " makes the routed rows, recv_capacity + "
                          "(experts / ep) * (padding - 1), exceed 2^31 - 1";
  return success();
}

void MoEDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "mok/Dialect/MoE/IR/MoETypes.cpp.inc"
      >();
}
