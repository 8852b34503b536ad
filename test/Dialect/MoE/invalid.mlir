// RUN: mok-opt %s --split-input-file --verify-diagnostics

// One case per verifier rule of the plan type and the moe ops.

//===----------------------------------------------------------------------===//
// !moe.plan
//===----------------------------------------------------------------------===//

// expected-error @+1 {{top_k must be in [1, experts = 8], got 0}}
func.func private @f(!moe.plan<tokens = 4, top_k = 0, experts = 8, ep = 1, padding = 1>)

// -----

// expected-error @+1 {{top_k must be in [1, experts = 8], got 9}}
func.func private @f(!moe.plan<tokens = 4, top_k = 9, experts = 8, ep = 1, padding = 1>)

// -----

// expected-error @+1 {{experts (8) must be divisible by ep (3)}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 3, padding = 1>)

// -----

// expected-error @+1 {{ep must be positive, got 0}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 0, padding = 1>)

// -----

// expected-error @+1 {{experts must be positive, got 0}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 0, ep = 1, padding = 1>)

// -----

// expected-error @+1 {{padding must be a power of two, got 96}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 1, padding = 96>)

// -----

// expected-error @+1 {{tokens must be non-negative or '?', got -4}}
func.func private @f(!moe.plan<tokens = -4, top_k = 2, experts = 8, ep = 1, padding = 1>)

// -----

