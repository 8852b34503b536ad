// RUN: mok-opt %s --split-input-file --moe-generate-backward | FileCheck %s
// RUN: mok-opt %s --split-input-file --moe-generate-backward=recompute=true | FileCheck %s --check-prefix=RECOMPUTE
// RUN: mok-opt %s --split-input-file --moe-generate-backward=main-grads=true | FileCheck %s --check-prefix=MAINGRADS
// RUN: mok-opt %s --split-input-file --moe-generate-backward=main-grads=true | mok-opt --split-input-file | FileCheck %s --check-prefix=MAINGRADS

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// An unfused chain: the pass fuses it, keeps @layer as the inference form and
// adds the training forward (output + context) and the backward.
// CHECK-LABEL: func.func @layer(
// CHECK-NEXT: moe.layer
// CHECK-NEXT: return

// CHECK-LABEL: func.func @layer_forward(
// CHECK-SAME: -> (tensor<64x32xbf16>, tensor<?x32xbf16> {moe.saved = "routed_x"}, tensor<?x48xbf16> {moe.saved = "gate"}, tensor<?x48xbf16> {moe.saved = "up"}, tensor<?x48xbf16> {moe.saved = "hidden"})
// CHECK-NEXT: %[[OUT:.*]], %[[CTX:.*]]:4 = moe.layer
// CHECK-NEXT: return %[[OUT]], %[[CTX]]#0, %[[CTX]]#1, %[[CTX]]#2, %[[CTX]]#3

// CHECK-LABEL: func.func @layer_backward(
// CHECK-SAME: %[[X:[^:]*]]: tensor<64x32xbf16>, %[[TOP:[^:]*]]: tensor<64x2xi32>, %[[RW:[^:]*]]: tensor<64x2xf32>, %[[WG:[^:]*]]: tensor<4x48x32xbf16>, %[[WU:[^:]*]]: tensor<4x48x32xbf16>, %[[WD:[^:]*]]: tensor<4x32x48xbf16>,
// CHECK-SAME: %[[XR:[^:]*]]: tensor<?x32xbf16> {moe.saved = "routed_x"}, %[[G:[^:]*]]: tensor<?x48xbf16> {moe.saved = "gate"}, %[[U:[^:]*]]: tensor<?x48xbf16> {moe.saved = "up"}, %[[H:[^:]*]]: tensor<?x48xbf16> {moe.saved = "hidden"}, %[[DOUT:[^:]*]]: tensor<64x32xbf16> {moe.cotangent})
// CHECK-SAME: -> (tensor<64x32xbf16> {moe.gradient_of = 0 : i64}, tensor<64x2xf32> {moe.gradient_of = 2 : i64}, tensor<4x48x32xbf16> {moe.gradient_of = 3 : i64}, tensor<4x48x32xbf16> {moe.gradient_of = 4 : i64}, tensor<4x32x48xbf16> {moe.gradient_of = 5 : i64})
// CHECK-NEXT: %[[DX:.*]], %[[DRW:.*]], %[[DWG:.*]], %[[DWU:.*]], %[[DWD:.*]] = moe.layer_grad %[[DOUT]], %[[X]], %[[TOP]], %[[RW]], gate %[[WG]], up %[[WU]], down %[[WD]] saved(%[[XR]], %[[G]], %[[U]], %[[H]]) plan !plan {swiglu_limit = 7.000000e+00 : f32}
// CHECK-NEXT: return %[[DX]], %[[DRW]], %[[DWG]], %[[DWU]], %[[DWD]]

// main-grads: one fp32 main_grad per weight after d_out (tagged with the
// weight's argument), and the weights' gradients fp32, main_grad + dW.
// MAINGRADS-LABEL: func.func @layer_backward(
// MAINGRADS-SAME: %[[DOUT:[^:]*]]: tensor<64x32xbf16> {moe.cotangent}, %[[MG:[^:]*]]: tensor<4x48x32xf32> {moe.main_grad_of = 3 : i64}, %[[MU:[^:]*]]: tensor<4x48x32xf32> {moe.main_grad_of = 4 : i64}, %[[MD:[^:]*]]: tensor<4x32x48xf32> {moe.main_grad_of = 5 : i64})
// MAINGRADS-SAME: -> (tensor<64x32xbf16> {moe.gradient_of = 0 : i64}, tensor<64x2xf32> {moe.gradient_of = 2 : i64}, tensor<4x48x32xf32> {moe.gradient_of = 3 : i64}, tensor<4x48x32xf32> {moe.gradient_of = 4 : i64}, tensor<4x32x48xf32> {moe.gradient_of = 5 : i64})
// MAINGRADS-NEXT: moe.layer_grad %[[DOUT]], {{.*}} main_grads(%[[MG]], %[[MU]], %[[MD]]) plan !plan

