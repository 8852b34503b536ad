// The backward and the training forward have their own tensor-core plan:
// the options they do not take are refused for them, not ignored (warp
// roles are the forward kernels': refused only with a recomputing backward).
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true" 2>&1 | FileCheck %s --check-prefix=WS
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a multicast=true" 2>&1 | FileCheck %s --check-prefix=MC
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" 2>&1 | FileCheck %s --check-prefix=FD
// WS: error: convert-moe-to-mk: warp-specialize is not implemented with a backward that recomputes the forward
// MC: error: convert-moe-to-mk: multicast is not implemented for the backward (moe.layer_grad) yet
// FD: error: convert-moe-to-mk: fuse-dispatch is not implemented for the backward (moe.layer_grad) yet
// RUN: mok-opt %s --convert-moe-to-mk | FileCheck %s --check-prefix=OK
// OK: gpu.func @backward_backward(

func.func @backward(%d: tensor<8x64xbf16>, %x: tensor<8x64xbf16>, %top: tensor<8x2xi32>,
                    %rw: tensor<8x2xf32>, %wg: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) {
  // expected-error @+1 {{convert-moe-to-mk: expert parallelism (ep = 1) is not supported yet}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 1, padding = 8>
      : (tensor<8x64xbf16>, tensor<8x64xbf16>, tensor<8x2xi32>, tensor<8x2xf32>,
         tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>)
      -> (tensor<8x64xbf16>, tensor<8x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>,
          tensor<4x64x32xbf16>)
  return
}
