// RUN: mok-opt %s --split-input-file --moe-fuse-layer | FileCheck %s
// RUN: mok-opt %s --split-input-file --moe-fuse-layer=remarks=true --verify-diagnostics > /dev/null

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// The chain without a shared expert becomes one moe.layer; nothing of the
// chain is left.
// CHECK-LABEL: func.func @routed_only
// CHECK-SAME: (%[[X:.*]]: tensor<64x32xbf16>, %[[TOP:.*]]: tensor<64x2xi32>, %[[RW:.*]]: tensor<64x2xf32>, %[[WG:.*]]: tensor<4x48x32xbf16>, %[[WU:.*]]: tensor<4x48x32xbf16>, %[[WD:.*]]: tensor<4x32x48xbf16>)
// CHECK-NEXT: %[[L:.*]] = moe.layer %[[X]], %[[TOP]], %[[RW]], gate %[[WG]], up %[[WU]], down %[[WD]] plan !{{.*}} : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
// CHECK-NEXT: return %[[L]]
func.func @routed_only(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                       %wg: tensor<4x48x32xbf16>, %wu: tensor<4x48x32xbf16>,
                       %wd: tensor<4x32x48xbf16>) -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// The shared expert and the clamp are fused with the routed chain.
// CHECK-LABEL: func.func @with_shared_expert
// CHECK-SAME: %[[SG:[^:]*]]: tensor<24x32xbf16>, %[[SU:[^:]*]]: tensor<24x32xbf16>, %[[SD:[^:]*]]: tensor<32x24xbf16>
// CHECK-NEXT: moe.layer {{.*}} shared(%[[SG]], %[[SU]], %[[SD]]) plan !{{.*}} {swiglu_limit = 7.000000e+00 : f32}
// CHECK-NEXT: return
func.func @with_shared_expert(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                              %wg: tensor<4x48x32xbf16>, %wu: tensor<4x48x32xbf16>,
                              %wd: tensor<4x32x48xbf16>, %sg: tensor<24x32xbf16>,
                              %su: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>)
    -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %s = moe.shared_expert %x, gate %sg, up %su, down %sd {swiglu_limit = 7.0 : f32}
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu {swiglu_limit = 7.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = ?, top_k = 1, experts = 4, ep = 1, padding = 1>

// A dynamic token count fuses like a static one.
// CHECK-LABEL: func.func @dynamic_tokens
// CHECK-NEXT: moe.layer {{.*}} -> tensor<?x16xbf16>
// CHECK-NEXT: return
func.func @dynamic_tokens(%x: tensor<?x16xbf16>, %top: tensor<?x1xi64>, %rw: tensor<?x1xf32>,
                          %wg: tensor<4x8x16xbf16>, %wd: tensor<4x16x8xbf16>)
    -> tensor<?x16xbf16> {
  %p = moe.plan %top : tensor<?x1xi64> -> !plan
  %xr = moe.dispatch %x, %p : tensor<?x16xbf16>, !plan -> tensor<?x16xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x16xbf16>, !plan, tensor<4x8x16xbf16> -> tensor<?x8xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x8xbf16>, !plan, tensor<4x16x8xbf16> -> tensor<?x16xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x16xbf16>, !plan, tensor<?x1xf32> -> tensor<?x16xbf16>
  return %o : tensor<?x16xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// Two layers on one plan both fuse; the plan dies with the second.
// CHECK-LABEL: func.func @two_layers_one_plan
// CHECK-NOT: moe.plan %
// CHECK: moe.layer
// CHECK: moe.layer
// CHECK-NOT: moe.plan %
func.func @two_layers_one_plan(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                               %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> (tensor<64x32xbf16>, tensor<64x32xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  %xr2 = moe.dispatch %o, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h2 = moe.expert_swiglu %xr2, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y2 = moe.expert_down %h2, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %o2 = moe.combine %y2, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o, %o2 : tensor<64x32xbf16>, tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// A plan with a user outside the chain is kept for that user.
// CHECK-LABEL: func.func @plan_used_elsewhere
// CHECK: %[[P:.*]] = moe.plan
// CHECK: moe.layer
// CHECK: return %{{.*}}, %[[P]]
func.func @plan_used_elsewhere(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                               %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> (tensor<64x32xbf16>, !plan) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o, %p : tensor<64x32xbf16>, !plan
}

// -----

// IR that is not an MoE chain is left alone.
// CHECK-LABEL: func.func @unrelated
// CHECK-NEXT: arith.addf
// CHECK-NEXT: return
func.func @unrelated(%a: f32) -> f32 {
  %b = arith.addf %a, %a : f32
  return %b : f32
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// The hidden activations are needed outside the layer (e.g. saved for
// backward): the chain stays.
// CHECK-LABEL: func.func @hidden_has_other_use
// CHECK-NOT: moe.layer
// CHECK: moe.combine
func.func @hidden_has_other_use(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> (tensor<64x32xbf16>, tensor<?x48xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the moe.expert_swiglu result has another use}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o, %h : tensor<64x32xbf16>, tensor<?x48xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @routed_x_has_other_use
// CHECK-NOT: moe.layer
func.func @routed_x_has_other_use(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                  %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> (tensor<64x32xbf16>, tensor<?x32xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the moe.dispatch result has another use}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o, %xr : tensor<64x32xbf16>, tensor<?x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @routed_y_has_other_use
// CHECK-NOT: moe.layer
func.func @routed_y_has_other_use(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                  %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> (tensor<64x32xbf16>, tensor<?x32xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the moe.expert_down result has another use}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o, %y : tensor<64x32xbf16>, tensor<?x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// Routed rows that come from elsewhere are not a chain.
// CHECK-LABEL: func.func @routed_y_from_argument
// CHECK: moe.combine
func.func @routed_y_from_argument(%y: tensor<?x32xbf16>, %p: !plan, %rw: tensor<64x2xf32>)
    -> tensor<64x32xbf16> {
  // expected-remark @+1 {{not fused into moe.layer: its routed_y is not produced by moe.expert_down}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @hidden_from_argument
// CHECK: moe.expert_down
// CHECK: moe.combine
func.func @hidden_from_argument(%h: tensor<?x48xbf16>, %p: !plan, %rw: tensor<64x2xf32>,
                                %wd: tensor<4x32x48xbf16>) -> tensor<64x32xbf16> {
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the moe.expert_down input is not produced by moe.expert_swiglu}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @routed_x_from_argument
// CHECK-NOT: moe.layer
func.func @routed_x_from_argument(%xr: tensor<?x32xbf16>, %p: !plan, %rw: tensor<64x2xf32>,
                                  %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> tensor<64x32xbf16> {
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the moe.expert_swiglu input is not produced by moe.dispatch}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// A plan passed in (not built here) leaves nothing to build the layer from.
// CHECK-LABEL: func.func @plan_from_argument
// CHECK-NOT: moe.layer
func.func @plan_from_argument(%x: tensor<64x32xbf16>, %p: !plan, %rw: tensor<64x2xf32>,
                              %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> tensor<64x32xbf16> {
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the routing plan is not produced by moe.plan}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @two_plans
// CHECK-NOT: moe.layer
func.func @two_plans(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %top2: tensor<64x2xi32>,
                     %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %p2 = moe.plan %top2 : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the chain uses more than one routing plan}}
  %o = moe.combine %y, %p2, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// A precomputed shared output is not a shared expert the layer can own.
// CHECK-LABEL: func.func @shared_from_argument
// CHECK-NOT: moe.layer
func.func @shared_from_argument(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                %s: tensor<64x32xbf16>) -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: its shared operand is not produced by moe.shared_expert}}
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @shared_on_other_tokens
// CHECK-NOT: moe.layer
func.func @shared_on_other_tokens(%x: tensor<64x32xbf16>, %x2: tensor<64x32xbf16>,
                                  %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                  %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                  %sg: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>)
    -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %s = moe.shared_expert %x2, gate %sg, up %sg, down %sd
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the shared expert and the routed experts read different tokens}}
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// CHECK-LABEL: func.func @shared_has_other_use
// CHECK-NOT: moe.layer
func.func @shared_has_other_use(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                %sg: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>)
    -> (tensor<64x32xbf16>, tensor<64x32xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %s = moe.shared_expert %x, gate %sg, up %sg, down %sd
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the moe.shared_expert result has another use}}
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  return %o, %s : tensor<64x32xbf16>, tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// One swiglu_limit serves both experts in moe.layer; different clamps stay
// unfused.
// CHECK-LABEL: func.func @different_limits
// CHECK-NOT: moe.layer
func.func @different_limits(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                            %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                            %sg: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>)
    -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %s = moe.shared_expert %x, gate %sg, up %sg, down %sd {swiglu_limit = 5.0 : f32}
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg {swiglu_limit = 7.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the shared and routed experts have different swiglu_limit}}
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// Fusing across blocks would move work across control flow.
// CHECK-LABEL: func.func @spans_blocks
// CHECK-NOT: moe.layer
func.func @spans_blocks(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                        %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> tensor<64x32xbf16> {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  cf.br ^bb1
^bb1:
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-remark @+1 {{not fused into moe.layer: the chain spans more than one block}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}
