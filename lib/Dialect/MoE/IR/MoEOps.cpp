// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace mok::moe;

//===----------------------------------------------------------------------===//
// Shape checking shared by the verifiers
//===----------------------------------------------------------------------===//

namespace {
/// A named dimension of the layer (T, H, I, ...). Its value is unknown until
/// the first operand that carries it statically; every later operand must
/// agree with it. Verifiers state each operand's shape as a list of these.
struct Dim {
  enum Kind {
    /// Only the token count may be dynamic.
    Tokens,
    /// Model sizes (H, I, experts, top_k) are compile-time constants.
    Static,
    /// Routed row counts depend on the routing and are always dynamic.
    DataDependent,
  };
  StringRef name;
  Kind kind;
  int64_t value = ShapedType::kDynamic;

  static Dim tokens(int64_t value) { return {"T", Tokens, value}; }
  static Dim fixed(StringRef name, int64_t value = ShapedType::kDynamic) {
    return {name, Static, value};
  }
  static Dim routedRows() { return {"R", DataDependent}; }
};
} // namespace

static std::string describe(ArrayRef<Dim *> dims) {
  std::string s = "[";
  llvm::raw_string_ostream os(s);
  llvm::interleaveComma(dims, os, [&](Dim *d) { os << d->name; });
  os << "]";
  return s;
}

/// Checks `value`'s type against `dims` (its rank is checked by the ODS
/// constraint already), binding each still-unknown dimension it carries.
static LogicalResult checkShape(Operation *op, StringRef operand, Value value,
                                ArrayRef<Dim *> dims) {
  auto type = cast<ShapedType>(value.getType());
  for (auto [i, dim] : llvm::enumerate(dims)) {
    int64_t actual = type.getDimSize(i);
    bool dynamic = ShapedType::isDynamic(actual);
    if (dim->kind == Dim::DataDependent) {
      if (!dynamic)
        return op->emitOpError()
               << "expects " << operand << " " << describe(dims)
               << " to have a dynamic row count " << dim->name
               << " (routed rows are data-dependent), got " << type;
      continue;
    }
    if (dynamic) {
      if (dim->kind == Dim::Static)
        return op->emitOpError()
               << "expects " << operand << " " << describe(dims)
               << " to have a static " << dim->name << ", got " << type;
      continue;
    }
    if (dim->kind == Dim::Static && actual < 1)
      return op->emitOpError() << "expects " << operand << " " << describe(dims)
                               << " to have a positive " << dim->name
                               << ", got " << type;
    if (ShapedType::isDynamic(dim->value)) {
      dim->value = actual;
      continue;
    }
    if (actual != dim->value)
      return op->emitOpError()
             << "expects " << operand << " of shape " << describe(dims)
             << " with " << dim->name << " = " << dim->value << ", got "
             << type;
  }
  return success();
}

static LogicalResult verifySwigluLimit(Operation *op, FloatAttr limit) {
  if (!limit)
    return success();
  const APFloat &value = limit.getValue();
  if (value.isNaN() || value.isNegative() || value.isZero())
    return op->emitOpError()
           << "expects swiglu_limit to be positive (or absent for no clamp), "
              "got "
           << value.convertToFloat();
  return success();
}

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

LogicalResult PlanOp::verify() {
  PlanType plan = getPlan().getType();
  Dim t = Dim::tokens(plan.getTokens()), k = Dim::fixed("top_k", plan.getTopK());
  return checkShape(*this, "top_experts", getTopExperts(), {&t, &k});
}

LogicalResult DispatchOp::verify() {
  PlanType plan = getPlan().getType();
  Dim t = Dim::tokens(plan.getTokens()), h = Dim::fixed("H"),
      r = Dim::routedRows();
  if (failed(checkShape(*this, "x", getX(), {&t, &h})) ||
      failed(checkShape(*this, "routed_x", getRoutedX(), {&r, &h})))
    return failure();
  return success();
}

