// RUN: mok-opt %s --split-input-file --convert-moe-to-cpu --verify-diagnostics

// What the CPU lowering cannot run is rejected with an error at the op.

func.func @expert_parallel(%x: tensor<4x8xbf16>, %top: tensor<4x1xi32>, %rw: tensor<4x1xf32>,
                           %wg: tensor<2x4x8xbf16>, %wd: tensor<2x8x4xbf16>) -> tensor<4x8xbf16> {
  // expected-error @+1 {{convert-moe-to-cpu: expert parallelism (ep = 2) needs a communicator; the CPU backend runs ep = 1 only}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 4, top_k = 1, experts = 4, ep = 2, padding = 1>
      : (tensor<4x8xbf16>, tensor<4x1xi32>, tensor<4x1xf32>, tensor<2x4x8xbf16>,
         tensor<2x4x8xbf16>, tensor<2x8x4xbf16>) -> tensor<4x8xbf16>
  return %o : tensor<4x8xbf16>
}

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
