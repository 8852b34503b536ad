// RUN: mok-opt %s --convert-moe-to-cpu | FileCheck %s
// RUN: mok-opt %s --moe-to-cpu | FileCheck %s --check-prefix=LLVM

// moe.quantize / moe.dequantize as host loops: the scale from the block's
// amax, the E4M3 code by integer arithmetic with one round-to-even, and the
// f8 buffers stored as bytes. Bit-exactness against a float64 model of the
// formats is python/tests/test_fp8.py's.

// CHECK-LABEL: func.func @mx(
// CHECK-SAME: memref<4x64xbf16>, %{{.*}}: memref<4x64xf8E4M3FN>, %{{.*}}: memref<4x2xf8E8M0FNU>)
// amax over the block (NaN and infinity propagate), then "finite" = amax < inf.
// CHECK: math.absf
// CHECK: arith.maximumf
// CHECK: %[[FINITE:.*]] = arith.cmpf olt, %{{.*}}, %{{.*}} : f32
// e = exponent(amax) - 8, plus one above a mantissa of 1.75 (0x600000).
// CHECK: arith.cmpi ugt, %{{.*}}, %c6291456_i32
// CHECK: arith.subi %{{.*}}, %c135_i32
// CHECK: arith.select %[[FINITE]], %{{.*}}, %c255_i32 : i32
// CHECK: arith.bitcast %{{.*}} : i8 to f8E8M0FNU
// The elements: x * 2^-e, E4M3 by one roundeven, NaN code for non-finite blocks.
// CHECK: arith.mulf
// CHECK: arith.minimumf %{{.*}}, %cst{{.*}} : f32
// CHECK: math.roundeven
// CHECK: arith.fptosi
// CHECK: arith.cmpf uno
// CHECK: arith.select %[[FINITE]]
// CHECK: arith.bitcast %{{.*}} : i8 to f8E4M3FN
func.func @mx(%w: tensor<4x64xbf16>) -> (tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>) {
  %q, %s = moe.quantize %w {block = array<i64: 1, 32>}
      : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  return %q, %s : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
}

// f32 scales: amax / 448 (1 for a block of zeros), elements x / s.
// CHECK-LABEL: func.func @fine(
// CHECK: %[[ZERO:.*]] = arith.cmpf oeq
// CHECK: arith.divf %{{.*}}, %cst
// CHECK: arith.select %[[ZERO]]
// CHECK: memref.store %{{.*}} : memref<?x2xf32>
// CHECK: arith.divf
// CHECK: math.roundeven
func.func @fine(%x: tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>) {
  %q, %s = moe.quantize %x {block = array<i64: 1, 128>}
      : tensor<?x256xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
  return %q, %s : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
}

// transpose: the data quantized is the input with its last two dimensions
// swapped; the results' dynamic sizes come from the input's swapped ones
// (values [d0, 64, d1], scales [d0, 2, d1 / 1]) and the loads read
// input[e, j, i] for element (i, j) of the swapped data.
// CHECK-LABEL: func.func @transposed(
// CHECK: %[[D0:.*]] = memref.dim %arg0, %c0{{[_0-9]*}} : memref<?x?x64xbf16>
// CHECK: %[[D1:.*]] = memref.dim %arg0, %c1{{[_0-9]*}} : memref<?x?x64xbf16>
// CHECK: %[[N:.*]] = arith.divsi %[[D1]], %c1{{[_0-9]*}} : index
// CHECK: memref.alloc(%[[D0]], %[[N]]) : memref<?x64x?xf8E4M3FN>
// CHECK: %[[S0:.*]] = memref.dim %arg0, %c0{{[_0-9]*}} : memref<?x?x64xbf16>
// CHECK: %[[S1:.*]] = memref.dim %arg0, %c1{{[_0-9]*}} : memref<?x?x64xbf16>
// CHECK: %[[SN:.*]] = arith.divsi %[[S1]], %c1{{[_0-9]*}} : index
// CHECK: memref.alloc(%[[S0]], %[[SN]]) : memref<?x2x?xf8E8M0FNU>
// CHECK: scf.for %[[E:[^ ]*]] =
// CHECK: scf.for %[[B1:[^ ]*]] =
// CHECK: scf.for %[[B2:[^ ]*]] =
// CHECK: %[[ROW:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK: %[[COL:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK: memref.load %arg0[%[[E]], %[[COL]], %[[ROW]]]
func.func @transposed(%x: tensor<?x?x64xbf16>) -> (tensor<?x64x?xf8E4M3FN>, tensor<?x2x?xf8E8M0FNU>) {
  %q, %s = moe.quantize %x {block = array<i64: 32, 1>, transpose}
      : tensor<?x?x64xbf16> -> tensor<?x64x?xf8E4M3FN>, tensor<?x2x?xf8E8M0FNU>
  return %q, %s : tensor<?x64x?xf8E4M3FN>, tensor<?x2x?xf8E8M0FNU>
}

// Dequantize: decode E4M3 and E8M0 (0xFF: NaN), multiply in f32, round to bf16.
// CHECK-LABEL: func.func @dequant(
// CHECK: arith.bitcast %{{.*}} : f8E8M0FNU to i8
// CHECK: arith.bitcast %{{.*}} : f8E4M3FN to i8
// CHECK: arith.sitofp
// CHECK: arith.mulf
// CHECK: arith.truncf %{{.*}} : f32 to bf16
func.func @dequant(%q: tensor<4x64xf8E4M3FN>, %s: tensor<4x2xf8E8M0FNU>) -> tensor<4x64xbf16> {
  %w = moe.dequantize %q, %s {block = array<i64: 1, 32>}
      : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU> -> tensor<4x64xbf16>
  return %w : tensor<4x64xbf16>
}

// An FP8 layer: the routed GEMMs read quantized-then-dequantized f32
// copies of x's rows, the gate, up and down weights and the hidden rows.
// CHECK-LABEL: func.func @moe_layer(
// CHECK-COUNT-5: math.roundeven
// CHECK-NOT: math.roundeven
// CHECK: return
func.func @moe_layer(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 1> {precision = "mxfp8"}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<?x64xbf16>
  return %out : tensor<?x64xbf16>
}

// The FP8 backward: d_out per token, W_d along H, d_y and h in row blocks,
// d_g and d_u per row, W_g and W_u along I, then d_g, d_u and x in row
// blocks: eleven quantized operands.
// CHECK-LABEL: func.func @layer_grad(
// CHECK-COUNT-11: math.roundeven
// CHECK-NOT: math.roundeven
// CHECK: return
func.func @layer_grad(%d: tensor<?x64xbf16>, %x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>, %xr: tensor<?x64xbf16>, %g: tensor<?x32xbf16>, %u: tensor<?x32xbf16>, %h: tensor<?x32xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) {
  %dx, %drw, %dwg, %dwu, %dwd = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wu, down %wd saved(%xr, %g, %u, %h)
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 32> {precision = "mxfp8"}
      : (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>, tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16>)
      -> (tensor<?x64xbf16>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>)
  return %dx, %drw, %dwg, %dwu, %dwd : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>
}

// The f8 element types reach LLVM as bytes.
// LLVM-LABEL: llvm.func @mx(
// LLVM: llvm.intr.roundeven
// LLVM: llvm.store %{{.*}}, %{{.*}} {alignment = 1 : i64} : i8, !llvm.ptr
