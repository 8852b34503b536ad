// REQUIRES: ptxas
// RUN: mok-opt %s --convert-moe-to-mk --convert-mk-to-gpu | FileCheck %s --check-prefix=GPU
// RUN: rm -rf %t && mok-opt %s --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/wgmma
// RUN: FileCheck %s --check-prefix=WGMMA --input-file %t/wgmma/fp8_layer_kernels.ptx
// RUN: grep -c wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 %t/wgmma/fp8_layer_kernels.ptx | FileCheck %s --check-prefix=COUNT
// RUN: ptxas -arch=sm_90a -v %t/wgmma/fp8_layer_kernels.ptx -o %t/wgmma.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx="chip=sm_90a warp-specialize=true" | %python %mok_src_root/scripts/extract-ptx.py %t/ws
// RUN: FileCheck %s --check-prefix=WS --input-file %t/ws/fp8_layer_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/ws/fp8_layer_kernels.ptx -o %t/ws.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx="chip=sm_90a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: FileCheck %s --input-file %t/sm90/fp8_layer_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90/fp8_layer_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx="chip=sm_100a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a -v %t/sm100/fp8_layer_kernels.ptx -o %t/sm100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS

// The FP8 forward on sm_90a's tensor cores: TMA boxes of 128 E4M3
// elements a row (the A box, gate's and up's 64-row boxes), a k-tile of
// four m64n128k32 e4m3 wgmmas into fresh partial sums (scale-d = 0 on the
// first; each step's descriptors step 0's plus 2, i.e. 32 bytes), waited
// for (wait_group 0), then added to the accumulator times each row's A
// scale and its operand's B scale (gate's for the first 32 fragment
// elements, up's for the rest). The k-loop carries those products: k-tile
// 0's made before it; each k-tile loads the next one's scales (the block
// clamped into them) before its barrier wait and MMAs, and multiplies
// them after its promotion.
// GPU-LABEL: gpu.func @fp8_layer_forward(
// GPU: nvgpu.tma.async.load {{.*}} <tensor = memref<128x128xf8E4M3FN
// GPU: nvgpu.tma.async.load {{.*}} <tensor = memref<64x128xf8E4M3FN
// GPU: nvgpu.tma.async.load {{.*}} <tensor = memref<64x128xf8E4M3FN
// GPU: %[[A0:.*]] = memref.load %{{.*}}[%[[KT0:.*]], %{{.*}}] {alignment = 4 : i64} : memref<2x588xf32>
// GPU: %[[A1:.*]] = memref.load %{{.*}}[%[[KT0]], %{{.*}}] {alignment = 4 : i64} : memref<2x588xf32>
// GPU: %[[B0:.*]] = memref.load %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}] {alignment = 4 : i64} : memref<4x1x2xf32>
// GPU: %[[B1:.*]] = memref.load %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}] {alignment = 4 : i64} : memref<4x1x2xf32>
// GPU-NEXT: arith.mulf %[[A0]], %[[B0]] : f32
// GPU-NEXT: arith.mulf %[[A1]], %[[B0]] : f32
// GPU-NEXT: arith.mulf %[[A0]], %[[B1]] : f32
// GPU-NEXT: arith.mulf %[[A1]], %[[B1]] : f32
// GPU: scf.for {{.*}} iter_args(%{{[^ ]+}} = %{{[^ ]+}}, %[[G0:[^ ]+]] = %{{[^ ]+}}, %[[G1:[^ ]+]] = %{{[^ ]+}}, %[[U0:[^ ]+]] = %{{[^ ]+}}, %[[U1:[^ ]+]] = %{{[^)]+}})
// GPU: %[[KT:.*]] = arith.minsi %{{.*}}, %{{.*}} : index
// GPU: %[[NA0:.*]] = memref.load %{{.*}}[%[[KT]], %{{.*}}] {alignment = 4 : i64} : memref<2x588xf32>
// GPU: %[[NA1:.*]] = memref.load %{{.*}}[%[[KT]], %{{.*}}] {alignment = 4 : i64} : memref<2x588xf32>
// GPU: arith.minsi
// GPU: %[[NG:.*]] = memref.load %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}] {alignment = 4 : i64} : memref<4x1x2xf32>
// GPU: arith.minsi
// GPU: %[[NU:.*]] = memref.load %{{.*}}[%{{.*}}, %{{.*}}, %{{.*}}] {alignment = 4 : i64} : memref<4x1x2xf32>
// GPU: nvgpu.mbarrier.try_wait.parity
// GPU: nvvm.wgmma.fence.aligned
// GPU-COUNT-2: nvgpu.warpgroup.generate.descriptor
// GPU-NOT: nvgpu.warpgroup.generate.descriptor
// GPU: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// GPU-NEXT: llvm.mlir.constant(2 : i64) : i64
// GPU-NEXT: llvm.add %{{.*}}, %{{.*}} : i64
// GPU-NOT: nvgpu.warpgroup.generate.descriptor
// GPU-COUNT-3: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 32>, D[<f32>, <one>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// GPU-NEXT: nvvm.wgmma.commit.group.sync.aligned
// GPU-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// GPU: llvm.intr.fma(%{{.*}}, %[[G0]], %{{.*}})
// GPU: llvm.intr.fma(%{{.*}}, %[[G1]], %{{.*}})
// GPU: llvm.intr.fma(%{{.*}}, %[[U0]], %{{.*}})
// GPU: llvm.intr.fma(%{{.*}}, %[[U1]], %{{.*}})
// GPU: %[[N0:.*]] = arith.mulf %[[NA0]], %[[NG]] : f32
// GPU-NEXT: %[[N1:.*]] = arith.mulf %[[NA1]], %[[NG]] : f32
// GPU-NEXT: %[[N2:.*]] = arith.mulf %[[NA0]], %[[NU]] : f32
// GPU-NEXT: %[[N3:.*]] = arith.mulf %[[NA1]], %[[NU]] : f32
// GPU: scf.yield %{{.*}}, %[[N0]], %[[N1]], %[[N2]], %[[N3]] :
// The FP8 k-loops are never unrolled (a loop of a few k-tiles unrolled in
// full made ptxas serialize the kernel's wgmmas).
// WGMMA: .pragma "nounroll";
// WGMMA: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3
// WGMMA: wgmma.wait_group.sync.aligned 0;
// WGMMA: fma.rn.f32
// COUNT: 8
//
// The FP8 forward on simt GEMMs, to PTX for both chips: the quantizers'
// saturating conversions and correctly rounded quotients, the GEMMs' exact E4M3
// decoding; ptxas accepts both without spills.
// CHECK: .entry fp8_layer_forward(
// CHECK-DAG: cvt.rn.satfinite.e4m3x2.f32
// CHECK-DAG: cvt.rn.f16x2.e4m3x2
// CHECK-DAG: div.rn.f32
// CHECK-NOT: div.approx.f32
// PTXAS: 0 bytes spill stores, 0 bytes spill loads

// With warp-specialize: the consumers take 224 registers; each k-tile's
// stage goes back to the producer (mbarrier.arrive on the stage's empty
// barrier) right after the k-tile's own wait_group 0, before its scaling;
// the producer (56 registers) loads the stages.
// WS: setmaxnreg.inc.sync.aligned.u32 224;
// WS: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3
// WS: wgmma.wait_group.sync.aligned 0;
// WS-NOT: fma.rn.f32
// WS: mbarrier.arrive.shared.b64
// WS-NEXT: $L__BB
// WS: fma.rn.f32
// WS: setmaxnreg.dec.sync.aligned.u32 56;
// WS: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
func.func @fp8_layer(%x: tensor<40x256xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>, %wg: tensor<4x128x256xbf16>, %wu: tensor<4x128x256xbf16>, %wd: tensor<4x256x128xbf16>) -> tensor<40x256xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 128> {precision = "fp8"}
      : (tensor<40x256xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x256xbf16>, tensor<4x128x256xbf16>, tensor<4x256x128xbf16>) -> tensor<40x256xbf16>
  return %out : tensor<40x256xbf16>
}
