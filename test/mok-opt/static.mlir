// The fully static mok-opt needs neither libMLIR nor libLLVM and behaves like
// the development build.
// REQUIRES: static-tools
// RUN: mok-opt-static %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-fuse-layer | FileCheck %s
// RUN: ldd %mok_tools_dir/mok-opt-static | FileCheck %s --check-prefix=LDD

// CHECK: moe.layer
// LDD-NOT: libMLIR
// LDD-NOT: libLLVM
// LDD-NOT: libstdc++