LogicalResult ExpertSwigluOp::verify() {
  PlanType plan = getPlan().getType();
  Dim e = Dim::fixed("E/ep", plan.getLocalExperts()), h = Dim::fixed("H"),
      i = Dim::fixed("I"), r = Dim::routedRows();
  if (failed(checkShape(*this, "routed_x", getRoutedX(), {&r, &h})) ||
      failed(checkShape(*this, "gate_weights", getGateWeights(), {&e, &i, &h})) ||
      failed(checkShape(*this, "hidden", getHidden(), {&r, &i})))
    return failure();
  return verifySwigluLimit(*this, getSwigluLimitAttr());
}

LogicalResult ExpertDownOp::verify() {
  PlanType plan = getPlan().getType();
  Dim e = Dim::fixed("E/ep", plan.getLocalExperts()), h = Dim::fixed("H"),
      i = Dim::fixed("I"), r = Dim::routedRows();
  if (failed(checkShape(*this, "hidden", getHidden(), {&r, &i})) ||
      failed(checkShape(*this, "down_weights", getDownWeights(), {&e, &h, &i})) ||
      failed(checkShape(*this, "routed_y", getRoutedY(), {&r, &h})))
    return failure();
  return success();
}

/// The shared expert's weights: gate and up `[I_s, H]`, down `[H, I_s]`.
static LogicalResult checkSharedWeights(Operation *op, Value gate, Value up,
                                        Value down, Dim &h, Dim &is) {
  if (failed(checkShape(op, "shared gate_weights", gate, {&is, &h})) ||
      failed(checkShape(op, "shared up_weights", up, {&is, &h})) ||
      failed(checkShape(op, "shared down_weights", down, {&h, &is})))
    return failure();
  return success();
}

LogicalResult SharedExpertOp::verify() {
  Dim t = Dim::tokens(ShapedType::kDynamic), h = Dim::fixed("H"),
      is = Dim::fixed("I_s");
  if (failed(checkShape(*this, "x", getX(), {&t, &h})) ||
      failed(checkSharedWeights(*this, getGateWeights(), getUpWeights(),
                                getDownWeights(), h, is)))
    return failure();
  return verifySwigluLimit(*this, getSwigluLimitAttr());
}

LogicalResult CombineOp::verify() {
  PlanType plan = getPlan().getType();
  Dim t = Dim::tokens(plan.getTokens()), k = Dim::fixed("top_k", plan.getTopK()),
      h = Dim::fixed("H"), r = Dim::routedRows();
  if (failed(checkShape(*this, "routed_y", getRoutedY(), {&r, &h})) ||
      failed(checkShape(*this, "router_weights", getRouterWeights(), {&t, &k})) ||
      (getSharedOut() &&
       failed(checkShape(*this, "shared", getSharedOut(), {&t, &h}))) ||
      failed(checkShape(*this, "out", getOut(), {&t, &h})))
    return failure();
  return success();
}

namespace {
/// The dimensions of a whole layer, shared by moe.layer and moe.layer_grad.
struct LayerDims {
  Dim t, k, e, h = Dim::fixed("H"), i = Dim::fixed("I"), is = Dim::fixed("I_s");
  explicit LayerDims(PlanType plan)
      : t(Dim::tokens(plan.getTokens())), k(Dim::fixed("top_k", plan.getTopK())),
        e(Dim::fixed("E/ep", plan.getLocalExperts())) {}
};
} // namespace

/// The operands moe.layer and moe.layer_grad share: tokens, routing, routed
/// and shared weights.
static LogicalResult verifyLayerInputs(Operation *op, LayerDims &d, Value x,
                                       Value topExperts, Value routerWeights,
                                       Value gate, Value up, Value down,
                                       ValueRange shared) {
  if (failed(checkShape(op, "x", x, {&d.t, &d.h})) ||
      failed(checkShape(op, "top_experts", topExperts, {&d.t, &d.k})) ||
      failed(checkShape(op, "router_weights", routerWeights, {&d.t, &d.k})) ||
      failed(checkShape(op, "gate_weights", gate, {&d.e, &d.i, &d.h})) ||
      failed(checkShape(op, "up_weights", up, {&d.e, &d.i, &d.h})) ||
      failed(checkShape(op, "down_weights", down, {&d.e, &d.h, &d.i})))
    return failure();
  if (!shared.empty() && shared.size() != 3)
    return op->emitOpError() << "expects shared(...) to list the shared "
                                "expert's gate, up and down weights (3 "
                                "operands), got "
                             << shared.size();
  if (shared.size() == 3 &&
      failed(checkSharedWeights(op, shared[0], shared[1], shared[2], d.h, d.is)))
    return failure();
  return success();
}

