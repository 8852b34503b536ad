// RUN: mok-opt %s --convert-mk-to-gpu | FileCheck %s
// RUN: mok-opt %S/../MoEToMK/convert-moe-to-mk.mlir --convert-moe-to-mk="chip=sm_90a barrier-timeout-ms=250" | FileCheck %s --check-prefix=PLAN

// The kernel's report to the runtime (`status`, host memory): expert ids
// outside [-1, E) and grid barriers whose bounded wait timed out.

// mk.check_routes: one thread a route; an id that is neither -1 nor below
// E (unsigned: the negative ids too) stores the id, the route and the flag.
// CHECK-LABEL: gpu.func @report(
// CHECK-SAME: %[[TOP:[^:]*]]: memref<40x2xi32>, %[[ST:[^:]*]]: memref<8xi32>, %[[BAR:[^:]*]]: memref<2xi32>)
// CHECK: scf.for %[[Q:.*]] = %{{.*}} to %c80 step
// CHECK: %[[ID32:.*]] = memref.load %[[TOP]]
// CHECK-NEXT: %[[ID:.*]] = arith.index_cast %[[ID32]] : i32 to index
// CHECK: %[[HIGH:.*]] = arith.cmpi uge, %[[ID]], %c4 : index
// CHECK: %[[SOME:.*]] = arith.cmpi ne, %[[ID]], %c-1 : index
// CHECK-NEXT: %[[BAD:.*]] = arith.andi %[[SOME]], %[[HIGH]] : i1
// CHECK-NEXT: scf.if %[[BAD]] {
// CHECK: memref.store %{{.*}}, %[[ST]][%c1{{.*}}]
// CHECK: memref.store %{{.*}}, %[[ST]][%c2{{.*}}]
// CHECK: memref.store %c1_i32, %[[ST]][%c0{{.*}}]
// The bounded barrier: the spin also ends when status[3] is set (read
// volatile: another CTA gave up) or after timeout_ns of %globaltimer; a CTA
// that left with the generation unchanged records the barrier (index 3 + 1
// = 4), the CTAs arrived, the grid and itself, unless one did already.
// CHECK: %[[START:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK: %[[STUCK:.*]] = scf.while
// CHECK: %[[SAME:.*]] = arith.cmpi eq
// CHECK: llvm.load volatile %{{.*}} : !llvm.ptr<1> -> i32
// CHECK: %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK-NEXT: %[[WAITED:.*]] = arith.subi %[[NOW]], %[[START]] : i64
// CHECK-NEXT: %c200000000_i64 = arith.constant 200000000 : i64
// CHECK-NEXT: arith.cmpi slt, %[[WAITED]], %c200000000_i64 : i64
// CHECK: scf.condition(%{{.*}}) %[[SAME]] : i1
// CHECK: llvm.load volatile
// CHECK: %[[RECORD:.*]] = arith.andi %[[STUCK]], %{{.*}} : i1
// CHECK-NEXT: scf.if %[[RECORD]] {
// CHECK: llvm.store volatile
// CHECK: llvm.store volatile
// CHECK: gpu.block_id x
// CHECK: llvm.store volatile
// CHECK: %c4_i32 = arith.constant 4 : i32
// CHECK: llvm.store volatile %c4_i32
// CHECK: gpu.return
module attributes {gpu.container_module} {
gpu.module @k {
  gpu.func @report(%top: memref<40x2xi32>, %s: memref<8xi32>, %b: memref<2xi32>) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.check_routes %top into %s {experts = 4 : i64} : memref<40x2xi32>, memref<8xi32>
    mk.grid_barrier %b status(%s : memref<8xi32>) {index = 3 : i64, timeout_ns = 200000000 : i64} : memref<2xi32>
    gpu.return
  }
}
}

// convert-moe-to-mk with barrier-timeout-ms: every grid barrier bounded,
// numbered in schedule order, reporting into the kernel's status.
// PLAN-LABEL: gpu.func @eligible_forward(
// PLAN: mk.check_routes %{{.*}} into %[[ST:[a-z0-9_]+]] {experts = 4 : i64}
// PLAN: mk.grid_barrier %[[BAR:[a-z0-9_]+]] status(%[[ST]] : memref<8xi32>) {index = 0 : i64, timeout_ns = 250000000 : i64}
// PLAN: mk.grid_barrier %[[BAR]] status(%[[ST]] : memref<8xi32>) {index = 1 : i64, timeout_ns = 250000000 : i64}
// PLAN-NOT: mk.grid_barrier %[[BAR]] :
