// REQUIRES: ptxas
// multicast=true (sm_90a): the dsv3-shard layer in clusters of 2 CTAs. Each
// CTA reads its rank, hands every consumed stage back to both CTAs' empty
// barriers (the partner's through mapa, at CTA scope: a .release.cluster
// arrival put a MEMBAR.ALL.GPU before each, on the H200 dsv3-shard 5.8 ->
// 7.1 ms), multicasts one 128-row half of each weight box to both, and
// meets the partner at a cluster barrier after the mbarrier init and after
// the last GEMM. ptxas assembles it without spills.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx="chip=sm_90a multicast=true" | %python %mok_src_root/scripts/extract-ptx.py %t/mc
// RUN: FileCheck %s --input-file %t/mc/dsv3_shard_moe_kernels.ptx --implicit-check-not=mbarrier.arrive.release.cluster
// RUN: ptxas -arch=sm_90a -v %t/mc/dsv3_shard_moe_kernels.ptx -o %t/mc.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: grep -c 'barrier.cluster.arrive;' %t/mc/dsv3_shard_moe_kernels.ptx | FileCheck %s --check-prefix=TWO
// RUN: grep -c 'cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster' %t/mc/dsv3_shard_moe_kernels.ptx | FileCheck %s --check-prefix=SOME
// The default plan has none of it.
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/plain
// RUN: FileCheck %s --check-prefix=PLAIN --input-file %t/plain/dsv3_shard_moe_kernels.ptx
// The machine code keeps every wgmma (when cuobjdump is there, see sass.mlir).
// RUN: %if cuobjdump %{ grep -c wgmma.mma_async %t/mc/dsv3_shard_moe_kernels.ptx > %t/mc.ptx.count %}
// RUN: %if cuobjdump %{ cuobjdump --dump-sass %t/mc.cubin | grep -c 'HGMMA\.64x[0-9]*x16\.F32\.BF16' > %t/mc.sass.count %}
// RUN: %if cuobjdump %{ diff %t/mc.ptx.count %t/mc.sass.count %}

// CHECK: .entry dsv3_shard_moe_forward(
// CHECK: .shared .align 8 .b8 mok_cluster_empty[32];
// CHECK: mbarrier.init.shared.b64
// CHECK: fence.mbarrier_init.release.cluster;
// CHECK: barrier.cluster.arrive;
// CHECK-NEXT: barrier.cluster.wait;
// CHECK: mov.u32 {{.*}}%cluster_ctarank;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster
// CHECK: mbarrier.arrive.shared.b64 {{.*}}, [[[LOCAL:%rd[0-9]+]]];
// CHECK-NEXT: mapa.shared::cluster.u64 [[REMOTE:%rd[0-9]+]], [[LOCAL]], %r{{[0-9]+}};
// CHECK-NEXT: mov.b32 [[ONE:%r[0-9]+]], 1;
// CHECK-NEXT: mbarrier.arrive.shared::cluster.b64 _, [[[REMOTE]]], [[ONE]];
// CHECK: barrier.cluster.arrive;
// CHECK-NEXT: barrier.cluster.wait;

// PTXAS: 0 bytes spill stores, 0 bytes spill loads
// TWO: {{^}}2{{$}}
// SOME: {{^[1-9][0-9]*$}}
// PLAIN-NOT: {{mapa|barrier.cluster|multicast|cluster_ctarank|mok_cluster_empty}}
