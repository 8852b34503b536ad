// RUN: mok-opt %s --split-input-file --moe-generate-backward --verify-diagnostics

// What moe-generate-backward does not support yet is rejected with an error
// at the op or function in the way.

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

func.func @other_op(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                    %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>, %c: f32) -> tensor<64x32xbf16> {
  // expected-error @+1 {{moe-generate-backward: cannot differentiate 'arith.addf'; only a function body of one MoE layer is supported}}
  %d = arith.addf %c, %c : f32
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd plan !plan
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

func.func @shared_argument(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                           %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) -> tensor<64x32xbf16> {
  // expected-error @+1 {{moe-generate-backward: function argument #3 feeds more than one operand of the layer; not supported}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd plan !plan
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

// expected-error @+1 {{moe-generate-backward: function argument #6 is not an operand of the layer; not supported}}
func.func @unused_argument(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                           %wg: tensor<4x48x32xbf16>, %wu: tensor<4x48x32xbf16>,
                           %wd: tensor<4x32x48xbf16>, %extra: tensor<4xf32>) -> tensor<64x32xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

func.func @unfusable(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                     %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>)
    -> (tensor<64x32xbf16>, tensor<?x48xbf16>) {
  %p = moe.plan %top : tensor<64x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x32xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x32xbf16>
  // expected-error @+1 {{moe-generate-backward: cannot fuse this layer (the moe.expert_swiglu result has another use); only fused layers can be differentiated}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return %o, %h : tensor<64x32xbf16>, tensor<?x48xbf16>
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>

func.func @name_taken_backward(%x: tensor<64x32xbf16>) {
  return
}
// expected-error @+1 {{moe-generate-backward: @name_taken_backward already exists}}
func.func @name_taken(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                      %wg: tensor<4x48x32xbf16>, %wu: tensor<4x48x32xbf16>,
                      %wd: tensor<4x32x48xbf16>) -> tensor<64x32xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return %o : tensor<64x32xbf16>
}

