// The whole GPU pipeline emits PTX in process for both targets, and CUDA's
// assembler accepts it. Eligible layers (all three here) get TMA + mbarrier
// GEMM phases: wgmma on sm_90a, tcgen05 (accumulators in Tensor Memory) on
// sm_100a. (No sm_100a GPU is available: ptxas is all that checks that code.)
// REQUIRES: ptxas
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-to-ptx="chip=sm_90a copy-dispatch=true" | FileCheck %s --check-prefix=SM90
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-to-ptx="chip=sm_90a copy-dispatch=true" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: FileCheck %s --check-prefix=WGMMA --input-file %t/sm90/qwen3_30b_a3b_moe_kernels.ptx
// RUN: grep wgmma.mma_async %t/sm90/qwen3_30b_a3b_moe_kernels.ptx | count 8
// The grid barriers fence at GPU scope (three fences a barrier), never at
// system scope.
// RUN: grep -c fence.acq_rel.gpu %t/sm90/qwen3_30b_a3b_moe_kernels.ptx | FileCheck %s --check-prefix=FENCES
// RUN: not grep -q fence.acq_rel.sys %t/sm90/qwen3_30b_a3b_moe_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90/qwen3_30b_a3b_moe_kernels.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// The SwiGLU's sigmoid in fast math: the approximate reciprocal (no IEEE
// rcp.rn.f32 with its slow-path call) and exponential (no expf range
// reduction, fma.rm); with warp roles (below) it is exact.
// RUN: grep -c rcp.approx.f32 %t/sm90/qwen3_30b_a3b_moe_kernels.ptx
// RUN: not grep -q rcp.rn.f32 %t/sm90/qwen3_30b_a3b_moe_kernels.ptx
// RUN: not grep -q fma.rm.f32 %t/sm90/qwen3_30b_a3b_moe_kernels.ptx
// RUN: mok-opt %s --moe-to-ptx="chip=sm_90a copy-dispatch=true" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90-shared
// RUN: FileCheck %s --check-prefix=WGMMA --input-file %t/sm90-shared/shared_layer_kernels.ptx
// RUN: grep wgmma.mma_async %t/sm90-shared/shared_layer_kernels.ptx | count 16
// RUN: ptxas -arch=sm_90a -v %t/sm90-shared/shared_layer_kernels.ptx -o %t/sm90-shared.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// The small layers of convert-mk-to-gpu-sm90.mlir: one eligible (with a
// shared expert, T = 40 < one 64-row tile, clamped SwiGLU), two not.
// RUN: mok-opt %S/../MKToGPU/convert-mk-to-gpu-sm90.mlir --moe-to-ptx="chip=sm_90a copy-dispatch=true" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90-small
// RUN: FileCheck %s --check-prefix=WGMMA --input-file %t/sm90-small/eligible_kernels.ptx
// RUN: ptxas -arch=sm_90a %t/sm90-small/eligible_kernels.ptx -o %t/sm90-small.cubin
// RUN: FileCheck %s --check-prefix=SCALAR --input-file %t/sm90-small/padding8_kernels.ptx
// RUN: ptxas -arch=sm_90a %t/sm90-small/padding8_kernels.ptx -o %t/sm90-small-scalar.cubin
// Warp-specialized (a TMA producer warpgroup; with 128-row tiles, 384
// threads and setmaxnreg 224 / 56; the first k-tile of a task apart, so
// twice the wgmmas): assembled without spills, and without
// ptxas serializing the wgmmas (C7514/C7520: it would say so).
// RUN: mok-opt %s --moe-to-ptx="chip=sm_90a warp-specialize=true" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90-ws
// RUN: grep wgmma.mma_async %t/sm90-ws/shared_layer_kernels.ptx | count 32
// RUN: ptxas -arch=sm_90a -v %t/sm90-ws/shared_layer_kernels.ptx -o %t/sm90-ws.cubin 2>&1 | FileCheck %s --check-prefix=WSPTXAS
// RUN: grep -q rcp.rn.f32 %t/sm90-ws/shared_layer_kernels.ptx
// RUN: grep -q fma.rm.f32 %t/sm90-ws/shared_layer_kernels.ptx
// RUN: not grep -q rcp.approx %t/sm90-ws/shared_layer_kernels.ptx
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx="chip=sm_90a warp-specialize=true" | %python %mok_src_root/scripts/extract-ptx.py %t/sm90-ws-dsv3
// RUN: FileCheck %s --check-prefix=WS --input-file %t/sm90-ws-dsv3/dsv3_shard_moe_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90-ws-dsv3/dsv3_shard_moe_kernels.ptx -o %t/sm90-ws-dsv3.cubin 2>&1 | FileCheck %s --check-prefix=WSPTXAS
// The dispatch fused into the gate/up GEMM (A rows by cp.async):
// RUN: mok-opt %mok_src_root/examples/dsv3-shard.mlir --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/sm90-fd-dsv3
// RUN: FileCheck %s --check-prefix=FD --input-file %t/sm90-fd-dsv3/dsv3_shard_moe_kernels.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90-fd-dsv3/dsv3_shard_moe_kernels.ptx -o %t/sm90-fd-dsv3.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a | FileCheck %s --check-prefix=SM100
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: FileCheck %s --check-prefix=TCGEN05 --input-file %t/sm100/shared_layer_kernels.ptx
// RUN: grep tcgen05.mma %t/sm100/shared_layer_kernels.ptx | count 24
// RUN: ptxas -arch=sm_100a -v %t/sm100/shared_layer_kernels.ptx -o %t/sm100.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %mok_src_root/examples/qwen3-30b-a3b.mlir --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100-qwen
// RUN: FileCheck %s --check-prefix=TCGEN05 --input-file %t/sm100-qwen/qwen3_30b_a3b_moe_kernels.ptx
// RUN: grep tcgen05.mma %t/sm100-qwen/qwen3_30b_a3b_moe_kernels.ptx | count 12
// RUN: ptxas -arch=sm_100a -v %t/sm100-qwen/qwen3_30b_a3b_moe_kernels.ptx -o %t/sm100-qwen.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %S/../MKToGPU/convert-mk-to-gpu-sm90.mlir --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100-small
// RUN: FileCheck %s --check-prefix=TCGEN05 --input-file %t/sm100-small/eligible_kernels.ptx
// RUN: ptxas -arch=sm_100a %t/sm100-small/eligible_kernels.ptx -o %t/sm100-small.cubin
// RUN: FileCheck %s --check-prefix=SCALAR --input-file %t/sm100-small/padding8_kernels.ptx
// RUN: ptxas -arch=sm_100a %t/sm100-small/padding8_kernels.ptx -o %t/sm100-small-scalar.cubin
// RUN: not mok-opt %s --moe-to-ptx=chip=sm_80 2>&1 | FileCheck %s --check-prefix=CHIP

