// The whole GPU pipeline emits PTX in process for both targets, and CUDA's
// assembler accepts it.
// REQUIRES: ptxas
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-to-ptx=chip=sm_90a | FileCheck %s --check-prefix=SM90
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: ptxas -arch=sm_90a %t/sm90/qwen3_30b_a3b_moe_kernels.ptx -o %t/sm90.cubin
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a | FileCheck %s --check-prefix=SM100
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a %t/sm100/shared_layer_kernels.ptx -o %t/sm100.cubin
// RUN: not mok-opt %s --moe-to-ptx=chip=sm_80 2>&1 | FileCheck %s --check-prefix=CHIP

// SM90: gpu.binary @qwen3_30b_a3b_moe_kernels [#gpu.object<#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx80">
// SM90-SAME: .target sm_90a
// SM90-SAME: .visible .entry qwen3_30b_a3b_moe_forward(
// SM100: gpu.binary @shared_layer_kernels [#gpu.object<#nvvm.target<O = 3, chip = "sm_100a", features = "+ptx88">
// SM100-SAME: .target sm_100a
// SM100-SAME: .visible .entry shared_layer_forward(
// CHIP: convert-moe-to-gpu: chip 'sm_80' is not supported; expected sm_90a or sm_100a

// A DeepSeek-V3-shaped layer on one GPU (the example is EP = 8, which the GPU
// lowering does not support yet), fewer tokens.
!plan = !moe.plan<tokens = 512, top_k = 8, experts = 32, ep = 1, padding = 128>
func.func @shared_layer(%x: tensor<512x7168xbf16>, %top: tensor<512x8xi32>, %rw: tensor<512x8xf32>,
                        %wg: tensor<32x2048x7168xbf16>, %wu: tensor<32x2048x7168xbf16>,
                        %wd: tensor<32x7168x2048xbf16>, %sg: tensor<2048x7168xbf16>,
                        %su: tensor<2048x7168xbf16>, %sd: tensor<7168x2048xbf16>)
    -> tensor<512x7168xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      : (tensor<512x7168xbf16>, tensor<512x8xi32>, tensor<512x8xf32>, tensor<32x2048x7168xbf16>,
         tensor<32x2048x7168xbf16>, tensor<32x7168x2048xbf16>, tensor<2048x7168xbf16>,
         tensor<2048x7168xbf16>, tensor<7168x2048xbf16>) -> tensor<512x7168xbf16>
  return %o : tensor<512x7168xbf16>
}