// Recomputing saves nothing: the forward returns only the output and the
// backward has no context arguments.
// RECOMPUTE-LABEL: func.func @layer_forward(
// RECOMPUTE-SAME: -> tensor<64x32xbf16>
// RECOMPUTE-LABEL: func.func @layer_backward(
// RECOMPUTE-SAME: %{{[^:]*}}: tensor<4x32x48xbf16>, %[[DOUT:[^:]*]]: tensor<64x32xbf16> {moe.cotangent})
// RECOMPUTE: moe.layer_grad %[[DOUT]]
// RECOMPUTE-NOT: saved(
// RECOMPUTE-SAME: plan
func.func @layer(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                 %wg: tensor<4x48x32xbf16>, %wu: tensor<4x48x32xbf16>,
                 %wd: tensor<4x32x48xbf16>) -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu {swiglu_limit = 7.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 2, padding = 16>

// A fused layer with a shared expert and a dynamic token count: the shared
// context is [T, I_s], and the argument order (router weights first) is
// kept in the gradients' moe.gradient_of.
// CHECK-LABEL: func.func @shared_forward(
// CHECK-SAME: tensor<?x24xbf16> {moe.saved = "shared_gate"}, tensor<?x24xbf16> {moe.saved = "shared_up"}, tensor<?x24xbf16> {moe.saved = "shared_hidden"})
// CHECK-LABEL: func.func @shared_backward(
// CHECK-SAME: -> (tensor<?x2xf32> {moe.gradient_of = 0 : i64}, tensor<?x32xbf16> {moe.gradient_of = 1 : i64}, tensor<4x48x32xbf16> {moe.gradient_of = 3 : i64}, tensor<4x48x32xbf16> {moe.gradient_of = 4 : i64}, tensor<4x32x48xbf16> {moe.gradient_of = 5 : i64}, tensor<24x32xbf16> {moe.gradient_of = 6 : i64}, tensor<24x32xbf16> {moe.gradient_of = 7 : i64}, tensor<32x24xbf16> {moe.gradient_of = 8 : i64})
// CHECK: %[[DX:[^,]*]], %[[DRW:[^,]*]], %[[DWG:[^,]*]], %[[DWU:[^,]*]], %[[DWD:[^,]*]], %[[DS:.*]]:3 = moe.layer_grad
// CHECK-NEXT: return %[[DRW]], %[[DX]], %[[DWG]], %[[DWU]], %[[DWD]], %[[DS]]#0, %[[DS]]#1, %[[DS]]#2
// RECOMPUTE-LABEL: func.func @shared_forward(
// RECOMPUTE-SAME: -> tensor<?x32xbf16>
func.func @shared(%rw: tensor<?x2xf32>, %x: tensor<?x32xbf16>, %top: tensor<?x2xi64>,
                  %wg: tensor<4x48x32xbf16>, %wu: tensor<4x48x32xbf16>,
                  %wd: tensor<4x32x48xbf16>, %sg: tensor<24x32xbf16>,
                  %su: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>) -> tensor<?x32xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      : (tensor<?x32xbf16>, tensor<?x2xi64>, tensor<?x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<24x32xbf16>,
         tensor<24x32xbf16>, tensor<32x24xbf16>) -> tensor<?x32xbf16>
  return %o : tensor<?x32xbf16>
}

// -----

// Functions without MoE ops are left alone.
// CHECK-LABEL: func.func @no_moe
// CHECK-NOT: func.func @no_moe_forward
func.func @no_moe(%a: f32) -> f32 {
  return %a : f32
}
