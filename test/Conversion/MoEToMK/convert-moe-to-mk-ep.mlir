// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a" | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a" | mok-opt | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_100a tensor-cores=false" | FileCheck %s --check-prefix=SIMT

// One rank of a 4-rank expert-parallel group (16 experts, 4 local), T = 40,
// top-2, a shared expert: the exchange of docs/ExpertParallel.md inside the
// kernel. The receive capacity is the default, 4 * 40 * min(2, 4) = 320
// routes, so the routed rows are 320 + 4 * 63 = 572.

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 16, ep = 4, padding = 64>
!aplan = !moe.plan<tokens = ?, top_k = 2, experts = 16, ep = 4, padding = 64, max_tokens = 96, recv_capacity = 200>

// The kernel's exchange parameters and the symmetric buffer's layout.
// CHECK-LABEL: gpu.func @layer_forward(
// CHECK-SAME: %[[PEERS:[a-z0-9]+]]: memref<4xi64>, %[[RANK:[a-z0-9]+]]: i32, %[[EPOCH:[a-z0-9]+]]: i64, %[[SYM:[a-z0-9]+]]: memref<56704xi8>, %{{.*}}: memref<304xi64>) kernel
// CHECK-SAME: ep = 4 : i64
// CHECK-SAME: {dtype = "i64", name = "peers", role = "peers", shape = array<i64: 4>}, {dtype = "i32", name = "rank", role = "rank", shape = array<i64>}, {dtype = "i64", name = "epoch", role = "epoch", shape = array<i64>}, {dtype = "u8", name = "symmetric", role = "symmetric", shape = array<i64: 56704>}
// CHECK-SAME: recv_capacity = 320 : i64, routed_capacity = 572 : i64, symmetric_bytes = 56704 : i64, symmetric_layout = [{name = "flags", offset = 0 : i64}, {name = "matrix", offset = 128 : i64}, {name = "recv_origin", offset = 384 : i64}, {name = "recv_experts", offset = 2944 : i64}, {name = "recv_x", offset = 5504 : i64}, {name = "ret", offset = 46464 : i64}]
// CHECK: %[[FLAGS:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56704xi8> to memref<3x4xi64>
// CHECK: %[[MATRIX:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56704xi8> to memref<4x8xi64>
// CHECK: %[[ORIGIN:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56704xi8> to memref<320xi64>
// CHECK: %[[RECV_E:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56704xi8> to memref<320x2xi32>
// CHECK: %[[RECV_X:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56704xi8> to memref<320x64xbf16>
// CHECK: %[[RET:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56704xi8> to memref<80x64xbf16>
// Count: each token's ranks and each route's return row; the routes per
// expert; the plan over ranks (padding 1: each token once per rank).
// CHECK: mk.check_routes %{{.*}} into %{{.*}} {experts = 16 : i64}
// CHECK: mk.route_ranks %[[TOP:[a-z0-9]+]] into %[[RANKS:[a-z0-9]+]], %[[ROUTE_ROW:[a-z0-9]+]] {ep = 4 : i64, experts = 16 : i64} : memref<40x2xi32>, memref<40x4xi32>, memref<80xi64>
// CHECK: mk.count_routes %[[TOP]] into %[[ECC:[a-z0-9]+]] {chunk = 32 : i64} : memref<40x2xi32>, memref<3x16xi64>
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.count_routes %[[RANKS]] into %[[SCC:[a-z0-9]+]] {chunk = 32 : i64} : memref<40x4xi32>, memref<5x4xi64>
// CHECK-NEXT: mk.scan_chunks %[[ECC]] into %[[ECOUNTS:[a-z0-9]+]]
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.scan_chunks %[[SCC]] into %[[SCOUNTS:[a-z0-9]+]]
// CHECK-NEXT: mk.grid_barrier
// The counts to every rank, published, awaited and checked.
// CHECK-NEXT: mk.pad_offsets %[[SCOUNTS]] into %[[SOFF:[a-z0-9]+]] {padding = 1 : i64}
// CHECK-NEXT: mk.put_counts %[[SCOUNTS]], %[[ECOUNTS]] into %[[MATRIX]] peers(%[[PEERS]] : memref<4xi64>) rank(%[[RANK]])
// CHECK-NEXT: mk.signal %[[FLAGS]][0] peers(%[[PEERS]] : memref<4xi64>) rank(%[[RANK]]) epoch(%[[EPOCH]])
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.assign_rows %[[RANKS]], %[[SOFF]], %[[SCC]] into %{{.*}}, %[[SEND_ROUTE:[a-z0-9]+]], %{{.*}} {chunk = 32 : i64}
// CHECK-NEXT: mk.wait %[[FLAGS]][0] epoch(%[[EPOCH]])
// CHECK-NEXT: mk.check_capacity %[[MATRIX]] into %{{.*}}, %[[VERDICT:[a-z0-9]+]] {capacity = 320 : i64}
// CHECK-NEXT: mk.grid_barrier
// Dispatch, then the shared expert's gate/up while the rows cross.
// CHECK-NEXT: mk.send_rows %{{.*}}, %[[TOP]], %[[SEND_ROUTE]], %[[SOFF]], %[[MATRIX]], %[[VERDICT]] into %[[RECV_X]], %[[ORIGIN]], %[[RECV_E]] peers(%[[PEERS]] : memref<4xi64>) rank(%[[RANK]]) {local_experts = 4 : i64}
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.signal %[[FLAGS]][1]
// CHECK-NEXT: mk.gemm swiglu {{.*}} schedule <wgmma, tile = [64, 128, 64], stages = 4>
// CHECK-NEXT: mk.wait %[[FLAGS]][1]
// The local experts over the rows received.
// CHECK-NEXT: %[[N:.*]] = mk.received_rows %[[MATRIX]], %[[VERDICT]] rank(%[[RANK]])
// CHECK-NEXT: mk.count_routes %[[RECV_E]] into %[[CC:[a-z0-9]+]] tokens(%[[N]]) {chunk = 32 : i64} : memref<320x2xi32>, memref<20x4xi64>
// CHECK: mk.assign_rows %[[RECV_E]], %[[OFF:[a-z0-9]+]], %[[CC]] into %{{.*}}, %[[ROW_ROUTE:[a-z0-9]+]], %{{.*}} tokens(%[[N]]) {chunk = 32 : i64} : memref<320x2xi32>, memref<5xi64>, memref<20x4xi64> -> memref<640xi64>, memref<572xi64>, memref<572xi64>
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gather %[[RECV_X]], %[[ROW_ROUTE]], %[[OFF]] into %{{.*}} {top_k = 2 : i64} : memref<320x64xbf16>, memref<572xi64>, memref<5xi64> -> memref<572x64xbf16>
// CHECK: mk.gemm swiglu {{.*}} grouped
// CHECK: mk.gemm store %{{.*}}, %{{.*}} into %[[Y:[a-z0-9]+]] grouped
// CHECK: mk.gemm store
// CHECK-NEXT: mk.grid_barrier
// Each result back to its source, then the combine there.
// CHECK-NEXT: mk.return_rows %[[Y]], %[[ROW_ROUTE]], %[[OFF]], %[[ORIGIN]] into %[[RET]] peers(%[[PEERS]] : memref<4xi64>) {top_k = 2 : i64}
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.signal %[[FLAGS]][2]
// CHECK-NEXT: mk.wait %[[FLAGS]][2]
// CHECK-NEXT: mk.combine %[[RET]], %[[ROUTE_ROW]] weights(%{{.*}} : memref<40x2xf32>) shared(%{{.*}} : memref<40x64xbf16>) into %{{.*}} : memref<80x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
// CHECK-NEXT: gpu.return

