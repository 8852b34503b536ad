// RUN: mok-opt %s --convert-moe-to-mk="tensor-cores=false" | FileCheck %s
// RUN: mok-opt %s --convert-moe-to-mk="tensor-cores=false profile=true" | FileCheck %s --check-prefix=PROFILE
// RUN: mok-opt %s --convert-moe-to-mk | FileCheck %s --check-prefix=WGMMA
// RUN: mok-opt %s --convert-moe-to-mk=fp8-quantized-weights=true | FileCheck %s --check-prefix=GIVEN --implicit-check-not=mk.quantize_weights
// RUN: sed -e 's/ {precision = "fp8"}//' %s | not mok-opt --convert-moe-to-mk=fp8-quantized-weights=true 2>&1 | FileCheck %s --check-prefix=GIVEN-BF16
// RUN: not mok-opt %s --convert-moe-to-mk=chip=sm_100a 2>&1 | FileCheck %s --check-prefix=TC
// RUN: mok-opt %s --convert-moe-to-mk=warp-specialize=true | FileCheck %s --check-prefix=WS
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk=warp-specialize=true | FileCheck %s --check-prefix=WS-TRAIN
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="tensor-cores=false" | FileCheck %s --check-prefix=BWD
// RUN: mok-opt %s --moe-generate-backward --convert-moe-to-mk="tensor-cores=false fp8-quantized-weights=true" | FileCheck %s --check-prefix=GIVEN-TRAIN --implicit-check-not=mk.quantize_weights
// RUN: sed -e 's/ep = 1/ep = 2/' -e 's/4x128x256/2x128x256/g' -e 's/4x256x128/2x256x128/g' %s | not mok-opt --convert-moe-to-mk="tensor-cores=false" 2>&1 | FileCheck %s --check-prefix=EP

// The FP8 forward (precision = "fp8") on simt GEMMs: x's 1 x 128 blocks
// quantized with the plan's counting (T rows, not the k times more routed
// ones), their E4M3 rows and scales dispatched and the weights' 128 x 128
// blocks quantized in one phase, the hidden activation's 1 x 128 blocks in
// a phase of its own, and the routed GEMMs reading the E4M3 copies with
// their f32 scales (a's block-major, [K/128, R rounded to 4]; the weights'
// [E, N/128, K/128]). The rest is the bf16 plan: routing, combine.
// CHECK-LABEL: gpu.func @fp8_layer_forward(
// CHECK-SAME: %[[X:[^:]*]]: memref<40x256xbf16>, %{{[^:]*}}: memref<40x2xi32>, %{{[^:]*}}: memref<40x2xf32>,
// CHECK-SAME: %[[WG:[^:]*]]: memref<4x128x256xbf16>, %[[WU:[^:]*]]: memref<4x128x256xbf16>, %[[WD:[^:]*]]: memref<4x256x128xbf16>,
// CHECK-SAME: %[[GQ:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[GS:[^:]*]]: memref<4x1x2xf32>, %[[UQ:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[US:[^:]*]]: memref<4x1x2xf32>,
// CHECK-SAME: %[[DQ:[^:]*]]: memref<4x256x128xf8E4M3FN>, %[[DS:[^:]*]]: memref<4x2x1xf32>,
// CHECK-SAME: %[[XQ:[^:]*]]: memref<40x256xf8E4M3FN>, %[[XS:[^:]*]]: memref<2x40xf32>,
// CHECK-SAME: %[[RXQ:[^:]*]]: memref<588x256xf8E4M3FN>, %[[RXS:[^:]*]]: memref<2x588xf32>, %[[HQ:[^:]*]]: memref<588x128xf8E4M3FN>, %[[HS:[^:]*]]: memref<1x588xf32>,
// The metadata: the FP8 workspaces, of the runtime's f8e4m3 dtype.
// CHECK-SAME: {align = 16 : i64, dtype = "f8e4m3", name = "gate_q", role = "workspace", shape = array<i64: 4, 128, 256>}
// CHECK-SAME: {align = 16 : i64, dtype = "f32", name = "routed_x_scale", role = "workspace", shape = array<i64: 2, 588>}
// CHECK: mk.quantize_rows %[[X]] into %[[XQ]], %[[XS]] : memref<40x256xbf16>
// CHECK: mk.count_routes
// CHECK: mk.assign_rows
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gather %[[XQ]], %{{.*}} into %[[RXQ]] block_scales(%[[XS]] into %[[RXS]] : memref<2x40xf32> -> memref<2x588xf32>)
// CHECK-NEXT: mk.quantize_weights %[[WG]] into %[[GQ]], %[[GS]]
// CHECK-NEXT: mk.quantize_weights %[[WU]] into %[[UQ]], %[[US]]
// CHECK-NEXT: mk.quantize_weights %[[WD]] into %[[DQ]], %[[DS]]
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gemm swiglu %[[RXQ]], %[[GQ]], %[[UQ]] into %[[H:[^ ]*]] grouped(%{{[^,]*}}, %[[OFF:[^ ]*]] : {{.*}}) scales(%[[RXS]], %[[GS]], %[[US]] : {{.*}}) schedule <simt>
// CHECK-NEXT: mk.grid_barrier
// The hidden rows the experts use (offsets[E]), not the capacity's rest.
// CHECK-NEXT: mk.quantize_rows %[[H]] into %[[HQ]], %[[HS]] grouped(%[[OFF]] : memref<5xi64>)
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.gemm store %[[HQ]], %[[DQ]] into %[[RY:[^ ]*]] grouped({{.*}}) scales(%[[HS]], %[[DS]] : {{.*}}) schedule <simt>
// CHECK-NEXT: mk.grid_barrier
// CHECK-NEXT: mk.combine %[[RY]]

