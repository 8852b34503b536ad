// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_90a tensor-cores=false" | FileCheck %s
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_90a" | FileCheck %s --check-prefix=TC
// RUN: mok-opt %s --moe-generate-backward=recompute=true --convert-moe-to-mk="chip=sm_100a" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_90a profile=true" | FileCheck %s --check-prefix=PROFILE
// RUN: mok-opt %s --moe-generate-backward=recompute=true --convert-moe-to-mk="chip=sm_90a" | FileCheck %s --check-prefix=RECOMPUTE90
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_90a tensor-cores=false" | mok-opt | FileCheck %s
// RUN: mok-opt %s --moe-generate-backward=main-grads=true --convert-moe-to-mk="chip=sm_90a" | FileCheck %s --check-prefix=MAINGRADS
// RUN: mok-opt %s --moe-generate-backward=main-grads=true --convert-moe-to-mk="chip=sm_90a tensor-cores=false" | FileCheck %s --check-prefix=MAINGRADS-SIMT
// RUN: mok-opt %s --moe-generate-backward=main-grads=true --convert-moe-to-mk="chip=sm_100a" | FileCheck %s --check-prefix=MAINGRADS-SM100

// main_grads (Megatron's gradient accumulation): the weights' gradients
// are fp32 outputs the kernel adds into (metadata "accumulate"; no
// main_grad params of their own: the caller passes the main_grads as
// these outputs), every weight-gradient GEMM with `accumulate` and an f32
// out, on wgmma, tcgen05 and the simt plan.
// MAINGRADS-LABEL: gpu.func @layer_backward_backward(
// MAINGRADS-NOT: main_grad
// MAINGRADS-SAME: {accumulate = true, dtype = "f32", name = "d_gate_weights", role = "output", shape = array<i64: 4, 128, 64>}
// MAINGRADS-SAME: {accumulate = true, dtype = "f32", name = "d_shared_down_weights", role = "output", shape = array<i64: 64, 128>}
// MAINGRADS: mk.gemm store {{.*}} k_groups({{.*}}) k_counts({{.*}}) schedule <wgmma{{[^>]*}}> {accumulate, {{.*}}} : memref<332x64xbf16>, memref<332x128xbf16> -> memref<4x64x128xf32>
// MAINGRADS: mk.gemm store {{.*}} schedule <wgmma{{[^>]*}}> {accumulate, {{.*}}} : memref<40x64xbf16>, memref<40x128xbf16> -> memref<64x128xf32>
// MAINGRADS: mk.gemm store {{.*}} k_groups({{.*}}) schedule <wgmma{{[^>]*}}> {accumulate, {{.*}}} : memref<332x128xbf16>, memref<332x64xbf16> -> memref<4x128x64xf32>
// MAINGRADS: mk.gemm store {{.*}} k_groups({{.*}}) schedule <wgmma{{[^>]*}}> {accumulate, {{.*}}} : memref<332x128xbf16>, memref<332x64xbf16> -> memref<4x128x64xf32>
// MAINGRADS: mk.gemm store {{.*}} schedule <wgmma{{[^>]*}}> {accumulate, {{.*}} -> memref<128x64xf32>
// MAINGRADS: mk.gemm store {{.*}} schedule <wgmma{{[^>]*}}> {accumulate, {{.*}} -> memref<128x64xf32>
// MAINGRADS-SIMT-LABEL: gpu.func @layer_backward_backward(
// MAINGRADS-SIMT-COUNT-6: mk.gemm store {{.*}} schedule <simt> {accumulate, transpose_a, transpose_b}
// MAINGRADS-SIMT-NOT: accumulate
// MAINGRADS-SM100-LABEL: gpu.func @layer_backward_backward(
// MAINGRADS-SM100-SAME: {accumulate = true, dtype = "f32", name = "d_gate_weights", role = "output", shape = array<i64: 4, 128, 64>}
// MAINGRADS-SM100: mk.gemm store {{.*}} k_groups({{.*}}) k_counts({{.*}}) schedule <tcgen05{{[^>]*}}> {accumulate, {{.*}}} : memref<332x64xbf16>, memref<332x128xbf16> -> memref<4x64x128xf32>
// MAINGRADS-SM100: mk.gemm store {{.*}} schedule <tcgen05{{[^>]*}}> {accumulate, {{.*}}} : memref<40x64xbf16>, memref<40x128xbf16> -> memref<64x128xf32>
// MAINGRADS-SM100-COUNT-2: mk.gemm store {{.*}} k_groups({{.*}}) schedule <tcgen05{{[^>]*}}> {accumulate, {{.*}}} : memref<332x128xbf16>, memref<332x64xbf16> -> memref<4x128x64xf32>
// MAINGRADS-SM100-COUNT-2: mk.gemm store {{.*}} schedule <tcgen05{{[^>]*}}> {accumulate, {{.*}} -> memref<128x64xf32>
// MAINGRADS-SM100-NOT: accumulate

