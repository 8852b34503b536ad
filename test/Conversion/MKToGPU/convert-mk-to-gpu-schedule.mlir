// RUN: mok-opt %s --convert-mk-to-gpu | FileCheck %s --implicit-check-not=mk.

// A hand-written schedule lowers op by op, in place: grid-stride loops over
// the elements, the barrier as CTA barriers around thread 0's arrival.

// CHECK-LABEL: gpu.func @separated(
// CHECK-SAME: %[[C:[^:]*]]: memref<4xi64>, %[[O:[^:]*]]: memref<5xi64>, %[[BAR:[^:]*]]: memref<2xi32>, %[[CLOCK:[^:]*]]: memref<2xi64>, %[[CYCLES:[^:]*]]: memref<2xi64>)
// mk.fill: thread g of the grid stores elements g, g + grid, ...
// CHECK: %[[GID:.*]] = arith.addi %{{.*}}, %thread_id_x : index
// (the CTA-first index that loops over chunks and experts use)
// CHECK: arith.muli %thread_id_x, %grid_dim_x : index
// CHECK: %[[STRIDE:.*]] = arith.muli %grid_dim_x, %block_dim_x : index
// CHECK: scf.for %[[I:.*]] = %[[GID]] to %{{.*}} step %[[STRIDE]] {
// CHECK-NEXT: memref.store %{{.*}}, %[[C]][%[[I]]] {alignment = 8 : i64} : memref<4xi64>
// mk.grid_barrier.
// CHECK: gpu.barrier
// CHECK: llvm.fence syncscope("device") acq_rel
// CHECK: memref.atomic_rmw addi {{.*}} %[[BAR]]
// CHECK: scf.while
// CHECK: gpu.barrier
// mk.pad_offsets: thread 0 of the grid scans the counts.
// CHECK: arith.cmpi eq, %[[GID]], %{{.*}} : index
// CHECK: scf.for
// CHECK: memref.load %[[C]]
// CHECK: memref.store %{{.*}}, %[[O]]
// mk.timestamp: thread 0 of the grid stores the global timer, and with
// cycles its SM's cycle counter.
// CHECK: arith.cmpi eq, %[[GID]], %{{.*}} : index
// CHECK-NEXT: scf.if
// CHECK-NEXT: %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK: memref.store %[[NOW]], %[[CLOCK]][%{{.*}}] {alignment = 8 : i64} : memref<2xi64>
// CHECK: %[[TICKS:.*]] = nvvm.read.ptx.sreg.clock64 : i64
// CHECK: memref.store %[[TICKS]], %[[CYCLES]][%{{.*}}] {alignment = 8 : i64} : memref<2xi64>
// CHECK: gpu.return
gpu.module @k {
  gpu.func @separated(%c: memref<4xi64>, %o: memref<5xi64>, %bar: memref<2xi32>, %clock: memref<2xi64>, %cycles: memref<2xi64>) kernel {
    mk.fill %c, 0 : memref<4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.pad_offsets %c into %o {padding = 8 : i64} : memref<4xi64>, memref<5xi64>
    mk.timestamp %clock[1] cycles(%cycles : memref<2xi64>) : memref<2xi64>
    gpu.return
  }
}

// mk.scan_chunks: one warp an expert in a kernel of whole warps (a known
// block size, a multiple of 32); without a known block size one thread an
// expert walks the chunks (no shuffles: partial warps would hang them).
// CHECK-LABEL: gpu.func @scan_by_warps(
// CHECK-COUNT-10: gpu.shuffle up
// CHECK-COUNT-2: gpu.shuffle idx
// CHECK: gpu.return
gpu.module @scan_warps {
  gpu.func @scan_by_warps(%cc: memref<40x4xi64>, %c: memref<4xi64>) kernel
      attributes {known_block_size = array<i32: 64, 1, 1>} {
    mk.scan_chunks %cc into %c : memref<40x4xi64>, memref<4xi64>
    gpu.return
  }
}
// CHECK-LABEL: gpu.func @scan_by_threads(
// CHECK-NOT: gpu.shuffle
// CHECK: scf.for
// CHECK: scf.for
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.return
gpu.module @scan_threads {
  gpu.func @scan_by_threads(%cc: memref<40x4xi64>, %c: memref<4xi64>) kernel {
    mk.scan_chunks %cc into %c : memref<40x4xi64>, memref<4xi64>
    gpu.return
  }
}

