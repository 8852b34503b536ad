// REQUIRES: ptxas
// RUN: rm -rf %t && mok-opt %s --moe-to-ptx="chip=sm_90a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: FileCheck %s --input-file %t/sm90/fp8_layer_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90/fp8_layer_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx="chip=sm_100a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a -v %t/sm100/fp8_layer_kernels.ptx -o %t/sm100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS

// The FP8 forward on simt GEMMs, to PTX for both chips: the quantizers'
// saturating conversions and IEEE divisions, the GEMMs' exact E4M3
// decoding; ptxas accepts both without spills.
// CHECK: .entry fp8_layer_forward(
// CHECK-DAG: cvt.rn.satfinite.e4m3x2.f32
// CHECK-DAG: cvt.rn.f16x2.e4m3x2
// CHECK-DAG: div.rn.f32
// CHECK-NOT: div.approx.f32
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
func.func @fp8_layer(%x: tensor<40x256xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>, %wg: tensor<4x128x256xbf16>, %wu: tensor<4x128x256xbf16>, %wd: tensor<4x256x128xbf16>) -> tensor<40x256xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 128> {precision = "fp8"}
      : (tensor<40x256xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x256xbf16>, tensor<4x128x256xbf16>, tensor<4x256x128xbf16>) -> tensor<40x256xbf16>
  return %out : tensor<40x256xbf16>
}
