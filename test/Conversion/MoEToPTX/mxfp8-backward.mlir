// REQUIRES: ptxas
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk=chip=sm_100a | FileCheck %s --check-prefix=MK
// RUN: rm -rf %t && mok-opt %s --moe-generate-backward --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/tc
// RUN: FileCheck %s --check-prefix=PTX --input-file %t/tc/mx_train_backward_kernels.ptx
// RUN: ptxas -arch=sm_100a -v %t/tc/mx_train_backward_kernels.ptx -o %t/bwd.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: ptxas -arch=sm_100a -v %t/tc/mx_train_forward_kernels.ptx -o %t/fwd.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_100a fp8-quantized-weights=true" | FileCheck %s --check-prefix=GIVEN --implicit-check-not=mk.quantize_weights
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx="chip=sm_100a fp8-quantized-weights=true" | %python %mok_src_root/scripts/extract-ptx.py %t/given
// RUN: ptxas -arch=sm_100a -v %t/given/mx_train_backward_kernels.ptx -o %t/given-bwd.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: ptxas -arch=sm_100a -v %t/given/mx_train_forward_kernels.ptx -o %t/given-fwd.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS

// The MXFP8 training layer (no shared expert) on sm_100a: every routed
// GEMM of the backward on tcgen05's block-scaled MMA in 128 x 128 tiles
// with K-major E4M3 operands and their E8M0 atoms: the down dgrad (f32
// out), the down weights' gradient and the gate and up ones (k_groups: K
// the routed rows, in column blocks of 32), and the gate/up dgrad (concat:
// the second K-loop reads d_up's and the up weights' atoms).
// MK-LABEL: gpu.func @mx_train_backward_backward(
// MK: mk.gemm store {{.*}} scales({{.*}} : memref<5x2x512xf8E8M0FNU>, memref<4x1x2x512xf8E8M0FNU>) schedule <tcgen05, tile = [128, 128, 128], stages = 4> {{.*}} -> memref<588x128xf32>
// MK: mk.gemm store {{.*}} k_groups({{.*}}) k_counts({{.*}}) scales({{.*}} : memref<2x5x512xf8E8M0FNU>, memref<1x5x512xf8E8M0FNU>) schedule <tcgen05, tile = [128, 128, 128], stages = 4>
// MK: mk.gemm store {{.*}} concat({{.*}}) scales({{.*}} : memref<5x1x512xf8E8M0FNU>, memref<5x1x512xf8E8M0FNU>, memref<4x2x1x512xf8E8M0FNU>, memref<4x2x1x512xf8E8M0FNU>) schedule <tcgen05, tile = [128, 128, 128], stages = 4>
// MK-COUNT-2: mk.gemm store {{.*}} k_groups({{.*}}) schedule <tcgen05, tile = [128, 128, 128], stages = 4>
//
// With fp8-quantized-weights both kernels take the routed weights as E4M3
// values and E8M0 atoms in both layouts (mok.ops.mxfp8_quantize, then
// mok.ops.mxfp8_scale_atoms): the forward's GEMMs read gate_q's, the
// backward's dgrads gate_qt's; no weight quantizer in either.
// GIVEN-LABEL: gpu.func @mx_train_forward_forward(
// GIVEN-SAME: %[[FGQ:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[FGS:[^:]*]]: memref<4x1x2x512xf8E8M0FNU>,
// GIVEN-SAME: name = "gate_scale_t", role = "input", shape = array<i64: 4, 2, 1, 512>
// GIVEN: mk.gemm swiglu %{{[^,]*}}, %[[FGQ]], %{{.*}} scales(%{{[^,]*}}, %[[FGS]],
// GIVEN-LABEL: gpu.func @mx_train_backward_backward(
// GIVEN-SAME: %[[BDQT:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[BDST:[^:]*]]: memref<4x1x2x512xf8E8M0FNU>, %{{[^:]*}}: memref<588x256xbf16>,
// GIVEN: mk.gemm store %{{[^,]*}}, %[[BDQT]] into %{{.*}} scales(%{{[^,]*}}, %[[BDST]] :
//
// PTX: .entry mx_train_backward_backward(
// PTX: tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32
// PTX-DAG: cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes
// PTX-DAG: tcgen05.cp.cta_group::1.32x128b.warpx4
// PTX-DAG: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32.collector::a::discard
// PTX-NOT: kind::f16
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
func.func @mx_train(%x: tensor<40x256xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>, %wg: tensor<4x128x256xbf16>, %wu: tensor<4x128x256xbf16>, %wd: tensor<4x256x128xbf16>) -> tensor<40x256xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 128> {precision = "mxfp8"}
      : (tensor<40x256xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x256xbf16>, tensor<4x128x256xbf16>, tensor<4x256x128xbf16>) -> tensor<40x256xbf16>
  return %out : tensor<40x256xbf16>
}
