// Expert parallelism on the GPU: the forward and the backward compile;
// what they do not cover yet is refused by name.
// RUN: not mok-opt %s --moe-generate-backward=recompute=true --convert-moe-to-mk 2>&1 | FileCheck %s --check-prefix=RECOMPUTE
// RECOMPUTE: error: convert-moe-to-mk: a backward that recomputes the forward is not implemented with expert parallelism (ep = 2) yet; save the forward's context instead
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk | FileCheck %s --check-prefix=TRAIN
// TRAIN: gpu.func @expert_parallel_forward_forward(
// TRAIN: gpu.func @expert_parallel_backward_backward(
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true" 2>&1 | FileCheck %s --check-prefix=WS
// WS: error: convert-moe-to-mk: warp-specialize is not implemented with expert parallelism (ep = 2) yet
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a multicast=true" 2>&1 | FileCheck %s --check-prefix=MC
// MC: error: convert-moe-to-mk: multicast is not implemented with expert parallelism (ep = 2) yet
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" 2>&1 | FileCheck %s --check-prefix=FD
// FD: error: convert-moe-to-mk: fuse-dispatch is not implemented with expert parallelism (ep = 2) yet
// RUN: mok-opt %s --convert-moe-to-mk | FileCheck %s --check-prefix=OK
// OK: gpu.func @expert_parallel_forward(

func.func @expert_parallel(%x: tensor<8x64xbf16>, %top: tensor<8x2xi32>, %rw: tensor<8x2xf32>,
                           %wg: tensor<2x32x64xbf16>, %wu: tensor<2x32x64xbf16>,
                           %wd: tensor<2x64x32xbf16>) -> tensor<8x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 2, padding = 8>
      : (tensor<8x64xbf16>, tensor<8x2xi32>, tensor<8x2xf32>, tensor<2x32x64xbf16>,
         tensor<2x32x64xbf16>, tensor<2x64x32xbf16>) -> tensor<8x64xbf16>
  return %o : tensor<8x64xbf16>
}
