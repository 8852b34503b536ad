// RUN: mok-opt %s --split-input-file --convert-moe-to-cpu | FileCheck %s
// RUN: mok-opt %s --split-input-file --moe-generate-backward --convert-moe-to-cpu | FileCheck %s --check-prefix=TRAIN
// RUN: mok-opt %s --split-input-file --moe-generate-backward=recompute=true --convert-moe-to-cpu | FileCheck %s --check-prefix=RECOMPUTE
// RUN: mok-opt %s --split-input-file --moe-generate-backward --moe-to-cpu | FileCheck %s --check-prefix=LLVM

// An expert-parallel layer (ep = 2: 4 experts, 2 a rank) becomes three stage
// functions, which a host runs on every rank with the exchanges in between
// (docs/ExpertParallel.md); the layer function itself is gone.

!plan = !moe.plan<tokens = 6, top_k = 2, experts = 4, ep = 2, padding = 2>

// CHECK-NOT: func.func @layer(
// send: counts per destination rank, then each token packed once per
// destination rank.
// CHECK-LABEL: func.func @layer__ep_send(
// CHECK-SAME: memref<6x2xi32> {moe.buffer = "top_experts"}, %{{[^:]*}}: memref<6x8xbf16> {moe.buffer = "x"}
// CHECK-SAME: memref<2xi64> {moe.buffer = "send_rows"}, %{{[^:]*}}: memref<2xi64> {moe.buffer = "send_routes"}
// CHECK-SAME: memref<?xi32> {moe.buffer = "token"}, %{{[^:]*}}: memref<?x2xi32> {moe.buffer = "expert_ids"}, %[[XROWS:[^:]*]]: memref<?x8xbf16> {moe.buffer = "x_rows"})
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NOT: moe.
// The destination rank of a route is its expert id / (E / ep).
// CHECK: arith.divsi %{{.*}}, %c2{{.*}} : index
// CHECK: arith.index_cast %{{.*}} : index to i64
// A packed row is written only where the caller's buffer has it.
// CHECK: %[[N:.*]] = memref.dim %[[XROWS]], %c0
// CHECK: arith.cmpi slt, %{{.*}}, %[[N]]
// CHECK: memref.store %{{.*}}, %[[XROWS]]
// CHECK: return

// experts: the plan over the local expert ids received, the local experts,
// and where each routed row goes back.
// CHECK-LABEL: func.func @layer__ep_experts(
// CHECK-SAME: memref<2xi64> {moe.buffer = "recv_rows"}, %{{[^:]*}}: memref<?xi32> {moe.buffer = "token"}, %{{[^:]*}}: memref<?x2xi32> {moe.buffer = "expert_ids"}, %{{[^:]*}}: memref<?x8xbf16> {moe.buffer = "x_rows"}
// CHECK-SAME: memref<2x4x8xbf16> {moe.buffer = "gate_weights"}, %{{[^:]*}}: memref<2x4x8xbf16> {moe.buffer = "up_weights"}, %{{[^:]*}}: memref<2x8x4xbf16> {moe.buffer = "down_weights"}
// CHECK-SAME: memref<?x8xbf16> {moe.buffer = "routed_y"}, %{{[^:]*}}: memref<?xi32> {moe.buffer = "dest_rank"}, %{{[^:]*}}: memref<?xi32> {moe.buffer = "dest_row"})
// CHECK: memref.alloc() : memref<2xindex>
// CHECK: math.exp
// CHECK: arith.minsi
// CHECK: return

// combine: the returned per-route rows weighted on the source rank.
// CHECK-LABEL: func.func @layer__ep_combine(
// CHECK-SAME: memref<6x8xbf16> {moe.buffer = "x"}, %{{[^:]*}}: memref<6x2xi32> {moe.buffer = "top_experts"}, %{{[^:]*}}: memref<6x2xf32> {moe.buffer = "router_weights"}
// CHECK-SAME: memref<?x8xbf16> {moe.buffer = "returned_y"}, %{{[^:]*}}: memref<6x8xbf16> {moe.buffer = "out"})
// CHECK: memref.load %{{.*}} : memref<6x2xf32>
// CHECK: arith.mulf
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: return

