// RUN: mok-opt %s | FileCheck %s
// RUN: mok-opt %s | mok-opt | FileCheck %s
// RUN: mok-opt %s --mlir-print-op-generic | mok-opt | FileCheck %s

// The expert-parallel exchange ops round-trip, in the custom and the generic
// form: one rank of 4, 16 experts (4 a rank), T = 40, k = 2, H = 64, a
// receive capacity of 160 routes; its regions are views of the symmetric
// buffer.

// CHECK-LABEL: gpu.func @exchange
// CHECK: mk.route_ranks %{{.*}} into %{{.*}}, %{{.*}} {ep = 4 : i64, experts = 16 : i64} : memref<40x2xi32>, memref<40x4xi32>, memref<80xi64>
// CHECK: mk.put_counts %{{.*}}, %{{.*}} into %[[M:.*]] peers(%[[P:.*]] : memref<4xi64>) rank(%[[R:.*]]) : memref<4xi64>, memref<16xi64>, memref<4x8xi64>
// CHECK: mk.signal %[[F:.*]][0] peers(%[[P]] : memref<4xi64>) rank(%[[R]]) epoch(%[[E:.*]]) : memref<3x4xi64>
// CHECK: mk.wait %[[F]][0] epoch(%[[E]]) : memref<3x4xi64>
// CHECK: mk.wait %[[F]][0] epoch(%[[E]]) status(%{{.*}} : memref<8xi32>) {report = 3 : i64, timeout_ns = 1000 : i64} : memref<3x4xi64>
// CHECK: mk.check_capacity %[[M]] into %{{.*}}, %[[V:.*]] {capacity = 160 : i64} : memref<4x8xi64>, memref<8xi32>, memref<1xi64>
// CHECK: mk.send_rows %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[M]], %[[V]] into %{{.*}}, %{{.*}}, %{{.*}} peers(%[[P]] : memref<4xi64>) rank(%[[R]]) tokens(%{{.*}}) {local_experts = 4 : i64} : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>, memref<4x8xi64>, memref<1xi64> -> memref<160x64xbf16>, memref<160xi64>, memref<160x2xi32>
// CHECK: mk.fence_peers
// CHECK: %{{.*}} = mk.received_rows %[[M]], %[[V]] rank(%[[R]]) : memref<4x8xi64>, memref<1xi64>
// CHECK: mk.return_rows %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} peers(%[[P]] : memref<4xi64>) {top_k = 2 : i64} : memref<172x64xbf16>, memref<172xi64>, memref<5xi64>, memref<160xi64> -> memref<80x64xbf16>

gpu.module @k {
  gpu.func @exchange(%x: memref<40x64xbf16>, %top: memref<40x2xi32>,
                     %ranks: memref<40x4xi32>, %route_row: memref<80xi64>,
                     %rows: memref<4xi64>, %routes: memref<16xi64>,
                     %send_route: memref<160xi64>, %send_offsets: memref<5xi64>,
                     %status: memref<8xi32>, %verdict: memref<1xi64>,
                     %routed_y: memref<172x64xbf16>, %row_route: memref<172xi64>,
                     %offsets: memref<5xi64>, %peers: memref<4xi64>, %rank: i32,
                     %epoch: i64, %t: index, %sym: memref<36352xi8>) kernel {
    %c0 = arith.constant 0 : index
    %c128 = arith.constant 128 : index
    %c384 = arith.constant 384 : index
    %c1792 = arith.constant 1792 : index
    %c3072 = arith.constant 3072 : index
    %c23552 = arith.constant 23552 : index
    %flags = memref.view %sym[%c0][] : memref<36352xi8> to memref<3x4xi64>
    %matrix = memref.view %sym[%c128][] : memref<36352xi8> to memref<4x8xi64>
    %origin = memref.view %sym[%c384][] : memref<36352xi8> to memref<160xi64>
    %experts = memref.view %sym[%c1792][] : memref<36352xi8> to memref<160x2xi32>
    %recv_x = memref.view %sym[%c3072][] : memref<36352xi8> to memref<160x64xbf16>
    %ret = memref.view %sym[%c23552][] : memref<36352xi8> to memref<80x64xbf16>
    mk.route_ranks %top into %ranks, %route_row {experts = 16 : i64, ep = 4 : i64}
        : memref<40x2xi32>, memref<40x4xi32>, memref<80xi64>
    mk.put_counts %rows, %routes into %matrix peers(%peers : memref<4xi64>) rank(%rank)
        : memref<4xi64>, memref<16xi64>, memref<4x8xi64>
    mk.signal %flags[0] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    mk.wait %flags[0] epoch(%epoch) : memref<3x4xi64>
    mk.wait %flags[0] epoch(%epoch) status(%status : memref<8xi32>) {report = 3 : i64, timeout_ns = 1000 : i64} : memref<3x4xi64>
    mk.check_capacity %matrix into %status, %verdict {capacity = 160 : i64}
        : memref<4x8xi64>, memref<8xi32>, memref<1xi64>
    mk.send_rows %x, %top, %send_route, %send_offsets, %matrix, %verdict
        into %recv_x, %origin, %experts peers(%peers : memref<4xi64>) rank(%rank)
        tokens(%t) {local_experts = 4 : i64}
        : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>,
          memref<4x8xi64>, memref<1xi64> -> memref<160x64xbf16>, memref<160xi64>, memref<160x2xi32>
    mk.fence_peers
    %n = mk.received_rows %matrix, %verdict rank(%rank) : memref<4x8xi64>, memref<1xi64>
    mk.return_rows %routed_y, %row_route, %offsets, %origin into %ret
        peers(%peers : memref<4xi64>) {top_k = 2 : i64}
        : memref<172x64xbf16>, memref<172xi64>, memref<5xi64>, memref<160xi64>
          -> memref<80x64xbf16>
    gpu.return
  }
}
