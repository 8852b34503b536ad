// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// convert-moe-to-mk: plans each fused moe.layer (Forward.cpp) and
// moe.layer_grad (Backward.cpp) as one persistent megakernel, a gpu.func
// whose body is the schedule in the mk dialect, and describes the kernel's
// interface for the runtime (the `mok.kernel` attribute, which mok-compile
// writes out as the metadata JSON).
//
// The plan takes tensor-core GEMMs for the chip when the layer's shapes fit
// the tiles, each tile the largest the chip's lowering implements for it
// (asked of mk::TargetSupport), and simt GEMMs otherwise. It is the place
// where a cost model would choose tiles, stages and task order per shape.
//
#include "mok/Conversion/MoEToMK/MoEToMK.h"
#include "KernelPlan.h"

#include "llvm/ADT/SetVector.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"

namespace mok {
#define GEN_PASS_DEF_CONVERTMOETOMK
#include "mok/Conversion/Passes.h.inc"
} // namespace mok

using namespace mlir;
using namespace mok;
using namespace mok::moe;
using namespace mok::moe_to_mk;

namespace {

struct ConvertMoEToMKPass
    : public mok::impl::ConvertMoEToMKBase<ConvertMoEToMKPass> {
  using ConvertMoEToMKBase::ConvertMoEToMKBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (chip != "sm_90a" && chip != "sm_100a") {
      module.emitError() << "convert-moe-to-mk: chip '" << chip
                         << "' is not supported; expected sm_90a or sm_100a";
      return signalPassFailure();
    }
    if (fuseDispatch && copyDispatch) {
      module.emitError() << "convert-moe-to-mk: fuse-dispatch and "
                            "copy-dispatch exclude each other";
      return signalPassFailure();
    }
    if (fuseDispatch && chip != "sm_90a") {
      module.emitError() << "convert-moe-to-mk: fuse-dispatch is "
                            "implemented for sm_90a only";
      return signalPassFailure();
    }
    if (multicast && (chip != "sm_90a" || warpSpecialize)) {
      module.emitError() << "convert-moe-to-mk: multicast is implemented for "
                            "sm_90a without warp-specialize only";
      return signalPassFailure();
    }
    if (warpSpecialize && chip != "sm_90a") {
      module.emitError() << "convert-moe-to-mk: warp-specialize is "
                            "implemented for sm_90a (wgmma) only, not "
                         << chip;
      return signalPassFailure();
    }
    if (blockSize < 32 || blockSize > 1024 || blockSize % 32) {
      module.emitError() << "convert-moe-to-mk: block-size must be a "
                            "multiple of 32 in [32, 1024], got "
                         << blockSize;
      return signalPassFailure();
    }
    PlanOptions options{*mk::TargetSupport::forChip(chip),
                        blockSize,
                        tensorCores,
                        profile,
                        warpSpecialize,
                        fuseDispatch,
                        copyDispatch,
                        multicast,
                        barrierTimeoutMs,
                        selfExchange,
                        fp8QuantizedWeights};
    SmallVector<std::pair<func::FuncOp, LayerOp>> layers;
    SmallVector<std::pair<func::FuncOp, LayerGradOp>> grads;
    SetVector<func::FuncOp> quantizers;
    WalkResult walk = module.walk([&](Operation *op) {
      if (isa<DequantizeOp>(op)) {
        op->emitError() << "convert-moe-to-mk: '" << op->getName()
                        << "' (FP8) is not supported by the GPU targets yet; "
                           "the CPU target runs it (--moe-to-cpu)";
        return WalkResult::interrupt();
      }
      // A function of moe.quantize ops: a kernel of its own.
      if (isa<QuantizeOp>(op)) {
        auto func = op->getParentOfType<func::FuncOp>();
        if (!quantizers.contains(func) &&
            (failed(checkQuantizer(func)) || !quantizers.insert(func)))
          return WalkResult::interrupt();
        return WalkResult::advance();
      }
      if (isa<MoEDialect>(op->getDialect()) && !isa<LayerOp, LayerGradOp>(op)) {
        op->emitError() << "convert-moe-to-mk: '" << op->getName()
                        << "' must be fused first (run --moe-fuse-layer)";
        return WalkResult::interrupt();
      }
      if (!isa<LayerOp, LayerGradOp>(op))
        return WalkResult::advance();
      std::optional<StringRef> precision =
          isa<LayerOp>(op) ? cast<LayerOp>(op).getPrecision()
                           : cast<LayerGradOp>(op).getPrecision();
      PlanType plan = isa<LayerOp>(op) ? cast<LayerOp>(op).getPlanType()
                                       : cast<LayerGradOp>(op).getPlanType();
      // fp8-quantized-weights is for FP8 layers (a bf16 layer is refused
      // at its moe.layer, which a moe.layer_grad comes with).
      if (fp8QuantizedWeights && !precision && !isa<LayerGradOp>(op)) {
        op->emitError() << "convert-moe-to-mk: fp8-quantized-weights is for "
                           "FP8 layers (precision = \"fp8\" or \"mxfp8\"); "
                           "this layer's precision is \"bf16\"";
        return WalkResult::interrupt();
      }
      bool mx = precision == StringRef("mxfp8");
      bool training =
          isa<LayerGradOp>(op) || cast<LayerOp>(op).savesContext();
      if (precision) {
        StringRef unsupported =
            options.exchanges(plan) ? "expert-parallel FP8 layers are" : "";
        if (!unsupported.empty()) {
          op->emitError() << "convert-moe-to-mk: " << unsupported
                          << " not supported by the GPU targets yet; the CPU "
                             "target runs "
                          << (isa<LayerGradOp>(op) ? "it" : "them")
                          << " (--moe-to-cpu)";
          return WalkResult::interrupt();
        }
        // MXFP8: the scale atoms span 128 columns; tcgen05's block-scaled
        // MMA (sm_100a) takes 128-row tiles, so whole 128-row segments;
        // Hopper has no block-scaled MMA.
        if (mx) {
          int64_t h = cast<ShapedType>(op->getOperand(isa<LayerOp>(op) ? 0 : 1)
                                           .getType())
                          .getDimSize(1);
          int64_t i = cast<ShapedType>(
                          (isa<LayerOp>(op) ? cast<LayerOp>(op).getGateWeights()
                                            : cast<LayerGradOp>(op)
                                                  .getGateWeights())
                              .getType())
                          .getDimSize(1);
          if (h % 128 || i % 128) {
            op->emitError() << "convert-moe-to-mk: MXFP8 layers on the GPU "
                               "targets need the hidden and intermediate "
                               "sizes to be multiples of 128 (the scale "
                               "atoms), got "
                            << h << " and " << i;
            return WalkResult::interrupt();
          }
          if (tensorCores && options.support.chip() == "sm_90a") {
            op->emitError()
                << "convert-moe-to-mk: MXFP8 layers (precision = \"mxfp8\") "
                   "on sm_90a run on scalar GEMMs only: compile them with "
                   "tensor-cores=false (Hopper has no block-scaled MMA; "
                   "\"fp8\" runs on its tensor cores)";
            return WalkResult::interrupt();
          }
          if (tensorCores && plan.getPadding() % 128) {
            op->emitError()
                << "convert-moe-to-mk: MXFP8 layers on tcgen05 need the "
                   "plan's padding to be a multiple of 128 (the block-scaled "
                   "MMA's 128-row tiles), got "
                << plan.getPadding();
            return WalkResult::interrupt();
          }
        }
        // The FP8 tensor-core GEMMs: E4M3 wgmma on sm_90a, without the
        // options that change the GEMMs.
        if (!mx && tensorCores && options.support.chip() == "sm_100a") {
          op->emitError()
              << "convert-moe-to-mk: FP8 layers (precision = \"fp8\") on "
                 "sm_100a run on scalar GEMMs only so far: compile them with "
                 "tensor-cores=false (tcgen05's block-scaled FP8 is not "
                 "implemented yet)";
          return WalkResult::interrupt();
        }
        // (warp-specialize: the "fp8" layer's wgmma GEMMs, forward and
        // backward; with recompute it is refused below.)
        if ((warpSpecialize && mx) || multicast || fuseDispatch) {
          op->emitError() << "convert-moe-to-mk: "
                          << (multicast      ? "multicast"
                              : fuseDispatch ? "fuse-dispatch"
                                             : "warp-specialize")
                          << " is not implemented for FP8 layers "
                             "(precision = \"" << *precision << "\")";
          return WalkResult::interrupt();
        }
      }
      // Expert parallelism: the forward (inference or training) and the
      // backward, with the GEMMs' default schedules
      // (docs/ExpertParallel.md).
      if (options.exchanges(plan)) {
        std::string group = "(ep = " + std::to_string(plan.getEp()) +
                            (plan.getEp() == 1 ? ", self-exchange)" : ")");
        auto grad = dyn_cast<LayerGradOp>(op);
        if (grad && grad.recomputes()) {
          op->emitError() << "convert-moe-to-mk: a backward that recomputes "
                             "the forward is not implemented with expert "
                             "parallelism "
                          << group
                          << " yet; save the forward's context instead";
          return WalkResult::interrupt();
        }
        if (warpSpecialize || fuseDispatch || multicast) {
          op->emitError() << "convert-moe-to-mk: "
                          << (warpSpecialize ? "warp-specialize"
                              : fuseDispatch ? "fuse-dispatch"
                                             : "multicast")
                          << " is not implemented with expert parallelism "
                          << group << " yet";
          return WalkResult::interrupt();
        }
      }
      if (!plan.hasStaticTokens() && !plan.getMaxTokens()) {
        op->emitError("convert-moe-to-mk: a dynamic token count needs a "
                      "capacity, the plan's max_tokens (the GPU kernel's "
                      "buffers are sized for it)");
        return WalkResult::interrupt();
      }
      std::string tooLarge = isa<LayerOp>(op)
                                 ? sizesOf(cast<LayerOp>(op)).whyTooLarge()
                                 : sizesOf(cast<LayerGradOp>(op)).whyTooLarge();
      if (!tooLarge.empty()) {
        op->emitError() << "convert-moe-to-mk: " << tooLarge;
        return WalkResult::interrupt();
      }
      // The backward and the training forward have their own tensor-core
      // plan (docs/Backward.md), without clusters or the fused dispatch of
      // x: those options are refused for them, not ignored. Warp roles
      // (warp-specialize) are the forward kernels': the training forward's
      // GEMMs take a producer, the backward's none yet.
      if (training && (fuseDispatch || multicast)) {
        op->emitError() << "convert-moe-to-mk: "
                        << (fuseDispatch ? "fuse-dispatch" : "multicast")
                        << " is not implemented for "
                        << (isa<LayerGradOp>(op)
                                ? "the backward (moe.layer_grad)"
                                : "the training forward (saved context)")
                        << " yet";
        return WalkResult::interrupt();
      }
      // A backward that recomputes the forward (without warp roles) would
      // not reproduce the h of a forward with them bit for bit: kernels
      // with warp roles compute the sigmoid exactly.
      if (auto grad = dyn_cast<LayerGradOp>(op);
          grad && grad.recomputes() && warpSpecialize) {
        op->emitError("convert-moe-to-mk: warp-specialize is not implemented "
                      "with a backward that recomputes the forward (its "
                      "recomputed SwiGLU, without warp roles, would not "
                      "match the forward's bit for bit); save the forward's "
                      "context instead");
        return WalkResult::interrupt();
      }
      auto func = op->getParentOfType<func::FuncOp>();
      if (auto grad = dyn_cast<LayerGradOp>(op))
        grads.push_back({func, grad});
      else
        layers.push_back({func, cast<LayerOp>(op)});
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();

    MLIRContext *ctx = &getContext();
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(ctx));
    for (auto [func, layer] : layers)
      if (failed(planForward(module, func, layer, options)))
        return signalPassFailure();
    for (auto [func, grad] : grads)
      if (failed(planBackward(module, func, grad, options)))
        return signalPassFailure();
    for (func::FuncOp func : quantizers)
      if (failed(planQuantizer(module, func, options)))
        return signalPassFailure();
  }
};

} // namespace
