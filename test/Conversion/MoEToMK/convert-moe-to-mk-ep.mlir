// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a" | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a" | mok-opt | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_100a tensor-cores=false" | FileCheck %s --check-prefix=SIMT
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_90a" | FileCheck %s --check-prefix=TRAIN
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a barrier-timeout-ms=500" | FileCheck %s --check-prefix=BOUNDED
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="chip=sm_100a tensor-cores=false" | FileCheck %s --check-prefix=TRAIN

// One rank of a 4-rank expert-parallel group (16 experts, 4 local), T = 40,
// top-2, a shared expert: the exchange of docs/ExpertParallel.md inside the
// kernel. The receive capacity is the default, 4 * 40 * min(2, 4) = 320
// routes, so the routed rows are 320 + 4 * 63 = 572.

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 16, ep = 4, padding = 64>
!aplan = !moe.plan<tokens = ?, top_k = 2, experts = 16, ep = 4, padding = 64, max_tokens = 96, recv_capacity = 200>

// The kernel's exchange parameters and the symmetric buffer's layout.
// CHECK-LABEL: gpu.func @layer_forward(
// CHECK-SAME: %[[PEERS:[a-z0-9]+]]: memref<4xi64>, %[[RANK:[a-z0-9]+]]: i32, %[[SYM:[a-z0-9]+]]: memref<56832xi8>, %{{.*}}: memref<304xi64>) kernel
// CHECK-SAME: ep = 4 : i64
// CHECK-SAME: {dtype = "i64", name = "peers", role = "peers", shape = array<i64: 4>}, {dtype = "i32", name = "rank", role = "rank", shape = array<i64>}, {dtype = "u8", name = "symmetric", role = "symmetric", shape = array<i64: 56832>}
// CHECK-SAME: recv_capacity = 320 : i64, routed_capacity = 572 : i64, symmetric_bytes = 56832 : i64, symmetric_layout = [{name = "flags", offset = 0 : i64}, {name = "launches", offset = 128 : i64}, {name = "matrix", offset = 256 : i64}, {name = "recv_origin", offset = 512 : i64}, {name = "recv_experts", offset = 3072 : i64}, {name = "recv_x", offset = 5632 : i64}, {name = "ret", offset = 46592 : i64}]
// CHECK: %[[FLAGS:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<3x4xi64>
// CHECK: %[[LAUNCHES:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<1xi64>
// CHECK: %[[MATRIX:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<4x8xi64>
// CHECK: %[[ORIGIN:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<320xi64>
// CHECK: %[[RECV_E:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<320x2xi32>
// CHECK: %[[RECV_X:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<320x64xbf16>
// CHECK: %[[RET:.*]] = memref.view %[[SYM]][%{{.*}}][] : memref<56832xi8> to memref<80x64xbf16>
// The kernel counts its launches on the device: the count is the epoch,
// read where each signal and wait uses it.
// CHECK: mk.count_launch %[[LAUNCHES]] : memref<1xi64>
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
// CHECK-NEXT: %[[EPOCH:.*]] = mk.launch_epoch %[[LAUNCHES]] : memref<1xi64>
// CHECK-NEXT: mk.signal %[[FLAGS]][0] peers(%[[PEERS]] : memref<4xi64>) rank(%[[RANK]]) epoch(%[[EPOCH]])
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.assign_rows %[[RANKS]], %[[SOFF]], %[[SCC]] into %{{.*}}, %[[SEND_ROUTE:[a-z0-9]+]], %{{.*}} {chunk = 32 : i64}
// CHECK-NEXT: %[[EPOCH2:.*]] = mk.launch_epoch %[[LAUNCHES]]
// CHECK-NEXT: mk.wait %[[FLAGS]][0] epoch(%[[EPOCH2]])
// CHECK-NEXT: mk.check_capacity %[[MATRIX]] into %{{.*}}, %[[VERDICT:[a-z0-9]+]] {capacity = 320 : i64}
// CHECK-NEXT: mk.grid_barrier
// Dispatch, and the shared expert's gate/up while the stores drain; then
// they are fenced, published and awaited.
// CHECK-NEXT: mk.send_rows %{{.*}}, %[[TOP]], %[[SEND_ROUTE]], %[[SOFF]], %[[MATRIX]], %[[VERDICT]] into %[[RECV_X]], %[[ORIGIN]], %[[RECV_E]] peers(%[[PEERS]] : memref<4xi64>) rank(%[[RANK]]) {local_experts = 4 : i64}
// CHECK-NEXT: mk.gemm swiglu {{.*}} schedule <wgmma, tile = [64, 128, 64], stages = 4>
// CHECK-NEXT: mk.fence_peers
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.launch_epoch
// CHECK-NEXT: mk.signal %[[FLAGS]][1]
// CHECK-NEXT: mk.launch_epoch
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
// CHECK-NEXT: mk.fence_peers
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.launch_epoch
// CHECK-NEXT: mk.signal %[[FLAGS]][2]
// CHECK-NEXT: mk.launch_epoch
// CHECK-NEXT: mk.wait %[[FLAGS]][2]
// Past the capacity (the verdict set) the output is NaN, not stale rows.
// CHECK-NEXT: mk.combine %[[RET]], %[[ROUTE_ROW]] weights(%{{.*}} : memref<40x2xf32>) shared(%{{.*}} : memref<40x64xbf16>) into %{{[a-z0-9]+}} poison(%[[VERDICT]] : memref<1xi64>) : memref<80x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
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

