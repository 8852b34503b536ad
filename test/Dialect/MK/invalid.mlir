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
    mk.gemm simt swiglu %a, %b into %o : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @limit_on_store(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{swiglu_limit needs the swiglu epilogue}}
    mk.gemm simt store %a, %b into %o {swiglu_limit = 1.0 : f32} : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_mismatch(%a: memref<64x64xbf16>, %b: memref<128x32xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{B dimension 1 must be 64 (K, a's columns), got 32}}
    mk.gemm simt store %a, %b into %o : memref<64x64xbf16>, memref<128x32xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @n_mismatch(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x96xbf16>) kernel {
    // expected-error @+1 {{out dimension 1 must be 128 (N, B's rows), got 96}}
    mk.gemm simt store %a, %b into %o : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x96xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @grouped_rank(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>,
                         %re: memref<64xi64>, %off: memref<5xi64>) kernel {
    // expected-error @+1 {{B operands must be [E, N, K] (grouped), got rank 2}}
    mk.gemm simt store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<5xi64>)
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @grouped_offsets(%a: memref<64x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<64x128xbf16>,
                            %re: memref<64xi64>, %off: memref<4xi64>) kernel {
    // expected-error @+1 {{offsets dimension 0 must be 5 (experts + 1), got 4}}
    mk.gemm simt store %a, %b into %o grouped(%re, %off : memref<64xi64>, memref<4xi64>)
        : memref<64x64xbf16>, memref<4x128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @simt_tile(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{the simt engine takes no tile, stages, maps or tensor_maps}}
    mk.gemm simt store %a, %b into %o {tile = array<i64: 64, 128, 64>} : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @wgmma_no_maps(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>) kernel {
    // expected-error @+1 {{the wgmma engine needs tile, stages, maps and tensor_maps}}
    mk.gemm wgmma store %a, %b into %o {tile = array<i64: 64, 128, 64>, stages = 4 : i64} : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_tile(%a: memref<64x96xbf16>, %b: memref<128x96xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{K = 96 must be a multiple of the tile's K (64)}}
    mk.gemm wgmma store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x96xbf16>, memref<128x96xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @map_count(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{maps must give 2 slots (a, then each B), got 3}}
    mk.gemm tcgen05 store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1, 2>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @tile_rank(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{tile must be [M, N, K], all positive}}
    mk.gemm wgmma store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @combine_rows(%y: memref<108x64xbf16>, %rr: memref<80xi64>, %w: memref<40x2xf32>, %o: memref<41x64xbf16>) kernel {
    // expected-error @+1 {{router_weights dimension 0 must be 41 (tokens, out's rows), got 40}}
    mk.combine %y, %rr, %w into %o : memref<108x64xbf16>, memref<80xi64>, memref<40x2xf32> -> memref<41x64xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @combine_shared(%y: memref<108x64xbf16>, %rr: memref<80xi64>, %w: memref<40x2xf32>, %s: memref<40x32xbf16>, %o: memref<40x64xbf16>) kernel {
    // expected-error @+1 {{shared must have out's type}}
    mk.combine %y, %rr, %w shared(%s : memref<40x32xbf16>) into %o : memref<108x64xbf16>, memref<80xi64>, memref<40x2xf32> -> memref<40x64xbf16>
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
  gpu.func @producer_tcgen05(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{a producer warp is implemented for the wgmma engine only, not tcgen05}}
    mk.gemm tcgen05 store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, producer, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_alone(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{registers needs producer (they are moved between the consumer and producer warpgroups)}}
    mk.gemm wgmma store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, registers = array<i64: 224, 56>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_bad(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{registers must be [consumer, producer], each a multiple of 8 in [24, 256]}}
    mk.gemm wgmma store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, producer, registers = array<i64: 224, 20>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @registers_order(%a: memref<64x64xbf16>, %b: memref<128x64xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{registers: the consumers get at least the producer's count}}
    mk.gemm wgmma store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, producer, registers = array<i64: 56, 224>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x64xbf16>, memref<128x64xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @k_zero(%a: memref<64x0xbf16>, %b: memref<128x0xbf16>, %o: memref<64x128xbf16>, %m: memref<32xi64>) kernel {
    // expected-error @+1 {{K = 0 is less than the tile's K (64): nothing to accumulate}}
    mk.gemm wgmma store %a, %b into %o maps(%m : memref<32xi64>)
        {maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<64x0xbf16>, memref<128x0xbf16> -> memref<64x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_no_topk(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{gather needs both gather_rows and gather_top_k}}
    mk.gemm wgmma store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) maps(%m : memref<304xi64>) gather(%rr : memref<332xi64>) {maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_simt(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{a gathered A operand is implemented for the wgmma engine only}}
    mk.gemm simt store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) gather(%rr : memref<332xi64>) {gather_top_k = 2 : i64}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_dense(%x: memref<40x64xbf16>, %b: memref<128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{a gathered A operand needs a grouped GEMM (its rows are routed rows)}}
    mk.gemm wgmma store %x, %b into %o maps(%m : memref<304xi64>) gather(%rr : memref<332xi64>) {gather_top_k = 2 : i64, maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<40x64xbf16>, memref<128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @gather_rows(%x: memref<40x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<331xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{gather_rows dimension 0 must be 332 (out's rows), got 331}}
    mk.gemm wgmma store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) maps(%m : memref<304xi64>) gather(%rr : memref<331xi64>) {gather_top_k = 2 : i64, maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<40x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @padding_dense(%x: memref<332x64xbf16>, %b: memref<128x64xbf16>, %o: memref<332x128xbf16>, %rr: memref<332xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{padding rows need a grouped GEMM (padding ends each expert's segment)}}
    mk.gemm wgmma store %x, %b into %o maps(%m : memref<304xi64>) padding(%rr : memref<332xi64>) {maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<332x64xbf16>, memref<128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}

// -----

gpu.module @k {
  gpu.func @padding_rows(%x: memref<332x64xbf16>, %b: memref<4x128x64xbf16>, %o: memref<332x128xbf16>, %re: memref<332xi64>, %off: memref<5xi64>, %rr: memref<331xi64>, %m: memref<304xi64>) kernel {
    // expected-error @+1 {{padding_rows dimension 0 must be 332 (out's rows), got 331}}
    mk.gemm wgmma store %x, %b into %o grouped(%re, %off : memref<332xi64>, memref<5xi64>) maps(%m : memref<304xi64>) padding(%rr : memref<331xi64>) {maps = array<i64: 0, 1>, stages = 4 : i64, tile = array<i64: 64, 128, 64>}
        : memref<332x64xbf16>, memref<4x128x64xbf16> -> memref<332x128xbf16>
    gpu.return
  }
}