/// The backward context: routed_x, gate, up, hidden and, with a shared
/// expert, shared_gate, shared_up, shared_hidden (see moe.layer).
static LogicalResult verifyContext(Operation *op, LayerDims &d,
                                   ValueRange saved, bool hasShared) {
  if (saved.empty())
    return success();
  size_t expected = hasShared ? 7 : 4;
  if (saved.size() != expected)
    return op->emitOpError()
           << "expects the backward context to have " << expected
           << " tensors (routed_x, gate, up, hidden"
           << (hasShared ? ", shared_gate, shared_up, shared_hidden" : "")
           << "), got " << saved.size();
  Dim r = Dim::routedRows();
  if (failed(checkShape(op, "saved routed_x", saved[0], {&r, &d.h})) ||
      failed(checkShape(op, "saved gate", saved[1], {&r, &d.i})) ||
      failed(checkShape(op, "saved up", saved[2], {&r, &d.i})) ||
      failed(checkShape(op, "saved hidden", saved[3], {&r, &d.i})))
    return failure();
  if (hasShared &&
      (failed(checkShape(op, "saved shared_gate", saved[4], {&d.t, &d.is})) ||
       failed(checkShape(op, "saved shared_up", saved[5], {&d.t, &d.is})) ||
       failed(checkShape(op, "saved shared_hidden", saved[6], {&d.t, &d.is}))))
    return failure();
  return success();
}

/// `precision` (absent: bf16) of moe.layer / moe.layer_grad: "mxfp8" or
/// "fp8", H and I multiples of its block and, for training (a saved
/// context, or the backward), a plan padding that keeps its backward's row
/// blocks inside one expert's segment.
static LogicalResult verifyPrecision(Operation *op,
                                     std::optional<StringRef> precision,
                                     LayerDims &d, PlanType plan, bool training) {
  if (!precision)
    return success();
  if (*precision != "mxfp8" && *precision != "fp8")
    return op->emitOpError("expected precision \"mxfp8\" or \"fp8\" (absent: "
                           "bf16), got \"")
           << *precision << "\"";
  int64_t block = *precision == "mxfp8" ? 32 : 128;
  for (auto [name, size] : {std::pair<StringRef, int64_t>{"H", d.h.value},
                            {"I", d.i.value}})
    if (size % block)
      return op->emitOpError("precision \"")
             << *precision << "\" needs " << name << " (" << size
             << ") to be a multiple of its block size " << block;
  if (training && plan.getPadding() % block)
    return op->emitOpError("the backward of precision \"")
           << *precision << "\" quantizes blocks of " << block
           << " routed rows: the plan's padding must be a multiple of "
           << block << ", got " << plan.getPadding();
  return success();
}

LogicalResult LayerOp::verify() {
  LayerDims d(getPlanType());
  if (failed(verifyLayerInputs(*this, d, getX(), getTopExperts(),
                               getRouterWeights(), getGateWeights(),
                               getUpWeights(), getDownWeights(),
                               getSharedWeights())) ||
      failed(checkShape(*this, "out", getOut(), {&d.t, &d.h})) ||
      failed(verifyContext(*this, d, getSaved(), hasSharedExpert())))
    return failure();
  if (failed(verifyPrecision(*this, getPrecision(), d, getPlanType(),
                             /*training=*/savesContext())))
    return failure();
  return verifySwigluLimit(*this, getSwigluLimitAttr());
}

