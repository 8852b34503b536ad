// mok-compile's options (mok::CompileOptions): refused by name before the
// input is read when they exclude each other or the chip does not implement
// them; --dispatch names the dispatch (--fuse-dispatch / --copy-dispatch
// are its fused / copy); --no-tensor-cores gives scalar GEMMs;
// --stages-dir writes the IR after each step of the one compile.
// RUN: rm -rf %t && mkdir -p %t
// RUN: not mok-compile %s --chip sm_80 -o %t/x 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: not mok-compile %s --chip sm_100a --dispatch fused -o %t/x 2>&1 | FileCheck %s --check-prefix=FUSED100
// RUN: not mok-compile %s --chip sm_100a --warp-specialize -o %t/x 2>&1 | FileCheck %s --check-prefix=WS100
// RUN: not mok-compile %s --multicast --warp-specialize -o %t/x 2>&1 | FileCheck %s --check-prefix=MCWS
// RUN: not mok-compile %s --no-tensor-cores --warp-specialize -o %t/x 2>&1 | FileCheck %s --check-prefix=NOTC
// RUN: not mok-compile %s --no-tensor-cores --dispatch fused -o %t/x 2>&1 | FileCheck %s --check-prefix=NOTC-FUSED
// RUN: not mok-compile %s --training --recompute --warp-specialize -o %t/x 2>&1 | FileCheck %s --check-prefix=TRAIN-WS
// RUN: not mok-compile %s --training --fuse-dispatch -o %t/x 2>&1 | FileCheck %s --check-prefix=TRAIN-FUSED
// RUN: not mok-compile %s --training --multicast -o %t/x 2>&1 | FileCheck %s --check-prefix=TRAIN-MC
// RUN: not mok-compile %s --dispatch both -o %t/x 2>&1 | FileCheck %s --check-prefix=BAD-DISPATCH
// RUN: not mok-compile %s -o %t/x --dispatch 2>&1 | FileCheck %s --check-prefix=NO-DISPATCH
// RUN: not mok-compile %s --copy-dispatch --dispatch copy -o %t/x 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not mok-compile %s --barrier-timeout-ms -5 -o %t/x 2>&1 | FileCheck %s --check-prefix=TIMEOUT
// RUN: not mok-compile %s --barrier-timeout-ms 10s -o %t/x 2>&1 | FileCheck %s --check-prefix=TIMEOUT
// RUN: not mok-compile %s -o %t/x --barrier-timeout-ms 2>&1 | FileCheck %s --check-prefix=NO-TIMEOUT
// TIMEOUT: mok-compile: --barrier-timeout-ms: expected milliseconds from 0 to 3600000, got
// NO-TIMEOUT: mok-compile: --barrier-timeout-ms needs a value (milliseconds)
// The refusals come before the input is read.
// RUN: not mok-compile %t/missing.mlir --chip sm_100a --multicast -o %t/x 2>&1 | FileCheck %s --check-prefix=MC100
// CHIP: mok-compile: invalid compile options: chip 'sm_80' is not supported; expected sm_90a or sm_100a
// CHIP: usage: mok-compile INPUT.mlir
// FUSED100: invalid compile options: fuse-dispatch is implemented for sm_90a only
// WS100: invalid compile options: warp-specialize is implemented for sm_90a (wgmma) only, not sm_100a
// MCWS: invalid compile options: multicast is implemented for sm_90a without warp-specialize only
// NOTC: invalid compile options: warp-specialize needs tensor-core GEMMs, and tensor-cores is off
// NOTC-FUSED: invalid compile options: fuse-dispatch needs tensor-core GEMMs
// TRAIN-WS: invalid compile options: warp-specialize is not implemented with recompute
// TRAIN-FUSED: invalid compile options: fuse-dispatch is not implemented for the training kernels
// TRAIN-MC: invalid compile options: multicast is not implemented for the training kernels
// BAD-DISPATCH: mok-compile: --dispatch: expected auto, fused or copy, got 'both'
// NO-DISPATCH: mok-compile: --dispatch needs a value: auto, fused or copy
// TWICE: mok-compile: --dispatch, --fuse-dispatch and --copy-dispatch exclude each other
// MC100: mok-compile: invalid compile options: multicast is implemented
// MC100-NOT: cannot open

