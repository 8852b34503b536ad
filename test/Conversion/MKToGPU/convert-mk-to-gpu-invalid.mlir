// RUN: mok-opt %s --split-input-file --convert-mk-to-gpu --verify-diagnostics

// What convert-mk-to-gpu checks before it lowers a schedule: barrier
// intervals, and that tensor-core GEMMs are what the lowering implements.

// A read of what another op wrote in the same barrier interval: other CTAs
// may not have written it yet.
gpu.module @k {
  gpu.func @read_after_write(%c: memref<4xi64>, %o: memref<5xi64>, %bar: memref<2xi32>) kernel
      attributes {mok.kernel = {params = [{name = "counts"}, {name = "offsets"}, {name = "grid_barrier"}]}} {
    // expected-note @+1 {{written here}}
    mk.fill %c, 0 : memref<4xi64>
    // expected-error @+1 {{'mk.pad_offsets' op accesses 'counts', which 'mk.fill' writes in the same barrier interval (add an mk.grid_barrier between them)}}
    mk.pad_offsets %c into %o {padding = 8 : i64} : memref<4xi64>, memref<5xi64>
    gpu.return
  }
}

// -----

// A write of what another op read in the same interval (without names in
// mok.kernel, the buffer is an argument number).
gpu.module @k {
  gpu.func @write_after_read(%c: memref<4xi64>, %o: memref<5xi64>, %bar: memref<2xi32>) kernel {
    mk.fill %c, 0 : memref<4xi64>
    mk.grid_barrier %bar : memref<2xi32>
    // expected-note @+1 {{accessed here}}
    mk.pad_offsets %c into %o {padding = 8 : i64} : memref<4xi64>, memref<5xi64>
    // expected-error @+1 {{'mk.fill' op writes argument #0, which 'mk.pad_offsets' accesses in the same barrier interval}}
    mk.fill %c, 1 : memref<4xi64>
    gpu.return
  }
}

// -----

