// mok-compile --training derives the training forward (which saves the
// backward context) and the backward of each layer (moe-generate-backward)
// and writes, beside the inference kernel's files, <fn>_forward.* and
// <fn>_backward.*, for both targets; CUDA's assembler accepts the PTX.
// --recompute saves no context: the backward takes none as an input.
// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: mok-compile %s --training --chip sm_90a -o %t/sm90 | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefixes=BACKWARD,CONTEXT -DCHIP=sm_90a < %t/sm90/layer_backward.json
// RUN: FileCheck %s --check-prefix=SAVING < %t/sm90/layer_forward.json
// RUN: FileCheck %s --check-prefix=INFERENCE < %t/sm90/layer.json
// RUN: ptxas -arch=sm_90a %t/sm90/layer_backward.ptx -o %t/sm90-backward.cubin
// RUN: ptxas -arch=sm_90a %t/sm90/layer_forward.ptx -o %t/sm90-forward.cubin
// RUN: mok-compile %s --training --chip sm_100a -o %t/sm100 | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefixes=BACKWARD,CONTEXT -DCHIP=sm_100a < %t/sm100/layer_backward.json
// RUN: FileCheck %s --check-prefix=SAVING < %t/sm100/layer_forward.json
// RUN: ptxas -arch=sm_100a %t/sm100/layer_backward.ptx -o %t/sm100-backward.cubin
// RUN: ptxas -arch=sm_100a %t/sm100/layer_forward.ptx -o %t/sm100-forward.cubin
// RUN: mok-compile %s --training --recompute --chip sm_90a -o %t/sm90-recompute | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefixes=BACKWARD,RECOMPUTE -DCHIP=sm_90a < %t/sm90-recompute/layer_backward.json
// RUN: FileCheck %s --check-prefix=NOSAVE < %t/sm90-recompute/layer_forward.json
// RUN: ptxas -arch=sm_90a %t/sm90-recompute/layer_backward.ptx -o %t/sm90-recompute.cubin
// RUN: mok-compile %s --training --recompute --chip sm_100a -o %t/sm100-recompute | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefixes=BACKWARD,RECOMPUTE -DCHIP=sm_100a < %t/sm100-recompute/layer_backward.json
// RUN: FileCheck %s --check-prefix=NOSAVE < %t/sm100-recompute/layer_forward.json
// RUN: ptxas -arch=sm_100a %t/sm100-recompute/layer_backward.ptx -o %t/sm100-recompute.cubin
// --warp-specialize: the training forward's GEMMs take a producer (its
// consumer warps hand each stage back on its "empty" barrier), the
// backward's none: its PTX is the one without the option.
// RUN: mok-compile %s --training --warp-specialize --chip sm_90a -o %t/sm90-ws | FileCheck %s --check-prefix=FILES
// RUN: ptxas -arch=sm_90a %t/sm90-ws/layer_forward.ptx -o %t/sm90-ws-forward.cubin
// RUN: cmp %t/sm90/layer_backward.ptx %t/sm90-ws/layer_backward.ptx
// RUN: not cmp -s %t/sm90/layer_forward.ptx %t/sm90-ws/layer_forward.ptx
// RUN: grep -c "mbarrier.arrive" %t/sm90/layer_forward.ptx | FileCheck %s --check-prefix=ARRIVES
// RUN: grep -c "mbarrier.arrive" %t/sm90-ws/layer_forward.ptx | FileCheck %s --check-prefix=ARRIVES-WS
// ARRIVES: 9
// ARRIVES-WS: 14
// --main-grads: the backward adds the weights' gradients into fp32
// outputs (Megatron's main_grad += dW; metadata "accumulate").
// RUN: mok-compile %s --training --main-grads --chip sm_90a -o %t/sm90-mg | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefix=MAINGRADS < %t/sm90-mg/layer_backward.json
// RUN: ptxas -arch=sm_90a %t/sm90-mg/layer_backward.ptx -o %t/sm90-mg.cubin
// RUN: grep -c "red.global.add.v2.f32" %t/sm90-mg/layer_backward.ptx | FileCheck %s --check-prefix=REDUCTIONS
// RUN: mok-compile %s --training --main-grads --chip sm_100a -o %t/sm100-mg | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefix=MAINGRADS < %t/sm100-mg/layer_backward.json
// RUN: ptxas -arch=sm_100a %t/sm100-mg/layer_backward.ptx -o %t/sm100-mg.cubin
// RUN: grep -c "red.global.add.f32" %t/sm100-mg/layer_backward.ptx | FileCheck %s --check-prefix=REDUCTIONS
// RUN: not mok-compile %s --main-grads --chip sm_90a -o %t/x 2>&1 | FileCheck %s --check-prefix=USAGE-MG
// MAINGRADS: "accumulate": true,
// MAINGRADS-NEXT: "dtype": "f32",
// MAINGRADS-NEXT: "name": "d_gate_weights",
// USAGE-MG: mok-compile: invalid compile options: main-grads needs training
// The additions are reductions in L2 (sm_90a: 8-byte pairs from the
// register epilogue; sm_100a: 4-byte elements from the shared one).
// REDUCTIONS: {{^[1-9][0-9]*$}}
// Without --training, only the inference kernel.
// The tensor-core training forms in the PTX: on sm_90a the backward's
// wgmmas read B N-major (imm-trans-b = 1) and, in the weight gradients, A
// M-major too (imm-trans-a = 1); the training forward stages gate and up
// through stmatrix as it does the activation (24 stmatrix a gate/up GEMM,
// 3 x the inference kernel's 8, routed and shared, and 16 a down
// projection: 80); on sm_100a the tcgen05 instruction descriptors carry
// the transpose bits (B: 0x04210490 = 69272720; A and B: 0x04218490 =
// 69305488).
// RUN: grep -c "p, 1,  1, 0,  1;" %t/sm90/layer_backward.ptx | FileCheck %s --check-prefix=TRANSB
// RUN: grep -c "p, 1,  1, 1,  1;" %t/sm90/layer_backward.ptx | FileCheck %s --check-prefix=TRANSAB
// RUN: grep -c "stmatrix" %t/sm90/layer_forward.ptx | FileCheck %s --check-prefix=STAGED
// RUN: grep -c "69272720" %t/sm100/layer_backward.ptx | FileCheck %s --check-prefix=TRANSB
// RUN: grep -c "69305488" %t/sm100/layer_backward.ptx | FileCheck %s --check-prefix=TRANSAB
// TRANSB: {{[1-9][0-9]*}}
// TRANSAB: {{[1-9][0-9]*}}
// STAGED: 80
// RUN: mok-compile %s --chip sm_90a -o %t/inference | FileCheck %s --check-prefix=NOTRAINING
// RUN: not mok-compile %s --recompute -o %t/x 2>&1 | FileCheck %s --check-prefix=USAGE
// RUN: not mok-compile %s --recompute --chip sm_90a -o %t/x 2>&1 | FileCheck %s --check-prefix=USAGE

