// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_90a | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_90a --convert-mk-to-gpu | FileCheck %s
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk=chip=sm_90a --convert-mk-to-gpu | FileCheck %s --check-prefix=BWD

// Padding rows. The planner gives the routed down projections the
// row_route buffer (padding rows are its negative entries); a 128-row
// tile's second warpgroup whose 64 rows are all padding (its first row is:
// padding ends each expert's segment) runs the k-loop without MMAs -- still
// at every consumer barrier and refill -- and stores nothing. The wide
// gate/up GEMM computes every row (a second k-loop slowed it on the H200).
// PLAN: mk.fill %[[ROWR:[^,]*]], -1 : memref<636xi64>
// PLAN: mk.gemm swiglu
// PLAN-NOT: padding
// PLAN-SAME: schedule <wgmma, tile = [128, 128, 64], stages = 4>
// PLAN-NEXT: mk.grid_barrier
// PLAN-NEXT: mk.gemm store {{.*}} padding(%[[ROWR]] : memref<636xi64>) schedule <wgmma, tile = [128, 256, 64], stages = 4>

// Gate/up: one k-loop, no padding test.
// CHECK: gpu.func @tall_forward(
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 256, k = 16>
// CHECK-NOT: arith.ori {{.*}} : i1
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-NOT: scf.if {{.*}} -> (!llvm.struct<(f32
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK-NEXT: gpu.barrier

// Down (after the grid barrier): the warpgroup's first row, m0 + 64 *
// warpgroup, decides.
// CHECK: %[[WG:.*]] = arith.divsi %thread_id_x{{[_0-9]*}}, %c128{{[_0-9]*}} : index
// CHECK-NEXT: %c64{{[_0-9]*}} = arith.constant 64 : index
// CHECK-NEXT: %[[HALF:.*]] = arith.muli %[[WG]], %c64{{[_0-9]*}} : index
// CHECK-NEXT: %[[ROW:.*]] = arith.addi %{{.*}}, %[[HALF]] : index
// CHECK: %[[R:.*]] = memref.load %{{.*}}[%[[ROW]]] {alignment = 8 : i64} : memref<636xi64>
// CHECK-NEXT: %[[RI:.*]] = arith.index_cast %[[R]] : i64 to index
// CHECK-NEXT: %[[REAL:.*]] = arith.cmpi sge, %[[RI]], %c0{{[_0-9]*}} : index
// CHECK: %[[FIRST:.*]] = arith.cmpi eq, %[[WG]], %c0{{[_0-9]*}} : index
// CHECK-NEXT: %[[LIVE:.*]] = arith.ori %[[FIRST]], %[[REAL]] : i1
// CHECK-NEXT: scf.if %[[LIVE]] -> (!llvm.struct<(f32
// CHECK-NEXT: llvm.mlir.zero
// CHECK: scf.for
// CHECK: nvgpu.mbarrier.try_wait.parity
// CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 256, k = 16>
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// The two warpgroups' loops reach their barriers at different
// instructions: barrier.sync without .aligned (bar.sync would require the
// same instruction in every thread).
// CHECK-NOT: nvvm.barrier id
// CHECK: llvm.inline_asm has_side_effects "barrier.sync 1, 256;", "~{memory}"
// CHECK: nvgpu.mbarrier.arrive.expect_tx
// The other branch: the same loop without the wait for the stage and
// without MMAs (undefined accumulators, never stored).
// CHECK: } else {
// CHECK-NEXT: llvm.mlir.undef
// CHECK-NOT: nvvm.wgmma
// CHECK-NOT: nvgpu.mbarrier.try_wait
// CHECK: scf.for
// CHECK-NOT: nvvm.wgmma
// CHECK-NOT: nvgpu.mbarrier.try_wait
// CHECK-NOT: nvvm.barrier id
// CHECK: llvm.inline_asm has_side_effects "barrier.sync 1, 256;", "~{memory}"
// CHECK-NOT: nvvm.wgmma
// CHECK-NOT: nvgpu.mbarrier.try_wait
// CHECK: nvgpu.mbarrier.arrive.expect_tx
// CHECK-NOT: nvvm.wgmma
// CHECK: scf.yield %arg{{[0-9]+}} : !llvm.struct
// CHECK-NOT: nvvm.wgmma
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// Both warpgroups synchronize and start the next task's loads; only then
// does the live/dead split return, for the stores.
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK: nvgpu.mbarrier.arrive.expect_tx
// CHECK: scf.if %[[LIVE]] {
// CHECK: llvm.bitcast %{{.*}} : vector<2xbf16> to i32
// CHECK: nvvm.stmatrix %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eltType = #nvvm.ld_st_matrix_elt_type<b16>, layout = #nvvm.mma_layout<row>, shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>} : !llvm.ptr<3>, i32, i32, i32, i32
// CHECK: nvvm.bar.warp.sync
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r"
// The backward: the down dgrad skips all-padding halves; the weight
// gradients (M-major A, K over an expert's rows) have no padding rows to
// skip, and the gate/up dgrad computes every row (the second k-loop slowed
// it on the H200).
// BWD-LABEL: gpu.func @tall_backward_backward(
// BWD: arith.ori %{{.*}}, %{{.*}} : i1
// BWD-NEXT: scf.if %{{.*}} -> (!llvm.struct<(f32
// The down dgrad's fp32 pairs: one 8-byte streaming store each (its
// workspace is 16-byte aligned, align = 16: no scalar stores).
// The pair (row r, columns c, c + 1) at byte (r * 128 + c) * 4, its two
// accumulator elements as the words.
// BWD: %[[V0:.*]] = llvm.extractvalue %[[ACC:.*]][0] : !llvm.struct<(f32
// BWD-NEXT: %[[V1:.*]] = llvm.extractvalue %[[ACC]][1] : !llvm.struct<(f32
// BWD-NEXT: arith.constant 128 : index
// BWD-NEXT: %[[RN:.*]] = arith.muli %[[R:[^,]*]], %c128{{.*}} : index
// BWD-NEXT: %[[RC:.*]] = arith.addi %[[RN]], %[[COL:[^ ]*]] : index
// BWD-NEXT: arith.constant 4 : i64
// BWD-NEXT: %[[RC64:.*]] = arith.index_cast %[[RC]] : index to i64
// BWD-NEXT: %[[BYTES:.*]] = arith.muli %[[RC64]], %c4_i64 : i64
// BWD-NEXT: %[[ADDR:.*]] = arith.addi %{{.*}}, %[[BYTES]] : i64
// BWD: %[[W0:.*]] = llvm.bitcast %[[V0]] : f32 to i32
// BWD-NEXT: %[[W1:.*]] = llvm.bitcast %[[V1]] : f32 to i32
// BWD-NEXT: llvm.inline_asm has_side_effects "st.global.cs.v2.b32 [$0], {$1, $2};", "l,r,r" %{{.*}}, %[[W0]], %[[W1]]
// BWD-NOT: memref.store %[[V0]], %{{.*}} : memref<636x128xf32>
// BWD: nvvm.wgmma.mma_async {{.*}} A[<bf16>, <one>, <col>]
// BWD-NOT: scf.if %{{.*}} -> (!llvm.struct<(f32
// BWD: gpu.return
!plan = !moe.plan<tokens = 64, top_k = 2, experts = 4, ep = 1, padding = 128>
func.func @tall(%x: tensor<64x128xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                %wg: tensor<4x128x128xbf16>, %wu: tensor<4x128x128xbf16>, %wd: tensor<4x128x128xbf16>)
    -> tensor<64x128xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x128xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x128xbf16>,
         tensor<4x128x128xbf16>, tensor<4x128x128xbf16>) -> tensor<64x128xbf16>
  return %o : tensor<64x128xbf16>
}
