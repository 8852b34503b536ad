// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true fuse-dispatch=true" | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true fuse-dispatch=true" --convert-mk-to-gpu | FileCheck %s

// Warp-specialized GEMMs with the dispatch fused (warp-specialize and
// fuse-dispatch both asked for; warp-specialize alone keeps the copy,
// convert-mk-to-gpu-sm90-gather.mlir): no mk.gather, the routed gate/up
// GEMM gathers its A rows from x and has a producer.
// PLAN-LABEL: gpu.func @tall_forward
// PLAN-SAME: known_block_size = array<i32: 384, 1, 1>
// PLAN-NOT: mk.gather
// PLAN: mk.gemm swiglu %arg0, {{.*}} gather(%{{.*}} : memref<{{[0-9]+}}xi64>) schedule <wgmma, {{.*}}, producer, registers = [224, 56]> {gather_top_k = 2 : i64
// PLAN: mk.gemm store {{.*}}schedule <wgmma, {{.*}}, producer, registers = [224, 56]>

// Three barriers a stage: full (B's bytes), empty (the consumer warps'
// releases, 8) and gather (the producer threads' copies, 128).
// CHECK-LABEL: gpu.func @tall_forward
// CHECK: %[[FULL:[0-9]+]] = nvgpu.mbarrier.create
// CHECK-NEXT: %[[EMPTY:[0-9]+]] = nvgpu.mbarrier.create
// CHECK-NEXT: %[[GATHER:[0-9]+]] = nvgpu.mbarrier.create
// CHECK: nvgpu.mbarrier.init %[[FULL]][%{{.*}}], %c1{{(_[0-9]+)?}} :
// CHECK: nvgpu.mbarrier.init %[[EMPTY]][%{{.*}}], %c8{{(_[0-9]+)?}} :
// CHECK: nvgpu.mbarrier.init %[[GATHER]][%{{.*}}], %c128{{(_[0-9]+)?}} :
// The consumers: each k-tile, the stage's full barrier and its gather
// barrier, then the proxy fence (the rows were written by the producer's
// cp.async, through the generic proxy), then the wgmmas; no cp.async of
// their own.
// CHECK: nvvm.setmaxregister increase 224
// CHECK-NOT: nvvm.cp.async.shared.global
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]]
// CHECK: nvgpu.mbarrier.try_wait.parity %[[GATHER]]
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <zero>]
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]]
// CHECK: nvgpu.mbarrier.try_wait.parity %[[GATHER]]
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.setmaxregister decrease 168
// The producer warpgroup, every thread: the stage's empty barrier, its
// eight chunks of the tile (128 rows x 8 chunks over 128 threads), then a
// cp.async.mbarrier.arrive.noinc on the stage's gather barrier (the copies'
// landing is one of its 128 arrivals; an arrival that raised the full
// barrier's pending count instead is what synccheck calls a barrier
// overflow), and the first thread's arrive.expect_tx for B's bytes (gate +
// up, 32 KiB) and its two TMA loads.
// CHECK: nvvm.setmaxregister decrease 56
// CHECK: nvgpu.mbarrier.try_wait.parity %[[EMPTY]]
// CHECK-COUNT-8: nvvm.cp.async.shared.global %{{.*}}, %{{.*}}, 16, cache = cg, %{{.*}} : !llvm.ptr<3>, !llvm.ptr<1>, i32
// CHECK: %[[BAR:.*]] = nvgpu.mbarrier.get %[[GATHER]][%{{.*}}] {{.*}} -> i32
// CHECK-NEXT: %[[PTR:.*]] = llvm.inttoptr %[[BAR]] : i32 to !llvm.ptr<3>
// CHECK-NEXT: nvvm.cp.async.mbarrier.arrive %[[PTR]] {noinc = true} : !llvm.ptr<3>
// CHECK-NOT: nvvm.barrier id = %c3_i32
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[FULL]][%{{.*}}], %c32768
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<128x64xbf16
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<128x64xbf16
// CHECK-NOT: memref<1x64xbf16
// CHECK: nvvm.barrier id = %c2_i32 number_of_threads = %c384_i32
// The down GEMM copies nothing: its producer is one thread again.
// CHECK: nvvm.setmaxregister decrease 56
// CHECK-NOT: nvvm.cp.async
// CHECK: gpu.return

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 4, ep = 1, padding = 128>
func.func @tall(%x: tensor<64x128xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                %wg: tensor<4x128x128xbf16>, %wu: tensor<4x128x128xbf16>, %wd: tensor<4x128x128xbf16>)
    -> tensor<64x128xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x128xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x128xbf16>,
         tensor<4x128x128xbf16>, tensor<4x128x128xbf16>) -> tensor<64x128xbf16>
  return %o : tensor<64x128xbf16>
}
