// Executes a CPU-compiled layer, forward and backward, with values small
// enough to check by hand. The layer is lowered first; the driver (@main)
// calls the lowered functions through their memref signatures.
// REQUIRES: mlir-runner
// RUN: split-file %s %t
// RUN: mok-opt %t/layer.mlir --moe-generate-backward=recompute=true --convert-moe-to-cpu | sed -e '/^module {$/d' -e '/^}$/d' > %t/lowered.mlir
// RUN: cat %t/lowered.mlir %t/main.mlir | mok-opt --moe-to-cpu | mlir-runner -e main -entry-point-result=void -shared-libs=%mlir_lib_dir/libmlir_c_runner_utils.so | FileCheck %s

// x = 0.5, W_g = W_u = 0.25, W_d = 0.125, H = 4, I = 2, router weights 0.5:
//   g = u = 4 * 0.5 * 0.25 = 0.5
//   h = bf16(silu(0.5) * 0.5) = bf16(0.155615) = 0.155273
//   y = bf16(2 * h * 0.125) = 0.0388184
// Token 0 has two routes (out = 0.5 y + 0.5 y), token 1 one route and a -1
// (out = 0.5 y), token 2 none (out = 0).
// CHECK-LABEL: out
// CHECK-NEXT: 0.0388184
// CHECK-NEXT: 0.0194092
// CHECK-NEXT: 0
// With d_out = 1: d_w = <d_out, y> = 4 y = 0.155273 per route, 0 for -1.
// CHECK-LABEL: d_router_weights
// CHECK-NEXT: 0.155273
// CHECK-NEXT: 0.155273
// CHECK-NEXT: 0.155273
// CHECK-NEXT: 0
// CHECK-NEXT: 0
// CHECK-NEXT: 0

//--- layer.mlir
func.func @layer(%x: tensor<3x4xbf16>, %top: tensor<3x2xi32>, %rw: tensor<3x2xf32>,
                 %wg: tensor<2x2x4xbf16>, %wu: tensor<2x2x4xbf16>,
                 %wd: tensor<2x4x2xbf16>) -> tensor<3x4xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 3, top_k = 2, experts = 2, ep = 1, padding = 4>
      : (tensor<3x4xbf16>, tensor<3x2xi32>, tensor<3x2xf32>, tensor<2x2x4xbf16>,
         tensor<2x2x4xbf16>, tensor<2x4x2xbf16>) -> tensor<3x4xbf16>
  return %o : tensor<3x4xbf16>
}

//--- main.mlir
memref.global "private" constant @x : memref<3x4xbf16> = dense<0.5>
memref.global "private" constant @top : memref<3x2xi32> = dense<[[0, 1], [1, -1], [-1, -1]]>
memref.global "private" constant @rw : memref<3x2xf32> = dense<0.5>
memref.global "private" constant @wgu : memref<2x2x4xbf16> = dense<0.25>
memref.global "private" constant @wd : memref<2x4x2xbf16> = dense<0.125>
memref.global "private" constant @dout : memref<3x4xbf16> = dense<1.0>
func.func private @printF32(f32)
func.func private @printNewline()
func.func private @printString(!llvm.ptr)
llvm.mlir.global internal constant @out_label("out\0A\00")
llvm.mlir.global internal constant @drw_label("d_router_weights\0A\00")

func.func @main() {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %x = memref.get_global @x : memref<3x4xbf16>
  %top = memref.get_global @top : memref<3x2xi32>
  %rw = memref.get_global @rw : memref<3x2xf32>
  %wgu = memref.get_global @wgu : memref<2x2x4xbf16>
  %wd = memref.get_global @wd : memref<2x4x2xbf16>
  %dout = memref.get_global @dout : memref<3x4xbf16>

  %out = memref.alloc() : memref<3x4xbf16>
  func.call @layer_forward(%x, %top, %rw, %wgu, %wgu, %wd, %out)
      : (memref<3x4xbf16>, memref<3x2xi32>, memref<3x2xf32>, memref<2x2x4xbf16>,
         memref<2x2x4xbf16>, memref<2x4x2xbf16>, memref<3x4xbf16>) -> ()
  %l0 = llvm.mlir.addressof @out_label : !llvm.ptr
  func.call @printString(%l0) : (!llvm.ptr) -> ()
  scf.for %t = %c0 to %c3 step %c1 {
    %v = memref.load %out[%t, %c0] : memref<3x4xbf16>
    %f = arith.extf %v : bf16 to f32
    func.call @printF32(%f) : (f32) -> ()
    func.call @printNewline() : () -> ()
  }

  %dx = memref.alloc() : memref<3x4xbf16>
  %drw = memref.alloc() : memref<3x2xf32>
  %dwg = memref.alloc() : memref<2x2x4xbf16>
  %dwu = memref.alloc() : memref<2x2x4xbf16>
  %dwd = memref.alloc() : memref<2x4x2xbf16>
  func.call @layer_backward(%x, %top, %rw, %wgu, %wgu, %wd, %dout, %dx, %drw, %dwg, %dwu, %dwd)
      : (memref<3x4xbf16>, memref<3x2xi32>, memref<3x2xf32>, memref<2x2x4xbf16>,
         memref<2x2x4xbf16>, memref<2x4x2xbf16>, memref<3x4xbf16>, memref<3x4xbf16>,
         memref<3x2xf32>, memref<2x2x4xbf16>, memref<2x2x4xbf16>, memref<2x4x2xbf16>) -> ()
  %l1 = llvm.mlir.addressof @drw_label : !llvm.ptr
  func.call @printString(%l1) : (!llvm.ptr) -> ()
  scf.for %t = %c0 to %c3 step %c1 {
    scf.for %k = %c0 to %c2 step %c1 {
      %v = memref.load %drw[%t, %k] : memref<3x2xf32>
      func.call @printF32(%v) : (f32) -> ()
      func.call @printNewline() : () -> ()
    }
  }
  memref.dealloc %out : memref<3x4xbf16>
  memref.dealloc %dx : memref<3x4xbf16>
  memref.dealloc %drw : memref<3x2xf32>
  memref.dealloc %dwg : memref<2x2x4xbf16>
  memref.dealloc %dwu : memref<2x2x4xbf16>
  memref.dealloc %dwd : memref<2x4x2xbf16>
  return
}
