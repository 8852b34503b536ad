// The shipped Qwen3-30B-A3B-like example parses, round-trips and fuses into
// one moe.layer without a shared expert.
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir | mok-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-fuse-layer | FileCheck %s

// ROUNDTRIP: moe.plan
// ROUNDTRIP: moe.combine

// CHECK: !plan = !moe.plan<tokens = 8192, top_k = 8, experts = 128, ep = 1, padding = 128>
// CHECK-LABEL: func.func @qwen3_30b_a3b_moe
// CHECK-NEXT: %[[OUT:.*]] = moe.layer %arg0, %arg1, %arg2, gate %arg3, up %arg4, down %arg5 plan !plan : (tensor<8192x2048xbf16>, tensor<8192x8xi32>, tensor<8192x8xf32>, tensor<128x768x2048xbf16>, tensor<128x768x2048xbf16>, tensor<128x2048x768xbf16>) -> tensor<8192x2048xbf16>
// CHECK-NEXT: return %[[OUT]]
