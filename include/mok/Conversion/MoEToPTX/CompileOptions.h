// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The options of a GPU compile, in one place: the pipeline builders
// (MoEToPTX.h), mok::Module::compileGPU, mok-compile and the Python
// extension all take this struct. No MLIR needed to include it.
//
#ifndef MOK_CONVERSION_MOETOPTX_COMPILEOPTIONS_H
#define MOK_CONVERSION_MOETOPTX_COMPILEOPTIONS_H

#include <optional>
#include <string>

namespace mok {

/// How the routed gate/up GEMM gets its A rows (convert-moe-to-mk's
/// fuse-dispatch / copy-dispatch options).
enum class Dispatch {
  /// Fused wherever it is implemented (sm_90a tensor-core GEMMs without
  /// warp-specialize), else the copy.
  Auto,
  /// Required fused: the GEMM copies its A rows straight from x (sm_90a;
  /// fuse-dispatch).
  Fused,
  /// The dispatch copy into routed_x (copy-dispatch).
  Copy,
};

/// "auto", "fused" or "copy".
const char *toString(Dispatch dispatch);
/// The Dispatch named `name` ("auto", "fused", "copy"), or none.
std::optional<Dispatch> parseDispatch(const std::string &name);

/// What a GPU compile of a moe module builds. The names in comments are the
/// pass options each field maps onto (convert-moe-to-mk, moe-generate-
/// backward) and mok-compile's flags.
struct CompileOptions {
  /// The GPU target: "sm_90a" (Hopper) or "sm_100a" (Blackwell).
  std::string chip = "sm_90a";
  /// The CUDA toolkit holding libdevice; empty: $CUDA_HOME, else
  /// /usr/local/cuda (resolvedToolkit()).
  std::string toolkit;
  /// TMA + tensor-core GEMM phases (wgmma on sm_90a, tcgen05 on sm_100a)
  /// for the layers whose shapes fit the tiles (tensor-cores).
  bool tensorCores = true;
  /// Kernels that record the global timer after each phase (profile).
  bool profile = false;
  /// sm_90a: the forward kernels' GEMMs (the training forward's too)
  /// with a TMA producer warpgroup (warp-specialize).
  bool warpSpecialize = false;
  /// The dispatch of x into the routed gate/up GEMM.
  Dispatch dispatch = Dispatch::Auto;
  /// sm_90a clusters of 2 CTAs sharing weight boxes by TMA multicast
  /// (multicast).
  bool multicast = false;
  /// First derive each layer's training forward <fn>_forward and backward
  /// <fn>_backward (moe-generate-backward), and compile them too.
  bool training = false;
  /// With training: the forward saves no context, the backward recomputes
  /// it (moe-generate-backward's recompute).
  bool recompute = false;
  /// With training: the backward adds the weights' gradients into fp32
  /// main_grad outputs (moe-generate-backward's main-grads).
  bool mainGrads = false;
  /// Debugging: every grid barrier's wait bounded to this many
  /// milliseconds (0: unbounded); a barrier that times out is reported by
  /// the runtime after the call instead of hanging (barrier-timeout-ms).
  unsigned barrierTimeoutMs = 0;
  /// For testing the exchange on one GPU: ep = 1 layers planned as the
  /// one rank of an expert-parallel group, run bound to a communicator of
  /// one rank (self-exchange).
  bool selfExchange = false;
  /// FP8 layers: the routed weights come quantized, as inputs
  /// (fp8-quantized-weights).
  bool fp8QuantizedWeights = false;

  /// Empty when the options can be compiled; otherwise why not, naming the
  /// options by their pass-option spelling (e.g. "multicast is implemented
  /// for sm_90a without warp-specialize only"). The refusals are
  /// convert-moe-to-mk's, made before anything is compiled: an unknown chip;
  /// fuse-dispatch, warp-specialize or multicast where they are not
  /// implemented (sm_100a, multicast with warp-specialize, any of them
  /// without tensor cores, fuse-dispatch and multicast for the training
  /// kernels, warp-specialize with recompute); recompute and main-grads
  /// without training.
  std::string validate() const;

  /// `toolkit`, or $CUDA_HOME, or /usr/local/cuda.
  std::string resolvedToolkit() const;
};

} // namespace mok

#endif // MOK_CONVERSION_MOETOPTX_COMPILEOPTIONS_H
