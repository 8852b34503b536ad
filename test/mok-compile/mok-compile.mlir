// mok-compile writes the PTX and the runtime metadata of each layer, for
// both targets; unsupported layers and bad arguments are errors.
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_90a --copy-dispatch -o %t/sm90 | FileCheck %s --check-prefix=FILES
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_90a -o %t/fused | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefix=FUSED < %t/fused/qwen3_30b_a3b_moe.json
// RUN: not mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --fuse-dispatch --copy-dispatch -o %t/x 2>&1 | FileCheck %s --check-prefix=BOTH
// RUN: FileCheck %s --check-prefix=META < %t/sm90/qwen3_30b_a3b_moe.json
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_100a -o %t/sm100 | FileCheck %s --check-prefix=FILES
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_90a --profile --copy-dispatch -o %t/prof | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefix=PROFILE < %t/prof/qwen3_30b_a3b_moe.json
// RUN: mok-compile %mok_src_root/examples/deepseek-v3.mlir -o %t/ep | FileCheck %s --check-prefix=EPFILES
// RUN: FileCheck %s --check-prefix=EP < %t/ep/deepseek_v3_moe.json
// RUN: mok-compile %mok_src_root/examples/deepseek-v3.mlir --training -o %t/ep-train | FileCheck %s --check-prefix=EPTRAINFILES
// RUN: FileCheck %s --check-prefix=EPBWD < %t/ep-train/deepseek_v3_moe_backward.json
// RUN: not mok-compile %mok_src_root/examples/deepseek-v3.mlir --training --recompute -o %t/ep-recompute 2>&1 | FileCheck %s --check-prefix=EPRECOMPUTE
// RUN: not mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir 2>&1 | FileCheck %s --check-prefix=USAGE
// RUN: not mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_80 -o %t/x 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_90a --multicast -o %t/mc | FileCheck %s --check-prefix=FILES
// RUN: FileCheck %s --check-prefix=MC < %t/mc/qwen3_30b_a3b_moe.json
// RUN: FileCheck %s --check-prefix=NOMC < %t/fused/qwen3_30b_a3b_moe.json
// RUN: not mok-compile %mok_src_root/examples/qwen3-30b-a3b.mlir --chip sm_100a --multicast -o %t/x 2>&1 | FileCheck %s --check-prefix=MC100

// FILES: qwen3_30b_a3b_moe.ptx
// FILES: qwen3_30b_a3b_moe.json

// META: "cooperative": true
// META: "kernel": "qwen3_30b_a3b_moe_forward"
// META: "mok_metadata_version": 5
// Inputs say how the kernel reads them: the weights only through maps.
// META: "access": "pointer",
// META-NEXT: "dtype": "bf16",
// META-NEXT: "name": "x",
// META: "access": "tensor_maps",
// META-NEXT: "dtype": "bf16",
// META-NEXT: "name": "gate_weights",
// META: "name": "tensor_maps"
// META-NEXT: "role": "tensor_maps"
// 128-row tiles on sm_90a (padding 128): A boxes of 128 rows.
// META: "tensor_maps": [
// META-NEXT: {
// META-NEXT: "box_cols": 64,
// META-NEXT: "box_rows": 128,
// META-NEXT: "buffer": "routed_x",
// META-NEXT: "cols": 2048,
// META-NEXT: "experts": 1,
// A routed weight: one map per expert (128 of [I, H] = [768, 2048]).
// META: "buffer": "gate_weights",
// META-NEXT: "cols": 2048,
// META-NEXT: "experts": 128,
// META-NEXT: "row_stride": 2048,
// META-NEXT: "rows": 768

// --profile: the phase clock and the phase names.
// PROFILE: "name": "phase_clock",
// PROFILE-NEXT: "role": "workspace",
// PROFILE-NEXT: "shape": [
// PROFILE-NEXT: 9
// PROFILE: "phases": [
// PROFILE-NEXT: "plan: count",

// One rank of the 8-rank DeepSeek-V3 group: its exchange in the metadata
// (the group size, the receive capacity 8 * 4096 * min(8, 32) routes by
// default, the symmetric buffer a rank needs and its parameters: no epoch,
// which the kernel counts on the device).
// EPFILES: deepseek_v3_moe.ptx
// EP: "ep": 8,
// EP: "mok_metadata_version": 5,
// EP: "name": "peers",
// EP-NEXT: "role": "peers",
// EP: "name": "rank",
// EP-NEXT: "role": "rank",
// EP: "name": "symmetric",
// EP-NEXT: "role": "symmetric",
// EP-NEXT: "shape": [
// EP-NEXT: 4238345600
// EP: "recv_capacity": 262144,
// EP: "symmetric_bytes": 4238345600,
// EPTRAINFILES: deepseek_v3_moe_forward.ptx
// EPTRAINFILES: deepseek_v3_moe_backward.ptx
// EPBWD: "ep": 8,
// EPBWD: "name": "symmetric",
// EPBWD: "symmetric_layout": [
// EPBWD: "name": "recv_weights",
// EPBWD: "name": "ret_weights",
// EPRECOMPUTE: deepseek-v3.mlir:{{[0-9]+}}:{{[0-9]+}}: error: convert-moe-to-mk: a backward that recomputes the forward is not implemented with expert parallelism (ep = 8) yet; save the forward's context instead
// USAGE: mok-compile: an input file and -o OUTDIR are required
// CHIP: mok-compile: invalid compile options: chip 'sm_80' is not supported; expected sm_90a or sm_100a

// By default sm_90a fuses the dispatch into the gate/up GEMM: no routed_x
// workspace; x is read through a map of one-row boxes.
// FUSED-NOT: "routed_x"
// FUSED: "box_rows": 1,
// FUSED-NEXT: "buffer": "x",
// FUSED-NOT: "routed_x"
// BOTH: mok-compile: --dispatch, --fuse-dispatch and --copy-dispatch exclude each other

// --multicast: clusters of 2 CTAs (metadata "cluster"); the down weights'
// maps get 128-row boxes (each CTA of a pair loads one half of a 256-row
// tile's B). Without it, no "cluster" and 256-row boxes.
// MC: "cluster": 2,
// MC: "buffer": "hidden",
// MC: "box_rows": 128,
// MC-NEXT: "buffer": "down_weights",
// NOMC-NOT: "cluster"
// NOMC: "buffer": "hidden",
// NOMC: "box_rows": 256,
// NOMC-NEXT: "buffer": "down_weights",
// NOMC-NOT: "cluster"
// MC100: mok-compile: invalid compile options: multicast is implemented for sm_90a without warp-specialize only