// The training forward and the backward (docs/Backward.md), planned with
// simt GEMMs today: the forward stores the backward context as outputs;
// the backward rebuilds the plan, gathers d_out (unscaled, and scaled by
// the router weight), runs the down dgrad with the down weights' gradient,
// the SwiGLU backward with the router weights' gradient, the gate/up dgrad
// (one accumulator over both K-loops) with the gate and up weights'
// gradients, and the reverse dispatch.

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>

// On sm_90a with shapes that fit the tiles, every GEMM runs on wgmma: the
// training forward's gate/up GEMMs save gate and up (with the dispatch
// copy: the context holds routed_x); in the backward the weights are read
// N-major through 64 x 64 boxes (transpose_b), the down dgrad stores fp32,
// the gate/up dgrad is a concat (maps: a, each B, then a2), the weight
// gradients read both operands through 64 x 64 boxes (transpose_a,
// transpose_b) with k_groups, and stop after each expert's counted rows
// (k_counts: the rows past them are zero padding).
// TC-LABEL: gpu.func @layer_forward(
// TC: mk.gemm swiglu {{.*}}schedule <wgmma{{[^>]*}}>
// TC-LABEL: gpu.func @layer_forward_forward(
// TC: mk.gather
// TC: mk.gemm swiglu {{.*}} saves({{.*}}schedule <wgmma{{[^>]*}}>
// TC-LABEL: gpu.func @layer_backward_backward(
// TC-SAME: memref<496xi64>) kernel
// TC-SAME: block = 256
// The weights are read through their tensor maps only (access
// "tensor_maps": the runtime may bind weight views to them), the other
// inputs by pointer.
// TC-SAME: {access = "pointer", dtype = "f32", name = "router_weights", role = "input", shape = array<i64: 40, 2>}, {access = "tensor_maps", dtype = "bf16", name = "gate_weights", role = "input", shape = array<i64: 4, 128, 64>}, {access = "tensor_maps", dtype = "bf16", name = "up_weights", role = "input", shape = array<i64: 4, 128, 64>}, {access = "tensor_maps", dtype = "bf16", name = "down_weights", role = "input", shape = array<i64: 4, 64, 128>}, {access = "tensor_maps", dtype = "bf16", name = "shared_gate_weights", role = "input", shape = array<i64: 128, 64>}, {access = "tensor_maps", dtype = "bf16", name = "shared_up_weights", role = "input", shape = array<i64: 128, 64>}, {access = "tensor_maps", dtype = "bf16", name = "shared_down_weights", role = "input", shape = array<i64: 64, 128>}, {access = "pointer", dtype = "bf16", name = "routed_x", role = "input"
// TC-SAME: {box_cols = 64 : i64, box_rows = 1 : i64, buffer = "d_out", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 40 : i64}, {box_cols = 64 : i64, box_rows = 64 : i64, buffer = "down_weights", cols = 128 : i64, experts = 4 : i64, row_stride = 128 : i64, rows = 64 : i64}
// TC-NOT: routed_d_out
// TC: mk.scan_chunks %{{.*}} into %[[TCNT:[^ ]*]] :
// The down dgrad gathers d_out's rows itself (no routed copy of them) and
// skips the MMAs of all-padding tile halves (padding: row_route).
// TC: mk.gather %{{.*}} scale(
// TC-NEXT: mk.grid_barrier
// TC-NEXT: mk.gemm store %[[TDOUT:[^,]*]], %{{.*}} into %{{.*}} grouped({{.*}}) maps({{.*}}) gather(%[[TRR:[^ ]*]] : memref<332xi64>) padding(%[[TRR]] : memref<332xi64>) schedule <wgmma, tile = [64, 256, 64], stages = 4> {gather_top_k = 2 : i64, maps = array<i64: 0, 1>, transpose_b} : memref<40x64xbf16>, memref<4x64x128xbf16> -> memref<332x128xf32>
// TC-NEXT: mk.gemm store {{.*}} k_groups({{.*}}) k_counts(%[[TCNT]] : memref<4xi64>) schedule <wgmma, tile = [64, 256, 64], stages = 4> {maps = array<i64: {{[0-9]+}}, {{[0-9]+}}>, transpose_a, transpose_b} : memref<332x64xbf16>, memref<332x128xbf16> -> memref<4x64x128xbf16>
// TC-NEXT: mk.gemm store {{.*}} schedule <wgmma{{[^>]*}}> {maps = array<i64: 15, 16>, transpose_b} : memref<40x64xbf16>, memref<64x128xbf16> -> memref<40x128xf32>
// TC-NEXT: mk.gemm store {{.*}} schedule <wgmma{{[^>]*}}> {{.*}}transpose_a, transpose_b} : memref<40x64xbf16>, memref<40x128xbf16> -> memref<64x128xbf16>
// The gate/up dgrads compute every row (a padding skip slowed the routed
// one on the H200).
// TC: mk.gemm store {{.*}} grouped({{.*}}) maps({{[^)]*}}) concat({{.*}}) schedule <wgmma{{[^>]*}}> {maps = array<i64: 5, 7, 11, 6>, transpose_b} : memref<332x128xbf16>, memref<4x128x64xbf16>, memref<4x128x64xbf16> -> memref<332x64xbf16>
// TC-NEXT: mk.gemm store {{.*}} k_groups({{.*}}) k_counts(%[[TCNT]] : memref<4xi64>) {{.*}}schedule <wgmma{{[^>]*}}>
// TC-NEXT: mk.gemm store {{.*}} k_groups({{.*}}) k_counts(%[[TCNT]] : memref<4xi64>) {{.*}}schedule <wgmma{{[^>]*}}>
// TC-NEXT: mk.gemm store {{.*}} maps({{[^)]*}}) concat({{.*}}) schedule <wgmma{{[^>]*}}> {maps = array<i64: 17, 19, 20, 18>,

