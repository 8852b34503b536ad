// The PTX step emits the kernel modules (here the training forward's and
// the backward's) in parallel, on the context's threads: the output is the
// same as with one thread, and it holds no time stamp, so two compiles of a
// layer are the same byte for byte.
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx=chip=sm_90a > %t.threads
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx=chip=sm_90a --mlir-disable-threading > %t.one
// RUN: cmp %t.threads %t.one
// RUN: FileCheck %s < %t.one
// CHECK-NOT: LLVMIRToISATimeInMs
// CHECK: gpu.binary @layer_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx81">, properties = {O = 3 : i32}, assembly = "//
// CHECK-NOT: LLVMIRToISATimeInMs
// CHECK: gpu.binary @layer_forward_kernels
// CHECK-SAME: .target sm_90a
// CHECK-NOT: LLVMIRToISATimeInMs
// CHECK: gpu.binary @layer_backward_kernels
// CHECK-SAME: .target sm_90a
// CHECK-NOT: LLVMIRToISATimeInMs

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