// The training functions: the forward's experts stage saves the routed
// context of the rows it received, the backward's stages mirror the
// forward's.
// TRAIN-LABEL: func.func @layer_forward__ep_experts(
// TRAIN-SAME: {moe.buffer = "dest_row"}, %{{[^:]*}}: memref<?x8xbf16> {moe.buffer = "routed_x"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "gate"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "up"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "hidden"})
// TRAIN-LABEL: func.func @layer_backward__ep_send(
// TRAIN-SAME: memref<6x2xi32> {moe.buffer = "top_experts"}, %{{[^:]*}}: memref<6x8xbf16> {moe.buffer = "d_out"}, %{{[^:]*}}: memref<6x2xf32> {moe.buffer = "router_weights"}, %{{[^:]*}}: memref<2xi64> {moe.buffer = "send_rows"}
// TRAIN-SAME: {moe.buffer = "d_out_rows"}, %{{[^:]*}}: memref<?x2xf32> {moe.buffer = "weights"})
// TRAIN-LABEL: func.func @layer_backward__ep_experts(
// TRAIN-SAME: {moe.buffer = "d_out_rows"}, %{{[^:]*}}: memref<?x2xf32> {moe.buffer = "weights"}, %{{[^:]*}}: memref<2x4x8xbf16> {moe.buffer = "gate_weights"}
// TRAIN-SAME: {moe.buffer = "routed_x"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "gate"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "up"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "hidden"}
// TRAIN-SAME: memref<?x8xbf16> {moe.buffer = "d_routed_x"}, %{{[^:]*}}: memref<?xf32> {moe.buffer = "d_route_weights"}, %{{[^:]*}}: memref<?xi32> {moe.buffer = "dest_rank"}, %{{[^:]*}}: memref<?xi32> {moe.buffer = "dest_row"}
// TRAIN-SAME: memref<2x4x8xbf16> {moe.buffer = "d_gate_weights"}, %{{[^:]*}}: memref<2x4x8xbf16> {moe.buffer = "d_up_weights"}, %{{[^:]*}}: memref<2x8x4xbf16> {moe.buffer = "d_down_weights"})
// TRAIN-LABEL: func.func @layer_backward__ep_combine(
// TRAIN-SAME: {moe.buffer = "d_out"}, %{{[^:]*}}: memref<?x8xbf16> {moe.buffer = "returned_dx"}, %{{[^:]*}}: memref<?xf32> {moe.buffer = "returned_dw"}, %{{[^:]*}}: memref<6x8xbf16> {moe.buffer = "d_x"}, %{{[^:]*}}: memref<6x2xf32> {moe.buffer = "d_router_weights"})

// Recomputing, the backward sends x too and saves nothing.
// RECOMPUTE-LABEL: func.func @layer_forward__ep_experts(
// RECOMPUTE-SAME: {moe.buffer = "dest_row"}) attributes
// RECOMPUTE-LABEL: func.func @layer_backward__ep_send(
// RECOMPUTE-SAME: {moe.buffer = "router_weights"}, %{{[^:]*}}: memref<6x8xbf16> {moe.buffer = "x"}
// RECOMPUTE-SAME: {moe.buffer = "weights"}, %{{[^:]*}}: memref<?x8xbf16> {moe.buffer = "x_rows"})
// RECOMPUTE-LABEL: func.func @layer_backward__ep_experts(
// RECOMPUTE-SAME: {moe.buffer = "x_rows"}, %{{[^:]*}}: memref<2x4x8xbf16> {moe.buffer = "gate_weights"}
// RECOMPUTE-NOT: {moe.buffer = "routed_x"}
// RECOMPUTE-SAME: {moe.buffer = "d_down_weights"})

