// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true" | FileCheck %s --check-prefix=PLAN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true" --convert-mk-to-gpu | FileCheck %s

// Warp-specialized GEMMs (convert-moe-to-mk's warp-specialize): the
// consumer warpgroups (one per 64 tile rows) and one producer warpgroup
// after them. With 128-row tiles the CTA has 384 threads and the GEMMs move
// registers to the consumers (224) from the producer warpgroup (56).
// PLAN-LABEL: gpu.func @tall_forward
// PLAN-SAME: known_block_size = array<i32: 384, 1, 1>
// PLAN: mk.gemm swiglu {{.*}}schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]>
// PLAN: mk.gemm store {{.*}}schedule <wgmma, tile = [128, 256, 64], stages = 4, producer, registers = [224, 56]>
// With 64-row tiles: 256 threads, nothing to move.
// PLAN-LABEL: gpu.func @short_forward
// PLAN-SAME: known_block_size = array<i32: 256, 1, 1>
// PLAN: mk.gemm swiglu {{.*}}schedule <wgmma, tile = [64, 128, 64], stages = 4, producer>

// The kernel is compiled for the even share of 384 threads (.maxnreg 168).
// CHECK-LABEL: gpu.func @tall_forward
// CHECK-SAME: nvvm.maxnreg = 168 : i32
// Full and empty barriers, one per stage; thread 0 initializes the empty
// ones for one arrival per consumer warp (8).
// CHECK: %[[FULL:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 4>
// CHECK: %[[EMPTY:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 4>
// CHECK: nvgpu.mbarrier.init %[[FULL]][%{{.*}}], %c1
// CHECK: nvgpu.mbarrier.init %[[EMPTY]][%{{.*}}], %c8
// The consumers (threads < 256): more registers, the task loop; each
// task's first k-tile apart, its first wgmma with scale-d = 0 on undefined
// accumulators; every k-tile hands the one before back (lane 0 of each
// warp; at the first k-tile of a task only the previous task's, not at the
// phase's first); the epilogue stores column pairs from registers. After
// the task loop the phase's last k-tile goes back.
// CHECK: %[[CONSUMER:.*]] = arith.cmpi ult, %{{.*}}, %c256{{.*}} : index
// CHECK: scf.if %[[CONSUMER]] -> (index)
// CHECK: nvvm.setmaxregister increase 224
// CHECK: llvm.mlir.undef : !llvm.struct
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]][
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <zero>]
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: %[[NOTFIRST:.*]] = arith.cmpi ne, %{{.*}}, %[[START:[^ ]*]] : index
// CHECK: scf.if %[[NOTFIRST]]
// CHECK: nvgpu.mbarrier.arrive %[[EMPTY]][
// CHECK: scf.for
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]][
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: nvgpu.mbarrier.arrive %[[EMPTY]][
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-NOT: memref.store {{.*}}#gpu.address_space<workgroup>
// Under the consumers' 224 registers the sigmoid is exact (the fast
// math's branch-free epilogue spilled).
// CHECK: math.exp %{{[^ ]*}} : f32
// CHECK: arith.addf
// CHECK-NOT: math.exp
// CHECK: arith.divf %{{[^ ]*}}, %{{[^ ]*}} : f32
// CHECK: llvm.bitcast %{{.*}} : vector<2xbf16> to i32
// CHECK: nvvm.stmatrix %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eltType = #nvvm.ld_st_matrix_elt_type<b16>, layout = #nvvm.mma_layout<row>, shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>} : !llvm.ptr<3>, i32, i32, i32, i32
// CHECK: nvvm.bar.warp.sync
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r"
// CHECK: %[[DONE:.*]] = arith.cmpi ne, %{{.*}}, %[[START]] : index
// CHECK: scf.if %[[DONE]]
// CHECK: nvgpu.mbarrier.arrive %[[EMPTY]][
// Back to the even share, and a signal to the producer warpgroup.
// CHECK: nvvm.setmaxregister decrease 168
// CHECK: nvvm.barrier.arrive id = %{{.*}} number_of_threads = %{{.*}}
// The producer warpgroup: fewer registers; its first thread (256) loads
// every k-tile of the same tasks once the consumers released its stage;
// then all its warps wait for the consumers' decrease before increasing.
// CHECK: } else {
// CHECK: nvvm.setmaxregister decrease 56
// CHECK: %[[PRODUCER:.*]] = arith.cmpi eq, %{{.*}}, %c256{{.*}} : index
// CHECK: scf.if %[[PRODUCER]] -> (index)
// CHECK: scf.for
// CHECK: scf.for
// CHECK: nvgpu.mbarrier.try_wait.parity %[[EMPTY]][
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[FULL]][
// CHECK: nvgpu.tma.async.load
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %{{.*}}
// CHECK-NEXT: nvvm.setmaxregister increase 168
// The down GEMM: the same roles, 256-column tiles.
// CHECK: nvvm.setmaxregister increase 224
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <zero>]
// CHECK-LABEL: gpu.func @short_forward
// CHECK-NOT: nvvm.maxnreg
// CHECK-NOT: nvvm.setmaxregister
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

!plan64 = !moe.plan<tokens = 64, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @short(%x: tensor<64x128xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                 %wg: tensor<4x128x128xbf16>, %wu: tensor<4x128x128xbf16>, %wd: tensor<4x128x128xbf16>)
    -> tensor<64x128xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan64
      : (tensor<64x128xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x128xbf16>,
         tensor<4x128x128xbf16>, tensor<4x128x128xbf16>) -> tensor<64x128xbf16>
  return %o : tensor<64x128xbf16>
}

// Hand-written schedule: two register-moving GEMMs with another step (not a
// grid barrier) between them. A CTA barrier ends the first GEMM, after the
// producer warpgroup's increase, before the consumers' next increase.
// RUN: mok-opt %s --split-input-file --convert-mk-to-gpu 2>&1 | FileCheck %s --check-prefix=BETWEEN
// BETWEEN-LABEL: gpu.func @between
// BETWEEN: nvvm.setmaxregister increase 224
// BETWEEN: nvvm.setmaxregister decrease 168
// BETWEEN: nvvm.setmaxregister increase 168
// BETWEEN: gpu.barrier
// BETWEEN: nvvm.setmaxregister increase 224
// -----
gpu.module @k {
  gpu.func @between(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>,
                    %o2: memref<128x128xbf16>, %f: memref<8xi64>, %m: memref<64xi64>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<64xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    mk.fill %f, 0 : memref<8xi64>
    mk.gemm store %a, %b into %o2 maps(%m : memref<64xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]> {maps = array<i64: 2, 3>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}
