// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" --convert-mk-to-gpu | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a tensor-cores=false" --convert-mk-to-gpu | FileCheck %s --check-prefix=SCALAR \
// RUN:   --implicit-check-not=nvgpu. --implicit-check-not=tensor_maps --implicit-check-not=mok_dyn_smem

// On sm_90a, a layer whose shapes fit the tiles (H % 64, I % 128, I_s % 128,
// padding % 64) gets TMA + mbarrier + wgmma GEMM phases; the others and
// tensor-cores=false keep the scalar FMA phases. (The same layers on sm_100a:
// convert-mk-to-gpu-sm100.mlir.)

// The eligible layer: one extra, last parameter holding the tensor maps, 19
// slots (1+4+4+1+4 routed, 5 shared) of 128 bytes = 304 x i64; 256 threads (the first
// warpgroup computes the GEMMs: padding 64 gives 64-row tiles) and 4 stages x
// 48 KiB (room for a 128-row A box) + 1 KiB of dynamic
// shared memory.
// CHECK-LABEL: gpu.module @eligible_kernels
// CHECK: memref.global "public" @mok_dyn_smem : memref<0xi8, #gpu.address_space<workgroup>> {alignment = 1024 : i64}
// CHECK: gpu.func @eligible_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>, %[[MAPS:[^:]*]]: memref<304xi64>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK-SAME: mok.kernel = {block = 256 : i64, chip = "sm_90a", cooperative = true, dynamic_shared_memory = 214016 : i64
// The existing parameters are unchanged; tensor_maps comes last.
// CHECK-SAME: {align = 16 : i64, dtype = "i32", name = "grid_barrier", role = "workspace", shape = array<i64: 2>}, {dtype = "i32", name = "status", role = "status", shape = array<i64: 8>}, {dtype = "i64", name = "tensor_maps", role = "tensor_maps", shape = array<i64: 304>}]
// Map entry i views a kernel buffer as 2-D bf16 [rows, cols]: A operands in
// boxes of 64 rows (routed_x is [Rcap = 40*2 + 4*63 = 332, H]), B operands
// in boxes of 128 (gate, up) or 256 (down: 256-column tiles on sm_90a); a
// routed weight's entry is one map per expert (gate: 4
// maps of [I, H], down: 4 of [H, I]), 19 slots in all (1+4+4+1+4 + 5).
// CHECK-SAME: tensor_maps = [
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 64 : i64, buffer = "routed_x", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 332 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "gate_weights", cols = 64 : i64, experts = 4 : i64, row_stride = 64 : i64, rows = 128 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "up_weights", cols = 64 : i64, experts = 4 : i64, row_stride = 64 : i64, rows = 128 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 64 : i64, buffer = "hidden", cols = 128 : i64, experts = 1 : i64, row_stride = 128 : i64, rows = 332 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 256 : i64, buffer = "down_weights", cols = 128 : i64, experts = 4 : i64, row_stride = 128 : i64, rows = 64 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 64 : i64, buffer = "x", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 40 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "shared_gate_weights", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 128 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "shared_up_weights", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 128 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 64 : i64, buffer = "shared_hidden", cols = 128 : i64, experts = 1 : i64, row_stride = 128 : i64, rows = 40 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 256 : i64, buffer = "shared_down_weights", cols = 128 : i64, experts = 1 : i64, row_stride = 128 : i64, rows = 64 : i64}]
// Setup: the stage buffers in the extern shared array, one mbarrier per
// stage, slot s at byte 128*s of the tensor_maps buffer; the maps every task
// reads (A operands, the shared expert's weights) are prefetched once.
// CHECK: memref.get_global @mok_dyn_smem
// CHECK: memref.reinterpret_cast {{.*}} sizes: [214016]
// CHECK: %[[BARS:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 4>
// CHECK: %[[BASE:.*]] = memref.extract_aligned_pointer_as_index %[[MAPS]] : memref<304xi64>
// CHECK: %[[BASE64:.*]] = arith.index_cast %[[BASE]] : index to i64
// CHECK: %[[P0:.*]] = llvm.inttoptr
// CHECK: %[[RX:.*]] = builtin.unrealized_conversion_cast %[[P0]] : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<64x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
// CHECK-COUNT-6: builtin.unrealized_conversion_cast {{.*}} to !nvgpu.tensormap.descriptor
// Thread 0 initializes the barriers once per kernel.
// CHECK: scf.if
// CHECK-COUNT-4: nvgpu.mbarrier.init %[[BARS]]
// CHECK-NEXT: nvvm.fence.mbarrier.init
// CHECK-NEXT: nvgpu.tma.prefetch.descriptor %[[RX]]
// CHECK-COUNT-6: nvgpu.tma.prefetch.descriptor
// CHECK-NOT: nvgpu.tma.prefetch.descriptor
// CHECK: gpu.barrier
// The plan and the dispatch are unchanged.
// CHECK: memref.atomic_rmw addi
// Routed gate/up: the first warpgroup loops over its tasks; thread 0 fills
// the stages (A + gate + up = 8 + 16 + 16 KiB), the first task's before
// the task loop ...
// CHECK: %[[WG0:.*]] = arith.cmpi ult, %{{.*}}, %c128{{.*}} : index
// CHECK: scf.if %[[WG0]] -> (index)
// The m-tile's expert (row_expert of its first row) picks the B maps: gate
// at slot 1 + e, up at slot 5 + e.
// CHECK: %[[EX:.*]] = memref.load %{{.*}} : memref<332xi64>
// CHECK: %[[EXI:.*]] = arith.index_cast %[[EX]] : i64 to index
// CHECK: %[[TRX:.*]] = builtin.unrealized_conversion_cast {{.*}} to !nvgpu.tensormap.descriptor<tensor = memref<64x64xbf16
// CHECK: %[[C1:.*]] = arith.constant 1 : index
// CHECK: %[[GSLOT:.*]] = arith.addi %[[C1]], %[[EXI]] : index
// CHECK: %[[GSLOT64:.*]] = arith.index_cast %[[GSLOT]] : index to i64
// CHECK: %[[GOFF:.*]] = arith.muli %[[GSLOT64]], %{{.*}} : i64
// CHECK: %[[GADDR:.*]] = arith.addi %[[BASE64]], %[[GOFF]] : i64
// CHECK: %[[GPTR:.*]] = llvm.inttoptr %[[GADDR]]
// CHECK: %[[GATE:.*]] = builtin.unrealized_conversion_cast %[[GPTR]] : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<128x64xbf16
// CHECK: %[[C5:.*]] = arith.constant 5 : index
// CHECK: arith.addi %[[C5]], %[[EXI]] : index
// CHECK: %[[UP:.*]] = builtin.unrealized_conversion_cast {{.*}} to !nvgpu.tensormap.descriptor<tensor = memref<128x64xbf16
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[BARS]][%{{.*}}], %c40960
// CHECK: nvgpu.tma.async.load %[[TRX]][
// CHECK: nvgpu.tma.async.load %[[GATE]][
// CHECK: nvgpu.tma.async.load %[[UP]][
// CHECK: scf.for
// ... and the warpgroup waits for a stage, then issues the k-tile as one
// wgmma group: a fence, one m64n256k16 wgmma per k16 step over A and the
// gate and up boxes at once (adjacent in the stage: one 256-row K-major B),
// A "row", K-major B "col" (no transposition in PTX), one accumulator in
// registers (128 f32 a thread: gate's columns, then up's), one commit.
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (!llvm.struct<({{(f32, ){127}f32}})>)
// CHECK: nvgpu.mbarrier.try_wait.parity %[[BARS]][
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: nvgpu.warpgroup.generate.descriptor {{.*}} : memref<64x16xbf16, #gpu.address_space<workgroup>>
// CHECK: nvgpu.warpgroup.generate.descriptor {{.*}} : memref<16x256xbf16, #gpu.address_space<workgroup>>
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK-COUNT-3: nvvm.wgmma.mma_async
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// The previous k-tile's group is complete (this one may still run); the
// warpgroup (only) syncs on named barrier 1, then thread 0 refills the
// previous k-tile's stage.
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: %[[N128:.*]] = arith.constant 128 : i32
// CHECK-NEXT: %[[ID1:.*]] = arith.constant 1 : i32
// CHECK-NEXT: nvvm.barrier id = %[[ID1]] number_of_threads = %[[N128]]
// CHECK: nvgpu.tma.async.load
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// Once every warp's wgmmas are complete (the warpgroup's barrier), thread 0
// starts the next task's first stages; meanwhile the epilogue runs from
// registers: gate (element i) and up (element i + 64) rounded to bf16, the
// SwiGLU (clamped at 7) in f32, two adjacent columns stored as bf16 at once
// (4-byte aligned: one streaming store, st.global.cs; else one at a time).
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %c128
// CHECK: nvgpu.mbarrier.arrive.expect_tx
// CHECK: llvm.extractvalue %{{.*}}[0]
// CHECK: llvm.extractvalue %{{.*}}[1]
// CHECK: llvm.extractvalue %{{.*}}[64]
// CHECK: llvm.extractvalue %{{.*}}[65]
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: arith.extf {{.*}} : bf16 to f32
// CHECK: arith.minimumf
// A clamped SwiGLU's sigmoid is exact (in fast math, ptxas spilled in
// clamped layers; moe-to-ptx.mlir checks the fast form of an unclamped one).
// CHECK: math.exp %{{[^ ]*}} : f32
// CHECK: arith.addf
// CHECK-NOT: math.exp
// CHECK: arith.divf %{{[^ ]*}}, %{{[^ ]*}} : f32
// CHECK: llvm.bitcast %{{.*}} : vector<2xbf16> to i32
// CHECK: nvvm.stmatrix %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eltType = #nvvm.ld_st_matrix_elt_type<b16>, layout = #nvvm.mma_layout<row>, shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>} : !llvm.ptr<3>, i32, i32, i32, i32
// CHECK: nvvm.bar.warp.sync
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r"
// The outputs are 16-byte aligned (their params' align = 16, which the
// runtime enforces): no epilogue for unaligned outputs.
// CHECK-NOT: memref.store {{.*}} : memref<332x128xbf16>
// Shared gate/up (x is A: rows >= T = 40 are zero-filled by TMA and not
// stored), then a grid barrier, then the down GEMMs: 64x256 tiles, A + B =
// 8 + 32 KiB a stage, one m64n256k16 wgmma per k16 step.
// CHECK: nvgpu.tma.async.load %{{.*}}[%{{.*}}, %{{.*}}], %[[BARS]]
// CHECK-NOT: memref.store {{.*}} : memref<40x128xbf16>
// CHECK: memref.atomic_rmw addi
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[BARS]][%{{.*}}], %c40960
// CHECK: scf.for {{.*}} -> (!llvm.struct<({{(f32, ){127}f32}})>) {
// CHECK: nvvm.wgmma.mma_async {{.*}}, <m = 64, n = 256, k = 16>
// The down projections' rows leave 16 bytes at a time (aligned outputs).
// CHECK-NOT: memref.store {{.*}} : memref<332x64xbf16>
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
// CHECK-NOT: memref.store {{.*}} : memref<40x64xbf16>
// CHECK: gpu.return