// The training forward: the context is a list of outputs after `out`
// (routed rows at the plan's capacity, 332), and the gate/up GEMMs save the
// activation's inputs.
// CHECK-LABEL: gpu.func @layer_forward_forward(
// CHECK-SAME: %[[X:[^:]*]]: memref<40x64xbf16>
// CHECK-SAME: memref<40x64xbf16>, %[[RX:[^:]*]]: memref<332x64xbf16>, %[[G:[^:]*]]: memref<332x128xbf16>, %[[U:[^:]*]]: memref<332x128xbf16>, %[[H:[^:]*]]: memref<332x128xbf16>, %[[SG:[^:]*]]: memref<40x128xbf16>, %[[SU:[^:]*]]: memref<40x128xbf16>, %[[SH:[^:]*]]: memref<40x128xbf16>
// CHECK-SAME: {align = 16 : i64, dtype = "bf16", name = "out", role = "output", shape = array<i64: 40, 64>}, {align = 16 : i64, dtype = "bf16", name = "routed_x", role = "output", shape = array<i64: 332, 64>}, {align = 16 : i64, dtype = "bf16", name = "gate", role = "output"
// CHECK: mk.gather %[[X]], %{{.*}}, %{{.*}} into %[[RX]]
// CHECK: mk.gemm swiglu %[[RX]], %{{.*}}, %{{.*}} into %[[H]] grouped(%{{.*}}) saves(%[[G]], %[[U]] : memref<332x128xbf16>, memref<332x128xbf16>) {{.*}}schedule <simt>
// CHECK: mk.gemm swiglu %[[X]], %{{.*}}, %{{.*}} into %[[SH]] saves(%[[SG]], %[[SU]] : memref<40x128xbf16>, memref<40x128xbf16>) {{.*}}schedule <simt>