// FILES: /layer.ptx
// FILES-NEXT: /layer.json
// FILES-NEXT: /layer_forward.ptx
// FILES-NEXT: /layer_forward.json
// FILES-NEXT: /layer_backward.ptx
// FILES-NEXT: /layer_backward.json
// FILES-EMPTY:

// NOTRAINING: /layer.ptx
// NOTRAINING-NEXT: /layer.json
// NOTRAINING-EMPTY:

// The backward kernel: its inputs are d_out, the layer's inputs and (without
// --recompute) the saved context; its outputs d_x, d_router_weights (f32)
// and the weights' gradients.
// BACKWARD: "chip": "[[CHIP]]",
// BACKWARD: "function": "layer_backward",
// BACKWARD: "kernel": "layer_backward_backward",
// BACKWARD: "params": [
// BACKWARD-NEXT: {
// BACKWARD-NEXT: "access": "pointer",
// BACKWARD-NEXT: "dtype": "bf16",
// BACKWARD-NEXT: "name": "d_out",
// BACKWARD-NEXT: "role": "input",
// BACKWARD: "name": "x",
// BACKWARD-NEXT: "role": "input",
// BACKWARD: "name": "router_weights",
// BACKWARD-NEXT: "role": "input",
// BACKWARD: "name": "shared_down_weights",
// BACKWARD-NEXT: "role": "input",

