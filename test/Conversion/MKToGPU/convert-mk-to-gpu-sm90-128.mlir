// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" --convert-mk-to-gpu | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a multicast=true" --convert-mk-to-gpu | FileCheck %s --check-prefix=MC
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a" --convert-mk-to-gpu | FileCheck %s --check-prefix=NOMC

// Clusters of 2 (multicast=true): per-stage empty barriers in static shared
// memory (arrival count 2: this CTA and its partner), initialized before a
// cluster barrier; the CTA's rank; multicasts of one 128-row half of the
// weight box (mask 0b11: both CTAs); each consumed stage released on this
// CTA's barrier and, through mapa, on the partner's (at CTA scope).
// MC: memref.global "private" @mok_cluster_empty : memref<4xi64, #gpu.address_space<workgroup>> {alignment = 8 : i64}
// MC: %[[RANK:.*]] = nvvm.read.ptx.sreg.cluster.ctarank : i32
// MC: %[[PEER:.*]] = arith.subi %{{.*}}, %[[RANK]] : i32
// MC: nvvm.mbarrier.init %{{.*}}, %[[TWO:.*]] : !llvm.ptr<3>, i32
// MC: nvvm.fence.mbarrier.init
// MC: nvvm.cluster.arrive
// MC-NEXT: nvvm.cluster.wait
// A load first waits until both CTAs released the stage (the empty
// barrier), then expects all of B on its full barrier.
// MC: nvvm.mbarrier.try_wait.parity %{{.*}} : !llvm.ptr<3>, i32, i32
// MC-NEXT: arith.constant 32768 : index
// MC-NEXT: nvgpu.mbarrier.arrive.expect_tx
// MC: nvgpu.tma.async.load {{.*}} multicast_mask = %{{.*}} : <tensor = memref<128x64xbf16
// MC: nvvm.mbarrier.arrive %[[LOCAL:[^ ]+]] : !llvm.ptr<3> -> i64
// MC-NEXT: %[[REMOTE:.*]] = nvvm.mapa %[[LOCAL]], %[[PEER]] : !llvm.ptr<3> -> !llvm.ptr<7>
// MC-NEXT: nvvm.mbarrier.arrive %[[REMOTE]] : !llvm.ptr<7>
// After the last GEMM (and its grid barrier), the pair meets once more
// before either goes on.
// MC: nvvm.cluster.arrive
// MC-NEXT: nvvm.cluster.wait
// NOMC-NOT: {{cluster|mapa|multicast_mask}}

// Padding 128: every tensor-core GEMM on sm_90a takes 128-row tiles, both
// warpgroups of the CTA computing one 64-row half each from the same B
// boxes; the down projections take 256 columns.
// PLAN: mk.gemm swiglu {{.*}} schedule <wgmma, tile = [128, 128, 64], stages = 4>
// PLAN: mk.gemm store {{.*}} schedule <wgmma, tile = [128, 256, 64], stages = 4>
// A boxes of 128 rows.
// CHECK: gpu.func @tall_forward(
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "routed_x"
// The grid barriers order each thread's ordinary stores before later TMA
// reads (async proxy).
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK-NEXT: gpu.barrier
// Both warpgroups run the task loops (all 256 threads).
// CHECK: %[[IN:.*]] = arith.cmpi ult, %{{.*}}, %c256{{.*}} : index
// CHECK: scf.if %[[IN]] -> (index)
// Thread 0 fills the first task's first stages before the task loop:
// A (128 x 64) + gate + up (128 x 64 each) = 48 KiB a stage.
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c49152
// CHECK: scf.for
// Each warpgroup reads its half of the A box: 64 rows of 128 bytes further.
// CHECK: %[[WG:.*]] = arith.divsi %thread_id_x{{[_0-9]*}}, %c128{{.*}} : index
// CHECK: arith.muli %[[WG]], %c8192{{.*}} : index
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: %[[N256:.*]] = arith.constant 256 : i32
// CHECK-NEXT: %[[ID:.*]] = arith.constant 1 : i32
// CHECK-NEXT: nvvm.barrier id = %[[ID]] number_of_threads = %[[N256]]
// After the last wgmma group both warpgroups synchronize, thread 0 starts
// the next task's first stages, then the SwiGLU epilogue stores column
// pairs from registers (4-byte streaming stores, st.global.cs, when aligned).
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c49152
// CHECK: llvm.bitcast %{{.*}} : vector<2xbf16> to i32
// CHECK: nvvm.stmatrix %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eltType = #nvvm.ld_st_matrix_elt_type<b16>, layout = #nvvm.mma_layout<row>, shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>} : !llvm.ptr<3>, i32, i32, i32, i32
// CHECK: nvvm.bar.warp.sync
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r"
// The down GEMM: A (16 KiB) + B (256 x 64, 32 KiB); the same early start
// of the next task and register epilogue (no shared-memory tile).
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c49152
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 256, k = 16>
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c256
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c49152
// CHECK-NOT: memref<128x256xf32, #gpu.address_space<workgroup>>
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
