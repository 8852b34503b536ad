// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-cpu: moe functions → scalar loops on memrefs, the
// executable statement of the dialect's semantics.
//
// Each function is rebuilt in destination-passing style: tensor arguments
// become memrefs, tensor results become trailing output memrefs. Inside, every
// tensor value gets a buffer (an argument or a memref.alloc freed before the
// return) and every routing plan a set of index buffers; each moe op is then
// emitted as loops over those buffers, by the pieces of LayerEmitters.h.
//
#include "mok/Conversion/MoEToCPU/MoEToCPU.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "ExpertParallel.h"
#include "LayerEmitters.h"
#include "Quantize.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMOETOCPU
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok::moe;
using namespace mok::conversion;
using namespace mok::cpu;

namespace {

/// The host plan of a moe plan type: its local experts.
Plan emitPlanOf(Emitter &e, PlanType type, Value topExperts, Temps &temps) {
  return emitPlan(e, type.getTopK(), type.getLocalExperts(), type.getPadding(),
                  topExperts, temps);
}

//===----------------------------------------------------------------------===//
// Function rewriting
//===----------------------------------------------------------------------===//

/// Lowers one moe function in place.
class FunctionLowering {
public:
  explicit FunctionLowering(func::FuncOp func) : func(func) {}

  LogicalResult run();

private:
  func::FuncOp func;
  DenseMap<Value, Value> buffers; // tensor value → memref
  DenseMap<Value, Plan> plans;    // plan value → its buffers
  SmallVector<Value> temps;       // allocations to free before returning

  static MemRefType bufferType(Type tensor) {
    auto t = cast<RankedTensorType>(tensor);
    return MemRefType::get(t.getShape(), t.getElementType());
  }

  /// A fresh buffer for a tensor of `type` whose dynamic dimensions are the
  /// given sizes, in order.
  Value allocFor(Emitter &e, Type type, ValueRange dynSizes) {
    Value m = e.alloc(bufferType(type), dynSizes);
    temps.push_back(m);
    return m;
  }
  /// A buffer for `value` whose dynamic row dimension is R or T.
  Value allocRows(Emitter &e, Value value, Value rows) {
    auto type = cast<RankedTensorType>(value.getType());
    SmallVector<Value> dyn;
    if (type.isDynamicDim(0))
      dyn.push_back(rows);
    return buffers[value] = allocFor(e, type, dyn);
  }

  LogicalResult lowerOp(Emitter &e, Operation *op);
  void lowerLayer(Emitter &e, LayerOp op);
  void lowerLayerGrad(Emitter &e, LayerGradOp op);
};

LogicalResult FunctionLowering::run() {
  if (!func.getBody().hasOneBlock())
    return func.emitError("convert-moe-to-cpu: expected a function body of "
                          "one block");
  // Check everything before changing anything.
  for (Type t : func.getArgumentTypes())
    if (!isa<RankedTensorType>(t))
      return func.emitError() << "convert-moe-to-cpu: argument of type " << t
                              << " is not supported; only ranked tensors";
  for (Type t : func.getResultTypes())
    if (!isa<RankedTensorType>(t))
      return func.emitError() << "convert-moe-to-cpu: result of type " << t
                              << " is not supported; only ranked tensors";
  Block &body = func.getBody().front();
  for (Operation &op : body) {
    if (isa<func::ReturnOp>(op))
      continue;
    if (!isa<MoEDialect>(op.getDialect()))
      return op.emitError() << "convert-moe-to-cpu: '" << op.getName()
                            << "' is not supported in a MoE function";
    if (auto g = dyn_cast<LayerGradOp>(op); g && g.accumulatesMainGrads())
      return op.emitError("convert-moe-to-cpu: main_grads (main_grad + dW) "
                          "is implemented for the GPU targets only");
  }

  // New signature: memrefs for the arguments, then one output per result.
  SmallVector<Type> argTypes;
  for (Type t : func.getArgumentTypes())
    argTypes.push_back(bufferType(t));
  for (Type t : func.getResultTypes())
    argTypes.push_back(bufferType(t));
  unsigned numArgs = func.getNumArguments();
  auto oldReturn = cast<func::ReturnOp>(body.getTerminator());

  // The new body is built in a second block of the region (builders need a
  // parent), then replaces the old one.
  Block *entry = new Block();
  func.getBody().push_back(entry);
  for (Type t : argTypes)
    entry->addArgument(t, func.getLoc());
  for (unsigned i = 0; i < numArgs; ++i)
    buffers[body.getArgument(i)] = entry->getArgument(i);

  OpBuilder b = OpBuilder::atBlockEnd(entry);
  for (Operation &op : body.without_terminator()) {
    Emitter e(b, op.getLoc());
    if (failed(lowerOp(e, &op))) {
      entry->dropAllDefinedValueUses();
      entry->erase();
      return failure();
    }
  }

  // Results: copy each into its output buffer (the routed rows that fit),
  // then free the temporaries.
  Emitter e(b, oldReturn.getLoc());
  for (auto [i, value] : llvm::enumerate(oldReturn.getOperands())) {
    Value src = buffers.lookup(value);
    Value dst = entry->getArgument(numArgs + i);
    emitCopyPrefix(e, src, dst);
  }
  for (Value m : temps)
    memref::DeallocOp::create(b, e.loc, m);
  func::ReturnOp::create(b, oldReturn.getLoc());

  // Swap in the new body.
  body.dropAllDefinedValueUses();
  body.erase();
  func.setFunctionType(FunctionType::get(func.getContext(), argTypes, {}));
  func.setAllResultAttrs(ArrayRef<DictionaryAttr>{});
  SmallVector<DictionaryAttr> argAttrs;
  for (unsigned i = 0; i < argTypes.size(); ++i)
    argAttrs.push_back(i < numArgs ? func.getArgAttrDict(i)
                                   : DictionaryAttr::get(func.getContext()));
  func.setAllArgAttrs(argAttrs);
  func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                UnitAttr::get(func.getContext()));
  return success();
}

