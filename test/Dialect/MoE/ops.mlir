// RUN: mok-opt %s | mok-opt | FileCheck %s
// RUN: mok-opt %s --mlir-print-op-generic | mok-opt | FileCheck %s

// Round trip of every moe op and of the plan type, in the custom and the
// generic form.

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
!dplan = !moe.plan<tokens = ?, top_k = 1, experts = 4, ep = 1, padding = 1>
!cplan = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 1, padding = 16, max_tokens = 4096>
!rplan = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 4, padding = 16, max_tokens = 64, recv_capacity = 96>

// CHECK-DAG: ![[PLAN:.*]] = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
// CHECK-DAG: ![[DPLAN:.*]] = !moe.plan<tokens = ?, top_k = 1, experts = 4, ep = 1, padding = 1>
// CHECK-DAG: ![[CPLAN:.*]] = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 1, padding = 16, max_tokens = 4096>
// CHECK-DAG: ![[RPLAN:.*]] = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 4, padding = 16, max_tokens = 64, recv_capacity = 96>

// CHECK-LABEL: func.func @unfused_chain
func.func @unfused_chain(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                         %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>,
                         %wu: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                         %sg: tensor<24x32xbf16>, %su: tensor<24x32xbf16>,
                         %sd: tensor<32x24xbf16>) -> tensor<64x32xbf16> {
  // CHECK: %[[P:.*]] = moe.plan %{{.*}} : tensor<64x2xi32> -> ![[PLAN]]
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  // CHECK: %[[XR:.*]] = moe.dispatch %{{.*}}, %[[P]] : tensor<64x32xbf16>, ![[PLAN]] -> tensor<?x32xbf16>
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  // CHECK: %[[H:.*]] = moe.expert_swiglu %[[XR]], %[[P]], gate %{{.*}}, up %{{.*}} {swiglu_limit = 7.000000e+00 : f32} : tensor<?x32xbf16>, ![[PLAN]], tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu {swiglu_limit = 7.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  // CHECK: %[[Y:.*]] = moe.expert_down %[[H]], %[[P]], down %{{.*}} : tensor<?x48xbf16>, ![[PLAN]], tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // CHECK: %[[S:.*]] = moe.shared_expert %{{.*}}, gate %{{.*}}, up %{{.*}}, down %{{.*}} {swiglu_limit = 7.000000e+00 : f32} : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  %s = moe.shared_expert %x, gate %sg, up %su, down %sd {swiglu_limit = 7.0 : f32}
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  // CHECK: %[[OUT:.*]] = moe.combine %[[Y]], %[[P]], weights %{{.*}} shared %[[S]] : tensor<?x32xbf16>, ![[PLAN]], tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  %out = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x32xbf16> -> tensor<64x32xbf16>
  // CHECK: return %[[OUT]]
  return %out : tensor<64x32xbf16>
}

// CHECK-LABEL: func.func @combine_without_shared
func.func @combine_without_shared(%y: tensor<?x32xbf16>, %p: !plan,
                                  %rw: tensor<64x2xf32>) -> tensor<64x32xbf16> {
  // CHECK: moe.combine %{{.*}}, %{{.*}}, weights %{{.*}} : tensor<?x32xbf16>, ![[PLAN]], tensor<64x2xf32> -> tensor<64x32xbf16>
  %out = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %out : tensor<64x32xbf16>
}

// 64-bit expert ids, a dynamic token count, no clamp.
// CHECK-LABEL: func.func @dynamic_tokens
func.func @dynamic_tokens(%x: tensor<?x16xbf16>, %top: tensor<?x1xi64>,
                          %wg: tensor<4x8x16xbf16>, %wu: tensor<4x8x16xbf16>)
    -> tensor<?x8xbf16> {
  // CHECK: moe.plan %{{.*}} : tensor<?x1xi64> -> ![[DPLAN]]
  %p = moe.plan %top : tensor<?x1xi64> -> !dplan
  // CHECK: moe.dispatch %{{.*}} : tensor<?x16xbf16>, ![[DPLAN]] -> tensor<?x16xbf16>
  %xr = moe.dispatch %x, %p : tensor<?x16xbf16>, !dplan -> tensor<?x16xbf16>
  // CHECK: moe.expert_swiglu
  // CHECK-NOT: swiglu_limit
  // CHECK-SAME: -> tensor<?x8xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu
      : tensor<?x16xbf16>, !dplan, tensor<4x8x16xbf16> -> tensor<?x8xbf16>
  return %h : tensor<?x8xbf16>
}

