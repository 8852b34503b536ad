// The layers of convert-mk-to-gpu-sm90.mlir on sm_100a: the eligible one
// gets TMA + mbarrier + tcgen05 GEMM phases (accumulators in Tensor Memory),
// the other two, and tensor-cores=false, keep the scalar FMA phases.
// RUN: mok-opt %S/convert-mk-to-gpu-sm90.mlir --convert-moe-to-mk=chip=sm_100a --convert-mk-to-gpu | FileCheck %s
// RUN: mok-opt %S/convert-mk-to-gpu-sm90.mlir --convert-moe-to-mk="chip=sm_100a tensor-cores=false" --convert-mk-to-gpu | FileCheck %s --check-prefix=SCALAR \
// RUN:   --implicit-check-not=nvgpu. --implicit-check-not=tcgen05 --implicit-check-not=tensor_maps --implicit-check-not=mok_dyn_smem
//
// The kernel interface is the sm_90a one, but for the chip and the box of
// the down weights' maps (256 rows on sm_90a, whose down GEMMs take
// 256-column tiles; 128 here): same parameters (tensor_maps last), same
// block and dynamic shared memory but for sm_90a's 16 KiB of epilogue
// staging (214016 = 197632 + 16384 bytes), so the runtime does the same for
// both.
// RUN: mok-opt %S/convert-mk-to-gpu-sm90.mlir --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" --convert-mk-to-gpu | grep "gpu.func @" | sed -e 's/sm_90a/CHIP/' -e 's/box_rows = 256/box_rows = 128/g' -e 's/dynamic_shared_memory = 214016/dynamic_shared_memory = 197632/' > %t.sm90
// RUN: mok-opt %S/convert-mk-to-gpu-sm90.mlir --convert-moe-to-mk=chip=sm_100a --convert-mk-to-gpu | grep "gpu.func @" | sed -e 's/sm_100a/CHIP/' > %t.sm100
// RUN: diff %t.sm90 %t.sm100

// CHECK-LABEL: gpu.module @eligible_kernels
// The shared-memory slot tcgen05.alloc writes the TMEM address to.
// CHECK: memref.global "private" @mok_tmem_base : memref<1xi32, #gpu.address_space<workgroup>> {alignment = 4 : i64}
// CHECK: memref.global "public" @mok_dyn_smem : memref<0xi8, #gpu.address_space<workgroup>> {alignment = 1024 : i64}
// CHECK: gpu.func @eligible_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>, %[[MAPS:[^:]*]]: memref<304xi64>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK-SAME: mok.kernel = {block = 256 : i64, chip = "sm_100a", cooperative = true, dynamic_shared_memory = 197632 : i64
// CHECK-SAME: {align = 16 : i64, dtype = "i32", name = "grid_barrier", role = "workspace", shape = array<i64: 2>}, {dtype = "i32", name = "status", role = "status", shape = array<i64: 8>}, {dtype = "i64", name = "tensor_maps", role = "tensor_maps", shape = array<i64: 304>}]
// CHECK-SAME: tensor_maps = [
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 64 : i64, buffer = "routed_x", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 332 : i64}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "shared_down_weights", cols = 128 : i64, experts = 1 : i64, row_stride = 128 : i64, rows = 64 : i64}]

