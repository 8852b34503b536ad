// The FP8 DeepSeek-V3 shard compiles to PTX for both targets: E4M3 wgmma
// on sm_90a (8 of them: four k32 steps in each routed GEMM's k-tile), with
// no spills at 255 registers, and scalar FP8 GEMMs on sm_100a.
// REQUIRES: ptxas
// RUN: rm -rf %t && mok-opt %mok_src_root/examples/dsv3-shard-fp8.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/sm90 | FileCheck %s
// RUN: grep -c wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 %t/sm90/dsv3_shard_fp8_moe_kernels.ptx | FileCheck %s --check-prefix=EIGHT
// RUN: ptxas -arch=sm_90a -v %t/sm90/dsv3_shard_fp8_moe_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %mok_src_root/examples/dsv3-shard-fp8.mlir --moe-to-ptx="chip=sm_90a fp8-quantized-weights=true" | %python %mok_src_root/scripts/extract-ptx.py %t/given
// RUN: ptxas -arch=sm_90a -v %t/given/dsv3_shard_fp8_moe_kernels.ptx -o %t/given.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %mok_src_root/examples/dsv3-shard-fp8.mlir --moe-to-ptx="chip=sm_100a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a %t/sm100/dsv3_shard_fp8_moe_kernels.ptx -o %t/sm100.cubin

// CHECK: dsv3_shard_fp8_moe_kernels.ptx
// EIGHT: {{^}}8{{$}}
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