// CONTEXT: "name": "routed_x",
// CONTEXT-NEXT: "role": "input",
// CONTEXT-NEXT: "shape": [
// CONTEXT-NEXT: 332,
// CONTEXT: "name": "gate",
// CONTEXT-NEXT: "role": "input",
// CONTEXT: "name": "up",
// CONTEXT-NEXT: "role": "input",
// CONTEXT: "name": "hidden",
// CONTEXT-NEXT: "role": "input",
// CONTEXT: "name": "shared_gate",
// CONTEXT-NEXT: "role": "input",
// CONTEXT: "name": "shared_up",
// CONTEXT-NEXT: "role": "input",
// CONTEXT: "name": "shared_hidden",
// CONTEXT-NEXT: "role": "input",

// With --recompute nothing after the weights is an input: the context is
// the backward's workspace.
// RECOMPUTE-NOT: "role": "input"

// d_x is the first output, d_router_weights (f32) the second.
// BACKWARD-NOT: "role": "output"
// BACKWARD: "dtype": "bf16",
// BACKWARD-NEXT: "name": "d_x",
// BACKWARD-NEXT: "role": "output",
// BACKWARD-NEXT: "shape": [
// BACKWARD-NEXT: 40,
// BACKWARD-NEXT: 64
// BACKWARD-NOT: "role"
// BACKWARD: "dtype": "f32",
// BACKWARD-NEXT: "name": "d_router_weights",
// BACKWARD-NEXT: "role": "output",
// BACKWARD-NEXT: "shape": [
// BACKWARD-NEXT: 40,
// BACKWARD-NEXT: 2
// BACKWARD: "name": "d_gate_weights",
// BACKWARD-NEXT: "role": "output",
// BACKWARD: "name": "d_shared_down_weights",
// BACKWARD-NEXT: "role": "output",

// RECOMPUTE: "name": "routed_x",
// RECOMPUTE-NEXT: "role": "workspace",
// RECOMPUTE: "name": "gate",
// RECOMPUTE-NEXT: "role": "workspace",
// RECOMPUTE: "name": "hidden",
// RECOMPUTE-NEXT: "role": "workspace",
// RECOMPUTE: "name": "shared_hidden",
// RECOMPUTE-NEXT: "role": "workspace",
// RECOMPUTE-NOT: "role": "input"

// The training forward saves the context as outputs after `out`.
// SAVING: "kernel": "layer_forward_forward",
// SAVING: "name": "out",
// SAVING-NEXT: "role": "output",
// SAVING: "name": "routed_x",
// SAVING-NEXT: "role": "output",
// SAVING: "name": "gate",
// SAVING-NEXT: "role": "output",
// SAVING: "name": "up",
// SAVING-NEXT: "role": "output",
// SAVING: "name": "hidden",
// SAVING-NEXT: "role": "output",
// SAVING: "name": "shared_hidden",
// SAVING-NEXT: "role": "output",

// With --recompute it is the inference kernel: one output, tensor maps.
// NOSAVE: "kernel": "layer_forward_forward",
// NOSAVE: "name": "out",
// NOSAVE-NEXT: "role": "output",
// NOSAVE-NOT: "role": "output"
// NOSAVE: "role": "tensor_maps"
// NOSAVE-NOT: "role": "output"

// INFERENCE: "kernel": "layer_forward",
// INFERENCE: "name": "out",
// INFERENCE-NEXT: "role": "output",
// INFERENCE-NOT: "role": "output"

// USAGE: mok-compile: invalid compile options: recompute needs training
// USAGE: usage: mok-compile INPUT.mlir

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>,
                 %sg: tensor<128x64xbf16>, %su: tensor<128x64xbf16>, %sd: tensor<64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd shared(%sg, %su, %sd) plan !plan
      {swiglu_limit = 7.0 : f32}
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>,
         tensor<64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
