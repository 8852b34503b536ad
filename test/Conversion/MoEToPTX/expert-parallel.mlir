// Expert-parallel kernels through the whole GPU pipeline to PTX, for both
// targets, and CUDA's assembler accepts them. (No sm_100a GPU is available:
// ptxas is all that checks that code.)
// REQUIRES: ptxas
// The shipped DeepSeek-V3 example, one rank of 8 (wgmma and tcgen05 GEMMs,
// 128-row tiles): no spills.
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir --moe-fuse-layer --moe-to-ptx="chip=sm_90a" | %python %mok_src_root/scripts/extract-ptx.py %t/dsv3-sm90
// RUN: ptxas -arch=sm_90a -v %t/dsv3-sm90/deepseek_v3_moe_kernels.ptx -o %t/dsv3-sm90.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN
// RUN: FileCheck %s --check-prefix=PTX --input-file %t/dsv3-sm90/deepseek_v3_moe_kernels.ptx
// RUN: grep -c wgmma.mma_async %t/dsv3-sm90/deepseek_v3_moe_kernels.ptx
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir --moe-fuse-layer --moe-to-ptx="chip=sm_100a" | %python %mok_src_root/scripts/extract-ptx.py %t/dsv3-sm100
// RUN: ptxas -arch=sm_100a -v %t/dsv3-sm100/deepseek_v3_moe_kernels.ptx -o %t/dsv3-sm100.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN
// RUN: FileCheck %s --check-prefix=PTX --input-file %t/dsv3-sm100/deepseek_v3_moe_kernels.ptx
// RUN: grep -c tcgen05.mma %t/dsv3-sm100/deepseek_v3_moe_kernels.ptx
// Its training forward and backward: ptxas accepts them; on sm_100a they do
// not spill, on sm_90a at most 40 bytes (SMALL, below).
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir --moe-fuse-layer --moe-generate-backward --moe-to-ptx="chip=sm_90a" | %python %mok_src_root/scripts/extract-ptx.py %t/train-sm90
// RUN: ptxas -arch=sm_90a -v %t/train-sm90/deepseek_v3_moe_forward_kernels.ptx -o %t/tf90.cubin 2>&1 | FileCheck %s --check-prefix=SMALL
// RUN: ptxas -arch=sm_90a -v %t/train-sm90/deepseek_v3_moe_backward_kernels.ptx -o %t/tb90.cubin 2>&1 | FileCheck %s --check-prefix=SMALL
// RUN: FileCheck %s --check-prefix=BWD --input-file %t/train-sm90/deepseek_v3_moe_backward_kernels.ptx
// RUN: mok-opt %mok_src_root/examples/deepseek-v3.mlir --moe-fuse-layer --moe-generate-backward --moe-to-ptx="chip=sm_100a" | %python %mok_src_root/scripts/extract-ptx.py %t/train-sm100
// RUN: ptxas -arch=sm_100a -v %t/train-sm100/deepseek_v3_moe_forward_kernels.ptx -o %t/tf100.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN
// RUN: ptxas -arch=sm_100a -v %t/train-sm100/deepseek_v3_moe_backward_kernels.ptx -o %t/tb100.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN
// RUN: FileCheck %s --check-prefix=BWD --input-file %t/train-sm100/deepseek_v3_moe_backward_kernels.ptx
// The small layers' training kernels, both targets.
// RUN: mok-opt %S/../MoEToMK/convert-moe-to-mk-ep.mlir --moe-generate-backward --moe-to-ptx="chip=sm_90a" | %python %mok_src_root/scripts/extract-ptx.py %t/small-train-sm90
// RUN: ptxas -arch=sm_90a %t/small-train-sm90/layer_backward_kernels.ptx -o %t/stb90.cubin
// RUN: ptxas -arch=sm_90a %t/small-train-sm90/any_tokens_backward_kernels.ptx -o %t/satb90.cubin
// RUN: mok-opt %S/../MoEToMK/convert-moe-to-mk-ep.mlir --moe-generate-backward --moe-to-ptx="chip=sm_100a" | %python %mok_src_root/scripts/extract-ptx.py %t/small-train-sm100
// RUN: ptxas -arch=sm_100a %t/small-train-sm100/layer_backward_kernels.ptx -o %t/stb100.cubin
// RUN: ptxas -arch=sm_100a %t/small-train-sm100/layer_forward_kernels.ptx -o %t/stf100.cubin
// The small layers of convert-moe-to-mk-ep.mlir (64-row tiles, a fixed T
// with a shared expert and any T), both targets, and their simt twins.
// RUN: mok-opt %S/../MoEToMK/convert-moe-to-mk-ep.mlir --moe-to-ptx="chip=sm_90a" | %python %mok_src_root/scripts/extract-ptx.py %t/small-sm90
// RUN: ptxas -arch=sm_90a -v %t/small-sm90/any_tokens_kernels.ptx -o %t/a90.cubin 2>&1 | FileCheck %s --check-prefix=SMALL
// RUN: ptxas -arch=sm_90a -v %t/small-sm90/layer_kernels.ptx -o %t/l90.cubin 2>&1 | FileCheck %s --check-prefix=SMALL
// RUN: mok-opt %S/../MoEToMK/convert-moe-to-mk-ep.mlir --moe-to-ptx="chip=sm_100a" | %python %mok_src_root/scripts/extract-ptx.py %t/small-sm100
// RUN: ptxas -arch=sm_100a -v %t/small-sm100/any_tokens_kernels.ptx -o %t/a100.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN
// RUN: ptxas -arch=sm_100a -v %t/small-sm100/layer_kernels.ptx -o %t/l100.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN
// RUN: mok-opt %S/../MoEToMK/convert-moe-to-mk-ep.mlir --moe-to-ptx="chip=sm_90a tensor-cores=false" | %python %mok_src_root/scripts/extract-ptx.py %t/simt
// RUN: ptxas -arch=sm_90a -v %t/simt/layer_kernels.ptx -o %t/simt.cubin 2>&1 | FileCheck %s --check-prefix=CLEAN

// CLEAN: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// The small sm_90a layers with 64-row tiles and the sm_90a training
// kernels: their kernel-wide indices (block and warp ids, kept from the
// kernel's start) spill around the GEMMs, which use every register (their
// ep = 1 twins use 255 without spilling); at most 40 bytes.
// SMALL: {{ ([0-9]|[1-3][0-9]|40) }}bytes spill stores

// The exchange's synchronization, at system scope: three signals (release
// stores into every rank's flags), three waits (acquire loads), the
// storing threads' fences.
// PTX: .visible .entry deepseek_v3_moe_forward(
// PTX-DAG: st.release.sys.global.u64
// PTX-DAG: ld.acquire.sys.global.u64
// PTX-DAG: fence.acq_rel.sys

// The backward returns each route's router-weight gradient (an f32 store
// into the source's buffer) beside its rows.
// BWD: .visible .entry deepseek_v3_moe_backward_backward(
// BWD: st.release.sys.global.u64
