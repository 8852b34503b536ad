// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "mok/Dialect/MoE/IR/MoEDialect.h"
#include "mok/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace mok::moe;

#include "mok/Dialect/MoE/IR/MoEDialect.cpp.inc"

namespace {
/// Prints plan types once, as `!plan = !moe.plan<...>` at the top of the
/// module: every op on the routing path names the plan type, and the full
/// spelling would dominate the printed IR.
struct MoEOpAsmInterface : public OpAsmDialectInterface {
  using OpAsmDialectInterface::OpAsmDialectInterface;
  AliasResult getAlias(Type type, raw_ostream &os) const override {
    if (isa<PlanType>(type)) {
      os << "plan";
      return AliasResult::OverridableAlias;
    }
    return AliasResult::NoAlias;
  }
};
} // namespace

void MoEDialect::initialize() {
  registerTypes();
  addOperations<
#define GET_OP_LIST
#include "mok/Dialect/MoE/IR/MoEOps.cpp.inc"
      >();
  addInterfaces<MoEOpAsmInterface>();
}
