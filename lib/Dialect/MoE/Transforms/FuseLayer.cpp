// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// moe-fuse-layer: plan → dispatch → expert_swiglu → expert_down → combine
// (+ shared_expert) becomes one moe.layer.
//
#include "mok/Dialect/MoE/Transforms/Fusion.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"
#include "mok/Dialect/MoE/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mok::moe {
#define GEN_PASS_DEF_MOEFUSELAYER
#include "mok/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mok::moe

using namespace mlir;
using namespace mok::moe;

namespace {
/// The ops of one forward layer, rooted at its combine.
struct LayerChain {
  PlanOp plan;
  DispatchOp dispatch;
  ExpertSwigluOp swiglu;
  ExpertDownOp down;
  CombineOp combine;
  SharedExpertOp shared; // null without a shared expert
};
} // namespace

/// `value`'s only user is `user` (the chain would otherwise be needed both
/// fused and unfused).
static bool onlyUsedBy(Value value, Operation *user) {
  return value.hasOneUse() && *value.user_begin() == user;
}

/// Matches the chain that ends in `combine`. On failure, `why` says what
/// prevents fusion, for the remark.
static FailureOr<LayerChain> matchChain(CombineOp combine, std::string &why) {
  LayerChain chain;
  chain.combine = combine;
  auto fail = [&](const Twine &reason) -> FailureOr<LayerChain> {
    why = reason.str();
    return failure();
  };

  chain.down = combine.getRoutedY().getDefiningOp<ExpertDownOp>();
  if (!chain.down)
    return fail("its routed_y is not produced by moe.expert_down");
  chain.swiglu = chain.down.getHidden().getDefiningOp<ExpertSwigluOp>();
  if (!chain.swiglu)
    return fail("the moe.expert_down input is not produced by "
                "moe.expert_swiglu");
  chain.dispatch = chain.swiglu.getRoutedX().getDefiningOp<DispatchOp>();
  if (!chain.dispatch)
    return fail("the moe.expert_swiglu input is not produced by moe.dispatch");

  Value plan = combine.getPlan();
  if (chain.down.getPlan() != plan || chain.swiglu.getPlan() != plan ||
      chain.dispatch.getPlan() != plan)
    return fail("the chain uses more than one routing plan");
  chain.plan = plan.getDefiningOp<PlanOp>();
  if (!chain.plan)
    return fail("the routing plan is not produced by moe.plan");

  if (!onlyUsedBy(chain.dispatch.getRoutedX(), chain.swiglu))
    return fail("the moe.dispatch result has another use");
  if (!onlyUsedBy(chain.swiglu.getHidden(), chain.down))
    return fail("the moe.expert_swiglu result has another use");
  if (!onlyUsedBy(chain.down.getRoutedY(), combine))
    return fail("the moe.expert_down result has another use");

  if (Value sharedOut = combine.getSharedOut()) {
    chain.shared = sharedOut.getDefiningOp<SharedExpertOp>();
    if (!chain.shared)
      return fail("its shared operand is not produced by moe.shared_expert");
    if (!onlyUsedBy(sharedOut, combine))
      return fail("the moe.shared_expert result has another use");
    if (chain.shared.getX() != chain.dispatch.getX())
      return fail("the shared expert and the routed experts read different "
                  "tokens");
    if (chain.shared.getSwigluLimitAttr() != chain.swiglu.getSwigluLimitAttr())
      return fail("the shared and routed experts have different swiglu_limit");
  }

  // Fusing ops of other blocks would move work into (or out of) loops and
  // branches; only fuse straight-line chains.
  Block *block = combine->getBlock();
  for (Operation *op : {chain.plan.getOperation(), chain.dispatch.getOperation(),
                        chain.swiglu.getOperation(), chain.down.getOperation()})
    if (op->getBlock() != block)
      return fail("the chain spans more than one block");
  if (chain.shared && chain.shared->getBlock() != block)
    return fail("the chain spans more than one block");
  return chain;
}

static LayerOp fuse(LayerChain &chain) {
  CombineOp combine = chain.combine;
  SmallVector<Location> locs = {
      combine.getLoc(), chain.down.getLoc(), chain.swiglu.getLoc(),
      chain.dispatch.getLoc(), chain.plan.getLoc()};
  SmallVector<Value, 3> sharedWeights;
  if (chain.shared) {
    locs.push_back(chain.shared.getLoc());
    sharedWeights = {chain.shared.getGateWeights(), chain.shared.getUpWeights(),
                     chain.shared.getDownWeights()};
  }
  MLIRContext *ctx = combine.getContext();
  OpBuilder builder(combine);
  auto layer = LayerOp::create(
      builder, FusedLoc::get(ctx, locs), combine.getOut().getType(),
      /*saved=*/TypeRange(), chain.dispatch.getX(), chain.plan.getTopExperts(),
      combine.getRouterWeights(), chain.swiglu.getGateWeights(),
      chain.swiglu.getUpWeights(), chain.down.getDownWeights(), sharedWeights,
      TypeAttr::get(chain.plan.getPlan().getType()),
      chain.swiglu.getSwigluLimitAttr(), /*precision=*/StringAttr());
  combine.getOut().replaceAllUsesWith(layer.getOut());

  // Users before producers; each is now dead (checked by matchChain), except
  // the plan, which may still serve other ops.
  combine.erase();
  if (chain.shared)
    chain.shared.erase();
  chain.down.erase();
  chain.swiglu.erase();
  chain.dispatch.erase();
  if (chain.plan->use_empty())
    chain.plan.erase();
  return layer;
}

FailureOr<LayerOp> mok::moe::fuseLayerChain(CombineOp combine,
                                           std::string &why) {
  FailureOr<LayerChain> chain = matchChain(combine, why);
  if (failed(chain))
    return failure();
  return fuse(*chain);
}

namespace {
struct MoEFuseLayerPass
    : public mok::moe::impl::MoEFuseLayerBase<MoEFuseLayerPass> {
  using MoEFuseLayerBase::MoEFuseLayerBase;

  void runOnOperation() override {
    SmallVector<CombineOp> combines;
    getOperation()->walk([&](CombineOp op) { combines.push_back(op); });
    for (CombineOp combine : combines) {
      std::string why;
      if (failed(fuseLayerChain(combine, why))) {
        ++numUnfused;
        if (remarks)
          combine.emitRemark() << "not fused into moe.layer: " << why;
        continue;
      }
      ++numFused;
    }
  }
};
} // namespace