// CHECK-LABEL: gpu.func @layer_backward_backward(
// CHECK-SAME: %[[DOUT:[^:]*]]: memref<40x64xbf16>, %[[BX:[^:]*]]: memref<40x64xbf16>, %[[TOP:[^:]*]]: memref<40x2xi32>, %[[RW:[^:]*]]: memref<40x2xf32>, %[[WG:[^:]*]]: memref<4x128x64xbf16>, %[[WU:[^:]*]]: memref<4x128x64xbf16>, %[[WD:[^:]*]]: memref<4x64x128xbf16>, %[[SWG:[^:]*]]: memref<128x64xbf16>, %[[SWU:[^:]*]]: memref<128x64xbf16>, %[[SWD:[^:]*]]: memref<64x128xbf16>, %[[CRX:[^:]*]]: memref<332x64xbf16>, %[[CG:[^:]*]]: memref<332x128xbf16>, %[[CU:[^:]*]]: memref<332x128xbf16>, %[[CH:[^:]*]]: memref<332x128xbf16>, %[[CSG:[^:]*]]: memref<40x128xbf16>, %[[CSU:[^:]*]]: memref<40x128xbf16>, %[[CSH:[^:]*]]: memref<40x128xbf16>, %[[DX:[^:]*]]: memref<40x64xbf16>, %[[DRW:[^:]*]]: memref<40x2xf32>, %[[DWG:[^:]*]]: memref<4x128x64xbf16>, %[[DWU:[^:]*]]: memref<4x128x64xbf16>, %[[DWD:[^:]*]]: memref<4x64x128xbf16>, %[[DSG:[^:]*]]: memref<128x64xbf16>, %[[DSU:[^:]*]]: memref<128x64xbf16>, %[[DSD:[^:]*]]: memref<64x128xbf16>,
// CHECK-SAME: {access = "pointer", dtype = "bf16", name = "gate_weights", role = "input", shape = array<i64: 4, 128, 64>}
// CHECK-SAME: {align = 16 : i64, dtype = "bf16", name = "d_x", role = "output", shape = array<i64: 40, 64>}, {align = 16 : i64, dtype = "f32", name = "d_router_weights", role = "output", shape = array<i64: 40, 2>}
// CHECK: mk.scan_chunks %{{.*}} into %[[CNT:[^ ]*]] : memref<3x4xi64>, memref<4xi64>
// CHECK: mk.assign_rows %[[TOP]], %[[OFF:[^,]*]], %{{.*}} into %[[RR:[^,]*]], %[[ROWR:[^,]*]], %[[ROWE:[^ ]*]]
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gather %[[DOUT]], %[[ROWR]], %[[OFF]] into %[[RDOUT:[^ ]*]] {top_k = 2 : i64}
// CHECK-NEXT: mk.gather %[[DOUT]], %[[ROWR]], %[[OFF]] into %[[DY:[^ ]*]] scale(%[[RW]] : memref<40x2xf32>)
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gemm store %[[RDOUT]], %[[WD]] into %[[DHU:[^ ]*]] grouped(%[[ROWE]], %[[OFF]] : {{.*}}) schedule <simt> {transpose_b} : memref<332x64xbf16>, memref<4x64x128xbf16> -> memref<332x128xf32>
// CHECK-NEXT: mk.gemm store %[[DY]], %[[CH]] into %[[DWD]] k_groups(%[[OFF]] : memref<5xi64>) k_counts(%[[CNT]] : memref<4xi64>) schedule <simt> {transpose_a, transpose_b} : memref<332x64xbf16>, memref<332x128xbf16> -> memref<4x64x128xbf16>
// CHECK-NEXT: mk.gemm store %[[DOUT]], %[[SWD]] into %[[DSHU:[^ ]*]] schedule <simt> {transpose_b} : memref<40x64xbf16>, memref<64x128xbf16> -> memref<40x128xf32>
// CHECK-NEXT: mk.gemm store %[[DOUT]], %[[CSH]] into %[[DSD]] schedule <simt> {transpose_a, transpose_b}
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.swiglu_grad %[[DHU]], %[[CG]], %[[CU]], %[[CH]] into %[[DG:[^,]*]], %[[DU:[^ ]*]] routes(%[[ROWR]], %[[RR]], %[[RW]], %[[OFF]] : {{.*}}) -> %[[DRW]] {swiglu_limit = 7.000000e+00 : f32}
// CHECK-NEXT: mk.swiglu_grad %[[DSHU]], %[[CSG]], %[[CSU]], %[[CSH]] into %[[DSGA:[^,]*]], %[[DSUA:[^ ]*]] {swiglu_limit
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gemm store %[[DG]], %[[WG]], %[[WU]] into %[[DRX:[^ ]*]] grouped(%[[ROWE]], %[[OFF]] : {{.*}}) concat(%[[DU]] : memref<332x128xbf16>) schedule <simt> {transpose_b}
// CHECK-NEXT: mk.gemm store %[[DG]], %[[CRX]] into %[[DWG]] k_groups(%[[OFF]] : memref<5xi64>) k_counts(%[[CNT]] : memref<4xi64>) schedule <simt> {transpose_a, transpose_b}
// CHECK-NEXT: mk.gemm store %[[DU]], %[[CRX]] into %[[DWU]] k_groups(%[[OFF]] : memref<5xi64>) k_counts(%[[CNT]] : memref<4xi64>) schedule <simt> {transpose_a, transpose_b}
// CHECK-NEXT: mk.gemm store %[[DSGA]], %[[SWG]], %[[SWU]] into %[[DSX:[^ ]*]] concat(%[[DSUA]] : memref<40x128xbf16>) schedule <simt> {transpose_b}
// CHECK-NEXT: mk.gemm store %[[DSGA]], %[[BX]] into %[[DSG]] schedule <simt> {transpose_a, transpose_b}
// CHECK-NEXT: mk.gemm store %[[DSUA]], %[[BX]] into %[[DSU]] schedule <simt> {transpose_a, transpose_b}
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.combine %[[DRX]], %[[RR]] shared(%[[DSX]] : memref<40x64xbf16>) into %[[DX]]
// CHECK-NEXT: gpu.return

