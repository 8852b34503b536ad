// mok-compile --cubin also writes each kernel's machine code for the chip
// (ptxas -arch=CHIP) and what it was made from (the chip, the PTX's
// SHA-256); without --cubin no cubin is left beside the new PTX. --cubin
// without ptxas is an error naming where it looked.
// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_90a --cubin -o %t/c | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefix=INFO < %t/c/qwen3_30b_a3b_moe.cubin.json
// RUN: od -A n -t x1 -N 4 %t/c/qwen3_30b_a3b_moe.cubin | FileCheck %s --check-prefix=ELF
// RUN: sha256sum %t/c/qwen3_30b_a3b_moe.ptx | cut -c1-64 > %t/sum
// RUN: FileCheck %s --check-prefix=SUM -DSUM=%{readfile:%t/sum} < %t/c/qwen3_30b_a3b_moe.cubin.json
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_90a -o %t/c | FileCheck %s --check-prefix=PLAIN
// RUN: ls %t/c | FileCheck %s --check-prefix=LEFT
// RUN: not mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --cubin --toolkit %t/none -o %t/x 2>&1 | FileCheck %s --check-prefix=NOPTXAS -DDIR=%t

// FILES: qwen3_30b_a3b_moe.ptx
// FILES-NEXT: qwen3_30b_a3b_moe.json
// FILES-NEXT: qwen3_30b_a3b_moe.cubin

// INFO: "chip": "sm_90a",
// INFO-NEXT: "ptx_sha256": "{{[0-9a-f]+}}"

// ELF: 7f 45 4c 46

// SUM: "ptx_sha256": "[[SUM]]"

// PLAIN: qwen3_30b_a3b_moe.json
// PLAIN-NOT: cubin
// LEFT-NOT: cubin

// NOPTXAS: mok-compile: --cubin needs ptxas (the CUDA toolkit's assembler); looked in [[DIR]]/none/bin/ptxas