// Any T with a receive capacity of its own: the token count reaches the
// send side, the received rows the local plan.
// CHECK-LABEL: gpu.func @any_tokens_forward(
// CHECK-SAME: any_tokens = true
// CHECK-SAME: recv_capacity = 200 : i64, routed_capacity = 452 : i64
// CHECK: %[[T:.*]] = arith.index_cast
// CHECK: mk.route_ranks %{{.*}} tokens(%[[T]])
// CHECK: mk.send_rows {{.*}} tokens(%[[T]])
// CHECK: %[[RN:.*]] = mk.received_rows
// CHECK: mk.count_routes %{{.*}} tokens(%[[RN]]) {chunk = 32 : i64} : memref<200x2xi32>, memref<13x4xi64>
// CHECK: mk.combine {{.*}} tokens(%[[T]])

// Without tensor cores (and on sm_100a) the same exchange around simt GEMMs.
// SIMT-LABEL: gpu.func @layer_forward(
// SIMT-NOT: tensor_maps
// SIMT: mk.send_rows
// SIMT: mk.gemm swiglu {{.*}} schedule <simt>
// SIMT: mk.return_rows

func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>,
                 %sg: tensor<128x64xbf16>, %su: tensor<128x64xbf16>, %sd: tensor<64x128xbf16>) -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>,
         tensor<64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}

func.func @any_tokens(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>,
                      %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>) -> tensor<?x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !aplan
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>) -> tensor<?x64xbf16>
  return %o : tensor<?x64xbf16>
}