LogicalResult FunctionLowering::lowerOp(Emitter &e, Operation *op) {
  return TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](PlanOp op) {
        plans[op.getPlan()] =
            emitPlanOf(e, op.getPlan().getType(),
                       buffers.lookup(op.getTopExperts()), temps);
        return success();
      })
      .Case([&](DispatchOp op) {
        const Plan &p = plans[op.getPlan()];
        emitDispatch(e, p, buffers.lookup(op.getX()),
                     allocRows(e, op.getRoutedX(), p.rows));
        return success();
      })
      .Case([&](ExpertSwigluOp op) {
        const Plan &p = plans[op.getPlan()];
        emitExpertSwiglu(e, p, buffers.lookup(op.getRoutedX()),
                         buffers.lookup(op.getGateWeights()),
                         buffers.lookup(op.getUpWeights()),
                         getLimit(op.getSwigluLimitAttr()), nullptr, nullptr,
                         allocRows(e, op.getHidden(), p.rows));
        return success();
      })
      .Case([&](ExpertDownOp op) {
        const Plan &p = plans[op.getPlan()];
        emitExpertDown(e, p, buffers.lookup(op.getHidden()),
                       buffers.lookup(op.getDownWeights()),
                       allocRows(e, op.getRoutedY(), p.rows));
        return success();
      })
      .Case([&](SharedExpertOp op) {
        Value x = buffers.lookup(op.getX());
        Value tokens = e.dim(x, 0);
        auto wg = cast<RankedTensorType>(op.getGateWeights().getType());
        auto hiddenType = RankedTensorType::get(
            {ShapedType::kDynamic, wg.getDimSize(0)}, wg.getElementType());
        Value hidden = allocFor(e, hiddenType, {tokens});
        emitSharedExpert(e, x, buffers.lookup(op.getGateWeights()),
                         buffers.lookup(op.getUpWeights()),
                         buffers.lookup(op.getDownWeights()),
                         getLimit(op.getSwigluLimitAttr()), nullptr, nullptr,
                         hidden, allocRows(e, op.getOut(), tokens));
        return success();
      })
      .Case([&](CombineOp op) {
        const Plan &p = plans[op.getPlan()];
        Value shared = op.getSharedOut() ? buffers.lookup(op.getSharedOut())
                                         : Value();
        emitCombine(e, p, buffers.lookup(op.getRoutedY()),
                    buffers.lookup(op.getRouterWeights()), shared,
                    allocRows(e, op.getOut(), p.tokens));
        return success();
      })
      .Case([&](LayerOp op) {
        lowerLayer(e, op);
        return success();
      })
      .Case([&](QuantizeOp op) {
        ArrayRef<int64_t> block = op.getBlock();
        Value input = buffers.lookup(op.getInput());
        bool transpose = op.getTranspose();
        // (Transposed: the data's last two dimensions are the input's
        // swapped.)
        auto dataDim = [&](int64_t d, int64_t rank) {
          if (transpose && d >= rank - 2)
            d = 2 * rank - 3 - d;
          return e.dim(input, d);
        };
        auto dynamic = [&](Value result, int64_t rows, int64_t cols) {
          auto type = cast<RankedTensorType>(result.getType());
          int64_t rank = type.getRank();
          SmallVector<Value> dyn;
          for (int64_t d = 0; d < rank; ++d)
            if (type.isDynamicDim(d))
              dyn.push_back(d == rank - 2
                                ? e.div(dataDim(d, rank), e.index(rows))
                            : d == rank - 1
                                ? e.div(dataDim(d, rank), e.index(cols))
                                : dataDim(d, rank));
          return buffers[result] = allocFor(e, type, dyn);
        };
        Value values = dynamic(op.getValues(), 1, 1);
        Value scales = dynamic(op.getScales(), block[0], block[1]);
        emitQuantize(e, input, values, scales, block[0], block[1], transpose);
        return success();
      })
      .Case([&](DequantizeOp op) {
        ArrayRef<int64_t> block = op.getBlock();
        Value values = buffers.lookup(op.getValues());
        auto type = cast<RankedTensorType>(op.getOutput().getType());
        SmallVector<Value> dyn;
        for (int64_t d = 0; d < type.getRank(); ++d)
          if (type.isDynamicDim(d))
            dyn.push_back(e.dim(values, d));
        Value out = buffers[op.getOutput()] = allocFor(e, type, dyn);
        emitDequantize(e, values, buffers.lookup(op.getScales()), out,
                       block[0], block[1]);
        return success();
      })
      .Case([&](LayerGradOp op) {
        lowerLayerGrad(e, op);
        return success();
      })
      .Default([&](Operation *op) {
        return op->emitError() << "convert-moe-to-cpu: '" << op->getName()
                               << "' is not supported";
      });
}

