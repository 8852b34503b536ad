// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_MOETOMK_MOETOMK_H
#define MOK_CONVERSION_MOETOMK_MOETOMK_H

#include "mlir/Pass/Pass.h"

namespace mok {

#define GEN_PASS_DECL_CONVERTMOETOMK
#include "mok/Conversion/Passes.h.inc"

} // namespace mok

#endif // MOK_CONVERSION_MOETOMK_MOETOMK_H
