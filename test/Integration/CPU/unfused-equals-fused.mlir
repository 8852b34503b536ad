// The unfused chain (plan, dispatch, expert_swiglu, expert_down,
// shared_expert, combine) and the fused moe.layer compute the same bits on
// the CPU, with padding, a clamp, -1 routes and a shared expert.
// REQUIRES: mlir-runner
// RUN: split-file %s %t
// RUN: mok-opt %t/layers.mlir --convert-moe-to-cpu | sed -e '/^module {$/d' -e '/^}$/d' > %t/lowered.mlir
// RUN: cat %t/lowered.mlir %t/main.mlir | mok-opt --moe-to-cpu | mlir-runner -e main -entry-point-result=void -shared-libs=%mlir_lib_dir/libmlir_c_runner_utils.so | FileCheck %s

// CHECK: nonzero outputs
// CHECK-NEXT: 18
// CHECK-NEXT: mismatches
// CHECK-NEXT: 0

//--- layers.mlir
!plan = !moe.plan<tokens = 6, top_k = 2, experts = 4, ep = 1, padding = 4>
func.func @unfused(%x: tensor<6x3xbf16>, %top: tensor<6x2xi32>, %rw: tensor<6x2xf32>,
                   %wg: tensor<4x2x3xbf16>, %wu: tensor<4x2x3xbf16>, %wd: tensor<4x3x2xbf16>,
                   %sg: tensor<2x3xbf16>, %su: tensor<2x3xbf16>, %sd: tensor<3x2xbf16>)
    -> tensor<6x3xbf16> {
  %p = moe.plan %top : tensor<6x2xi32> -> !plan
  %xr = moe.dispatch %x, %p : tensor<6x3xbf16>, !plan -> tensor<?x3xbf16>
  %h = moe.expert_swiglu %xr, %p, gate %wg, up %wu {swiglu_limit = 0.75 : f32}
      : tensor<?x3xbf16>, !plan, tensor<4x2x3xbf16> -> tensor<?x2xbf16>
  %y = moe.expert_down %h, %p, down %wd
      : tensor<?x2xbf16>, !plan, tensor<4x3x2xbf16> -> tensor<?x3xbf16>
  %s = moe.shared_expert %x, gate %sg, up %su, down %sd {swiglu_limit = 0.75 : f32}
      : tensor<6x3xbf16>, tensor<2x3xbf16>, tensor<3x2xbf16>
  %o = moe.combine %y, %p, weights %rw shared %s
      : tensor<?x3xbf16>, !plan, tensor<6x2xf32>, tensor<6x3xbf16> -> tensor<6x3xbf16>
  return %o : tensor<6x3xbf16>
}
func.func @fused(%x: tensor<6x3xbf16>, %top: tensor<6x2xi32>, %rw: tensor<6x2xf32>,
                 %wg: tensor<4x2x3xbf16>, %wu: tensor<4x2x3xbf16>, %wd: tensor<4x3x2xbf16>,
                 %sg: tensor<2x3xbf16>, %su: tensor<2x3xbf16>, %sd: tensor<3x2xbf16>)
    -> tensor<6x3xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd)
      plan !plan {swiglu_limit = 0.75 : f32}
      : (tensor<6x3xbf16>, tensor<6x2xi32>, tensor<6x2xf32>, tensor<4x2x3xbf16>,
         tensor<4x2x3xbf16>, tensor<4x3x2xbf16>, tensor<2x3xbf16>, tensor<2x3xbf16>,
         tensor<3x2xbf16>) -> tensor<6x3xbf16>
  return %o : tensor<6x3xbf16>
}

//--- main.mlir
memref.global "private" constant @x : memref<6x3xbf16> =
    dense<[[0.5, -1.0, 2.0], [1.5, 0.25, -0.75], [-2.0, 1.0, 0.5],
           [0.125, 0.75, -1.5], [1.0, 1.0, 1.0], [-0.5, 2.5, 0.0]]>
memref.global "private" constant @top : memref<6x2xi32> =
    dense<[[0, 3], [1, -1], [3, 2], [-1, -1], [2, 0], [3, 1]]>
memref.global "private" constant @rw : memref<6x2xf32> =
    dense<[[0.6, 0.4], [1.0, 0.0], [0.3, 0.7], [0.5, 0.5], [0.0, 1.0], [0.9, 0.1]]>
memref.global "private" constant @wg : memref<4x2x3xbf16> =
    dense<[[[0.5, -0.25, 1.0], [0.75, 0.5, -0.5]], [[-1.0, 0.25, 0.5], [0.125, 1.0, 0.75]],
           [[0.25, 0.25, -0.25], [1.5, -0.5, 0.5]], [[-0.5, 1.0, 0.0], [0.5, 0.5, 0.5]]]>
memref.global "private" constant @wu : memref<4x2x3xbf16> =
    dense<[[[1.0, 0.5, -0.5], [0.25, -1.0, 0.5]], [[0.5, 0.5, 0.5], [-0.75, 0.25, 1.0]],
           [[1.25, -0.25, 0.0], [0.5, 0.75, -1.0]], [[0.0, -0.5, 1.5], [1.0, 0.25, 0.25]]]>
