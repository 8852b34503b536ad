// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a copy-dispatch=true" --convert-mk-to-gpu | FileCheck %s

// The sm_90a register epilogue through shared memory: each consumer warp
// (tid / 32) owns 2 KiB after the stage ring (4 x 48 KiB + 1 KiB slack:
// 214016 bytes in all) and, per 64 output columns, puts its 16 rows there
// with four stmatrix.x4 (lane l addresses row 8 * (l / 8 % 2) + l % 8,
// 16-byte piece 2j + l / 16, swizzled: piece ^ (row % 8)), syncs the warp,
// reads the rows back as whole 16-byte pieces (lane l: piece l % 8 of rows
// l / 8 + 4i) and stores each with st.global.cs.v4 when its row is
// computed; then syncs again before the next 64 columns. Without 16-byte
// alignment of the output, the column-pair stores.
// CHECK: gpu.func @tall_forward(
// CHECK-SAME: dynamic_shared_memory = 214016
// CHECK: memref.reinterpret_cast {{.*}} sizes: [214016]

// Gate/up (128 columns: two rounds).
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: scf.if %{{.*}} {
// CHECK: %[[L8:.*]] = arith.remsi %[[LANE:.*]], %c8{{[_0-9]*}} : index
// CHECK-NEXT: %c8{{[_0-9]*}} = arith.constant 8 : index
// CHECK-NEXT: %[[G:.*]] = arith.divsi %[[LANE]], %c8{{[_0-9]*}} : index
// CHECK-NEXT: %c2048 = arith.constant 2048 : index
// CHECK-NEXT: %c32{{[_0-9]*}} = arith.constant 32 : index
// CHECK-NEXT: %[[W:.*]] = arith.divsi %thread_id_x{{[_0-9]*}}, %c32{{[_0-9]*}} : index
// CHECK-NEXT: %[[WOFF:.*]] = arith.muli %[[W]], %c2048 : index
// CHECK-NEXT: %[[BUF:.*]] = arith.addi %{{.*}}, %[[WOFF]] : index
// The staged row of this lane's stmatrix address: 8 * (group % 2) + lane % 8.
// CHECK: %[[GM:.*]] = arith.remsi %[[G]], %c2{{[_0-9]*}} : index
// CHECK: %[[GM8:.*]] = arith.muli %[[GM]], %c8{{[_0-9]*}} : index
// CHECK-NEXT: %[[SR:.*]] = arith.addi %[[GM8]], %[[L8]] : index
// CHECK: %[[SG:.*]] = arith.divsi %[[G]], %c2{{[_0-9]*}} : index
// CHECK: %[[UNIT:.*]] = arith.addi %c0{{[_0-9]*}}, %[[SG]] : index
// CHECK: %[[RM:.*]] = arith.remsi %[[SR]], %c8{{[_0-9]*}} : index
// CHECK-NEXT: %[[SW:.*]] = arith.xori %[[UNIT]], %[[RM]] : index
// CHECK-NEXT: %[[SW16:.*]] = arith.muli %[[SW]], %c16{{[_0-9]*}} : index
// CHECK-NEXT: %c128{{[_0-9]*}} = arith.constant 128 : index
// CHECK-NEXT: %[[R128:.*]] = arith.muli %[[SR]], %c128{{[_0-9]*}} : index
// CHECK-NEXT: %[[IN:.*]] = arith.addi %[[R128]], %[[SW16]] : index
// CHECK-NEXT: %[[OFF:.*]] = arith.addi %[[BUF]], %[[IN]] : index
// CHECK-NEXT: %[[ADDR:.*]] = arith.addi %{{.*}}, %[[OFF]] : index
// CHECK-NEXT: %[[A32:.*]] = arith.index_cast %[[ADDR]] : index to i32
// CHECK-NEXT: %[[PTR:.*]] = llvm.inttoptr %[[A32]] : i32 to !llvm.ptr<3>
// CHECK-NEXT: nvvm.stmatrix %[[PTR]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {eltType = #nvvm.ld_st_matrix_elt_type<b16>, layout = #nvvm.mma_layout<row>, shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>} : !llvm.ptr<3>, i32, i32, i32, i32
// CHECK-COUNT-3: nvvm.stmatrix
// CHECK-NOT: nvvm.stmatrix
// CHECK: nvvm.bar.warp.sync
// Read back: rows group + 4i, piece lane % 8.
// CHECK: %[[RB:.*]] = arith.addi %[[G]], %c0{{[_0-9]*}} : index
// CHECK: arith.remsi %[[RB]], %c8{{[_0-9]*}} : index
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: %[[INROWS:.*]] = arith.cmpi slt, %{{.*}}, %{{.*}} : index
// CHECK-NEXT: scf.if %[[INROWS]] {
// CHECK: llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r"
// CHECK-COUNT-3: llvm.inline_asm has_side_effects "st.global.cs.v4.b32
// CHECK-NOT: nvvm.stmatrix
// CHECK: nvvm.bar.warp.sync
// CHECK-COUNT-4: nvvm.stmatrix
// CHECK-NOT: nvvm.stmatrix
// CHECK: nvvm.bar.warp.sync
// CHECK-COUNT-4: llvm.inline_asm has_side_effects "st.global.cs.v4.b32
// CHECK: nvvm.bar.warp.sync
// The outputs are 16-byte aligned (align = 16, enforced by the runtime):
// no pair-by-pair epilogue for unaligned ones.
// CHECK-NOT: "st.global.cs.b32 [$0], $1;"

// Down (256 columns: four rounds of four stmatrix.x4 and four stores).
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK-NEXT: gpu.barrier
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-COUNT-4: nvvm.stmatrix
// CHECK-NOT: nvvm.stmatrix
// CHECK: nvvm.bar.warp.sync
// CHECK-COUNT-4: llvm.inline_asm has_side_effects "st.global.cs.v4.b32
// CHECK: nvvm.bar.warp.sync
// CHECK-COUNT-12: nvvm.stmatrix
// CHECK-NOT: nvvm.stmatrix
// CHECK-NOT: "st.global.cs.b32 [$0], $1;"
// CHECK: gpu.return
!plan = !moe.plan<tokens = 64, top_k = 2, experts = 4, ep = 1, padding = 128>
func.func @tall(%x: tensor<64x256xbf16>, %top: tensor<64x2xi32>, %rw: tensor<64x2xf32>,
                %wg: tensor<4x128x256xbf16>, %wu: tensor<4x128x256xbf16>, %wd: tensor<4x256x128xbf16>)
    -> tensor<64x256xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<64x256xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<4x128x256xbf16>,
         tensor<4x128x256xbf16>, tensor<4x256x128xbf16>) -> tensor<64x256xbf16>
  return %o : tensor<64x256xbf16>
}
