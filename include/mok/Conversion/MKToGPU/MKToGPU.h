// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_MKTOGPU_MKTOGPU_H
#define MOK_CONVERSION_MKTOGPU_MKTOGPU_H

#include "mlir/Pass/Pass.h"

namespace mok {

#define GEN_PASS_DECL_CONVERTMKTOGPU
#include "mok/Conversion/Passes.h.inc"

} // namespace mok

#endif // MOK_CONVERSION_MKTOGPU_MKTOGPU_H
