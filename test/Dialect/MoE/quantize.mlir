// RUN: mok-opt %s | mok-opt | FileCheck %s

// moe.quantize / moe.dequantize round-trip: MX (E8M0 scales), f32 scales
// over 1 x 128 and 128 x 128 blocks, a dynamic token dimension.

// CHECK-LABEL: func.func @mx
// CHECK: %{{.*}}, %{{.*}} = moe.quantize %{{.*}} {block = array<i64: 1, 32>} : tensor<8x256x512xbf16> -> tensor<8x256x512xf8E4M3FN>, tensor<8x256x16xf8E8M0FNU>
// CHECK: moe.dequantize %{{.*}}, %{{.*}} {block = array<i64: 1, 32>} : tensor<8x256x512xf8E4M3FN>, tensor<8x256x16xf8E8M0FNU> -> tensor<8x256x512xbf16>
func.func @mx(%w: tensor<8x256x512xbf16>) -> tensor<8x256x512xbf16> {
  %q, %s = moe.quantize %w {block = array<i64: 1, 32>}
      : tensor<8x256x512xbf16> -> tensor<8x256x512xf8E4M3FN>, tensor<8x256x16xf8E8M0FNU>
  %d = moe.dequantize %q, %s {block = array<i64: 1, 32>}
      : tensor<8x256x512xf8E4M3FN>, tensor<8x256x16xf8E8M0FNU> -> tensor<8x256x512xbf16>
  return %d : tensor<8x256x512xbf16>
}

// CHECK-LABEL: func.func @fine_grained
// CHECK: moe.quantize %{{.*}} {block = array<i64: 1, 128>} : tensor<?x7168xbf16> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>
// CHECK: moe.quantize %{{.*}} {block = array<i64: 128, 128>} : tensor<2048x7168xf32> -> tensor<2048x7168xf8E4M3FN>, tensor<16x56xf32>
func.func @fine_grained(%x: tensor<?x7168xbf16>, %w: tensor<2048x7168xf32>)
    -> (tensor<?x56xf32>, tensor<16x56xf32>) {
  %qx, %sx = moe.quantize %x {block = array<i64: 1, 128>}
      : tensor<?x7168xbf16> -> tensor<?x7168xf8E4M3FN>, tensor<?x56xf32>
  %qw, %sw = moe.quantize %w {block = array<i64: 128, 128>}
      : tensor<2048x7168xf32> -> tensor<2048x7168xf8E4M3FN>, tensor<16x56xf32>
  return %sx, %sw : tensor<?x56xf32>, tensor<16x56xf32>
}

// The transposed layout: values [E, K, N] of a weight [E, N, K].
// CHECK-LABEL: func.func @transposed
// CHECK: moe.quantize %{{.*}} {block = array<i64: 128, 128>, transpose} : tensor<8x256x512xbf16> -> tensor<8x512x256xf8E4M3FN>, tensor<8x4x2xf32>
func.func @transposed(%w: tensor<8x256x512xbf16>) -> (tensor<8x512x256xf8E4M3FN>, tensor<8x4x2xf32>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>, transpose}
      : tensor<8x256x512xbf16> -> tensor<8x512x256xf8E4M3FN>, tensor<8x4x2xf32>
  return %q, %s : tensor<8x512x256xf8E4M3FN>, tensor<8x4x2xf32>
}