// --dispatch copy is --copy-dispatch, --dispatch auto the default.
// RUN: mok-compile %s --copy-dispatch -o %t/copy-flag
// RUN: mok-compile %s --dispatch copy -o %t/copy
// RUN: cmp %t/copy-flag/layer.ptx %t/copy/layer.ptx
// RUN: mok-compile %s -o %t/default
// RUN: mok-compile %s --dispatch auto -o %t/auto
// RUN: cmp %t/default/layer.ptx %t/auto/layer.ptx
// RUN: FileCheck %s --check-prefix=FUSED < %t/default/layer.json
// RUN: FileCheck %s --check-prefix=COPY < %t/copy/layer.json
// FUSED-NOT: "routed_x"
// COPY: "name": "routed_x"

// --no-tensor-cores: scalar GEMMs, the weights read by pointer.
// RUN: mok-compile %s --no-tensor-cores -o %t/simt
// RUN: FileCheck %s --check-prefix=SIMT < %t/simt/layer.json
// RUN: FileCheck %s --check-prefix=TC < %t/default/layer.json
// SIMT-NOT: "tensor_maps"
// TC: "tensor_maps"

// --stages-dir: the stages of the one compile; the kernel files are the
// same as without it.
// RUN: mok-compile %s --training --stages-dir %t/stages -o %t/staged | FileCheck %s --check-prefix=FILES
// RUN: mok-compile %s --training -o %t/unstaged
// RUN: cmp %t/staged/layer_backward.ptx %t/unstaged/layer_backward.ptx
// RUN: cmp %t/staged/layer_backward.json %t/unstaged/layer_backward.json
// RUN: ls %t/stages | FileCheck %s --check-prefix=STAGES
// RUN: FileCheck %s --check-prefix=MOE < %t/stages/moe.mlir
// RUN: FileCheck %s --check-prefix=TRAINING < %t/stages/training.mlir
// RUN: FileCheck %s --check-prefix=MK < %t/stages/mk.mlir
// RUN: FileCheck %s --check-prefix=GPU < %t/stages/gpu.mlir
// RUN: FileCheck %s --check-prefix=LLVM < %t/stages/llvm.mlir
// RUN: mok-compile %s --stages-dir %t/inference-stages -o %t/inference
// RUN: ls %t/inference-stages | FileCheck %s --check-prefix=INFERENCE-STAGES
// FILES: /layer.ptx
// FILES-NOT: stages
// STAGES: gpu.mlir
// STAGES-NEXT: llvm.mlir
// STAGES-NEXT: mk.mlir
// STAGES-NEXT: moe.mlir
// STAGES-NEXT: training.mlir
// INFERENCE-STAGES: gpu.mlir
// INFERENCE-STAGES-NEXT: llvm.mlir
// INFERENCE-STAGES-NEXT: mk.mlir
// INFERENCE-STAGES-NEXT: moe.mlir
// INFERENCE-STAGES-EMPTY:
// MOE: func.func @layer(
// MOE-NOT: @layer_backward
// TRAINING: func.func @layer_forward(
// TRAINING: func.func @layer_backward(
// TRAINING: moe.layer_grad
// MK: gpu.module @layer_backward_kernels
// MK: mk.gemm
// GPU: gpu.func @layer_backward_backward(
// GPU-NOT: mk.gemm
// LLVM: #nvvm.target<O = 3, chip = "sm_90a"
// LLVM: llvm.func @layer_backward_backward(
// LLVM: nvvm.

!plan = !moe.plan<tokens = 40, top_k = 2, experts = 4, ep = 1, padding = 64>
func.func @layer(%x: tensor<40x64xbf16>, %top: tensor<40x2xi32>, %rw: tensor<40x2xf32>,
                 %wg: tensor<4x128x64xbf16>, %wu: tensor<4x128x64xbf16>, %wd: tensor<4x64x128xbf16>)
    -> tensor<40x64xbf16> {
  %o = moe.layer %x, %top, %rw, gate %wg, up %wu, down %wd plan !plan
      : (tensor<40x64xbf16>, tensor<40x2xi32>, tensor<40x2xf32>, tensor<4x128x64xbf16>,
         tensor<4x128x64xbf16>, tensor<4x64x128xbf16>) -> tensor<40x64xbf16>
  return %o : tensor<40x64xbf16>
}
