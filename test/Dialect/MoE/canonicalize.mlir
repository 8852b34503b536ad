// RUN: mok-opt %s --split-input-file --canonicalize | FileCheck %s

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// A clamp at +inf is no clamp: the attribute is dropped; finite ones stay.
// CHECK-LABEL: func.func @infinite_limit
func.func @infinite_limit(%xr: tensor<?x32xbf16>, %p: !plan, %w: tensor<4x48x32xbf16>,
                          %x: tensor<64x32xbf16>, %sg: tensor<24x32xbf16>,
                          %sd: tensor<32x24xbf16>)
    -> (tensor<?x48xbf16>, tensor<?x48xbf16>, tensor<64x32xbf16>) {
  // CHECK: moe.expert_swiglu
  // CHECK-NOT: swiglu_limit
  // CHECK-SAME: -> tensor<?x48xbf16>
  %a = moe.expert_swiglu %xr, %p, gate %w, up %w {swiglu_limit = 0x7F800000 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  // CHECK: moe.expert_swiglu {{.*}} {swiglu_limit = 7.000000e+00 : f32}
  %b = moe.expert_swiglu %xr, %p, gate %w, up %w {swiglu_limit = 7.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  // CHECK: moe.shared_expert
  // CHECK-NOT: swiglu_limit
  // CHECK-SAME: tensor<32x24xbf16>
  %c = moe.shared_expert %x, gate %sg, up %sg, down %sd {swiglu_limit = 0x7F800000 : f32}
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>
  return %a, %b, %c : tensor<?x48xbf16>, tensor<?x48xbf16>, tensor<64x32xbf16>
}

// -----

// CHECK-LABEL: func.func @layer_infinite_limit
func.func @layer_infinite_limit(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                                %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>,
                                %wd: tensor<4x32x48xbf16>) -> tensor<64x32xbf16> {
  // CHECK: moe.layer
  // CHECK-NOT: swiglu_limit
  // CHECK-SAME: -> tensor<64x32xbf16>
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      {swiglu_limit = 0x7F800000 : f32}
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

// The moe ops have no side effects: a chain whose result is unused is dead.
// CHECK-LABEL: func.func @dead_chain
// CHECK-NEXT: return
func.func @dead_chain(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                      %w: tensor<4x48x32xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32>
      -> !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>,
      !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16> -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w
      : tensor<?x32xbf16>, !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>,
        tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  return
}
