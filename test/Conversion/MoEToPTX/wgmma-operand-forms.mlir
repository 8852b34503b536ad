// RUN: rm -rf %t && mok-opt %s --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t
// RUN: FileCheck %s --input-file %t/operand_forms.ptx

// The three operand forms of the tensor-core GEMMs on sm_90a, through the
// whole pipeline to PTX: the forward's (A and B K-major), the backward's
// data gradients (B N-major: imm-trans-b = 1) and its weight gradients (A
// M-major and B N-major: imm-trans-a = imm-trans-b = 1). The GPU tests
// check their results on the H200; this pins the PTX they were checked on.
//
// A shared-memory descriptor is the tile's address >> 4 or'ed with a
// constant: the 128-byte swizzle (bits 62-63 = 1), the stride-dimension
// offset (bits 32-45, 1024 bytes >> 4 = 64: from one 8-row group to the
// next) and the leading-dimension offset (bits 16-29). An MN-major operand
// (a 128-column tile in two 64-column boxes of 64 rows x 128 bytes) needs
// a leading offset of 8192 bytes >> 4 = 512, the box to box step:
// 0x4000004002000000 = 4611686293338849280. A K-major operand's leading
// offset is unused under the swizzle (the K-major B's, from its 128-row
// box, is 1024: 0x4000004004000000 = 4611686293372403712).

// The first wgmma of each kernel with its two descriptors, then the other
// three of the k-tile's four k16 steps; no descriptor of the MN-major
// forms has the K-major B's leading offset.
// CHECK-LABEL: .entry k_major(
// CHECK: or.b64 [[KA:%rd[0-9]+]], {{%rd[0-9]+}}, 4611686293338849280;
// CHECK: or.b64 [[KB:%rd[0-9]+]], {{%rd[0-9]+}}, 4611686293372403712;
// CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, [[KA]], [[KB]], p, 1, 1, 0, 0;
// CHECK-COUNT-3: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 0;
// CHECK-NOT: wgmma.mma_async

// CHECK-LABEL: .entry n_major_b(
// CHECK-NOT: 4611686293372403712
// CHECK: or.b64 [[NA:%rd[0-9]+]], {{%rd[0-9]+}}, 4611686293338849280;
// CHECK: or.b64 [[NB:%rd[0-9]+]], {{%rd[0-9]+}}, 4611686293338849280;
// CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, [[NA]], [[NB]], p, 1, 1, 0, 1;
// CHECK-COUNT-3: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 0, 1;
// CHECK-NOT: wgmma.mma_async
// CHECK-NOT: 4611686293372403712

// CHECK-LABEL: .entry mn_major(
// CHECK-NOT: 4611686293372403712
// CHECK: or.b64 [[MA:%rd[0-9]+]], {{%rd[0-9]+}}, 4611686293338849280;
// CHECK: or.b64 [[MB:%rd[0-9]+]], {{%rd[0-9]+}}, 4611686293338849280;
// CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, [[MA]], [[MB]], p, 1, 1, 1, 1;
// CHECK-COUNT-3: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK-NOT: wgmma.mma_async
// CHECK-NOT: 4611686293372403712

gpu.module @operand_forms {
  // out = a b^T: a [M, K], b [N, K].
  gpu.func @k_major(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }

  // out = a b: b [K, N] (the data gradients' weights).
  gpu.func @n_major_b(%a: memref<64x64xbf16>, %b: memref<64x128xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>, transpose_b}
        : memref<64x64xbf16>, memref<64x128xbf16> -> memref<64x128xbf16>
    gpu.return
  }

  // out = a^T b: a [K, M], b [K, N] (the weight gradients, K over rows).
  gpu.func @mn_major(%a: memref<64x64xbf16>, %b: memref<64x128xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<64x64xbf16>, memref<64x128xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}
