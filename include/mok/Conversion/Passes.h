// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#ifndef MOK_CONVERSION_PASSES_H
#define MOK_CONVERSION_PASSES_H

#include "mok/Conversion/MKToGPU/MKToGPU.h"
#include "mok/Conversion/MoEToCPU/MoEToCPU.h"
#include "mok/Conversion/MoEToMK/MoEToMK.h"
#include "mok/Conversion/MoEToPTX/MoEToPTX.h"

namespace mok {

#define GEN_PASS_REGISTRATION
#include "mok/Conversion/Passes.h.inc"

} // namespace mok

#endif // MOK_CONVERSION_PASSES_H