// The routing plan with chunks of 64 routes in a kernel of whole warps:
// one warp a chunk, two rounds of 32 routes. Count: the row zeroed, each
// round's match.sync groups added by their first lanes after a warp
// barrier. Offsets: the grid's first warp. Assign: a route's row from its
// expert's offset, the chunk's count and its lower peers; between rounds
// the group's first lane moves the count on, fenced by warp barriers on
// both sides (every lane has read it; the next round reads it after).
// The lane is %laneid (not tid % 32, which later GEMM epilogues share).
// CHECK-LABEL: gpu.func @plan_by_warps(
// CHECK: %[[LANEI:.*]] = nvvm.read.ptx.sreg.laneid : i32
// CHECK-NEXT: %[[LANE:.*]] = arith.index_cast %[[LANEI]] : i32 to index
// CHECK: scf.for %{{.*}} = %[[LANE]] to %c4{{.*}} step %c32
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %c2{{.*}} step
// CHECK: %[[CPEERS:.*]] = nvvm.match.sync any
// CHECK: %[[CBELOW:.*]] = arith.andi %[[CPEERS]], %{{.*}} : i32
// CHECK: %[[CNONE:.*]] = arith.cmpi eq, %[[CBELOW]], %c0_i32
// CHECK: %[[CLEAD:.*]] = arith.andi %{{.*}}, %[[CNONE]] : i1
// CHECK: nvvm.bar.warp.sync
// CHECK-NEXT: scf.if %[[CLEAD]] {
// CHECK-NEXT: llvm.intr.ctpop(%[[CPEERS]])
// CHECK: arith.cmpi slt, %{{.*}}, %c32{{.*}} : index
// CHECK-COUNT-10: gpu.shuffle up
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %c2{{.*}} step
// CHECK: %[[PEERS:.*]] = nvvm.match.sync any
// CHECK: %[[BELOW:.*]] = arith.andi %[[PEERS]], %{{.*}} : i32
// CHECK: %[[VALID:.*]] = arith.cmpi sge, %{{.*}}, %c0{{.*}} : index
// CHECK: llvm.intr.ctpop(%[[BELOW]])
// CHECK: memref.store %{{.*}} : memref<128xi64>
// CHECK: nvvm.bar.warp.sync
// CHECK-NEXT: arith.constant 0 : i32
// CHECK-NEXT: %[[NONE:.*]] = arith.cmpi eq, %[[BELOW]], %c0_i32
// CHECK-NEXT: %[[LEAD:.*]] = arith.andi %[[VALID]], %[[NONE]] : i1
// CHECK-NEXT: scf.if %[[LEAD]] {
// CHECK-NEXT: llvm.intr.ctpop(%[[PEERS]])
// CHECK: memref.store %{{.*}} : memref<2x4xi64>
// CHECK-NEXT: }
// CHECK-NEXT: arith.constant -1 : i32
// CHECK-NEXT: nvvm.bar.warp.sync
// CHECK: gpu.return
gpu.module @plan_warps {
  gpu.func @plan_by_warps(%top: memref<64x2xi32>, %cc: memref<2x4xi64>, %c: memref<4xi64>, %o: memref<5xi64>, %rr: memref<128xi64>, %rowr: memref<636xi64>, %rowe: memref<636xi64>, %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 64, 1, 1>} {
    mk.count_routes %top into %cc {chunk = 64 : i64} : memref<64x2xi32>, memref<2x4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.scan_chunks %cc into %c : memref<2x4xi64>, memref<4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.pad_offsets %c into %o {padding = 128 : i64} : memref<4xi64>, memref<5xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.assign_rows %top, %o, %cc into %rr, %rowr, %rowe {chunk = 64 : i64} : memref<64x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<128xi64>, memref<636xi64>, memref<636xi64>
    gpu.return
  }
}
// Without a known block size (partial warps would hang warp-wide
// operations): one thread a chunk walks its routes, thread 0 the offsets.
// CHECK-LABEL: gpu.func @plan_by_threads(
// CHECK-NOT: nvvm.match.sync
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: nvvm.bar.warp.sync
// CHECK: gpu.return
gpu.module @plan_threads {
  gpu.func @plan_by_threads(%top: memref<64x2xi32>, %cc: memref<2x4xi64>, %c: memref<4xi64>, %o: memref<5xi64>, %rr: memref<128xi64>, %rowr: memref<636xi64>, %rowe: memref<636xi64>, %bar: memref<2xi32>) kernel {
    mk.count_routes %top into %cc {chunk = 64 : i64} : memref<64x2xi32>, memref<2x4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.scan_chunks %cc into %c : memref<2x4xi64>, memref<4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.pad_offsets %c into %o {padding = 128 : i64} : memref<4xi64>, memref<5xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.assign_rows %top, %o, %cc into %rr, %rowr, %rowe {chunk = 64 : i64} : memref<64x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<128xi64>, memref<636xi64>, memref<636xi64>
    gpu.return
  }
}

// More than 32 chunks a lane (2048 chunks: 64 a lane, two groups of 32
// loads): the scan loops over the groups in both passes (a fold of the
// sums, then of the prefixes); and more than 32 experts (40: 2 a lane)
// for the offsets, each lane's experts loaded at once.
// CHECK-LABEL: gpu.func @scan_groups(
// CHECK: scf.for {{.*}} iter_args
// CHECK-COUNT-32: memref.load
// CHECK: gpu.shuffle up
// CHECK: scf.for {{.*}} iter_args
// CHECK-COUNT-32: memref.load
// CHECK: gpu.shuffle idx
// CHECK: arith.cmpi slt, %{{.*}}, %c32{{.*}} : index
// CHECK-COUNT-2: memref.load %{{.*}} : memref<40xi64>
// CHECK-NOT: memref.load
// CHECK: gpu.shuffle up
// CHECK-COUNT-2: memref.store %{{.*}} : memref<41xi64>
// CHECK: gpu.return
gpu.module @scan_groups_module {
  gpu.func @scan_groups(%cc: memref<2048x40xi64>, %c: memref<40xi64>, %o: memref<41xi64>, %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 64, 1, 1>} {
    mk.scan_chunks %cc into %c : memref<2048x40xi64>, memref<40xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.pad_offsets %c into %o {padding = 64 : i64} : memref<40xi64>, memref<41xi64>
    gpu.return
  }
}
