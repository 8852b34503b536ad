// mok probe, M-major A and N-major B: one Hopper GEMM tile in the operand
// form of the backward's weight gradients (docs/Backward.md), where K runs
// over routed rows: dW = d_y^T h reads d_y [rows, H] as an M-major A and
// h [rows, I] as an N-major B. Same kernel as gemm_sm90_nmajor.mlir except A:
//
//   C[M,N] (f32, row-major) = A[K,M]^T (bf16, row-major) . B[K,N] (bf16, row-major)
//
// Each K-tile of A's 128-row tile is two TMA boxes of 64 (M, inner, 128
// bytes) x 64 (K), 8 KiB apart, like B's. wgmma reads A transposed (PTX
// imm-trans-a = 1, nvgpu `transposeA`) with nvgpu's descriptor from the
// 64 x 64 map type (stride-dimension offset 1024 bytes between 8-row K
// groups; the leading-dimension offset, 8192, is unused with 64 M rows a
// wgmma); the wgmma of M half h starts at the half's box, +2048 bytes a k16
// step.
//
// Kernel parameters: %tmA_p (box {64 (M), 64 (K)}), %tmB_p (box {64 (N),
// 64 (K)}), %C. Sizes, grid, block and shared memory as gemm_sm90.mlir.

!tmap = !nvgpu.tensormap.descriptor<tensor = memref<128x64xbf16, 3>, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
!tmapB = !nvgpu.tensormap.descriptor<tensor = memref<64x64xbf16, 3>, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
!halfT = memref<64x64xbf16, #gpu.address_space<workgroup>>
!mbar = !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>, num_barriers = 2>
!smem = memref<66560xi8, #gpu.address_space<workgroup>>
!tileT = memref<128x64xbf16, #gpu.address_space<workgroup>>
!aT = memref<64x16xbf16, #gpu.address_space<workgroup>>
!bT = memref<16x128xbf16, #gpu.address_space<workgroup>>
!dA = !nvgpu.warpgroup.descriptor<tensor = memref<64x16xbf16, #gpu.address_space<workgroup>>>
!dB = !nvgpu.warpgroup.descriptor<tensor = memref<16x128xbf16, #gpu.address_space<workgroup>>>
!acc = !nvgpu.warpgroup.accumulator<fragmented = vector<64x128xf32>>

