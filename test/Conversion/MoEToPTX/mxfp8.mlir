// REQUIRES: ptxas
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_100a | FileCheck %s --check-prefix=MK
// RUN: mok-opt %s --convert-moe-to-mk=chip=sm_100a --convert-mk-to-gpu | FileCheck %s --check-prefix=GPU
// RUN: rm -rf %t && mok-opt %s --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/tc
// RUN: FileCheck %s --check-prefix=PTX --input-file %t/tc/mx_layer_kernels.ptx
// RUN: ptxas -arch=sm_100a -v %t/tc/mx_layer_kernels.ptx -o %t/tc.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx="chip=sm_90a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: ptxas -arch=sm_90a -v %t/sm90/mx_layer_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx="chip=sm_100a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a -v %t/sm100/mx_layer_kernels.ptx -o %t/sm100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: not mok-opt %s --convert-moe-to-mk 2>&1 | FileCheck %s --check-prefix=HOPPER
// RUN: sed -e 's/padding = 128/padding = 32/' %s | not mok-opt --convert-moe-to-mk=chip=sm_100a 2>&1 | FileCheck %s --check-prefix=PADDING
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk=chip=sm_100a | FileCheck %s --check-prefix=TRAIN
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/bwdtc
// RUN: ptxas -arch=sm_100a -v %t/bwdtc/mx_layer_backward_kernels.ptx -o %t/bwdtc.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="tensor-cores=false" | FileCheck %s --check-prefix=BWD
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx="chip=sm_90a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/bwd90
// RUN: ptxas -arch=sm_90a -v %t/bwd90/mx_layer_backward_kernels.ptx -o %t/bwd90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-generate-backward --moe-to-ptx="chip=sm_100a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/bwd100
// RUN: ptxas -arch=sm_100a -v %t/bwd100/mx_layer_backward_kernels.ptx -o %t/bwd100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS

// The MXFP8 forward on sm_100a: the weights and the routed rows (after
// the dispatch) and the hidden activation quantized in blocks of 32 along
// K with E8M0 scales in tcgen05's scale-factor atoms, then the routed
// GEMMs on tcgen05's block-scaled MMA in 128 x 128 tiles; the shared
// expert stays bf16, in 128-row tiles too (one tile height a kernel).
// MK-LABEL: gpu.func @mx_layer_forward(
// MK: mk.quantize_weights %{{.*}} : memref<4x128x256xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2x512xf8E8M0FNU>
// MK: mk.quantize_weights %{{.*}} : memref<4x128x256xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2x512xf8E8M0FNU>
// MK: mk.quantize_weights %{{.*}} : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1x512xf8E8M0FNU>
// MK: mk.quantize_rows %{{.*}} : memref<588x256xbf16> -> memref<588x256xf8E4M3FN>, memref<5x2x512xf8E8M0FNU>
// MK: mk.gemm swiglu {{.*}} scales({{.*}} : memref<5x2x512xf8E8M0FNU>, memref<4x1x2x512xf8E8M0FNU>, memref<4x1x2x512xf8E8M0FNU>) schedule <tcgen05, tile = [128, 128, 128], stages = 4>
// MK: mk.gemm swiglu {{.*}} schedule <tcgen05, tile = [128, 128, 64], stages = 4>
// MK: mk.quantize_rows %{{.*}} : memref<588x128xbf16> -> memref<588x128xf8E4M3FN>, memref<5x1x512xf8E8M0FNU>
// MK: mk.gemm store {{.*}} scales({{.*}} : memref<5x1x512xf8E8M0FNU>, memref<4x2x1x512xf8E8M0FNU>) schedule <tcgen05, tile = [128, 128, 128], stages = 4>
// MK: mk.gemm store {{.*}} schedule <tcgen05, tile = [128, 128, 64], stages = 4>
//
// 512 Tensor Memory columns (the accumulators, then the scale atoms), and
// the scale atoms' ring in static shared memory.
// GPU: memref.global "private" @mok_mx_scale_atoms : memref<6144xi8, #gpu.address_space<workgroup>> {alignment = 128 : i64}
// GPU: nvvm.tcgen05.alloc %{{.*}}, %c512_i32
//
// The MX quantizer: the exponent from amax's bits (E - 135, plus one past
// a mantissa of 1.75), clamped to -127; the elements multiplied by 2^-e.
// GPU: arith.constant 6291456 : i32
// GPU: arith.constant 135 : i32
// GPU: arith.maxsi %{{.*}}, %c-127_i32 : i32
// GPU: nvvm.convert.f32x2.to.f8x2 {{.*}}(f8E4M3FN)
//
// Each k-tile's three atoms bulk-copied with the stage (512 bytes each),
// then copied to Tensor Memory (32x128b, warpx4) before the block-scaled
// MMAs.
// GPU: nvvm.cp.async.bulk.shared.cluster.global {{.*}} : !llvm.ptr<3>, <1>
// GPU: nvvm.tcgen05.cp {{.*}} {multicast = #nvvm.tcgen05_cp_multicast<warpx4>, shape = #nvvm.tcgen05_cp_shape<shape_32x128b>}
// GPU: nvvm.tcgen05.mma.block_scale %{{.*}}, %{{.*}}, %{{.*}}, %c144703488_i32, {{.*}} {blockScale = #nvvm.tcgen05_mma_block_scale<block32>, ctaGroup = #nvvm.cta_group<cta_1>, kind = #nvvm.block_scale_kind<mxf8f6f4>}
//
// The instruction descriptors of the four k32 steps: M = 128, N = 128,
// E4M3 x E4M3, UE8M0 scales, scale byte ks for A and B (0x08A00000,
// 0x28A00010, 0x48A00020, 0x68A00030).
// PTX: .entry mx_layer_forward(
// PTX: tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32
// PTX-DAG: cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes
// PTX-DAG: tcgen05.cp.cta_group::1.32x128b.warpx4
// PTX-DAG: mov.b32 {{.*}}, 144703488;
// PTX-DAG: mov.b32 {{.*}}, 681574416;
// PTX-DAG: mov.b32 {{.*}}, 1218445344;
// PTX-DAG: mov.b32 {{.*}}, 1755316272;
// PTX-DAG: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32.collector::a::discard
// PTX-DAG: tcgen05.mma.cta_group::1.kind::f16.collector::a::discard
// PTX-DAG: tcgen05.ld.sync.aligned.32x32b.x32.b32
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
//
// The MXFP8 backward on scalar GEMMs: the weights quantized transposed
// (blocks of 32 along the dgrads' K), d_out's routed bf16 rows quantized,
// the column blocks of 32 routed rows for the weights' gradients
// (k_groups), and the gate/up dgrad's two K-loops with their own scales.
// BWD-LABEL: gpu.func @mx_layer_backward_backward(
// BWD: mk.gather %{{.*}} into %[[DOUT:.*]] {top_k = 2 : i64} : memref<40x256xbf16>, memref<588xi64>, memref<5xi64> -> memref<588x256xbf16>
// BWD: mk.quantize_weights %{{.*}} transposed : memref<4x128x256xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1x512xf8E8M0FNU>
// BWD: mk.quantize_weights %{{.*}} transposed : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2x512xf8E8M0FNU>
// BWD: mk.quantize_columns {{.*}} : memref<588x128xbf16> -> memref<128x640xf8E4M3FN>, memref<1x5x512xf8E8M0FNU>
// BWD: mk.quantize_rows %[[DOUT]] into {{.*}} : memref<588x256xbf16> -> memref<588x256xf8E4M3FN>, memref<5x2x512xf8E8M0FNU>
// BWD: mk.gemm store {{.*}} grouped({{.*}}) scales({{.*}} : memref<5x2x512xf8E8M0FNU>, memref<4x1x2x512xf8E8M0FNU>) schedule <simt> {{.*}} -> memref<588x128xf32>
// BWD: mk.gemm store {{.*}} k_groups({{.*}}) k_counts({{.*}}) scales({{.*}} : memref<2x5x512xf8E8M0FNU>, memref<1x5x512xf8E8M0FNU>) schedule <simt>
// BWD: mk.gemm store {{.*}} concat({{.*}}) scales({{.*}} : memref<5x1x512xf8E8M0FNU>, memref<5x1x512xf8E8M0FNU>, memref<4x2x1x512xf8E8M0FNU>, memref<4x2x1x512xf8E8M0FNU>) schedule <simt>
//
// HOPPER: error: convert-moe-to-mk: MXFP8 layers (precision = "mxfp8") on sm_90a run on scalar GEMMs only: compile them with tensor-cores=false
// PADDING: error: convert-moe-to-mk: MXFP8 layers on tcgen05 need the plan's padding to be a multiple of 128 (the block-scaled MMA's 128-row tiles), got 32
//
// The training layer on sm_100a: the shared expert's bf16 backward GEMMs
// (N-major B for the dgrads, M-major A too for the weights' gradients)
// share the routed ones' 128-row tiles.
// TRAIN-LABEL: gpu.func @mx_layer_backward_backward(
// TRAIN: schedule <tcgen05, tile = [128, 128, 128], stages = 4>
// TRAIN: schedule <tcgen05, tile = [128, 128, 64], stages = 4> {maps = array<i64: {{.*}}>, transpose_b}
// TRAIN: schedule <tcgen05, tile = [128, 128, 64], stages = 4> {maps = array<i64: {{.*}}>, transpose_a, transpose_b}
func.func @mx_layer(%x: tensor<40x256xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>, %wg: tensor<4x128x256xbf16>, %wu: tensor<4x128x256xbf16>, %wd: tensor<4x256x128xbf16>, %sg: tensor<128x256xbf16>, %su: tensor<128x256xbf16>, %sd: tensor<256x128xbf16>) -> tensor<40x256xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      plan !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 128> {precision = "mxfp8"}
      : (tensor<40x256xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x256xbf16>, tensor<4x128x256xbf16>, tensor<4x256x128xbf16>, tensor<128x256xbf16>, tensor<128x256xbf16>, tensor<256x128xbf16>) -> tensor<40x256xbf16>
  return %out : tensor<40x256xbf16>
}
