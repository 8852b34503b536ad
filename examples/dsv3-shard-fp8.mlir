// The one-GPU DeepSeek-V3 shard of dsv3-shard.mlir in FP8 (docs/FP8.md):
// the routed experts' GEMMs on E4M3 operands, the activations in 1 x 128
// blocks and the weights in 128 x 128 blocks with f32 scales, quantized in
// the kernel; the shared expert in bf16.
//
//   mok-opt examples/dsv3-shard-fp8.mlir --moe-to-ptx=chip=sm_90a
//   mok-opt examples/dsv3-shard-fp8.mlir \
//       --moe-to-ptx="chip=sm_90a fp8-quantized-weights=true"
//
// (the second takes the weights quantized, as mok.ops.fp8_quantize makes
// them; sm_100a: tensor-cores=false).

!plan = !moe.plan<tokens = 4096, top_k = 8, experts = 32, ep = 1, padding = 128>

func.func @dsv3_shard_fp8_moe(
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
      shared(%shared_gate, %shared_up, %shared_down) plan !plan {precision = "fp8"}
      : (tensor<4096x7168xbf16>, tensor<4096x8xi32>, tensor<4096x8xf32>,
         tensor<32x2048x7168xbf16>, tensor<32x2048x7168xbf16>, tensor<32x7168x2048xbf16>,
         tensor<2048x7168xbf16>, tensor<2048x7168xbf16>, tensor<7168x2048xbf16>)
      -> tensor<4096x7168xbf16>
  return %out : tensor<4096x7168xbf16>
}
