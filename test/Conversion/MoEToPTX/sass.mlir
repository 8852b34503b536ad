// REQUIRES: ptxas, cuobjdump
// The machine code of the sm_90a kernels ("check the SASS for
// HGMMA"): every wgmma of the PTX is an HGMMA in the SASS. ptxas deletes a
// wgmma whose accumulators nothing reads (a diagnostic variant without the
// gate/up stores kept 8 of 16), so the count is compared, not just found.
// The default plan (fused dispatch), warp roles, and the Qwen3 shape.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/fused
// RUN: ptxas -arch=sm_90a %t/fused/dsv3_shard_moe_kernels.ptx -o %t/fused.cubin
// RUN: grep -c wgmma.mma_async %t/fused/dsv3_shard_moe_kernels.ptx > %t/fused.ptx.count
// RUN: cuobjdump --dump-sass %t/fused.cubin | grep -c 'HGMMA\.64x[0-9]*x16\.F32\.BF16' > %t/fused.sass.count
// RUN: diff %t/fused.ptx.count %t/fused.sass.count
// RUN: FileCheck %s --check-prefix=SIXTEEN --input-file %t/fused.sass.count
//
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx="chip=sm_90a warp-specialize=true" | %python %mok_src_root/scripts/extract-ptx.py %t/ws
// RUN: ptxas -arch=sm_90a %t/ws/dsv3_shard_moe_kernels.ptx -o %t/ws.cubin
// RUN: grep -c wgmma.mma_async %t/ws/dsv3_shard_moe_kernels.ptx > %t/ws.ptx.count
// RUN: cuobjdump --dump-sass %t/ws.cubin | grep -c 'HGMMA\.64x[0-9]*x16\.F32\.BF16' > %t/ws.sass.count
// RUN: diff %t/ws.ptx.count %t/ws.sass.count
// RUN: FileCheck %s --check-prefix=THIRTYTWO --input-file %t/ws.sass.count
//
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/qwen3
// RUN: ptxas -arch=sm_90a %t/qwen3/qwen3_30b_a3b_moe_kernels.ptx -o %t/qwen3.cubin
// RUN: grep -c wgmma.mma_async %t/qwen3/qwen3_30b_a3b_moe_kernels.ptx > %t/qwen3.ptx.count
// RUN: cuobjdump --dump-sass %t/qwen3.cubin | grep -c 'HGMMA\.64x[0-9]*x16\.F32\.BF16' > %t/qwen3.sass.count
// RUN: diff %t/qwen3.ptx.count %t/qwen3.sass.count
// RUN: FileCheck %s --check-prefix=EIGHT --input-file %t/qwen3.sass.count

// SIXTEEN: {{^}}16{{$}}
// THIRTYTWO: {{^}}32{{$}}
// EIGHT: {{^}}8{{$}}
//
// The FP8 shard: every E4M3 wgmma of the PTX is a *GMMA in the SASS.
// RUN: mok-opt %mok_src_root/examples/dsv3-shard-fp8.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/fp8
// RUN: ptxas -arch=sm_90a %t/fp8/dsv3_shard_fp8_moe_kernels.ptx -o %t/fp8.cubin
// RUN: grep -c wgmma.mma_async %t/fp8/dsv3_shard_fp8_moe_kernels.ptx > %t/fp8.ptx.count
// RUN: cuobjdump --dump-sass %t/fp8.cubin | grep -cE '[A-Z]GMMA\.64x[0-9]*x(16|32)\.' > %t/fp8.sass.count
// RUN: diff %t/fp8.ptx.count %t/fp8.sass.count