module attributes {gpu.container_module} {
gpu.module @mok_probe {
  // Dynamic shared memory. A public, uninitialised, zero-sized workgroup
  // global becomes `.extern .shared .align 1024 .b8 mok_dyn_smem[];` in PTX,
  // i.e. CUDA's `extern __shared__` array placed after all static smem.
  // (gpu.dynamic_shared_memory instead makes an *internal* [0 x i8] global that
  // NVPTX demotes to a 1-byte `.shared .align 16 .b8 __dynamic_shmem__0;`
  // next to the static __mbarrier array, in an order ptxas chooses.)
  memref.global "public" @mok_dyn_smem : memref<0xi8, #gpu.address_space<workgroup>> {alignment = 1024 : i64}

  gpu.func @gemm_bf16_tnn_256x256x512(%tmA_p: !llvm.ptr, %tmW_p: !llvm.ptr,
                                     %C: memref<256x256xf32>) kernel {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %c4 = arith.constant 4 : index
    %c32 = arith.constant 32 : index
    %c64 = arith.constant 64 : index
    %c128 = arith.constant 128 : index
    %c1023 = arith.constant 1023 : index
    %c1024 = arith.constant 1024 : index
    %c2048 = arith.constant 2048 : index
    %c8192 = arith.constant 8192 : index
    %c16384 = arith.constant 16384 : index
    %c32768 = arith.constant 32768 : index   // bytes per stage = expect_tx count
    %kTiles = arith.constant 8 : index       // K / 64
    %ticks = arith.constant 10000000 : index

    %tmA = builtin.unrealized_conversion_cast %tmA_p : !llvm.ptr to !tmapB
    %tmW = builtin.unrealized_conversion_cast %tmW_p : !llvm.ptr to !tmapB

    %tid = gpu.thread_id x
    %bx = gpu.block_id x
    %by = gpu.block_id y
    %m0 = arith.muli %bx, %c128 : index
    %n0 = arith.muli %by, %c128 : index
    %isT0 = arith.cmpi eq, %tid, %c0 : index

    // Dynamic smem (see @mok_dyn_smem); round the stage base up to 1024 bytes
    // in case the driver does not honour the declared alignment.
    %dyn0 = memref.get_global @mok_dyn_smem : memref<0xi8, #gpu.address_space<workgroup>>
    %dyn = memref.reinterpret_cast %dyn0 to offset: [0], sizes: [66560], strides: [1]
        : memref<0xi8, #gpu.address_space<workgroup>> to !smem
    %base = memref.extract_aligned_pointer_as_index %dyn : !smem -> index
    %b1 = arith.addi %base, %c1023 : index
    %b2 = arith.divui %b1, %c1024 : index
    %b3 = arith.muli %b2, %c1024 : index
    %pad = arith.subi %b3, %base : index     // stage s: A at pad + s*32768, W at +16384

    // mbarriers: one per stage, arrival count 1 (thread 0's arrive.expect_tx).
    %bar = nvgpu.mbarrier.create -> !mbar
    scf.if %isT0 {
      nvgpu.mbarrier.init %bar[%c0], %c1 : !mbar
      nvgpu.mbarrier.init %bar[%c1], %c1 : !mbar
      nvvm.fence.mbarrier.init
      nvgpu.tma.prefetch.descriptor %tmA : !tmapB
      nvgpu.tma.prefetch.descriptor %tmW : !tmapB
    }
    gpu.barrier

    // Prologue: fill both stages (K-tiles 0 and 1).
    scf.if %isT0 {
      scf.for %s = %c0 to %c2 step %c1 {
        %sOff = arith.muli %s, %c32768 : index
        %oA = arith.addi %pad, %sOff : index
        %oW = arith.addi %oA, %c16384 : index
        %oW1 = arith.addi %oW, %c8192 : index
        %vW0 = memref.view %dyn[%oW][] : !smem to !halfT
        %vW1 = memref.view %dyn[%oW1][] : !smem to !halfT
        %kc = arith.muli %s, %c64 : index
        %n1 = arith.addi %n0, %c64 : index
        nvgpu.mbarrier.arrive.expect_tx %bar[%s], %c32768 : !mbar
        %oA1 = arith.addi %oA, %c8192 : index
        %vA0 = memref.view %dyn[%oA][] : !smem to !halfT
        %vA1 = memref.view %dyn[%oA1][] : !smem to !halfT
        %m1b = arith.addi %m0, %c64 : index
        nvgpu.tma.async.load %tmA[%m0, %kc], %bar[%s] to %vA0 : !tmapB, !mbar -> !halfT
        nvgpu.tma.async.load %tmA[%m1b, %kc], %bar[%s] to %vA1 : !tmapB, !mbar -> !halfT
        nvgpu.tma.async.load %tmW[%n0, %kc], %bar[%s] to %vW0 : !tmapB, !mbar -> !halfT
        nvgpu.tma.async.load %tmW[%n1, %kc], %bar[%s] to %vW1 : !tmapB, !mbar -> !halfT
      }
    }

    %init0 = nvgpu.warpgroup.mma.init.accumulator -> !acc
    %init1 = nvgpu.warpgroup.mma.init.accumulator -> !acc

    %res:2 = scf.for %kt = %c0 to %kTiles step %c1
        iter_args(%acc0 = %init0, %acc1 = %init1) -> (!acc, !acc) {
      %s = arith.remui %kt, %c2 : index
      %round = arith.divui %kt, %c2 : index
      %par = arith.remui %round, %c2 : index
      %parity = arith.cmpi ne, %par, %c0 : index
      nvgpu.mbarrier.try_wait.parity %bar[%s], %parity, %ticks : !mbar

      %sOff = arith.muli %s, %c32768 : index
      %oA = arith.addi %pad, %sOff : index
      %oW = arith.addi %oA, %c16384 : index

      %r:2 = scf.for %ks = %c0 to %c4 step %c1
          iter_args(%a0 = %acc0, %a1 = %acc1) -> (!acc, !acc) {
        %kbA = arith.muli %ks, %c2048 : index         // 16 K rows = two 1024-byte K groups
        %oA0 = arith.addi %oA, %kbA : index           // M rows 0..63: the first box
        %oA1 = arith.addi %oA0, %c8192 : index        // M rows 64..127: the second
        %kbB = arith.muli %ks, %c2048 : index         // 16 K rows = two 1024-byte K groups
        %oB = arith.addi %oW, %kbB : index
        %vA0 = memref.view %dyn[%oA0][] : !smem to !aT
        %vA1 = memref.view %dyn[%oA1][] : !smem to !aT
        %vB = memref.view %dyn[%oB][] : !smem to !bT
        %dA0 = nvgpu.warpgroup.generate.descriptor %vA0, %tmA : !aT, !tmapB -> !dA
        %dA1 = nvgpu.warpgroup.generate.descriptor %vA1, %tmA : !aT, !tmapB -> !dA
        %dB = nvgpu.warpgroup.generate.descriptor %vB, %tmW : !bT, !tmapB -> !dB
        // transposeA / transposeB: A is M-major, B is N-major (PTX imm-trans-a = imm-trans-b = 1)
        %u0 = nvgpu.warpgroup.mma %dA0, %dB, %a0 {waitGroup = 1, transposeA, transposeB} : !dA, !dB, !acc -> !acc
        %u1 = nvgpu.warpgroup.mma %dA1, %dB, %a1 {waitGroup = 1, transposeA, transposeB} : !dA, !dB, !acc -> !acc
        scf.yield %u0, %u1 : !acc, !acc
      }
      // All wgmma reading stage s must be done before TMA refills it.
      nvvm.wgmma.wait.group.sync.aligned 0
      gpu.barrier
      %next = arith.addi %kt, %c2 : index
      %more = arith.cmpi ult, %next, %kTiles : index
      %go = arith.andi %more, %isT0 : i1
      scf.if %go {
        %oW1 = arith.addi %oW, %c8192 : index
        %vW0 = memref.view %dyn[%oW][] : !smem to !halfT
        %vW1 = memref.view %dyn[%oW1][] : !smem to !halfT
        %kc = arith.muli %next, %c64 : index
        %n1 = arith.addi %n0, %c64 : index
        nvgpu.mbarrier.arrive.expect_tx %bar[%s], %c32768 : !mbar
        %oA1 = arith.addi %oA, %c8192 : index
        %vA0 = memref.view %dyn[%oA][] : !smem to !halfT
        %vA1 = memref.view %dyn[%oA1][] : !smem to !halfT
        %m1b = arith.addi %m0, %c64 : index
        nvgpu.tma.async.load %tmA[%m0, %kc], %bar[%s] to %vA0 : !tmapB, !mbar -> !halfT
        nvgpu.tma.async.load %tmA[%m1b, %kc], %bar[%s] to %vA1 : !tmapB, !mbar -> !halfT
        nvgpu.tma.async.load %tmW[%n0, %kc], %bar[%s] to %vW0 : !tmapB, !mbar -> !halfT
        nvgpu.tma.async.load %tmW[%n1, %kc], %bar[%s] to %vW1 : !tmapB, !mbar -> !halfT
      }
      scf.yield %r#0, %r#1 : !acc, !acc
    }

    // Epilogue: fragment registers straight to global C.
    %m1 = arith.addi %m0, %c64 : index
    %C0 = memref.subview %C[%m0, %n0] [64, 128] [1, 1] : memref<256x256xf32> to memref<64x128xf32, strided<[256, 1], offset: ?>>
    %C1 = memref.subview %C[%m1, %n0] [64, 128] [1, 1] : memref<256x256xf32> to memref<64x128xf32, strided<[256, 1], offset: ?>>
    nvgpu.warpgroup.mma.store %res#0, %C0 : !acc to memref<64x128xf32, strided<[256, 1], offset: ?>>
    nvgpu.warpgroup.mma.store %res#1, %C1 : !acc to memref<64x128xf32, strided<[256, 1], offset: ?>>
    gpu.return
  }
}
}
