// mok-compile compiles a quantizer function (moe.quantize of FP8 weights,
// convert-moe-to-mk's quantizer plan) like a layer: its PTX and the
// runtime's metadata, the outputs named in the order it returns them.
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-compile %s --function refresh -o %t/out
// RUN: FileCheck %s --input-file %t/out/refresh.json
// RUN: FileCheck %s --check-prefix=PTX --input-file %t/out/refresh.ptx
// RUN: mok-compile %s --chip sm_100a --function refresh -o %t/sm100
// RUN: FileCheck %s --input-file %t/sm100/refresh.json
// A function that is neither a layer nor a quantizer is refused by name.
// RUN: sed -e 's/block = array<i64: 128, 128>}/block = array<i64: 1, 128>}/' -e 's/tensor<2x1x2xf32>/tensor<2x128x2xf32>/g' %s > %t/rows.mlir
// RUN: not mok-compile %t/rows.mlir --function refresh -o %t/x 2>&1 | FileCheck %s --check-prefix=ROWS
// CHECK: "block": 512,
// CHECK: "function": "refresh",
// CHECK: "kernel": "refresh_quantize",
// CHECK: "name": "weight",
// CHECK: "name": "values",
// CHECK: "shape": [
// CHECK-NEXT: 2,
// CHECK-NEXT: 128,
// CHECK-NEXT: 256
// CHECK: "name": "scales",
// CHECK: "name": "values_t",
// CHECK: "shape": [
// CHECK-NEXT: 2,
// CHECK-NEXT: 256,
// CHECK-NEXT: 128
// CHECK: "name": "scales_t",
// PTX: .entry refresh_quantize(
// ROWS: on the GPU targets moe.quantize takes 128 x 128 blocks with f32 scales ("fp8" weights), got a block of 1 x 128 with 'f32' scales
func.func @refresh(%w: tensor<2x128x256xbf16>)
    -> (tensor<2x128x256xf8E4M3FN>, tensor<2x1x2xf32>, tensor<2x256x128xf8E4M3FN>, tensor<2x2x1xf32>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>}
      : tensor<2x128x256xbf16> -> tensor<2x128x256xf8E4M3FN>, tensor<2x1x2xf32>
  %qt, %st = moe.quantize %w {block = array<i64: 128, 128>, transpose}
      : tensor<2x128x256xbf16> -> tensor<2x256x128xf8E4M3FN>, tensor<2x2x1xf32>
  return %q, %s, %qt, %st
      : tensor<2x128x256xf8E4M3FN>, tensor<2x1x2xf32>, tensor<2x256x128xf8E4M3FN>, tensor<2x2x1xf32>
}