// SM90: gpu.binary @qwen3_30b_a3b_moe_kernels [#gpu.object<#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx81">
// SM90-SAME: .target sm_90a
// SM90-SAME: .visible .entry qwen3_30b_a3b_moe_forward(

// The wgmma kernel: 256 threads, dynamic shared memory as an extern array
// aligned to the 128-byte swizzle atom, one mbarrier per stage, TMA loads
// completing on them, bf16 wgmma with fp32 accumulators (one m64n256k16
// per k16 step: over gate's and up's adjacent 128-row B boxes at once, or
// over down's 256-row box; 8 without and 16 with a shared expert), named
// barrier 1 for the computing warpgroups (256 threads with 128-row tiles,
// 128 with 64-row ones).
// WGMMA: .extern .shared .align 1024 .b8 mok_dyn_smem[];
// WGMMA: .entry {{[a-z0-9_]+}}_forward(
// WGMMA: .maxntid 256, 1, 1
// WGMMA-NEXT: .minnctapersm 1
// WGMMA: .shared .align 8 .b8 __mbarrier[32];
// WGMMA-COUNT-4: mbarrier.init.shared.b64
// WGMMA: fence.mbarrier_init.release.cluster
// WGMMA: prefetch.tensormap
// WGMMA: mbarrier.arrive.expect_tx.shared.b64
// WGMMA: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// WGMMA: mbarrier.try_wait.parity.shared.b64
// A k-tile is one wgmma group (4 k16 steps, gate and up in one m64n256
// wgmma); the group of the k-tile before is waited for (wait_group 1)
// before its stage is refilled.
// WGMMA: wgmma.fence.sync.aligned;
// WGMMA-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 0;
// WGMMA: wgmma.commit_group.sync.aligned;
// WGMMA-NEXT: wgmma.wait_group.sync.aligned 1;
// WGMMA-NEXT: bar.sync 1, {{128|256}};
// WGMMA: wgmma.wait_group.sync.aligned 0;

