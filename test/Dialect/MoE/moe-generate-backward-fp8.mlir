// RUN: mok-opt %s --moe-generate-backward | FileCheck %s
// RUN: not mok-opt %s --moe-generate-backward=recompute=true 2>&1 | FileCheck %s --check-prefix=RECOMPUTE

// An FP8 layer's precision reaches its training forward (which saves the
// bf16 context) and its backward; recompute is refused: the FP8 backward
// reads the saved context.

// CHECK-LABEL: func.func @moe_layer_forward(
// CHECK: moe.layer
// CHECK-SAME: precision = "mxfp8"
// CHECK-SAME: -> (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16>)
// CHECK-LABEL: func.func @moe_layer_backward(
// CHECK: moe.layer_grad
// CHECK-SAME: precision = "mxfp8"
// RECOMPUTE: error: moe-generate-backward: recompute is not supported for an FP8 layer (precision = "mxfp8"): its backward reads the saved context
func.func @moe_layer(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 32> {precision = "mxfp8"}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<?x64xbf16>
  return %out : tensor<?x64xbf16>
}
