// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" | FileCheck %s --check-prefixes=CHECK,SM90
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_100a | FileCheck %s --check-prefixes=CHECK,SM100
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a tensor-cores=false block-size=128" | FileCheck %s --check-prefix=SIMT
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" | mok-opt | FileCheck %s --check-prefixes=CHECK,SM90
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --convert-moe-to-mk="chip=sm_90a multicast=true" | FileCheck %s --check-prefix=MC
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --convert-moe-to-mk="chip=sm_90a" | FileCheck %s --check-prefix=NOMC

// The plan of a fused layer as one megakernel: the schedule in mk ops, the
// barriers between its phases, and per GEMM the engine, tile, stages and
// tensor-map slots; the same schedule on both chips but for the MMA engine.

// CHECK: module attributes {gpu.container_module}
// The layer function stays (the host side); the kernel is added.
// CHECK: func.func @eligible(
// CHECK: moe.layer
// CHECK-LABEL: gpu.module @eligible_kernels
// CHECK: gpu.func @eligible_forward(%[[X:[^:]*]]: memref<40x64xbf16>, %[[TOP:[^:]*]]: memref<40x2xi32>, %[[RW:[^:]*]]: memref<40x2xf32>, %[[WG:[^:]*]]: memref<4x128x64xbf16>, %[[WU:[^:]*]]: memref<4x128x64xbf16>, %[[WD:[^:]*]]: memref<4x64x128xbf16>, %[[SG:[^:]*]]: memref<128x64xbf16>, %[[SU:[^:]*]]: memref<128x64xbf16>, %[[SD:[^:]*]]: memref<64x128xbf16>, %[[OUT:[^:]*]]: memref<40x64xbf16>, %[[COUNTS:[^:]*]]: memref<4xi64>, %[[CC:[^:]*]]: memref<3x4xi64>, %[[OFF:[^:]*]]: memref<5xi64>, %[[RR:[^:]*]]: memref<80xi64>, %[[ROWR:[^:]*]]: memref<332xi64>, %[[ROWE:[^:]*]]: memref<332xi64>, %[[RX:[^:]*]]: memref<332x64xbf16>, %[[H:[^:]*]]: memref<332x128xbf16>, %[[Y:[^:]*]]: memref<332x64xbf16>, %[[SH:[^:]*]]: memref<40x128xbf16>, %[[SO:[^:]*]]: memref<40x64xbf16>, %[[BAR:[^:]*]]: memref<2xi32>, %[[STATUS:[^:]*]]: memref<8xi32>, %[[MAPS:[^:]*]]: memref<304xi64>) kernel
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// SM90-SAME: chip = "sm_90a"
// SM100-SAME: chip = "sm_100a"
// The weights are read only through tensor maps: the runtime may bind views.
// CHECK-SAME: {access = "pointer", dtype = "bf16", name = "x", role = "input", shape = array<i64: 40, 64>}
// CHECK-SAME: {access = "tensor_maps", dtype = "bf16", name = "gate_weights", role = "input", shape = array<i64: 4, 128, 64>}
// CHECK-SAME: {access = "tensor_maps", dtype = "bf16", name = "shared_down_weights", role = "input", shape = array<i64: 64, 128>}
// CHECK-SAME: {align = 16 : i64, dtype = "bf16", name = "out", role = "output", shape = array<i64: 40, 64>}
// One CTA per SM, said to ptxas (.minnctapersm 1) so it does not trade
// registers for occupancy the persistent kernel never uses.
// CHECK-SAME: nvvm.minctasm = 1 : i32
// Phase 1, the routing plan: reset the row maps, report expert ids outside
// [-1, E) into the kernel's status, count each chunk of 32 routes (80
// routes: 3 chunks), scan the chunks per expert, pad, assign; a barrier
// after each.
// CHECK-NEXT: mk.fill %[[ROWR]], -1 : memref<332xi64>
// CHECK-NEXT: mk.fill %[[ROWE]], -1 : memref<332xi64>
// CHECK-NEXT: mk.check_routes %[[TOP]] into %[[STATUS]] {experts = 4 : i64} : memref<40x2xi32>, memref<8xi32>
// CHECK-NEXT: mk.count_routes %[[TOP]] into %[[CC]] {chunk = 32 : i64}
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// CHECK-NEXT: mk.scan_chunks %[[CC]] into %[[COUNTS]]
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// CHECK-NEXT: mk.pad_offsets %[[COUNTS]] into %[[OFF]] {padding = 64 : i64}
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// CHECK-NEXT: mk.assign_rows %[[TOP]], %[[OFF]], %[[CC]] into %[[RR]], %[[ROWR]], %[[ROWE]] {chunk = 32 : i64}
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// Phase 2, dispatch.
// CHECK-NEXT: mk.gather %[[X]], %[[ROWR]], %[[OFF]] into %[[RX]] {top_k = 2 : i64}
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// Phase 3: routed gate/up grouped by expert, with the gate and up maps one
// slot per expert (1 + e, 5 + e); the shared expert's gate/up beside it.
// SM90-NEXT: mk.gemm swiglu %[[RX]], %[[WG]], %[[WU]] into %[[H]] grouped(%[[ROWE]], %[[OFF]] : memref<332xi64>, memref<5xi64>) maps(%[[MAPS]] : memref<304xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1, 5>, swiglu_limit = 7.000000e+00 : f32}
// SM100-NEXT: mk.gemm swiglu %[[RX]], %[[WG]], %[[WU]] into %[[H]] grouped(%[[ROWE]], %[[OFF]] : memref<332xi64>, memref<5xi64>) maps(%[[MAPS]] : memref<304xi64>) schedule <tcgen05, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1, 5>, swiglu_limit = 7.000000e+00 : f32}
// CHECK-NEXT: mk.gemm swiglu %[[X]], %[[SG]], %[[SU]] into %[[SH]] maps(%[[MAPS]] : memref<304xi64>) schedule <{{wgmma|tcgen05}}{{[^>]*}}> {maps = array<i64: 14, 15, 16>
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// Phase 4: the down projections.
// SM90-NEXT: mk.gemm store %[[H]], %[[WD]] into %[[Y]] grouped(%[[ROWE]], %[[OFF]] : memref<332xi64>, memref<5xi64>) maps(%[[MAPS]] : memref<304xi64>) padding(%[[ROWR]] : memref<332xi64>) schedule <wgmma{{[^>]*}}> {maps = array<i64: 9, 10>
// SM100-NEXT: mk.gemm store %[[H]], %[[WD]] into %[[Y]] grouped(%[[ROWE]], %[[OFF]] : memref<332xi64>, memref<5xi64>) maps(%[[MAPS]] : memref<304xi64>) schedule <tcgen05{{[^>]*}}> {maps = array<i64: 9, 10>
// CHECK-NEXT: mk.gemm store %[[SH]], %[[SD]] into %[[SO]] maps(%[[MAPS]] : memref<304xi64>) schedule <{{wgmma|tcgen05}}{{[^>]*}}> {maps = array<i64: 17, 18>
// CHECK-NEXT: mk.grid_barrier %[[BAR]]
// Phase 5: combine onto the shared expert's output.
// CHECK-NEXT: mk.combine %[[Y]], %[[RR]] weights(%[[RW]] : {{.*}}) shared(%[[SO]] : memref<40x64xbf16>) into %[[OUT]]
// CHECK-NEXT: gpu.return

