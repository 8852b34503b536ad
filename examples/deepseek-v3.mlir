// A DeepSeek-V3-like MoE layer, as one rank of an 8-way expert-parallel group:
// hidden size H = 7168, expert intermediate size I = 2048, 256 routed experts
// (32 per rank), top-8 routing, one shared expert (I_s = 2048), 4096 tokens
// per rank, expert segments padded to 128 rows.
//
//   mok-opt examples/deepseek-v3.mlir --moe-fuse-layer
//
// prints the same layer as a single moe.layer.

!plan = !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>

func.func @deepseek_v3_moe(
    %x: tensor<4096x7168xbf16>,
    %top_experts: tensor<4096x8xi32>,
    %router_weights: tensor<4096x8xf32>,
    %gate: tensor<32x2048x7168xbf16>,
    %up: tensor<32x2048x7168xbf16>,
    %down: tensor<32x7168x2048xbf16>,
    %shared_gate: tensor<2048x7168xbf16>,
    %shared_up: tensor<2048x7168xbf16>,
    %shared_down: tensor<7168x2048xbf16>) -> tensor<4096x7168xbf16> {
  %plan = moe.plan %top_experts : tensor<4096x8xi32> -> !plan
  %routed_x = moe.dispatch %x, %plan
      : tensor<4096x7168xbf16>, !plan -> tensor<?x7168xbf16>
  %hidden = moe.expert_swiglu %routed_x, %plan, gate %gate, up %up
      : tensor<?x7168xbf16>, !plan, tensor<32x2048x7168xbf16> -> tensor<?x2048xbf16>
  %routed_y = moe.expert_down %hidden, %plan, down %down
      : tensor<?x2048xbf16>, !plan, tensor<32x7168x2048xbf16> -> tensor<?x7168xbf16>
  %shared_out = moe.shared_expert %x, gate %shared_gate, up %shared_up, down %shared_down
      : tensor<4096x7168xbf16>, tensor<2048x7168xbf16>, tensor<7168x2048xbf16>
  %out = moe.combine %routed_y, %plan, weights %router_weights shared %shared_out
      : tensor<?x7168xbf16>, !plan, tensor<4096x8xf32>, tensor<4096x7168xbf16>
      -> tensor<4096x7168xbf16>
  return %out : tensor<4096x7168xbf16>
}
