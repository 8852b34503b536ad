// REQUIRES: ptxas
// The probe tiles of scripts/probe (run on the H200 by run_on_h200.sh): the
// committed PTX assembles for sm_90a without spills. The K-major tile reads
// B with imm-trans-b = 0, the N-major one (the backward's dgrad operand form,
// docs/Backward.md) with 1, and the wgrad form both A and B transposed.
// RUN: ptxas -arch=sm_90a -v %mok_src_root/scripts/probe/gemm_sm90.ptx -o %t.k.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: ptxas -arch=sm_90a -v %mok_src_root/scripts/probe/gemm_sm90_nmajor.ptx -o %t.n.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: ptxas -arch=sm_90a -v %mok_src_root/scripts/probe/gemm_sm90_mnmajor.ptx -o %t.mn.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
// RUN: FileCheck %s --check-prefix=KMAJOR --input-file=%mok_src_root/scripts/probe/gemm_sm90.ptx
// KMAJOR: .entry gemm_bf16_tn_256x256x512
// KMAJOR-COUNT-8: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 0;
// RUN: FileCheck %s --check-prefix=NMAJOR --input-file=%mok_src_root/scripts/probe/gemm_sm90_nmajor.ptx
// NMAJOR: .entry gemm_bf16_nn_256x256x512
// NMAJOR-COUNT-8: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 1;
// The wgrad form: A M-major and B N-major (imm-trans-a = imm-trans-b = 1).
// RUN: FileCheck %s --check-prefix=MNMAJOR --input-file=%mok_src_root/scripts/probe/gemm_sm90_mnmajor.ptx
// MNMAJOR: .entry gemm_bf16_tnn_256x256x512
// MNMAJOR-COUNT-8: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// The N-major B descriptor (nvgpu's, from the 64 x 64 box map type): leading
// byte offset 8192 >> 4 = 512 at bit 16 (between 64-column N blocks; the
// K-major A's is 1024 >> 4, unused), then the wgmma reads B transposed.
// RUN: mlir-opt %mok_src_root/scripts/probe/gemm_sm90_nmajor.mlir --convert-nvgpu-to-nvvm | FileCheck %s --check-prefix=DESC
// DESC: %[[LBO:.*]] = llvm.mlir.constant(512 : i64)
// DESC: %[[AT32:.*]] = llvm.mlir.constant(32 : i64)
// DESC-NEXT: llvm.shl %[[SBO:.*]], %[[AT32]]
// DESC: %[[AT16:.*]] = llvm.mlir.constant(16 : i64)
// DESC-NEXT: llvm.shl %[[LBO]], %[[AT16]]
// DESC: nvvm.wgmma.mma_async {{.*}} B[<bf16>, <one>, <row>]