// multicast=true (examples/dsv3-shard.mlir): clusters of 2 CTAs (mok.kernel
// cluster = 2, which the runtime launches), and the down weights' maps (one
// B operand, 256-column tiles) get 128-row boxes, one half of a tile's B for
// each CTA of a pair.
// MC-LABEL: gpu.func @dsv3_shard_moe_forward(
// MC-SAME: cluster = 2 : i64
// MC-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "down_weights"
// MC-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "shared_down_weights"
// Every tensor-core GEMM of the kernel multicasts its B boxes to the pair.
// MC-COUNT-4: schedule <wgmma, tile = [128, {{128|256}}, 64], stages = 4, multicast>
// MC-NOT: schedule <wgmma
// NOMC-LABEL: gpu.func @dsv3_shard_moe_forward(
// NOMC-NOT: cluster =
// NOMC-SAME: {box_cols = 64 : i64, box_rows = 256 : i64, buffer = "down_weights"
// NOMC-SAME: {box_cols = 64 : i64, box_rows = 256 : i64, buffer = "shared_down_weights"
// NOMC-NOT: multicast

// Padding 8 does not cut expert segments into 64-row tiles: simt GEMMs, no
// tensor maps, the weights read by pointer.
// CHECK-LABEL: gpu.module @padding8_kernels
// CHECK: gpu.func @padding8_forward(
// CHECK-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// CHECK-SAME: {access = "pointer", dtype = "bf16", name = "gate_weights"
// CHECK-NOT: tensor_maps
// CHECK: mk.gemm swiglu {{.*}}schedule <simt>
// CHECK-NOT: maps
// CHECK: mk.gemm store {{.*}}schedule <simt>
// CHECK: mk.combine {{.*}} into
// CHECK-NOT: shared(

