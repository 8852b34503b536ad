// The one-GPU DeepSeek-V3 shard compiles to PTX for both targets (the
// setup script's main job).
// REQUIRES: ptxas
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/sm90 | FileCheck %s
// RUN: ptxas -arch=sm_90a %t/sm90/dsv3_shard_moe_kernels.ptx -o %t/sm90.cubin
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100 | FileCheck %s
// RUN: ptxas -arch=sm_100a %t/sm100/dsv3_shard_moe_kernels.ptx -o %t/sm100.cubin

// CHECK: dsv3_shard_moe_kernels.ptx
