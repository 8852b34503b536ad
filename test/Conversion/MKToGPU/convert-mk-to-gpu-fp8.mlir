// RUN: mok-opt %s --convert-mk-to-gpu | FileCheck %s --implicit-check-not=mk.
// REQUIRES: ptxas
// RUN: rm -rf %t && mok-opt %s --moe-to-ptx=chip=sm_90a | %python %mok_src_root/scripts/extract-ptx.py %t/sm90
// RUN: FileCheck %s --check-prefix=PTX --input-file %t/sm90/k.ptx
// RUN: ptxas -arch=sm_90a -v %t/sm90/k.ptx -o %t/sm90.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: FileCheck %s --check-prefix=GPTX --input-file %t/sm90/g.ptx
// RUN: ptxas -arch=sm_90a %t/sm90/g.ptx -o %t/sm90-g.cubin
// RUN: ptxas -arch=sm_90a -v %t/sm90/w.ptx -o %t/sm90-w.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: mok-opt %s --moe-to-ptx=chip=sm_100a | %python %mok_src_root/scripts/extract-ptx.py %t/sm100
// RUN: ptxas -arch=sm_100a %t/sm100/k.ptx -o %t/sm100.cubin
// RUN: ptxas -arch=sm_100a %t/sm100/g.ptx -o %t/sm100-g.cubin
// RUN: ptxas -arch=sm_90a %t/sm90/d.ptx -o %t/sm90-d.cubin
// RUN: ptxas -arch=sm_90a -v %t/sm90/c.ptx -o %t/sm90-c.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS
// RUN: ptxas -arch=sm_100a %t/sm100/c.ptx -o %t/sm100-c.cubin

// The FP8 steps of convert-mk-to-gpu: the row, column and weight
// quantizers and the simt GEMMs over E4M3 operands with f32 block scales.

