// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_90a self-exchange=true" | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="chip=sm_100a self-exchange=true" | FileCheck %s
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="self-exchange=true" | FileCheck %s --check-prefix=TRAIN
// RUN: mok-opt %s --convert-moe-to-mk | FileCheck %s --check-prefix=PLAIN
// RUN: not mok-opt %s --moe-generate-backward=recompute=true --convert-moe-to-mk="self-exchange=true" 2>&1 | FileCheck %s --check-prefix=RECOMPUTE
// RUN: not mok-opt %s --convert-moe-to-mk="self-exchange=true warp-specialize=true" 2>&1 | FileCheck %s --check-prefix=WS

// self-exchange: an ep = 1 layer planned as the one rank of an
// expert-parallel group. Its routes cross its own symmetric buffer through
// a peer table of one entry (the exchange a one-rank communicator, such as
// NCCL's window on one GPU, runs), with every expert local; the receive
// capacity is the default, 1 * 40 * min(2, 4) = 80 routes.

// CHECK-LABEL: gpu.func @self_exchange_forward(
// CHECK-SAME: %[[PEERS:[a-z0-9]+]]: memref<1xi64>, %[[RANK:[a-z0-9]+]]: i32, %[[SYM:[a-z0-9]+]]: memref<[[B:[0-9]+]]xi8>
// CHECK-SAME: ep = 1 : i64
// CHECK-SAME: recv_capacity = 80 : i64
// CHECK-SAME: symmetric_bytes = [[B]] : i64
// CHECK: mk.count_launch
// CHECK: mk.route_ranks %{{.*}} into %{{.*}}, %{{.*}} {ep = 1 : i64, experts = 4 : i64}
// CHECK: mk.put_counts %{{.*}}, %{{.*}} into %{{.*}} peers(%[[PEERS]] : memref<1xi64>) rank(%[[RANK]])
// CHECK: mk.signal %{{.*}}[0] peers(%[[PEERS]] : memref<1xi64>)
// CHECK: mk.wait %{{.*}}[0]
// CHECK: mk.check_capacity %{{.*}} into %{{.*}}, %{{.*}} {capacity = 80 : i64}
// CHECK: mk.send_rows {{.*}} peers(%[[PEERS]] : memref<1xi64>) rank(%[[RANK]]) {local_experts = 4 : i64}
// CHECK: mk.received_rows
// CHECK: mk.return_rows

// The training forward and the backward exchange too.
// TRAIN-LABEL: gpu.func @self_exchange_forward_forward(
// TRAIN-SAME: memref<1xi64>
// TRAIN: mk.send_rows
// TRAIN-LABEL: gpu.func @self_exchange_backward_backward(
// TRAIN-SAME: memref<1xi64>
// TRAIN: mk.send_rows
// TRAIN: mk.take_routes

// Without the option the layer is the ep = 1 kernel: no exchange.
// PLAIN-LABEL: gpu.func @self_exchange_forward(
// PLAIN-NOT: peers
// PLAIN-NOT: mk.send_rows
// PLAIN: gpu.return

// RECOMPUTE: error: convert-moe-to-mk: a backward that recomputes the forward is not implemented with expert parallelism (ep = 1, self-exchange) yet; save the forward's context instead
// WS: error: convert-moe-to-mk: warp-specialize is not implemented with expert parallelism (ep = 1, self-exchange) yet

func.func @self_exchange(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                         %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>,
                         %wd: tensor<4x64x32xbf16>) -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 8>
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x32x64xbf16>,
         tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