// Bounded (a debugging mode): the exchange's waits too, numbered with the
// grid barriers in schedule order (the counts' wait follows 4 barriers).
// BOUNDED-LABEL: gpu.func @layer_forward(
// BOUNDED: mk.wait %{{.*}}[0] epoch(%{{.*}}) status(%{{.*}} : memref<8xi32>) {report = 4 : i64, timeout_ns = 500000000 : i64}
// BOUNDED: mk.wait %{{.*}}[1] epoch(%{{.*}}) status(%{{.*}} : memref<8xi32>) {report = 7 : i64, timeout_ns = 500000000 : i64}

// Training: the forward saves the context of its local plan (its rows
// over the rows received; the backward's plan over the same rows is the
// same); the backward dispatches d_out's rows with their routes' router
// weights, runs the local experts' backward and returns each routed row's
// d_x and each route's router-weight gradient.
// TRAIN-LABEL: gpu.func @layer_forward_forward(
// TRAIN-SAME: {align = 16 : i64, dtype = "bf16", name = "routed_x", role = "output", shape = array<i64: 572, 64>}
// TRAIN: mk.send_rows
// TRAIN: mk.gemm swiglu {{.*}} saves(
// TRAIN: mk.gemm swiglu {{.*}} grouped({{.*}} saves(
// TRAIN: mk.return_rows
// TRAIN-LABEL: gpu.func @layer_backward_backward(
// TRAIN-SAME: symmetric_layout = [{name = "flags", offset = 0 : i64}, {name = "launches", offset = 128 : i64}, {name = "matrix", offset = 256 : i64}, {name = "recv_origin", offset = 512 : i64}, {name = "recv_experts", offset = 3072 : i64}, {name = "recv_x", offset = 5632 : i64}, {name = "ret", offset = 46592 : i64}, {name = "recv_weights", offset = 56832 : i64}, {name = "ret_weights", offset = 59392 : i64}]
// TRAIN: %[[RECV_X:.*]] = memref.view %{{.*}} to memref<320x64xbf16>
// TRAIN: %[[RET:.*]] = memref.view %{{.*}} to memref<80x64xbf16>
// TRAIN: %[[RECV_W:.*]] = memref.view %{{.*}} to memref<320x2xf32>
// TRAIN: %[[RET_W:.*]] = memref.view %{{.*}} to memref<80xf32>
// TRAIN: mk.route_ranks %{{.*}} into %{{.*}}, %[[ROUTE_ROW:[a-z0-9]+]]
// TRAIN: mk.send_rows %[[D_OUT:arg0]], {{.*}} into %[[RECV_X]], %[[ORIGIN:[a-z0-9_]+]], %{{.*}} weights(%{{.*}} into %[[RECV_W]] : memref<40x2xf32>, memref<320x2xf32>)
// The shared expert's down dgrad and down weights' gradient while the
// stores drain.
// TRAIN-NEXT: mk.gemm store %[[D_OUT]], {{.*}}transpose_b
// TRAIN-NEXT: mk.gemm store %[[D_OUT]], {{.*}}transpose_a, transpose_b
// TRAIN-NEXT: mk.fence_peers
// TRAIN: mk.signal %{{.*}}[1]
// TRAIN-NEXT: mk.launch_epoch
// TRAIN-NEXT: mk.wait %{{.*}}[1]
// TRAIN: %[[N:.*]] = mk.received_rows
// TRAIN: mk.assign_rows %{{.*}} into %[[RRR:[a-z0-9_]+]], %[[ROW_ROUTE:[a-z0-9_]+]], %{{.*}} tokens(%[[N]])
// TRAIN: mk.gather %[[RECV_X]], %[[ROW_ROUTE]], %{{.*}} into %{{.*}} {top_k = 2 : i64}
// TRAIN-NEXT: mk.gather %[[RECV_X]], %[[ROW_ROUTE]], %{{.*}} into %{{.*}} scale(%[[RECV_W]] : memref<320x2xf32>)
// TRAIN: mk.swiglu_grad {{.*}} routes(%[[ROW_ROUTE]], %[[RRR]], %[[RECV_W]], %{{.*}}) -> %[[D_RECV_W:[a-z0-9_]+]] tokens(%[[N]])
// TRAIN: mk.return_rows %{{.*}}, %[[ROW_ROUTE]], %{{.*}}, %[[ORIGIN]] into %[[RET]] scalars(%[[D_RECV_W]] into %[[RET_W]] : memref<320x2xf32>, memref<80xf32>)
// TRAIN: mk.signal %{{.*}}[2]
// TRAIN-NEXT: mk.launch_epoch
// TRAIN-NEXT: mk.wait %{{.*}}[2]
// TRAIN-NEXT: mk.combine %[[RET]], %[[ROUTE_ROW]] shared(%{{.*}}) into %{{.*}} : memref<80x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
// TRAIN-NEXT: mk.take_routes %[[RET_W]], %[[ROUTE_ROW]] into %{{[a-z0-9]+}} poison(%{{.*}} : memref<1xi64>) : memref<80xf32>, memref<80xi64> -> memref<40x2xf32>

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