// mk.quantize_rows: 1 x 128 blocks (row r = i / blocks, block i %
// blocks). amax: the NaN-propagating maximum of |x| over the block's
// lanes (maximumf, then a butterfly of xor shuffles, so every lane has the
// block's); s = amax / 448 (1 for amax = 0); the values E4M3(x / s) by cvt
// pairs (rn, satfinite); a non-finite block (amax not < inf) stores 0x7F
// with each element's sign and a NaN scale; one lane stores scales[block,
// r].
//
// With 16-byte aligned buffers (the check of their addresses): a
// half-warp a block, 16 consecutive blocks a warp step (2 u + lane / 16, u
// < 8, eight 16-byte loads in flight a lane), lane l holding the block's
// columns 8 (l % 16) .. + 7 and storing their 8 codes at once; the
// butterfly stays in the half-warp (xor 1 .. 8); lane l % 16 = 0 stores
// the scale.
// CHECK-LABEL: gpu.func @quantize(
// CHECK-SAME: %[[X:[^:]*]]: memref<40x256xbf16>, %[[Q:[^:]*]]: memref<40x256xf8E4M3FN>, %[[S:[^:]*]]: memref<2x40xf32>)
// CHECK: scf.if
// CHECK: %[[STEPS:.*]] = arith.divsi %{{.*}}, %c16
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[STEPS]] step
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c8_i32
// CHECK: scf.if
// CHECK-COUNT-4: nvvm.convert.f32x2.to.f8x2
// CHECK: llvm.store %{{.*}} {alignment = 8 : i64} : vector<2xi32>, !llvm.ptr<1>
// CHECK-COUNT-8: memref.store %{{.*}}, %[[S]]
// CHECK: } else {
// Otherwise one warp a block, warps spread over the blocks first; lane l
// holds the block's columns l, l + 32, l + 64, l + 96 (each warp access
// contiguous).
// CHECK: %[[LANE32:.*]] = nvvm.read.ptx.sreg.laneid
// CHECK: %[[LANE:.*]] = arith.index_cast %[[LANE32]]
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK: %[[R:.*]] = arith.divsi %[[I]], %c2
// CHECK: %[[B:.*]] = arith.remsi %[[I]], %c2
// CHECK: %[[B0:.*]] = arith.muli %[[B]], %c128
// CHECK: %[[C0:.*]] = arith.addi %[[B0]], %[[LANE]]
// CHECK: memref.load %[[X]][%[[R]], %{{.*}}]
// CHECK-COUNT-3: memref.load %[[X]]
// CHECK: math.absf
// CHECK: arith.maximumf
// CHECK: gpu.shuffle  xor %{{.*}}, %c16_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: %[[AMAX:.*]] = arith.maximumf
// CHECK: %[[FINITE:.*]] = arith.cmpf olt, %[[AMAX]], %cst{{.*}} : f32
// CHECK: %[[ZERO:.*]] = arith.cmpf oeq, %[[AMAX]]
// CHECK: %[[DIV:.*]] = arith.divf %[[AMAX]], %cst{{.*}} : f32
// CHECK: %[[SC:.*]] = arith.select %[[ZERO]], %cst{{.*}}, %[[DIV]]
// CHECK: %[[SCALE:.*]] = arith.select %[[FINITE]], %[[SC]], %cst{{.*}} : f32
// The quotients without a division an element: y = RN(1 / s) once a
// block; where s >= 2^-90 (a branch uniform over the block) a = |x|, q =
// a y and two Newton steps of fma give RN(a / s) (Markstein), with x's
// sign bit; a tinier s divides.
// CHECK: %[[LARGE:.*]] = arith.cmpf oge, %[[SC]], %cst{{.*}} : f32
// CHECK: %[[Y:.*]] = arith.divf %cst{{.*}}, %[[SC]] : f32
// CHECK: scf.if %[[LARGE]] -> (i8, i8, i8, i8)
// CHECK: %[[A:.*]] = math.absf %{{.*}} : f32
// CHECK: %[[QA:.*]] = arith.mulf %[[A]], %[[Y]] : f32
// CHECK: %[[NA:.*]] = arith.negf %[[QA]] : f32
// CHECK: %[[RA:.*]] = llvm.intr.fma(%[[NA]], %[[SC]], %[[A]])
// CHECK: %[[QB:.*]] = llvm.intr.fma(%[[RA]], %[[Y]], %[[QA]])
// CHECK: %[[NB:.*]] = arith.negf %[[QB]] : f32
// CHECK: %[[RB:.*]] = llvm.intr.fma(%[[NB]], %[[SC]], %[[A]])
// CHECK: %[[QC:.*]] = llvm.intr.fma(%[[RB]], %[[Y]], %[[QB]])
// CHECK: arith.andi %{{.*}}, %c-2147483648_i32
// CHECK: %[[Q0:.*]] = arith.bitcast %{{.*}} : i32 to f32
// CHECK: %[[Q1:.*]] = arith.bitcast %{{.*}} : i32 to f32
// CHECK: nvvm.convert.f32x2.to.f8x2 %[[Q0]], %[[Q1]] {rnd = #nvvm.fp_rnd_mode<rn>, sat = #nvvm.sat_mode<satfinite>} : i16(f8E4M3FN)
// CHECK: nvvm.convert.f32x2.to.f8x2
// CHECK: } else {
// CHECK-COUNT-2: arith.divf %{{.*}}, %[[SC]] : f32
// CHECK: arith.select %[[FINITE]], %{{.*}} : i8
// CHECK-COUNT-4: memref.store %{{.*}}, %[[Q]][%[[R]], %{{.*}}] {alignment = 1 : i64} : memref<40x256xf8E4M3FN>
// CHECK: arith.cmpi eq, %[[LANE]], %c0
// CHECK: memref.store %[[SCALE]], %[[S]][%[[B]], %[[R]]]
//
// In the PTX, the IEEE division for the scale and the correctly rounded
// reciprocal (rcp.rn; no .ftz: subnormal scales are kept), fused
// multiply-adds that round once, the NaN-propagating maximum, the
// saturating conversion, no spills.
// PTX: max.NaN.f32
// PTX: shfl.sync.bfly.b32
// PTX: div.rn.f32 {{.*}}, 0f43E00000;
// PTX: rcp.rn.f32
// PTX: fma.rn.f32
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX: cvt.rn.satfinite.e4m3x2.f32
// PTX-NOT: .ftz
// PTX-NOT: div.approx
// PTX-NOT: rcp.approx
// PTXAS: 0 bytes spill stores, 0 bytes spill loads
gpu.module @k {
  gpu.func @quantize(%x: memref<40x256xbf16>, %q: memref<40x256xf8E4M3FN>, %s: memref<2x40xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.quantize_rows %x into %q, %s : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<2x40xf32>
    gpu.return
  }
}

