// RUN: mok-opt %s --convert-mk-to-gpu | FileCheck %s --implicit-check-not=mk.

// The backward's simt forms, lowered op by op: the SwiGLU gradient (one
// warp a row, the router-weight gradient a fixed shuffle tree), the
// transposed, concatenated and k-grouped GEMMs, the f32 GEMM output, the
// scaled gather and the unweighted combine.

// mk.swiglu_grad, routed (rows of 36 columns: one column a lane; whole
// 16-byte pieces take the 8-column form, below): warp (tid / 32) * grid +
// block (its lane from %laneid) takes rows
// r < offsets[E], stepping by the grid's warps; its lanes stride over the
// columns. dh = bf16(w * d_hidden_u), w = router_weights[q / k, q % k] (0 for
// a padding row, whose d_gate and d_up are zeros); each lane sums
// d_hidden_u * hidden over its columns, the butterfly (xor 16, 8, 4, 2, 1)
// adds the lanes, and lane 0 of a valid row stores the route's gradient.
// CHECK-LABEL: gpu.func @swiglu_grad_routed(
// CHECK-SAME: %[[DH:[^:]*]]: memref<108x36xf32>, %[[G:[^:]*]]: memref<108x36xbf16>, %[[U:[^:]*]]: memref<108x36xbf16>, %[[H:[^:]*]]: memref<108x36xbf16>,
// CHECK-SAME: %[[DG:[^:]*]]: memref<108x36xbf16>, %[[DU:[^:]*]]: memref<108x36xbf16>, %[[RR:[^:]*]]: memref<108xi64>, %[[QR:[^:]*]]: memref<80xi64>,
// CHECK-SAME: %[[W:[^:]*]]: memref<40x2xf32>, %[[OFF:[^:]*]]: memref<5xi64>, %[[DW:[^:]*]]: memref<40x2xf32>)
// CHECK: %[[R_END:.*]] = memref.load %[[OFF]][%c4]
// CHECK: %[[WIDTH:.*]] = arith.constant 32 : i32
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[WARP_IN_BLOCK:.*]] = arith.divsi %[[TID]], %c32{{.*}} : index
// CHECK: %[[LANE_I32:.*]] = nvvm.read.ptx.sreg.laneid : i32
// CHECK-NEXT: %[[LANE:.*]] = arith.index_cast %[[LANE_I32]] : i32 to index
// CHECK: %[[WARPS:.*]] = arith.divsi %{{.*}}, %c32{{.*}} : index
// CHECK: scf.for %[[ROW:.*]] = %{{.*}} to %{{.*}} step %[[WARPS]] {
// CHECK: %[[Q:.*]] = memref.load %[[RR]][%[[ROW]]]
// CHECK: %[[VALID:.*]] = arith.cmpi sge,
// A row with a route reads its d_hidden_u, gate, up and hidden rows; a
// padding row (else branch, below) reads nothing.
// CHECK-NEXT: scf.if %[[VALID]] {
// CHECK: %[[T:.*]] = arith.divsi %{{.*}}, %c2 : index
// CHECK: %[[SLOT:.*]] = arith.remsi %{{.*}}, %c2 : index
// CHECK: %[[SCALE:.*]] = memref.load %[[W]][%[[T]], %[[SLOT]]]
// CHECK: %[[PARTIAL:.*]] = scf.for %[[COL:.*]] = %[[LANE]] to %c36{{.*}} step %c32{{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (f32) {
// CHECK: %[[DHU:.*]] = memref.load %[[DH]][%[[ROW]], %[[COL]]]
// CHECK: %[[SCALED:.*]] = arith.mulf %[[SCALE]], %[[DHU]] : f32
// CHECK-NEXT: arith.truncf %[[SCALED]] : f32 to bf16
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %[[DG]][%[[ROW]], %[[COL]]]
// CHECK: memref.store %{{.*}}, %[[DU]][%[[ROW]], %[[COL]]]
// CHECK: %[[HL:.*]] = memref.load %[[H]][%[[ROW]], %[[COL]]]
// CHECK-NEXT: %[[HV:.*]] = arith.extf %[[HL]] : bf16 to f32
// CHECK-NEXT: %[[PROD:.*]] = arith.mulf %[[DHU]], %[[HV]] : f32
// CHECK-NEXT: %[[NEXT:.*]] = arith.addf %[[ACC]], %[[PROD]] : f32
// CHECK-NEXT: scf.yield %[[NEXT]] : f32
// CHECK: %[[S16:.*]], %{{.*}} = gpu.shuffle xor %[[PARTIAL]], %c16_i32, %[[WIDTH]] : f32
// CHECK-NEXT: %[[P16:.*]] = arith.addf %[[PARTIAL]], %[[S16]] : f32
// CHECK-NEXT: %c8_i32 = arith.constant 8 : i32
// CHECK-NEXT: %[[S8:.*]], %{{.*}} = gpu.shuffle xor %[[P16]], %c8_i32, %[[WIDTH]] : f32
// CHECK-NEXT: %[[P8:.*]] = arith.addf %[[P16]], %[[S8]] : f32
// CHECK-NEXT: %c4_i32 = arith.constant 4 : i32
// CHECK-NEXT: %[[S4:.*]], %{{.*}} = gpu.shuffle xor %[[P8]], %c4_i32, %[[WIDTH]] : f32
// CHECK-NEXT: %[[P4:.*]] = arith.addf %[[P8]], %[[S4]] : f32
// CHECK-NEXT: %c2_i32 = arith.constant 2 : i32
// CHECK-NEXT: %[[S2:.*]], %{{.*}} = gpu.shuffle xor %[[P4]], %c2_i32, %[[WIDTH]] : f32
// CHECK-NEXT: %[[P2:.*]] = arith.addf %[[P4]], %[[S2]] : f32
// CHECK-NEXT: %c1_i32 = arith.constant 1 : i32
// CHECK-NEXT: %[[S1:.*]], %{{.*}} = gpu.shuffle xor %[[P2]], %c1_i32, %[[WIDTH]] : f32
// CHECK-NEXT: %[[SUM:.*]] = arith.addf %[[P2]], %[[S1]] : f32
// CHECK-NOT: gpu.shuffle
// CHECK: %[[FIRST:.*]] = arith.cmpi eq, %[[LANE]], %{{.*}} : index
// CHECK-NEXT: scf.if %[[FIRST]] {
// CHECK-NEXT: memref.store %[[SUM]], %[[DW]][%[[T]], %[[SLOT]]]
// A padding row: zero d_gate and d_up, no loads.
// CHECK: } else {
// CHECK-NEXT: arith.constant 32
// CHECK-NEXT: arith.constant 36
// CHECK-NEXT: scf.for %[[ZCOL:.*]] = %[[LANE]] to
// CHECK-NOT: memref.load
// CHECK: memref.store %{{.*}}, %[[DG]][%[[ROW]], %[[ZCOL]]]
// CHECK-NOT: memref.load
// CHECK: memref.store %{{.*}}, %[[DU]][%[[ROW]], %[[ZCOL]]]
// Routes without a row (route_row < 0): a zero gradient, grid-stride.
// CHECK: scf.for %[[ROUTE:.*]] = %{{.*}} to %c80 step
// CHECK: memref.load %[[QR]][%[[ROUTE]]]
// CHECK: arith.cmpi slt
// CHECK: scf.if
// CHECK: memref.store %{{.*}}, %[[DW]]
// CHECK: gpu.return