// The shared setup: stage buffers, one full barrier per stage, the maps.
// CHECK: memref.reinterpret_cast {{.*}} sizes: [197632]
// CHECK: %[[SMEM:.*]] = memref.extract_aligned_pointer_as_index %reinterpret_cast
// CHECK: %[[FULL:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 4>
// CHECK: memref.extract_aligned_pointer_as_index %[[MAPS]] : memref<304xi64>
// CHECK: %[[RX:.*]] = builtin.unrealized_conversion_cast {{.*}} : !llvm.ptr to !nvgpu.tensormap.descriptor<tensor = memref<64x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[T0:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK: scf.if %[[T0]]
// CHECK-COUNT-4: nvgpu.mbarrier.init %[[FULL]]
// CHECK: gpu.barrier
// The tcgen05 setup: kStages "empty" barriers and the accumulator barrier
// (index 4), initialized by thread 0; warp 0 allocates 256 TMEM columns and
// relinquishes the allocation permit; every thread reads the address after
// a CTA barrier framed by tcgen05 fences.
// CHECK: %[[SLOT:.*]] = memref.get_global @mok_tmem_base
// CHECK: %[[SLOTPTR:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr<3>
// CHECK: %[[MMA:.*]] = nvgpu.mbarrier.create -> <memorySpace = #gpu.address_space<workgroup>, num_barriers = 5>
// CHECK: scf.if %[[T0]] {
// CHECK-COUNT-5: nvgpu.mbarrier.init %[[MMA]]
// CHECK-NEXT: nvvm.fence.mbarrier.init
// CHECK: %[[W0:.*]] = arith.cmpi ult, %[[TID]], %c32 : index
// CHECK-NEXT: scf.if %[[W0]] {
// CHECK-NEXT: %[[COLS:.*]] = arith.constant 256 : i32
// CHECK-NEXT: nvvm.tcgen05.alloc %[[SLOTPTR]], %[[COLS]] : !llvm.ptr<3>, i32
// CHECK-NEXT: nvvm.tcgen05.relinquish_alloc_permit
// CHECK-NEXT: }
// CHECK-NEXT: nvvm.tcgen05.fence <before>
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: nvvm.tcgen05.fence <after>
// CHECK-NEXT: arith.constant 0 : index
// CHECK-NEXT: %[[TMEM:.*]] = memref.load %[[SLOT]][%{{.*}}] {alignment = 4 : i64} : memref<1xi32, #gpu.address_space<workgroup>>