//===----------------------------------------------------------------------===//
// moe.plan
//===----------------------------------------------------------------------===//

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @plan_ids_type(%top: tensor<64x2xf32>) {
  // expected-error @+1 {{operand #0 must be 2D tensor of 32-bit signless integer or 64-bit signless integer values}}
  %p = moe.plan %top : tensor<64x2xf32> -> !plan
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @plan_tokens(%top: tensor<32x2xi32>) {
  // expected-error @+1 {{expects top_experts of shape [T, top_k] with T = 64, got 'tensor<32x2xi32>'}}
  %p = moe.plan %top : tensor<32x2xi32> -> !plan
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @plan_top_k(%top: tensor<64x4xi32>) {
  // expected-error @+1 {{expects top_experts of shape [T, top_k] with top_k = 2, got 'tensor<64x4xi32>'}}
  %p = moe.plan %top : tensor<64x4xi32> -> !plan
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @plan_dynamic_top_k(%top: tensor<64x?xi32>) {
  // expected-error @+1 {{expects top_experts [T, top_k] to have a static top_k, got 'tensor<64x?xi32>'}}
  %p = moe.plan %top : tensor<64x?xi32> -> !plan
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.dispatch
//===----------------------------------------------------------------------===//

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @dispatch_dtype(%x: tensor<64x32xf16>, %p: !plan) {
  // expected-error @+1 {{operand #0 must be 2D tensor of bfloat16 type values}}
  %xr = moe.dispatch %x, %p : tensor<64x32xf16>, !plan -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @dispatch_rank(%x: tensor<64x32x1xbf16>, %p: !plan) {
  // expected-error @+1 {{operand #0 must be 2D tensor of bfloat16 type values}}
  %xr = moe.dispatch %x, %p : tensor<64x32x1xbf16>, !plan -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @dispatch_tokens(%x: tensor<128x32xbf16>, %p: !plan) {
  // expected-error @+1 {{expects x of shape [T, H] with T = 64, got 'tensor<128x32xbf16>'}}
  %xr = moe.dispatch %x, %p : tensor<128x32xbf16>, !plan -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @dispatch_dynamic_hidden(%x: tensor<64x?xbf16>, %p: !plan) {
  // expected-error @+1 {{expects x [T, H] to have a static H, got 'tensor<64x?xbf16>'}}
  %xr = moe.dispatch %x, %p : tensor<64x?xbf16>, !plan -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @dispatch_static_rows(%x: tensor<64x32xbf16>, %p: !plan) {
  // expected-error @+1 {{expects routed_x [R, H] to have a dynamic row count R (routed rows are data-dependent), got 'tensor<128x32xbf16>'}}
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<128x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @dispatch_result_hidden(%x: tensor<64x32xbf16>, %p: !plan) {
  // expected-error @+1 {{expects routed_x of shape [R, H] with H = 32, got 'tensor<?x16xbf16>'}}
  %xr = moe.dispatch %x, %p : tensor<64x32xbf16>, !plan -> tensor<?x16xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.expert_swiglu
//===----------------------------------------------------------------------===//

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_local_experts(%xr: tensor<?x32xbf16>, %p: !plan,
                                %w: tensor<8x48x32xbf16>) {
  // expected-error @+1 {{expects gate_weights of shape [E/ep, I, H] with E/ep = 4, got 'tensor<8x48x32xbf16>'}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w
      : tensor<?x32xbf16>, !plan, tensor<8x48x32xbf16> -> tensor<?x48xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_hidden_size(%xr: tensor<?x32xbf16>, %p: !plan,
                              %w: tensor<4x48x64xbf16>) {
  // expected-error @+1 {{expects gate_weights of shape [E/ep, I, H] with H = 32, got 'tensor<4x48x64xbf16>'}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w
      : tensor<?x32xbf16>, !plan, tensor<4x48x64xbf16> -> tensor<?x48xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_gate_up_differ(%xr: tensor<?x32xbf16>, %p: !plan,
                                 %wg: tensor<4x48x32xbf16>, %wu: tensor<4x24x32xbf16>) {
  // expected-error @+1 {{all of {gate_weights, up_weights} have same type}}
  %h = "moe.expert_swiglu"(%xr, %p, %wg, %wu)
      : (tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16>, tensor<4x24x32xbf16>) -> tensor<?x48xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_result_width(%xr: tensor<?x32xbf16>, %p: !plan,
                               %w: tensor<4x48x32xbf16>) {
  // expected-error @+1 {{expects hidden of shape [R, I] with I = 48, got 'tensor<?x32xbf16>'}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_dynamic_weights(%xr: tensor<?x32xbf16>, %p: !plan,
                                  %w: tensor<4x?x32xbf16>) {
  // expected-error @+1 {{expects gate_weights [E/ep, I, H] to have a static I, got 'tensor<4x?x32xbf16>'}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w
      : tensor<?x32xbf16>, !plan, tensor<4x?x32xbf16> -> tensor<?x48xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_empty_weights(%xr: tensor<?x32xbf16>, %p: !plan,
                                %w: tensor<4x0x32xbf16>) {
  // expected-error @+1 {{expects gate_weights [E/ep, I, H] to have a positive I, got 'tensor<4x0x32xbf16>'}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w
      : tensor<?x32xbf16>, !plan, tensor<4x0x32xbf16> -> tensor<?x0xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_negative_limit(%xr: tensor<?x32xbf16>, %p: !plan,
                                 %w: tensor<4x48x32xbf16>) {
  // expected-error @+1 {{expects swiglu_limit to be positive (or absent for no clamp), got -1}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w {swiglu_limit = -1.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_zero_limit(%xr: tensor<?x32xbf16>, %p: !plan,
                             %w: tensor<4x48x32xbf16>) {
  // expected-error @+1 {{expects swiglu_limit to be positive (or absent for no clamp), got 0}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w {swiglu_limit = 0.0 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @swiglu_nan_limit(%xr: tensor<?x32xbf16>, %p: !plan,
                            %w: tensor<4x48x32xbf16>) {
  // expected-error @+1 {{expects swiglu_limit to be positive (or absent for no clamp), got nan}}
  %h = moe.expert_swiglu %xr, %p, gate %w, up %w {swiglu_limit = 0x7FC00000 : f32}
      : tensor<?x32xbf16>, !plan, tensor<4x48x32xbf16> -> tensor<?x48xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.expert_down
//===----------------------------------------------------------------------===//

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @down_local_experts(%h: tensor<?x48xbf16>, %p: !plan,
                              %w: tensor<2x32x48xbf16>) {
  // expected-error @+1 {{expects down_weights of shape [E/ep, H, I] with E/ep = 4, got 'tensor<2x32x48xbf16>'}}
  %y = moe.expert_down %h, %p, down %w
      : tensor<?x48xbf16>, !plan, tensor<2x32x48xbf16> -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @down_intermediate(%h: tensor<?x48xbf16>, %p: !plan,
                             %w: tensor<4x32x64xbf16>) {
  // expected-error @+1 {{expects down_weights of shape [E/ep, H, I] with I = 48, got 'tensor<4x32x64xbf16>'}}
  %y = moe.expert_down %h, %p, down %w
      : tensor<?x48xbf16>, !plan, tensor<4x32x64xbf16> -> tensor<?x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
func.func @down_result(%h: tensor<?x48xbf16>, %p: !plan,
                       %w: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects routed_y of shape [R, H] with H = 32, got 'tensor<?x48xbf16>'}}
  %y = moe.expert_down %h, %p, down %w
      : tensor<?x48xbf16>, !plan, tensor<4x32x48xbf16> -> tensor<?x48xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.shared_expert
//===----------------------------------------------------------------------===//

func.func @shared_hidden(%x: tensor<64x32xbf16>, %g: tensor<24x16xbf16>,
                         %d: tensor<32x24xbf16>) {
  // expected-error @+1 {{expects shared gate_weights of shape [I_s, H] with H = 32, got 'tensor<24x16xbf16>'}}
  %s = moe.shared_expert %x, gate %g, up %g, down %d
      : tensor<64x32xbf16>, tensor<24x16xbf16>, tensor<32x24xbf16>
  return
}

// -----

func.func @shared_intermediate(%x: tensor<64x32xbf16>, %g: tensor<24x32xbf16>,
                               %d: tensor<32x12xbf16>) {
  // expected-error @+1 {{expects shared down_weights of shape [H, I_s] with I_s = 24, got 'tensor<32x12xbf16>'}}
  %s = moe.shared_expert %x, gate %g, up %g, down %d
      : tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<32x12xbf16>
  return
}

// -----

func.func @shared_result(%x: tensor<64x32xbf16>, %g: tensor<24x32xbf16>,
                         %d: tensor<32x24xbf16>) {
  // expected-error @+1 {{all of {x, out} have same type}}
  %s = "moe.shared_expert"(%x, %g, %g, %d)
      : (tensor<64x32xbf16>, tensor<24x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>)
      -> tensor<32x32xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.combine
//===----------------------------------------------------------------------===//

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_weights_dtype(%y: tensor<?x32xbf16>, %p: !plan, %rw: tensor<64x2xf16>) {
  // expected-error @+1 {{operand #2 must be 2D tensor of 32-bit float values}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf16> -> tensor<64x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_weights_top_k(%y: tensor<?x32xbf16>, %p: !plan, %rw: tensor<64x8xf32>) {
  // expected-error @+1 {{expects router_weights of shape [T, top_k] with top_k = 2, got 'tensor<64x8xf32>'}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x8xf32> -> tensor<64x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_weights_tokens(%y: tensor<?x32xbf16>, %p: !plan, %rw: tensor<16x2xf32>) {
  // expected-error @+1 {{expects router_weights of shape [T, top_k] with T = 64, got 'tensor<16x2xf32>'}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<16x2xf32> -> tensor<64x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_shared_shape(%y: tensor<?x32xbf16>, %p: !plan, %rw: tensor<64x2xf32>,
                                %s: tensor<64x16xbf16>) {
  // expected-error @+1 {{expects shared of shape [T, H] with H = 32, got 'tensor<64x16xbf16>'}}
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32>, tensor<64x16xbf16> -> tensor<64x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_out_hidden(%y: tensor<?x32xbf16>, %p: !plan, %rw: tensor<64x2xf32>) {
  // expected-error @+1 {{expects out of shape [T, H] with H = 32, got 'tensor<64x64xbf16>'}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x64xbf16>
  return
}

// -----

// With a dynamic token count in the plan, the operands must still agree with
// each other.
!plan = !moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_dynamic_tokens_disagree(%y: tensor<?x32xbf16>, %p: !plan,
                                           %rw: tensor<64x2xf32>) {
  // expected-error @+1 {{expects out of shape [T, H] with T = 64, got 'tensor<32x32xbf16>'}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x32xbf16>, !plan, tensor<64x2xf32> -> tensor<32x32xbf16>
  return
}

// -----

!plan = !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 16>
func.func @combine_static_rows(%y: tensor<128x32xbf16>, %p: !plan, %rw: tensor<64x2xf32>) {
  // expected-error @+1 {{expects routed_y [R, H] to have a dynamic row count R}}
  %o = moe.combine %y, %p, weights %rw
      : tensor<128x32xbf16>, !plan, tensor<64x2xf32> -> tensor<64x32xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.layer
//===----------------------------------------------------------------------===//

func.func @layer_tokens(%x: tensor<32x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                        %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects x of shape [T, H] with T = 64, got 'tensor<32x32xbf16>'}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<32x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<32x32xbf16>
  return
}

// -----

func.func @layer_router_weights(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x1xf32>,
                                %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects router_weights of shape [T, top_k] with top_k = 2, got 'tensor<64x1xf32>'}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x1xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @layer_up(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                    %wg: tensor<4x48x32xbf16>, %wu: tensor<4x24x32xbf16>,
                    %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects up_weights of shape [E/ep, I, H] with I = 48, got 'tensor<4x24x32xbf16>'}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x24x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @layer_down(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                      %wg: tensor<4x48x32xbf16>, %wd: tensor<4x48x32xbf16>) {
  // expected-error @+1 {{expects down_weights of shape [E/ep, H, I] with H = 32, got 'tensor<4x48x32xbf16>'}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @layer_shared_count(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                              %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                              %sg: tensor<24x32xbf16>) {
  // expected-error @+1 {{expects shared(...) to list the shared expert's gate, up and down weights (3 operands), got 2}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd shared(%sg, %sg)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<24x32xbf16>,
         tensor<24x32xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @layer_shared_down(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                             %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                             %sg: tensor<24x32xbf16>, %sd: tensor<32x48xbf16>) {
  // expected-error @+1 {{expects shared down_weights of shape [H, I_s] with I_s = 24, got 'tensor<32x48xbf16>'}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd shared(%sg, %sg, %sd)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<24x32xbf16>,
         tensor<24x32xbf16>, tensor<32x48xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @layer_plan_attr(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                           %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{attribute 'plan' failed to satisfy constraint: type attribute of}}
  %o = "moe.layer"(%x, %top, %rw, %wg, %wg, %wd) <{plan = i32}>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

func.func @layer_limit(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                       %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects swiglu_limit to be positive (or absent for no clamp), got -7}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      {swiglu_limit = -7.0 : f32}
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>) -> tensor<64x32xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// Backward context and moe.layer_grad
//===----------------------------------------------------------------------===//

func.func @layer_context_count(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                               %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects the backward context to have 4 tensors (routed_x, gate, up, hidden), got 2}}
  %o:3 = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>)
      -> (tensor<64x32xbf16>, tensor<?x32xbf16>, tensor<?x48xbf16>)
  return
}

// -----

func.func @layer_context_shape(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                               %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects saved hidden of shape [R, I] with I = 48, got 'tensor<?x32xbf16>'}}
  %o:5 = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>)
      -> (tensor<64x32xbf16>, tensor<?x32xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>,
          tensor<?x32xbf16>)
  return
}

// -----

func.func @layer_context_shared(%x: tensor<64x32xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                                %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                %sg: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>) {
  // expected-error @+1 {{expects saved shared_up of shape [T, I_s] with I_s = 24, got 'tensor<64x48xbf16>'}}
  %o:8 = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd shared(%sg, %sg, %sd)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x48x32xbf16>,
         tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<24x32xbf16>,
         tensor<24x32xbf16>, tensor<32x24xbf16>)
      -> (tensor<64x32xbf16>, tensor<?x32xbf16>, tensor<?x48xbf16>, tensor<?x48xbf16>,
          tensor<?x48xbf16>, tensor<64x24xbf16>, tensor<64x48xbf16>, tensor<64x24xbf16>)
  return
}

// -----

func.func @grad_dout(%d: tensor<64x16xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                     %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects d_out of shape [T, H] with H = 32, got 'tensor<64x16xbf16>'}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x16xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>,
          tensor<4x32x48xbf16>)
  return
}

// -----

func.func @grad_result_type(%d: tensor<64x32xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                            %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>) {
  // expected-error @+1 {{expects d_down_weights to have the type of its operand, 'tensor<4x32x48xbf16>', got 'tensor<4x48x32xbf16>'}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>,
          tensor<4x48x32xbf16>)
  return
}

// -----

func.func @grad_main_grads_count(%d: tensor<64x32xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                                 %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                 %mg: tensor<4x48x32xf32>) {
  // expected-error @+1 {{expects one main_grad per weight (3), got 1}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd main_grads(%mg)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<4x48x32xf32>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xf32>, tensor<4x48x32xf32>,
          tensor<4x32x48xf32>)
  return
}

// -----

func.func @grad_main_grad_shape(%d: tensor<64x32xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                                %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                %mg: tensor<4x48x32xf32>) {
  // expected-error @+1 {{expects main_grad #2 (of down_weights) to be 'tensor<4x32x48xf32>', got 'tensor<4x48x32xf32>'}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd main_grads(%mg, %mg, %mg)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>,
         tensor<4x48x32xf32>, tensor<4x48x32xf32>, tensor<4x48x32xf32>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xf32>, tensor<4x48x32xf32>,
          tensor<4x32x48xf32>)
  return
}

// -----

func.func @grad_main_grad_result(%d: tensor<64x32xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                                 %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                                 %mg: tensor<4x48x32xf32>, %md: tensor<4x32x48xf32>) {
  // expected-error @+1 {{expects d_gate_weights to be 'tensor<4x48x32xf32>' (main_grad + dW), got 'tensor<4x48x32xbf16>'}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd main_grads(%mg, %mg, %md)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>,
         tensor<4x48x32xf32>, tensor<4x48x32xf32>, tensor<4x32x48xf32>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xf32>,
          tensor<4x32x48xf32>)
  return
}

// -----

func.func @grad_shared_count(%d: tensor<64x32xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                             %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                             %sg: tensor<24x32xbf16>, %sd: tensor<32x24xbf16>) {
  // expected-error @+1 {{expects one gradient per shared weight (3), got 0}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd shared(%sg, %sg, %sd)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>,
         tensor<24x32xbf16>, tensor<24x32xbf16>, tensor<32x24xbf16>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>,
          tensor<4x32x48xbf16>)
  return
}

// -----

func.func @grad_saved_count(%d: tensor<64x32xbf16>, %x: tensor<64x32xbf16>, %top: tensor<64x2xi32>,
                            %rw: tensor<64x2xf32>, %wg: tensor<4x48x32xbf16>, %wd: tensor<4x32x48xbf16>,
                            %xr: tensor<?x32xbf16>) {
  // expected-error @+1 {{expects the backward context to have 4 tensors (routed_x, gate, up, hidden), got 1}}
  %g:5 = moe.layer_grad %d, %x, %top, %rw, gate %wg, up %wg, down %wd saved(%xr)
      plan !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 2, padding = 16>
      : (tensor<64x32xbf16>, tensor<64x32xbf16>, tensor<64x2xi32>, tensor<64x2xf32>,
         tensor<4x48x32xbf16>, tensor<4x48x32xbf16>, tensor<4x32x48xbf16>, tensor<?x32xbf16>)
      -> (tensor<64x32xbf16>, tensor<64x2xf32>, tensor<4x48x32xbf16>, tensor<4x48x32xbf16>,
          tensor<4x32x48xbf16>)
  return
}

// -----

// expected-error @+1 {{max_tokens (64) is the capacity of a dynamic token count; tokens = 4 is static}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 1, padding = 1, max_tokens = 64>)

// -----

// expected-error @+1 {{max_tokens must be positive, got -3}}
func.func private @f(!moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 1, padding = 1, max_tokens = -3>)

// -----

// expected-error @+1 {{max_tokens = 1073741824 makes the routed rows, max_tokens * top_k + (experts / ep) * (padding - 1), exceed 2^31 - 1}}
func.func private @f(!moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 1, padding = 1, max_tokens = 1073741824>)

// -----

// expected-error @+1 {{recv_capacity (64) is the receive capacity of an expert-parallel rank; ep = 1 exchanges nothing}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 1, padding = 1, recv_capacity = 64>)

// -----

// expected-error @+1 {{recv_capacity must be positive, got -5}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 2, padding = 1, recv_capacity = -5>)

// -----

// expected-error @+1 {{recv_capacity = 2147483647 makes the routed rows, recv_capacity + (experts / ep) * (padding - 1), exceed 2^31 - 1}}
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 2, padding = 2, recv_capacity = 2147483647>)

// -----

// expected-error @+1 {{expected 'max_tokens' or 'recv_capacity' (each at most once, in that order), got 'max_tokens'}}
func.func private @f(!moe.plan<tokens = ?, top_k = 2, experts = 8, ep = 2, padding = 1, recv_capacity = 8, max_tokens = 64>)

//===----------------------------------------------------------------------===//
// moe.quantize / moe.dequantize
//===----------------------------------------------------------------------===//

// -----

func.func @f(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expected 'block' to have 2 sizes (rows, cols of a block over the last two dimensions), got 1}}
  %q, %s = moe.quantize %x {block = array<i64: 32>} : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expected positive block sizes, got [0, 32]}}
  %q, %s = moe.quantize %x {block = array<i64: 0, 32>} : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<64xbf16>) {
  // expected-error @+1 {{expected input of rank >= 2 (blocks span its last two dimensions), got rank 1}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>} : tensor<64xbf16> -> tensor<64xf8E4M3FN>, tensor<2xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<4x48xbf16>) {
  // expected-error @+1 {{dimension 1 of input (48) is not a multiple of the block's 32}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>} : tensor<4x48xbf16> -> tensor<4x48xf8E4M3FN>, tensor<4x1xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expected scales' dimension 1 to be 2 (64 / 32), got 4}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>} : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>, tensor<4x4xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<?x256xbf16>) {
  // expected-error @+1 {{dimension 0 of input is dynamic; a block of 128 along it needs a static size}}
  %q, %s = moe.quantize %x {block = array<i64: 128, 128>} : tensor<?x256xbf16> -> tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
  return
}

// -----

func.func @f(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{expected values of the input's shape, got 'tensor<4x32xf8E4M3FN>'}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>} : tensor<4x64xbf16> -> tensor<4x32xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<4x64xbf16>) {
  // expected-error @+1 {{result #1 must be tensor of f8E8M0FNU type or 32-bit float values}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>} : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>, tensor<4x2xbf16>
  return
}

// -----

func.func @f(%x: tensor<2x64x128xbf16>) {
  // expected-error @+1 {{expected values of the transposed input's shape, as of 'tensor<2x128x64xbf16>', got 'tensor<2x64x128xf8E4M3FN>'}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>, transpose} : tensor<2x64x128xbf16> -> tensor<2x64x128xf8E4M3FN>, tensor<2x64x4xf8E8M0FNU>
  return
}

// -----

func.func @f(%x: tensor<2x64x128xbf16>) {
  // expected-error @+1 {{expected scales' dimension 2 to be 2 (64 / 32), got 4}}
  %q, %s = moe.quantize %x {block = array<i64: 1, 32>, transpose} : tensor<2x64x128xbf16> -> tensor<2x128x64xf8E4M3FN>, tensor<2x128x4xf8E8M0FNU>
  return
}

// -----

func.func @f(%q: tensor<4x64xf8E4M3FN>, %s: tensor<4x2xf8E8M0FNU>) {
  // expected-error @+1 {{expected an output of the values' shape, got 'tensor<4x32xf32>'}}
  %w = moe.dequantize %q, %s {block = array<i64: 1, 32>} : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU> -> tensor<4x32xf32>
  return
}

// -----

func.func @f(%q: tensor<4x64xf8E4M3FN>, %s: tensor<2x2xf8E8M0FNU>) {
  // expected-error @+1 {{expected scales' dimension 0 to be 4 (4 / 1), got 2}}
  %w = moe.dequantize %q, %s {block = array<i64: 1, 32>} : tensor<4x64xf8E4M3FN>, tensor<2x2xf8E8M0FNU> -> tensor<4x64xf32>
  return
}

// -----

func.func @moe_layer(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{expected precision "mxfp8" or "fp8" (absent: bf16), got "fp4"}}
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 1> {precision = "fp4"}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<?x64xbf16>
  return %out : tensor<?x64xbf16>
}

// -----

func.func @moe_layer(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{precision "fp8" needs H (64) to be a multiple of its block size 128}}
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 1> {precision = "fp8"}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<?x64xbf16>
  return %out : tensor<?x64xbf16>
}

// -----

func.func @moe_layer(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{the backward of precision "mxfp8" quantizes blocks of 32 routed rows: the plan's padding must be a multiple of 32, got 1}}
  %out:5 = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 1> {precision = "mxfp8"}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16>)
  return %out#0 : tensor<?x64xbf16>
}