// Profiling names the FP8 phases.
// PROFILE: phases = ["plan: count + quantize x", "plan: scan", "plan: offsets", "plan: assign", "dispatch + quantize weights", "gate/up + SwiGLU", "quantize hidden", "down", "combine"]

// On sm_90a's tensor cores (the default): the same phases, the routed
// GEMMs on E4M3 wgmma reading the FP8 copies through tensor maps of bytes
// (boxes of 128-element rows), in tiles of 128 columns in all (gate's 64
// and up's, or down's 128) and K = 128; the routed weights read by the
// quantizer through pointers, not maps.
// WGMMA-LABEL: gpu.func @fp8_layer_forward(
// WGMMA-SAME: {access = "pointer", dtype = "bf16", name = "gate_weights"
// WGMMA-SAME: {box_cols = 128 : i64, box_rows = 128 : i64, buffer = "routed_x_q", cols = 256 : i64, experts = 1 : i64, row_stride = 256 : i64, rows = 588 : i64}
// WGMMA-SAME: {box_cols = 128 : i64, box_rows = 64 : i64, buffer = "gate_q", cols = 256 : i64, experts = 4 : i64, row_stride = 256 : i64, rows = 128 : i64}
// WGMMA-SAME: {box_cols = 128 : i64, box_rows = 64 : i64, buffer = "up_q"
// WGMMA-SAME: {box_cols = 128 : i64, box_rows = 128 : i64, buffer = "hidden_q"
// WGMMA-SAME: {box_cols = 128 : i64, box_rows = 128 : i64, buffer = "down_q"
// WGMMA: mk.quantize_rows
// WGMMA: mk.gemm swiglu %{{.*}} scales({{.*}}) schedule <wgmma, tile = [128, 64, 128], stages = 4> {maps = array<i64: 0, 1, 5>}
// WGMMA: mk.quantize_rows
// WGMMA: mk.gemm store %{{.*}} scales({{.*}}) schedule <wgmma, tile = [128, 128, 128], stages = 4> {maps = array<i64: 9, 10>}
// With fp8-quantized-weights the routed weights are inputs, quantized:
// gate_q, up_q and down_q read through their tensor maps, the scales by
// pointer; no bf16 routed weights and no weight quantization in the kernel.
// GIVEN-LABEL: gpu.func @fp8_layer_forward(
// GIVEN-SAME: %{{[^:]*}}: memref<40x2xf32>, %[[GQ:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[GS:[^:]*]]: memref<4x1x2xf32>, %{{[^:]*}}: memref<4x128x256xf8E4M3FN>, %{{[^:]*}}: memref<4x1x2xf32>, %{{[^:]*}}: memref<4x256x128xf8E4M3FN>, %{{[^:]*}}: memref<4x2x1xf32>, %{{[^:]*}}: memref<40x256xbf16>,
// GIVEN-SAME: {access = "tensor_maps", dtype = "f8e4m3", name = "gate_q", role = "input", shape = array<i64: 4, 128, 256>}, {access = "pointer", dtype = "f32", name = "gate_scale", role = "input", shape = array<i64: 4, 1, 2>}
// GIVEN: mk.gather
// GIVEN-NEXT: mk.grid_barrier
// GIVEN-NEXT: mk.gemm swiglu %{{[^,]*}}, %[[GQ]], %{{.*}} scales(%{{[^,]*}}, %[[GS]],
// GIVEN-BF16: error: convert-moe-to-mk: fp8-quantized-weights is for FP8 layers (precision = "fp8" or "mxfp8"); this layer's precision is "bf16"
// TC: error: convert-moe-to-mk: FP8 layers (precision = "fp8") on sm_100a run on scalar GEMMs only so far: compile them with tensor-cores=false (tcgen05's block-scaled FP8 is not implemented yet)
// With warp-specialize the routed GEMMs take a producer warpgroup, the
// registers moving to the two consumers; in training, the training
// forward's GEMMs do (their saves staged after the ring, as without a
// producer), and so do the backward's, in a kernel of 384 threads.
// WS: mk.gemm swiglu %{{.*}} schedule <wgmma, tile = [128, 64, 128], stages = 4, producer, registers = [224, 56]>
// WS: mk.gemm store %{{.*}} schedule <wgmma, tile = [128, 128, 128], stages = 4, producer, registers = [224, 56]>
// WS-TRAIN-LABEL: gpu.func @fp8_layer_forward_forward(
// WS-TRAIN: mk.gemm swiglu %{{.*}} saves(%{{.*}} schedule <wgmma, tile = [128, 64, 128], stages = 4, producer, registers = [224, 56]>
// WS-TRAIN: mk.gemm store %{{.*}} schedule <wgmma, tile = [128, 128, 128], stages = 4, producer, registers = [224, 56]>
// WS-TRAIN-LABEL: gpu.func @fp8_layer_backward_backward(
// WS-TRAIN-SAME: known_block_size = array<i32: 384, 1, 1>
// WS-TRAIN-COUNT-5: mk.gemm store %{{.*}} schedule <wgmma, tile = [128, 128, 128], stages = 4, producer, registers = [224, 56]>
// WS-TRAIN-NOT: mk.gemm
// The FP8 backward (docs/FP8.md's backward table), after the plan:
// d_out's row blocks, the weights quantized transposed (K-major for the
// dgrads), and the column blocks of the saved hidden rows and x's routed
// rows; then d_out's E4M3 rows dispatched and d_y's column blocks,
// gathered from d_out and the router weights (no bf16 d_y, no reverse
// combine); the down dgrad (f32) and the down weights'
// gradient (k_groups, both scales [K/128, S]); the SwiGLU backward; d_gate
// and d_up in row and column blocks; the gate/up dgrad (concat, the two
// K-loops with their own scales) and the gate and up weights' gradients.
// The training forward quantizes x's T rows with the counting and
// dispatches their E4M3 rows and scales beside the bf16 rows it saves
// (routed_x): no quantization of the routed rows.
// BWD-LABEL: gpu.func @fp8_layer_forward_forward(
// BWD-SAME: %[[X:[^:]*]]: memref<40x256xbf16>
// BWD: mk.quantize_rows %[[X]] into %[[XQ:[^,]*]], %[[XS:[^ ]*]] : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<2x40xf32>
// BWD: mk.count_routes
// BWD: mk.gather %[[XQ]], %{{[^,]*}}, %{{[^ ]*}} into %[[RXQ:[^ ]*]] block_scales(%[[XS]] into %[[RXS:[^ ]*]] :
// BWD-NEXT: mk.gather %[[X]], %{{[^,]*}}, %{{[^ ]*}} into %{{[^ ]*}} {top_k = 2 : i64} : memref<40x256xbf16>, memref<588xi64>, memref<5xi64> -> memref<588x256xbf16>
// BWD-NOT: mk.quantize_rows %{{[^ ]*}} into %[[RXQ]]
// BWD: mk.gemm swiglu %[[RXQ]], {{.*}} scales(%[[RXS]],
// BWD-LABEL: gpu.func @fp8_layer_backward_backward(
// BWD-SAME: %[[DOUT:[^:]*]]: memref<40x256xbf16>, %{{[^:]*}}: memref<40x256xbf16>, %{{[^:]*}}: memref<40x2xi32>, %[[RW:[^:]*]]: memref<40x2xf32>
// BWD-NOT: name = "d_y"
// BWD: mk.assign_rows %{{[^,]*}}, %[[OFF:[^,]*]], %{{[^ ]*}} into %{{[^,]*}}, %[[RR:[^,]*]], %{{[^ ]*}} {
// BWD: mk.grid_barrier
// BWD-NEXT: mk.quantize_rows %[[DOUT]] into %[[DOUTQ:[^,]*]], %[[DOUTS:[^ ]*]] : memref<40x256xbf16> -> memref<40x256xf8E4M3FN>, memref<2x40xf32>
// BWD-NEXT: mk.quantize_weights %{{[^ ]*}} into %[[GQT:[^,]*]], %[[GST:[^ ]*]] transposed : memref<4x128x256xbf16> -> memref<4x256x128xf8E4M3FN>, memref<4x2x1xf32>
// BWD-NEXT: mk.quantize_weights %{{[^ ]*}} into %[[UQT:[^,]*]], %[[UST:[^ ]*]] transposed
// BWD-NEXT: mk.quantize_weights %{{[^ ]*}} into %[[DQT:[^,]*]], %[[DST:[^ ]*]] transposed : memref<4x256x128xbf16> -> memref<4x128x256xf8E4M3FN>, memref<4x1x2xf32>
// BWD-NEXT: mk.quantize_columns %{{[^ ]*}} into %[[HT:[^,]*]], %[[HTS:[^ ]*]] routed(%[[RR]], %[[OFF]] : memref<588xi64>, memref<5xi64>) : memref<588x128xbf16> -> memref<128x640xf8E4M3FN>, memref<5x128xf32>
// BWD-NEXT: mk.quantize_columns %{{[^ ]*}} into %[[XT:[^,]*]], %[[XTS:[^ ]*]] routed(%[[RR]], %[[OFF]] : memref<588xi64>, memref<5xi64>) : memref<588x256xbf16> -> memref<256x640xf8E4M3FN>, memref<5x256xf32>
// BWD-NEXT: mk.grid_barrier
// BWD-NEXT: mk.gather %[[DOUTQ]], %[[RR]], %[[OFF]] into %[[RDQ:[^ ]*]] block_scales(%[[DOUTS]] into %[[RDS:[^ ]*]] : memref<2x40xf32> -> memref<2x588xf32>)
// BWD-NEXT: mk.quantize_columns %[[DOUT]] into %[[DYT:[^,]*]], %[[DYTS:[^ ]*]] routed(%[[RR]], %[[OFF]] : memref<588xi64>, memref<5xi64>) gathered(%[[RW]] : memref<40x2xf32>) : memref<40x256xbf16> -> memref<256x640xf8E4M3FN>, memref<5x256xf32>
// BWD-NEXT: mk.grid_barrier
// BWD-NEXT: mk.gemm store %[[RDQ]], %[[DQT]] into %[[DHU:[^ ]*]] grouped(%{{[^,]*}}, %[[OFF]] : memref<588xi64>, memref<5xi64>) scales(%[[RDS]], %[[DST]] : memref<2x588xf32>, memref<4x1x2xf32>) schedule <simt> : memref<588x256xf8E4M3FN>, memref<4x128x256xf8E4M3FN> -> memref<588x128xf32>
// BWD-NEXT: mk.gemm store %[[DYT]], %[[HT]] into %{{[^ ]*}} k_groups(%[[OFF]] : memref<5xi64>) k_counts(%{{[^ ]*}} : memref<4xi64>) scales(%[[DYTS]], %[[HTS]] : memref<5x256xf32>, memref<5x128xf32>) schedule <simt> : memref<256x640xf8E4M3FN>, memref<128x640xf8E4M3FN> -> memref<4x256x128xbf16>
// BWD-NEXT: mk.grid_barrier
// BWD-NEXT: mk.swiglu_grad %[[DHU]], {{.*}} into %[[DG:[^,]*]], %[[DU:[^ ]*]] routes(
// BWD-NEXT: mk.grid_barrier
// BWD-NEXT: mk.quantize_rows %[[DG]] into %[[DGQ:[^,]*]], %[[DGS:[^ ]*]] grouped(%{{.*}} : memref<5xi64>) : memref<588x128xbf16> -> memref<588x128xf8E4M3FN>, memref<1x588xf32>
// BWD-NEXT: mk.quantize_columns %[[DG]] into %[[DGT:[^,]*]], %[[DGTS:[^ ]*]] routed(
// BWD-NEXT: mk.quantize_rows %[[DU]] into %[[DUQ:[^,]*]], %[[DUS:[^ ]*]] grouped(
// BWD-NEXT: mk.quantize_columns %[[DU]] into %[[DUT:[^,]*]], %[[DUTS:[^ ]*]] routed(
// BWD-NEXT: mk.grid_barrier
// BWD-NEXT: mk.gemm store %[[DGQ]], %[[GQT]], %[[UQT]] into %{{[^ ]*}} grouped(%{{[^)]*}}) concat(%[[DUQ]] : memref<588x128xf8E4M3FN>) scales(%[[DGS]], %[[DUS]], %[[GST]], %[[UST]] :
// BWD-NEXT: mk.gemm store %[[DGT]], %[[XT]] into %{{[^ ]*}} k_groups(%[[OFF]] : memref<5xi64>) k_counts(%{{[^ ]*}} : memref<4xi64>) scales(%[[DGTS]], %[[XTS]] :
// BWD-NEXT: mk.gemm store %[[DUT]], %[[XT]] into %{{[^ ]*}} k_groups(%[[OFF]] : memref<5xi64>) k_counts(%{{[^ ]*}} : memref<4xi64>) scales(%[[DUTS]], %[[XTS]] :
// BWD-NEXT: mk.grid_barrier
// BWD-NEXT: mk.combine
// Training with fp8-quantized-weights: both kernels take the routed
// weights quantized in both layouts (mok.ops.fp8_quantize(w, True,
// True)), the same inputs in the same order: the forward's GEMMs read the
// normal one, the backward's dgrads the transposed one; no bf16 routed
// weights, no weight quantizer in either kernel.
// GIVEN-TRAIN-LABEL: gpu.func @fp8_layer_forward_forward(
// GIVEN-TRAIN-SAME: %{{[^:]*}}: memref<40x2xf32>, %[[FGQ:[^:]*]]: memref<4x128x256xf8E4M3FN>, %{{[^:]*}}: memref<4x1x2xf32>, %{{[^:]*}}: memref<4x128x256xf8E4M3FN>, %{{[^:]*}}: memref<4x1x2xf32>, %{{[^:]*}}: memref<4x256x128xf8E4M3FN>, %{{[^:]*}}: memref<4x2x1xf32>, %{{[^:]*}}: memref<4x256x128xf8E4M3FN>, %{{[^:]*}}: memref<4x2x1xf32>, %{{[^:]*}}: memref<4x256x128xf8E4M3FN>, %{{[^:]*}}: memref<4x2x1xf32>, %{{[^:]*}}: memref<4x128x256xf8E4M3FN>, %{{[^:]*}}: memref<4x1x2xf32>, %{{[^:]*}}: memref<40x256xbf16>,
// GIVEN-TRAIN-SAME: name = "gate_q", role = "input"
// GIVEN-TRAIN-SAME: name = "gate_qt", role = "input"
// GIVEN-TRAIN-SAME: name = "down_scale_t", role = "input"
// GIVEN-TRAIN: mk.gemm swiglu %{{[^,]*}}, %[[FGQ]],
// GIVEN-TRAIN-LABEL: gpu.func @fp8_layer_backward_backward(
// GIVEN-TRAIN-SAME: %{{[^:]*}}: memref<40x2xf32>, %{{[^:]*}}: memref<4x128x256xf8E4M3FN>, %{{[^:]*}}: memref<4x1x2xf32>, %{{[^:]*}}: memref<4x128x256xf8E4M3FN>, %{{[^:]*}}: memref<4x1x2xf32>, %{{[^:]*}}: memref<4x256x128xf8E4M3FN>, %{{[^:]*}}: memref<4x2x1xf32>, %[[BGQT:[^:]*]]: memref<4x256x128xf8E4M3FN>, %[[BGST:[^:]*]]: memref<4x2x1xf32>, %[[BUQT:[^:]*]]: memref<4x256x128xf8E4M3FN>, %[[BUST:[^:]*]]: memref<4x2x1xf32>, %[[BDQT:[^:]*]]: memref<4x128x256xf8E4M3FN>, %[[BDST:[^:]*]]: memref<4x1x2xf32>, %{{[^:]*}}: memref<588x256xbf16>,
// GIVEN-TRAIN-SAME: name = "gate_q", role = "input"
// GIVEN-TRAIN-SAME: name = "gate_qt", role = "input"
// GIVEN-TRAIN: mk.quantize_rows
// GIVEN-TRAIN-NEXT: mk.quantize_columns
// GIVEN-TRAIN: mk.gemm store %{{[^,]*}}, %[[BDQT]] into %{{.*}} scales(%{{[^,]*}}, %[[BDST]] :
// GIVEN-TRAIN: mk.gemm store %{{[^,]*}}, %[[BGQT]], %[[BUQT]] into %{{.*}} scales(%{{[^,]*}}, %{{[^,]*}}, %[[BGST]], %[[BUST]] :
// EP: error: convert-moe-to-mk: expert-parallel FP8 layers are not supported by the GPU targets yet; the CPU target runs them (--moe-to-cpu)
func.func @fp8_layer(%x: tensor<40x256xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>, %wg: tensor<4x128x256xbf16>, %wu: tensor<4x128x256xbf16>, %wd: tensor<4x256x128xbf16>) -> tensor<40x256xbf16> {
  %out = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd
      plan !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 128> {precision = "fp8"}
      : (tensor<40x256xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x256xbf16>, tensor<4x128x256xbf16>, tensor<4x256x128xbf16>) -> tensor<40x256xbf16>
  return %out : tensor<40x256xbf16>
}
