// RUN: mok-opt %s --moe-generate-backward --moe-to-cpu | FileCheck %s

// The whole CPU pipeline ends in the LLVM dialect, for the inference, the
// training forward and the backward function, each with its C interface.
// CHECK-NOT: moe.
// CHECK-NOT: memref.
// CHECK-NOT: scf.
// CHECK-DAG: llvm.func @layer(
// CHECK-DAG: llvm.func @_mlir_ciface_layer(
// CHECK-DAG: llvm.func @_mlir_ciface_layer_forward(
// CHECK-DAG: llvm.func @_mlir_ciface_layer_backward(
// CHECK-DAG: llvm.intr.exp
func.func @layer(%x: tensor<5x8xbf16>, %top: tensor<5x2xi32>, %rw: tensor<5x2xf32>,
                 %wg: tensor<4x6x8xbf16>, %wu: tensor<4x6x8xbf16>,
                 %wd: tensor<4x8x6xbf16>, %sg: tensor<3x8xbf16>,
                 %su: tensor<3x8xbf16>, %sd: tensor<8x3xbf16>) -> tensor<5x8xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      plan !moe.plan<tokens = 5, top_k = 2, experts = 4, ep = 1, padding = 2>
      : (tensor<5x8xbf16>, tensor<5x2xi32>, tensor<5x2xf32>, tensor<4x6x8xbf16>,
         tensor<4x6x8xbf16>, tensor<4x8x6xbf16>, tensor<3x8xbf16>, tensor<3x8xbf16>,
         tensor<8x3xbf16>) -> tensor<5x8xbf16>
  return %o : tensor<5x8xbf16>
}