// A padding of 8 does not cut expert segments into 64-row tiles: scalar.
// CHECK-LABEL: gpu.module @padding8_kernels
// CHECK-NOT: mok_dyn_smem
// CHECK: gpu.func @padding8_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK-SAME: dynamic_shared_memory = 0 : i64
// CHECK-NOT: tensor_maps
// CHECK-NOT: nvgpu.
// CHECK: gpu.return

// The same with I = 96 (not a multiple of the 128-column tile).
// CHECK-LABEL: gpu.module @inter96_kernels
// CHECK: gpu.func @inter96_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// CHECK-NOT: nvgpu.
// CHECK: gpu.return

// SCALAR: gpu.func @eligible_forward(
// SCALAR-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// SCALAR-SAME: known_block_size = array<i32: 256, 1, 1>
// SCALAR-SAME: dynamic_shared_memory = 0 : i64
// SCALAR: gpu.func @padding8_forward(
// SCALAR: gpu.func @inter96_forward(

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @eligible(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                    %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>,
                    %sg: tensor<128x64xbf16>, %su: tensor<128x64xbf16>, %sd: tensor<64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      {swiglu_limit = 7.0 : f32}
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>,
         tensor<64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}

!plan8 = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 8>
func.func @padding8(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                    %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan8
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}

func.func @inter96(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                   %wg: tensor<4x96x64xbf16>, %wu: tensor<4x96x64xbf16>, %wd: tensor<4x64x96xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x96x64xbf16>,
         tensor<4x96x64xbf16>, tensor<4x64x96xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
