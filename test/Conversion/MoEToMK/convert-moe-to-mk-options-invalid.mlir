// The options that change the tensor-core GEMMs are refused, not ignored,
// for a layer that runs scalar GEMMs (here: I = 32 does not fit the tiles).
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a warp-specialize=true" 2>&1 | FileCheck %s --check-prefix=WS
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true" 2>&1 | FileCheck %s --check-prefix=FD
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a tensor-cores=false fuse-dispatch=true" 2>&1 | FileCheck %s --check-prefix=OFF
// WS: error: convert-moe-to-mk: warp-specialize needs tensor-core GEMMs, and this layer runs scalar ones (its shapes do not fit the tiles: H % 64, I and I_s % 128, padding % 64 must be 0)
// FD: error: convert-moe-to-mk: fuse-dispatch needs tensor-core GEMMs, and this layer runs scalar ones (its shapes
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a fuse-dispatch=true copy-dispatch=true" 2>&1 | FileCheck %s --check-prefix=BOTH
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" | FileCheck %s --check-prefix=SCALAR
// BOTH: error: convert-moe-to-mk: fuse-dispatch and copy-dispatch exclude each other
// copy-dispatch asks for what scalar GEMMs do anyway.
// SCALAR: mk.gather
// SCALAR: mk.gemm swiglu {{.*}}schedule <simt>
// OFF: error: convert-moe-to-mk: fuse-dispatch needs tensor-core GEMMs, and this layer runs scalar ones (tensor-cores=false)
// multicast (clusters of 2 CTAs sharing weight boxes): sm_90a without warp
// roles, tensor-core GEMMs only.
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a multicast=true" 2>&1 | FileCheck %s --check-prefix=MCSCALAR
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_100a multicast=true" 2>&1 | FileCheck %s --check-prefix=MCCHIP
// RUN: not mok-opt %s --convert-moe-to-mk="chip=sm_90a multicast=true warp-specialize=true" 2>&1 | FileCheck %s --check-prefix=MCCHIP
// MCSCALAR: error: convert-moe-to-mk: multicast needs tensor-core GEMMs, and this layer runs scalar ones (its shapes
// MCCHIP: error: convert-moe-to-mk: multicast is implemented for sm_90a without warp-specialize only

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 8>
func.func @small(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x32x64xbf16>,
         tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