// With tokens(%t): the blocks of rows r < t only.
// CHECK-LABEL: gpu.func @quantize_tokens(
// CHECK-SAME: %{{[^:]*}}: memref<64x128xbf16>, %{{[^:]*}}: memref<64x128xf8E4M3FN>, %{{[^:]*}}: memref<1x64xf32>, %[[T:[^:]*]]: index)
// CHECK: %[[N:.*]] = arith.muli %[[T]], %c1
// CHECK: scf.if
// CHECK: %[[N15:.*]] = arith.addi %[[N]], %c15
// CHECK: %[[NS:.*]] = arith.divsi %[[N15]], %c16
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[NS]] step
// CHECK: } else {
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[N]] step
gpu.module @t {
  gpu.func @quantize_tokens(%x: memref<64x128xbf16>, %q: memref<64x128xf8E4M3FN>, %s: memref<1x64xf32>, %t: index) kernel
      attributes {known_block_size = array<i32: 128, 1, 1>} {
    mk.quantize_rows %x into %q, %s tokens(%t) : memref<64x128xbf16> -> memref<64x128xf8E4M3FN>, memref<1x64xf32>
    gpu.return
  }
}

// With grouped(%offsets): the blocks of the rows the experts use, r <
// offsets[E] (read in the kernel).
// CHECK-LABEL: gpu.func @quantize_grouped(
// CHECK-SAME: %[[OFFS:[^:]*]]: memref<5xi64>)
// CHECK: %[[END:.*]] = memref.load %[[OFFS]][%c4]
// CHECK: %[[ROWS:.*]] = arith.index_cast %[[END]] : i64 to index
// CHECK: %[[NG:.*]] = arith.muli %[[ROWS]], %c2
// CHECK: scf.if
// CHECK: scf.for
// CHECK: } else {
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[NG]] step
gpu.module @g2 {
  gpu.func @quantize_grouped(%x: memref<600x256xbf16>, %q: memref<600x256xf8E4M3FN>, %s: memref<2x600xf32>, %o: memref<5xi64>) kernel
      attributes {known_block_size = array<i32: 128, 1, 1>} {
    mk.quantize_rows %x into %q, %s grouped(%o : memref<5xi64>) : memref<600x256xbf16> -> memref<600x256xf8E4M3FN>, memref<2x600xf32>
    gpu.return
  }
}

