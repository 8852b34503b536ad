// The shipped DeepSeek-V3-like example parses, round-trips and fuses into one
// moe.layer with its shared expert.
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir | mok-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir --moe-fuse-layer | FileCheck %s
// As one rank of its 8-rank group, it lowers for the CPU target to the
// stage functions of docs/ExpertParallel.md, training functions included.
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir --moe-fuse-layer --moe-generate-backward --convert-moe-to-cpu | FileCheck %s --check-prefix=CPU

// ROUNDTRIP: moe.plan
// ROUNDTRIP: moe.combine

// CPU-LABEL: func.func @deepseek_v3_moe__ep_send(
// CPU-SAME: memref<4096x8xi32> {moe.buffer = "top_experts"}, %{{[^:]*}}: memref<4096x7168xbf16> {moe.buffer = "x"}, %{{[^:]*}}: memref<8xi64> {moe.buffer = "send_rows"}
// CPU-LABEL: func.func @deepseek_v3_moe__ep_experts(
// CPU-SAME: memref<32x2048x7168xbf16> {moe.buffer = "gate_weights"}
// CPU-LABEL: func.func @deepseek_v3_moe__ep_combine(
// CPU-SAME: memref<2048x7168xbf16> {moe.buffer = "shared_gate_weights"}
// CPU-LABEL: func.func @deepseek_v3_moe_forward__ep_experts(
// CPU-LABEL: func.func @deepseek_v3_moe_backward__ep_combine(

// CHECK: !plan = !moe.plan<tokens = 4096, top_k = 8, experts = 256, ep = 8, padding = 128>
// CHECK-LABEL: func.func @deepseek_v3_moe
// CHECK-NEXT: %[[OUT:.*]] = moe.layer %arg0, %arg1, %arg2, gate %arg3, up %arg4, down %arg5 shared(%arg6, %arg7, %arg8) plan !plan : (tensor<4096x7168xbf16>, tensor<4096x8xi32>, tensor<4096x8xf32>, tensor<32x2048x7168xbf16>, tensor<32x2048x7168xbf16>, tensor<32x7168x2048xbf16>, tensor<2048x7168xbf16>, tensor<2048x7168xbf16>, tensor<7168x2048xbf16>) -> tensor<4096x7168xbf16>
// CHECK-NEXT: return %[[OUT]]
