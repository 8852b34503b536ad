// RUN: mok-opt %s --convert-mk-to-gpu | FileCheck %s

// The exchange ops' lowering: stores into a peer's copy of a region go to
// the peer table's address plus the region's offset in the symmetric
// buffer; the storing threads fence to the system scope; a signal is a
// release store at system scope of the epoch into every rank's flag, a wait
// an acquire load at system scope spinning until the flag holds it. A wait
// forgets the exchange ops' stores (what follows reads the received rows
// and the counts without a grid barrier).

// CHECK-LABEL: gpu.func @exchange
// A peer's copy of a region: the peer table's entry plus the region's
// offset (its address less the symmetric buffer's).
// CHECK: %[[REGION:.*]] = memref.extract_aligned_pointer_as_index %view
// CHECK: %[[R64:.*]] = arith.index_cast %[[REGION]] : index to i64
// CHECK: %[[BASE:.*]] = memref.extract_aligned_pointer_as_index %arg15
// CHECK: %[[B64:.*]] = arith.index_cast %[[BASE]] : index to i64
// CHECK: %[[OFF:.*]] = arith.subi %[[R64]], %[[B64]] : i64
// CHECK: %[[PEER:.*]] = memref.load %arg12[
// CHECK: arith.addi %[[PEER]], %[[OFF]] : i64
// CHECK-NOT: mk.
// CHECK: gpu.return
// Five system fences (mk.put_counts' threads, two signals, the two
// mk.fence_peers after mk.send_rows' and mk.return_rows' stores), two
// release stores and two acquire spins.
// RUN: mok-opt %s --convert-mk-to-gpu | grep -c 'llvm.fence acq_rel$' | FileCheck %s --check-prefix=FENCES
// FENCES: 5
// RUN: mok-opt %s --convert-mk-to-gpu | grep -c 'st.release.sys.global.u64' | FileCheck %s --check-prefix=TWO
// RUN: mok-opt %s --convert-mk-to-gpu | grep -c 'ld.acquire.sys.global.u64' | FileCheck %s --check-prefix=TWO
// TWO: 2

gpu.module @k {
  gpu.func @exchange(%x: memref<40x64xbf16>, %top: memref<40x2xi32>,
                     %rows: memref<4xi64>, %routes: memref<16xi64>,
                     %send_route: memref<160xi64>, %send_offsets: memref<5xi64>,
                     %status: memref<8xi32>, %verdict: memref<1xi64>,
                     %routed_y: memref<172x64xbf16>, %row_route: memref<172xi64>,
                     %offsets: memref<5xi64>, %counts: memref<10x4xi64>,
                     %peers: memref<4xi64>, %rank: i32,
                     %epoch: i64, %sym: memref<36352xi8>, %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
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
    mk.put_counts %rows, %routes into %matrix peers(%peers : memref<4xi64>) rank(%rank)
        : memref<4xi64>, memref<16xi64>, memref<4x8xi64>
    mk.signal %flags[0] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    mk.wait %flags[0] epoch(%epoch) : memref<3x4xi64>
    mk.check_capacity %matrix into %status, %verdict {capacity = 160 : i64}
        : memref<4x8xi64>, memref<8xi32>, memref<1xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.send_rows %x, %top, %send_route, %send_offsets, %matrix, %verdict
        into %recv_x, %origin, %experts peers(%peers : memref<4xi64>) rank(%rank)
        {local_experts = 4 : i64}
        : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>,
          memref<4x8xi64>, memref<1xi64> -> memref<160x64xbf16>, memref<160xi64>, memref<160x2xi32>
    mk.fence_peers
    mk.grid_barrier %bar : memref<2xi32>
    mk.signal %flags[1] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    mk.wait %flags[1] epoch(%epoch) : memref<3x4xi64>
    %n = mk.received_rows %matrix, %verdict rank(%rank) : memref<4x8xi64>, memref<1xi64>
    mk.count_routes %experts into %counts tokens(%n) {chunk = 32 : i64} : memref<160x2xi32>, memref<10x4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.return_rows %routed_y, %row_route, %offsets, %origin into %ret
        peers(%peers : memref<4xi64>) {top_k = 2 : i64}
        : memref<172x64xbf16>, memref<172xi64>, memref<5xi64>, memref<160xi64>
          -> memref<80x64xbf16>
    mk.fence_peers
    gpu.return
  }
}
