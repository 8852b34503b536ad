// RUN: mok-opt %s --split-input-file --convert-moe-to-mk --verify-diagnostics
// Warp roles exist for wgmma only:
// RUN: not mok-opt %s --split-input-file --convert-moe-to-mk="chip=sm_100a warp-specialize=true" 2>&1 | FileCheck %s --check-prefix=WS
// WS: error: convert-moe-to-mk: warp-specialize is implemented for sm_90a (wgmma) only, not sm_100a
// RUN: not mok-opt %s --split-input-file --convert-moe-to-mk="chip=sm_100a fuse-dispatch=true" 2>&1 | FileCheck %s --check-prefix=FD
// FD: error: convert-moe-to-mk: fuse-dispatch is implemented for sm_90a only

// What the GPU lowering does not support yet is rejected by name.

func.func @dynamic_tokens(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>,
                          %wg: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{convert-moe-to-mk: a dynamic token count needs a capacity, the plan's max_tokens (the GPU kernel's buffers are sized for it)}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 8>
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>,
         tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<?x64xbf16>
  return %o : tensor<?x64xbf16>
}

// -----

// Sizes whose buffers overflow int64_t are refused (T * top_k overflowed
// and the kernel got negative buffer sizes; found under UBSan).
func.func @huge_tokens(%x: tensor<4611686018427387904x64xbf16>, %top: tensor<4611686018427387904x2xi32>,
                       %rw: tensor<4611686018427387904x2xf32>, %wg: tensor<4x32x64xbf16>,
                       %wd: tensor<4x64x32xbf16>) -> tensor<4611686018427387904x64xbf16> {
  // expected-error @+1 {{convert-moe-to-mk: the layer's buffers are too large for 64-bit sizes (T = 4611686018427387904, top_k = 2, E = 4, padding = 8, H = 64, I = 32)}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 4611686018427387904, top_k = 2, experts = 4, ep = 1, padding = 8>
      : (tensor<4611686018427387904x64xbf16>, tensor<4611686018427387904x2xi32>, tensor<4611686018427387904x2xf32>,
         tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<4611686018427387904x64xbf16>
  return %o : tensor<4611686018427387904x64xbf16>
}

// -----

// A model size alone can be too large: E * I * H (the weights).
func.func @huge_weights(%x: tensor<8x1099511627776xbf16>, %top: tensor<8x2xi32>, %rw: tensor<8x2xf32>,
                        %wg: tensor<4x1099511627776x1099511627776xbf16>,
                        %wd: tensor<4x1099511627776x1099511627776xbf16>) -> tensor<8x1099511627776xbf16> {
  // expected-error @+1 {{convert-moe-to-mk: the layer's buffers are too large for 64-bit sizes (T = 8, top_k = 2, E = 4, padding = 8, H = 1099511627776, I = 1099511627776)}}
  %o = moe.layer %x, %top, %rw, gate %wg, up %wg, down %wd
      plan !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 1, padding = 8>
      : (tensor<8x1099511627776xbf16>, tensor<8x2xi32>, tensor<8x2xf32>, tensor<4x1099511627776x1099511627776xbf16>,
         tensor<4x1099511627776x1099511627776xbf16>, tensor<4x1099511627776x1099511627776xbf16>) -> tensor<8x1099511627776xbf16>
  return %o : tensor<8x1099511627776xbf16>
}

// -----

func.func @unfused(%x: tensor<8x64xbf16>, %top: tensor<8x2xi32>) -> !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 1, padding = 8> {
  // expected-error @+1 {{convert-moe-to-mk: 'moe.plan' must be fused first (run --moe-fuse-layer)}}
  %p = moe.plan %top : tensor<8x2xi32> -> !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 1, padding = 8>
  return %p : !moe.plan<tokens = 8, top_k = 2, experts = 4, ep = 1, padding = 8>
}

// -----

// moe.quantize compiles on its own (a quantizer function) for FP8 weights
// [E, N, K] in 128 x 128 blocks; the rest runs on the CPU target.
func.func @fp8(%w: tensor<4x64xbf16>) -> (tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>) {
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets moe.quantize takes bf16 weights [E, N, K] of static sizes, got 'tensor<4x64xbf16>'}}
  %q, %s = moe.quantize %w {block = array<i64: 1, 32>} : tensor<4x64xbf16> -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  return %q, %s : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
}

