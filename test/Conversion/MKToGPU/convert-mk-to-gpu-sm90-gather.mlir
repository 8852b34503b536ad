// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" --convert-mk-to-gpu | FileCheck %s

// The dispatch fused into the gate/up GEMM (convert-moe-to-mk's
// fuse-dispatch): no mk.gather and no routed_x; the GEMM reads x through a
// map of one-row boxes, row r of a tile being x[row_route[r] / top_k].
// PLAN-LABEL: gpu.func @tall_forward
// PLAN-NOT: routed_x
// PLAN-SAME: {box_cols = 64 : i64, box_rows = 1 : i64, buffer = "x"
// PLAN-NOT: mk.gather
// PLAN: mk.gemm wgmma swiglu %arg0, %{{.*}}, %{{.*}} into %{{.*}} grouped({{.*}}) maps({{.*}}) gather(%[[ROWROUTE:.*]] : memref<{{[0-9]+}}xi64>) {gather_top_k = 2 : i64
// PLAN: mk.gemm wgmma store

// Each consumer thread computes its tile row's source row once per task
// (row_route[m0 + r] / 2, or row 0 for padding rows, whose results are not
// read); thread 0 expects the whole stage (A + gate + up = 48 KiB) and
// loads gate and up; threads r < 128 each load row r of A, one 1 x 64 box.
// CHECK-LABEL: gpu.func @tall_forward
// CHECK: arith.minui %{{.*}}, %c127
// CHECK: arith.divsi %{{.*}}, %c2
// CHECK: arith.select %{{.*}}, %{{.*}}, %c0
// CHECK: nvgpu.mbarrier.arrive.expect_tx %{{.*}}, %c49152
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<128x64xbf16
// CHECK: arith.cmpi ult, %{{.*}}, %c128
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<1x64xbf16, #gpu.address_space<workgroup>>
// The refill in the k-loop: thread 0's B boxes, every thread its row.
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<128x64xbf16
// CHECK: nvgpu.tma.async.load {{.*}} -> memref<1x64xbf16, #gpu.address_space<workgroup>>

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 4, ep = 1, padding = 128>
func.func @tall(%x: tensor<64x128xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                %wg: tensor<4x128x128xbf16>, %wu: tensor<4x128x128xbf16>, %wd: tensor<4x128x128xbf16>)
    -> tensor<64x128xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x128xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x128xbf16>,
         tensor<4x128x128xbf16>, tensor<4x128x128xbf16>) -> tensor<64x128xbf16>
  return %o : tensor<64x128xbf16>
}
