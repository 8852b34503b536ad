// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk's quantizer plan: a function whose body is moe.quantize
// ops of bf16 weights [E, N, K] (128 x 128 blocks, f32 scales) compiles to
// one kernel of mk.quantize_weights, the refresh a trainer runs once per
// optimizer step for layers that take their FP8 weights quantized.
//
#include "KernelPlan.h"

using namespace mlir;
using namespace mok;
using namespace mok::moe;
using namespace mok::moe_to_mk;

namespace {

constexpr unsigned kQuantizerBlock = 512;

/// The kernel's name for result `index` of `op`.
std::string outputName(QuantizeOp op, unsigned index) {
  return std::string(index == 0 ? "values" : "scales") +
         (op.getTranspose() ? "_t" : "");
}

} // namespace

LogicalResult mok::moe_to_mk::checkQuantizer(func::FuncOp func) {
  auto fail = [](Operation *op) {
    return op->emitError() << "convert-moe-to-mk: on the GPU targets ";
  };
  if (func.getNumArguments() != 1)
    return fail(func) << "a function of moe.quantize ops takes one argument, "
                         "the bf16 weight they quantize; @"
                      << func.getSymName() << " takes "
                      << func.getNumArguments();
  bool seen[2] = {false, false}; // without and with transpose
  for (Operation &op : func.getBody().front()) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      for (Value v : ret.getOperands())
        if (!v.getDefiningOp<QuantizeOp>())
          return fail(ret) << "a function of moe.quantize ops returns their "
                              "results only, not its argument or other values";
      continue;
    }
    auto q = dyn_cast<QuantizeOp>(op);
    if (!q)
      return fail(&op) << "moe.quantize compiles in a function of "
                          "moe.quantize ops and a return only; this one has '"
                       << op.getName() << "' too";
    // (Its input is the argument: the function has no other op, and a
    // quantize's results are returned, not read.)
    auto type = cast<RankedTensorType>(q.getInput().getType());
    if (type.getRank() != 3 || !type.hasStaticShape() ||
        !type.getElementType().isBF16())
      return fail(q) << "moe.quantize takes bf16 weights [E, N, K] of static "
                        "sizes, got "
                     << type;
    for (Value result : q.getResults())
      if (!cast<ShapedType>(result.getType()).hasStaticShape())
        return fail(q) << "moe.quantize's results have static sizes, got "
                       << result.getType();
    Type scale = cast<ShapedType>(q.getScales().getType()).getElementType();
    if (q.getBlock() != ArrayRef<int64_t>{128, 128} || !scale.isF32())
      return fail(q) << "moe.quantize takes 128 x 128 blocks with f32 scales "
                        "(\"fp8\" weights), got a block of "
                     << q.getBlock()[0] << " x " << q.getBlock()[1]
                     << " with " << scale
                     << " scales; the CPU target runs the others";
    if (seen[q.getTranspose()])
      return fail(q) << "a function quantizes its weight once "
                     << (q.getTranspose() ? "with" : "without")
                     << " transpose (each layout is one pair of outputs)";
    seen[q.getTranspose()] = true;
    for (Value result : q.getResults())
      if (!result.hasOneUse() ||
          !isa<func::ReturnOp>(*result.getUsers().begin()))
        return fail(q) << "moe.quantize's results are the function's "
                          "results, each returned once";
  }
  return success();
}

LogicalResult mok::moe_to_mk::planQuantizer(ModuleOp module, func::FuncOp func,
                                            const PlanOptions &options) {
  MLIRContext *ctx = module.getContext();
  Builder tb(ctx);
  auto memref = [](Type t) {
    auto r = cast<RankedTensorType>(t);
    return MemRefType::get(r.getShape(), r.getElementType());
  };
  // The weight, then the outputs in the order the function returns them,
  // and the grid barrier every kernel's description has (zeroed before the
  // first launch; the quantizer has no grid barrier to use it).
  SmallVector<Param> params;
  params.push_back(
      {"weight", "input", memref(func.getArgument(0).getType())});
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  for (Value v : ret.getOperands()) {
    auto result = cast<OpResult>(v);
    params.push_back(
        {outputName(cast<QuantizeOp>(result.getOwner()),
                    result.getResultNumber()),
         "output", memref(v.getType())});
  }
  params.push_back({"grid_barrier", "workspace",
                    MemRefType::get({2}, tb.getI32Type())});

  // (No experts: no routed rows to describe.)
  Sizes s{};
  // A warp a block, 16 warps an SM: ptxas fits the lowering in 128
  // registers at 512 threads (at 1024 it spills). (The pass's block-size
  // is the layers'.)
  unsigned block = kQuantizerBlock;
  DictionaryAttr description =
      describeKernel(ctx, params, s, options.support.chip(), block, {}, {},
                     /*cluster=*/1);
  Operation *first = &func.getBody().front().front();
  OpBuilder b(ctx);
  gpu::GPUFuncOp kernel =
      createKernel(b, module, func, first, "_quantize", params, block,
                   description);
  llvm::StringMap<Value> buf;
  for (auto [i, p] : llvm::enumerate(params))
    buf[p.name] = kernel.getArgument(i);
  // The normal layout first, whatever the function's order: convert-mk-to-
  // gpu quantizes a weight's two layouts in one pass when the transposed
  // one follows the normal one.
  SmallVector<QuantizeOp, 2> quantizes(
      func.getBody().front().getOps<QuantizeOp>());
  llvm::stable_sort(quantizes, [](QuantizeOp a, QuantizeOp b) {
    return !a.getTranspose() && b.getTranspose();
  });
  for (QuantizeOp q : quantizes) {
    StringRef t = q.getTranspose() ? "_t" : "";
    mk::QuantizeWeightsOp::create(b, q.getLoc(), buf["weight"],
                                  buf[("values" + t).str()],
                                  buf[("scales" + t).str()], q.getTranspose());
  }
  gpu::ReturnOp::create(b, func.getLoc());
  return success();
}