// An FP8 GEMM on simt: each operand element is decoded exactly (the byte
// in both halves of cvt.rn.f16x2.e4m3x2, then f16 to f32) and multiplied by
// its block's scale: B's [e, c / 128, k / 128], A's [k / 128, r]; then the
// fp32 sum in k order and the bf16 epilogue, as for bf16 operands.
// CHECK-LABEL: gpu.func @fp8_gemms(
// CHECK-SAME: %[[A:[^:]*]]: memref<256x128xf8E4M3FN>, %[[SA:[^:]*]]: memref<1x256xf32>, %[[G:[^:]*]]: memref<2x128x128xf8E4M3FN>, %[[SG:[^:]*]]: memref<2x1x1xf32>,
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK: %[[R:.*]] = arith.divsi %[[I]], %c128
// CHECK: %[[E:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK: scf.for %[[K:.*]] = %c0 to %c128{{.*}} iter_args(%[[ACC:.*]] = %cst) -> (f32)
// CHECK: %[[CB:.*]] = arith.divsi %[[C:.*]], %c128
// CHECK: %[[KB:.*]] = arith.divsi %[[K]], %c128
// CHECK: %[[SB:.*]] = memref.load %[[SG]][%[[E]], %[[CB]], %[[KB]]]
// CHECK: %[[BQ:.*]] = memref.load %[[G]][%[[E]], %[[C]], %[[K]]]
// CHECK: %[[BBYTE:.*]] = arith.bitcast %[[BQ]] : f8E4M3FN to i8
// CHECK: %[[BH:.*]] = nvvm.convert.f8x2.to.f16x2 %{{.*}} : vector<2xi8>(f8E4M3FN) -> vector<2xf16>
// CHECK: %[[BF:.*]] = arith.extf %{{.*}} : f16 to f32
// CHECK: %[[BV:.*]] = arith.mulf %[[BF]], %[[SB]]
// CHECK: %[[SAV:.*]] = memref.load %[[SA]][%{{.*}}, %[[R]]]
// CHECK: memref.load %[[A]][%[[R]], %[[K]]]
// CHECK: nvvm.convert.f8x2.to.f16x2
// CHECK: %[[AF:.*]] = arith.extf %{{.*}} : f16 to f32
// CHECK: %[[AV:.*]] = arith.mulf %[[AF]], %[[SAV]]
// CHECK: %[[P:.*]] = arith.mulf %[[AV]], %[[BV]]
// CHECK: arith.addf %[[ACC]], %[[P]]
// GPTX: cvt.rn.f16x2.e4m3x2
gpu.module @g {
  gpu.func @fp8_gemms(%a: memref<256x128xf8E4M3FN>, %sa: memref<1x256xf32>,
                      %g: memref<2x128x128xf8E4M3FN>, %sg: memref<2x1x1xf32>,
                      %u: memref<2x128x128xf8E4M3FN>, %su: memref<2x1x1xf32>,
                      %re: memref<256xi64>, %off: memref<3xi64>,
                      %h: memref<256x128xbf16>,
                      %d: memref<128x128xf8E4M3FN>, %sd: memref<1x1xf32>,
                      %y: memref<256x128xbf16>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.gemm swiglu %a, %g, %u into %h grouped(%re, %off : memref<256xi64>, memref<3xi64>)
        scales(%sa, %sg, %su : memref<1x256xf32>, memref<2x1x1xf32>, memref<2x1x1xf32>)
        schedule <simt>
        : memref<256x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN>, memref<2x128x128xf8E4M3FN> -> memref<256x128xbf16>
    mk.gemm store %a, %d into %y scales(%sa, %sd : memref<1x256xf32>, memref<1x1xf32>) schedule <simt>
        : memref<256x128xf8E4M3FN>, memref<128x128xf8E4M3FN> -> memref<256x128xbf16>
    gpu.return
  }
}

