// RUN: mok-opt %s | FileCheck %s
// RUN: mok-opt %s | mok-opt | FileCheck %s
// RUN: mok-opt %s --mlir-print-op-generic | mok-opt | FileCheck %s

// Every mk op round-trips, in the custom and the generic form.

// CHECK-LABEL: gpu.func @schedule
// CHECK: mk.fill %{{.*}}, -1 : memref<108xi64>
// CHECK: mk.check_routes %{{.*}} into %[[ST:.*]] {experts = 4 : i64} : memref<40x2xi32>, memref<8xi32>
// CHECK: mk.count_routes %{{.*}} into %[[CC:.*]] {chunk = 64 : i64} : memref<40x2xi32>, memref<2x4xi64>
// CHECK: mk.grid_barrier %[[BAR:.*]] : memref<2xi32>
// CHECK: mk.grid_barrier %[[BAR]] status(%[[ST]] : memref<8xi32>) {index = 1 : i64, timeout_ns = 200000000 : i64} : memref<2xi32>
// CHECK: mk.scan_chunks %[[CC]] into %[[COUNTS:.*]] : memref<2x4xi64>, memref<4xi64>
// CHECK: mk.pad_offsets %[[COUNTS]] into %{{.*}} {padding = 8 : i64} : memref<4xi64>, memref<5xi64>
// CHECK: mk.assign_rows %{{.*}}, %{{.*}}, %[[CC]] into %{{.*}}, %{{.*}}, %{{.*}} {chunk = 64 : i64} : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<80xi64>, memref<108xi64>, memref<108xi64>
// CHECK: mk.gather %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} {top_k = 2 : i64} : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
// CHECK: mk.gemm swiglu %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} grouped(%{{.*}}, %{{.*}} : memref<108xi64>, memref<5xi64>) schedule <simt> {swiglu_limit = 7.000000e+00 : f32} : memref<108x64xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x32xbf16>
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} schedule <simt> : memref<40x16xbf16>, memref<64x16xbf16> -> memref<40x64xbf16>
// CHECK: mk.combine %{{.*}}, %{{.*}} weights(%{{.*}} : memref<40x2xf32>) shared(%{{.*}} : memref<40x64xbf16>) into %{{.*}} : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
// CHECK: mk.combine %{{.*}}, %{{.*}} weights(%{{.*}} : memref<40x2xf32>) into %{{.*}} : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
// CHECK: mk.timestamp %{{.*}}[3] : memref<9xi64>
// CHECK: mk.timestamp %[[TS:[a-z0-9_]+]][4] cycles(%[[TS]] : memref<9xi64>) : memref<9xi64>
// CHECK-LABEL: gpu.func @tensor_cores
// CHECK: mk.gemm swiglu %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} grouped(%{{.*}}, %{{.*}} : memref<332xi64>, memref<5xi64>) maps(%{{.*}} : memref<304xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1, 5>}
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} maps(%{{.*}} : memref<304xi64>) schedule <tcgen05, tile = [64, 128, 64], stages = 4> {maps = array<i64: 17, 18>} : memref<40x128xbf16>, memref<64x128xbf16> -> memref<40x64xbf16>
// CHECK: mk.gemm swiglu %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} grouped(%{{.*}}, %{{.*}} : memref<332xi64>, memref<5xi64>) maps(%{{.*}} : memref<304xi64>) gather(%{{.*}} : memref<332xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {gather_top_k = 2 : i64, maps = array<i64: 0, 1, 5>} : memref<40x64xbf16>, memref<4x128x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} grouped(%{{.*}}, %{{.*}} : memref<332xi64>, memref<5xi64>) maps(%{{.*}} : memref<304xi64>) padding(%{{.*}} : memref<332xi64>) schedule <wgmma, tile = [128, 256, 64], stages = 4> {maps = array<i64: 9, 10>} : memref<332x128xbf16>, memref<4x64x128xbf16> -> memref<332x64xbf16>
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} maps(%{{.*}} : memref<304xi64>) schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]> {maps = array<i64: 17, 18>}
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} grouped(%{{.*}}, %{{.*}} : memref<332xi64>, memref<5xi64>) maps(%{{.*}} : memref<304xi64>) schedule <wgmma, tile = [128, 256, 64], stages = 4, multicast> {maps = array<i64: 9, 10>} : memref<332x128xbf16>, memref<4x64x128xbf16> -> memref<332x64xbf16>

