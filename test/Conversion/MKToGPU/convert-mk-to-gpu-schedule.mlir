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
// CHECK-NEXT: memref.store %{{.*}}, %[[C]][%[[I]]] : memref<4xi64>
// mk.grid_barrier.
// CHECK: gpu.barrier
// CHECK: llvm.fence acq_rel
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
// CHECK: memref.store %[[NOW]], %[[CLOCK]][%{{.*}}] : memref<2xi64>
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