// CHECK-LABEL: func.func @fused_layer
func.func @fused_layer(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                       %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>,
                       %wu: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                       %sg: tensor<24x32xbf16>, %su: tensor<24x32xbf16>,
                       %sd: tensor<32x24xbf16>)
    -> (tensor<64x32xbf16>, tensor<64x32xbf16>) {
  // CHECK: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, gate %{{.*}}, up %{{.*}}, down %{{.*}} plan ![[PLAN]] : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  %a = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  // CHECK: moe.layer {{.*}} shared(%{{.*}}, %{{.*}}, %{{.*}}) plan ![[PLAN]] {swiglu_limit = 1.000000e+01 : f32}
  %b = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      plan !plan {swiglu_limit = 10.0 : f32}
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<24x32xbf16>,
         tensor<24x32xbf16>, tensor<32x24xbf16>) -> tensor<64x32xbf16>
  return %a, %b : tensor<64x32xbf16>, tensor<64x32xbf16>
}

// The forward layer that returns its backward context, and the backward.
// CHECK-LABEL: func.func @training
func.func @training(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                    %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>,
                    %wu: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                    %sg: tensor<24x32xbf16>, %su: tensor<24x32xbf16>,
                    %sd: tensor<32x24xbf16>, %dout: tensor<64x32xbf16>)
    -> (tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<64x2xf32>) {
  // CHECK: %[[OUT:.*]], %[[S:.*]]:7 = moe.layer {{.*}} shared({{.*}}) plan ![[PLAN]] : {{.*}} -> (tensor<64x32xbf16>, tensor<?x32xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>, tensor<64x24xbf16>, tensor<64x24xbf16>, tensor<64x24xbf16>)
  %out, %s:7 = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      plan !plan
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<24x32xbf16>,
         tensor<24x32xbf16>, tensor<32x24xbf16>)
      -> (tensor<64x32xbf16>, tensor<?x32xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>,
          tensor<?x48xbf16>, tensor<64x24xbf16>, tensor<64x24xbf16>, tensor<64x24xbf16>)
  // CHECK: moe.layer_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, gate %{{.*}}, up %{{.*}}, down %{{.*}} shared(%{{.*}}, %{{.*}}, %{{.*}}) saved(%[[S]]#0, %[[S]]#1, %[[S]]#2, %[[S]]#3, %[[S]]#4, %[[S]]#5, %[[S]]#6) plan ![[PLAN]] {swiglu_limit = 7.000000e+00 : f32}
  %dx, %drw, %dwg, %dwu, %dwd, %dsh:3 = moe.layer_grad %dout, %x, %top, %rw,
      gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      saved(%s#0, %s#1, %s#2, %s#3, %s#4, %s#5, %s#6) plan !plan {swiglu_limit = 7.0 : f32}
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>,
         tensor<24x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>,
         tensor<?x32xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>,
         tensor<64x24xbf16>, tensor<64x24xbf16>, tensor<64x24xbf16>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>,
          tensor<4x32x48xbf16>, tensor<24x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>)
  // Recompute form: no shared expert, no saved context.
  // CHECK: moe.layer_grad
  // CHECK-NOT: saved(
  // CHECK-SAME: plan ![[PLAN]]
  %dx2, %drw2, %dwg2, %dwu2, %dwd2 = moe.layer_grad %dout, %x, %top, %rw,
      gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>,
          tensor<4x32x48xbf16>)
  return %out, %dsh#0, %drw2 : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<64x2xf32>
}

// A dynamic token count with a capacity (the GPU targets' any-T layers).
// CHECK: func.func private @capacity(![[CPLAN]])
func.func private @capacity(!cplan)
// An expert-parallel rank's receive capacity.
// CHECK: func.func private @receive_capacity(![[RPLAN]])
func.func private @receive_capacity(!rplan)