// With recompute, the context is not an input: the backward repeats the
// forward's dispatch and gate/up GEMMs into its workspace first. The
// training forward is the inference kernel (tensor cores). On sm_100a the
// tcgen05 GEMMs take [64, 128, 64] tiles and d_out is copied, not gathered.
// RECOMPUTE-LABEL: gpu.func @layer_forward_forward(
// RECOMPUTE: mk.gemm swiglu {{.*}}schedule <tcgen05{{[^>]*}}>
// RECOMPUTE-LABEL: gpu.func @layer_backward_backward(
// RECOMPUTE-NOT: name = "gate", role = "input"
// RECOMPUTE: name = "gate", role = "workspace"
// RECOMPUTE: mk.assign_rows
// RECOMPUTE-NEXT: mk.grid_barrier
// RECOMPUTE-NEXT: mk.gather %{{.*}} into %[[RX:[^ ]*]] {top_k = 2 : i64}
// RECOMPUTE-NEXT: mk.grid_barrier
// RECOMPUTE-NEXT: mk.gemm swiglu %[[RX]], {{.*}} saves({{.*}}schedule <tcgen05{{[^>]*}}>
// RECOMPUTE-NEXT: mk.gemm swiglu {{.*}} saves({{.*}}schedule <tcgen05{{[^>]*}}>
// RECOMPUTE-NEXT: mk.grid_barrier
// RECOMPUTE-NEXT: mk.gather
// (tcgen05 has no padding skip: its down dgrad takes no `padding`.)
// RECOMPUTE: mk.gemm store {{[^(]*}} grouped({{[^)]*}}) maps({{[^)]*}}) schedule <tcgen05, tile = [64, 128, 64], stages = 4> {maps = array<i64: {{[0-9]+}}, {{[0-9]+}}>, transpose_b} : memref<332x64xbf16>, memref<4x64x128xbf16> -> memref<332x128xf32>
// RECOMPUTE: mk.gemm store {{.*}} k_groups({{.*}}) k_counts({{.*}}schedule <tcgen05{{[^>]*}}>

// On sm_90a the recompute GEMMs run on wgmma too (K-major, as forward's).
// RECOMPUTE90-LABEL: gpu.func @layer_backward_backward(
// RECOMPUTE90: mk.gemm swiglu {{.*}} grouped({{.*}}) maps({{.*}}) saves({{.*}}) schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: {{[0-9]+}}, {{[0-9]+}}, {{[0-9]+}}>, swiglu_limit = 7.000000e+00 : f32}
// RECOMPUTE90-NEXT: mk.gemm swiglu {{.*}} saves({{.*}}schedule <wgmma{{[^>]*}}>

// PROFILE-LABEL: gpu.func @layer_backward_backward(
// PROFILE-SAME: phases = ["plan: count", "plan: scan", "plan: offsets", "plan: assign", "reverse combine", "down dgrad + wgrad", "SwiGLU backward", "gate/up dgrad + wgrads", "reverse dispatch"]
// PROFILE-COUNT-10: mk.timestamp
// PROFILE-NOT: mk.timestamp
// PROFILE: gpu.return

func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
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