// Two writers of one buffer in one interval.
gpu.module @k {
  gpu.func @write_after_write(%c: memref<4xi64>, %bar: memref<2xi32>) kernel {
    // expected-note @+1 {{written here}}
    mk.fill %c, 0 : memref<4xi64>
    // expected-error @+1 {{'mk.fill' op accesses argument #0, which 'mk.fill' writes in the same barrier interval}}
    mk.fill %c, 1 : memref<4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @engine_chip(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_100a", dynamic_shared_memory = 197632}} {
    // expected-error @+1 {{the wgmma engine needs a sm_90a kernel (mok.kernel chip = "sm_90a"), got "sm_100a"}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// FP8 GEMMs on wgmma: a producer is taken, but not clusters.
gpu.module @k {
  gpu.func @fp8_multicast(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %m: memref<32xi64>,
                          %sa: memref<1x128xf32>, %sb: memref<1x1xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2 : i64, dynamic_shared_memory = 214016 : i64}} {
    // expected-error @+1 {{'mk.gemm' op FP8 operands on wgmma are implemented without clusters or a gathered A}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) scales(%sa, %sb : memref<1x128xf32>, memref<1x1xf32>)
        schedule <wgmma, tile = [128, 128, 128], stages = 4, multicast> {maps = array<i64: 0, 1>}
        : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// FP8 GEMMs on wgmma: tiles of 128 columns in all and K = 128 (a k-tile's
// partial sums take as many registers as the accumulators).
gpu.module @k {
  gpu.func @fp8_wgmma(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %m: memref<32xi64>,
                      %sa: memref<1x128xf32>, %sb: memref<1x1xf32>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016 : i64}} {
    // expected-error @+1 {{'mk.gemm' op FP8 operands on wgmma: tile [128, 128, 64] with 4 stages is not implemented; the lowering supports tiles of 64 or 128 rows, 128 columns in all (64 a B operand with two), K = 128 and 4 stages}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) scales(%sa, %sb : memref<1x128xf32>, memref<1x1xf32>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// MXFP8 (E8M0 scales) needs tcgen05's block-scaled MMA, at 128 rows.
gpu.module @k {
  gpu.func @mx_wgmma(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %m: memref<32xi64>,
                     %sa: memref<1x1x512xf8E8M0FNU>, %sb: memref<1x1x512xf8E8M0FNU>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016 : i64}} {
    // expected-error @+1 {{'mk.gemm' op MXFP8 operands (E8M0 block scales) need tcgen05's block-scaled MMA (sm_100a); on sm_90a they run on the simt engine}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) scales(%sa, %sb : memref<1x1x512xf8E8M0FNU>, memref<1x1x512xf8E8M0FNU>)
        schedule <wgmma, tile = [128, 128, 128], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mx_tcgen05_short(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %m: memref<32xi64>,
                             %sa: memref<1x1x512xf8E8M0FNU>, %sb: memref<1x1x512xf8E8M0FNU>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_100a", dynamic_shared_memory = 197632 : i64}} {
    // expected-error @+1 {{'mk.gemm' op MXFP8 operands on tcgen05: tile [64, 128, 128] with 4 stages is not implemented; the block-scaled MMA takes M = 128 (tile [128, 128, 128], 4 stages)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) scales(%sa, %sb : memref<1x1x512xf8E8M0FNU>, memref<1x1x512xf8E8M0FNU>)
        schedule <tcgen05, tile = [64, 128, 128], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @smem(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 197632 : i64}} {
    // expected-error @+1 {{the wgmma engine uses 214016 bytes of dynamic shared memory, but mok.kernel dynamic_shared_memory is 197632}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// Without the key the runtime would launch with no dynamic shared memory.
gpu.module @k {
  gpu.func @no_smem(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a"}} {
    // expected-error @+1 {{the wgmma engine uses 214016 bytes of dynamic shared memory, but mok.kernel has no dynamic_shared_memory (the runtime would launch with 0)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @no_chip(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    // expected-error @+1 {{the tcgen05 engine needs a sm_100a kernel (mok.kernel chip = "sm_100a"), got none}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <tcgen05, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @tile(%a: memref<128x64xbf16>, %b: memref<256x64xbf16>, %o: memref<128x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{tile [128, 256, 64] with 3 stages is not implemented; the lowering supports tile [64, 128, 64] with 4 stages}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 3> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<256x64xbf16> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @block(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 128, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{tensor-core GEMMs of 64-row tiles need a kernel with known_block_size = [256, 1, 1]}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// Without a known_block_size at all (this crashed; found by fuzzing).
gpu.module @k {
  gpu.func @no_block(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{tensor-core GEMMs of 64-row tiles need a kernel with known_block_size = [256, 1, 1]}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @two_map_buffers(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>,
                            %o2: memref<64x128xbf16>, %m: memref<32xi64>, %m2: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    // expected-error @+1 {{a kernel's tensor-core GEMMs must read one tensor_maps buffer}}
    mk.gemm store %a, %b into %o2 maps(%m2 : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// 128-row and 256-column tiles are wgmma (sm_90a) tiles only, 256 columns
// with one B operand.
gpu.module @k {
  gpu.func @wide_tcgen05(%a: memref<64x64xbf16>, %b: memref<256x64xbf16>, %o: memref<64x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_100a", dynamic_shared_memory = 197632}} {
    // expected-error @+1 {{tile [64, 256, 64] with 4 stages is not implemented; the lowering supports tile [64, 128, 64] with 4 stages (and, for wgmma, M = 128, and N = 256 with one B operand)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <tcgen05, tile = [64, 256, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<256x64xbf16> -> memref<64x256xbf16>
    gpu.return
  }
}

// -----

// A tile shape no lowering implements (K = 32).
gpu.module @k {
  gpu.func @tile_k(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{tile [64, 128, 32] with 4 stages is not implemented}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 32], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// 64-row and 128-row tiles in one kernel: the threads that count k-tiles
// would differ between the two task loops.
gpu.module @k {
  gpu.func @mixed_heights(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>,
                          %o2: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    // expected-error @+1 {{a kernel's tensor-core GEMMs must have one tile height; got 128 after 64}}
    mk.gemm store %a, %b into %o2 maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// The lowering computes in int64_t from the shapes: buffers are limited to
// 2^40 elements (9223372036854775807 experts overflowed (experts + 31) / 32;
// found under UBSan). A dimension of size 0 does not hide another one's.
gpu.module @k {
  gpu.func @huge_counts(%c: memref<9223372036854775807xi64>, %off: memref<5xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    // expected-error @+1 {{'mk.pad_offsets' op convert-mk-to-gpu takes buffers of at most 2^40 elements: operand #0 is 'memref<9223372036854775807xi64>'}}
    mk.pad_offsets %c into %off {padding = 8 : i64} : memref<9223372036854775807xi64>, memref<5xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @huge_empty(%t: memref<0x2199023255552xi32>, %cc: memref<0x4xi64>) kernel attributes {known_block_size = array<i32: 256, 1, 1>} {
    // expected-error @+1 {{'mk.count_routes' op convert-mk-to-gpu takes buffers of at most 2^40 elements: operand #0 is 'memref<0x2199023255552xi32>'}}
    mk.count_routes %t into %cc {chunk = 64 : i64} : memref<0x2199023255552xi32>, memref<0x4xi64>
    gpu.return
  }
}

// -----

// A grouped B operand takes one map slot per expert: 4 experts from slot 1
// need slots 1..4, the buffer has 2.
gpu.module @k {
  gpu.func @slots(%a: memref<64x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<64x128xbf16>,
                  %re: memref<64xi64>, %off: memref<5xi64>, %c: memref<4xi64>, %m: memref<32xi64>,
                  %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.pad_offsets %c into %off {padding = 64 : i64} : memref<4xi64>, memref<5xi64>
    mk.grid_barrier %bar : memref<2xi32>
    // expected-error @+1 {{map slot 1 (+4) is out of the tensor_maps buffer's 2 slots}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>) maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<4x128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// The largest slot is out of the buffer too (slot + 1 overflowed int64_t and
// passed; found by fuzzing under UBSan).
gpu.module @k {
  gpu.func @slot_max(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{map slot 9223372036854775807 (+1) is out of the tensor_maps buffer's 2 slots}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4> {maps = array<i64: 9223372036854775807, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// A description whose maps cover the whole int64_t range: finding the
// slot's map must not overflow (the UBSan build checks that), and the slot
// is still out of the buffer.
gpu.module @k {
  gpu.func @cluster_box_far(%a: memref<128x64xbf16>, %b: memref<256x64xbf16>, %o: memref<128x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2, dynamic_shared_memory = 214016,
                  tensor_maps = [{box_rows = 128, experts = 9223372036854775807}, {box_rows = 128, experts = 9223372036854775807}]}} {
    // expected-error @+1 {{map slot 9223372036854775807 (+1) is out of the tensor_maps buffer's 2 slots}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4, multicast> {maps = array<i64: 0, 9223372036854775807>}
        : memref<128x64xbf16>, memref<256x64xbf16> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

// Segments padded to 64 rows cannot be cut into 128-row tiles.
gpu.module @k {
  gpu.func @padding(%a: memref<128x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<128x128xbf16>,
                    %re: memref<128xi64>, %off: memref<5xi64>, %c: memref<4xi64>, %m: memref<96xi64>,
                    %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.pad_offsets %c into %off {padding = 64 : i64} : memref<4xi64>, memref<5xi64>
    mk.grid_barrier %bar : memref<2xi32>
    // expected-error @+1 {{expert segments are padded to 64 rows, not a multiple of the tile's 128: a tile would span two experts}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<128xi64>, memref<5xi64>) maps(%m : memref<96xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<4x128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @producer_block(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %o2: memref<128x127xbf16>, %b2: memref<127x64xbf16>, %o3: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{tensor-core GEMMs with a producer of 128-row tiles need a kernel with known_block_size = [384, 1, 1]}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mixed_roles(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %o2: memref<128x127xbf16>, %b2: memref<127x64xbf16>, %o3: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    // expected-error @+1 {{a kernel's tensor-core GEMMs must have the same warp roles (producer, registers)}}
    mk.gemm store %a, %b into %o3 maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @odd_columns(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %o2: memref<128x127xbf16>, %b2: memref<127x64xbf16>, %o3: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{with a producer the epilogue stores pairs of columns from registers: out needs an even number of columns}}
    mk.gemm store %a, %b2 into %o2 maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<127x64xbf16> -> memref<128x127xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @too_many_registers(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %o2: memref<128x127xbf16>, %b2: memref<127x64xbf16>, %o3: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{registers [240, 56] for 2 consumer warpgroup(s) and a producer exceed the register file (168 a thread for 384 threads)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [240, 56]> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_below_even(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{registers [160, 160]: the consumers need at least and the producer at most the even share (168 a thread for 384 threads)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [160, 160]> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_box(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<128x128xbf16>, %re: memref<128xi64>, %off: memref<5xi64>, %rr: memref<128xi64>, %m: memref<96xi64>, %cnt: memref<4xi64>, %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>,
                  mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016, tensor_maps = [
                    {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "x", cols = 64 : i64, experts = 1 : i64, row_stride = 64 : i64, rows = 40 : i64},
                    {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "w", cols = 64 : i64, experts = 4 : i64, row_stride = 64 : i64, rows = 128 : i64}]}} {
    mk.pad_offsets %cnt into %off {padding = 128 : i64} : memref<4xi64>, memref<5xi64>
    mk.grid_barrier %bar : memref<2xi32>
    // expected-error @+1 {{a gathered A operand is read through one-row boxes, but map slot 0 has boxes of 128 rows}}
    mk.gemm store %x, %b into %o grouped(%re, %off : memref<128xi64>, memref<5xi64>) maps(%m : memref<96xi64>)
        gather(%rr : memref<128xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4> {gather_top_k = 2 : i64, maps = array<i64: 0, 1>}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// The lowering sizes its loops from static shapes: a dynamic one is refused
// (here the scan's chunk count).
gpu.module @k {
  gpu.func @dynamic_chunks(%cc: memref<?x4xi64>, %c: memref<4xi64>) kernel {
    // expected-error @+1 {{'mk.scan_chunks' op convert-mk-to-gpu needs static shapes: operand #0 is 'memref<?x4xi64>'}}
    mk.scan_chunks %cc into %c : memref<?x4xi64>, memref<4xi64>
    gpu.return
  }
}

// -----

// Clusters (mok.kernel cluster, multicast=true in convert-moe-to-mk): 1 or 2
// CTAs.
gpu.module @k {
  // expected-error @+1 {{mok.kernel cluster must be the integer 1 or 2 (CTAs per cluster), got 4}}
  gpu.func @cluster_four(%a: memref<128x64xbf16>, %b: memref<256x64xbf16>, %o: memref<128x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 4, dynamic_shared_memory = 214016}} {
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<256x64xbf16> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  // expected-error @+1 {{mok.kernel cluster = 2 needs tensor-core GEMMs (the pairs share their B boxes)}}
  gpu.func @cluster_scalar(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2}} {
    mk.gemm store %a, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// Each CTA of a pair loads one 128-row half of the tile's B: gate and up,
// or the halves of one 256-column operand; a 128-column tile of one
// operand has no second half.
gpu.module @k {
  gpu.func @cluster_narrow(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2, dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{with multicast the B boxes of a tile must be two 128-row halves (gate and up, or one operand of 256-column tiles); got 1 operand(s) of 128-column tiles}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 128, 64], stages = 4, multicast> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// A tile's N as large as int64_t goes: the B columns of a tile (operands
// times N) are computed without overflow (the UBSan build checks that).
gpu.module @k {
  gpu.func @cluster_huge_tile(%a: memref<128x64xbf16>, %b: memref<128x64xbf16>, %o: memref<128x128xbf16>, %m: memref<48xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2, dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{with multicast the B boxes of a tile must be two 128-row halves (gate and up, or one operand of 256-column tiles); got 2 operand(s) of 4611686018427387904-column tiles}}
    mk.gemm swiglu %a, %b, %b into %o maps(%m : memref<48xi64>)
        schedule <wgmma, tile = [128, 4611686018427387904, 64], stages = 4, multicast> {maps = array<i64: 0, 1, 2>}
        : memref<128x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

// The CTA pairs of a 2-CTA cluster run every phase's tasks together: every
// tensor-core GEMM of such a kernel multicasts, and only such a kernel's.
gpu.module @k {
  gpu.func @cluster_without_multicast(%a: memref<128x64xbf16>, %b: memref<256x64xbf16>, %o: memref<128x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2, dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{in a kernel of mok.kernel cluster = 2 every tensor-core GEMM multicasts (the CTA pairs run each phase's tasks together): its schedule needs multicast}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4, producer> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<256x64xbf16> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @multicast_without_cluster(%a: memref<128x64xbf16>, %b: memref<256x64xbf16>, %o: memref<128x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{multicast needs a kernel launched in clusters of 2 CTAs (mok.kernel cluster = 2)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4, multicast> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<256x64xbf16> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

// The partner may fill the stages while a shared-memory epilogue (odd N)
// would reuse them: clusters need the register epilogue's column pairs.
gpu.module @k {
  gpu.func @cluster_odd(%a: memref<128x64xbf16>, %b: memref<255x64xbf16>, %o: memref<128x255xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2, dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{with multicast the epilogue stores pairs of columns from registers: out needs an even number of columns}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4, multicast> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<255x64xbf16> -> memref<128x255xbf16>
    gpu.return
  }
}

// -----

// B is loaded in 128-row halves: the description's maps must have such boxes.
gpu.module @k {
  gpu.func @cluster_box(%a: memref<128x64xbf16>, %b: memref<256x64xbf16>, %o: memref<128x256xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2, dynamic_shared_memory = 214016,
                  tensor_maps = [{box_rows = 128, experts = 1}, {box_rows = 256, experts = 1}]}} {
    // expected-error @+1 {{with multicast B is loaded in 128-row halves, but map slot 1 has boxes of 256 rows}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [128, 256, 64], stages = 4, multicast> {maps = array<i64: 0, 1>}
        : memref<128x64xbf16>, memref<256x64xbf16> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

// With a producer, a gathered A (the producer warpgroup copies the rows)
// after another tensor-core GEMM: the producer's other threads have not
// counted that GEMM's k-tiles.
gpu.module @tall_kernels {
  gpu.func @tall_forward(%arg0: memref<64x128xbf16>, %arg1: memref<64x2xi32>, %arg2: memref<64x2xf32>, %arg3: memref<4x128x128xbf16>, %arg4: memref<4x128x128xbf16>, %arg5: memref<4x128x128xbf16>, %arg6: memref<64x128xbf16>, %arg7: memref<4xi64>, %arg8: memref<8x4xi64>, %arg9: memref<5xi64>, %arg10: memref<128xi64>, %arg11: memref<636xi64>, %arg12: memref<636xi64>, %arg13: memref<636x128xbf16>, %arg14: memref<636x128xbf16>, %arg15: memref<2xi32>, %arg16: memref<224xi64>) kernel attributes {known_block_size = array<i32: 384, 1, 1>, mok.kernel = {block = 384 : i64, chip = "sm_90a", cooperative = true, dynamic_shared_memory = 214016 : i64, grid = "persistent: one CTA per SM", params = [{access = "pointer", dtype = "bf16", name = "x", role = "input", shape = array<i64: 64, 128>}, {access = "pointer", dtype = "i32", name = "top_experts", role = "input", shape = array<i64: 64, 2>}, {access = "pointer", dtype = "f32", name = "router_weights", role = "input", shape = array<i64: 64, 2>}, {access = "tensor_maps", dtype = "bf16", name = "gate_weights", role = "input", shape = array<i64: 4, 128, 128>}, {access = "tensor_maps", dtype = "bf16", name = "up_weights", role = "input", shape = array<i64: 4, 128, 128>}, {access = "tensor_maps", dtype = "bf16", name = "down_weights", role = "input", shape = array<i64: 4, 128, 128>}, {dtype = "bf16", name = "out", role = "output", shape = array<i64: 64, 128>}, {dtype = "i64", name = "counts", role = "workspace", shape = array<i64: 4>}, {dtype = "i64", name = "chunk_counts", role = "workspace", shape = array<i64: 8, 4>}, {dtype = "i64", name = "offsets", role = "workspace", shape = array<i64: 5>}, {dtype = "i64", name = "route_row", role = "workspace", shape = array<i64: 128>}, {dtype = "i64", name = "row_route", role = "workspace", shape = array<i64: 636>}, {dtype = "i64", name = "row_expert", role = "workspace", shape = array<i64: 636>}, {dtype = "bf16", name = "hidden", role = "workspace", shape = array<i64: 636, 128>}, {dtype = "bf16", name = "routed_y", role = "workspace", shape = array<i64: 636, 128>}, {dtype = "i32", name = "grid_barrier", role = "workspace", shape = array<i64: 2>}, {dtype = "i64", name = "tensor_maps", role = "tensor_maps", shape = array<i64: 224>}], routed_capacity = 636 : i64, tensor_maps = [{box_cols = 64 : i64, box_rows = 1 : i64, buffer = "x", cols = 128 : i64, experts = 1 : i64, row_stride = 128 : i64, rows = 64 : i64}, {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "gate_weights", cols = 128 : i64, experts = 4 : i64, row_stride = 128 : i64, rows = 128 : i64}, {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "up_weights", cols = 128 : i64, experts = 4 : i64, row_stride = 128 : i64, rows = 128 : i64}, {box_cols = 64 : i64, box_rows = 128 : i64, buffer = "hidden", cols = 128 : i64, experts = 1 : i64, row_stride = 128 : i64, rows = 636 : i64}, {box_cols = 64 : i64, box_rows = 256 : i64, buffer = "down_weights", cols = 128 : i64, experts = 4 : i64, row_stride = 128 : i64, rows = 128 : i64}], zero_before_first_launch = ["grid_barrier"]}, nvvm.minctasm = 1 : i32} {
    mk.fill %arg11, -1 : memref<636xi64>
    mk.fill %arg12, -1 : memref<636xi64>
    mk.count_routes %arg1 into %arg8 {chunk = 16 : i64} : memref<64x2xi32>, memref<8x4xi64>
    mk.grid_barrier %arg15 : memref<2xi32>
    mk.scan_chunks %arg8 into %arg7 : memref<8x4xi64>, memref<4xi64>
    mk.grid_barrier %arg15 : memref<2xi32>
    mk.pad_offsets %arg7 into %arg9 {padding = 128 : i64} : memref<4xi64>, memref<5xi64>
    mk.grid_barrier %arg15 : memref<2xi32>
    mk.assign_rows %arg1, %arg9, %arg8 into %arg10, %arg11, %arg12 {chunk = 16 : i64} : memref<64x2xi32>, memref<5xi64>, memref<8x4xi64> -> memref<128xi64>, memref<636xi64>, memref<636xi64>
    mk.grid_barrier %arg15 : memref<2xi32>
    mk.gemm store %arg13, %arg5 into %arg14 grouped(%arg12, %arg9 : memref<636xi64>, memref<5xi64>) maps(%arg16 : memref<224xi64>) padding(%arg11 : memref<636xi64>) schedule <wgmma, tile = [128, 256, 64], stages = 4, producer, registers = [224, 56]> {maps = array<i64: 9, 10>} : memref<636x128xbf16>, memref<4x128x128xbf16> -> memref<636x128xbf16>
    mk.grid_barrier %arg15 : memref<2xi32>
    // expected-error @+1 {{with a producer, a gathered A operand is implemented for the kernel's first tensor-core GEMM only}}
    mk.gemm swiglu %arg0, %arg3, %arg4 into %arg13 grouped(%arg12, %arg9 : memref<636xi64>, memref<5xi64>) maps(%arg16 : memref<224xi64>) gather(%arg11 : memref<636xi64>) schedule <wgmma, tile = [128, 128, 64], stages = 4, producer, registers = [224, 56]> {gather_top_k = 2 : i64, maps = array<i64: 0, 1, 5>} : memref<64x128xbf16>, memref<4x128x128xbf16>, memref<4x128x128xbf16> -> memref<636x128xbf16>
    mk.grid_barrier %arg15 : memref<2xi32>
    mk.grid_barrier %arg15 : memref<2xi32>
    mk.combine %arg14, %arg10 weights(%arg2 : memref<64x2xf32>) into %arg6 : memref<636x128xbf16>, memref<128xi64> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// On wgmma, an M-major A comes with an N-major B (the weight gradients'
// form).
gpu.module @k {
  gpu.func @wgmma_transpose_a(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{'mk.gemm' op on the tensor-core engines, transpose_a needs transpose_b}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>, transpose_a}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// With a producer, a weight gradient's K in groups is implemented for FP8
// operands only (a bf16 task's first k-tile is peeled, and a group may
// have no rows).
gpu.module @k {
  gpu.func @wgmma_k_groups_producer(%a: memref<108x64xbf16>, %b: memref<108x128xbf16>, %o: memref<4x64x128xbf16>, %off: memref<5xi64>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{transpose_a, transpose_b, concat, k_groups and an f32 out are implemented for tensor-core GEMMs of one B operand (two with concat) without clusters, with a producer on wgmma (k_groups there with FP8 operands), and a gathered A only with transpose_b alone and no producer}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) k_groups(%off : memref<5xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, producer> {maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x128xbf16> -> memref<4x64x128xbf16>
    gpu.return
  }
}

// -----

// With a producer, a bf16 GEMM's K is static: not the call's rows.
gpu.module @k {
  gpu.func @wgmma_tokens_k_producer(%t: index, %a: memref<64x64xbf16>, %b: memref<64x128xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{with a producer, a bf16 GEMM's K must be static: K = the call's rows is implemented with a producer for FP8 operands only}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) tokens(%t)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, producer> {maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<64x64xbf16>, memref<64x128xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// concat's two K-loops read A K-major on the tensor cores.
gpu.module @k {
  gpu.func @concat_transpose_a(%a: memref<64x64xbf16>, %a2: memref<64x64xbf16>, %b: memref<64x128xbf16>, %b2: memref<64x128xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{concat on the tensor-core engines takes a K-major A}}
    mk.gemm store %a, %b, %b2 into %o maps(%m : memref<32xi64>) concat(%a2 : memref<64x64xbf16>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1, 2, 3>, transpose_a, transpose_b}
        : memref<64x64xbf16>, memref<64x128xbf16>, memref<64x128xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// mk.swiglu_grad gives a row to each warp: the kernel must be whole warps.
gpu.module @k {
  gpu.func @swiglu_grad_partial_warps(%dh: memref<40x16xf32>, %g: memref<40x16xbf16>, %o: memref<40x16xbf16>, %o2: memref<40x16xbf16>) kernel
      attributes {known_block_size = array<i32: 48, 1, 1>} {
    // expected-error @+1 {{needs a kernel of whole warps: a known_block_size [n, 1, 1] with n a multiple of 32}}
    mk.swiglu_grad %dh, %g, %g, %g into %o, %o2 : memref<40x16xf32>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16> -> memref<40x16xbf16>, memref<40x16xbf16>
    gpu.return
  }
}

// -----

// k_groups on the tensor-core engines: out's M is a whole number of tiles.
gpu.module @k {
  gpu.func @k_groups_ragged_m(%a: memref<108x96xbf16>, %b: memref<108x128xbf16>, %off: memref<5xi64>, %o: memref<4x96x128xbf16>, %m: memref<32xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{k_groups on the tensor-core engines: out's M (96) must be a multiple of the tile's M (64)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>) k_groups(%off : memref<5xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>, transpose_a, transpose_b}
        : memref<108x96xbf16>, memref<108x128xbf16> -> memref<4x96x128xbf16>
    gpu.return
  }
}

// -----

// saves (the training forward's gate and up) without clusters.
gpu.module @k {
  gpu.func @saves_multicast(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %g: memref<64x128xbf16>, %u: memref<64x128xbf16>, %m: memref<48xi64>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>, mok.kernel = {chip = "sm_90a", cluster = 2 : i64, dynamic_shared_memory = 214016}} {
    // expected-error @+1 {{saves is implemented for wgmma GEMMs without clusters or a gathered A}}
    mk.gemm swiglu %a, %b, %b into %o maps(%m : memref<48xi64>) saves(%g, %u : memref<64x128xbf16>, memref<64x128xbf16>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, multicast> {maps = array<i64: 0, 1, 2>}
        : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// A signal publishes what the grid stored before it: the rows every CTA
// sends need a grid barrier between them and the signal.
gpu.module @k {
  gpu.func @signal_before_barrier(%x: memref<40x64xbf16>, %top: memref<40x2xi32>,
                                  %send_route: memref<160xi64>, %send_offsets: memref<5xi64>,
                                  %verdict: memref<1xi64>, %peers: memref<4xi64>, %rank: i32,
                                  %epoch: i64, %sym: memref<65536xi8>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    %c0 = arith.constant 0 : index
    %c128 = arith.constant 128 : index
    %c384 = arith.constant 384 : index
    %c2048 = arith.constant 2048 : index
    %c4096 = arith.constant 4096 : index
    %flags = memref.view %sym[%c0][] : memref<65536xi8> to memref<3x4xi64>
    %matrix = memref.view %sym[%c128][] : memref<65536xi8> to memref<4x8xi64>
    %origin = memref.view %sym[%c384][] : memref<65536xi8> to memref<160xi64>
    %experts = memref.view %sym[%c2048][] : memref<65536xi8> to memref<160x2xi32>
    %recv_x = memref.view %sym[%c4096][] : memref<65536xi8> to memref<160x64xbf16>
    // expected-note @+1 {{stored here}}
    mk.send_rows %x, %top, %send_route, %send_offsets, %matrix, %verdict
        into %recv_x, %origin, %experts peers(%peers : memref<4xi64>) rank(%rank)
        {local_experts = 4 : i64}
        : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>,
          memref<4x8xi64>, memref<1xi64> -> memref<160x64xbf16>, memref<160xi64>, memref<160x2xi32>
    mk.fence_peers
    // expected-error @+1 {{'mk.signal' op publishes the peers' copies of a buffer, which 'mk.send_rows' stores from every CTA in the same barrier interval (add an mk.grid_barrier between them)}}
    mk.signal %flags[1] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    gpu.return
  }
}

// -----

// The peer stores need an mk.fence_peers before their signal, even after
// a grid barrier.
gpu.module @k {
  gpu.func @signal_without_fence(%x: memref<40x64xbf16>, %top: memref<40x2xi32>,
                                 %send_route: memref<160xi64>, %send_offsets: memref<5xi64>,
                                 %verdict: memref<1xi64>, %peers: memref<4xi64>, %rank: i32,
                                 %epoch: i64, %sym: memref<65536xi8>, %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    %c0 = arith.constant 0 : index
    %c128 = arith.constant 128 : index
    %c384 = arith.constant 384 : index
    %c2048 = arith.constant 2048 : index
    %c4096 = arith.constant 4096 : index
    %flags = memref.view %sym[%c0][] : memref<65536xi8> to memref<3x4xi64>
    %matrix = memref.view %sym[%c128][] : memref<65536xi8> to memref<4x8xi64>
    %origin = memref.view %sym[%c384][] : memref<65536xi8> to memref<160xi64>
    %experts = memref.view %sym[%c2048][] : memref<65536xi8> to memref<160x2xi32>
    %recv_x = memref.view %sym[%c4096][] : memref<65536xi8> to memref<160x64xbf16>
    // expected-note @+1 {{stored here}}
    mk.send_rows %x, %top, %send_route, %send_offsets, %matrix, %verdict
        into %recv_x, %origin, %experts peers(%peers : memref<4xi64>) rank(%rank)
        {local_experts = 4 : i64}
        : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>,
          memref<4x8xi64>, memref<1xi64> -> memref<160x64xbf16>, memref<160xi64>, memref<160x2xi32>
    mk.grid_barrier %bar : memref<2xi32>
    // expected-error @+1 {{'mk.signal' op publishes what 'mk.send_rows' stored into the peers, which no mk.fence_peers made visible (add one before the grid barrier that precedes the signal)}}
    mk.signal %flags[1] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    gpu.return
  }
}

// -----

// FP8's row quantizer gives each block to one warp: whole warps only.
gpu.module @k {
  gpu.func @fp8_rows(%x: memref<40x128xbf16>, %q: memref<40x128xf8E4M3FN>, %s: memref<1x40xf32>) kernel
      attributes {known_block_size = array<i32: 48, 1, 1>} {
    // expected-error @+1 {{'mk.quantize_rows' op needs a kernel of whole warps: a known_block_size [n, 1, 1] with n a multiple of 32}}
    mk.quantize_rows %x into %q, %s : memref<40x128xbf16> -> memref<40x128xf8E4M3FN>, memref<1x40xf32>
    gpu.return
  }
}
