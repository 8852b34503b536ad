// One GPU's shard of a DeepSeek-V3-like layer, as the benchmarks run it:
// 32 of the 256 experts (H = 7168, I = 2048), top-8, one shared expert
// (I_s = 2048), 4096 tokens, expert segments padded to 128 rows, no expert
// parallelism.
//
//   mok-opt examples/dsv3-shard.mlir --moe-to-ptx=chip=sm_90a

!plan = !moe.plan<tokens = 4096, top_k = 8, experts = 32, ep = 1, padding = 128>

func.func @dsv3_shard_moe(
    %x: tensor<4096x7168xbf16>,
    %top_experts: tensor<4096x8xi32>,
    %router_weights: tensor<4096x8xf32>,
    %gate: tensor<32x2048x7168xbf16>,
    %up: tensor<32x2048x7168xbf16>,
    %down: tensor<32x7168x2048xbf16>,
    %shared_gate: tensor<2048x7168xbf16>,
    %shared_up: tensor<2048x7168xbf16>,
    %shared_down: tensor<7168x2048xbf16>) -> tensor<4096x7168xbf16> {
  %out = moe.layer %x, %top_experts, %router_weights, gate %gate, up %up, down %down
      shared(%shared_gate, %shared_up, %shared_down) plan !plan
      : (tensor<4096x7168xbf16>, tensor<4096x8xi32>, tensor<4096x8xf32>,
         tensor<32x2048x7168xbf16>, tensor<32x2048x7168xbf16>, tensor<32x7168x2048xbf16>,
         tensor<2048x7168xbf16>, tensor<2048x7168xbf16>, tensor<7168x2048xbf16>)
      -> tensor<4096x7168xbf16>
  return %out : tensor<4096x7168xbf16>
}