// FD: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// FD: cp.async.cg.shared.global [%{{.*}}], [%{{.*}}], 16, %r{{[0-9]+}};
// FD: cp.async.wait_group
// FD-NOT: ld.global.v4
// FD: wgmma.mma_async

// WS: .maxntid 384, 1, 1
// WS: .maxnreg 168
// WS: setmaxnreg.inc.sync.aligned.u32 224;
// WS: setmaxnreg.dec.sync.aligned.u32 56;
// WS: bar.sync 2, 384;
// WS: setmaxnreg.inc.sync.aligned.u32 168;
// WS: setmaxnreg.dec.sync.aligned.u32 168;
// WS: bar.arrive 2, 384;
// WSPTXAS-NOT: C75{{[0-9][0-9]}}
// WSPTXAS: Function properties for {{[a-z0-9_]+}}_forward
// Under the consumers' 168 registers ptxas keeps at most one 8-byte value
// in local memory (one store and three loads in its code).
// WSPTXAS-NEXT: {{(0|8)}} bytes stack frame, {{(0|8)}} bytes spill stores, {{(0|8|16|24)}} bytes spill loads
// WSPTXAS-NEXT: Used 168 registers
// WSPTXAS-NOT: C75{{[0-9][0-9]}}

// PTXAS: Function properties for {{[a-z0-9_]+}}_forward
// PTXAS-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// PTXAS-NEXT: Used {{[0-9]+}} registers, used 2 barriers, 1024 bytes smem