// The stages lower to the LLVM dialect with C interfaces.
// LLVM-DAG: llvm.func @_mlir_ciface_layer_forward__ep_send(
// LLVM-DAG: llvm.func @_mlir_ciface_layer_forward__ep_experts(
// LLVM-DAG: llvm.func @_mlir_ciface_layer_backward__ep_combine(
func.func @layer(%x: tensor<6x8xbf16>, %top: tensor<6x2xi32>, %rw: tensor<6x2xf32>,
                 %wg: tensor<2x4x8xbf16>, %wu: tensor<2x4x8xbf16>,
                 %wd: tensor<2x8x4xbf16>) -> tensor<6x8xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<6x8xbf16>, tensor<6x2xi32>, tensor<6x2xf32>, tensor<2x4x8xbf16>,
         tensor<2x4x8xbf16>, tensor<2x8x4xbf16>) -> tensor<6x8xbf16>
  return %o : tensor<6x8xbf16>
}

// -----

// Any T, int64 ids and a shared expert: the token rows are dynamic, the
// shared expert runs in the combine stage (with its context in training).
!plan = !moe.plan<tokens = ?, top_k = 3, experts = 8, ep = 4, padding = 1>

// CHECK-LABEL: func.func @shared__ep_send(
// CHECK-SAME: memref<?x3xi64> {moe.buffer = "top_experts"}, %{{[^:]*}}: memref<?x16xbf16> {moe.buffer = "x"}, %{{[^:]*}}: memref<4xi64> {moe.buffer = "send_rows"}
// CHECK-LABEL: func.func @shared__ep_combine(
// CHECK-SAME: {moe.buffer = "router_weights"}, %{{[^:]*}}: memref<4x16xbf16> {moe.buffer = "shared_gate_weights"}, %{{[^:]*}}: memref<4x16xbf16> {moe.buffer = "shared_up_weights"}, %{{[^:]*}}: memref<16x4xbf16> {moe.buffer = "shared_down_weights"}, %{{[^:]*}}: memref<?x16xbf16> {moe.buffer = "returned_y"}, %{{[^:]*}}: memref<?x16xbf16> {moe.buffer = "out"})
// The shared expert's SwiGLU, clamped.
// CHECK: arith.minimumf
// CHECK: math.exp
// TRAIN-LABEL: func.func @shared_forward__ep_combine(
// TRAIN-SAME: {moe.buffer = "out"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "shared_gate"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "shared_up"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "shared_hidden"})
// TRAIN-LABEL: func.func @shared_backward__ep_combine(
// TRAIN-SAME: {moe.buffer = "shared_down_weights"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "shared_gate"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "shared_up"}, %{{[^:]*}}: memref<?x4xbf16> {moe.buffer = "shared_hidden"}, %{{[^:]*}}: memref<?x16xbf16> {moe.buffer = "d_out"}
// TRAIN-SAME: {moe.buffer = "d_router_weights"}, %{{[^:]*}}: memref<4x16xbf16> {moe.buffer = "d_shared_gate_weights"}, %{{[^:]*}}: memref<4x16xbf16> {moe.buffer = "d_shared_up_weights"}, %{{[^:]*}}: memref<16x4xbf16> {moe.buffer = "d_shared_down_weights"})
func.func @shared(%x: tensor<?x16xbf16>, %top: tensor<?x3xi64>, %rw: tensor<?x3xf32>,
                  %wg: tensor<2x8x16xbf16>, %wu: tensor<2x8x16xbf16>, %wd: tensor<2x16x8xbf16>,
                  %sg: tensor<4x16xbf16>, %su: tensor<4x16xbf16>,
                  %sd: tensor<16x4xbf16>) -> tensor<?x16xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      plan !plan {swiglu_limit = 2.0 : f32}
      : (tensor<?x16xbf16>, tensor<?x3xi64>, tensor<?x3xf32>, tensor<2x8x16xbf16>,
         tensor<2x8x16xbf16>, tensor<2x16x8xbf16>, tensor<4x16xbf16>, tensor<4x16xbf16>,
         tensor<16x4xbf16>) -> tensor<?x16xbf16>
  return %o : tensor<?x16xbf16>
}