// Routed gate/up: the first warpgroup's task loop carries the k-tile count
// and the count of finished tasks (the accumulator barrier's phase).
// CHECK: scf.if %{{.*}} -> (index, index) {
// CHECK: scf.for {{.*}} iter_args(%[[IT:.*]] = %{{.*}}, %[[DONE:.*]] = %{{.*}}) -> (index, index) {
// Prologue (thread 0): a k-tile g >= 4 waits for the empty barrier of its
// stage first, then arrive.expect_tx (A + gate + up) and three TMA loads.
// CHECK: scf.if %[[T0]] {
// CHECK: arith.cmpi sge
// CHECK: nvgpu.mbarrier.try_wait.parity %[[MMA]][
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[FULL]][%{{.*}}], %c40960
// CHECK: nvgpu.tma.async.load %{{.*}}[%{{.*}}, %{{.*}}], %[[FULL]][%{{.*}}] to %{{.*}} : <tensor = memref<64x64xbf16
// CHECK: nvgpu.tma.async.load
// CHECK: nvgpu.tma.async.load
// The MMA issuer (thread 0): per k-tile, wait for the full barrier, then
// 4 k16 steps x (gate, up) of tcgen05.mma kind f16 with shared memory
// descriptors (start >> 4, LBO 1, SBO 1024 >> 4, base offset 0, relative
// LBO, 128B swizzle = 2) and the instruction descriptor 0x04200490 (D f32,
// A/B bf16, K-major, N = 128, M = 64); the first k16 step of the task does
// not accumulate; then a commit to the stage's empty barrier. A
// tcgen05.fence::after_thread_sync orders the MMAs after the wait (and after
// the previous task's tcgen05.ld, across the warpgroup barrier).
// CHECK: scf.if %[[T0]] {
// CHECK: scf.for %[[KT:.*]] = %{{.*}} to %{{.*}} step
// CHECK: nvgpu.mbarrier.try_wait.parity %[[FULL]][
// CHECK-NEXT: nvvm.tcgen05.fence <after>
// CHECK: %[[FIRST:.*]] = arith.cmpi ne, %[[KT]], %{{.*}} : index
// CHECK: %[[A0:.*]] = arith.addi %[[SMEM]], %{{.*}} : index
// CHECK-NEXT: %[[A1:.*]] = arith.index_cast %[[A0]] : index to i32
// CHECK-NEXT: %[[C4:.*]] = arith.constant 4 : i32
// CHECK-NEXT: %[[START:.*]] = arith.shrui %[[A1]], %[[C4]] : i32
// CHECK: %[[ADESC:.*]] = nvvm.tcgen05.mma_smem_desc(%[[START]], %c1_i32{{.*}}, %c64_i32{{.*}}, %c0_i8{{.*}}, %false{{.*}}, %c2_i8{{.*}}) : (i32, i32, i32, i8, i1, i8) -> i64
// CHECK: %[[BDESC:.*]] = nvvm.tcgen05.mma_smem_desc(
// CHECK: %[[D0:.*]] = arith.addi %[[TMEM]], %c0_i32{{.*}} : i32
// CHECK: %[[D0PTR:.*]] = llvm.inttoptr %[[D0]] : i32 to !llvm.ptr<6>
// CHECK: %[[IDESC:.*]] = arith.constant 69207184 : i32
// CHECK-NEXT: nvvm.tcgen05.mma %[[D0PTR]], %[[ADESC]], %[[BDESC]], %[[IDESC]], %[[FIRST]] {ctaGroup = #nvvm.cta_group<cta_1>, kind = #nvvm.tcgen05_mma_kind<f16>} : (!llvm.ptr<6>, i64, i64, i32, i1)
// The up accumulator is 128 columns further.
// CHECK: %[[D1:.*]] = arith.addi %[[TMEM]], %c128_i32{{.*}} : i32
// CHECK: llvm.inttoptr %[[D1]] : i32 to !llvm.ptr<6>
// CHECK: nvvm.tcgen05.mma {{.*}}, %[[FIRST]] {ctaGroup = #nvvm.cta_group<cta_1>, kind = #nvvm.tcgen05_mma_kind<f16>}
// CHECK-COUNT-6: nvvm.tcgen05.mma {{.*}}, %true
// CHECK: %[[EMPTY:.*]] = nvgpu.mbarrier.get %[[MMA]][%{{.*}}] : <memorySpace = #gpu.address_space<workgroup>, num_barriers = 5> -> i32
// CHECK-NEXT: %[[EMPTYPTR:.*]] = llvm.inttoptr %[[EMPTY]] : i32 to !llvm.ptr<3>
// CHECK-NEXT: nvvm.tcgen05.commit %[[EMPTYPTR]] : !llvm.ptr<3>
// CHECK-NEXT: }
// After the last k-tile: a commit to the accumulator barrier.
// CHECK-NEXT: %[[ACC:.*]] = nvgpu.mbarrier.get %[[MMA]][%c4{{.*}}]
// CHECK-NEXT: %[[ACCPTR:.*]] = llvm.inttoptr %[[ACC]] : i32 to !llvm.ptr<3>
// CHECK-NEXT: nvvm.tcgen05.commit %[[ACCPTR]] : !llvm.ptr<3>
// CHECK-NEXT: }
// The warpgroup waits for the accumulators (phase parity = finished tasks
// % 2), then each warp reads its TMEM lanes (lane field 32 * warp) with
// tcgen05.ld 32x32b.x32 + tcgen05.wait::ld, 32 columns at a time, and the
// lanes < 16 (M = 64: rows 16 * warp + lane) store them to the fp32 tile.
// CHECK: arith.remsi %[[DONE]], %c2
// CHECK: nvgpu.mbarrier.try_wait.parity %[[MMA]][%c4
// CHECK-NEXT: nvvm.tcgen05.fence <after>
// CHECK: %[[LANE:.*]] = arith.remsi %[[TID]], %c32
// CHECK: arith.cmpi slt, %[[LANE]], %c16
// CHECK: arith.shli %{{.*}}, %c16_i32 : i32
// CHECK: memref.view {{.*}} to memref<64x128xf32, #gpu.address_space<workgroup>>
// CHECK: scf.for
// CHECK: llvm.inttoptr %{{.*}} : i32 to !llvm.ptr<6>
// CHECK-NEXT: nvvm.tcgen05.ld %{{.*}} {shape = #nvvm.tcgen05_ldst_shape<shape_32x32b>} : vector<32xi32>
// CHECK-NEXT: nvvm.tcgen05.wait <load>
// CHECK-NEXT: llvm.bitcast %{{.*}} : vector<32xi32> to vector<32xf32>
// CHECK-COUNT-32: memref.store {{.*}} : memref<64x128xf32, #gpu.address_space<workgroup>>
// CHECK: nvvm.tcgen05.ld
// CHECK: nvvm.tcgen05.fence <before>
// CHECK-NEXT: arith.constant 128 : i32
// CHECK-NEXT: arith.constant 1 : i32
// CHECK-NEXT: nvvm.barrier id
// CHECK-NEXT: arith.constant 1 : index
// CHECK-NEXT: arith.addi %[[DONE]]
// The shared epilogue, as on sm_90a: gate and up rounded to bf16, the
// SwiGLU (clamped at 7) in f32, stored as bf16.
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: arith.minimumf
// CHECK: math.exp
// CHECK: memref.store {{.*}} : memref<332x128xbf16>
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// Shared gate/up, the grid barrier, then the down GEMMs (A + B = 24 KiB a
// stage, one accumulator).
// CHECK: memref.store {{.*}} : memref<40x128xbf16>
// CHECK: memref.atomic_rmw addi
// CHECK: nvgpu.mbarrier.arrive.expect_tx %[[FULL]][%{{.*}}], %c24576
// CHECK: nvvm.tcgen05.mma
// CHECK: memref.store {{.*}} : memref<332x64xbf16>
// CHECK: memref.store {{.*}} : memref<40x64xbf16>
// After the grid barrier that ends the last GEMM phase, warp 0 frees the
// Tensor Memory; then the combine phase.
// CHECK: llvm.fence syncscope("device") acq_rel
// CHECK: nvvm.tcgen05.fence <after>
// CHECK-NEXT: scf.if %[[W0]] {
// CHECK-NEXT: %[[PTR:.*]] = llvm.inttoptr %[[TMEM]] : i32 to !llvm.ptr<6>
// CHECK-NEXT: %[[COLS2:.*]] = arith.constant 256 : i32
// CHECK-NEXT: nvvm.tcgen05.dealloc %[[PTR]], %[[COLS2]] : !llvm.ptr<6>, i32
// CHECK-NEXT: }
// CHECK-NOT: tcgen05
// CHECK: gpu.return

// The ineligible layers: scalar, no TMEM, no TMA.
// CHECK-LABEL: gpu.module @padding8_kernels
// CHECK-NOT: mok_tmem_base
// CHECK: gpu.func @padding8_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// CHECK-SAME: chip = "sm_100a"
// CHECK-SAME: dynamic_shared_memory = 0 : i64
// CHECK-NOT: tensor_maps
// CHECK-NOT: nvgpu.
// CHECK-NOT: tcgen05
// CHECK: gpu.return
// CHECK-LABEL: gpu.module @inter96_kernels
// CHECK: gpu.func @inter96_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// CHECK-NOT: nvgpu.
// CHECK-NOT: tcgen05
// CHECK: gpu.return

// SCALAR: gpu.func @eligible_forward(
// SCALAR-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// SCALAR-SAME: known_block_size = array<i32: 256, 1, 1>
// SCALAR-SAME: chip = "sm_100a"
// SCALAR-SAME: dynamic_shared_memory = 0 : i64
// SCALAR: gpu.func @padding8_forward(
// SCALAR: gpu.func @inter96_forward(
