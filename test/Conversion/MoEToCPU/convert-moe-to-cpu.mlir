// RUN: mok-opt %s --split-input-file --convert-moe-to-cpu | FileCheck %s

!plan = !moe.plan<tokens = 5, top_k = 2, experts = 4, ep = 1, padding = 2>

// The function is rebuilt in destination-passing style: memref arguments,
// one output buffer per result, no results, a C interface. No moe op and no
// tensor is left; every temporary is freed before returning.
// CHECK-LABEL: func.func @layer(
// CHECK-SAME: %[[X:[^:]*]]: memref<5x8xbf16>, %[[TOP:[^:]*]]: memref<5x2xi32>, %{{[^:]*}}: memref<5x2xf32>, %{{[^:]*}}: memref<4x6x8xbf16>, %{{[^:]*}}: memref<4x6x8xbf16>, %{{[^:]*}}: memref<4x8x6xbf16>, %[[OUT:[^:]*]]: memref<5x8xbf16>)
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NOT: moe.
// CHECK-NOT: tensor<
// The plan: per-expert counts, then padded offsets, then the row maps.
// CHECK: %[[COUNTS:.*]] = memref.alloc() : memref<4xindex>
// CHECK: memref.load %[[TOP]]
// CHECK: %[[OFFSETS:.*]] = memref.alloc() : memref<5xindex>
// CHECK: %[[ROWS:.*]] = scf.for {{.*}} iter_args
// CHECK: memref.alloc(%[[ROWS]]) : memref<?xindex>
// SwiGLU in f32 from bf16 gate/up, with the clamp; the sigmoid divides
// exactly (IEEE; the GPU's approximate reciprocal is not for the reference).
// CHECK: math.exp
// CHECK-NOT: fastmath
// CHECK: arith.divf %{{[^ ]*}}, %{{[^ ]*}} : f32
// CHECK: arith.truncf {{.*}} : f32 to bf16
// The result is copied into the output buffer, the temporaries freed.
// CHECK: memref.store {{.*}}, %[[OUT]]
// CHECK: memref.dealloc %[[COUNTS]]
// CHECK: memref.dealloc %[[OFFSETS]]
// CHECK: return
// CHECK-NOT: moe.
func.func @layer(%x: tensor<5x8xbf16>, %top: tensor<5x2xi32>, %rw: tensor<5x2xf32>,
                 %wg: tensor<4x6x8xbf16>, %wu: tensor<4x6x8xbf16>,
                 %wd: tensor<4x8x6xbf16>) -> tensor<5x8xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan {swiglu_limit = 7.0 : f32}
      : (tensor<5x8xbf16>, tensor<5x2xi32>, tensor<5x2xf32>, tensor<4x6x8xbf16>,
         tensor<4x6x8xbf16>, tensor<4x8x6xbf16>) -> tensor<5x8xbf16>
  return %o : tensor<5x8xbf16>
}

// -----

!plan = !moe.plan<tokens = ?, top_k = 1, experts = 2, ep = 1, padding = 1>

// Unfused ops, a dynamic token count and a routed-row result (dynamic rows):
// the output buffer of the routed rows comes last, sized by the caller.
// CHECK-LABEL: func.func @chain(
// CHECK-SAME: memref<?x4xbf16>, %{{[^:]*}}: memref<?x1xi64>, %{{[^:]*}}: memref<?x1xf32>, %{{[^:]*}}: memref<2x2x4xbf16>, %{{[^:]*}}: memref<2x4x2xbf16>, %{{[^:]*}}: memref<?x4xbf16>, %[[ROUTED:[^:]*]]: memref<?x2xbf16>)
// CHECK-NOT: moe.
// CHECK: arith.minsi
// CHECK: return
func.func @chain(%x: tensor<?x4xbf16>, %top: tensor<?x1xi64>, %rw: tensor<?x1xf32>,
                 %wg: tensor<2x2x4xbf16>, %wd: tensor<2x4x2xbf16>)
    -> (tensor<?x4xbf16>, tensor<?x2xbf16>) {
  %p = moe.plan %top : tensor<?x1xi64> -> !plan
  %xr = moe.dispatch %x, %p : tensor<?x4xbf16>, !plan -> tensor<?x4xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wg
      : tensor<?x4xbf16>, !plan, tensor<2x2x4xbf16> -> tensor<?x2xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x2xbf16>, !plan, tensor<2x4x2xbf16> -> tensor<?x4xbf16>
  %o = moe.combine %y, %p, weights %rw
      : tensor<?x4xbf16>, !plan, tensor<?x1xf32> -> tensor<?x4xbf16>
  return %o, %h : tensor<?x4xbf16>, tensor<?x2xbf16>
}

// -----

// Functions without moe ops are left alone.
// CHECK-LABEL: func.func @plain(%{{.*}}: f32) -> f32
// CHECK-NEXT: return
func.func @plain(%a: f32) -> f32 {
  return %a : f32
}
