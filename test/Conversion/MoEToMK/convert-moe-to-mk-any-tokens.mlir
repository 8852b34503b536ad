// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_90a | FileCheck %s
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk=chip=sm_90a | FileCheck %s --check-prefix=BWD
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_100a --convert-mk-to-gpu | FileCheck %s --check-prefix=LOWER

// A layer for any token count up to a capacity (max_tokens = 300): the
// kernel's buffers are sized for 300 tokens, the call's T is one more
// parameter (role "tokens", an i64), and every step over tokens reads it.

!plan = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 1, padding = 128, max_tokens = 300>

// CHECK-LABEL: gpu.func @layer_forward
// CHECK-SAME: %arg0: memref<300x512xbf16>
// CHECK-SAME: %[[T:arg[0-9]+]]: i64
// CHECK-SAME: any_tokens = true
// CHECK-SAME: max_tokens = 300 : i64
// CHECK-SAME: {access = "pointer", call_rows = array<i64: 1, 0>, dtype = "bf16", name = "x", role = "input", shape = array<i64: 300, 512>}
// CHECK-SAME: {align = 16 : i64, call_rows = array<i64: 1, 0>, dtype = "bf16", name = "out", role = "output", shape = array<i64: 300, 512>}
// CHECK-SAME: {align = 16 : i64, call_rows = array<i64: 2, 0>, dtype = "i64", name = "route_row", role = "workspace", shape = array<i64: 600>}
// CHECK-SAME: {align = 16 : i64, call_rows = array<i64: 2, 1016>, dtype = "i64", name = "row_route", role = "workspace", shape = array<i64: 1616>}
// CHECK-SAME: {dtype = "i64", name = "tokens", role = "tokens", shape = array<i64>}
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "x", call_rows = array<i64: 1, 0>
// The routed weights' maps do not follow T.
// CHECK-SAME: {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "shared_gate_weights", cols = 512 : i64, experts = 1 : i64, row_stride = 512 : i64, rows = 256 : i64}
// CHECK: %[[N:.*]] = arith.index_cast %[[T]] : i64 to index
// CHECK: mk.check_routes {{.*}} tokens(%[[N]])
// CHECK: mk.count_routes {{.*}} tokens(%[[N]])
// CHECK: mk.assign_rows {{.*}} tokens(%[[N]])
// The routed GEMMs take their rows from the plan; the shared ones from T.
// CHECK: mk.gemm swiglu {{.*}} grouped({{.*}}) maps({{.*}}) gather({{.*}}) schedule
// CHECK: mk.gemm swiglu {{.*}} maps({{.*}}) tokens(%[[N]]) schedule
// CHECK: mk.gemm store {{.*}} grouped({{.*}}) maps({{.*}}) padding({{.*}}) schedule
// CHECK: mk.gemm store {{.*}} maps({{.*}}) tokens(%[[N]]) schedule
// CHECK: mk.combine {{.*}} tokens(%[[N]])

// BWD-LABEL: gpu.func @layer_forward_forward
// BWD-SAME: {align = 16 : i64, call_rows = array<i64: 2, 1016>, dtype = "bf16", name = "routed_x", role = "output", shape = array<i64: 1616, 512>}
// BWD-SAME: {align = 16 : i64, call_rows = array<i64: 1, 0>, dtype = "bf16", name = "shared_gate", role = "output", shape = array<i64: 300, 256>}
// BWD-LABEL: gpu.func @layer_backward_backward
// BWD-SAME: %[[T:arg[0-9]+]]: i64
// BWD: %[[N:.*]] = arith.index_cast %[[T]] : i64 to index
// The shared down dgrad over T rows, and its weights' gradient summing
// over the call's T tokens (K).
// BWD: mk.gemm store {{.*}} maps({{.*}}) tokens(%[[N]]) schedule <wgmma, {{.*}}> {maps = {{.*}}, transpose_b}
// BWD: mk.gemm store {{.*}} maps({{.*}}) tokens(%[[N]]) schedule <wgmma, {{.*}}> {maps = {{.*}}, transpose_a, transpose_b}
// BWD: mk.swiglu_grad {{.*}} routes({{.*}}) -> %{{.*}} tokens(%[[N]])
// BWD: mk.swiglu_grad {{.*}} tokens(%[[N]])
// BWD: mk.gemm store {{.*}} concat({{.*}}) tokens(%[[N]]) schedule
// BWD: mk.combine {{.*}} into %{{.*}} tokens(%[[N]])

// LOWER-LABEL: gpu.func @layer_forward
// LOWER-NOT: mk.
// LOWER: gpu.return

func.func @layer(%x: tensor<?x512xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>,
                 %wg: tensor<8x256x512xbf16>, %wu: tensor<8x256x512xbf16>, %wd: tensor<8x512x256xbf16>,
                 %sg: tensor<256x512xbf16>, %su: tensor<256x512xbf16>, %sd: tensor<512x256xbf16>)
    -> tensor<?x512xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      : (tensor<?x512xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<8x256x512xbf16>,
         tensor<8x256x512xbf16>, tensor<8x512x256xbf16>, tensor<256x512xbf16>,
         tensor<256x512xbf16>, tensor<512x256xbf16>) -> tensor<?x512xbf16>
  return %out : tensor<?x512xbf16>
}
