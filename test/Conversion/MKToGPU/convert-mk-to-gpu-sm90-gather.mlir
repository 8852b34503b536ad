// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" --convert-mk-to-gpu | FileCheck %s
// The default plan on sm_90a (without fuse-dispatch or copy-dispatch) is
// the same; copy-dispatch keeps the copy.
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_90a | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" | FileCheck %s --check-prefix=COPY
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true" | FileCheck %s --check-prefix=COPY
// COPY: mk.gather %arg0
// COPY: mk.gemm swiglu {{.*}}schedule <wgmma{{[^>]*}}>
// COPY-NOT: gather(
// COPY-SAME: : memref<{{[0-9]+}}x128xbf16>

// The dispatch fused into the gate/up GEMM (convert-moe-to-mk's
// fuse-dispatch): no mk.gather and no routed_x; row r of a gate/up tile is
// x[row_route[r] / top_k] (the map of x, one-row boxes, is never read on
// the device: encoding it makes the runtime check x's alignment).
// PLAN-LABEL: gpu.func @tall_forward
// PLAN-NOT: routed_x
// PLAN-SAME: {box_cols = 64 : i64, box_rows = 1 : i64, buffer = "x"
// PLAN-NOT: mk.gather
// PLAN: mk.gemm swiglu %arg0, %{{.*}}, %{{.*}} into %{{.*}} grouped({{.*}}) maps({{.*}}) gather(%[[ROWROUTE:.*]] : memref<{{[0-9]+}}xi64>) schedule <wgmma{{[^>]*}}> {gather_top_k = 2 : i64
// PLAN: mk.gemm store {{.*}}schedule <wgmma{{[^>]*}}>

// Each consumer thread computes its four chunks' places once per task:
// chunk t % 8 of rows t / 8 + 32 i, source row row_route[m0 + r] / 2 (a
// padding row copies 0 bytes: zeros), destination swizzled by hand
// (chunk ^ row % 8). Thread 0 expects B's bytes only (gate + up = 32 KiB)
// and loads gate and up by TMA; every consumer thread copies its chunks of
// A with cp.async, one group per k-tile.
// CHECK-LABEL: gpu.func @tall_forward
// CHECK: arith.divsi %{{.*}}, %c2
// CHECK: arith.select %{{.*}}, %c16{{.*}}, %c0
// CHECK: arith.xori
// CHECK-COUNT-3: arith.xori
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c32768
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<128x64xbf16
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<128x64xbf16
// CHECK-NOT: memref<1x64xbf16
// CHECK-COUNT-4: nvvm.cp.async.shared.global %{{.*}}, %{{.*}}, 16, cache = cg, %{{.*}} : !llvm.ptr<3>, !llvm.ptr<1>, i32
// CHECK: nvvm.cp.async.commit.group
// K = 128: two k-tiles, both in the prologue (the first task's before the
// task loop); at each task's start, k-tile 0's rows before the MMA layer.
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for
// CHECK: nvvm.cp.async.wait.group 1
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// In the k-loop: k-tile kt+1's rows waited for (here no later group may
// stay pending) before the consumers' barrier, then thread 0's B boxes and
// every thread's chunks of the refill, committed (empty or not).
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK-NOT: nvvm.barrier
// CHECK: nvvm.cp.async.wait.group 0
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c32768
// CHECK-COUNT-4: nvvm.cp.async.shared.global
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// Then the next task's prologue (B boxes, rows), before the epilogue.
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c32768
// CHECK-COUNT-4: nvvm.cp.async.shared.global
// CHECK: nvvm.cp.async.commit.group
// CHECK: llvm.bitcast %{{.*}} : vector<2xbf16> to i32
// CHECK: nvvm.stmatrix %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eltType = #nvvm.ld_st_matrix_elt_type<b16>, layout = #nvvm.mma_layout<row>, shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>} : !llvm.ptr<3>, i32, i32, i32, i32
// CHECK: nvvm.bar.warp.sync
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r"

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 4, ep = 1, padding = 128>
func.func @tall(%x: tensor<64x128xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                %wg: tensor<4x128x128xbf16>, %wu: tensor<4x128x128xbf16>, %wd: tensor<4x128x128xbf16>)
    -> tensor<64x128xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x128xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x128xbf16>,
         tensor<4x128x128xbf16>, tensor<4x128x128xbf16>) -> tensor<64x128xbf16>
  return %o : tensor<64x128xbf16>
}

// K = 384: six k-tiles, more than the four stages. At a task's start the
// consumers wait for k-tile 0's group with the three later prologue groups
// pending; in the k-loop for k-tile kt+1's with one group (kt+2's) pending;
// the refill's group is committed whether or not the refill ran (outside
// its scf.if), so the count holds at the last k-tiles. Chunk t % 8 goes
// to the swizzled place chunk ^ (row % 8). The first task's prologue runs
// before the task loop if the CTA has a task; the next task's (k-tiles
// numbered from it + 6) after a task's MMAs if there is one.
// CHECK-LABEL: gpu.func @deep_forward
// CHECK: %[[HAS:.*]] = arith.cmpi slt, %block_id_x{{[_0-9]*}}, %{{.*}} : index
// CHECK-NEXT: scf.if %[[HAS]] {
// CHECK: %[[CHUNK:.*]] = arith.remsi %thread_id_x{{[_0-9]*}}, %c8{{[_0-9]*}} : index
// CHECK: %[[ROW8:.*]] = arith.remsi %{{.*}}, %c8{{[_0-9]*}} : index
// CHECK-NEXT: arith.xori %[[CHUNK]], %[[ROW8]] : index
// CHECK: scf.for
// CHECK: nvvm.cp.async.wait.group 3
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: nvvm.cp.async.wait.group 1
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK-COUNT-4: nvvm.cp.async.shared.global
// CHECK-NEXT: }
// CHECK-NEXT: nvvm.cp.async.commit.group
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK-NEXT: %[[NEXT:.*]] = arith.addi %{{.*}}, %grid_dim_x{{[_0-9]*}} : index
// CHECK-NEXT: %[[MORE:.*]] = arith.cmpi slt, %[[NEXT]], %{{.*}} : index
// CHECK-NEXT: scf.if %[[MORE]] {
// CHECK: arith.addi %{{.*}}, %c6{{[_0-9]*}} : index
// CHECK: nvgpu.mbarrier.arrive.expect_tx
func.func @deep(%x: tensor<64x384xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                %wg: tensor<4x128x384xbf16>, %wu: tensor<4x128x384xbf16>, %wd: tensor<4x384x128xbf16>)
    -> tensor<64x384xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x384xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x384xbf16>,
         tensor<4x128x384xbf16>, tensor<4x384x128xbf16>) -> tensor<64x384xbf16>
  return %o : tensor<64x384xbf16>
}
