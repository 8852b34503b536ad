// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok::CompileOptions: its checks, made before anything is compiled.
//
#include "mok/Conversion/MoEToPTX/CompileOptions.h"

#include <cstdlib>

namespace mok {

const char *toString(Dispatch dispatch) {
  switch (dispatch) {
  case Dispatch::Auto:
    return "auto";
  case Dispatch::Fused:
    return "fused";
  case Dispatch::Copy:
    return "copy";
  }
  return "auto";
}

std::optional<Dispatch> parseDispatch(const std::string &name) {
  for (Dispatch d : {Dispatch::Auto, Dispatch::Fused, Dispatch::Copy})
    if (name == toString(d))
      return d;
  return std::nullopt;
}

std::string CompileOptions::validate() const {
  // The order and the words are convert-moe-to-mk's, which refuses the same
  // options (its textual options can still reach it from mok-opt).
  if (chip != "sm_90a" && chip != "sm_100a")
    return "chip '" + chip + "' is not supported; expected sm_90a or sm_100a";
  bool fused = dispatch == Dispatch::Fused;
  if (fused && chip != "sm_90a")
    return "fuse-dispatch is implemented for sm_90a only";
  if (multicast && (chip != "sm_90a" || warpSpecialize))
    return "multicast is implemented for sm_90a without warp-specialize only";
  if (warpSpecialize && chip != "sm_90a")
    return "warp-specialize is implemented for sm_90a (wgmma) only, not " + chip;
  // The options that change the tensor-core GEMMs: refused, not ignored,
  // where no layer runs them.
  const char *gemmOption = warpSpecialize ? "warp-specialize"
                           : fused        ? "fuse-dispatch"
                           : multicast    ? "multicast"
                                          : nullptr;
  if (gemmOption && !tensorCores)
    return std::string(gemmOption) +
           " needs tensor-core GEMMs, and tensor-cores is off";
  // The training kernels have their own tensor-core plan, without
  // clusters or the fused dispatch of x (docs/Backward.md); warp roles are
  // the forward kernels' (the training forward's GEMMs take a producer).
  if ((fused || multicast) && training)
    return std::string(fused ? "fuse-dispatch" : "multicast") +
           " is not implemented for the training kernels (the training "
           "forward and the backward) yet";
  if (warpSpecialize && recompute)
    return "warp-specialize is not implemented with recompute (the "
           "backward's recomputed SwiGLU, without warp roles, would not "
           "match the forward's bit for bit); save the forward's context "
           "instead";
  if (recompute && !training)
    return "recompute needs training";
  if (mainGrads && !training)
    return "main-grads needs training";
  return "";
}

std::string CompileOptions::resolvedToolkit() const {
  if (!toolkit.empty())
    return toolkit;
  const char *home = std::getenv("CUDA_HOME");
  return home && *home ? home : "/usr/local/cuda";
}

} // namespace mok
