// REQUIRES: ptxas
// RUN: rm -rf %t && mok-opt %s --moe-to-ptx="chip=sm_90a warp-specialize=true" | %python %mok_src_root/scripts/extract-ptx.py %t/ws
// RUN: ptxas -arch=sm_90a -v %t/ws/moe_layer_kernels.ptx -o %t/ws.cubin 2>&1 | FileCheck %s --implicit-check-not=C7512
// RUN: grep -c "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" %t/ws/moe_layer_kernels.ptx | FileCheck %s --check-prefix=COUNT
// RUN: mok-opt %s --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/plain
// RUN: ptxas -arch=sm_90a -v %t/plain/moe_layer_kernels.ptx -o %t/plain.cubin 2>&1 | FileCheck %s --implicit-check-not=C7512

// An FP8 layer whose down projections have a short K (I = 512: four
// k-tiles, three in the k-loop after the first), with and without a
// producer. LLVM must not unroll the FP8 k-loops: unrolled in full, with
// the scale factors they carry, ptxas serialized every wgmma of the
// kernel for want of registers (C7512). Each GEMM keeps one k-loop: its
// first k-tile (with a producer, emitted apart) and the loop's, 4 wgmmas
// each, for gate/up and down.
// CHECK: Used {{[0-9]+}} registers
// COUNT: 16
func.func @moe_layer(%x: tensor<300x1024xbf16>, %top_experts: tensor<300x4xi32>, %router_weights: tensor<300x4xf32>, %gate: tensor<16x512x1024xbf16>, %up: tensor<16x512x1024xbf16>, %down: tensor<16x1024x512xbf16>, %shared_gate: tensor<256x1024xbf16>, %shared_up: tensor<256x1024xbf16>, %shared_down: tensor<1024x256xbf16>) -> tensor<300x1024xbf16> {
  %out = moe.layer %x, %top_experts, %router_weights, gate %gate, up %up, down %down shared(%shared_gate, %shared_up, %shared_down)
      plan !moe.plan<tokens = 300, top_k = 4, experts = 16, ep = 1, padding = 128> {precision = "fp8"}
      : (tensor<300x1024xbf16>, tensor<300x4xi32>, tensor<300x4xf32>, tensor<16x512x1024xbf16>, tensor<16x512x1024xbf16>, tensor<16x1024x512xbf16>, tensor<256x1024xbf16>, tensor<256x1024xbf16>, tensor<1024x256xbf16>) -> tensor<300x1024xbf16>
  return %out : tensor<300x1024xbf16>
}
