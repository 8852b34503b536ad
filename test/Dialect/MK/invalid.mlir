// RUN: mok-opt %s --split-input-file --verify-diagnostics

// The mk verifiers: one case a rule.

func.func @outside_kernel(%c: memref<4xi64>) {
  // expected-error @+1 {{'mk.fill' op expects parent op 'gpu.func'}}
  mk.fill %c, 0 : memref<4xi64>
  return
}

// -----

gpu.module @k {
  gpu.func @offsets_size(%c: memref<4xi64>, %o: memref<4xi64>) kernel {
    // expected-error @+1 {{offsets dimension 0 must be 5 (experts + 1), got 4}}
    mk.pad_offsets %c into %o {padding = 8 : i64} : memref<4xi64>, memref<4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @padding(%c: memref<4xi64>, %o: memref<5xi64>) kernel {
    // expected-error @+1 {{attribute 'padding' failed to satisfy constraint}}
    mk.pad_offsets %c into %o {padding = 0 : i64} : memref<4xi64>, memref<5xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @route_row(%t: memref<40x2xi32>, %o: memref<5xi64>, %cc: memref<2x4xi64>, %rr: memref<81xi64>, %r: memref<108xi64>) kernel {
    // expected-error @+1 {{route_row dimension 0 must be 80 (tokens * top_k), got 81}}
    mk.assign_rows %t, %o, %cc into %rr, %r, %r {chunk = 64 : i64} : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<81xi64>, memref<108xi64>, memref<108xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @row_expert(%t: memref<40x2xi32>, %o: memref<5xi64>, %cc: memref<2x4xi64>, %rr: memref<80xi64>, %r: memref<108xi64>, %re: memref<100xi64>) kernel {
    // expected-error @+1 {{row_expert dimension 0 must be 108 (the size of row_route), got 100}}
    mk.assign_rows %t, %o, %cc into %rr, %r, %re {chunk = 64 : i64} : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<80xi64>, memref<108xi64>, memref<100xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @assign_chunks(%t: memref<40x2xi32>, %o: memref<5xi64>, %cc: memref<2x4xi64>, %rr: memref<80xi64>, %r: memref<108xi64>) kernel {
    // expected-error @+1 {{chunk_counts dimension 0 must be 3 (ceil(tokens * top_k / chunk)), got 2}}
    mk.assign_rows %t, %o, %cc into %rr, %r, %r {chunk = 32 : i64} : memref<40x2xi32>, memref<5xi64>, memref<2x4xi64> -> memref<80xi64>, memref<108xi64>, memref<108xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @assign_experts(%t: memref<40x2xi32>, %o: memref<5xi64>, %cc: memref<2x3xi64>, %rr: memref<80xi64>, %r: memref<108xi64>) kernel {
    // expected-error @+1 {{chunk_counts dimension 1 must be 4 (experts, offsets - 1), got 3}}
    mk.assign_rows %t, %o, %cc into %rr, %r, %r {chunk = 64 : i64} : memref<40x2xi32>, memref<5xi64>, memref<2x3xi64> -> memref<80xi64>, memref<108xi64>, memref<108xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @count_chunks(%t: memref<40x2xi32>, %cc: memref<1x4xi64>) kernel {
    // expected-error @+1 {{chunk_counts dimension 0 must be 2 (ceil(tokens * top_k / chunk)), got 1}}
    mk.count_routes %t into %cc {chunk = 64 : i64} : memref<40x2xi32>, memref<1x4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @scan_experts(%cc: memref<2x4xi64>, %c: memref<5xi64>) kernel {
    // expected-error @+1 {{chunk_counts dimension 1 must be 5 (experts, the size of counts), got 4}}
    mk.scan_chunks %cc into %c : memref<2x4xi64>, memref<5xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_hidden(%x: memref<40x64xbf16>, %r: memref<108xi64>, %o: memref<5xi64>, %rx: memref<108x32xbf16>) kernel {
    // expected-error @+1 {{routed_x dimension 1 must be 64 (the hidden size of x), got 32}}
    mk.gather %x, %r, %o into %rx {top_k = 2 : i64} : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_one_b(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{the swiglu epilogue takes 2 B operand(s), got 1}}
    mk.gemm swiglu %a, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @limit_on_store(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{swiglu_limit needs the swiglu epilogue}}
    mk.gemm store %a, %b into %o schedule <simt> {swiglu_limit = 1.0 : f32} : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_mismatch(%a: memref<64x64xbf16>, %b: memref<128x32xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{B dimension 1 must be 64 (K, a's columns), got 32}}
    mk.gemm store %a, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x32xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @n_mismatch(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x96xbf16>) kernel {
    // expected-error @+1 {{out dimension 1 must be 128 (N, B's rows), got 96}}
    mk.gemm store %a, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x96xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @grouped_rank(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>,
                         %re: memref<64xi64>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{B operands must be [E, N, K] (grouped), got rank 2}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>) schedule <simt>
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @grouped_offsets(%a: memref<64x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<64x128xbf16>,
                            %re: memref<64xi64>, %off: memref<4xi64>) kernel {
    // expected-error @+1 {{offsets dimension 0 must be 5 (experts + 1), got 4}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<4xi64>) schedule <simt>
        : memref<64x64xbf16>, memref<4x128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @simt_tile(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{the simt engine takes no tile, stages, producer, registers or multicast}}
    mk.gemm store %a, %b into %o schedule <simt, tile = [64, 128, 64]> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @wgmma_no_maps(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{the wgmma engine needs maps and tensor_maps}}
    mk.gemm store %a, %b into %o schedule <wgmma, tile = [64, 128, 64], stages = 4> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_tile(%a: memref<64x96xbf16>, %b: memref<128x96xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{K = 96 must be a multiple of the tile's K (64)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x96xbf16>, memref<128x96xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @map_count(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{maps must give 2 slots (a, then each B), got 3}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <tcgen05, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1, 2>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @tile_rank(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{the wgmma engine needs tile = [M, N, K], all positive}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @combine_rows(%y: memref<108x64xbf16>, %rr: memref<80xi64>, %w: memref<40x2xf32>, %o: memref<41x64xbf16>) kernel {
    // expected-error @+1 {{router_weights dimension 0 must be 41 (tokens, out's rows), got 40}}
    mk.combine %y, %rr weights(%w : memref<40x2xf32>) into %o : memref<108x64xbf16>, memref<80xi64> -> memref<41x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @combine_shared(%y: memref<108x64xbf16>, %rr: memref<80xi64>, %w: memref<40x2xf32>, %s: memref<40x32xbf16>, %o: memref<40x64xbf16>) kernel {
    // expected-error @+1 {{shared must have out's type}}
    mk.combine %y, %rr weights(%w : memref<40x2xf32>) shared(%s : memref<40x32xbf16>) into %o : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @barrier_state(%b: memref<3xi32>) kernel {
    // expected-error @+1 {{state dimension 0 must be 2 ([arrived CTAs, generation]), got 3}}
    mk.grid_barrier %b : memref<3xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fill_type(%b: memref<4xi32>) kernel {
    // expected-error @+1 {{must be 1D memref of 64-bit signless integer values}}
    mk.fill %b, 0 : memref<4xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @timestamp_index(%c: memref<9xi64>) kernel {
    // expected-error @+1 {{index 9 is out of the clock buffer's 9 entries}}
    mk.timestamp %c[9] : memref<9xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @timestamp_cycles(%c: memref<9xi64>, %y: memref<8xi64>) kernel {
    // expected-error @+1 {{cycles dimension 0 must be 9 (the clock's entries), got 8}}
    mk.timestamp %c[3] cycles(%y : memref<8xi64>) : memref<9xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @producer_tcgen05(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{a producer warp is implemented for the wgmma engine only, not tcgen05}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <tcgen05, tile = [64, 128, 64], stages = 4, producer> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_alone(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{registers needs producer (they are moved between the consumer and producer warpgroups)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, registers = [224, 56]> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_bad(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{registers must be [consumer, producer], each a multiple of 8 in [24, 256]}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, producer, registers = [224, 20]> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_order(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{registers: the consumers get at least the producer's count}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, producer, registers = [56, 224]> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @schedule_no_stages(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{the wgmma engine needs stages = a positive count}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64]> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @schedule_multicast_tcgen05(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{multicast is implemented for wgmma GEMMs without a producer}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <tcgen05, tile = [64, 128, 64], stages = 4, multicast> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @schedule_multicast_producer(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{multicast is implemented for wgmma GEMMs without a producer}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, producer, multicast> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @schedule_unknown_engine(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{expected a GEMM engine (simt, wgmma or tcgen05), got 'mma'}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <mma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @schedule_unknown_parameter(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{unknown GEMM schedule parameter 'swizzle' (expected tile, stages, producer, registers or multicast)}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, swizzle = 128> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @schedule_twice(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+2 {{'stages' given twice}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4, stages = 2> {maps = array<i64: 0, 1>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_zero(%a: memref<64x0xbf16>, %b: memref<128x0xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{K = 0 is less than the tile's K (64): nothing to accumulate}}
    mk.gemm store %a, %b into %o maps(%m : memref<32xi64>)
        schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<64x0xbf16>, memref<128x0xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_no_topk(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{gather needs both gather_rows and gather_top_k}}
    mk.gemm store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) maps(%m : memref<304xi64>) gather(%rr : memref<332xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_simt(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{a gathered A operand is implemented for the wgmma engine only}}
    mk.gemm store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) gather(%rr : memref<332xi64>) schedule <simt> {gather_top_k = 2 : i64}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_dense(%x: memref<40x64xbf16>, %b: memref<128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{a gathered A operand needs a grouped GEMM (its rows are routed rows)}}
    mk.gemm store %x, %b into %o maps(%m : memref<304xi64>) gather(%rr : memref<332xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {gather_top_k = 2 : i64, maps = array<i64: 0, 1>}
        : memref<40x64xbf16>, memref<128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_rows(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<331xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{gather_rows dimension 0 must be 332 (out's rows), got 331}}
    mk.gemm store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) maps(%m : memref<304xi64>) gather(%rr : memref<331xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {gather_top_k = 2 : i64, maps = array<i64: 0, 1>}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @padding_dense(%x: memref<332x64xbf16>, %b: memref<128x64xbf16>, %o: memref<332x128xbf16>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{padding rows need a grouped GEMM (padding ends each expert's segment)}}
    mk.gemm store %x, %b into %o maps(%m : memref<304xi64>) padding(%rr : memref<332xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<332x64xbf16>, memref<128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @padding_rows(%x: memref<332x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<331xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{padding_rows dimension 0 must be 332 (out's rows), got 331}}
    mk.gemm store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) maps(%m : memref<304xi64>) padding(%rr : memref<331xi64>) schedule <wgmma, tile = [64, 128, 64], stages = 4> {maps = array<i64: 0, 1>}
        : memref<332x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

// The scaled gather: scale is router_weights [tokens, top_k].
gpu.module @k {
  gpu.func @gather_scale_tokens(%x: memref<40x64xbf16>, %r: memref<108xi64>, %o: memref<5xi64>, %rx: memref<108x64xbf16>, %w: memref<41x2xf32>) kernel {
    // expected-error @+1 {{scale dimension 0 must be 40 (tokens, x's rows), got 41}}
    mk.gather %x, %r, %o into %rx scale(%w : memref<41x2xf32>) {top_k = 2 : i64} : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_scale_top_k(%x: memref<40x64xbf16>, %r: memref<108xi64>, %o: memref<5xi64>, %rx: memref<108x64xbf16>, %w: memref<40x2xf32>) kernel {
    // expected-error @+1 {{scale dimension 1 must be 4 (top_k), got 2}}
    mk.gather %x, %r, %o into %rx scale(%w : memref<40x2xf32>) {top_k = 4 : i64} : memref<40x64xbf16>, memref<108xi64>, memref<5xi64> -> memref<108x64xbf16>
    gpu.return
  }
}

// -----

// The backward's GEMM forms.
gpu.module @k {
  gpu.func @accumulate_bf16(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{accumulate needs an f32 out (out += the fp32 accumulators)}}
    mk.gemm store %a, %b into %o schedule <simt> {accumulate} : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @f32_swiglu(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xf32>) kernel {
    // expected-error @+1 {{an f32 out needs the store epilogue}}
    mk.gemm swiglu %a, %b, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<64x128xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @store_two_b(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{the store epilogue takes 1 B operand(s) (2 with concat), got 2}}
    mk.gemm store %a, %b, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @concat_one_b(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{concat needs the store epilogue and two B operands (a with the first, a2 with the second)}}
    mk.gemm store %a, %b into %o concat(%a : memref<64x64xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @concat_swiglu(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{concat needs the store epilogue and two B operands (a with the first, a2 with the second)}}
    mk.gemm swiglu %a, %b, %b into %o concat(%a : memref<64x64xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @concat_type(%a: memref<64x64xbf16>, %a2: memref<64x32xbf16>, %b: memref<128x64xbf16>, %b2: memref<128x32xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{concat: a2 must have a's type}}
    mk.gemm store %a, %b, %b2 into %o concat(%a2 : memref<64x32xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x32xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// concat's B operands have one type (gate and up weights).
gpu.module @k {
  gpu.func @concat_n(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %b2: memref<96x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{B operands must have one type}}
    mk.gemm store %a, %b, %b2 into %o concat(%a : memref<64x64xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<96x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @saves_store(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{saves needs the swiglu epilogue and two buffers (gate, up)}}
    mk.gemm store %a, %b into %o saves(%o, %o : memref<64x128xbf16>, memref<64x128xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @saves_one(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %g: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{saves needs the swiglu epilogue and two buffers (gate, up)}}
    mk.gemm swiglu %a, %b, %b into %o saves(%g : memref<64x128xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @saves_type(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %g: memref<64x128xbf16>, %u: memref<64x64xbf16>) kernel {
    // expected-error @+1 {{saves: each buffer must have out's type}}
    mk.gemm swiglu %a, %b, %b into %o saves(%g, %u : memref<64x128xbf16>, memref<64x64xbf16>) schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_groups_no_transpose_a(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<4x64x32xbf16>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{k_groups needs transpose_a and transpose_b (A [K, M] and B [K, N], K over the routed rows; FP8: A [M, K] and B [N, K]) and no grouped}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<5xi64>) schedule <simt> {transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_groups_grouped(%a: memref<108x64xbf16>, %b: memref<4x108x32xbf16>, %o: memref<4x64x32xbf16>, %re: memref<64xi64>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{k_groups needs transpose_a and transpose_b (A [K, M] and B [K, N], K over the routed rows; FP8: A [M, K] and B [N, K]) and no grouped}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>) k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<4x108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_groups_out_rank(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<64x32xbf16>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{k_groups: out must be [E, M, N]}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_groups_experts(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<3x64x32xbf16>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{out dimension 0 must be 4 (E, offsets - 1), got 3}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<3x64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_groups_m(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<4x32x32xbf16>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{out dimension 1 must be 64 (M, a's columns), got 32}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x32x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_groups_n(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<4x64x64xbf16>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{out dimension 2 must be 32 (N, B's columns), got 64}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @out_rank_3(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<4x64x128xbf16>) kernel {
    // expected-error @+1 {{out must be [M, N] (rank 3 needs k_groups)}}
    mk.gemm store %a, %b into %o schedule <simt> : memref<64x64xbf16>, memref<128x64xbf16> -> memref<4x64x128xbf16>
    gpu.return
  }
}

// -----

// transpose_a: a is [K, M].
gpu.module @k {
  gpu.func @transpose_a_k(%a: memref<32x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{B dimension 1 must be 32 (K, a's rows), got 64}}
    mk.gemm store %a, %b into %o schedule <simt> {transpose_a} : memref<32x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @transpose_a_m(%a: memref<64x32xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{out dimension 0 must be 32 (M, a's columns), got 64}}
    mk.gemm store %a, %b into %o schedule <simt> {transpose_a} : memref<64x32xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// transpose_b: B is [K, N] ([E, K, N] grouped).
gpu.module @k {
  gpu.func @transpose_b_k(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x64xbf16>) kernel {
    // expected-error @+1 {{B dimension 0 must be 64 (K, a's columns), got 128}}
    mk.gemm store %a, %b into %o schedule <simt> {transpose_b} : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x64xbf16>
    gpu.return
  }
}

// -----

// (Transposed, N is B's columns; the message's meaning says "B's rows".)
gpu.module @k {
  gpu.func @transpose_b_n(%a: memref<64x64xbf16>, %b: memref<64x128xbf16>, %o: memref<64x64xbf16>) kernel {
    // expected-error @+1 {{out dimension 1 must be 128 (N, B's}}
    mk.gemm store %a, %b into %o schedule <simt> {transpose_b} : memref<64x64xbf16>, memref<64x128xbf16> -> memref<64x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @transpose_b_rank(%a: memref<64x64xbf16>, %b: memref<4x64x128xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{B operands must be [K, N] (transposed), got rank 3}}
    mk.gemm store %a, %b into %o schedule <simt> {transpose_b} : memref<64x64xbf16>, memref<4x64x128xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// The ranks are checked before N is read from B's shape: reading dimension 2
// of this rank-2 B read past its shape (the assertion-enabled sanitizer
// build, docs/Building.md, stops there).
gpu.module @k {
  gpu.func @transpose_b_grouped_rank(%a: memref<64x64xbf16>, %b: memref<64x128xbf16>, %o: memref<64x128xbf16>,
                                     %re: memref<64xi64>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{B operands must be [E, K, N] (grouped, transposed), got rank 2}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>) schedule <simt> {transpose_b}
        : memref<64x64xbf16>, memref<64x128xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @transpose_b_grouped_k(%a: memref<64x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<64x64xbf16>,
                                  %re: memref<64xi64>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{B dimension 1 must be 64 (K, a's columns), got 128}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>) schedule <simt> {transpose_b}
        : memref<64x64xbf16>, memref<4x128x64xbf16> -> memref<64x64xbf16>
    gpu.return
  }
}

// -----

// Without weights every weight is 1 and top_k is route_row's size over
// out's rows.
gpu.module @k {
  gpu.func @combine_unweighted_routes(%y: memref<108x64xbf16>, %rr: memref<81xi64>, %o: memref<40x64xbf16>) kernel {
    // expected-error @+1 {{route_row's 81 routes must be a multiple of out's 40 rows (tokens * top_k)}}
    mk.combine %y, %rr into %o : memref<108x64xbf16>, memref<81xi64> -> memref<40x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @combine_unweighted_no_rows(%y: memref<108x64xbf16>, %rr: memref<80xi64>, %o: memref<0x64xbf16>) kernel {
    // expected-error @+1 {{route_row's 80 routes must be a multiple of out's 0 rows (tokens * top_k)}}
    mk.combine %y, %rr into %o : memref<108x64xbf16>, memref<80xi64> -> memref<0x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @combine_weighted_routes(%y: memref<108x64xbf16>, %rr: memref<81xi64>, %w: memref<40x2xf32>, %o: memref<40x64xbf16>) kernel {
    // expected-error @+1 {{route_row dimension 0 must be 80 (tokens * top_k), got 81}}
    mk.combine %y, %rr weights(%w : memref<40x2xf32>) into %o : memref<108x64xbf16>, memref<81xi64> -> memref<40x64xbf16>
    gpu.return
  }
}

// -----

// mk.swiglu_grad: gate, up, d_gate and d_up have d_hidden_u's shape; routed,
// so does hidden, row_route has its rows and route_row router_weights' routes.
gpu.module @k {
  gpu.func @swiglu_grad_gate(%dh: memref<40x16xf32>, %g: memref<41x16xbf16>, %u: memref<40x16xbf16>, %dg: memref<40x16xbf16>) kernel {
    // expected-error @+1 {{gate dimension 0 must be 40 (d_hidden_u's rows), got 41}}
    mk.swiglu_grad %dh, %g, %u, %u into %dg, %dg : memref<40x16xf32>, memref<41x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16> -> memref<40x16xbf16>, memref<40x16xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_up(%dh: memref<40x16xf32>, %g: memref<40x16xbf16>, %u: memref<40x8xbf16>, %dg: memref<40x16xbf16>) kernel {
    // expected-error @+1 {{up dimension 1 must be 16 (d_hidden_u's columns), got 8}}
    mk.swiglu_grad %dh, %g, %u, %g into %dg, %dg : memref<40x16xf32>, memref<40x16xbf16>, memref<40x8xbf16>, memref<40x16xbf16> -> memref<40x16xbf16>, memref<40x16xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_d_gate(%dh: memref<40x16xf32>, %g: memref<40x16xbf16>, %dg: memref<39x16xbf16>) kernel {
    // expected-error @+1 {{d_gate dimension 0 must be 40 (d_hidden_u's rows), got 39}}
    mk.swiglu_grad %dh, %g, %g, %g into %dg, %g : memref<40x16xf32>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16> -> memref<39x16xbf16>, memref<40x16xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_d_up(%dh: memref<40x16xf32>, %g: memref<40x16xbf16>, %du: memref<40x32xbf16>) kernel {
    // expected-error @+1 {{d_up dimension 1 must be 16 (d_hidden_u's columns), got 32}}
    mk.swiglu_grad %dh, %g, %g, %g into %g, %du : memref<40x16xf32>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16> -> memref<40x16xbf16>, memref<40x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_hidden(%dh: memref<108x32xf32>, %g: memref<108x32xbf16>, %h: memref<108x16xbf16>,
                               %rr: memref<108xi64>, %qr: memref<80xi64>, %w: memref<40x2xf32>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{hidden dimension 1 must be 32 (d_hidden_u's columns), got 16}}
    mk.swiglu_grad %dh, %g, %g, %h into %g, %g
        routes(%rr, %qr, %w, %off : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %w
        : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x16xbf16>
          -> memref<108x32xbf16>, memref<108x32xbf16>, memref<40x2xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_row_route(%dh: memref<108x32xf32>, %g: memref<108x32xbf16>,
                                  %rr: memref<100xi64>, %qr: memref<80xi64>, %w: memref<40x2xf32>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{row_route dimension 0 must be 108 (d_hidden_u's rows), got 100}}
    mk.swiglu_grad %dh, %g, %g, %g into %g, %g
        routes(%rr, %qr, %w, %off : memref<100xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %w
        : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>
          -> memref<108x32xbf16>, memref<108x32xbf16>, memref<40x2xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_route_row(%dh: memref<108x32xf32>, %g: memref<108x32xbf16>,
                                  %rr: memref<108xi64>, %qr: memref<40xi64>, %w: memref<40x2xf32>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{route_row dimension 0 must be 80 (tokens * top_k), got 40}}
    mk.swiglu_grad %dh, %g, %g, %g into %g, %g
        routes(%rr, %qr, %w, %off : memref<108xi64>, memref<40xi64>, memref<40x2xf32>, memref<5xi64>) -> %w
        : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>
          -> memref<108x32xbf16>, memref<108x32xbf16>, memref<40x2xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @swiglu_grad_d_router_weights(%dh: memref<108x32xf32>, %g: memref<108x32xbf16>,
                                         %rr: memref<108xi64>, %qr: memref<80xi64>, %w: memref<40x2xf32>,
                                         %off: memref<5xi64>, %dw: memref<80x1xf32>) kernel {
    // expected-error @+1 {{d_router_weights must have router_weights' type}}
    mk.swiglu_grad %dh, %g, %g, %g into %g, %g
        routes(%rr, %qr, %w, %off : memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> %dw
        : memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>
          -> memref<108x32xbf16>, memref<108x32xbf16>, memref<80x1xf32>
    gpu.return
  }
}

// -----

// d_hidden_u is the fp32 product d_out W_d.
gpu.module @k {
  gpu.func @swiglu_grad_bf16(%dh: memref<40x16xbf16>, %g: memref<40x16xbf16>) kernel {
    // expected-error @+1 {{operand #0 must be 2D memref of 32-bit float values}}
    mk.swiglu_grad %dh, %g, %g, %g into %g, %g : memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16>, memref<40x16xbf16> -> memref<40x16xbf16>, memref<40x16xbf16>
    gpu.return
  }
}

// -----

gpu.module @m {
  gpu.func @k_groups_swiglu(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %off: memref<5xi64>, %o: memref<4x64x32xbf16>) kernel {
    // expected-error @+1 {{k_groups needs the store epilogue with one B operand (no concat)}}
    mk.gemm swiglu %a, %b, %b into %o k_groups(%off : memref<5xi64>) schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @m {
  gpu.func @swiglu_grad_partial_routes(%dh: memref<108x32xf32>, %g: memref<108x32xbf16>, %rr: memref<108xi64>, %q: memref<80xi64>, %w: memref<40x2xf32>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{the routed form needs all of row_route, route_row, router_weights, offsets and d_router_weights (the shared form none)}}
    "mk.swiglu_grad"(%dh, %g, %g, %g, %g, %g, %rr, %q, %w, %off) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0>}>
        : (memref<108x32xf32>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108x32xbf16>, memref<108xi64>, memref<80xi64>, memref<40x2xf32>, memref<5xi64>) -> ()
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_counts_without_k_groups(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<64x32xbf16>, %cnt: memref<4xi64>) kernel {
    // expected-error @+1 {{k_counts needs k_groups (it counts each K group's rows)}}
    mk.gemm store %a, %b into %o k_counts(%cnt : memref<4xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_counts_groups(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<4x64x32xbf16>, %off: memref<5xi64>, %cnt: memref<5xi64>) kernel {
    // expected-error @+1 {{k_counts dimension 0 must be 4 (E, offsets - 1), got 5}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<5xi64>) k_counts(%cnt : memref<5xi64>) schedule <simt> {transpose_a, transpose_b} : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }
}

// -----

// A dynamic size is unknown, not a number: the checks that compute with one
// (experts + 1, offsets - 1, tokens * top_k) skip it rather than compare
// with -2^63 + 1 or an int64_t overflow's result (found by fuzzing under
// UBSan). These verify.
gpu.module @k {
  gpu.func @dynamic_counts(%c: memref<?xi64>, %off: memref<5xi64>) kernel {
    mk.pad_offsets %c into %off {padding = 8 : i64} : memref<?xi64>, memref<5xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @dynamic_routes(%t: memref<?x2xi32>, %off: memref<?xi64>, %cc: memref<2x4xi64>, %rr: memref<80xi64>,
                           %r: memref<108xi64>, %re: memref<108xi64>) kernel {
    mk.assign_rows %t, %off, %cc into %rr, %r, %re {chunk = 64 : i64}
        : memref<?x2xi32>, memref<?xi64>, memref<2x4xi64> -> memref<80xi64>, memref<108xi64>, memref<108xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @dynamic_k_groups(%a: memref<108x64xbf16>, %b: memref<108x32xbf16>, %o: memref<4x64x32xbf16>,
                             %off: memref<?xi64>) kernel {
    mk.gemm store %a, %b into %o k_groups(%off : memref<?xi64>) schedule <simt> {transpose_a, transpose_b}
        : memref<108x64xbf16>, memref<108x32xbf16> -> memref<4x64x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @dynamic_experts(%a: memref<108x64xbf16>, %wg: memref<?x32x64xbf16>, %wu: memref<?x32x64xbf16>,
                            %h: memref<108x32xbf16>, %re: memref<108xi64>, %off: memref<5xi64>) kernel {
    mk.gemm swiglu %a, %wg, %wu into %h grouped(%re, %off : memref<108xi64>, memref<5xi64>) schedule <simt>
        : memref<108x64xbf16>, memref<?x32x64xbf16>, memref<?x32x64xbf16> -> memref<108x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @dynamic_weights(%ry: memref<108x64xbf16>, %rr: memref<80xi64>, %w: memref<?x2xf32>,
                            %out: memref<40x64xbf16>) kernel {
    mk.combine %ry, %rr weights(%w : memref<?x2xf32>) into %out : memref<108x64xbf16>, memref<80xi64> -> memref<40x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @report_size(%top: memref<40x2xi32>, %s: memref<4xi32>) kernel {
    // expected-error @+1 {{status dimension 0 must be 8 (the kernel's report words), got 4}}
    mk.check_routes %top into %s {experts = 4 : i64} : memref<40x2xi32>, memref<4xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @check_routes_experts(%top: memref<40x2xi32>, %s: memref<8xi32>) kernel {
    // expected-error @+1 {{attribute 'experts' failed to satisfy constraint}}
    mk.check_routes %top into %s {experts = 0 : i64} : memref<40x2xi32>, memref<8xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @bounded_without_status(%b: memref<2xi32>) kernel {
    // expected-error @+1 {{a bounded wait needs both status and timeout_ns}}
    mk.grid_barrier %b {index = 0 : i64, timeout_ns = 1000 : i64} : memref<2xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @bounded_without_index(%b: memref<2xi32>, %s: memref<8xi32>) kernel {
    // expected-error @+1 {{index names a bounded wait's barrier}}
    mk.grid_barrier %b status(%s : memref<8xi32>) {timeout_ns = 1000 : i64} : memref<2xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @bounded_report_size(%b: memref<2xi32>, %s: memref<6xi32>) kernel {
    // expected-error @+1 {{status dimension 0 must be 8 (the kernel's report words), got 6}}
    mk.grid_barrier %b status(%s : memref<6xi32>) {index = 0 : i64, timeout_ns = 1000 : i64} : memref<2xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @grouped_tokens(%a: memref<64x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<64x128xbf16>,
                           %re: memref<64xi64>, %off: memref<5xi64>, %t: index) kernel {
    // expected-error @+1 {{tokens (a's token rows) applies to a GEMM over token rows: not grouped, no k_groups (their rows come from the routing plan)}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>) tokens(%t) schedule <simt>
        : memref<64x64xbf16>, memref<4x128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

// The exchange ops: their symmetric regions are views of the kernel's
// symmetric buffer, and their shapes agree with the group.

gpu.module @k {
  gpu.func @region_not_a_view(%matrix: memref<4x8xi64>, %rows: memref<4xi64>,
                              %routes: memref<16xi64>, %peers: memref<4xi64>,
                              %rank: i32) kernel {
    // expected-error @+1 {{matrix must be a region of the kernel's symmetric buffer (a memref.view of its i8 argument)}}
    mk.put_counts %rows, %routes into %matrix peers(%peers : memref<4xi64>) rank(%rank)
        : memref<4xi64>, memref<16xi64>, memref<4x8xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @matrix_shape(%sym: memref<1024xi8>, %rows: memref<4xi64>,
                         %routes: memref<16xi64>, %peers: memref<4xi64>,
                         %rank: i32) kernel {
    %c0 = arith.constant 0 : index
    %matrix = memref.view %sym[%c0][] : memref<1024xi8> to memref<4x4xi64>
    // expected-error @+1 {{matrix dimension 1 must be 8 (2 * ranks: rows, then routes, to each rank), got 4}}
    mk.put_counts %rows, %routes into %matrix peers(%peers : memref<4xi64>) rank(%rank)
        : memref<4xi64>, memref<16xi64>, memref<4x4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @routes_per_rank(%sym: memref<1024xi8>, %rows: memref<4xi64>,
                            %routes: memref<10xi64>, %peers: memref<4xi64>,
                            %rank: i32) kernel {
    %c0 = arith.constant 0 : index
    %matrix = memref.view %sym[%c0][] : memref<1024xi8> to memref<4x8xi64>
    // expected-error @+1 {{routes' 10 experts must be divisible by the 4 ranks}}
    mk.put_counts %rows, %routes into %matrix peers(%peers : memref<4xi64>) rank(%rank)
        : memref<4xi64>, memref<10xi64>, memref<4x8xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @signal_index(%sym: memref<1024xi8>, %peers: memref<4xi64>,
                         %rank: i32, %epoch: i64) kernel {
    %c0 = arith.constant 0 : index
    %flags = memref.view %sym[%c0][] : memref<1024xi8> to memref<3x4xi64>
    // expected-error @+1 {{index 3 is out of flags' 3 rows}}
    mk.signal %flags[3] peers(%peers : memref<4xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @signal_group(%sym: memref<1024xi8>, %peers: memref<2xi64>,
                         %rank: i32, %epoch: i64) kernel {
    %c0 = arith.constant 0 : index
    %flags = memref.view %sym[%c0][] : memref<1024xi8> to memref<3x4xi64>
    // expected-error @+1 {{flags dimension 1 must be 2 (ranks, the peers), got 4}}
    mk.signal %flags[0] peers(%peers : memref<2xi64>) rank(%rank) epoch(%epoch) : memref<3x4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @wait_not_a_view(%flags: memref<3x4xi64>, %epoch: i64) kernel {
    // expected-error @+1 {{flags must be a region of the kernel's symmetric buffer}}
    mk.wait %flags[0] epoch(%epoch) : memref<3x4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @verdict(%sym: memref<1024xi8>, %status: memref<8xi32>,
                    %verdict: memref<2xi64>) kernel {
    %c0 = arith.constant 0 : index
    %matrix = memref.view %sym[%c0][] : memref<1024xi8> to memref<4x8xi64>
    // expected-error @+1 {{verdict dimension 0 must be 1 (one word), got 2}}
    mk.check_capacity %matrix into %status, %verdict {capacity = 16 : i64}
        : memref<4x8xi64>, memref<8xi32>, memref<2xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @route_ranks(%top: memref<40x2xi32>, %ranks: memref<40x2xi32>,
                        %route_row: memref<80xi64>) kernel {
    // expected-error @+1 {{ranks dimension 1 must be 4 (ep), got 2}}
    mk.route_ranks %top into %ranks, %route_row {experts = 16 : i64, ep = 4 : i64}
        : memref<40x2xi32>, memref<40x2xi32>, memref<80xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @route_ranks_divisible(%top: memref<40x2xi32>, %ranks: memref<40x3xi32>,
                                  %route_row: memref<80xi64>) kernel {
    // expected-error @+1 {{experts (16) must be divisible by ep (3)}}
    mk.route_ranks %top into %ranks, %route_row {experts = 16 : i64, ep = 3 : i64}
        : memref<40x2xi32>, memref<40x3xi32>, memref<80xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @send_rows(%x: memref<40x64xbf16>, %top: memref<40x2xi32>,
                      %send_route: memref<160xi64>, %send_offsets: memref<5xi64>,
                      %verdict: memref<1xi64>, %peers: memref<4xi64>, %rank: i32,
                      %sym: memref<65536xi8>) kernel {
    %c0 = arith.constant 0 : index
    %c256 = arith.constant 256 : index
    %c2048 = arith.constant 2048 : index
    %c4096 = arith.constant 4096 : index
    %matrix = memref.view %sym[%c0][] : memref<65536xi8> to memref<4x8xi64>
    %origin = memref.view %sym[%c256][] : memref<65536xi8> to memref<160xi64>
    %experts = memref.view %sym[%c2048][] : memref<65536xi8> to memref<160x2xi32>
    %recv_x = memref.view %sym[%c4096][] : memref<65536xi8> to memref<160x32xbf16>
    // expected-error @+1 {{recv_x dimension 1 must be 64 (the hidden size of x), got 32}}
    mk.send_rows %x, %top, %send_route, %send_offsets, %matrix, %verdict
        into %recv_x, %origin, %experts peers(%peers : memref<4xi64>) rank(%rank)
        {local_experts = 4 : i64}
        : memref<40x64xbf16>, memref<40x2xi32>, memref<160xi64>, memref<5xi64>,
          memref<4x8xi64>, memref<1xi64> -> memref<160x32xbf16>, memref<160xi64>, memref<160x2xi32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @return_rows(%routed_y: memref<172x64xbf16>, %row_route: memref<172xi64>,
                        %offsets: memref<5xi64>, %peers: memref<4xi64>,
                        %sym: memref<65536xi8>) kernel {
    %c0 = arith.constant 0 : index
    %c2048 = arith.constant 2048 : index
    %origin = memref.view %sym[%c0][] : memref<65536xi8> to memref<160xi64>
    %ret = memref.view %sym[%c2048][] : memref<65536xi8> to memref<80x32xbf16>
    // expected-error @+1 {{ret dimension 1 must be 64 (the hidden size of routed_y), got 32}}
    mk.return_rows %routed_y, %row_route, %offsets, %origin into %ret
        peers(%peers : memref<4xi64>) {top_k = 2 : i64}
        : memref<172x64xbf16>, memref<172xi64>, memref<5xi64>, memref<160xi64>
          -> memref<80x32xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @wait_half_bounded(%sym: memref<1024xi8>, %epoch: i64, %st: memref<8xi32>) kernel {
    %c0 = arith.constant 0 : index
    %flags = memref.view %sym[%c0][] : memref<1024xi8> to memref<3x4xi64>
    // expected-error @+1 {{a bounded wait needs status, timeout_ns and report, each with the others}}
    mk.wait %flags[0] epoch(%epoch) status(%st : memref<8xi32>) {timeout_ns = 10 : i64} : memref<3x4xi64>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @quantize_rows_cols(%x: memref<40x96xbf16>, %q: memref<40x96xf8E4M3FN>, %s: memref<1x40xf32>) kernel {
    // expected-error @+1 {{src's columns (96) must be a multiple of 128, the block}}
    mk.quantize_rows %x into %q, %s : memref<40x96xbf16> -> memref<40x96xf8E4M3FN>, memref<1x40xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @quantize_rows_values(%x: memref<40x128xbf16>, %q: memref<40x256xf8E4M3FN>, %s: memref<1x40xf32>) kernel {
    // expected-error @+1 {{values dimension 1 must be 128 (src's columns), got 256}}
    mk.quantize_rows %x into %q, %s : memref<40x128xbf16> -> memref<40x256xf8E4M3FN>, memref<1x40xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @quantize_rows_blocks(%x: memref<40x256xbf16>, %q: memref<40x256xf8E4M3FN>, %s: memref<1x40xf32>) kernel {
    // expected-error @+1 {{scales dimension 0 must be 2 (src's columns / 128, one row of scales a block), got 1}}
    mk.quantize_rows %x into %q, %s : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<1x40xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @quantize_rows_width(%x: memref<42x128xbf16>, %q: memref<42x128xf8E4M3FN>, %s: memref<1x42xf32>) kernel {
    // expected-error @+1 {{scales dimension 1 must be at least src's rows (42) and a multiple of 4 (16-byte rows), got 42}}
    mk.quantize_rows %x into %q, %s : memref<42x128xbf16> -> memref<42x128xf8E4M3FN>, memref<1x42xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @quantize_rows_bounds(%x: memref<40x128xbf16>, %q: memref<40x128xf8E4M3FN>, %s: memref<1x40xf32>, %t: index, %o: memref<5xi64>) kernel {
    // expected-error @+1 {{takes tokens (token rows) or grouped (routed rows), not both}}
    mk.quantize_rows %x into %q, %s tokens(%t) grouped(%o : memref<5xi64>) : memref<40x128xbf16> -> memref<40x128xf8E4M3FN>, memref<1x40xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @quantize_rows_type(%x: memref<40x128xbf16>, %q: memref<40x128xbf16>, %s: memref<1x40xf32>) kernel {
    // expected-error @+1 {{operand #1 must be 2D memref of f8E4M3FN type values}}
    "mk.quantize_rows"(%x, %q, %s) {operandSegmentSizes = array<i32: 1, 1, 1, 0, 0>} : (memref<40x128xbf16>, memref<40x128xbf16>, memref<1x40xf32>) -> ()
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_mixed(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xbf16>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>) kernel {
    // expected-error @+1 {{a, a2 and the B operands must all be bf16 or all f8E4M3FN}}
    mk.gemm store %a, %b into %o scales(%s : memref<1x128xf32>) schedule <simt> : memref<128x128xf8E4M3FN>, memref<128x128xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_no_scales(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>) kernel {
    // expected-error @+1 {{FP8 operands need one scale buffer each (a, a2, then each B): expected 2, got 0}}
    mk.gemm store %a, %b into %o schedule <simt> : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @bf16_scales(%a: memref<128x128xbf16>, %b: memref<128x128xbf16>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>) kernel {
    // expected-error @+1 {{scales are for FP8 (f8E4M3FN) operands; bf16 operands take none}}
    mk.gemm store %a, %b into %o scales(%s, %s : memref<1x128xf32>, memref<1x128xf32>) schedule <simt> : memref<128x128xbf16>, memref<128x128xbf16> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_transposed(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>, %sb: memref<1x1xf32>) kernel {
    // expected-error @+1 {{FP8 operands are K-major (A [M, K], B [N, K]): no transpose_a, transpose_b or gathered A}}
    mk.gemm store %a, %b into %o scales(%s, %sb : memref<1x128xf32>, memref<1x1xf32>) schedule <simt> {transpose_b} : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_k(%a: memref<128x64xf8E4M3FN>, %b: memref<128x64xf8E4M3FN>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>, %sb: memref<1x1xf32>) kernel {
    // expected-error @+1 {{FP8: K = 64 must be a multiple of 128, the block}}
    mk.gemm store %a, %b into %o scales(%s, %sb : memref<1x128xf32>, memref<1x1xf32>) schedule <simt> : memref<128x64xf8E4M3FN>, memref<128x64xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_a_scales(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %s: memref<1x126xf32>, %sb: memref<1x1xf32>) kernel {
    // expected-error @+1 {{A scales dimension 1 must be at least a's rows (128) and a multiple of 4, got 126}}
    mk.gemm store %a, %b into %o scales(%s, %sb : memref<1x126xf32>, memref<1x1xf32>) schedule <simt> : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_a_blocks(%a: memref<128x256xf8E4M3FN>, %b: memref<128x256xf8E4M3FN>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>, %sb: memref<1x2xf32>) kernel {
    // expected-error @+1 {{A scales dimension 0 must be 2 (K / 128, one row of scales a block), got 1}}
    mk.gemm store %a, %b into %o scales(%s, %sb : memref<1x128xf32>, memref<1x2xf32>) schedule <simt> : memref<128x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_b_rank(%a: memref<128x128xf8E4M3FN>, %b: memref<2x128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>, %sb: memref<1x1xf32>, %re: memref<128xi64>, %off: memref<3xi64>) kernel {
    // expected-error @+1 {{scales #1 (of a B operand) must be [E, N/128, K/128]}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<128xi64>, memref<3xi64>) scales(%s, %sb : memref<1x128xf32>, memref<1x1xf32>) schedule <simt> : memref<128x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_b_experts(%a: memref<128x128xf8E4M3FN>, %b: memref<2x128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %s: memref<1x128xf32>, %sb: memref<3x1x1xf32>, %re: memref<128xi64>, %off: memref<3xi64>) kernel {
    // expected-error @+1 {{B scales dimension 0 must be 2 (E, B's experts), got 3}}
    mk.gemm store %a, %b into %o grouped(%re, %off : memref<128xi64>, memref<3xi64>) scales(%s, %sb : memref<1x128xf32>, memref<3x1x1xf32>) schedule <simt> : memref<128x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_b_n(%a: memref<128x128xf8E4M3FN>, %b: memref<256x128xf8E4M3FN>, %o: memref<128x256xbf16>, %s: memref<1x128xf32>, %sb: memref<1x1xf32>) kernel {
    // expected-error @+1 {{B scales dimension 0 must be 2 (N / 128), got 1}}
    mk.gemm store %a, %b into %o scales(%s, %sb : memref<1x128xf32>, memref<1x1xf32>) schedule <simt> : memref<128x128xf8E4M3FN>, memref<256x128xf8E4M3FN> -> memref<128x256xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @weights_values(%w: memref<4x256x128xbf16>, %q: memref<4x128x128xf8E4M3FN>, %s: memref<4x2x1xf32>) kernel {
    // expected-error @+1 {{values dimension 1 must be 256 (src's), got 128}}
    mk.quantize_weights %w into %q, %s : memref<4x256x128xbf16> -> memref<4x128x128xf8E4M3FN>, memref<4x2x1xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @weights_block(%w: memref<4x256x96xbf16>, %q: memref<4x256x96xf8E4M3FN>, %s: memref<4x2x1xf32>) kernel {
    // expected-error @+1 {{src dimension 2 (96) must be a multiple of 128, the block}}
    mk.quantize_weights %w into %q, %s : memref<4x256x96xbf16> -> memref<4x256x96xf8E4M3FN>, memref<4x2x1xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @weights_scales(%w: memref<4x256x128xbf16>, %q: memref<4x256x128xf8E4M3FN>, %s: memref<4x1x1xf32>) kernel {
    // expected-error @+1 {{scales dimension 1 must be 2 (one scale a 128 x 128 block), got 1}}
    mk.quantize_weights %w into %q, %s : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x1x1xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @weights_experts(%w: memref<4x256x128xbf16>, %q: memref<4x256x128xf8E4M3FN>, %s: memref<2x2x1xf32>) kernel {
    // expected-error @+1 {{scales dimension 0 must be 4 (src's experts), got 2}}
    mk.quantize_weights %w into %q, %s : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<2x2x1xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_fp8_no_scales(%x: memref<40x256xf8E4M3FN>, %rr: memref<108xi64>, %off: memref<5xi64>, %rx: memref<108x256xf8E4M3FN>) kernel {
    // expected-error @+1 {{block_scales go with f8E4M3FN rows, and f8E4M3FN rows with block_scales}}
    mk.gather %x, %rr, %off into %rx {top_k = 2 : i64} : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xf8E4M3FN>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_mixed(%x: memref<40x256xf8E4M3FN>, %rr: memref<108xi64>, %off: memref<5xi64>, %rx: memref<108x256xbf16>) kernel {
    // expected-error @+1 {{x and routed_x must have one element type}}
    mk.gather %x, %rr, %off into %rx {top_k = 2 : i64} : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_fp8_width(%x: memref<40x256xf8E4M3FN>, %xs: memref<2x40xf32>, %rr: memref<108xi64>, %off: memref<5xi64>, %rx: memref<108x256xf8E4M3FN>, %rs: memref<2x100xf32>) kernel {
    // expected-error @+1 {{routed_scales dimension 1 must be at least its rows (108) and a multiple of 4, got 100}}
    mk.gather %x, %rr, %off into %rx block_scales(%xs into %rs : memref<2x40xf32> -> memref<2x100xf32>) {top_k = 2 : i64} : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xf8E4M3FN>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_fp8_blocks(%x: memref<40x256xf8E4M3FN>, %xs: memref<1x40xf32>, %rr: memref<108xi64>, %off: memref<5xi64>, %rx: memref<108x256xf8E4M3FN>, %rs: memref<2x108xf32>) kernel {
    // expected-error @+1 {{x_scales dimension 0 must be 2 (the hidden size / 128), got 1}}
    mk.gather %x, %rr, %off into %rx block_scales(%xs into %rs : memref<1x40xf32> -> memref<2x108xf32>) {top_k = 2 : i64} : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xf8E4M3FN>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_k_groups_b_scales(%a: memref<256x256xf8E4M3FN>, %b: memref<128x256xf8E4M3FN>, %o: memref<2x256x128xf32>, %off: memref<3xi64>, %sa: memref<2x256xf32>, %sb: memref<1x2x2xf32>) kernel {
    // expected-error @+1 {{with k_groups the B operand's scales are [K/128, S], S >= N}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<3xi64>) scales(%sa, %sb : memref<2x256xf32>, memref<1x2x2xf32>) schedule <simt> : memref<256x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<2x256x128xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @fp8_k_groups_b_width(%a: memref<256x256xf8E4M3FN>, %b: memref<128x256xf8E4M3FN>, %o: memref<2x256x128xf32>, %off: memref<3xi64>, %sa: memref<2x256xf32>, %sb: memref<2x64xf32>) kernel {
    // expected-error @+1 {{B scales dimension 1 must be at least N (128) and a multiple of 4, got 64}}
    mk.gemm store %a, %b into %o k_groups(%off : memref<3xi64>) scales(%sa, %sb : memref<2x256xf32>, memref<2x64xf32>) schedule <simt> : memref<256x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<2x256x128xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @weights_transposed_values(%w: memref<4x256x128xbf16>, %q: memref<4x256x128xf8E4M3FN>, %s: memref<4x1x2xf32>) kernel {
    // expected-error @+1 {{values dimension 1 must be 128 (src's, transposed), got 256}}
    mk.quantize_weights %w into %q, %s transposed : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x1x2xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @weights_transposed_scales(%w: memref<4x256x128xbf16>, %q: memref<4x128x256xf8E4M3FN>, %s: memref<4x2x1xf32>) kernel {
    // expected-error @+1 {{scales dimension 1 must be 1 (one scale a 128 x 128 block), got 2}}
    mk.quantize_weights %w into %q, %s transposed : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x2x1xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_values(%x: memref<200x64xbf16>, %q: memref<64x200xf8E4M3FN>, %s: memref<2x64xf32>) kernel {
    // expected-error @+1 {{values dimension 1 (200) must be src's rows (200) or more, a multiple of 128, the block}}
    mk.quantize_columns %x into %q, %s : memref<200x64xbf16> -> memref<64x200xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_transposed(%x: memref<200x64xbf16>, %q: memref<200x256xf8E4M3FN>, %s: memref<2x64xf32>) kernel {
    // expected-error @+1 {{values dimension 0 must be 64 (src's columns), got 200}}
    mk.quantize_columns %x into %q, %s : memref<200x64xbf16> -> memref<200x256xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_scale_rows(%x: memref<200x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<1x64xf32>) kernel {
    // expected-error @+1 {{scales dimension 0 must be 2 (values' columns / 128, one row of scales a block), got 1}}
    mk.quantize_columns %x into %q, %s : memref<200x64xbf16> -> memref<64x256xf8E4M3FN>, memref<1x64xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_scale_width(%x: memref<200x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<2x62xf32>) kernel {
    // expected-error @+1 {{scales dimension 1 must be at least src's columns (64) and a multiple of 4, got 62}}
    mk.quantize_columns %x into %q, %s : memref<200x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x62xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_lanes(%x: memref<200x48xbf16>, %q: memref<48x256xf8E4M3FN>, %s: memref<2x48xf32>) kernel {
    // expected-error @+1 {{src's columns (48) must be a multiple of 32 (a warp's lanes)}}
    mk.quantize_columns %x into %q, %s : memref<200x48xbf16> -> memref<48x256xf8E4M3FN>, memref<2x48xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_row_route(%x: memref<200x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<2x64xf32>, %rr: memref<100xi64>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{row_route dimension 0 must be 200 (src's rows), got 100}}
    mk.quantize_columns %x into %q, %s routed(%rr, %off : memref<100xi64>, memref<5xi64>) : memref<200x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// -----

// MX (E8M0) scales: tcgen05's scale-factor atoms, [rows/128, cols/128, 512].
gpu.module @k {
  gpu.func @mx_rows_rank(%x: memref<40x128xbf16>, %q: memref<40x128xf8E4M3FN>, %s: memref<1x1x1x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{scales: E8M0 scales must be [rows / 128, columns / 128, 512] (tcgen05's scale-factor atoms), got rank 4}}
    mk.quantize_rows %x into %q, %s : memref<40x128xbf16> -> memref<40x128xf8E4M3FN>, memref<1x1x1x512xf8E8M0FNU>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mx_rows_atoms(%x: memref<200x256xbf16>, %q: memref<200x256xf8E4M3FN>, %s: memref<1x2x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{scales dimension 0 must be 2 (the rows / 128, rounded up), got 1}}
    mk.quantize_rows %x into %q, %s : memref<200x256xbf16> -> memref<200x256xf8E4M3FN>, memref<1x2x512xf8E8M0FNU>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mx_rows_cols(%x: memref<40x96xbf16>, %q: memref<40x96xf8E4M3FN>, %s: memref<1x1x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{scales: MX operands of 96 columns; the scale atoms need a multiple of 128}}
    mk.quantize_rows %x into %q, %s : memref<40x96xbf16> -> memref<40x96xf8E4M3FN>, memref<1x1x512xf8E8M0FNU>
    gpu.return
  }
}

// -----

// (Transposed: the atoms of [E, K, N], blocks along N.)
gpu.module @k {
  gpu.func @mx_weights_transposed(%w: memref<2x128x256xbf16>, %q: memref<2x256x128xf8E4M3FN>, %s: memref<2x1x2x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{scales dimension 1 must be 2 (the rows / 128, rounded up), got 1}}
    mk.quantize_weights %w into %q, %s transposed : memref<2x128x256xbf16> -> memref<2x256x128xf8E4M3FN>, memref<2x1x2x512xf8E8M0FNU>
    gpu.return
  }
}

// -----

// Gathered column blocks: routed, router weights [T, k] with k static.
gpu.module @k {
  gpu.func @columns_gathered_unrouted(%d: memref<100x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<2x64xf32>, %rw: memref<100x2xf32>) kernel {
    // expected-error @+1 {{gathered needs routed (row_route and offsets)}}
    mk.quantize_columns %d into %q, %s gathered(%rw : memref<100x2xf32>) : memref<100x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_gathered_weights(%d: memref<100x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<2x64xf32>, %rr: memref<200xi64>, %off: memref<3xi64>, %rw: memref<50x4xf32>) kernel {
    // expected-error @+1 {{router_weights dimension 0 must be 100 (src's rows, the tokens), got 50}}
    mk.quantize_columns %d into %q, %s routed(%rr, %off : memref<200xi64>, memref<3xi64>) gathered(%rw : memref<50x4xf32>) : memref<100x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_gathered_rows(%d: memref<100x64xbf16>, %q: memref<64x128xf8E4M3FN>, %s: memref<1x64xf32>, %rr: memref<200xi64>, %off: memref<3xi64>, %rw: memref<100x2xf32>) kernel {
    // expected-error @+1 {{values dimension 1 (128) must be row_route's length (200) or more, a multiple of 128, the block}}
    mk.quantize_columns %d into %q, %s routed(%rr, %off : memref<200xi64>, memref<3xi64>) gathered(%rw : memref<100x2xf32>) : memref<100x64xbf16> -> memref<64x128xf8E4M3FN>, memref<1x64xf32>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @columns_gathered_top_k(%d: memref<100x64xbf16>, %q: memref<64x256xf8E4M3FN>, %s: memref<2x64xf32>, %rr: memref<200xi64>, %off: memref<3xi64>, %rw: memref<100x?xf32>) kernel {
    // expected-error @+1 {{router_weights' columns (top_k) must be static}}
    mk.quantize_columns %d into %q, %s routed(%rr, %off : memref<200xi64>, memref<3xi64>) gathered(%rw : memref<100x?xf32>) : memref<100x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    gpu.return
  }
}

// -----

// Column blocks, MX: the atoms of the transposed [C, R'].
gpu.module @k {
  gpu.func @mx_columns(%x: memref<200x256xbf16>, %q: memref<256x256xf8E4M3FN>, %s: memref<2x1x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{scales dimension 1 must be 2 (the columns / 128), got 1}}
    mk.quantize_columns %x into %q, %s : memref<200x256xbf16> -> memref<256x256xf8E4M3FN>, memref<2x1x512xf8E8M0FNU>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mx_weights_atoms(%w: memref<2x128x256xbf16>, %q: memref<2x128x256xf8E4M3FN>, %s: memref<2x1x1x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{scales dimension 2 must be 2 (the columns / 128), got 1}}
    mk.quantize_weights %w into %q, %s : memref<2x128x256xbf16> -> memref<2x128x256xf8E4M3FN>, memref<2x1x1x512xf8E8M0FNU>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mx_gemm_mixed(%a: memref<128x128xf8E4M3FN>, %b: memref<128x128xf8E4M3FN>, %o: memref<128x128xbf16>, %sa: memref<1x1x512xf8E8M0FNU>, %sb: memref<1x1xf32>) kernel {
    // expected-error @+1 {{FP8 scales must be all f32 or all E8M0 (f8E8M0FNU)}}
    mk.gemm store %a, %b into %o scales(%sa, %sb : memref<1x1x512xf8E8M0FNU>, memref<1x1xf32>) schedule <simt> : memref<128x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @mx_gemm_b_atoms(%a: memref<128x256xf8E4M3FN>, %b: memref<128x256xf8E4M3FN>, %o: memref<128x128xbf16>, %sa: memref<1x2x512xf8E8M0FNU>, %sb: memref<1x1x512xf8E8M0FNU>) kernel {
    // expected-error @+1 {{B scales dimension 1 must be 2 (the columns / 128), got 1}}
    mk.gemm store %a, %b into %o scales(%sa, %sb : memref<1x2x512xf8E8M0FNU>, memref<1x1x512xf8E8M0FNU>) schedule <simt> : memref<128x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<128x128xbf16>
    gpu.return
  }
}

