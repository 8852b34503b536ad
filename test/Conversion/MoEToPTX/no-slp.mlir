// The PTX step runs LLVM's O3 pipeline without the SLP vectorizer: two
// scalar f16 products of neighbouring elements stay two scalar mul.rn.f16
// (with it they became one mul.rn.f16x2). The layers' kernels emit their
// pairs as vector operations themselves, so their PTX is the same either
// way; this pins the pipeline (lib/Conversion/MoEToPTX/EmitPTX.cpp).
// RUN: mok-opt %s --moe-to-ptx=chip=sm_90a > %t.90
// RUN: FileCheck %s < %t.90
// RUN: FileCheck %s --check-prefix=UNPAIRED < %t.90
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a > %t.100
// RUN: FileCheck %s < %t.100
// RUN: FileCheck %s --check-prefix=UNPAIRED < %t.100
// CHECK: gpu.binary @pairs_kernels
// CHECK-SAME: mul.rn.f16 {{.*}}mul.rn.f16 {{.*}}ret;
// UNPAIRED-NOT: f16x2
module attributes {gpu.container_module} {
  gpu.module @pairs_kernels {
    gpu.func @pairs(%a: memref<2xf16>, %b: memref<2xf16>, %c: memref<2xf16>) kernel {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %a0 = memref.load %a[%c0] : memref<2xf16>
      %a1 = memref.load %a[%c1] : memref<2xf16>
      %b0 = memref.load %b[%c0] : memref<2xf16>
      %b1 = memref.load %b[%c1] : memref<2xf16>
      %p0 = arith.mulf %a0, %b0 : f16
      %p1 = arith.mulf %a1, %b1 : f16
      memref.store %p0, %c[%c0] : memref<2xf16>
      memref.store %p1, %c[%c1] : memref<2xf16>
      gpu.return
    }
  }
}
