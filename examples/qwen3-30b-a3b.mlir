// A Qwen3-30B-A3B-like MoE layer on one GPU (no expert parallelism):
// hidden size H = 2048, expert intermediate size I = 768, 128 routed experts,
// top-8 routing, no shared expert, 8192 tokens, expert segments padded to 128
// rows.
//
//   mok-opt examples/qwen3-30b-a3b.mlir --moe-fuse-layer
//
// prints the same layer as a single moe.layer.

!plan = !moe.plan<tokens = 8192, top_k = 8, experts = 128, ep = 1, padding = 128>

func.func @qwen3_30b_a3b_moe(
    %x: tensor<8192x2048xbf16>,
    %top_experts: tensor<8192x8xi32>,
    %router_weights: tensor<8192x8xf32>,
    %gate: tensor<128x768x2048xbf16>,
    %up: tensor<128x768x2048xbf16>,
    %down: tensor<128x2048x768xbf16>) -> tensor<8192x2048xbf16> {
  %plan = moe.plan %top_experts : tensor<8192x8xi32> -> !plan
  %routed_x = moe.dispatch %x, %plan
      : tensor<8192x2048xbf16>, !plan -> tensor<?x2048xbf16>
  %hidden = moe.expert_swiglu %routed_x, %plan, gate %gate, up %up
      : tensor<?x2048xbf16>, !plan, tensor<128x768x2048xbf16> -> tensor<?x768xbf16>
  %routed_y = moe.expert_down %hidden, %plan, down %down
      : tensor<?x768xbf16>, !plan, tensor<128x2048x768xbf16> -> tensor<?x2048xbf16>
  %out = moe.combine %routed_y, %plan, weights %router_weights
      : tensor<?x2048xbf16>, !plan, tensor<8192x8xf32> -> tensor<8192x2048xbf16>
  return %out : tensor<8192x2048xbf16>
}