void FunctionLowering::lowerLayer(Emitter &e, LayerOp op) {
  Plan p = emitPlanOf(e, op.getPlanType(), buffers.lookup(op.getTopExperts()),
                      temps);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  auto x = cast<RankedTensorType>(op.getX().getType());
  auto wg = cast<RankedTensorType>(op.getGateWeights().getType());
  Type bf16 = x.getElementType();
  int64_t dyn = ShapedType::kDynamic;
  auto routedH = RankedTensorType::get({dyn, x.getDimSize(1)}, bf16);
  auto routedI = RankedTensorType::get({dyn, wg.getDimSize(1)}, bf16);

  // The context tensors are the layer's own intermediates.
  auto saved = [&](unsigned i, Type type, Value rows) {
    Value m = allocFor(e, type, {rows});
    if (op.savesContext())
      buffers[op.getSaved()[i]] = m;
    return m;
  };
  Value routedX = saved(0, routedH, p.rows);
  Value gate = op.savesContext() ? saved(1, routedI, p.rows) : Value();
  Value up = op.savesContext() ? saved(2, routedI, p.rows) : Value();
  Value hidden = saved(3, routedI, p.rows);
  emitDispatch(e, p, buffers.lookup(op.getX()), routedX);

  // FP8 (precision): each routed GEMM reads its operands' quantized values
  // (moe.quantize, then moe.dequantize into f32 buffers), accumulating in
  // fp32 as the bf16 GEMMs do.
  Fp8Blocks q = Fp8Blocks::of(op.getPrecision());
  auto fp8 = [&](Value src, int64_t rows, int64_t cols) -> Value {
    return q.on ? emitFakeQuantize(e, src, rows, cols, q.mx, temps) : src;
  };
  emitExpertSwiglu(e, p, fp8(routedX, 1, q.act),
                   fp8(buffers.lookup(op.getGateWeights()), q.weightRows, q.weightCols),
                   fp8(buffers.lookup(op.getUpWeights()), q.weightRows, q.weightCols),
                   limit, gate, up, hidden);
  Value routedY = allocFor(e, routedH, {p.rows});
  emitExpertDown(e, p, fp8(hidden, 1, q.act),
                 fp8(buffers.lookup(op.getDownWeights()), q.weightRows, q.weightCols),
                 routedY);

  Value sharedOut;
  if (op.hasSharedExpert()) {
    auto sg = cast<RankedTensorType>(op.getSharedGate().getType());
    auto sharedI = RankedTensorType::get({dyn, sg.getDimSize(0)}, bf16);
    Value sGate = op.savesContext() ? saved(4, sharedI, p.tokens) : Value();
    Value sUp = op.savesContext() ? saved(5, sharedI, p.tokens) : Value();
    Value sHidden = saved(6, sharedI, p.tokens);
    sharedOut = allocFor(e, RankedTensorType::get({dyn, x.getDimSize(1)}, bf16),
                         {p.tokens});
    emitSharedExpert(e, buffers.lookup(op.getX()),
                     buffers.lookup(op.getSharedGate()),
                     buffers.lookup(op.getSharedUp()),
                     buffers.lookup(op.getSharedDown()), limit, sGate, sUp,
                     sHidden, sharedOut);
  }
  emitCombine(e, p, routedY, buffers.lookup(op.getRouterWeights()), sharedOut,
              allocRows(e, op.getOut(), p.tokens));
}

