// RUN: mok-opt %s --convert-moe-to-mk | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_100a | FileCheck %s

// A quantizer function: moe.quantize ops of one bf16 weight [E, N, K]
// (128 x 128 blocks, f32 scales), the normal layout and the transposed one,
// as one kernel `<fn>_quantize` of mk.quantize_weights ops, its outputs in
// the order the function returns them (mok.ops.fp8_quantize's refresh).
// CHECK-LABEL: gpu.module @refresh_kernels
// CHECK: gpu.func @refresh_quantize(%[[W:[^:]*]]: memref<4x256x384xbf16>, %[[QT:[^:]*]]: memref<4x384x256xf8E4M3FN>, %[[ST:[^:]*]]: memref<4x3x2xf32>, %[[Q:[^:]*]]: memref<4x256x384xf8E4M3FN>, %[[S:[^:]*]]: memref<4x2x3xf32>, %{{[^:]*}}: memref<2xi32>) kernel
// CHECK-SAME: known_block_size = array<i32: 512, 1, 1>
// CHECK-SAME: name = "weight", role = "input"
// CHECK-SAME: dtype = "f8e4m3", name = "values_t", role = "output", shape = array<i64: 4, 384, 256>
// CHECK-SAME: dtype = "f32", name = "scales_t", role = "output", shape = array<i64: 4, 3, 2>
// CHECK-SAME: dtype = "f8e4m3", name = "values", role = "output", shape = array<i64: 4, 256, 384>
// CHECK-SAME: dtype = "f32", name = "scales", role = "output", shape = array<i64: 4, 2, 3>
// CHECK-SAME: name = "grid_barrier", role = "workspace"
// CHECK-NOT: routed_capacity
// CHECK: mk.quantize_weights %[[W]] into %[[Q]], %[[S]] :
// CHECK-NEXT: mk.quantize_weights %[[W]] into %[[QT]], %[[ST]] transposed :
// CHECK-NEXT: gpu.return
func.func @refresh(%w: tensor<4x256x384xbf16>)
    -> (tensor<4x384x256xf8E4M3FN>, tensor<4x3x2xf32>, tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>}
      : tensor<4x256x384xbf16> -> tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>
  %qt, %st = moe.quantize %w {block = array<i64: 128, 128>, transpose}
      : tensor<4x256x384xbf16> -> tensor<4x384x256xf8E4M3FN>, tensor<4x3x2xf32>
  return %qt, %st, %q, %s
      : tensor<4x384x256xf8E4M3FN>, tensor<4x3x2xf32>, tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>
}

// One layout alone.
// CHECK-LABEL: gpu.module @normal_kernels
// CHECK: gpu.func @normal_quantize(%{{[^:]*}}: memref<1x128x256xbf16>, %{{[^:]*}}: memref<1x128x256xf8E4M3FN>, %{{[^:]*}}: memref<1x1x2xf32>, %{{[^:]*}}: memref<2xi32>)
// CHECK: mk.quantize_weights
// CHECK-NOT: mk.quantize_weights
// CHECK: gpu.return
func.func @normal(%w: tensor<1x128x256xbf16>) -> (tensor<1x128x256xf8E4M3FN>, tensor<1x1x2xf32>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>}
      : tensor<1x128x256xbf16> -> tensor<1x128x256xf8E4M3FN>, tensor<1x1x2xf32>
  return %q, %s : tensor<1x128x256xf8E4M3FN>, tensor<1x1x2xf32>
}

// The transposed layout first in the function: the kernel still quantizes
// the normal one first, so that convert-mk-to-gpu does both in one pass.
// CHECK-LABEL: gpu.module @transposed_first_kernels
// CHECK: gpu.func @transposed_first_quantize(%[[W:[^:]*]]: memref<1x128x256xbf16>, %[[QT:[^:]*]]: memref<1x256x128xf8E4M3FN>, %[[ST:[^:]*]]: memref<1x2x1xf32>, %[[Q:[^:]*]]: memref<1x128x256xf8E4M3FN>, %[[S:[^:]*]]: memref<1x1x2xf32>,
// CHECK: mk.quantize_weights %[[W]] into %[[Q]], %[[S]] :
// CHECK-NEXT: mk.quantize_weights %[[W]] into %[[QT]], %[[ST]] transposed :
func.func @transposed_first(%w: tensor<1x128x256xbf16>)
    -> (tensor<1x256x128xf8E4M3FN>, tensor<1x2x1xf32>, tensor<1x128x256xf8E4M3FN>, tensor<1x1x2xf32>) {
  %qt, %st = moe.quantize %w {block = array<i64: 128, 128>, transpose}
      : tensor<1x128x256xbf16> -> tensor<1x256x128xf8E4M3FN>, tensor<1x2x1xf32>
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>}
      : tensor<1x128x256xbf16> -> tensor<1x128x256xf8E4M3FN>, tensor<1x1x2xf32>
  return %qt, %st, %q, %s
      : tensor<1x256x128xf8E4M3FN>, tensor<1x2x1xf32>, tensor<1x128x256xf8E4M3FN>, tensor<1x1x2xf32>
}
