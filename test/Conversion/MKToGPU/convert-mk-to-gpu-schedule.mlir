// RUN: mok-opt %s --convert-mk-to-gpu | FileCheck %s --implicit-check-not=mk.

// A hand-written schedule lowers op by op, in place: grid-stride loops over
// the elements, the barrier as CTA barriers around thread 0's arrival.

// CHECK-LABEL: gpu.func @separated(
// CHECK-SAME: %[[C:[^:]*]]: memref<4xi64>, %[[O:[^:]*]]: memref<5xi64>, %[[BAR:[^:]*]]: memref<2xi32>, %[[CLOCK:[^:]*]]: memref<2xi64>)
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
// mk.timestamp: thread 0 of the grid stores the global timer.
// CHECK: arith.cmpi eq, %[[GID]], %{{.*}} : index
// CHECK-NEXT: scf.if
// CHECK-NEXT: %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK: memref.store %[[NOW]], %[[CLOCK]][%{{.*}}] {alignment = 8 : i64} : memref<2xi64>
// CHECK: gpu.return
gpu.module @k {
  gpu.func @separated(%c: memref<4xi64>, %o: memref<5xi64>, %bar: memref<2xi32>, %clock: memref<2xi64>) kernel {
    mk.fill %c, 0 : memref<4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    mk.pad_offsets %c into %o {padding = 8 : i64} : memref<4xi64>, memref<5xi64>
    mk.timestamp %clock[1] : memref<2xi64>
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
