// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// moe-generate-backward: @f → @f_forward (output + backward context) and
// @f_backward (gradients), the interface between them explicit in the IR.
//
#include "mok/Dialect/MoE/IR/MoEOps.h"
#include "mok/Dialect/MoE/Transforms/Fusion.h"
#include "mok/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"

namespace mok::moe {
#define GEN_PASS_DEF_MOEGENERATEBACKWARD
#include "mok/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mok::moe

using namespace mlir;
using namespace mok::moe;

/// Names of the backward context tensors, in the order moe.layer returns them.
static constexpr StringLiteral kContextNames[] = {
    "routed_x", "gate", "up", "hidden", "shared_gate", "shared_up",
    "shared_hidden"};

/// The types of the backward context of `layer`.
static SmallVector<Type> contextTypes(LayerOp layer) {
  auto x = cast<RankedTensorType>(layer.getX().getType());
  auto gate = cast<RankedTensorType>(layer.getGateWeights().getType());
  Type bf16 = x.getElementType();
  int64_t dyn = ShapedType::kDynamic, h = x.getDimSize(1),
          i = gate.getDimSize(1), t = x.getDimSize(0);
  auto routedI = RankedTensorType::get({dyn, i}, bf16);
  SmallVector<Type> types = {RankedTensorType::get({dyn, h}, bf16), routedI,
                             routedI, routedI};
  if (layer.hasSharedExpert()) {
    int64_t is = cast<RankedTensorType>(layer.getSharedGate().getType())
                     .getDimSize(0);
    types.append(3, RankedTensorType::get({t, is}, bf16));
  }
  return types;
}

/// The one layer `func` consists of, or an error at what is in the way.
static FailureOr<LayerOp> findLayer(func::FuncOp func) {
  // Fuse unfused chains first; the refusals are the fusion pass's rules.
  SmallVector<CombineOp> combines;
  func.walk([&](CombineOp op) { combines.push_back(op); });
  for (CombineOp combine : combines) {
    std::string why;
    if (failed(fuseLayerChain(combine, why)))
      return combine.emitError()
             << "moe-generate-backward: cannot fuse this layer (" << why
             << "); only fused layers can be differentiated";
  }

  Block &body = func.getBody().front();
  if (!func.getBody().hasOneBlock())
    return func.emitError("moe-generate-backward: expected a function body "
                          "of one block");
  LayerOp layer;
  for (Operation &op : body.without_terminator()) {
    if (auto l = dyn_cast<LayerOp>(op); l && !layer) {
      layer = l;
      continue;
    }
    return op.emitError() << "moe-generate-backward: cannot differentiate '"
                          << op.getName()
                          << "'; only a function body of one MoE layer is "
                             "supported";
  }
  if (!layer)
    return func.emitError("moe-generate-backward: no MoE layer in the body");
  if (layer.savesContext())
    return layer.emitError("moe-generate-backward: the layer already returns "
                           "a backward context");

  auto ret = cast<func::ReturnOp>(body.getTerminator());
  if (ret.getNumOperands() != 1 || ret.getOperand(0) != layer.getOut())
    return ret.emitError("moe-generate-backward: expected the function to "
                         "return exactly the layer's output");
  llvm::SmallDenseSet<Value> seen;
  for (OpOperand &use : layer->getOpOperands()) {
    auto arg = dyn_cast<BlockArgument>(use.get());
    if (!arg)
      return layer.emitError() << "moe-generate-backward: operand #"
                               << use.getOperandNumber()
                               << " is not a function argument";
    if (!seen.insert(arg).second)
      return layer.emitError()
             << "moe-generate-backward: function argument #"
             << arg.getArgNumber()
             << " feeds more than one operand of the layer; not supported";
  }
  for (BlockArgument arg : func.getArguments())
    if (!seen.contains(arg))
      return func.emitError()
             << "moe-generate-backward: function argument #"
             << arg.getArgNumber()
             << " is not an operand of the layer; not supported";
  return layer;
}

/// Adds `@<name>_forward`: @f's body with a layer that also returns the
/// context (none when recomputing).
static void buildForward(OpBuilder &b, func::FuncOp func, LayerOp layer,
                         bool recompute) {
  auto fwd = cast<func::FuncOp>(b.clone(*func));
  fwd.setSymName((func.getSymName() + "_forward").str());
  auto oldLayer = cast<LayerOp>(
      *fwd.getBody().front().getOps<LayerOp>().begin());
  SmallVector<Type> saved;
  if (!recompute)
    saved = contextTypes(layer);
  OpBuilder ib(oldLayer);
  auto newLayer = LayerOp::create(
      ib, oldLayer.getLoc(), oldLayer.getOut().getType(), saved,
      oldLayer.getX(), oldLayer.getTopExperts(), oldLayer.getRouterWeights(),
      oldLayer.getGateWeights(), oldLayer.getUpWeights(),
      oldLayer.getDownWeights(), oldLayer.getSharedWeights(),
      oldLayer.getPlanAttr(), oldLayer.getSwigluLimitAttr(),
      oldLayer.getPrecisionAttr());
  oldLayer.getOut().replaceAllUsesWith(newLayer.getOut());
  oldLayer.erase();

  auto ret = cast<func::ReturnOp>(fwd.getBody().front().getTerminator());
  SmallVector<Value> results = {newLayer.getOut()};
  llvm::append_range(results, newLayer.getSaved());
  ret->setOperands(results);
  SmallVector<Type> resultTypes(ValueRange(results).getTypes());
  fwd.setFunctionType(
      b.getFunctionType(fwd.getArgumentTypes(), resultTypes));
  for (unsigned i = 0, e = newLayer.getSaved().size(); i < e; ++i)
    fwd.setResultAttr(1 + i, "moe.saved", b.getStringAttr(kContextNames[i]));
}

/// Adds `@<name>_backward(args..., context..., d_out)`.
static void buildBackward(OpBuilder &b, func::FuncOp func, LayerOp layer,
                          bool recompute, bool mainGrads) {
  MLIRContext *ctx = b.getContext();
  SmallVector<Type> saved;
  if (!recompute)
    saved = contextTypes(layer);
  SmallVector<Type> argTypes(func.getArgumentTypes());
  llvm::append_range(argTypes, saved);
  argTypes.push_back(layer.getOut().getType());

  // The weights, in moe.layer_grad's order (main_grads follow it).
  SmallVector<Value> weights = layer.getWeights();
  auto f32Like = [&](Value v) -> Type {
    return RankedTensorType::get(cast<RankedTensorType>(v.getType()).getShape(),
                                 b.getF32Type());
  };
  DenseSet<unsigned> weightArgs;
  for (Value w : weights)
    weightArgs.insert(cast<BlockArgument>(w).getArgNumber());
  if (mainGrads)
    for (Value w : weights)
      argTypes.push_back(f32Like(w));

  // One gradient per floating-point argument, in argument order (a
  // weight's fp32 with main_grads: main_grad + dW).
  SmallVector<unsigned> differentiable;
  SmallVector<Type> gradTypes;
  for (auto [i, type] : llvm::enumerate(func.getArgumentTypes()))
    if (isa<FloatType>(cast<ShapedType>(type).getElementType())) {
      differentiable.push_back(i);
      gradTypes.push_back(mainGrads && weightArgs.contains(i)
                              ? f32Like(func.getArgument(i))
                              : type);
    }

  auto bwd = func::FuncOp::create(b, func.getLoc(),
                                  (func.getSymName() + "_backward").str(),
                                  b.getFunctionType(argTypes, gradTypes));
  unsigned numArgs = func.getNumArguments();
  for (unsigned i = 0; i < saved.size(); ++i)
    bwd.setArgAttr(numArgs + i, "moe.saved", b.getStringAttr(kContextNames[i]));
  bwd.setArgAttr(numArgs + saved.size(), "moe.cotangent", UnitAttr::get(ctx));
  if (mainGrads)
    for (auto [i, w] : llvm::enumerate(weights))
      bwd.setArgAttr(
          numArgs + saved.size() + 1 + i, "moe.main_grad_of",
          b.getI64IntegerAttr(cast<BlockArgument>(w).getArgNumber()));
  for (auto [r, argIndex] : llvm::enumerate(differentiable))
    bwd.setResultAttr(r, "moe.gradient_of", b.getI64IntegerAttr(argIndex));

  Block *entry = bwd.addEntryBlock();
  OpBuilder ib = OpBuilder::atBlockEnd(entry);
  // The layer's operands are function arguments: map them by position.
  auto arg = [&](Value v) {
    return entry->getArgument(cast<BlockArgument>(v).getArgNumber());
  };
  SmallVector<Value> shared;
  for (Value w : layer.getSharedWeights())
    shared.push_back(arg(w));
  ValueRange savedArgs = entry->getArguments().slice(numArgs, saved.size());
  Value dOut = entry->getArgument(numArgs + saved.size());
  ValueRange mainGradArgs =
      entry->getArguments().drop_front(numArgs + saved.size() + 1);
  auto gradType = [&](Value w) { return mainGrads ? f32Like(w) : w.getType(); };
  SmallVector<Type> dShared;
  for (Value w : shared)
    dShared.push_back(gradType(w));
  auto grad = LayerGradOp::create(
      ib, layer.getLoc(), layer.getX().getType(),
      layer.getRouterWeights().getType(), gradType(layer.getGateWeights()),
      gradType(layer.getUpWeights()), gradType(layer.getDownWeights()), dShared,
      dOut, arg(layer.getX()), arg(layer.getTopExperts()),
      arg(layer.getRouterWeights()), arg(layer.getGateWeights()),
      arg(layer.getUpWeights()), arg(layer.getDownWeights()), shared, savedArgs,
      mainGradArgs, layer.getPlanAttr(), layer.getSwigluLimitAttr(),
      layer.getPrecisionAttr());

  // Gradient of each layer operand, keyed by the argument it comes from.
  DenseMap<unsigned, Value> gradOfArg;
  auto record = [&](Value operand, Value g) {
    gradOfArg[cast<BlockArgument>(operand).getArgNumber()] = g;
  };
  record(layer.getX(), grad.getDX());
  record(layer.getRouterWeights(), grad.getDRouterWeights());
  record(layer.getGateWeights(), grad.getDGateWeights());
  record(layer.getUpWeights(), grad.getDUpWeights());
  record(layer.getDownWeights(), grad.getDDownWeights());
  for (auto [w, g] : llvm::zip(layer.getSharedWeights(), grad.getDSharedWeights()))
    record(w, g);

  // findLayer checked that every argument is a layer operand, so every
  // differentiable argument has its gradient.
  SmallVector<Value> results;
  for (unsigned argIndex : differentiable)
    results.push_back(gradOfArg.lookup(argIndex));
  func::ReturnOp::create(ib, func.getLoc(), results);
}

namespace {
struct MoEGenerateBackwardPass
    : public mok::moe::impl::MoEGenerateBackwardBase<MoEGenerateBackwardPass> {
  using MoEGenerateBackwardBase::MoEGenerateBackwardBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> funcs;
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isDeclaration())
        continue;
      bool hasMoE = false;
      func.walk([&](Operation *op) {
        if (isa<MoEDialect>(op->getDialect()) && !isa<LayerGradOp>(op))
          hasMoE = true;
      });
      if (hasMoE)
        funcs.push_back(func);
    }

    SymbolTable symbols(module);
    for (func::FuncOp func : funcs) {
      for (StringRef suffix : {"_forward", "_backward"})
        if (symbols.lookup((func.getSymName() + suffix).str())) {
          func.emitError() << "moe-generate-backward: @" << func.getSymName()
                           << suffix << " already exists";
          return signalPassFailure();
        }
      FailureOr<LayerOp> layer = findLayer(func);
      if (failed(layer))
        return signalPassFailure();
      if (recompute && layer->getPrecision()) {
        layer->emitError() << "moe-generate-backward: recompute is not "
                              "supported for an FP8 layer (precision = \""
                           << *layer->getPrecision()
                           << "\"): its backward reads the saved context";
        return signalPassFailure();
      }
      OpBuilder b(module.getContext());
      b.setInsertionPointAfter(func);
      buildBackward(b, func, *layer, recompute, mainGrads);
      b.setInsertionPointAfter(func);
      buildForward(b, func, *layer, recompute);
    }
  }
};
} // namespace