// The shared form: w = 1, hidden is not read, no router-weight gradient (no
// shuffles).
// CHECK-LABEL: gpu.func @swiglu_grad_shared(
// CHECK-SAME: %[[SDH:[^:]*]]: memref<40x20xf32>, %{{[^:]*}}: memref<40x20xbf16>, %{{[^:]*}}: memref<40x20xbf16>, %[[SH:[^:]*]]: memref<40x20xbf16>,
// CHECK-SAME: %[[SDG:[^:]*]]: memref<40x20xbf16>, %[[SDU:[^:]*]]: memref<40x20xbf16>)
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: memref.load %[[SH]]
// CHECK: scf.for %[[SROW:.*]] = %{{.*}} to %c40 step
// CHECK-NEXT: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: %[[SDHU:.*]] = memref.load %[[SDH]]
// CHECK: arith.mulf %[[ONE]], %[[SDHU]] : f32
// CHECK: memref.store %{{.*}}, %[[SDG]]
// CHECK: memref.store %{{.*}}, %[[SDU]]
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: memref.load %[[SH]]
// CHECK: gpu.return

gpu.module @swiglu_grad {
  gpu.func @swiglu_grad_routed(%dh: memref<108x36xf32>, %g: memref<108x36xbf16>, %u: memref<108x36xbf16>, %h: memref<108x36xbf16>,
                               %dg: memref<108x36xbf16>, %du: memref<108x36xbf16>, %rr: memref<108xi64>, %qr: memref<80xi64>,
                               %w: memref<40x2xf32>, %off: memref<5xi64>, %dw: memref<40x2xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.swiglu_grad %dh, %g, %u, %h into %dg, %du
        routes(%rr, %qr, %w, %off : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %dw
        {swiglu_limit = 7.0 : f32}
        : memref<108x36xf32>, memref<108x36xbf16>, memref<108x36xbf16>, memref<108x36xbf16>
          -> memref<108x36xbf16>, memref<108x36xbf16>, memref<40x2xf32>
    gpu.return
  }

  gpu.func @swiglu_grad_shared(%dh: memref<40x20xf32>, %g: memref<40x20xbf16>, %u: memref<40x20xbf16>, %h: memref<40x20xbf16>,
                               %dg: memref<40x20xbf16>, %du: memref<40x20xbf16>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.swiglu_grad %dh, %g, %u, %h into %dg, %du
        : memref<40x20xf32>, memref<40x20xbf16>, memref<40x20xbf16>, memref<40x20xbf16>
          -> memref<40x20xbf16>, memref<40x20xbf16>
    gpu.return
  }
}

// An f32 out stores the fp32 accumulator as it is: no rounding to bf16.
// CHECK-LABEL: gpu.func @f32_out(
// CHECK-SAME: %[[FO:[^:]*]]: memref<40x16xf32>)
// CHECK-NOT: arith.truncf
// CHECK: %[[FACC:.*]] = scf.for
// CHECK-NOT: arith.truncf
// CHECK: memref.store %[[FACC]], %[[FO]][%{{.*}}, %{{.*}}] {alignment = 4 : i64} : memref<40x16xf32>
// CHECK-NOT: arith.truncf
// CHECK: gpu.return

// transpose_a: a(r, k) = a[k, r].
// CHECK-LABEL: gpu.func @transpose_a(
// CHECK-SAME: %[[TA:[^:]*]]: memref<64x40xbf16>, %[[TB:[^:]*]]: memref<16x64xbf16>
// CHECK: %[[TC:.*]] = arith.remsi %{{.*}}, %c16 : index
// CHECK-NEXT: %[[TR:.*]] = arith.divsi %{{.*}}, %c16 : index
// CHECK: scf.for %[[TK:.*]] = %c0 to %c64 step
// CHECK: memref.load %[[TB]][%[[TC]], %[[TK]]]
// CHECK: memref.load %[[TA]][%[[TK]], %[[TR]]]
// CHECK: gpu.return

// concat with transpose_b (d_routed_x = d_gate W_g + d_up W_u, B [E, K, N]):
// the second K-loop starts from the first's sum; one rounding at the store.
// CHECK-LABEL: gpu.func @concat(
// CHECK-SAME: %[[CG:[^:]*]]: memref<108x32xbf16>, %[[CU:[^:]*]]: memref<108x32xbf16>, %[[CWG:[^:]*]]: memref<4x32x64xbf16>, %[[CWU:[^:]*]]: memref<4x32x64xbf16>, %[[CO:[^:]*]]: memref<108x64xbf16>
// CHECK: %[[CC:.*]] = arith.remsi %{{.*}}, %c64 : index
// CHECK-NEXT: %[[CR:.*]] = arith.divsi %{{.*}}, %c64 : index
// CHECK: %[[CE:.*]] = arith.index_cast
// CHECK: %[[FIRST_K:.*]] = scf.for %[[CK:.*]] = %c0 to %c32 step %{{.*}} iter_args(%{{.*}} = %cst)
// CHECK-NEXT: memref.load %[[CWG]][%[[CE]], %[[CK]], %[[CC]]]
// CHECK: memref.load %[[CG]][%[[CR]], %[[CK]]]
// CHECK: %[[BOTH:.*]] = scf.for %[[CK2:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %[[FIRST_K]])
// CHECK-NEXT: memref.load %[[CWU]][%[[CE]], %[[CK2]], %[[CC]]]
// CHECK: memref.load %[[CU]][%[[CR]], %[[CK2]]]
// CHECK: %[[CROUND:.*]] = arith.truncf %[[BOTH]] : f32 to bf16
// CHECK-NEXT: memref.store %[[CROUND]], %[[CO]][%[[CR]], %[[CC]]]
// CHECK: gpu.return

// k_groups (weight gradients): out[e] sums over rows [offsets[e],
// offsets[e + 1]) of both transposed operands.
// CHECK-LABEL: gpu.func @k_groups(
// CHECK-SAME: %[[KA:[^:]*]]: memref<108x64xbf16>, %[[KB:[^:]*]]: memref<108x32xbf16>, %[[KO:[^:]*]]: memref<4x64x32xbf16>, %[[KOFF:[^:]*]]: memref<5xi64>)
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step
// CHECK: %[[KC:.*]] = arith.remsi %{{.*}}, %c32 : index
// CHECK: %[[KE:.*]] = arith.divsi %{{.*}}, %c64 : index
// CHECK-NEXT: %[[KR:.*]] = arith.remsi %{{.*}}, %c64 : index
// CHECK-NEXT: %[[KBEGIN:.*]] = memref.load %[[KOFF]][%[[KE]]]
// CHECK: %[[KNEXT:.*]] = arith.addi %[[KE]], %{{.*}} : index
// CHECK-NEXT: %[[KEND:.*]] = memref.load %[[KOFF]][%[[KNEXT]]]
// CHECK: %[[KSUM:.*]] = scf.for %[[KK:.*]] = %{{.*}} to %{{.*}} step
// CHECK-NEXT: memref.load %[[KB]][%[[KK]], %[[KC]]]
// CHECK: memref.load %[[KA]][%[[KK]], %[[KR]]]
// CHECK: %[[KROUND:.*]] = arith.truncf %[[KSUM]] : f32 to bf16
// CHECK-NEXT: memref.store %[[KROUND]], %[[KO]][%[[KE]], %[[KR]], %[[KC]]]
// CHECK: gpu.return

// k_counts: group e sums rows [offsets[e], min(offsets[e + 1], offsets[e] +
// counts[e])) (the rows past the count are zero padding).
// CHECK-LABEL: gpu.func @k_counts(
// CHECK-SAME: %[[CKOFF:[^:]*]]: memref<5xi64>, %[[CKCNT:[^:]*]]: memref<4xi64>)
// CHECK: %[[CKE:.*]] = arith.divsi %{{.*}}, %c64 : index
// CHECK: %[[CKB:.*]] = memref.load %[[CKOFF]][%[[CKE]]]
// CHECK-NEXT: %[[CKBI:.*]] = arith.index_cast %[[CKB]]
// CHECK: %[[CKEND:.*]] = memref.load %[[CKOFF]]
// CHECK-NEXT: %[[CKENDI:.*]] = arith.index_cast %[[CKEND]]
// CHECK-NEXT: %[[CKN:.*]] = memref.load %[[CKCNT]][%[[CKE]]]
// CHECK-NEXT: %[[CKNI:.*]] = arith.index_cast %[[CKN]]
// CHECK-NEXT: %[[CKLAST:.*]] = arith.addi %[[CKBI]], %[[CKNI]] : index
// CHECK-NEXT: %[[CKSTOP:.*]] = arith.minsi %[[CKENDI]], %[[CKLAST]] : index
// CHECK: scf.for %{{.*}} = %[[CKBI]] to %[[CKSTOP]] step
// CHECK: gpu.return

// On wgmma, a task's k-tiles stop after the one holding the group's last
// counted row: min(offsets[e + 1] - offsets[e], ceil(counts[e] / 64) * 64)
// / 64 k-tiles.
// CHECK-LABEL: gpu.func @k_counts_wgmma(
// CHECK-SAME: %[[WKOFF:[^:]*]]: memref<5xi64>, %[[WKCNT:[^:]*]]: memref<4xi64>,
// CHECK: %[[WKB:.*]] = memref.load %[[WKOFF]][%[[WKG:[0-9a-z_]+]]]
// CHECK-NEXT: %[[WKBI:.*]] = arith.index_cast %[[WKB]]
// CHECK: %[[WKE:.*]] = memref.load %[[WKOFF]]
// CHECK-NEXT: %[[WKEI:.*]] = arith.index_cast %[[WKE]]
// CHECK-NEXT: %[[WKROWS:.*]] = arith.subi %[[WKEI]], %[[WKBI]] : index
// CHECK: %[[WKN:.*]] = memref.load %[[WKCNT]][%[[WKG]]]
// CHECK-NEXT: %[[WKNI:.*]] = arith.index_cast %[[WKN]]
// CHECK-NEXT: %[[WKUP:.*]] = arith.addi %[[WKNI]], %c63{{.*}} : index
// CHECK-NEXT: %[[WKT:.*]] = arith.divsi %[[WKUP]], %c64{{.*}} : index
// CHECK-NEXT: %[[WKR:.*]] = arith.muli %[[WKT]], %c64{{.*}} : index
// CHECK-NEXT: %[[WKMIN:.*]] = arith.minsi %[[WKROWS]], %[[WKR]] : index
// CHECK: arith.divsi %[[WKMIN]], %c64{{.*}} : index
// CHECK: gpu.return

// accumulate (main_grad += dW): the simt sum is added to out's element,
// in f32, before the store.
// CHECK-LABEL: gpu.func @k_groups_accumulate(
// CHECK-SAME: %[[AO:[^:]*]]: memref<4x64x32xf32>,
// CHECK: %[[ASUM:.*]] = scf.for
// CHECK: %[[AOLD:.*]] = memref.load %[[AO]][%[[AE:[a-z0-9_]+]], %[[AR:[a-z0-9_]+]], %[[AC:[a-z0-9_]+]]]
// CHECK-NEXT: %[[ANEW:.*]] = arith.addf %[[AOLD]], %[[ASUM]] : f32
// CHECK-NEXT: memref.store %[[ANEW]], %[[AO]][%[[AE]], %[[AR]], %[[AC]]]
// CHECK: gpu.return

// On wgmma: the register epilogue adds each pair to out's by a reduction
// in L2, nothing loaded into the SM and nothing stored: one 8-byte
// reduction a pair when out is 8-byte aligned, else two 4-byte ones, the
// alignment tested once a tile (the rows of an f32 k_groups out are the
// flattened [E * M] rows).
// CHECK-LABEL: gpu.func @k_groups_accumulate_wgmma(
// CHECK-NOT: llvm.load
// CHECK-NOT: memref.store
// CHECK-COUNT-32: red.global.add.v2.f32 [$0], {$1, $2};
// CHECK-NOT: red.global.add.v2.f32
// CHECK: } else {
// CHECK-COUNT-64: red.global.add.f32 [$0], $1;
// CHECK-NOT: red.global.add
// CHECK-NOT: st.global.cs
// CHECK-NOT: llvm.load
// CHECK: gpu.return

// On tcgen05: the shared-memory epilogue adds each element to out's by a
// 4-byte reduction in L2; out is never loaded or stored.
// CHECK-LABEL: gpu.func @k_groups_accumulate_tcgen05(
// CHECK-SAME: %[[TCO:[^:]*]]: memref<4x64x128xf32>,
// CHECK-NOT: memref.load %[[TCO]]
// CHECK-NOT: memref.store %{{.*}}, %[[TCO]]
// CHECK: tcgen05.mma
// CHECK-NOT: memref.load %[[TCO]]
// CHECK-NOT: memref.store %{{.*}}, %[[TCO]]
// CHECK: red.global.add.f32 [$0], $1;
// CHECK-NOT: memref.load %[[TCO]]
// CHECK-NOT: memref.store %{{.*}}, %[[TCO]]
// CHECK: gpu.return

// saves: the swiglu epilogue also stores its bf16 inputs.
// CHECK-LABEL: gpu.func @saves(
// CHECK-SAME: %[[SVH:[^:]*]]: memref<108x32xbf16>, %[[SVG:[^:]*]]: memref<108x32xbf16>, %[[SVU:[^:]*]]: memref<108x32xbf16>,
// CHECK: memref.store %{{.*}}, %[[SVG]]
// CHECK-NEXT: arith.truncf
// CHECK-NEXT: memref.store %{{.*}}, %[[SVU]]
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %[[SVH]]
// CHECK: gpu.return

gpu.module @gemms {
  gpu.func @f32_out(%a: memref<40x64xbf16>, %b: memref<16x64xbf16>, %o: memref<40x16xf32>) kernel {
    mk.gemm store %a, %b into %o schedule <simt> : memref<40x64xbf16>, memref<16x64xbf16> -> memref<40x16xf32>
    gpu.return
  }

  gpu.func @transpose_a(%xt: memref<64x40xbf16>, %b: memref<16x64xbf16>, %o: memref<40x16xbf16>) kernel {
    mk.gemm store %xt, %b into %o schedule <simt> {transpose_a} : memref<64x40xbf16>, memref<16x64xbf16> -> memref<40x16xbf16>
    gpu.return
  }

  gpu.func @concat(%dg: memref<108x32xbf16>, %du: memref<108x32xbf16>, %wg: memref<4x32x64xbf16>, %wu: memref<4x32x64xbf16>,
                   %drx: memref<108x64xbf16>, %re: memref<108xi64>, %off: memref<5xi64>) kernel {
    mk.gemm store %dg, %wg, %wu into %drx grouped(%re, %off : memref<108xi64>, memref<5xi64>)
        concat(%du : memref<108x32xbf16>) schedule <simt> {transpose_b}
        : memref<108x32xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x64xbf16>
    gpu.return
  }

  gpu.func @k_groups(%dy: memref<108x64xbf16>, %h: memref<108x32xbf16>, %dwd: memref<4x64x32xbf16>, %off: memref<5xi64>) kernel {
    mk.gemm store %dy, %h into %dwd k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }

  gpu.func @k_counts(%dy: memref<108x64xbf16>, %h: memref<108x32xbf16>, %dwd: memref<4x64x32xbf16>, %off: memref<5xi64>, %cnt: memref<4xi64>) kernel {
    mk.gemm store %dy, %h into %dwd k_groups(%off : memref<5xi64>) k_counts(%cnt : memref<4xi64>) schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }

  gpu.func @k_counts_wgmma(%a: memref<108x64xbf16>, %b: memref<108x128xbf16>, %o: memref<4x64x128xbf16>, %off: memref<5xi64>, %cnt: memref<4xi64>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) k_groups(%off : memref<5xi64>) k_counts(%cnt : memref<4xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x128xbf16> -> memref<4x64x128xbf16>
    gpu.return
  }

  gpu.func @k_groups_accumulate(%dy: memref<108x64xbf16>, %h: memref<108x32xbf16>, %mg: memref<4x64x32xf32>, %off: memref<5xi64>, %cnt: memref<4xi64>) kernel {
    mk.gemm store %dy, %h into %mg k_groups(%off : memref<5xi64>) k_counts(%cnt : memref<4xi64>) schedule <simt> {accumulate, transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xf32>
    gpu.return
  }

  gpu.func @k_groups_accumulate_wgmma(%a: memref<108x64xbf16>, %b: memref<108x128xbf16>, %o: memref<4x64x128xf32>, %off: memref<5xi64>, %cnt: memref<4xi64>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) k_groups(%off : memref<5xi64>) k_counts(%cnt : memref<4xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {accumulate, maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x128xbf16> -> memref<4x64x128xf32>
    gpu.return
  }

  gpu.func @k_groups_accumulate_tcgen05(%a: memref<108x64xbf16>, %b: memref<108x128xbf16>, %o: memref<4x64x128xf32>, %off: memref<5xi64>, %cnt: memref<4xi64>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_100a", dynamic_shared_memory = 197632}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) k_groups(%off : memref<5xi64>) k_counts(%cnt : memref<4xi64>)
        schedule <tcgen05, tile = [64, 128, 64], stages = 4> {accumulate, maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x128xbf16> -> memref<4x64x128xf32>
    gpu.return
  }

  gpu.func @saves(%x: memref<108x64xbf16>, %wg: memref<4x32x64xbf16>, %wu: memref<4x32x64xbf16>, %h: memref<108x32xbf16>,
                  %g: memref<108x32xbf16>, %u: memref<108x32xbf16>, %re: memref<108xi64>, %off: memref<5xi64>) kernel {
    mk.gemm swiglu %x, %wg, %wu into %h grouped(%re, %off : memref<108xi64>, memref<5xi64>)
        saves(%g, %u : memref<108x32xbf16>, memref<108x32xbf16>) schedule <simt>
        : memref<108x64xbf16>, memref<4x32x64xbf16>, memref<4x32x64xbf16> -> memref<108x32xbf16>
    gpu.return
  }
}

// The scaled gather (the reverse combine; rows of 60 columns: element by
// element): the token's row times router_weights[q / k, q % k].
// CHECK-LABEL: gpu.func @gather_scaled(
// CHECK-SAME: %[[GX:[^:]*]]: memref<40x60xbf16>, %[[GR:[^:]*]]: memref<108xi64>, %{{[^:]*}}: memref<5xi64>, %[[GY:[^:]*]]: memref<108x60xbf16>, %[[GW:[^:]*]]: memref<40x2xf32>)
// CHECK-NOT: llvm.load
// CHECK: %[[GQ:.*]] = memref.load %[[GR]]
// CHECK-NEXT: %[[GROUTE:.*]] = arith.index_cast %[[GQ]] : i64 to index
// CHECK: scf.if
// CHECK-NEXT: %[[GT:.*]] = arith.divsi %[[GROUTE]], %c2 : index
// CHECK-NEXT: memref.load %[[GX]][%[[GT]], %{{.*}}]
// CHECK-NEXT: %[[GXV:.*]] = arith.extf
// CHECK-NEXT: %[[GSLOT:.*]] = arith.remsi %[[GROUTE]], %c2 : index
// CHECK-NEXT: %[[GWV:.*]] = memref.load %[[GW]][%[[GT]], %[[GSLOT]]]
// CHECK-NEXT: %[[GV:.*]] = arith.mulf %[[GWV]], %[[GXV]] : f32
// CHECK-NEXT: scf.yield %[[GV]] : f32
// CHECK: memref.store %{{.*}}, %[[GY]]
// CHECK-NOT: llvm.load
// CHECK: gpu.return

// The unweighted combine (the reverse dispatch): k = route_row's 80 routes /
// out's 40 rows = 2, and each term is the routed row's element as it is (no
// weight, no multiply), in the 16-byte path and the element path alike.
// CHECK-LABEL: gpu.func @combine_unweighted(
// CHECK-SAME: %{{[^:]*}}: memref<108x64xbf16>, %[[QR1:[^:]*]]: memref<80xi64>, %{{[^:]*}}: memref<40x64xbf16>)
// CHECK-NOT: arith.mulf
// CHECK: scf.if
// CHECK: memref.load %[[QR1]]
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: arith.mulf
// CHECK: } else {
// CHECK: scf.for %{{.*}} = %c0 to %c2 step
// CHECK-NOT: arith.mulf
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @combine_unweighted_scalar(
// CHECK-SAME: %[[CY:[^:]*]]: memref<108x12xbf16>, %{{[^:]*}}: memref<80xi64>, %[[CO2:[^:]*]]: memref<40x12xbf16>)
// CHECK-NOT: arith.mulf
// CHECK: %[[CSUM:.*]] = scf.for %{{.*}} = %c0 to %c2 step %{{.*}} iter_args(%[[CACC:.*]] = %{{.*}})
// CHECK: %[[CTERM:.*]] = scf.if
// CHECK-NEXT: memref.load %[[CY]]
// CHECK-NEXT: %[[CV:.*]] = arith.extf
// CHECK-NEXT: scf.yield %[[CV]] : f32
// CHECK: arith.addf %[[CACC]], %[[CTERM]] : f32
// CHECK-NOT: arith.mulf
// CHECK: memref.store %{{.*}}, %[[CO2]]
// CHECK: gpu.return
// The weighted combine, for contrast: each term is multiplied by its weight.
// CHECK-LABEL: gpu.func @combine_weighted_scalar(
// CHECK-SAME: %[[WW:[^:]*]]: memref<40x2xf32>
// CHECK: %[[WV:.*]] = memref.load %[[WW]]
// CHECK: arith.mulf %[[WV]], %{{.*}} : f32
// CHECK: gpu.return

gpu.module @dispatch {
  gpu.func @gather_scaled(%x: memref<40x60xbf16>, %r: memref<108xi64>, %off: memref<5xi64>, %y: memref<108x60xbf16>, %w: memref<40x2xf32>) kernel {
    mk.gather %x, %r, %off into %y scale(%w : memref<40x2xf32>) {top_k = 2 : i64}
        : memref<40x60xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x60xbf16>
    gpu.return
  }

  gpu.func @combine_unweighted(%y: memref<108x64xbf16>, %rr: memref<80xi64>, %o: memref<40x64xbf16>) kernel {
    mk.combine %y, %rr into %o : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    gpu.return
  }

  gpu.func @combine_unweighted_scalar(%y: memref<108x12xbf16>, %rr: memref<80xi64>, %o: memref<40x12xbf16>) kernel {
    mk.combine %y, %rr into %o : memref<108x12xbf16>, memref<80xi64> -> memref<40x12xbf16>
    gpu.return
  }

  gpu.func @combine_weighted_scalar(%y: memref<108x12xbf16>, %rr: memref<80xi64>, %w: memref<40x2xf32>, %o: memref<40x12xbf16>) kernel {
    mk.combine %y, %rr weights(%w : memref<40x2xf32>) into %o : memref<108x12xbf16>, memref<80xi64> -> memref<40x12xbf16>
    gpu.return
  }
}

// Whole 16-byte pieces: mk.swiglu_grad takes 8 columns a lane (d_hidden_u
// in two 16-byte loads, gate, up and hidden in one each, d_gate and d_up
// stored 16 bytes at a time) when every buffer is 16-byte aligned, else the
// column-a-lane form; the scaled gather likewise scales 8 elements a
// thread.
// CHECK-LABEL: gpu.func @swiglu_grad_vector(
// CHECK: scf.if
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (f32) {
// CHECK-COUNT-2: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xf32>
// CHECK-COUNT-3: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-COUNT-2: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};"
// CHECK: gpu.shuffle xor
// CHECK: } else {
// CHECK: memref.load
// CHECK: gpu.return
// Rows of 80 pieces: a lane of the SwiGLU backward loads 3 pieces (c, c +
// 32, c + 64; stepping by 96) before it computes any; the last round is
// partial, so each piece's stores are guarded and its partial of d_w
// selected.
// CHECK-LABEL: gpu.func @swiglu_grad_pieces(
// CHECK: scf.for {{.*}} step %c96{{.*}} iter_args(%[[ACC:[^ ]*]] = {{.*}}) -> (f32) {
// CHECK-NOT: st.global
// CHECK: %[[IN0:.*]] = arith.cmpi slt, %{{.*}}, %c80{{.*}} : index
// CHECK: arith.minsi %{{.*}}, %c79
// CHECK-COUNT-2: llvm.load {{.*}} : !llvm.ptr<1> -> vector<4xf32>
// CHECK-COUNT-3: llvm.load {{.*}} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: st.global
// CHECK: arith.minsi %{{.*}}, %c79
// CHECK-COUNT-2: llvm.load {{.*}} : !llvm.ptr<1> -> vector<4xf32>
// CHECK-COUNT-3: llvm.load {{.*}} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: st.global
// CHECK: arith.minsi %{{.*}}, %c79
// CHECK-COUNT-2: llvm.load {{.*}} : !llvm.ptr<1> -> vector<4xf32>
// CHECK-COUNT-3: llvm.load {{.*}} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: llvm.load
// CHECK: scf.if %[[IN0]] {
// CHECK-COUNT-2: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};"
// The first piece's d_w partial counts only when the piece is in the row.
// CHECK: arith.select %[[IN0]], %{{.*}}, %[[ACC]] : f32
// CHECK: scf.if
// CHECK: scf.if
// CHECK: gpu.shuffle xor
// CHECK: gpu.return
// Rows of 64 pieces: 16 pieces a thread, 4 threads a row; a thread's
// pieces are 4 apart (element offsets 0, 32, ..., 480 from its first), so
// that each load and store instruction of a warp covers adjacent pieces;
// the plain gather (the dispatch copy) alike.
// CHECK-LABEL: gpu.func @gather_wide(
// CHECK: scf.if
// CHECK: arith.muli %{{.*}}, %c8{{.*}} : index
// CHECK: arith.addi %{{.*}}, %c32{{.*}} : index
// CHECK-NOT: st.global
// CHECK: arith.addi %{{.*}}, %c480{{.*}} : index
// CHECK-NOT: st.global
// CHECK: llvm.load {{.*}} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NOT: llvm.load
// CHECK-COUNT-16: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};"
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @gather_scaled_wide(
// CHECK: scf.if
// CHECK: arith.muli %{{.*}}, %c8{{.*}} : index
// CHECK: arith.addi %{{.*}}, %c32{{.*}} : index
// CHECK: arith.addi %{{.*}}, %c480{{.*}} : index
// CHECK-COUNT-16: arith.mulf
// CHECK: gpu.return
// Rows of 8 pieces: a thread of the scaled gather loads a whole row (up to
// 16 pieces) before it scales and stores any.
// CHECK-LABEL: gpu.func @gather_scaled_vector(
// CHECK: scf.if
// CHECK-COUNT-8: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-NOT: st.global
// CHECK-COUNT-8: arith.mulf
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};"
// CHECK-COUNT-8: arith.mulf
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};"
// CHECK: } else {
// CHECK: gpu.return
gpu.module @vector_forms {
  gpu.func @swiglu_grad_vector(%dh: memref<108x32xf32>, %g: memref<108x32xbf16>, %u: memref<108x32xbf16>, %h: memref<108x32xbf16>,
                               %dg: memref<108x32xbf16>, %du: memref<108x32xbf16>, %rr: memref<108xi64>, %qr: memref<80xi64>,
                               %w: memref<40x2xf32>, %off: memref<5xi64>, %dw: memref<40x2xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.swiglu_grad %dh, %g, %u, %h into %dg, %du
        routes(%rr, %qr, %w, %off : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %dw
        : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>
          -> memref<108x32xbf16>, memref<108x32xbf16>, memref<40x2xf32>
    gpu.return
  }
  gpu.func @swiglu_grad_pieces(%dh: memref<108x640xf32>, %g: memref<108x640xbf16>, %u: memref<108x640xbf16>, %h: memref<108x640xbf16>,
                               %dg: memref<108x640xbf16>, %du: memref<108x640xbf16>, %rr: memref<108xi64>, %qr: memref<80xi64>,
                               %w: memref<40x2xf32>, %off: memref<5xi64>, %dw: memref<40x2xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.swiglu_grad %dh, %g, %u, %h into %dg, %du
        routes(%rr, %qr, %w, %off : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %dw
        : memref<108x640xf32>, memref<108x640xbf16>, memref<108x640xbf16>, memref<108x640xbf16>
          -> memref<108x640xbf16>, memref<108x640xbf16>, memref<40x2xf32>
    gpu.return
  }
  gpu.func @gather_wide(%x: memref<40x512xbf16>, %r: memref<108xi64>, %off: memref<5xi64>, %y: memref<108x512xbf16>) kernel {
    mk.gather %x, %r, %off into %y {top_k = 2 : i64}
        : memref<40x512xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x512xbf16>
    gpu.return
  }
  gpu.func @gather_scaled_wide(%x: memref<40x512xbf16>, %r: memref<108xi64>, %off: memref<5xi64>, %y: memref<108x512xbf16>, %w: memref<40x2xf32>) kernel {
    mk.gather %x, %r, %off into %y scale(%w : memref<40x2xf32>) {top_k = 2 : i64}
        : memref<40x512xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x512xbf16>
    gpu.return
  }
  gpu.func @gather_scaled_vector(%x: memref<40x64xbf16>, %r: memref<108xi64>, %off: memref<5xi64>, %y: memref<108x64xbf16>, %w: memref<40x2xf32>) kernel {
    mk.gather %x, %r, %off into %y scale(%w : memref<40x2xf32>) {top_k = 2 : i64}
        : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    gpu.return
  }
}