// mk.quantize_weights: one warp a 128 x 128 block (expert i / 2, block row
// (i / 1) % 2, block column i % 1 of the 4 x 2 x 1 grid); a pass over the
// block's rows for the amax, the butterfly, the scale, then a second pass
// that quantizes and stores; lane 0 stores scales[expert, n / 128, k /
// 128]. With 16-byte aligned buffers (the check of the weights' address)
// lane l reads 8 columns (16 bytes) of the rows of its parity l / 16 (eight
// pairs of rows a step for the amax, four for the codes), and stores their
// 8 codes at once (8 bytes);
// otherwise a lane reads columns l + 32 j and stores code by code.
// CHECK-LABEL: gpu.func @weights(
// CHECK-SAME: %[[W:[^:]*]]: memref<4x256x128xbf16>, %[[WQ:[^:]*]]: memref<4x256x128xf8E4M3FN>, %[[WS:[^:]*]]: memref<4x2x1xf32>)
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %c8 step
// CHECK: scf.if
// CHECK: %[[X:.*]] = arith.divsi %[[I]], %c2
// CHECK: %[[NB:.*]] = arith.remsi %{{.*}}, %c2
// CHECK: %[[KB:.*]] = arith.remsi %[[I]], %c1
// CHECK: %[[VAMAX:.*]] = scf.for %{{.*}} = %c0{{.*}} to %c64{{.*}} step %c8{{.*}} iter_args(%{{.*}}) -> (f32)
// CHECK-COUNT-8: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: scf.yield
// CHECK: gpu.shuffle  xor %[[VAMAX]], %c16_i32
// CHECK: arith.divf %{{.*}}, %cst{{.*}} : f32
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %c64{{.*}} step %c4
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-COUNT-4: nvvm.convert.f32x2.to.f8x2
// CHECK: llvm.store %{{.*}} {alignment = 8 : i64} : vector<2xi32>, !llvm.ptr<1>
// CHECK: memref.store %{{.*}}, %[[WS]][%{{.*}}, %{{.*}}, %{{.*}}]
// CHECK: } else {
// CHECK: %[[AMAX:.*]] = scf.for %{{.*}} iter_args(%{{.*}}) -> (f32)
// CHECK-COUNT-4: memref.load %[[W]][%{{.*}}, %{{.*}}, %{{.*}}]
// CHECK: scf.yield
// CHECK: gpu.shuffle  xor %[[AMAX]], %c16_i32
// CHECK: scf.for
// CHECK-COUNT-2: nvvm.convert.f32x2.to.f8x2
// CHECK-COUNT-4: memref.store %{{.*}}, %[[WQ]][%{{.*}}, %{{.*}}, %{{.*}}]
// CHECK: memref.store %{{.*}}, %[[WS]][%{{.*}}, %{{.*}}, %{{.*}}]
gpu.module @w {
  gpu.func @weights(%w: memref<4x256x128xbf16>, %q: memref<4x256x128xf8E4M3FN>, %s: memref<4x2x1xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.quantize_weights %w into %q, %s : memref<4x256x128xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1xf32>
    gpu.return
  }
}

// The FP8 dispatch: E4M3 rows copied as bytes (16-byte pieces of 16
// elements when aligned, else byte by byte), and each routed row's block
// scales from its token's (1 for a padding row).
// CHECK-LABEL: gpu.func @fp8_gather(
// CHECK-SAME: %[[XS:[^:]*]]: memref<2x40xf32>, %[[RR:[^:]*]]: memref<108xi64>, %{{[^:]*}}: memref<5xi64>, %{{[^:]*}}: memref<108x256xf8E4M3FN>, %[[RS:[^:]*]]: memref<2x108xf32>)
// CHECK: scf.for
// CHECK: %[[ROUTE:.*]] = arith.index_cast %{{.*}} : i64 to index
// CHECK: %[[S:.*]] = scf.if
// CHECK: memref.load %[[XS]]
// CHECK: } else {
// CHECK: scf.yield %cst{{.*}} : f32
// CHECK: memref.store %[[S]], %[[RS]]
// CHECK: %c16 = arith.constant 16 : index
// CHECK: llvm.load {{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
gpu.module @d {
  gpu.func @fp8_gather(%x: memref<40x256xf8E4M3FN>, %xs: memref<2x40xf32>, %rr: memref<108xi64>, %off: memref<5xi64>,
                       %rx: memref<108x256xf8E4M3FN>, %rs: memref<2x108xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.gather %x, %rr, %off into %rx block_scales(%xs into %rs : memref<2x40xf32> -> memref<2x108xf32>) {top_k = 2 : i64}
        : memref<40x256xf8E4M3FN>, memref<108xi64>, memref<5xi64> -> memref<108x256xf8E4M3FN>
    gpu.return
  }
}


