// mok-compile --function compiles the named layer functions' kernels only,
// the same PTX as in a compile of them all; --stages picks the stages that
// --stages-dir writes; --times says where the time went (stderr).
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-compile %s --training -o %t/all
// RUN: mok-compile %s --training --function layer_forward --function layer_backward --stages-dir %t/stages --stages moe,mk --times -o %t/some 2>%t/times | FileCheck %s --check-prefix=FILES
// RUN: cmp %t/all/layer_forward.ptx %t/some/layer_forward.ptx
// RUN: cmp %t/all/layer_backward.ptx %t/some/layer_backward.ptx
// RUN: cmp %t/all/layer_backward.json %t/some/layer_backward.json
// RUN: ls %t/all | FileCheck %s --check-prefix=ALL
// RUN: ls %t/some | FileCheck %s --check-prefix=SOME
// RUN: ls %t/stages | FileCheck %s --check-prefix=STAGES
// RUN: FileCheck %s --check-prefix=MK < %t/stages/mk.mlir
// RUN: FileCheck %s --check-prefix=TIMES < %t/times
// RUN: not mok-compile %s --function other -o %t/x 2>&1 | FileCheck %s --check-prefix=NO-FUNCTION
// RUN: not mok-compile %s -o %t/x --function 2>&1 | FileCheck %s --check-prefix=NO-NAME
// RUN: not mok-compile %s --stages moe -o %t/x 2>&1 | FileCheck %s --check-prefix=NO-DIR
// RUN: not mok-compile %s --stages-dir %t/bad --stages moe,ptx -o %t/x 2>&1 | FileCheck %s --check-prefix=BAD-STAGE
// FILES: /layer_forward.ptx
// FILES: /layer_backward.ptx
// ALL: layer.json
// ALL: layer.ptx
// SOME-NOT: layer.ptx
// SOME: layer_backward.json
// SOME-NOT: layer.ptx
// STAGES: mk.mlir
// STAGES-NEXT: moe.mlir
// STAGES-EMPTY:
// MK-NOT: gpu.module @layer_kernels
// MK: gpu.module @layer_forward_kernels
// MK-NOT: gpu.module @layer_kernels
// MK: gpu.module @layer_backward_kernels
// MK-NOT: gpu.module @layer_kernels
// TIMES: {{^parse [0-9.]+$}}
// TIMES-NEXT: {{^training [0-9.]+$}}
// TIMES-NEXT: {{^mk [0-9.]+$}}
// TIMES-NEXT: {{^gpu [0-9.]+$}}
// TIMES-NEXT: {{^llvm [0-9.]+$}}
// TIMES-NEXT: {{^ptx [0-9.]+$}}
// TIMES-NEXT: {{^ptx.translate [0-9.]+$}}
// TIMES-NEXT: {{^ptx.link [0-9.]+$}}
// TIMES-NEXT: {{^ptx.optimize [0-9.]+$}}
// TIMES-NEXT: {{^ptx.codegen [0-9.]+$}}
// TIMES-NEXT: {{^print [0-9.]+$}}
// NO-FUNCTION: no function @other to compile; the module has @layer
// NO-NAME: mok-compile: --function needs a function name
// NO-DIR: mok-compile: --stages selects what --stages-dir writes; give --stages-dir
// BAD-STAGE: unknown stage 'ptx'; expected moe, training, mk, gpu or llvm

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
