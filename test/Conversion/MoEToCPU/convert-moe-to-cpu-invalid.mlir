// RUN: mok-opt %s --split-input-file --convert-moe-to-cpu --verify-diagnostics

// What the CPU lowering cannot run is rejected with an error at the op.

// An expert-parallel layer is lowered as one fused op whose results the
// function returns (its stage functions replace it): not an unfused chain,
func.func @expert_parallel_chain(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>)
    -> tensor<?x8xbf16> {
  // expected-error @+1 {{convert-moe-to-cpu: an expert-parallel function (ep > 1) must be one fused moe.layer or moe.layer_grad returning its results; fuse the chain first (--moe-fuse-layer)}}
  %p = moe.plan %top : tensor<4x1xi32> -> !moe.plan<tokens = 4, top_k = 1, experts = 4, ep = 2, padding = 1>
  %xr = moe.dispatch %x, %p : tensor<4x8xbf16>, !moe.plan<tokens = 4, top_k = 1, experts = 4, ep = 2, padding = 1> -> tensor<?x8xbf16>
  return %xr : tensor<?x8xbf16>
}

// -----

// nor a function that returns something else,
func.func @expert_parallel_other_result(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>, %rw: tensor<4x1xf32>,
                                        %wg: tensor<2x4x8xbf16>, %wd: tensor<2x8x4xbf16>) -> tensor<4x8xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 4, top_k = 1, experts = 4, ep = 2, padding = 1>
      : (tensor<4x8xbf16>, tensor<4x1xi32>, tensor<4x1xf32>, tensor<2x4x8xbf16>,
         tensor<2x4x8xbf16>, tensor<2x8x4xbf16>) -> tensor<4x8xbf16>
  // expected-error @+1 {{convert-moe-to-cpu: an expert-parallel function (ep > 1) must be one fused moe.layer or moe.layer_grad returning its results}}
  return %x : tensor<4x8xbf16>
}

// -----

// nor a function something calls (its stages run on the host, between the
// ranks' exchanges),
// expected-error @+1 {{convert-moe-to-cpu: @called is an expert-parallel layer and is called; its stages run on the host, between the ranks' exchanges, and cannot be called as one function}}
func.func @called(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>, %rw: tensor<4x1xf32>,
                  %wg: tensor<2x4x8xbf16>, %wd: tensor<2x8x4xbf16>) -> tensor<4x8xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 4, top_k = 1, experts = 4, ep = 2, padding = 1>
      : (tensor<4x8xbf16>, tensor<4x1xi32>, tensor<4x1xf32>, tensor<2x4x8xbf16>,
         tensor<2x4x8xbf16>, tensor<2x8x4xbf16>) -> tensor<4x8xbf16>
  return %o : tensor<4x8xbf16>
}
func.func @caller(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>, %rw: tensor<4x1xf32>,
                  %wg: tensor<2x4x8xbf16>, %wd: tensor<2x8x4xbf16>) -> tensor<4x8xbf16> {
  %o = func.call @called(%x, %top, %rw, %wg, %wd)
      : (tensor<4x8xbf16>, tensor<4x1xi32>, tensor<4x1xf32>, tensor<2x4x8xbf16>,
         tensor<2x8x4xbf16>) -> tensor<4x8xbf16>
  return %o : tensor<4x8xbf16>
}

// -----

// nor one whose stage names are taken.
// expected-error @+1 {{convert-moe-to-cpu: the stage function @taken__ep_experts already exists}}
func.func @taken(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>, %rw: tensor<4x1xf32>,
                 %wg: tensor<2x4x8xbf16>, %wd: tensor<2x8x4xbf16>) -> tensor<4x8xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 4, top_k = 1, experts = 4, ep = 2, padding = 1>
      : (tensor<4x8xbf16>, tensor<4x1xi32>, tensor<4x1xf32>, tensor<2x4x8xbf16>,
         tensor<2x4x8xbf16>, tensor<2x8x4xbf16>) -> tensor<4x8xbf16>
  return %o : tensor<4x8xbf16>
}
func.func private @taken__ep_experts()

// -----

// -----

func.func @other_op(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>) -> tensor<?x8xbf16> {
  %p = moe.plan %top : tensor<4x1xi32> -> !moe.plan<tokens = 4, top_k = 1, experts = 2, ep = 1, padding = 1>
  // expected-error @+1 {{convert-moe-to-cpu: 'arith.constant' is not supported in a MoE function}}
  %c = arith.constant 1.0 : f32
  %xr = moe.dispatch %x, %p : tensor<4x8xbf16>, !moe.plan<tokens = 4, top_k = 1, experts = 2, ep = 1, padding = 1> -> tensor<?x8xbf16>
  return %xr : tensor<?x8xbf16>
}

// -----

!plan = !moe.plan<tokens = 4, top_k = 1, experts = 2, ep = 1, padding = 1>
// expected-error @+1 {{convert-moe-to-cpu: argument of type '!moe.plan<tokens = 4, top_k = 1, experts = 2, ep = 1, padding = 1>' is not supported; only ranked tensors}}
func.func @plan_argument(%p: !plan, %x: tensor<4x8xbf16>) -> tensor<?x8xbf16> {
  %xr = moe.dispatch %x, %p : tensor<4x8xbf16>, !plan -> tensor<?x8xbf16>
  return %xr : tensor<?x8xbf16>
}

// -----

// main_grads (main_grad + dW in place) is a GPU-target feature, with or
// without expert parallelism.
func.func @main_grads(%d: tensor<8x16xbf16>, %x: tensor<8x16xbf16>, %top: tensor<8x2xi32>,
                      %rw: tensor<8x2xf32>, %wg: tensor<2x8x16xbf16>, %wd: tensor<2x16x8xbf16>,
                      %mg: tensor<2x8x16xf32>, %md: tensor<2x16x8xf32>)
    -> (tensor<8x16xbf16>, tensor<8x2xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>,
        tensor<2x16x8xf32>) {
  // expected-error @+1 {{convert-moe-to-cpu: main_grads (main_grad + dW) is implemented for the GPU targets only}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd main_grads(%mg, %mg, %md)
      plan !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 2, padding = 1>
      : (tensor<8x16xbf16>, tensor<8x16xbf16>, tensor<8x2xi32>, tensor<8x2xf32>,
         tensor<2x8x16xbf16>, tensor<2x8x16xbf16>, tensor<2x16x8xbf16>,
         tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x16x8xf32>)
      -> (tensor<8x16xbf16>, tensor<8x2xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>,
          tensor<2x16x8xf32>)
  return %g#0, %g#1, %g#2, %g#3, %g#4 : tensor<8x16xbf16>, tensor<8x2xf32>, tensor<2x8x16xf32>,
      tensor<2x8x16xf32>, tensor<2x16x8xf32>
}