LogicalResult LayerGradOp::verify() {
  LayerDims d(getPlanType());
  if (failed(verifyLayerInputs(*this, d, getX(), getTopExperts(),
                               getRouterWeights(), getGateWeights(),
                               getUpWeights(), getDownWeights(),
                               getSharedWeights())) ||
      failed(checkShape(*this, "d_out", getDOut(), {&d.t, &d.h})) ||
      failed(verifyContext(*this, d, getSaved(), hasSharedExpert())) ||
      failed(verifyPrecision(*this, getPrecision(), d, getPlanType(),
                             /*training=*/true)))
    return failure();
  if (getPrecision() && recomputes())
    return emitOpError("an FP8 backward (precision = \"")
           << *getPrecision()
           << "\") reads the saved context: recomputing it is not supported";
  // Each gradient has the shape and type of what it differentiates.
  auto sameType = [&](StringRef name, Value grad, Value of) -> LogicalResult {
    if (grad.getType() == of.getType())
      return success();
    return emitOpError() << "expects " << name << " to have the type of its "
                         << "operand, " << of.getType() << ", got "
                         << grad.getType();
  };
  if (failed(sameType("d_x", getDX(), getX())) ||
      failed(sameType("d_router_weights", getDRouterWeights(),
                      getRouterWeights())))
    return failure();
  if (getDSharedWeights().size() != getSharedWeights().size())
    return emitOpError() << "expects one gradient per shared weight ("
                         << getSharedWeights().size() << "), got "
                         << getDSharedWeights().size();
  SmallVector<Value> weights = getWeights(), grads = getWeightGradients();
  static const StringRef names[] = {"gate_weights",      "up_weights",
                                    "down_weights",      "shared_gate_weights",
                                    "shared_up_weights", "shared_down_weights"};
  ValueRange mainGrads = getMainGrads();
  if (!mainGrads.empty() && mainGrads.size() != weights.size())
    return emitOpError() << "expects one main_grad per weight ("
                         << weights.size() << "), got " << mainGrads.size();
  for (auto [i, pair] : llvm::enumerate(llvm::zip(grads, weights))) {
    auto [grad, of] = pair;
    std::string name = ("d_" + names[i]).str();
    if (mainGrads.empty()) {
      if (failed(sameType(name, grad, of)))
        return failure();
      continue;
    }
    // main_grads: fp32 in the weight's shape, and the gradient its type.
    auto w = cast<RankedTensorType>(of.getType());
    auto f32 =
        RankedTensorType::get(w.getShape(), Float32Type::get(getContext()));
    if (mainGrads[i].getType() != f32)
      return emitOpError() << "expects main_grad #" << i << " (of " << names[i]
                           << ") to be " << f32 << ", got "
                           << mainGrads[i].getType();
    if (grad.getType() != f32)
      return emitOpError() << "expects " << name << " to be " << f32
                           << " (main_grad + dW), got " << grad.getType();
  }
  return verifySwigluLimit(*this, getSwigluLimitAttr());
}

//===----------------------------------------------------------------------===//
// Canonicalization
//===----------------------------------------------------------------------===//

namespace {
/// A clamp at +inf is no clamp: `swiglu_limit = 0x7F800000 : f32` is dropped,
/// so later passes see one spelling of "unclamped".
template <typename OpTy>
struct DropInfiniteSwigluLimit : OpRewritePattern<OpTy> {
  using OpRewritePattern<OpTy>::OpRewritePattern;
  LogicalResult matchAndRewrite(OpTy op,
                                PatternRewriter &rewriter) const override {
    FloatAttr limit = op.getSwigluLimitAttr();
    if (!limit || !limit.getValue().isInfinity() ||
        limit.getValue().isNegative())
      return failure();
    rewriter.modifyOpInPlace(op, [&] { op.removeSwigluLimitAttr(); });
    return success();
  }
};
} // namespace

void ExpertSwigluOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                                 MLIRContext *context) {
  results.add<DropInfiniteSwigluLimit<ExpertSwigluOp>>(context);
}

void SharedExpertOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                                 MLIRContext *context) {
  results.add<DropInfiniteSwigluLimit<SharedExpertOp>>(context);
}

void LayerOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                          MLIRContext *context) {
  results.add<DropInfiniteSwigluLimit<LayerOp>>(context);
}

void LayerGradOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                              MLIRContext *context) {
  results.add<DropInfiniteSwigluLimit<LayerGradOp>>(context);
}

#define GET_OP_CLASSES
#include "mok/Dialect/MoE/IR/MoEOps.cpp.inc"

//===----------------------------------------------------------------------===//
// moe.quantize / moe.dequantize
//===----------------------------------------------------------------------===//

/// Checks `block` against `data` (the quantized or the quantizable tensor)
/// and `scales`: two positive sizes that divide the last two dimensions
/// (static ones; a dynamic one must have a block size of 1), and scales of
/// data's shape divided by the block.
static LogicalResult verifyBlockScales(Operation *op, ArrayRef<int64_t> block,
                                       ShapedType data, ShapedType scales,
                                       StringRef dataName) {
  if (block.size() != 2)
    return op->emitOpError("expected 'block' to have 2 sizes (rows, cols of a "
                           "block over the last two dimensions), got ")
           << block.size();
  for (int64_t b : block)
    if (b < 1)
      return op->emitOpError("expected positive block sizes, got [")
             << block[0] << ", " << block[1] << "]";
  int64_t rank = data.getRank();
  if (rank < 2)
    return op->emitOpError("expected ") << dataName
           << " of rank >= 2 (blocks span its last two dimensions), got rank "
           << rank;
  if (scales.getRank() != rank)
    return op->emitOpError("expected scales of rank ")
           << rank << " (" << dataName << "'s), got rank " << scales.getRank();
  for (int64_t d = 0; d < rank; ++d) {
    int64_t size = data.getDimSize(d);
    int64_t b = d >= rank - 2 ? block[d - (rank - 2)] : 1;
    if (ShapedType::isDynamic(size)) {
      if (b != 1)
        return op->emitOpError("dimension ")
               << d << " of " << dataName << " is dynamic; a block of " << b
               << " along it needs a static size";
      if (!scales.isDynamicDim(d))
        return op->emitOpError("expected scales' dimension ")
               << d << " to be dynamic, as " << dataName << "'s is";
      continue;
    }
    if (size % b)
      return op->emitOpError("dimension ")
             << d << " of " << dataName << " (" << size
             << ") is not a multiple of the block's " << b;
    if (!scales.isDynamicDim(d) && scales.getDimSize(d) != size / b)
      return op->emitOpError("expected scales' dimension ")
             << d << " to be " << size / b << " (" << size << " / " << b
             << "), got " << scales.getDimSize(d);
  }
  return success();
}

LogicalResult QuantizeOp::verify() {
  auto input = cast<ShapedType>(getInput().getType());
  auto values = cast<ShapedType>(getValues().getType());
  if (getTranspose()) {
    if (input.getRank() < 2)
      return emitOpError("expected an input of rank >= 2 to transpose, got "
                         "rank ")
             << input.getRank();
    // The data quantized: the input with its last two dimensions swapped.
    SmallVector<int64_t> shape(input.getShape());
    std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
    if (failed(verifyCompatibleShape(shape, values.getShape())))
      return emitOpError("expected values of the transposed input's shape, ")
             << "as of " << input.clone(shape) << ", got "
             << getValues().getType();
    return verifyBlockScales(*this, getBlock(), input.clone(shape),
                             cast<ShapedType>(getScales().getType()),
                             "the transposed input");
  }
  if (failed(verifyCompatibleShape(input.getShape(), values.getShape())))
    return emitOpError("expected values of the input's shape, got ")
           << getValues().getType();
  return verifyBlockScales(*this, getBlock(), input,
                           cast<ShapedType>(getScales().getType()), "input");
}

LogicalResult DequantizeOp::verify() {
  auto values = cast<ShapedType>(getValues().getType());
  auto output = cast<ShapedType>(getOutput().getType());
  if (failed(verifyCompatibleShape(values.getShape(), output.getShape())))
    return emitOpError("expected an output of the values' shape, got ")
           << getOutput().getType();
  return verifyBlockScales(*this, getBlock(), values,
                           cast<ShapedType>(getScales().getType()), "values");
}
