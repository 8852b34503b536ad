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

#define GET_TYPEDEF_CLASSES
#include "mok/Dialect/MoE/IR/MoETypes.cpp.inc"

LogicalResult PlanType::verify(function_ref<InFlightDiagnostic()> emitError,
                               int64_t tokens, int64_t topK, int64_t experts,
                               int64_t ep, int64_t padding) {
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
  return success();
}

void MoEDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "mok/Dialect/MoE/IR/MoETypes.cpp.inc"
      >();
}
