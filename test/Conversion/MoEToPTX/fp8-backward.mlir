// REQUIRES: ptxas
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk --convert-mk-to-gpu | FileCheck %s --check-prefix=GPU
// RUN: rm -rf %t && mok-opt %s --moe-generate-backward --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/wgmma
// RUN: grep -c wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 %t/wgmma/moe_layer_backward_kernels.ptx | FileCheck %s --check-prefix=COUNT
// RUN: ptxas -arch=sm_90a -v %t/wgmma/moe_layer_backward_kernels.ptx -o %t/wgmma.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx="chip=sm_90a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: ptxas -arch=sm_90a -v %t/sm90/moe_layer_backward_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx="chip=sm_100a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a -v %t/sm100/moe_layer_backward_kernels.ptx -o %t/sm100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx="chip=sm_90a warp-specialize=true" | %python %mok_src_root/scripts/extract-ptx.py %t/ws
// RUN: grep -c wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 %t/ws/moe_layer_backward_kernels.ptx | FileCheck %s --check-prefix=COUNT-WS
// RUN: ptxas -arch=sm_90a -v %t/ws/moe_layer_backward_kernels.ptx -o %t/ws.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS-WS

// The FP8 backward on sm_90a's tensor cores: every routed GEMM in E4M3
// wgmma (the down dgrad, the down weights' gradient, the gate/up dgrad
// and the gate and up weights' gradients: 4 k32 steps each), the shared
// expert's in bf16. The quantizers' loops carry the next block's loads
// (64 registers a lane for a column block) beside the block they
// quantize, so ptxas spills a few of the values the kernel holds across
// its phases, here and in the scalar form on both chips: under 100 bytes.
// COUNT: 20
// PTXAS: {{ ([0-9]|[1-9][0-9]) }}bytes spill stores
// PTXAS-NOT: spill stores
// With warp-specialize a producer warpgroup feeds the GEMMs (384
// threads): the down dgrad and the gate/up dgrad (K static) peel their
// first k-tile, the weight gradients (K in groups) do not: 28 E4M3
// wgmmas. ptxas takes the kernel at 168 registers a thread outside the
// GEMMs; at these small sizes LLVM unrolls the shared expert's short bf16
// k-loops in full and ptxas spills a few hundred bytes, some inside them
// (at dsv3-shard's sizes, none in a k-loop): under 1000 bytes.
// COUNT-WS: 28
// PTXAS-WS: {{ ([0-9]|[1-9][0-9]|[1-9][0-9][0-9]) }}bytes spill stores
// PTXAS-WS: Used 168 registers

// The weight gradients' promotion: A's two rows' scales of the k-tile's
// block, kBase / 128 + kt of the expert's rows, and a B scale a column
// (the thread's 32 columns of the 128-column tile), all from the
// [K/128, S] scales of mk.quantize_columns. They come staged with the
// k-tile's boxes: the loader copies the block's 128 row scales of A and
// 128 column scales of B (512 bytes each, the row clamped into the
// scales: a group may have no k-tile) into the stage's slot on its full
// barrier, and after the wait each thread reads its two rows' and its 16
// pairs of columns from shared memory.
// GPU-LABEL: gpu.func @moe_layer_backward_backward(
// GPU: %[[ROW:.*]] = arith.minsi %{{.*}}, %c7{{(_[0-9]+)?}} : index
// GPU: nvvm.cp.async.bulk.shared.cluster.global %{{.*}}, %{{.*}}, %[[BAR:[0-9]+]], %c512_i32{{(_[0-9]+)?}} : !llvm.ptr<7>, <1>
// GPU: nvvm.cp.async.bulk.shared.cluster.global %{{.*}}, %{{.*}}, %[[BAR]], %c512_i32{{(_[0-9]+)?}} : !llvm.ptr<7>, <1>
// GPU: scf.for
// GPU: nvgpu.mbarrier.try_wait.parity
// GPU-COUNT-2: llvm.load %{{.*}} : !llvm.ptr<3> -> f32
// GPU-COUNT-16: llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr<3> -> vector<2xf32>
// GPU: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// GPU: nvvm.wgmma.wait.group.sync.aligned 0
// GPU: llvm.intr.fma
// GPU-NOT: nvvm.wgmma
// GPU: scf.yield
// The gate/up dgrad (concat): k-tiles from kSplit = 2 on are d_up's, with
// d_up's row scales and the up weights' block scale, selected per k-tile.
// GPU: %[[SUB:.*]] = arith.subi %[[KT:[0-9a-z_]+]], %c2{{(_[0-9]+)?}} : index
// GPU-NEXT: %[[KK:.*]] = arith.select %[[SECOND:[0-9]+]], %[[SUB]], %[[KT]] : index
// GPU: %[[KKC:.*]] = arith.minsi %[[KK]], %{{.*}} : index
// GPU: %[[G:.*]] = memref.load %{{.*}}[%[[KKC]], %{{.*}}] {alignment = 4 : i64} : memref<2x1020xf32>
// GPU-NEXT: %[[U:.*]] = memref.load %{{.*}}[%[[KKC]], %{{.*}}] {alignment = 4 : i64} : memref<2x1020xf32>
// GPU-NEXT: arith.select %[[SECOND]], %[[U]], %[[G]] : f32
func.func @moe_layer(%x: tensor<256x256xbf16>, %top_experts: tensor<256x2xi32>, %router_weights: tensor<256x2xf32>, %gate: tensor<4x256x256xbf16>, %up: tensor<4x256x256xbf16>, %down: tensor<4x256x256xbf16>, %shared_gate: tensor<128x256xbf16>, %shared_up: tensor<128x256xbf16>, %shared_down: tensor<256x128xbf16>) -> tensor<256x256xbf16> {
  %out = moe.layer %x, %top_experts, %router_weights, gate %gate, up %up, down %down shared(%shared_gate, %shared_up, %shared_down)
      plan !moe.plan<tokens = 256, top_k = 2, experts = 4, ep = 1, padding = 128> {precision = "fp8"}
      : (tensor<256x256xbf16>, tensor<256x2xi32>, tensor<256x2xf32>, tensor<4x256x256xbf16>, tensor<4x256x256xbf16>, tensor<4x256x256xbf16>, tensor<128x256xbf16>, tensor<128x256xbf16>, tensor<256x128xbf16>) -> tensor<256x256xbf16>
  return %out : tensor<256x256xbf16>
}
