// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The one place that says which passes and pipelines mok's tools register.
//
#ifndef MOK_INITALLPASSES_H
#define MOK_INITALLPASSES_H

#include "mlir/Transforms/Passes.h"

#include "mok/Conversion/Passes.h"
#include "mok/Dialect/MoE/Transforms/Passes.h"

namespace mok {

inline void registerAllPasses() {
  moe::registerMoEPasses();
  registerMokConversionPasses();
  registerMoEToCPUPipeline();
  registerMoEToPTXPipeline();
  // The generic cleanups a user reaches for between mok passes.
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
}

} // namespace mok

#endif // MOK_INITALLPASSES_H
