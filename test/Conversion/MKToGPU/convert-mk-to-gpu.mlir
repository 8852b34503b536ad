// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_90a --convert-mk-to-gpu | FileCheck %s

// One persistent kernel per layer, in a gpu.module: bare buffers for the
// inputs, the output and the workspace, described for the runtime.
// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @layer_kernels
// CHECK: gpu.func @layer_forward(%{{[^:]*}}: memref<40x64xbf16>, %{{[^:]*}}: memref<40x2xi32>, %{{[^:]*}}: memref<40x2xf32>, %{{[^:]*}}: memref<4x32x64xbf16>, %{{[^:]*}}: memref<4x32x64xbf16>, %{{[^:]*}}: memref<4x64x32xbf16>, %{{[^:]*}}: memref<16x64xbf16>, %{{[^:]*}}: memref<16x64xbf16>, %{{[^:]*}}: memref<64x16xbf16>, %{{[^:]*}}: memref<40x64xbf16>,
// The routed capacity is T*k + E*(padding-1) = 80 + 4*7 = 108 rows.
// CHECK-SAME: memref<108x64xbf16>
// CHECK-SAME: %[[BAR:[^:]*]]: memref<2xi32>, %[[STATUS:[^:]*]]: memref<8xi32>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK-SAME: mok.kernel = {block = 256 : i64, chip = "sm_90a", cooperative = true
// CHECK-SAME: {align = 16 : i64, dtype = "i32", name = "grid_barrier", role = "workspace", shape = array<i64: 2>}, {dtype = "i32", name = "status", role = "status", shape = array<i64: 8>}]
// CHECK-SAME: routed_capacity = 108 : i64, zero_before_first_launch = ["grid_barrier"]
// The routing plan in kernels of whole warps (80 routes, chunks of 32).
// Count: one warp a chunk zeroes the chunk's row, then per round of 32
// routes match.sync groups the lanes by expert, and after a warp barrier
// each group's first lane (no lower peer) adds the group's size.
// CHECK: scf.for %[[C:[^ ]*]] = %{{.*}} to %c3{{.*}} step
// CHECK: memref.store %c0_i64, %[[CC:arg[0-9]+]][%[[C]], %{{.*}}] {{.*}} : memref<3x4xi64>
// CHECK: %[[PEERS:.*]] = nvvm.match.sync any %c-1_i32, %{{.*}} : i32 -> i32
// CHECK: %[[LT:.*]] = nvvm.read.ptx.sreg.lanemask.lt : i32
// CHECK: %[[BELOW:.*]] = arith.andi %[[PEERS]], %[[LT]] : i32
// CHECK: %[[NOLOWER:.*]] = arith.cmpi eq, %[[BELOW]], %c0_i32
// CHECK: %[[VALIDEX:.*]] = arith.cmpi sge, %[[EX:[^,]*]], %c0
// CHECK: %[[LEADER:.*]] = arith.andi %[[VALIDEX]], %[[NOLOWER]] : i1
// CHECK: nvvm.bar.warp.sync %c-1_i32
// CHECK-NEXT: scf.if %[[LEADER]] {
// CHECK-NEXT: %[[SIZE:.*]] = llvm.intr.ctpop(%[[PEERS]])
// CHECK-NEXT: %[[SIZE64:.*]] = arith.extui %[[SIZE]] : i32 to i64
// CHECK-NEXT: %[[OLD:.*]] = memref.load %[[CC]][%[[C]], %[[EX]]]
// CHECK-NEXT: %[[NEW:.*]] = arith.addi %[[OLD]], %[[SIZE64]] : i64
// CHECK-NEXT: memref.store %[[NEW]], %[[CC]][%[[C]], %[[EX]]]
// Phases are separated by grid barriers (CTA barrier, fence, arrival on
// the counter).
// CHECK: gpu.barrier
// CHECK: llvm.fence syncscope("device") acq_rel
// CHECK: memref.atomic_rmw addi {{.*}} %[[BAR]]
// The scan of the chunk counts: one warp an expert, each lane's sum over
// its chunks scanned across the lanes by shuffles (an i64 as two i32
// halves, 5 steps); the lane's one group of loads is reused by the pass
// that writes the exclusive prefixes (no second loop), the total from
// lane 31.
// CHECK: gpu.thread_id x
// CHECK: scf.for
// CHECK-NOT: scf.for
// CHECK-COUNT-10: gpu.shuffle up
// CHECK-NOT: memref.load
// CHECK: %[[START:.*]] = arith.subi %[[INCL:.*]], %[[LOCAL:.*]] : i64
// CHECK-NOT: scf.for
// CHECK-NOT: memref.load
// CHECK: memref.store %[[START]], %[[CC]]
// CHECK-COUNT-2: gpu.shuffle idx
// Offsets: the grid's first warp, a shuffle scan of the padded counts.
// CHECK: %[[FIRST:.*]] = arith.cmpi slt, %{{.*}}, %c32{{.*}} : index
// CHECK: scf.if %[[FIRST]]
// CHECK: arith.divsi %{{.*}}, %c8
// CHECK-COUNT-10: gpu.shuffle up
// CHECK: %[[TOTAL:.*]] = arith.addi %{{.*}}, %{{.*}} : i64
// CHECK-NEXT: %[[OFFSTART:.*]] = arith.subi %[[TOTAL]], %{{.*}} : i64
// CHECK: memref.store %[[OFFSTART]], %[[OFF:arg[0-9]+]][%{{.*}}] {{.*}} : memref<5xi64>
// The total from lane 31 (the inclusive sum of every lane's experts).
// CHECK: %[[LAST:.*]] = arith.cmpi eq, %{{.*}}, %c31 : index
// CHECK-NEXT: scf.if %[[LAST]] {
// CHECK-NEXT: arith.constant 4 : index
// CHECK-NEXT: memref.store %[[TOTAL]], %[[OFF]][%c4{{.*}}] {{.*}} : memref<5xi64>
// Assign: one warp a chunk; a route's row is its expert's offset plus the
// chunk's scanned count plus its peers on lower lanes.
// CHECK: %[[PEERS2:.*]] = nvvm.match.sync any
// CHECK: %[[LT2:.*]] = nvvm.read.ptx.sreg.lanemask.lt
// CHECK: %[[BELOW2:.*]] = arith.andi %[[PEERS2]], %[[LT2]]
// CHECK: %[[RANK:.*]] = llvm.intr.ctpop(%[[BELOW2]])
// CHECK: %[[RANK64:.*]] = arith.extui %[[RANK]]
// CHECK: %[[START:.*]] = memref.load %[[CC]]
// CHECK: %[[BASE:.*]] = memref.load %[[OFF]]
// CHECK: %[[SUM:.*]] = arith.addi %[[BASE]], %[[START]]
// CHECK: %[[ROW:.*]] = arith.addi %[[SUM]], %[[RANK64]]
// CHECK: memref.store %[[ROW]], %{{.*}} : memref<80xi64>
// CHECK: memref.store %{{.*}}, %{{.*}} : memref<108xi64>
// CHECK: } else {
// CHECK: memref.store %c-1_i64{{.*}} : memref<80xi64>
// One warp an expert labels its rows, lane-strided.
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c32
// CHECK: memref.store %{{.*}} : memref<108xi64>
// The gather (H = 64: 8 pieces of 16 bytes a row) copies a whole row a
// thread (up to 16 pieces: the most that divides the row's), loads first,
// when x and routed_x are 16-byte aligned, else element by element; a
// padding row stores zeros (selected, not branched).
// CHECK: %[[LOW:.*]] = arith.andi %{{.*}}, %c15_i64 : i64
// CHECK: %[[ALIGNED:.*]] = arith.cmpi eq, %[[LOW]]
// CHECK: scf.if %[[ALIGNED]] {
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK-COUNT-8: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};"
// CHECK: } else {
// CHECK: memref.store {{.*}} : memref<108x64xbf16>
// The activation, as on the CPU.
// CHECK: math.exp
// The combine: 8 columns of a token an item, four items a thread at once,
// straight-line over the k = 2 routes: every item's routed rows' 16-byte
// loads and the shared output's first, then per item f32 accumulation with
// selects for routes without a row and one 16-byte store.
// CHECK: arith.muli %{{.*}}, %c4
// CHECK-COUNT-12: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: llvm.store
// CHECK-COUNT-8: llvm.extractelement
// CHECK: arith.select
// CHECK: arith.addf
// CHECK-COUNT-8: llvm.insertelement
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// CHECK: gpu.return
!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 8>
func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>,
                 %sg: tensor<16x64xbf16>, %su: tensor<16x64xbf16>, %sd: tensor<64x16xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      {swiglu_limit = 7.0 : f32}
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x32x64xbf16>,
         tensor<4x32x64xbf16>, tensor<4x64x32xbf16>, tensor<16x64xbf16>, tensor<16x64xbf16>,
         tensor<64x16xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