// mk.quantize_columns: one warp a 128-row block of 32 columns, over the
// blocks that hold routed rows (offsets[E], at most src's 200); a row past
// them or with row_route < 0 reads as zero. With 16-byte aligned buffers
// the block stays in registers: lane l loads rows 16 (l % 8) + i (i < 16)
// of it, 8 columns from 8 (l / 8) on (16 loads of 16 bytes), and the
// row_route entries of rows 4 l + k (k < 4). A warp's blocks in turn: the
// loop carries the next block's loads, issued before the current one is
// quantized (the first block's before the loop). The rows' routes go
// through four ballots (row 16 h + j is bit 4 h + j / 4 of ballot j % 4);
// the lane takes its columns' amax over its rows and then over the 8
// lanes of the same columns (xor 1, 2, 4), and stores each column's 16
// codes in one 16-byte store of its transposed row; lanes l % 8 = 0 store
// scales[block, c]. Otherwise a lane a column: an amax pass over the
// block's rows, then 8 chunks of 16 rows, each packed into one 16-byte
// store of the column's transposed row (byte stores where values is not
// 16-byte aligned).
// CHECK-LABEL: gpu.func @fp8_columns(
// CHECK-SAME: %[[H:[^:]*]]: memref<200x128xbf16>, %[[HQ:[^:]*]]: memref<128x256xf8E4M3FN>, %[[HS:[^:]*]]: memref<2x128xf32>, %[[RR:[^:]*]]: memref<200xi64>, %[[OFF:[^:]*]]: memref<3xi64>, %[[D:[^:]*]]: memref<200x64xbf16>, %[[DQ:[^:]*]]: memref<64x256xf8E4M3FN>, %[[DS:[^:]*]]: memref<2x64xf32>, %[[DW:[^:]*]]: memref<2x64x128xf32>
// CHECK: memref.load %[[OFF]][%c2
// CHECK: arith.minsi %{{.*}}, %c200
// CHECK: scf.if
// CHECK-COUNT-16: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-COUNT-4: memref.load %[[RR]]
// CHECK: scf.for %{{.*}} iter_args({{.*}}) -> (vector<8xbf16>, {{.*}}, i64, i64, i64, i64)
// CHECK-COUNT-16: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-COUNT-4: memref.load %[[RR]]
// CHECK-COUNT-4: nvvm.vote.sync  ballot
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK: arith.divf %{{.*}}, %cst{{.*}} : f32
// A column's 16 elements from their bf16 halves by bit operations, then
// its codes as 4 words: on a finite block's branch (and its large scale's)
// each cvt's pair of codes goes into its half of a word as it is; a block
// that is not finite takes the elements' NaN codes on its own branch.
// CHECK: llvm.bitcast %{{.*}} : vector<8xbf16> to vector<4xi32>
// CHECK: arith.shli %{{.*}}, %c16_i32
// CHECK: scf.if %{{.*}} -> (i32, i32, i32, i32) {
// CHECK: scf.if %{{.*}} -> (i32, i32, i32, i32) {
// CHECK: %[[P0:.*]] = nvvm.convert.f32x2.to.f8x2
// CHECK: %[[W0:.*]] = llvm.insertelement %[[P0]], %{{.*}} : vector<2xi16>
// CHECK: %[[P1:.*]] = nvvm.convert.f32x2.to.f8x2
// CHECK: %[[W1:.*]] = llvm.insertelement %[[P1]], %[[W0]][%{{.*}} : vector<2xi16>
// CHECK-NEXT: llvm.bitcast %[[W1]] : vector<2xi16> to i32
// CHECK-NOT: arith.trunci
// CHECK-COUNT-6: nvvm.convert.f32x2.to.f8x2
// CHECK-NOT: arith.trunci
// CHECK: } else {
// CHECK: arith.divf
// CHECK: } else {
// CHECK: arith.ori %{{.*}}, %c127_i8
// CHECK: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-COUNT-8: memref.store %{{.*}}, %[[HS]]
// CHECK: scf.yield
// CHECK: } else {
// CHECK: scf.for %{{.*}} iter_args(%{{.*}}) -> (f32)
// CHECK: memref.load %[[RR]]
// CHECK: memref.load %[[H]]
// CHECK: arith.maximumf
// CHECK: arith.divf %{{.*}}, %cst{{.*}} : f32
// CHECK: scf.for %{{.*}} = %{{.*}} to %c8
// CHECK-COUNT-16: memref.load %[[H]]
// CHECK-COUNT-8: nvvm.convert.f32x2.to.f8x2
// CHECK: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: } else {
// CHECK-COUNT-16: memref.store %{{.*}}, %[[HQ]]
// CHECK: memref.store %{{.*}}, %[[HS]]
// The second: every row of src (no row_route), the blocks of values.
// CHECK: scf.for
// CHECK: memref.load %[[D]]
// CHECK-NOT: memref.load %[[RR]]
// CHECK: memref.store %{{.*}}, %[[DS]]
// The weight gradient on them (k_groups, simt): out[g, m, n] sums expert
// g's K rows, each term A's E4M3 value times sa[k/128, m] and B's times
// sb[k/128, n] (both blocks along K).
// CHECK: gpu.barrier
// CHECK: %[[N:.*]] = arith.remsi %{{.*}}, %c128
// CHECK: %[[M:.*]] = arith.remsi %{{.*}}, %c64
// CHECK: scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args
// CHECK: %[[KB:.*]] = arith.divsi %[[K]], %c128
// CHECK: memref.load %[[HS]][%[[KB]], %[[N]]]
// CHECK: memref.load %[[HQ]][%[[N]], %[[K]]]
// CHECK: %[[KB2:.*]] = arith.divsi %[[K]], %c128
// CHECK: memref.load %[[DS]][%[[KB2]], %[[M]]]
// CHECK: memref.load %[[DQ]][%[[M]], %[[K]]]
// CHECK: memref.store %{{.*}}, %[[DW]]
//
// Gathered: the rows are d_out's routed rows scaled by their router
// weights, read from the token rows. Lane l loads its 16 rows' routes
// first, then each route's token row piece (t = q / k) and weight, and
// rounds w * x to bf16, two at a time (mk.gather's scaled rows; a zero
// piece for padding rows and rows past offsets[E]); no ballots, and one
// block at a time (no
// loads carried across the loop). The scalar path reads a value so too.
// CHECK-LABEL: gpu.func @gathered_columns(
// CHECK-SAME: %[[GD:[^:]*]]: memref<100x128xbf16>, %[[GRR:[^:]*]]: memref<200xi64>, %[[GOFF:[^:]*]]: memref<3xi64>, %[[GRW:[^:]*]]: memref<100x2xf32>, %[[GQ:[^:]*]]: memref<128x256xf8E4M3FN>, %[[GS:[^:]*]]: memref<2x128xf32>)
// CHECK: memref.load %[[GOFF]][%c2
// CHECK: arith.minsi %{{.*}}, %c200
// CHECK: scf.if
// CHECK: scf.for
// CHECK-NOT: iter_args
// CHECK-COUNT-16: memref.load %[[GRR]]
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK: %[[GW:.*]] = memref.load %[[GRW]]
// CHECK-COUNT-8: arith.mulf %[[GW]],
// CHECK: arith.truncf %{{.*}} : vector<2xf32> to vector<2xbf16>
// CHECK: arith.select %{{.*}}, %{{.*}}, %{{.*}} : vector<8xbf16>
// CHECK-NOT: nvvm.vote.sync
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: nvvm.convert.f32x2.to.f8x2
// CHECK: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: memref.store %{{.*}}, %[[GS]]
// CHECK: } else {
// CHECK: scf.for %{{.*}} iter_args(%{{.*}}) -> (f32)
// CHECK: memref.load %[[GRR]]
// CHECK: memref.load %[[GD]]
// CHECK: %[[GW2:.*]] = memref.load %[[GRW]]
// CHECK: arith.mulf %[[GW2]],
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: arith.maximumf
//
// mk.quantize_weights transposed: the block's amax as above, then, with
// 16-byte aligned buffers, its four 128 x 32 tiles as mk.quantize_columns
// takes them (16 loads of 16 bytes a lane, a 16-byte store of 16 codes a
// column); otherwise lane l quantizes the block's columns l + 32 j, 16
// rows at a time, into one 16-byte store of values[e, k, n0 .. n0 + 15];
// scales[e, k / 128, n / 128].
// CHECK-LABEL: gpu.func @weights_t(
// CHECK-SAME: %[[TW:[^:]*]]: memref<4x256x128xbf16>, %[[TQ:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[TS:[^:]*]]: memref<4x1x2xf32>)
// CHECK: scf.if
// CHECK: %[[TX:.*]] = arith.divsi %{{.*}}, %c2
// CHECK: %[[TNB:.*]] = arith.remsi %{{.*}}, %c2
// CHECK: %[[TKB:.*]] = arith.remsi %{{.*}}, %c1
// CHECK: gpu.shuffle  xor
// CHECK: scf.for %{{.*}} = %{{.*}} to %c4
// CHECK-COUNT-16: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
// CHECK-COUNT-8: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: memref.store %{{.*}}, %[[TS]][%[[TX]], %[[TKB]], %[[TNB]]]
// CHECK: } else {
// CHECK: %[[SX:.*]] = arith.divsi %{{.*}}, %c2
// CHECK: %[[SNB:.*]] = arith.remsi %{{.*}}, %c2
// CHECK: %[[SKB:.*]] = arith.remsi %{{.*}}, %c1
// CHECK: gpu.shuffle  xor
// CHECK: scf.for %{{.*}} = %{{.*}} to %c32
// CHECK-COUNT-16: memref.load %[[TW]][%[[SX]], %{{.*}}, %{{.*}}]
// CHECK: llvm.store {{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: } else {
// CHECK-COUNT-16: memref.store %{{.*}}, %[[TQ]]
// CHECK: memref.store %{{.*}}, %[[TS]][%[[SX]], %[[SKB]], %[[SNB]]]
gpu.module @c {
  gpu.func @fp8_columns(%h: memref<200x128xbf16>, %hq: memref<128x256xf8E4M3FN>, %hs: memref<2x128xf32>,
                        %rr: memref<200xi64>, %off: memref<3xi64>,
                        %d: memref<200x64xbf16>, %dq: memref<64x256xf8E4M3FN>, %ds: memref<2x64xf32>,
                        %dw: memref<2x64x128xf32>, %bar: memref<2xi32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.quantize_columns %h into %hq, %hs routed(%rr, %off : memref<200xi64>, memref<3xi64>) : memref<200x128xbf16> -> memref<128x256xf8E4M3FN>, memref<2x128xf32>
    mk.quantize_columns %d into %dq, %ds : memref<200x64xbf16> -> memref<64x256xf8E4M3FN>, memref<2x64xf32>
    mk.grid_barrier %bar : memref<2xi32>
    mk.gemm store %dq, %hq into %dw k_groups(%off : memref<3xi64>) scales(%ds, %hs : memref<2x64xf32>, memref<2x128xf32>) schedule <simt> : memref<64x256xf8E4M3FN>, memref<128x256xf8E4M3FN> -> memref<2x64x128xf32>
    gpu.return
  }
  gpu.func @gathered_columns(%d: memref<100x128xbf16>, %rr: memref<200xi64>, %off: memref<3xi64>,
                             %rw: memref<100x2xf32>, %q: memref<128x256xf8E4M3FN>, %s: memref<2x128xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.quantize_columns %d into %q, %s routed(%rr, %off : memref<200xi64>, memref<3xi64>) gathered(%rw : memref<100x2xf32>) : memref<100x128xbf16> -> memref<128x256xf8E4M3FN>, memref<2x128xf32>
    gpu.return
  }
  gpu.func @weights_t(%w: memref<4x256x128xbf16>, %q: memref<4x128x256xf8E4M3FN>, %s: memref<4x1x2xf32>) kernel
      attributes {known_block_size = array<i32: 256, 1, 1>} {
    mk.quantize_weights %w into %q, %s transposed : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2xf32>
    gpu.return
  }
}