// tensor-cores=false: simt everywhere, with the requested block size.
// SIMT: gpu.func @eligible_forward(
// SIMT-SAME: %{{[^:]*}}: memref<2xi32>, %{{[^:]*}}: memref<8xi32>) kernel
// SIMT-SAME: known_block_size = array<i32: 128, 1, 1>
// SIMT-SAME: dynamic_shared_memory = 0 : i64
// SIMT-COUNT-4: mk.gemm {{.*}} schedule <simt>
// SIMT: gpu.func @padding8_forward(

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

// profile=true: phase_clock and phase_cycles workspace buffers (start + 8
// phases), the phases named in mok.kernel, a stamp (time and cycles) at the
// start and after every barrier, and one more barrier before the last
// stamp.
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a profile=true copy-dispatch=true" | FileCheck %s --check-prefix=PROFILE
// PROFILE-LABEL: gpu.func @eligible_forward(
// PROFILE-SAME: %[[BAR:[^:]*]]: memref<2xi32>, %[[STATUS:[^:]*]]: memref<8xi32>, %[[CLOCK:[^:]*]]: memref<9xi64>, %[[CYCLES:[^:]*]]: memref<9xi64>, %{{[^:]*}}: memref<304xi64>) kernel
// PROFILE-SAME: {align = 16 : i64, dtype = "i64", name = "phase_clock", role = "workspace", shape = array<i64: 9>}, {align = 16 : i64, dtype = "i64", name = "phase_cycles", role = "workspace", shape = array<i64: 9>}
// PROFILE-SAME: phases = ["plan: count", "plan: scan", "plan: offsets", "plan: assign", "dispatch", "gate/up + SwiGLU", "down", "combine"]
// PROFILE-NEXT: mk.timestamp %[[CLOCK]][0] cycles(%[[CYCLES]] : memref<9xi64>)
// PROFILE: mk.count_routes
// PROFILE-NEXT: mk.grid_barrier %[[BAR]]
// PROFILE-NEXT: mk.timestamp %[[CLOCK]][1] cycles(%[[CYCLES]] : memref<9xi64>)
// PROFILE: mk.combine
// PROFILE-NEXT: mk.grid_barrier %[[BAR]]
// PROFILE-NEXT: mk.timestamp %[[CLOCK]][8] cycles(%[[CYCLES]] : memref<9xi64>)
// PROFILE-NEXT: gpu.return
