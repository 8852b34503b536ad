// Mutated versions of the examples and dialect tests: mok-opt must answer
// every one with output or diagnostics, never a crash. A fixed seed keeps the
// test repeatable; run scripts/fuzz-mok-opt.py with other seeds and counts to
// search further.
// RUN: %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt mok-opt --count 3000 --seed 1 %mok_src_root/examples/deepseek-v3.mlir %mok_src_root/examples/qwen3-30b-a3b.mlir %mok_src_root/test/Dialect/MoE/ops.mlir %mok_src_root/test/Dialect/MoE/invalid.mlir %mok_src_root/test/Dialect/MoE/moe-fuse-layer.mlir %mok_src_root/test/Dialect/MoE/moe-generate-backward.mlir %mok_src_root/test/Conversion/MoEToCPU/convert-moe-to-cpu.mlir | FileCheck %s
// CHECK: fuzz: 3000 mutants x 4 pipelines, no crash
