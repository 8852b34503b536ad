// mok-compile --cubin with several kernels (here --training's three) runs
// their ptxas side by side and writes each cubin with what it was made
// from, after the PTX; --times reports the ptxas runs as "cubin".
// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-compile %s --training --cubin --times -o %t/c 2>%t/times | FileCheck %s --check-prefix=FILES
// RUN: od -A n -t x1 -N 4 %t/c/layer_forward.cubin | FileCheck %s --check-prefix=ELF
// RUN: od -A n -t x1 -N 4 %t/c/layer_backward.cubin | FileCheck %s --check-prefix=ELF
// RUN: sha256sum %t/c/layer_backward.ptx | cut -c1-64 > %t/sum
// RUN: FileCheck %s --check-prefix=SUM -DSUM=%{readfile:%t/sum} < %t/c/layer_backward.cubin.json
// RUN: FileCheck %s --check-prefix=TIMES < %t/times
// FILES: layer.ptx
// FILES-NEXT: layer.json
// FILES-NEXT: layer_forward.ptx
// FILES-NEXT: layer_forward.json
// FILES-NEXT: layer_backward.ptx
// FILES-NEXT: layer_backward.json
// FILES-NEXT: layer.cubin
// FILES-NEXT: layer_forward.cubin
// FILES-NEXT: layer_backward.cubin
// ELF: 7f 45 4c 46
// SUM: "ptx_sha256": "[[SUM]]"
// TIMES: {{^print [0-9.]+$}}
// TIMES-NEXT: {{^cubin [0-9.]+$}}

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