// CHECK-LABEL: gpu.func @backward
// Each operand is matched as one SSA name, so a missing or an extra operand
// group fails the match.
// CHECK: mk.gather %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} scale(%{{[a-z0-9_]+}} : memref<40x2xf32>) {top_k = 2 : i64} : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} grouped(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<108xi64>, memref<5xi64>) schedule <simt> {transpose_b} : memref<108x64xbf16>, memref<4x64x32xbf16> -> memref<108x32xf32>
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} schedule <simt> {transpose_a} : memref<64x40xbf16>, memref<16x64xbf16> -> memref<40x16xbf16>
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} schedule <simt> : memref<40x64xbf16>, memref<16x64xbf16> -> memref<40x16xf32>
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} grouped(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<108xi64>, memref<5xi64>) concat(%{{[a-z0-9_]+}} : memref<108x32xbf16>) schedule <simt> {transpose_b} : memref<108x32xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x64xbf16>
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} k_groups(%{{[a-z0-9_]+}} : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} k_groups(%{{[a-z0-9_]+}} : memref<5xi64>) k_counts(%{{[a-z0-9_]+}} : memref<4xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
// CHECK: mk.gemm swiglu %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} grouped(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<108xi64>, memref<5xi64>) saves(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<108x32xbf16>, memref<108x32xbf16>) schedule <simt> {swiglu_limit = 7.000000e+00 : f32} : memref<108x64xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x32xbf16>
// CHECK: mk.swiglu_grad %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} routes(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %{{[a-z0-9_]+}} {swiglu_limit = 7.000000e+00 : f32} : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16> -> memref<108x32xbf16>, memref<108x32xbf16>, memref<40x2xf32>
// CHECK: mk.swiglu_grad %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<40x16xf32>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16> -> memref<40x16xbf16>, memref<40x16xbf16>{{$}}
// CHECK: mk.combine %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
// CHECK: mk.combine %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} shared(%{{[a-z0-9_]+}} : memref<40x64xbf16>) into %{{[a-z0-9_]+}} : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>

module attributes {gpu.container_module} {
gpu.module @kernels {
  gpu.func @schedule(%x: memref<40x64xbf16>, %top: memref<40x2xi32>, %rw: memref<40x2xf32>,
                     %wg: memref<4x32x64xbf16>, %wu: memref<4x32x64xbf16>,
                     %sd: memref<64x16xbf16>, %out: memref<40x64xbf16>,
                     %counts: memref<4xi64>, %cc: memref<2x4xi64>, %offsets: memref<5xi64>, %route_row: memref<80xi64>,
                     %row_route: memref<108xi64>, %row_expert: memref<108xi64>,
                     %routed_x: memref<108x64xbf16>, %hidden: memref<108x32xbf16>,
                     %routed_y: memref<108x64xbf16>, %shared_hidden: memref<40x16xbf16>,
                     %shared_out: memref<40x64xbf16>, %bar: memref<2xi32>,
                     %clock: memref<9xi64>, %status: memref<8xi32>) kernel {
    mk.fill %row_route, -1 : memref<108xi64>
    mk.check_routes %top into %status {experts = 4 : i64} : memref<40x2xi32>, memref<8xi32>
    mk.count_routes %top into %cc {chunk = 64 : i64} : memref<40x2xi32>, memref<2x4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.grid_barrier %bar status(%status : memref<8xi32>) {index = 1 : i64, timeout_ns = 200000000 : i64} : memref<2xi32>
    mk.scan_chunks %cc into %counts : memref<2x4xi64>, memref<4xi64>
    mk.pad_offsets %counts into %offsets {padding = 8 : i64} : memref<4xi64>, memref<5xi64>
    mk.assign_rows %top, %offsets, %cc into %route_row, %row_route, %row_expert {chunk = 64 : i64}
        : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<80xi64>, memref<108xi64>, memref<108xi64>
    mk.gather %x, %row_route, %offsets into %routed_x {top_k = 2 : i64}
        : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    mk.gemm swiglu %routed_x, %wg, %wu into %hidden
        grouped(%row_expert, %offsets : memref<108xi64>, memref<5xi64>) schedule <simt> {swiglu_limit = 7.0 : f32}
        : memref<108x64xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x32xbf16>
    mk.gemm store %shared_hidden, %sd into %shared_out schedule <simt>
        : memref<40x16xbf16>, memref<64x16xbf16> -> memref<40x64xbf16>
    mk.combine %routed_y, %route_row weights(%rw : memref<40x2xf32>) shared(%shared_out : memref<40x64xbf16>) into %out
        : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    mk.combine %routed_y, %route_row weights(%rw : memref<40x2xf32>) into %out
        : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    mk.timestamp %clock[3] : memref<9xi64>
    mk.timestamp %clock[4] cycles(%clock : memref<9xi64>) : memref<9xi64>
    gpu.return
  }

  gpu.func @tensor_cores(%routed_x: memref<332x64xbf16>, %wg: memref<4x128x64xbf16>,
                         %wu: memref<4x128x64xbf16>, %hidden: memref<332x128xbf16>,
                         %row_expert: memref<332xi64>, %offsets: memref<5xi64>,
                         %sh: memref<40x128xbf16>, %sd: memref<64x128xbf16>,
                         %so: memref<40x64xbf16>, %maps: memref<304xi64>,
                         %x: memref<40x64xbf16>, %wd: memref<4x64x128xbf16>,
                         %ry: memref<332x64xbf16>) kernel {
    mk.gemm swiglu %routed_x, %wg, %wu into %hidden
        grouped(%row_expert, %offsets : memref<332xi64>, memref<5xi64>) maps(%maps : memref<304xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1, 5>}
        : memref<332x64xbf16>, memref<4x128x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    mk.gemm store %sh, %sd into %so maps(%maps : memref<304xi64>)
        schedule <tcgen05, tile = [64, 128, 64], stages = 4> {maps = array<i64: 17, 18>}
        : memref<40x128xbf16>, memref<64x128xbf16> -> memref<40x64xbf16>
    // Gathered A: rows of %x picked by %row_expert (route / 2).
    mk.gemm swiglu %x, %wg, %wu into %hidden
        grouped(%row_expert, %offsets : memref<332xi64>, memref<5xi64>) maps(%maps : memref<304xi64>)
        gather(%row_expert : memref<332xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {gather_top_k = 2 : i64, maps = array<i64: 0, 1, 5>}
        : memref<40x64xbf16>, memref<4x128x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    // Padding rows (row_route < 0) whose results nothing reads.
    mk.gemm store %hidden, %wd into %ry
        grouped(%row_expert, %offsets : memref<332xi64>, memref<5xi64>) maps(%maps : memref<304xi64>)
        padding(%row_expert : memref<332xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4> {maps = array<i64: 9, 10>}
        : memref<332x128xbf16>, memref<4x64x128xbf16> -> memref<332x64xbf16>
    // Warp roles: a producer warpgroup, registers moved to the consumers.
    mk.gemm store %sh, %sd into %so maps(%maps : memref<304xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]> {maps = array<i64: 17, 18>}
        : memref<40x128xbf16>, memref<64x128xbf16> -> memref<40x64xbf16>
    // The CTA pairs of 2-CTA clusters sharing each weight box.
    mk.gemm store %hidden, %wd into %ry
        grouped(%row_expert, %offsets : memref<332xi64>, memref<5xi64>) maps(%maps : memref<304xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4, multicast> {maps = array<i64: 9, 10>}
        : memref<332x128xbf16>, memref<4x64x128xbf16> -> memref<332x64xbf16>
    gpu.return
  }

  // The backward's forms (simt only).
  gpu.func @backward(%d_out: memref<40x64xbf16>, %rw: memref<40x2xf32>, %row_route: memref<108xi64>,
                     %route_row: memref<80xi64>, %row_expert: memref<108xi64>, %offsets: memref<5xi64>,
                     %d_y: memref<108x64xbf16>, %wg: memref<4x32x64xbf16>, %wu: memref<4x32x64xbf16>,
                     %wd: memref<4x64x32xbf16>, %dh_u: memref<108x32xf32>,
                     %routed_x: memref<108x64xbf16>, %gate: memref<108x32xbf16>, %up: memref<108x32xbf16>,
                     %hidden: memref<108x32xbf16>, %d_gate: memref<108x32xbf16>, %d_up: memref<108x32xbf16>,
                     %d_rw: memref<40x2xf32>, %d_rx: memref<108x64xbf16>, %d_wd: memref<4x64x32xbf16>,
                     %xt: memref<64x40xbf16>, %x: memref<40x64xbf16>, %sb: memref<16x64xbf16>,
                     %sh: memref<40x16xbf16>, %sh32: memref<40x16xf32>, %sdh: memref<40x16xf32>,
                     %sg: memref<40x16xbf16>, %su: memref<40x16xbf16>, %sdg: memref<40x16xbf16>,
                     %sdu: memref<40x16xbf16>, %d_x: memref<40x64xbf16>, %counts: memref<4xi64>) kernel {
    // The reverse combine: d_out scaled by the router weights.
    mk.gather %d_out, %row_route, %offsets into %d_y scale(%rw : memref<40x2xf32>) {top_k = 2 : i64}
        : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    // d_hidden_u = d_y W_d (B [E, K, N]), unrounded.
    mk.gemm store %d_y, %wd into %dh_u grouped(%row_expert, %offsets : memref<108xi64>, memref<5xi64>)
        schedule <simt> {transpose_b} : memref<108x64xbf16>, memref<4x64x32xbf16> -> memref<108x32xf32>
    mk.gemm store %xt, %sb into %sh schedule <simt> {transpose_a}
        : memref<64x40xbf16>, memref<16x64xbf16> -> memref<40x16xbf16>
    mk.gemm store %x, %sb into %sh32 schedule <simt> : memref<40x64xbf16>, memref<16x64xbf16> -> memref<40x16xf32>
    // d_routed_x = d_gate W_g + d_up W_u, one accumulator.
    mk.gemm store %d_gate, %wg, %wu into %d_rx grouped(%row_expert, %offsets : memref<108xi64>, memref<5xi64>)
        concat(%d_up : memref<108x32xbf16>) schedule <simt> {transpose_b}
        : memref<108x32xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x64xbf16>
    // d_down[e] = d_y^T hidden over expert e's rows.
    mk.gemm store %d_y, %hidden into %d_wd k_groups(%offsets : memref<5xi64>) schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    // ... stopping after each expert's counted rows (the rest is padding).
    mk.gemm store %d_y, %hidden into %d_wd k_groups(%offsets : memref<5xi64>)
        k_counts(%counts : memref<4xi64>) schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    // The training forward saves the activation's inputs.
    mk.gemm swiglu %routed_x, %wg, %wu into %hidden grouped(%row_expert, %offsets : memref<108xi64>, memref<5xi64>)
        saves(%gate, %up : memref<108x32xbf16>, memref<108x32xbf16>) schedule <simt> {swiglu_limit = 7.0 : f32}
        : memref<108x64xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x32xbf16>
    mk.swiglu_grad %dh_u, %gate, %up, %hidden into %d_gate, %d_up
        routes(%row_route, %route_row, %rw, %offsets : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>)
        -> %d_rw {swiglu_limit = 7.0 : f32}
        : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>
          -> memref<108x32xbf16>, memref<108x32xbf16>, memref<40x2xf32>
    // The shared expert: no routes, no router-weight gradient.
    mk.swiglu_grad %sdh, %sg, %su, %sg into %sdg, %sdu
        : memref<40x16xf32>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16>
          -> memref<40x16xbf16>, memref<40x16xbf16>
    // The reverse dispatch: unweighted sums of each token's routed rows.
    mk.combine %d_rx, %route_row into %d_x : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    mk.combine %d_rx, %route_row shared(%x : memref<40x64xbf16>) into %d_x
        : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    gpu.return
  }
}
}

// Weight gradients added into fp32 accumulators (main_grad += dW).
// CHECK-LABEL: gpu.func @accumulate
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} k_groups(%{{[a-z0-9_]+}} : memref<5xi64>) k_counts(%{{[a-z0-9_]+}} : memref<4xi64>) schedule <simt> {accumulate, transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xf32>
gpu.module @accumulate_module {
  gpu.func @accumulate(%d_y: memref<108x64xbf16>, %hidden: memref<108x32xbf16>, %offsets: memref<5xi64>,
                       %counts: memref<4xi64>, %main_grad: memref<4x64x32xf32>) kernel {
    mk.gemm store %d_y, %hidden into %main_grad k_groups(%offsets : memref<5xi64>)
        k_counts(%counts : memref<4xi64>) schedule <simt> {accumulate, transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xf32>
    gpu.return
  }
}

// A kernel for any token count: the ops over tokens read the call's T.
// CHECK-LABEL: gpu.func @any_tokens
// CHECK: %[[T:.*]] = arith.index_cast
// CHECK: mk.check_routes %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} tokens(%[[T]]) {experts = 4 : i64}
// CHECK: mk.count_routes %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} tokens(%[[T]]) {chunk = 64 : i64}
// CHECK: mk.assign_rows {{.*}} tokens(%[[T]]) {chunk = 64 : i64}
// CHECK: mk.gemm store %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}} tokens(%[[T]]) schedule <simt>
// CHECK: mk.gemm store {{.*}} tokens(%[[T]]) schedule <simt> {transpose_a, transpose_b}
// CHECK: mk.swiglu_grad {{.*}} tokens(%[[T]]) :
// CHECK: mk.combine %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} weights(%{{[a-z0-9_]+}} : memref<40x2xf32>) into %{{[a-z0-9_]+}} tokens(%[[T]]) :
gpu.module @any_tokens_module {
  gpu.func @any_tokens(%t: i64, %top: memref<40x2xi32>, %status: memref<8xi32>, %cc: memref<2x4xi64>,
                       %offsets: memref<5xi64>, %route_row: memref<80xi64>, %row_route: memref<108xi64>,
                       %row_expert: memref<108xi64>, %sh: memref<40x16xbf16>, %sd: memref<64x16xbf16>,
                       %so: memref<40x64xbf16>, %x: memref<40x64xbf16>, %dw: memref<16x64xbf16>,
                       %sdh: memref<40x16xf32>, %rw: memref<40x2xf32>, %routed_y: memref<108x64xbf16>) kernel {
    %tokens = arith.index_cast %t : i64 to index
    mk.check_routes %top into %status tokens(%tokens) {experts = 4 : i64} : memref<40x2xi32>, memref<8xi32>
    mk.count_routes %top into %cc tokens(%tokens) {chunk = 64 : i64} : memref<40x2xi32>, memref<2x4xi64>
    mk.assign_rows %top, %offsets, %cc into %route_row, %row_route, %row_expert tokens(%tokens) {chunk = 64 : i64}
        : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<80xi64>, memref<108xi64>, memref<108xi64>
    mk.gemm store %sh, %sd into %so tokens(%tokens) schedule <simt>
        : memref<40x16xbf16>, memref<64x16xbf16> -> memref<40x64xbf16>
    mk.gemm store %sh, %x into %dw tokens(%tokens) schedule <simt> {transpose_a, transpose_b}
        : memref<40x16xbf16>, memref<40x64xbf16> -> memref<16x64xbf16>
    mk.swiglu_grad %sdh, %sh, %sh, %sh into %sh, %sh tokens(%tokens)
        : memref<40x16xf32>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16>
          -> memref<40x16xbf16>, memref<40x16xbf16>
    mk.combine %routed_y, %route_row weights(%rw : memref<40x2xf32>) into %so tokens(%tokens)
        : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    gpu.return
  }
}

// FP8: E4M3 values and f32 scales of 1 x 128 row blocks.
// CHECK-LABEL: gpu.func @fp8
// CHECK: mk.quantize_rows %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<2x40xf32>
// CHECK: mk.quantize_rows %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} tokens(%{{[a-z0-9_]+}}) : memref<42x128xbf16> -> memref<42x128xf8E4M3FN>, memref<1x44xf32>
gpu.module @fp8_kernels {
  gpu.func @fp8(%x: memref<40x256xbf16>, %q: memref<40x256xf8E4M3FN>, %s: memref<2x40xf32>,
                %h: memref<42x128xbf16>, %hq: memref<42x128xf8E4M3FN>, %hs: memref<1x44xf32>,
                %t: index) kernel {
    mk.quantize_rows %x into %q, %s : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<2x40xf32>
    mk.quantize_rows %h into %hq, %hs tokens(%t) : memref<42x128xbf16> -> memref<42x128xf8E4M3FN>, memref<1x44xf32>
    gpu.return
  }
}

// FP8 weights: E4M3 values and f32 scales of 128 x 128 blocks.
// CHECK-LABEL: gpu.func @fp8_weights
// CHECK: mk.quantize_weights %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1xf32>
// CHECK: mk.quantize_weights %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} transposed : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2xf32>
gpu.module @fp8_weight_kernels {
  gpu.func @fp8_weights(%w: memref<4x256x128xbf16>, %q: memref<4x256x128xf8E4M3FN>, %s: memref<4x2x1xf32>,
                        %qt: memref<4x128x256xf8E4M3FN>, %st: memref<4x1x2xf32>) kernel {
    mk.quantize_weights %w into %q, %s : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1xf32>
    mk.quantize_weights %w into %qt, %st transposed : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2xf32>
    gpu.return
  }
}

// FP8 columns: 128 x 1 blocks stored transposed, all rows or the plan's
// routed rows; and the weight gradient that reads them (k_groups, both
// operands' scales [K/128, S]).
// CHECK-LABEL: gpu.func @fp8_columns
// CHECK: mk.quantize_columns %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<200x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
// CHECK: mk.quantize_columns %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} routed(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<200xi64>, memref<3xi64>) : memref<200x128xbf16> -> memref<128x256xf8E4M3FN>, memref<2x128xf32>
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} k_groups(%{{.*}} : memref<3xi64>) scales(%{{.*}}, %{{.*}} : memref<2x64xf32>, memref<2x128xf32>) schedule <simt> : memref<64x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<2x64x128xf32>
// Gathered: the routed rows of the token rows %d (100 tokens, top 2)
// scaled by their router weights.
// CHECK: mk.quantize_columns %{{[a-z0-9_]+}} into %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} routed(%{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} : memref<200xi64>, memref<3xi64>) gathered(%{{[a-z0-9_]+}} : memref<100x2xf32>) : memref<100x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
gpu.module @fp8_column_kernels {
  gpu.func @fp8_columns(%x: memref<200x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<2x64xf32>,
                        %h: memref<200x128xbf16>, %hq: memref<128x256xf8E4M3FN>, %hs: memref<2x128xf32>,
                        %rr: memref<200xi64>, %off: memref<3xi64>, %dw: memref<2x64x128xf32>,
                        %d: memref<100x64xbf16>, %rw: memref<100x2xf32>) kernel {
    mk.quantize_columns %x into %q, %s : memref<200x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    mk.quantize_columns %h into %hq, %hs routed(%rr, %off : memref<200xi64>, memref<3xi64>) : memref<200x128xbf16> -> memref<128x256xf8E4M3FN>, memref<2x128xf32>
    mk.gemm store %q, %hq into %dw k_groups(%off : memref<3xi64>) scales(%s, %hs : memref<2x64xf32>, memref<2x128xf32>) schedule <simt> : memref<64x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<2x64x128xf32>
    mk.quantize_columns %d into %q, %s routed(%rr, %off : memref<200xi64>, memref<3xi64>) gathered(%rw : memref<100x2xf32>) : memref<100x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// FP8 GEMMs: E4M3 operands with their f32 block scales (a's [K/128, S],
// each B's [E, N/128, K/128], or [N/128, K/128] not grouped).
// CHECK-LABEL: gpu.func @fp8_gemm
// CHECK: mk.gemm swiglu %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} grouped(%{{.*}}, %{{.*}} : memref<256xi64>, memref<3xi64>) scales(%{{.*}}, %{{.*}}, %{{.*}} : memref<1x256xf32>, memref<2x1x1xf32>, memref<2x1x1xf32>) schedule <simt> : memref<256x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN> -> memref<256x128xbf16>
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %{{.*}} concat(%{{.*}} : memref<256x128xf8E4M3FN>) scales(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : memref<1x256xf32>, memref<1x256xf32>, memref<1x1xf32>, memref<1x1xf32>) schedule <simt> : memref<256x128xf8E4M3FN>, memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<256x128xf32>
gpu.module @fp8_gemm_kernels {
  gpu.func @fp8_gemm(%a: memref<256x128xf8E4M3FN>, %sa: memref<1x256xf32>,
                     %g: memref<2x128x128xf8E4M3FN>, %sg: memref<2x1x1xf32>,
                     %u: memref<2x128x128xf8E4M3FN>, %su: memref<2x1x1xf32>,
                     %re: memref<256xi64>, %off: memref<3xi64>, %h: memref<256x128xbf16>,
                     %d: memref<128x128xf8E4M3FN>, %sd: memref<1x1xf32>, %y: memref<256x128xf32>) kernel {
    mk.gemm swiglu %a, %g, %u into %h grouped(%re, %off : memref<256xi64>, memref<3xi64>)
        scales(%sa, %sg, %su : memref<1x256xf32>, memref<2x1x1xf32>, memref<2x1x1xf32>) schedule <simt>
        : memref<256x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN> -> memref<256x128xbf16>
    mk.gemm store %a, %d, %d into %y concat(%a : memref<256x128xf8E4M3FN>)
        scales(%sa, %sa, %sd, %sd : memref<1x256xf32>, memref<1x256xf32>, memref<1x1xf32>, memref<1x1xf32>) schedule <simt>
        : memref<256x128xf8E4M3FN>, memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<256x128xf32>
    gpu.return
  }
}

// FP8 dispatch: x's E4M3 rows and their block scales.
// CHECK-LABEL: gpu.func @fp8_gather
// CHECK: mk.gather %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} block_scales(%{{.*}} into %{{.*}} : memref<2x40xf32> -> memref<2x108xf32>) {top_k = 2 : i64} : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xf8E4M3FN>
gpu.module @fp8_gather_kernels {
  gpu.func @fp8_gather(%x: memref<40x256xf8E4M3FN>, %xs: memref<2x40xf32>, %rr: memref<108xi64>, %off: memref<5xi64>,
                       %rx: memref<108x256xf8E4M3FN>, %rs: memref<2x108xf32>) kernel {
    mk.gather %x, %rr, %off into %rx block_scales(%xs into %rs : memref<2x40xf32> -> memref<2x108xf32>) {top_k = 2 : i64}
        : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xf8E4M3FN>
    gpu.return
  }
}