// -----

func.func @mx(%w: tensor<2x128x128xbf16>) -> (tensor<2x128x128xf8E4M3FN>, tensor<2x128x4xf8E8M0FNU>) {
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets moe.quantize takes 128 x 128 blocks with f32 scales ("fp8" weights), got a block of 1 x 32 with 'f8E8M0FNU' scales; the CPU target runs the others}}
  %q, %s = moe.quantize %w {block = array<i64: 1, 32>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x128x4xf8E8M0FNU>
  return %q, %s : tensor<2x128x128xf8E4M3FN>, tensor<2x128x4xf8E8M0FNU>
}

// -----

func.func @f32_weight(%w: tensor<2x128x128xf32>) -> (tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>) {
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets moe.quantize takes bf16 weights [E, N, K] of static sizes, got 'tensor<2x128x128xf32>'}}
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xf32> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  return %q, %s : tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
}

// -----

func.func @scales_only(%w: tensor<2x128x128xbf16>) -> tensor<2x1x1xf32> {
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets moe.quantize's results are the function's results, each returned once}}
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  return %s : tensor<2x1x1xf32>
}

// -----

func.func @twice(%w: tensor<2x128x128xbf16>) -> (tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>, tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets a function quantizes its weight once without transpose (each layout is one pair of outputs)}}
  %q2, %s2 = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  return %q, %s, %q2, %s2 : tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>, tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
}

// -----

func.func @returns_its_weight(%w: tensor<2x128x128xbf16>) -> (tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>, tensor<2x128x128xbf16>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets a function of moe.quantize ops returns their results only, not its argument or other values}}
  return %q, %s, %w : tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>, tensor<2x128x128xbf16>
}

// -----

func.func @dynamic_values(%w: tensor<2x128x128xbf16>) -> (tensor<?x128x128xf8E4M3FN>, tensor<2x1x1xf32>) {
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets moe.quantize's results have static sizes, got 'tensor<?x128x128xf8E4M3FN>'}}
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<?x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  return %q, %s : tensor<?x128x128xf8E4M3FN>, tensor<2x1x1xf32>
}

// -----

// expected-error @+1 {{convert-moe-to-mk: on the GPU targets a function of moe.quantize ops takes one argument, the bf16 weight they quantize; @two takes 2}}
func.func @two(%w: tensor<2x128x128xbf16>, %v: tensor<2x128x128xbf16>) -> (tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>) {
  %q, %s = moe.quantize %w {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  return %q, %s : tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
}

// -----

func.func @with_other_ops(%w: tensor<2x128x128xbf16>, %q0: tensor<2x128x128xf8E4M3FN>, %s0: tensor<2x1x1xf32>) -> tensor<2x128x128xf32> {
  // expected-error @+1 {{convert-moe-to-mk: 'moe.dequantize' (FP8) is not supported by the GPU targets yet; the CPU target runs it (--moe-to-cpu)}}
  %d = moe.dequantize %q0, %s0 {block = array<i64: 128, 128>} : tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32> -> tensor<2x128x128xf32>
  return %d : tensor<2x128x128xf32>
}

// -----

func.func @negated(%w: tensor<2x128x128xbf16>) -> (tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>) {
  // expected-error @+1 {{convert-moe-to-mk: on the GPU targets moe.quantize compiles in a function of moe.quantize ops and a return only; this one has 'arith.negf' too}}
  %n = arith.negf %w : tensor<2x128x128xbf16>
  %q, %s = moe.quantize %n {block = array<i64: 128, 128>} : tensor<2x128x128xbf16> -> tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
  return %q, %s : tensor<2x128x128xf8E4M3FN>, tensor<2x1x1xf32>
}

// -----

func.func @moe_layer(%x: tensor<?x64xbf16>, %top: tensor<?x2xi32>, %rw: tensor<?x2xf32>, %wg: tensor<4x32x64xbf16>, %wu: tensor<4x32x64xbf16>, %wd: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{convert-moe-to-mk: MXFP8 layers on the GPU targets need the hidden and intermediate sizes to be multiples of 128 (the scale atoms), got 64 and 32}}
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = ?, top_k = 2, experts = 4, ep = 1, padding = 1> {precision = "mxfp8"}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<4x32x64xbf16>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> tensor<?x64xbf16>
  return %out : tensor<?x64xbf16>
}