void FunctionLowering::lowerLayerGrad(Emitter &e, LayerGradOp op) {
  Plan p = emitPlanOf(e, op.getPlanType(), buffers.lookup(op.getTopExperts()),
                      temps);
  Limit limit = getLimit(op.getSwigluLimitAttr());
  auto xType = cast<RankedTensorType>(op.getX().getType());
  Type bf16 = xType.getElementType();
  int64_t dyn = ShapedType::kDynamic;
  auto routedH = RankedTensorType::get({dyn, xType.getDimSize(1)}, bf16);
  Value x = buffers.lookup(op.getX()), dOut = buffers.lookup(op.getDOut());

  RoutedContext saved;
  if (!op.recomputes())
    saved = {buffers.lookup(op.getSaved()[0]), buffers.lookup(op.getSaved()[1]),
             buffers.lookup(op.getSaved()[2]), buffers.lookup(op.getSaved()[3])};
  Value dRouterWeights = allocRows(e, op.getDRouterWeights(), p.tokens);
  e.fill(dRouterWeights, e.f32(0.0f));
  Value dRoutedX = allocFor(e, routedH, {p.rows});
  Value dWg = allocRows(e, op.getDGateWeights(), Value());
  Value dWu = allocRows(e, op.getDUpWeights(), Value());
  Value dWd = allocRows(e, op.getDDownWeights(), Value());
  emitRoutedGrad(e, p, limit, x, dOut, buffers.lookup(op.getRouterWeights()),
                 buffers.lookup(op.getGateWeights()),
                 buffers.lookup(op.getUpWeights()),
                 buffers.lookup(op.getDownWeights()), saved, dRouterWeights,
                 RouteWeightGrads::ByRoute, dRoutedX, dWg, dWu, dWd, temps,
                 Fp8Blocks::of(op.getPrecision()));

  // The shared expert: the same with weight 1 on every token.
  Value dSharedX;
  if (op.hasSharedExpert()) {
    SharedContext sharedSaved;
    if (!op.recomputes())
      sharedSaved = {buffers.lookup(op.getSaved()[4]),
                     buffers.lookup(op.getSaved()[5]),
                     buffers.lookup(op.getSaved()[6])};
    ValueRange dShared = op.getDSharedWeights();
    Value dSg = allocRows(e, dShared[0], Value());
    Value dSu = allocRows(e, dShared[1], Value());
    Value dSd = allocRows(e, dShared[2], Value());
    dSharedX = emitSharedGrad(e, limit, x, dOut,
                              buffers.lookup(op.getSharedWeights()[0]),
                              buffers.lookup(op.getSharedWeights()[1]),
                              buffers.lookup(op.getSharedWeights()[2]),
                              sharedSaved, dSg, dSu, dSd, temps);
  }

  // d_x[t] = bf16(f32(d_x_shared[t]) + sum_k f32(d_routed_x[row(t, k)])).
  emitInputGrad(e, p, dRoutedX, dSharedX, allocRows(e, op.getDX(), p.tokens));
}

struct ConvertMoEToCPUPass
    : public mok::impl::ConvertMoEToCPUBase<ConvertMoEToCPUPass> {
  void runOnOperation() override {
    SmallVector<func::FuncOp> funcs;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (func.isDeclaration())
        continue;
      bool hasMoE = false;
      func.walk([&](Operation *op) {
        hasMoE |= isa<MoEDialect>(op->getDialect());
      });
      if (hasMoE)
        funcs.push_back(func);
    }
    for (func::FuncOp func : funcs) {
      // An expert-parallel layer becomes the stage functions its ranks run
      // between their exchanges; any other function is rewritten in place.
      LogicalResult lowered = isExpertParallel(func)
                                  ? lowerExpertParallel(func)
                                  : FunctionLowering(func).run();
      if (failed(lowered))
        return signalPassFailure();
    }
  }
};

} // namespace