memref.global "private" constant @wd : memref<4x3x2xbf16> =
    dense<[[[0.5, 1.0], [-0.5, 0.25], [1.0, -1.0]], [[0.25, 0.75], [1.0, 0.5], [-0.25, 0.5]],
           [[-1.0, 0.5], [0.5, 0.5], [0.75, -0.25]], [[0.5, -0.5], [0.25, 1.0], [1.0, 0.125]]]>
memref.global "private" constant @sg : memref<2x3xbf16> = dense<[[0.5, 0.5, -0.5], [1.0, -0.25, 0.25]]>
memref.global "private" constant @su : memref<2x3xbf16> = dense<[[-0.5, 1.0, 0.5], [0.25, 0.25, 1.0]]>
memref.global "private" constant @sd : memref<3x2xbf16> = dense<[[1.0, 0.5], [-0.5, 0.75], [0.25, -1.0]]>
func.func private @printI64(i64)
func.func private @printNewline()
func.func private @printString(!llvm.ptr)
llvm.mlir.global internal constant @nonzero("nonzero outputs\0A\00")
llvm.mlir.global internal constant @mismatch("mismatches\0A\00")

func.func @main() {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c6 = arith.constant 6 : index
  %zero = arith.constant 0 : i64
  %one = arith.constant 1 : i64
  %fzero = arith.constant 0.0 : f32
  %x = memref.get_global @x : memref<6x3xbf16>
  %top = memref.get_global @top : memref<6x2xi32>
  %rw = memref.get_global @rw : memref<6x2xf32>
  %wg = memref.get_global @wg : memref<4x2x3xbf16>
  %wu = memref.get_global @wu : memref<4x2x3xbf16>
  %wd = memref.get_global @wd : memref<4x3x2xbf16>
  %sg = memref.get_global @sg : memref<2x3xbf16>
  %su = memref.get_global @su : memref<2x3xbf16>
  %sd = memref.get_global @sd : memref<3x2xbf16>
  %a = memref.alloc() : memref<6x3xbf16>
  %b = memref.alloc() : memref<6x3xbf16>
  func.call @unfused(%x, %top, %rw, %wg, %wu, %wd, %sg, %su, %sd, %a)
      : (memref<6x3xbf16>, memref<6x2xi32>, memref<6x2xf32>, memref<4x2x3xbf16>,
         memref<4x2x3xbf16>, memref<4x3x2xbf16>, memref<2x3xbf16>, memref<2x3xbf16>,
         memref<3x2xbf16>, memref<6x3xbf16>) -> ()
  func.call @fused(%x, %top, %rw, %wg, %wu, %wd, %sg, %su, %sd, %b)
      : (memref<6x3xbf16>, memref<6x2xi32>, memref<6x2xf32>, memref<4x2x3xbf16>,
         memref<4x2x3xbf16>, memref<4x3x2xbf16>, memref<2x3xbf16>, memref<2x3xbf16>,
         memref<3x2xbf16>, memref<6x3xbf16>) -> ()
  // Compare bit patterns; count outputs that are not zero (so the check
  // cannot pass on two all-zero results).
  %counts:2 = scf.for %t = %c0 to %c6 step %c1 iter_args(%nz = %zero, %bad = %zero) -> (i64, i64) {
    %r:2 = scf.for %j = %c0 to %c3 step %c1 iter_args(%nz2 = %nz, %bad2 = %bad) -> (i64, i64) {
      %va = memref.load %a[%t, %j] : memref<6x3xbf16>
      %vb = memref.load %b[%t, %j] : memref<6x3xbf16>
      %ia = arith.bitcast %va : bf16 to i16
      %ib = arith.bitcast %vb : bf16 to i16
      %ne = arith.cmpi ne, %ia, %ib : i16
      %fa = arith.extf %va : bf16 to f32
      %isnz = arith.cmpf one, %fa, %fzero : f32
      %inc1 = arith.select %ne, %one, %zero : i64
      %inc2 = arith.select %isnz, %one, %zero : i64
      %n1 = arith.addi %bad2, %inc1 : i64
      %n2 = arith.addi %nz2, %inc2 : i64
      scf.yield %n2, %n1 : i64, i64
    }
    scf.yield %r#0, %r#1 : i64, i64
  }
  %l0 = llvm.mlir.addressof @nonzero : !llvm.ptr
  func.call @printString(%l0) : (!llvm.ptr) -> ()
  func.call @printI64(%counts#0) : (i64) -> ()
  func.call @printNewline() : () -> ()
  %l1 = llvm.mlir.addressof @mismatch : !llvm.ptr
  func.call @printString(%l1) : (!llvm.ptr) -> ()
  func.call @printI64(%counts#1) : (i64) -> ()
  func.call @printNewline() : () -> ()
  memref.dealloc %a : memref<6x3xbf16>
  memref.dealloc %b : memref<6x3xbf16>
  return
}
