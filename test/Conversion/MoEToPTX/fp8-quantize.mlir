// REQUIRES: ptxas
// RUN: rm -rf %t && mok-opt %s --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: FileCheck %s --input-file %t/sm90/fp8_quantize_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90/fp8_quantize_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: FileCheck %s --input-file %t/sm100/fp8_quantize_kernels.ptx
// RUN: ptxas -arch=sm_100a -v %t/sm100/fp8_quantize_kernels.ptx -o %t/sm100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --convert-moe-to-mk --convert-mk-to-gpu | grep -c gpu.shuffle | FileCheck %s --check-prefix=ONE-PASS

// mok.ops.fp8_quantize's kernel (fp8_quantizer_ir) for a weight of both
// layouts: 512 threads, the E4M3 codes from cvt pairs stored 16 bytes at a
// time, no spills (ptxas fits it in 127 registers at 512 threads).
// CHECK: .entry fp8_quantize_quantize(
// CHECK: .maxntid 512, 1, 1
// CHECK: cvt.rn.satfinite.e4m3x2.f32
// CHECK: st.global.v4.b32
// The two layouts from one pass over each block: one amax (a warp's
// butterfly, 5 shuffles) in the 16-byte form and one in the scalar form,
// not one a layout.
// ONE-PASS: {{^}}10{{$}}
// PTXAS: Compiling entry function 'fp8_quantize_quantize'
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
func.func @fp8_quantize(%w: tensor<4x256x384xbf16>)
    -> (tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>, tensor<4x384x256xf8E4M3FN>, tensor<4x3x2xf32>) {
  %q0, %s0 = moe.quantize %w {block = array<i64: 128, 128>}
      : tensor<4x256x384xbf16> -> tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>
  %q1, %s1 = moe.quantize %w {block = array<i64: 128, 128>, transpose}
      : tensor<4x256x384xbf16> -> tensor<4x384x256xf8E4M3FN>, tensor<4x3x2xf32>
  return %q0, %s0, %q1, %s1
      : tensor<4x256x384xf8E4M3FN>, tensor<4x2x3xf32>, tensor<4x384x256xf8E4M3FN>, tensor<4x3x2xf32>
}