// The tcgen05 kernel: the same shared-memory ring, full barriers and TMA
// loads as the wgmma kernel, plus 5 mbarriers for tcgen05.commit (one
// "empty" barrier per stage, one for the accumulators) and the slot
// tcgen05.alloc writes the Tensor Memory address to. Warp 0 allocates 256
// columns and relinquishes the permit between tcgen05 fences around a CTA
// barrier; one thread issues m64n128k16 kind::f16 MMAs (8 per k-tile for
// gate/up, 4 for down) from shared-memory descriptors and commits them to
// an mbarrier; the warpgroup reads the accumulators with tcgen05.ld 32x32b
// + tcgen05.wait::ld; warp 0 frees the Tensor Memory after the last GEMM
// phase.
// TCGEN05: .extern .shared .align 1024 .b8 mok_dyn_smem[];
// TCGEN05: .entry {{[a-z0-9_]+}}_forward(
// TCGEN05: .maxntid 256, 1, 1
// TCGEN05-NEXT: .minnctapersm 1
// TCGEN05: .shared .align 8 .b8 __mbarrier{{[_0-9]*}}[40];
// TCGEN05: .shared .align 8 .b8 __mbarrier{{[_0-9]*}}[32];
// TCGEN05: .shared .align 4 .b8 mok_tmem_base[4];
// TCGEN05-COUNT-4: mbarrier.init.shared.b64
// TCGEN05-NEXT: fence.mbarrier_init.release.cluster;
// TCGEN05-NEXT: prefetch.tensormap
// TCGEN05: bar.sync 0;
// TCGEN05-COUNT-5: mbarrier.init.shared.b64
// TCGEN05-NEXT: fence.mbarrier_init.release.cluster;
// TCGEN05: tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [mok_tmem_base], %r{{[0-9]+}};
// TCGEN05-NEXT: tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
// TCGEN05: tcgen05.fence::before_thread_sync;
// TCGEN05-NEXT: bar.sync 0;
// TCGEN05-NEXT: tcgen05.fence::after_thread_sync;
// TCGEN05: ld.shared.b32 %r{{[0-9]+}}, [mok_tmem_base];
// TCGEN05: mbarrier.arrive.expect_tx.shared.b64
// TCGEN05: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// TCGEN05: mbarrier.try_wait.parity.shared.b64
// TCGEN05: tcgen05.fence::after_thread_sync;
// TCGEN05: mov.b32 %r{{[0-9]+}}, 69207184;
// TCGEN05-COUNT-8: tcgen05.mma.cta_group::1.kind::f16.collector::a::discard [%r{{[0-9]+}}], %rd{{[0-9]+}}, %rd{{[0-9]+}}, %r{{[0-9]+}}, %p{{[0-9]+}};
// TCGEN05: tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64
// TCGEN05: tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64
// TCGEN05: mbarrier.try_wait.parity.shared.b64
// TCGEN05: tcgen05.fence::after_thread_sync;
// TCGEN05: tcgen05.ld.sync.aligned.32x32b.x32.b32
// TCGEN05-NEXT: tcgen05.wait::ld.sync.aligned;
// TCGEN05: st.shared
// TCGEN05: tcgen05.fence::before_thread_sync;
// TCGEN05-NEXT: bar.sync 1, 128;
// TCGEN05: fence.proxy.async.shared::cta;
// TCGEN05: tcgen05.fence::after_thread_sync;
// TCGEN05: tcgen05.dealloc.cta_group::1.sync.aligned.b32
// TCGEN05-NOT: wgmma

// The scalar kernels: no tensor cores, no TMA.
// SCALAR: .entry {{[a-z0-9_]+}}_forward(
// SCALAR-NOT: wgmma
// SCALAR-NOT: tcgen05
// SCALAR-NOT: cp.async.bulk.tensor
// SCALAR-NOT: mok_dyn_smem

// SM100: gpu.binary @shared_layer_kernels [#gpu.object<#nvvm.target<O = 3, chip = "sm_100a", features = "+ptx88">
// SM100-SAME: .target sm_100a
// SM100-SAME: .visible .entry shared_layer_forward(
// CHIP: convert-moe-to-mk: chip 'sm_80' is not supported; expected sm_90a or sm_100a

// A DeepSeek-V3-shaped layer on one GPU (the example is EP = 8, which the GPU
// lowering does not support yet), fewer tokens.
!plan = !moe.plan<tokens = 512, top_k = 8, experts = 32, ep = 1, padding = 128>
func.func @shared_layer(%x: tensor<512x7168xbf16>, %top: tensor<512x8xi32>, %rw: tensor<512x8xf32>,
                        %wg: tensor<32x2048x7168xbf16>, %wu: tensor<32x2048x7168xbf16>,
                        %wd: tensor<32x7168x2048xbf16>, %sg: tensor<2048x7168xbf16>,
                        %su: tensor<2048x7168xbf16>, %sd: tensor<7168x2048xbf16>)
    -> tensor<512x7168xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      : (tensor<512x7168xbf16>, tensor<512x8xi32>, tensor<512x8xf32>, tensor<32x2048x7168xbf16>,
         tensor<32x2048x7168xbf16>, tensor<32x7168x2048xbf16>, tensor<2048x7168xbf16>,
         tensor<2048x7168xbf16>, tensor<7168x2048xbf16>) -> tensor<512x7168xbf16>
  return %o : tensor<512x7168xbf16>
}
// FENCES: {{^[1-9][0-9]*$}}
