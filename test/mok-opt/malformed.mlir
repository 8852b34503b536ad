// mok-opt reports malformed input with a location and exits non-zero; it
// never crashes (`not` fails on a crash, unlike `not --crash`).
// RUN: split-file %s %t
// RUN: not mok-opt %t/syntax.mlir 2>&1 | FileCheck %s --check-prefix=SYNTAX
// RUN: not mok-opt %t/verifier.mlir 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: not mok-opt %t/bad-type.mlir 2>&1 | FileCheck %s --check-prefix=TYPE
// RUN: not mok-opt %t/truncated-type.mlir 2>&1 | FileCheck %s --check-prefix=TRUNCATED
// RUN: not mok-opt %t/unknown-op.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not mok-opt %t/verifier.mlir --moe-fuse-layer 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: not mok-opt %t/does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=MISSING

// SYNTAX: syntax.mlir:2:{{[0-9]+}}: error:
// VERIFIER: verifier.mlir:3:8: error: 'moe.plan' op expects top_experts of shape [T, top_k] with top_k = 2
// TYPE: bad-type.mlir:1:{{[0-9]+}}: error: moe.plan: experts (8) must be divisible by ep (3)
// TRUNCATED: truncated-type.mlir:1:{{[0-9]+}}: error:
// UNKNOWN: unknown-op.mlir:2:3: error: custom op 'moe.frobnicate' is unknown
// MISSING: cannot open input file

//--- syntax.mlir
func.func @f(%x: tensor<4x4xbf16>) {
  %p = moe.plan %x : tensor<4x4xi32 ->
}

//--- verifier.mlir
func.func @f(%top: tensor<64x4xi32>) {
  // the plan says top_k = 2
  %p = moe.plan %top : tensor<64x4xi32> -> !moe.plan<tokens = 64, top_k = 2, experts = 8, ep = 1, padding = 1>
  return
}

//--- bad-type.mlir
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts = 8, ep = 3, padding = 1>)

//--- truncated-type.mlir
func.func private @f(!moe.plan<tokens = 4, top_k = 2, experts =

//--- unknown-op.mlir
func.func @f() {
  moe.frobnicate
  return
}
