// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The runtime's host logic — argument checks, weight-view arithmetic, the
// expert-parallel check, handles, and the behaviour without a CUDA driver —
// tested on any machine. MOK_CUDA_DRIVER is pointed at a library that does
// not exist, so the driver-missing path is tested on GPU machines too; the
// driver's calls and their failures are tested in a child process against
// a stand-in driver (driver_test.cpp, FakeCuda.cpp).
//
#include "mok/Runtime/mok_runtime.h"

#include "Check.h"
#include "TensorMaps.h" // internal: the slot address arithmetic

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int passed = 0, failed = 0;

void check(bool cond, const char *what, int line) {
  if (cond) {
    ++passed;
    return;
  }
  ++failed;
  std::printf("FAILED line %d: %s (last error: %s)\n", line, what,
              mok_last_error());
}

alignas(64) static unsigned char memory[1 << 16];

static void testTensorChecks() {
  int64_t shape[2] = {4, 64};
  mok_tensor x = mok_tensor_contiguous(memory, MOK_DTYPE_BF16, 2, shape);
  CHECK(x.strides[0] == 64 && x.strides[1] == 1);
  CHECK(mok_tensor_check(&x, "x", MOK_DTYPE_BF16, 2, shape) == MOK_OK);
  CHECK(std::string(mok_last_error()).empty());
  int64_t anyRows[2] = {-1, 64};
  CHECK(mok_tensor_check(&x, "x", MOK_DTYPE_BF16, 2, anyRows) == MOK_OK);

  CHECK_FAILS(mok_tensor_check(&x, "x", MOK_DTYPE_F32, 2, shape),
              MOK_ERROR_INVALID_ARGUMENT, "x: expected dtype f32, got bf16 [4, 64]");
  int64_t other[2] = {4, 32};
  CHECK_FAILS(mok_tensor_check(&x, "x", MOK_DTYPE_BF16, 2, other),
              MOK_ERROR_INVALID_ARGUMENT, "x: expected shape [4, 32], got [4, 64]");
  int64_t three[3] = {4, 64, 1};
  CHECK_FAILS(mok_tensor_check(&x, "x", MOK_DTYPE_BF16, 3, three),
              MOK_ERROR_INVALID_ARGUMENT, "x: expected rank 3");
  CHECK_FAILS(mok_tensor_check(nullptr, "router_weights", MOK_DTYPE_F32, 2, shape),
              MOK_ERROR_INVALID_ARGUMENT, "router_weights: is NULL");

  mok_tensor strided = x;
  strided.strides[1] = 2;
  CHECK_FAILS(mok_tensor_check(&strided, "x", MOK_DTYPE_BF16, 2, shape),
              MOK_ERROR_INVALID_ARGUMENT, "innermost dimension must be contiguous");
  mok_tensor misaligned = x;
  misaligned.data = memory + 2;
  CHECK_FAILS(mok_tensor_check(&misaligned, "x", MOK_DTYPE_BF16, 2, shape),
              MOK_ERROR_INVALID_ARGUMENT, "x: data must be 16-byte aligned");
  mok_tensor oddRows = x;
  oddRows.strides[0] = 65;
  CHECK_FAILS(mok_tensor_check(&oddRows, "x", MOK_DTYPE_BF16, 2, shape),
              MOK_ERROR_INVALID_ARGUMENT, "stride of dimension 0 must be a multiple of 16 bytes");
  mok_tensor null = x;
  null.data = nullptr;
  CHECK_FAILS(mok_tensor_check(&null, "x", MOK_DTYPE_BF16, 2, shape),
              MOK_ERROR_INVALID_ARGUMENT, "x: data is NULL");
}

static void testWeightViews() {
  // A contiguous [E=3, I=8, H=16] tensor.
  int64_t shape[3] = {3, 8, 16};
  mok_tensor t = mok_tensor_contiguous(memory, MOK_DTYPE_BF16, 3, shape);
  mok_expert_weights w;
  CHECK(mok_weights_from_tensor(&t, "gate", &w) == MOK_OK);
  CHECK(w.layout == MOK_WEIGHTS_STRIDED && w.experts == 3 && w.rows == 8 &&
        w.cols == 16 && w.expert_stride == 128 && w.row_stride == 16);
  uintptr_t a;
  CHECK(mok_weights_element_address(&w, 2, 5, 7, &a) == MOK_OK);
  CHECK(a == reinterpret_cast<uintptr_t>(memory) + (2 * 128 + 5 * 16 + 7) * 2);
  CHECK(mok_weights_check(&w, "gate", MOK_DTYPE_BF16, 3, 8, 16) == MOK_OK);
  CHECK_FAILS(mok_weights_check(&w, "gate", MOK_DTYPE_BF16, 3, 4, 16),
              MOK_ERROR_INVALID_ARGUMENT, "gate: expected [E, rows, cols] = [3, 4, 16], got [3, 8, 16]");
  CHECK_FAILS(mok_weights_element_address(&w, 3, 0, 0, &a),
              MOK_ERROR_INVALID_ARGUMENT, "element (3, 0, 0) is outside [3, 8, 16]");

  // A fused FC1 [E=3, 2I=8, H=16]: gate rows [0, 4), up rows [4, 8), no copy.
  mok_expert_weights gate, up;
  CHECK(mok_weights_split_fc1(&t, "fc1", &gate, &up) == MOK_OK);
  CHECK(gate.rows == 4 && up.rows == 4 && gate.expert_stride == 128 &&
        up.expert_stride == 128);
  uintptr_t g, u, whole;
  CHECK(mok_weights_element_address(&gate, 1, 3, 9, &g) == MOK_OK);
  mok_weights_element_address(&w, 1, 3, 9, &whole);
  CHECK(g == whole);
  CHECK(mok_weights_element_address(&up, 1, 3, 9, &u) == MOK_OK);
  mok_weights_element_address(&w, 1, 4 + 3, 9, &whole);
  CHECK(u == whole);
  int64_t odd[3] = {3, 7, 16};
  mok_tensor oddFc1 = mok_tensor_contiguous(memory, MOK_DTYPE_BF16, 3, odd);
  oddFc1.strides[1] = 16; // keep rows 16-byte aligned
  oddFc1.strides[0] = 7 * 16;
  CHECK_FAILS(mok_weights_split_fc1(&oddFc1, "fc1", &gate, &up),
              MOK_ERROR_INVALID_ARGUMENT, "fc1: a fused FC1 [E, 2*I, H] needs an even row count, got 7");

  // One allocation per expert.
  void *ptrs[2] = {memory + 4096, memory + 1024};
  mok_expert_weights per;
  CHECK(mok_weights_per_expert(ptrs, 2, 8, 16, 16, MOK_DTYPE_BF16, "down", &per) == MOK_OK);
  CHECK(mok_weights_element_address(&per, 1, 2, 3, &a) == MOK_OK);
  CHECK(a == reinterpret_cast<uintptr_t>(memory + 1024) + (2 * 16 + 3) * 2);
  void *bad[2] = {memory + 4096, memory + 1025};
  CHECK_FAILS(mok_weights_per_expert(bad, 2, 8, 16, 16, MOK_DTYPE_BF16, "down", &per),
              MOK_ERROR_INVALID_ARGUMENT, "down: expert 1's pointer must be non-NULL and 16-byte aligned");
  CHECK_FAILS(mok_weights_per_expert(ptrs, 2, 8, 16, 12, MOK_DTYPE_BF16, "down", &per),
              MOK_ERROR_INVALID_ARGUMENT, "down: row_stride 12 is less than cols 16");
  CHECK_FAILS(mok_weights_per_expert(ptrs, 2, 8, 12, 12, MOK_DTYPE_BF16, "down", &per),
              MOK_ERROR_INVALID_ARGUMENT, "down: row_stride must be a multiple of 16 bytes");
}

// Stands for an ncclComm_t: the group checks never dereference it.
static void *const kComm = memory + 4096;

static void testExpertParallelGroup() {
  mok_ep_group one{1, 0, nullptr};
  CHECK(mok_ep_group_check(&one) == MOK_OK);
  mok_ep_group eight{8, 3, kComm};
  CHECK(mok_ep_group_check(&eight) == MOK_OK);
  mok_ep_group noComm{8, 3, nullptr};
  CHECK_FAILS(mok_ep_group_check(&noComm), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: expert parallelism (size 8) needs an NCCL communicator, "
              "got nccl_comm NULL");
  mok_ep_group bad{2, 2, kComm};
  CHECK_FAILS(mok_ep_group_check(&bad), MOK_ERROR_INVALID_ARGUMENT,
              "expected 0 <= rank < size, got rank 2 of size 2");
  mok_ep_group empty{0, 0, nullptr};
  CHECK_FAILS(mok_ep_group_check(&empty), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: expected 0 <= rank < size, got rank 0 of size 0");
  mok_ep_group negative{4, -1, kComm};
  CHECK_FAILS(mok_ep_group_check(&negative), MOK_ERROR_INVALID_ARGUMENT,
              "got rank -1 of size 4");
  CHECK_FAILS(mok_ep_group_check(nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: is NULL");
}

static void testWithoutDriver() {
  int available = -1, count = -1;
  CHECK(mok_driver_probe(&available, &count) == MOK_OK);
  CHECK(available == 0 && count == 0);
  CHECK(std::strstr(mok_last_error(), "/nonexistent/libcuda.so.1") != nullptr);
  mok_module m = nullptr;
  CHECK_FAILS(mok_module_load_ptx(0, ".version 8.0\n", &m),
              MOK_ERROR_DRIVER_UNAVAILABLE, "the CUDA driver could not be loaded");
  CHECK(m == nullptr);
  alignas(64) unsigned char descriptor[128];
  CHECK_FAILS(mok_tma_descriptor_2d(descriptor, memory, 64, 64, 64, 64, 64),
              MOK_ERROR_DRIVER_UNAVAILABLE, "the CUDA driver could not be loaded");
  // Argument errors are reported before the driver is needed.
  CHECK_FAILS(mok_tma_descriptor_2d(descriptor, memory, 64, 64, 64, 64, 128),
              MOK_ERROR_INVALID_ARGUMENT, "box [64, 128] must have at most 256 rows and 128 bytes a row (128B swizzle), 64 bf16 elements");
  CHECK_FAILS(mok_tma_descriptor_2d_typed(descriptor, memory, MOK_DTYPE_F8E4M3, 64, 256, 256, 64, 256),
              MOK_ERROR_INVALID_ARGUMENT, "box [64, 256] must have at most 256 rows and 128 bytes a row (128B swizzle), 128 f8e4m3 elements");
  CHECK_FAILS(mok_tma_descriptor_2d_typed(descriptor, memory, MOK_DTYPE_F32, 64, 64, 64, 64, 32),
              MOK_ERROR_INVALID_ARGUMENT, "dtype: expected bf16 or f8e4m3, got f32");
  // An FP8 row stride is in bytes: 8 elements are not 16-byte aligned.
  CHECK_FAILS(mok_tma_descriptor_2d_typed(descriptor, memory, MOK_DTYPE_F8E4M3, 4, 8, 8, 4, 8),
              MOK_ERROR_INVALID_ARGUMENT, "data and row_stride must be 16-byte aligned for TMA");
  CHECK_FAILS(mok_module_load_ptx(0, "", &m), MOK_ERROR_INVALID_ARGUMENT,
              "ptx: is empty");
  // Cluster launches and their occupancy: the arguments are checked before
  // the module.
  uint32_t grid[3] = {2, 1, 1}, odd[3] = {3, 1, 1}, block[3] = {256, 1, 1};
  CHECK_FAILS(mok_module_launch_clusters(nullptr, "k", nullptr, block, 2, 0,
                                         nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT, "kernel/grid/block: is NULL");
  CHECK_FAILS(mok_module_launch_clusters(nullptr, "k", grid, block, 0, 0,
                                         nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT,
              "cluster: expected 1 to 8 CTAs a cluster, got 0");
  CHECK_FAILS(mok_module_launch_clusters(nullptr, "k", grid, block, 16, 0,
                                         nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT, "got 16");
  CHECK_FAILS(mok_module_launch_clusters(nullptr, "k", odd, block, 2, 0,
                                         nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT,
              "grid: grid[0] = 3 is not a multiple of the cluster's 2 CTAs");
  CHECK_FAILS(mok_module_launch_clusters(nullptr, "k", grid, block, 2, 0,
                                         nullptr, nullptr, 4),
              MOK_ERROR_INVALID_ARGUMENT, "flags: unknown bits 0x4");
  CHECK_FAILS(mok_module_launch_clusters(nullptr, "k", grid, block, 2, 0,
                                         nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT, "module: is NULL");
  // mok_module_launch is the same with clusters of 1.
  CHECK_FAILS(
      mok_module_launch(nullptr, "k", grid, block, 0, nullptr, nullptr, 0),
      MOK_ERROR_INVALID_ARGUMENT, "module: is NULL");
  int clusters = -1;
  CHECK_FAILS(mok_module_max_active_clusters(nullptr, "k", 256, 2, 0, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "kernel/count: is NULL");
  CHECK_FAILS(
      mok_module_max_active_clusters(nullptr, "k", 256, 9, 0, &clusters),
      MOK_ERROR_INVALID_ARGUMENT,
      "cluster: expected 1 to 8 CTAs a cluster, got 9");
  CHECK_FAILS(mok_module_max_active_clusters(nullptr, "k", 0, 2, 0, &clusters),
              MOK_ERROR_INVALID_ARGUMENT,
              "block: expected 1 to 1024 threads, got 0");
  CHECK_FAILS(
      mok_module_max_active_clusters(nullptr, "k", 256, 2, 0, &clusters),
      MOK_ERROR_INVALID_ARGUMENT, "module: is NULL");
  CHECK(clusters == -1);
}

// A small layer's metadata, in the compiler's format.
static const char *kMetadata = R"({
  "mok_metadata_version": 1, "kernel": "moe_layer_forward", "block": 256,
  "cooperative": true, "dynamic_shared_memory": 0,
  "zero_before_first_launch": ["grid_barrier"],
  "params": [
    {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
    {"name": "top_experts", "role": "input", "dtype": "i32", "shape": [4, 2]},
    {"name": "router_weights", "role": "input", "dtype": "f32", "shape": [4, 2]},
    {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
    {"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},
    {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [16]}],
  "tensor_maps": [{"buffer": "x", "rows": 4, "cols": 64, "row_stride": 64,
                   "box_rows": 64, "box_cols": 64}]
})";

static void testLayerMetadata() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kMetadata, &layer) == MOK_OK);
  CHECK(mok_layer_input_count(layer) == 3);
  CHECK(std::string(mok_layer_input_name(layer, 1)) == "top_experts");
  CHECK(mok_layer_input_name(layer, 3) == nullptr);

  alignas(64) static unsigned char x[4 * 64 * 2], out[4 * 64 * 2], ids[32], rw[32];
  int64_t sx[2] = {4, 64}, sk[2] = {4, 2};
  mok_named_tensor in[3] = {
      {"router_weights", mok_tensor_contiguous(rw, MOK_DTYPE_F32, 2, sk)},
      {"x", mok_tensor_contiguous(x, MOK_DTYPE_BF16, 2, sx)},
      {"top_experts", mok_tensor_contiguous(ids, MOK_DTYPE_I32, 2, sk)}};
  mok_tensor o = mok_tensor_contiguous(out, MOK_DTYPE_BF16, 2, sx);
  CHECK(mok_layer_check(layer, in, 3, &o) == MOK_OK);
  CHECK_FAILS(mok_layer_check(layer, in, 2, &o), MOK_ERROR_INVALID_ARGUMENT,
              "inputs: 'top_experts' is missing");
  mok_named_tensor twice[3] = {in[0], in[1], in[1]};
  CHECK_FAILS(mok_layer_check(layer, twice, 3, &o), MOK_ERROR_INVALID_ARGUMENT,
              "inputs: 'x' is given twice");
  mok_named_tensor unknown[3] = {in[0], in[1], {"gate", in[2].tensor}};
  CHECK_FAILS(mok_layer_check(layer, unknown, 3, &o), MOK_ERROR_INVALID_ARGUMENT,
              "unknown input 'gate'; expected x, top_experts, router_weights");
  mok_named_tensor wrong[3] = {in[0], in[1], in[2]};
  wrong[2].tensor.dtype = MOK_DTYPE_I64;
  CHECK_FAILS(mok_layer_check(layer, wrong, 3, &o), MOK_ERROR_INVALID_ARGUMENT,
              "top_experts: expected dtype i32, got i64");
  mok_named_tensor transposed[3] = {in[0], in[1], in[2]};
  int64_t sT[2] = {4, 64};
  transposed[1].tensor = mok_tensor_contiguous(x, MOK_DTYPE_BF16, 2, sT);
  transposed[1].tensor.strides[0] = 128; // rows with a gap: not dense
  CHECK_FAILS(mok_layer_check(layer, transposed, 3, &o), MOK_ERROR_INVALID_ARGUMENT,
              "x: expected a dense row-major tensor; dimension 0 has stride 128, expected 64");
  mok_tensor small = o;
  small.shape[0] = 3;
  CHECK_FAILS(mok_layer_check(layer, in, 3, &small), MOK_ERROR_INVALID_ARGUMENT,
              "out: expected shape [4, 64], got [3, 64]");
  // One output: it is `out`, not a named tensor, and it may not overlap an
  // input.
  CHECK(mok_layer_output_count(layer) == 1);
  CHECK(std::string(mok_layer_output_name(layer, 0)) == "out");
  CHECK(mok_layer_output_name(layer, 1) == nullptr);
  mok_named_tensor named[4] = {in[0], in[1], in[2], {"out", o}};
  CHECK_FAILS(mok_layer_check(layer, named, 4, &o), MOK_ERROR_INVALID_ARGUMENT,
              "inputs[3]: 'out' is the layer's first output: pass it as `out`");
  mok_tensor overX = mok_tensor_contiguous(x, MOK_DTYPE_BF16, 2, sx);
  CHECK_FAILS(mok_layer_check(layer, in, 3, &overX), MOK_ERROR_INVALID_ARGUMENT,
              "out: 'out' (bytes [0x");
  CHECK(std::strstr(mok_last_error(), ") overlaps the input 'x' ([0x") !=
        nullptr);
  CHECK_FAILS(mok_layer_forward(layer, in, 3, &o, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "layer: not loaded (call mok_layer_load first)");
  CHECK_FAILS(mok_layer_load(layer, 0, ".version 8.0\n"), MOK_ERROR_DRIVER_UNAVAILABLE,
              "the CUDA driver could not be loaded");
  mok_layer_destroy(layer);

  struct { const char *json, *message; } bad[] = {
      {"{", "metadata: not JSON (offset 1: expected a member name)"},
      {"[1, 2]", "metadata: not a JSON object"},
      {R"({"mok_metadata_version": 6})", "expected mok_metadata_version 1 to 5"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0})", "metadata: missing or mistyped 'params'"},
      // Version 4: a kernel for any token count.
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
           {"name": "x", "role": "input", "dtype": "bf16", "shape": [8, 64],
            "call_rows": [1, 0]}]})",
       "metadata: params[0] ('x'): 'call_rows' in a kernel for one token count"},
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
           {"name": "tokens", "role": "tokens", "dtype": "i64", "shape": []}]})",
       "metadata: params[0]: role 'tokens' in a kernel for one token count"},
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "any_tokens": true, "max_tokens": 8, "params": [
           {"name": "x", "role": "input", "dtype": "bf16", "shape": [9, 64],
            "call_rows": [1, 0]}]})",
       "metadata: params[0] ('x'): 'call_rows' [1, 0] at max_tokens = 8 is not its 9 rows"},
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "any_tokens": true, "max_tokens": 8, "params": [
           {"name": "x", "role": "input", "dtype": "bf16", "shape": [8, 64],
            "call_rows": [0, 8]}]})",
       "metadata: params[0] ('x'): 'call_rows' must be [scale >= 1, offset >= 0]"},
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "any_tokens": true, "max_tokens": 8, "params": [
           {"name": "tokens", "role": "tokens", "dtype": "i32", "shape": []}]})",
       "metadata: params[0]: the call's token count (role 'tokens') must be an i64"},
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "any_tokens": true, "max_tokens": 8, "params": [
           {"name": "x", "role": "input", "dtype": "bf16", "shape": [8, 64],
            "call_rows": [1, 0]},
           {"name": "out", "role": "output", "dtype": "bf16", "shape": [8, 64]}]})",
       "metadata: a kernel for any token count without a parameter of role 'tokens'"},
      {R"({"mok_metadata_version": 4, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "any_tokens": true, "max_tokens": 0, "params": []})",
       "metadata: 'max_tokens' must be an integer >= 1"},
      // Version 3: CTAs per cluster, 1 to 8.
      {R"({"mok_metadata_version": 3, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "cluster": 0, "params": []})",
       "metadata: 'cluster' must be an integer >= 1"},
      {R"({"mok_metadata_version": 3, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "cluster": 9, "params": []})",
       "metadata: 'cluster' must be at most 8 CTAs"},
      {R"({"mok_metadata_version": 3, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0, "cluster": "2", "params": []})",
       "metadata: missing or mistyped 'cluster'"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 0, "cooperative": true,
           "dynamic_shared_memory": 0, "params": []})", "'block' must be an integer >= 1"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "x", "role": "input", "dtype": "f16", "shape": [4]}]})",
       "metadata: params[0]: unknown dtype 'f16'"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "x", "role": "scratch", "dtype": "bf16", "shape": [4]}]})",
       "metadata: params[0]: unknown role 'scratch'"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "x", "role": "input", "dtype": "bf16", "shape": [4]}]})",
       "metadata: no parameter has role 'output'"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "o", "role": "output", "dtype": "bf16", "shape": [4]}],
           "tensor_maps": [{"buffer": "w", "rows": 1, "cols": 64, "row_stride": 64,
                            "box_rows": 1, "box_cols": 64}]})",
       "metadata: tensor map of unknown buffer 'w'"},
      // Integers out of what the fields they land in hold (a uint32_t
      // block, int64 byte sizes): refused, never truncated or overflowed.
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 4294967328, "cooperative": true,
           "dynamic_shared_memory": 0, "params": []})",
       "metadata: 'block' must be an integer >= 1 and <= 1024"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 4294967296, "params": []})",
       "'dynamic_shared_memory' must be an integer >= 0 and <= 4294967295"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 1e300, "cooperative": true,
           "dynamic_shared_memory": 0, "params": []})",
       "'block' must be an integer >= 1 and <= 1024"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "o", "role": "output", "dtype": "bf16", "shape": [1e30]}]})",
       "metadata: params[0]: shape entries must be integers >= 0 and <= 2^53"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "o", "role": "output", "dtype": "bf16",
              "shape": [2147483648, 2147483648]}]})",
       "metadata: params[0] ('o'): bf16 [2147483648, 2147483648] holds more than "
       "2^62 bytes"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "o", "role": "output", "dtype": "bf16", "shape": [4, 64]},
             {"name": "m", "role": "tensor_maps", "dtype": "i64", "shape": [16]}],
           "tensor_maps": [{"buffer": "o", "rows": 4, "cols": 64, "row_stride": 64,
                            "box_rows": 4, "box_cols": 4294967360}]})",
       "metadata: tensor_maps[0]: 'box_cols' must be an integer >= 1 and <= 256"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 32, "cooperative": true,
           "dynamic_shared_memory": 0, "params": [
             {"name": "o", "role": "output", "dtype": "bf16", "shape": [4, 64]},
             {"name": "m", "role": "tensor_maps", "dtype": "i64", "shape": [16]}],
           "tensor_maps": [{"buffer": "o", "rows": 9007199254740992, "cols": 64,
                            "row_stride": 9007199254740992, "box_rows": 4,
                            "box_cols": 64}]})",
       "metadata: tensor_maps[0] ('o'): 1 x [9007199254740992, 64] with row stride "
       "9007199254740992 ends at element past 2^63, past the buffer's 256"},
  };
  for (auto &b : bad) {
    mok_layer l = nullptr;
    CHECK_FAILS(mok_layer_create(b.json, &l), MOK_ERROR_INVALID_ARGUMENT, "");
    check(std::strstr(mok_last_error(), b.message) != nullptr, b.message, __LINE__);
    CHECK(l == nullptr);
  }
}

// Huge dimensions next to an empty one: a buffer of no bytes, accepted
// (its element count is never formed as a product that overflows).
static void testEmptyHugeBuffer() {
  mok_layer l = nullptr;
  CHECK(mok_layer_create(R"({"mok_metadata_version": 1, "kernel": "k", "block": 32,
      "cooperative": false, "dynamic_shared_memory": 0, "params": [
        {"name": "o", "role": "output", "dtype": "f32", "shape": [4]},
        {"name": "w", "role": "workspace", "dtype": "f32",
         "shape": [9007199254740992, 9007199254740992, 0]}]})", &l) == MOK_OK);
  size_t bytes = 1;
  CHECK(mok_layer_workspace_size(l, "w", &bytes) == MOK_OK && bytes == 0);
  mok_layer_destroy(l);
}

// kMetadata with a top-level "ep" (what the compiler will emit for an
// expert-parallel layer), `ep` as JSON text.
// For ep = 4, metadata version 5 with the exchange's buffer and params.
static std::string withEp(const std::string &ep) {
  std::string s = "{\"ep\": " + ep + "," + std::string(kMetadata).substr(1);
  if (ep != "4")
    return s;
  s.replace(s.find("\"mok_metadata_version\": 1"), 25,
            "\"mok_metadata_version\": 5, \"symmetric_bytes\": 4096");
  s.insert(s.find("{\"name\": \"grid_barrier\""),
           R"({"name": "peers", "role": "peers", "dtype": "i64", "shape": [4]},
    {"name": "rank", "role": "rank", "dtype": "i32", "shape": []},
    {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": []},
    {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [4096]},
    )");
  return s;
}

static bool sameGroup(mok_layer layer, int32_t size, int32_t rank, void *comm) {
  mok_ep_group g{-1, -1, nullptr};
  return mok_layer_ep_group(layer, &g) == MOK_OK && g.size == size &&
         g.rank == rank && g.nccl_comm == comm;
}

// A layer's expert-parallel group: the default, what is refused and how,
// and a compiled "ep" the group must match.
static void testLayerExpertParallelGroup() {
  alignas(64) static unsigned char x[4 * 64 * 2], out[4 * 64 * 2], ids[32], rw[32];
  int64_t sx[2] = {4, 64}, sk[2] = {4, 2};
  mok_named_tensor in[3] = {
      {"x", mok_tensor_contiguous(x, MOK_DTYPE_BF16, 2, sx)},
      {"top_experts", mok_tensor_contiguous(ids, MOK_DTYPE_I32, 2, sk)},
      {"router_weights", mok_tensor_contiguous(rw, MOK_DTYPE_F32, 2, sk)}};
  mok_tensor o = mok_tensor_contiguous(out, MOK_DTYPE_BF16, 2, sx);

  // Metadata without "ep": compiled for ep = 1, in the default group.
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kMetadata, &layer) == MOK_OK);
  int32_t ep = -1;
  CHECK(mok_layer_ep_size(layer, &ep) == MOK_OK && ep == 1);
  CHECK(sameGroup(layer, 1, 0, nullptr));
  mok_ep_group one{1, 0, nullptr};
  CHECK(mok_layer_set_ep_group(layer, &one) == MOK_OK);
  CHECK(std::string(mok_last_error()).empty());
  // Size 1 with a communicator: accepted, kept (nothing to exchange).
  mok_ep_group oneWithComm{1, 0, kComm};
  CHECK(mok_layer_set_ep_group(layer, &oneWithComm) == MOK_OK);
  CHECK(sameGroup(layer, 1, 0, kComm));
  CHECK(mok_layer_check(layer, in, 3, &o) == MOK_OK);

  // Size > 1: refused by name, pointing at communicators; a refused group
  // leaves the previous one.
  mok_ep_group eight{8, 3, kComm};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &eight), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 8: a layer joins an expert-parallel group through "
              "a communicator (mok_comm_create or mok_comm_adopt, then "
              "mok_layer_bind_comm); mok_layer_set_ep_group sets size 1 only");
  CHECK(sameGroup(layer, 1, 0, kComm));
  mok_ep_group two{2, 1, kComm};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &two), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 2: a layer joins");
  // Argument errors come first, as mok_ep_group_check reports them.
  mok_ep_group noComm{2, 0, nullptr};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &noComm), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: expert parallelism (size 2) needs an NCCL communicator, "
              "got nccl_comm NULL");
  mok_ep_group badRank{2, 2, kComm};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &badRank), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: expected 0 <= rank < size, got rank 2 of size 2");
  mok_ep_group badRankOne{1, 1, nullptr};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &badRankOne), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: expected 0 <= rank < size, got rank 1 of size 1");
  mok_ep_group zero{0, 0, nullptr};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &zero), MOK_ERROR_INVALID_ARGUMENT,
              "got rank 0 of size 0");
  CHECK(sameGroup(layer, 1, 0, kComm));
  // NULL: back to the default group.
  CHECK(mok_layer_set_ep_group(layer, nullptr) == MOK_OK);
  CHECK(sameGroup(layer, 1, 0, nullptr));

  // NULL arguments.
  CHECK_FAILS(mok_layer_set_ep_group(nullptr, &one), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is NULL");
  CHECK_FAILS(mok_layer_ep_group(nullptr, &one), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is NULL");
  CHECK_FAILS(mok_layer_ep_group(layer, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "group: is NULL");
  CHECK_FAILS(mok_layer_ep_size(nullptr, &ep), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is NULL");
  CHECK_FAILS(mok_layer_ep_size(layer, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "size: is NULL");
  mok_layer_destroy(layer);

  // "ep": 1 is the same as no "ep".
  layer = nullptr;
  CHECK(mok_layer_create(withEp("1").c_str(), &layer) == MOK_OK);
  CHECK(mok_layer_ep_size(layer, &ep) == MOK_OK && ep == 1);
  CHECK(mok_layer_set_ep_group(layer, &one) == MOK_OK);
  CHECK(mok_layer_check(layer, in, 3, &o) == MOK_OK);
  mok_layer_destroy(layer);

  // Compiled for ep = 4 (hand-written, version 5, without the layer's
  // other parameters). The default group does not match:
  // setting size 1 is refused naming both sizes, and so are checks and
  // forwards of the layer until a communicator is bound (comm_test.cpp).
  layer = nullptr;
  CHECK(mok_layer_create(withEp("4").c_str(), &layer) == MOK_OK);
  CHECK(mok_layer_ep_size(layer, &ep) == MOK_OK && ep == 4);
  CHECK(sameGroup(layer, 1, 0, nullptr));
  CHECK_FAILS(mok_layer_set_ep_group(layer, &one), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 1, but this layer was compiled for ep = 4 (the "
              "metadata's \"ep\"); the group's size must be the compiled one: "
              "bind a communicator of 4 ranks with mok_layer_bind_comm");
  CHECK_FAILS(mok_layer_set_ep_group(layer, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 1, but this layer was compiled for ep = 4");
  mok_ep_group four{4, 2, kComm};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &four), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 4: a layer joins an expert-parallel group");
  CHECK(sameGroup(layer, 1, 0, nullptr));
  CHECK_FAILS(mok_layer_check(layer, in, 3, &o), MOK_ERROR_INVALID_ARGUMENT,
              "layer: compiled for ep = 4 (expert parallelism), but no "
              "communicator is bound (bind one of 4 ranks with "
              "mok_layer_bind_comm)");
  CHECK_FAILS(mok_layer_forward(layer, in, 3, &o, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "layer: not loaded (call mok_layer_load first)");
  mok_layer_destroy(layer);

  // A malformed "ep" is a metadata error.
  struct { std::string ep; const char *message; } bad[] = {
      {"0", "metadata: 'ep' must be an integer >= 1"},
      {"-2", "metadata: 'ep' must be an integer >= 1"},
      {"1.5", "metadata: 'ep' must be an integer >= 1"},
      {"\"8\"", "metadata: missing or mistyped 'ep'"},
      {"4294967296", "metadata: 'ep' must be at most 2147483647"},
  };
  for (auto &b : bad) {
    mok_layer l = nullptr;
    CHECK_FAILS(mok_layer_create(withEp(b.ep).c_str(), &l),
                MOK_ERROR_INVALID_ARGUMENT, "");
    check(std::strstr(mok_last_error(), b.message) != nullptr, b.message, __LINE__);
    CHECK(l == nullptr);
  }
}

// Where each CUtensorMap slot reads: dense tensors, weight views.
static void testTensorMapSlots() {
  using mok::runtime::MapSlot;
  uintptr_t base = reinterpret_cast<uintptr_t>(memory);
  // A dense [E=2, 8, 64] tensor, one slot per expert: 8*64 elements apart.
  std::vector<MapSlot> slots;
  mok::runtime::appendDenseSlots(base, 2, 2, 8, 64, slots);
  CHECK(slots.size() == 2);
  CHECK(slots[0] == (MapSlot{base, 64}));
  CHECK(slots[1] == (MapSlot{base + 8 * 64 * 2, 64}));
  // One slot over a whole buffer, after what is there: appends.
  mok::runtime::appendDenseSlots(base + 4096, 2, 1, 16, 72, slots);
  CHECK(slots.size() == 3 && slots[2] == (MapSlot{base + 4096, 72}));

  // A fused FC1 [E=3, 2I=16, H=64]: gate at base + e*2*I*H, up at
  // base + I*H + e*2*I*H elements, rows H apart.
  int64_t shape[3] = {3, 16, 64};
  mok_tensor fc1 = mok_tensor_contiguous(memory, MOK_DTYPE_BF16, 3, shape);
  mok_expert_weights gate, up;
  CHECK(mok_weights_split_fc1(&fc1, "fc1", &gate, &up) == MOK_OK);
  std::vector<MapSlot> g, u;
  mok::runtime::appendViewSlots(gate, 3, g);
  mok::runtime::appendViewSlots(up, 3, u);
  CHECK(g.size() == 3 && u.size() == 3);
  for (int64_t e = 0; e < 3; ++e) {
    CHECK(g[e] == (MapSlot{base + e * 2 * 8 * 64 * 2, 64}));
    CHECK(u[e] == (MapSlot{base + (8 * 64 + e * 2 * 8 * 64) * 2, 64}));
    uintptr_t a = 0;
    CHECK(mok_weights_element_address(&up, e, 0, 0, &a) == MOK_OK && a == u[e].address);
  }
  // One allocation per expert, in table order (not address order), with the
  // view's row stride.
  void *table[2] = {memory + 8192, memory + 2048};
  mok_expert_weights per;
  CHECK(mok_weights_per_expert(table, 2, 8, 64, 72, MOK_DTYPE_BF16, "w", &per) == MOK_OK);
  std::vector<MapSlot> p;
  mok::runtime::appendViewSlots(per, 2, p);
  CHECK(p.size() == 2 && p[0] == (MapSlot{base + 8192, 72}) &&
        p[1] == (MapSlot{base + 2048, 72}));
  // A new row stride at the same address is a different slot: rebinding a
  // view with other strides rebuilds the descriptors.
  CHECK(p[0] != (MapSlot{base + 8192, 64}));
}

// Builds a metadata object of the compiler's format around params and maps.
static std::string layerJson(int version, const std::string &params,
                             const std::string &maps) {
  return "{\"mok_metadata_version\": " + std::to_string(version) +
         ", \"kernel\": \"k\", \"block\": 256, \"cooperative\": true,"
         " \"dynamic_shared_memory\": 0, \"params\": [" + params + "]" +
         (maps.empty() ? "" : ", \"tensor_maps\": [" + maps + "]") + "}";
}

// A tensor-core layer (version 2): gate/up read through one map per expert,
// down through one map over the whole tensor, plus a shared expert.
static const char *kWeightParams = R"(
    {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
    {"name": "top_experts", "role": "input", "dtype": "i32", "shape": [4, 2]},
    {"name": "router_weights", "role": "input", "dtype": "f32", "shape": [4, 2],
     "access": "pointer"},
    {"name": "gate_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64],
     "access": "tensor_maps"},
    {"name": "up_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64],
     "access": "tensor_maps"},
    {"name": "down_weights", "role": "input", "dtype": "bf16", "shape": [2, 64, 8],
     "access": "tensor_maps"},
    {"name": "shared_gate_weights", "role": "input", "dtype": "bf16", "shape": [16, 64],
     "access": "tensor_maps"},
    {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
    {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [112]})";
static const char *kWeightMaps = R"(
    {"buffer": "x", "rows": 4, "cols": 64, "row_stride": 64, "box_rows": 64, "box_cols": 64},
    {"buffer": "gate_weights", "rows": 8, "cols": 64, "row_stride": 64,
     "box_rows": 64, "box_cols": 64, "experts": 2},
    {"buffer": "up_weights", "rows": 8, "cols": 64, "row_stride": 64,
     "box_rows": 64, "box_cols": 64, "experts": 2},
    {"buffer": "down_weights", "rows": 128, "cols": 8, "row_stride": 8,
     "box_rows": 64, "box_cols": 8},
    {"buffer": "shared_gate_weights", "rows": 16, "cols": 64, "row_stride": 64,
     "box_rows": 64, "box_cols": 64})";

static void testWeightMetadata() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(layerJson(2, kWeightParams, kWeightMaps).c_str(), &layer) == MOK_OK);
  CHECK(mok_layer_input_count(layer) == 7);
  mok_layer_destroy(layer);
  // Version 1 reads the new keys alike (they default to version 1's meaning).
  layer = nullptr;
  CHECK(mok_layer_create(layerJson(1, kWeightParams, kWeightMaps).c_str(), &layer) == MOK_OK);
  mok_layer_destroy(layer);

  const std::string out =
      R"({"name": "out", "role": "output", "dtype": "bf16", "shape": [4]})";
  const std::string w =
      R"({"name": "w", "role": "input", "dtype": "bf16", "shape": [2, 8, 64], "access": "tensor_maps"})";
  const std::string maps16 =
      R"({"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [16]})";
  const std::string maps32 =
      R"({"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [32]})";
  const std::string perExpert =
      R"({"buffer": "w", "rows": 8, "cols": 64, "row_stride": 64, "box_rows": 8, "box_cols": 64, "experts": 2})";
  struct { std::string json; const char *message; } bad[] = {
      {layerJson(2, R"({"name": "x", "role": "input", "dtype": "bf16", "shape": [4], "access": "texture"}, )" + out, ""),
       "metadata: params[0] ('x'): unknown access 'texture' (expected 'pointer' or 'tensor_maps')"},
      {layerJson(2, R"({"name": "x", "role": "input", "dtype": "bf16", "shape": [4], "access": 1}, )" + out, ""),
       "metadata: params[0] ('x'): missing or mistyped 'access'"},
      {layerJson(2, w + ", " + out + ", " + maps32,
                 R"({"buffer": "w", "rows": 8, "cols": 64, "row_stride": 64, "box_rows": 8, "box_cols": 64, "experts": 0})"),
       "metadata: tensor_maps[0]: 'experts' must be an integer >= 1"},
      {layerJson(2, w + ", " + out + ", " + maps32,
                 R"({"buffer": "w", "rows": 8, "cols": 64, "row_stride": 64, "box_rows": 8, "box_cols": 64, "experts": 1.5})"),
       "metadata: tensor_maps[0]: 'experts' must be an integer >= 1"},
      // Two slots in a buffer of one.
      {layerJson(2, w + ", " + out + ", " + maps16, perExpert),
       "metadata: the tensor_maps entries need 2 CUtensorMap slots (128 bytes, 16 i64 each), but the 'tensor_maps' parameter holds 16 i64 elements (128 bytes)"},
      {layerJson(2, w + ", " + out, perExpert),
       "metadata: the tensor_maps entries need 2 CUtensorMap slots, but no parameter has role 'tensor_maps'"},
      {layerJson(2, out + ", " + maps16, ""),
       "metadata: the tensor_maps entries need 0 CUtensorMap slots"},
      {layerJson(2, out + ", " + maps16 + ", " + maps16, ""),
       "metadata: more than one parameter has role 'tensor_maps'"},
      {layerJson(2, w + ", " + out, ""),
       "metadata: params[0] ('w'): access 'tensor_maps' but no tensor_maps entry views it"},
      // Three experts of a two-expert tensor: TMA would read past it.
      {layerJson(2, w + ", " + out + R"(, {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [48]})",
                 R"({"buffer": "w", "rows": 8, "cols": 64, "row_stride": 64, "box_rows": 8, "box_cols": 64, "experts": 3})"),
       "metadata: tensor_maps[0] ('w'): 3 x [8, 64] with row stride 64 ends at element 1536, past the buffer's 1024"},
      {layerJson(2, w + ", " + out + ", " + maps16,
                 R"({"buffer": "w", "rows": 8, "cols": 64, "row_stride": 32, "box_rows": 8, "box_cols": 64})"),
       "metadata: tensor_maps[0] ('w'): row_stride 32 is less than cols 64"},
      {layerJson(2, R"({"name": "ids", "role": "input", "dtype": "i32", "shape": [64]}, )" + out + ", " + maps16,
                 R"({"buffer": "ids", "rows": 1, "cols": 64, "row_stride": 64, "box_rows": 1, "box_cols": 64})"),
       "metadata: tensor_maps[0] ('ids'): tensor maps are bf16 or f8e4m3, the buffer is i32"},
      // A bf16 box of 128 columns is 256 bytes a row: twice a swizzle row.
      {layerJson(2, w + ", " + out + ", " + maps16,
                 R"({"buffer": "w", "rows": 8, "cols": 64, "row_stride": 64, "box_rows": 8, "box_cols": 128})"),
       "metadata: tensor_maps[0] ('w'): box_cols 128 of bf16 is more than the 128 bytes of a swizzled box row"},
  };
  for (auto &b : bad) {
    mok_layer l = nullptr;
    CHECK_FAILS(mok_layer_create(b.json.c_str(), &l), MOK_ERROR_INVALID_ARGUMENT, "");
    check(std::strstr(mok_last_error(), b.message) != nullptr, b.message, __LINE__);
    CHECK(l == nullptr);
  }
}

// The named inputs of the weight layer but gate/up; `dense` adds them.
struct WeightInputs {
  alignas(64) unsigned char x[4 * 64 * 2], ids[32], rw[32], out[4 * 64 * 2];
  alignas(64) unsigned char gate[2 * 8 * 64 * 2], up[2 * 8 * 64 * 2];
  alignas(64) unsigned char down[2 * 64 * 8 * 2], shared[16 * 64 * 2];
  std::vector<mok_named_tensor> named(bool gateUp, bool withDown = true) {
    int64_t sx[2] = {4, 64}, sk[2] = {4, 2}, sw[3] = {2, 8, 64}, sd[3] = {2, 64, 8},
            ss[2] = {16, 64};
    std::vector<mok_named_tensor> in = {
        {"x", mok_tensor_contiguous(x, MOK_DTYPE_BF16, 2, sx)},
        {"top_experts", mok_tensor_contiguous(ids, MOK_DTYPE_I32, 2, sk)},
        {"router_weights", mok_tensor_contiguous(rw, MOK_DTYPE_F32, 2, sk)},
        {"shared_gate_weights", mok_tensor_contiguous(shared, MOK_DTYPE_BF16, 2, ss)}};
    if (withDown)
      in.push_back({"down_weights", mok_tensor_contiguous(down, MOK_DTYPE_BF16, 3, sd)});
    if (gateUp) {
      in.push_back({"gate_weights", mok_tensor_contiguous(gate, MOK_DTYPE_BF16, 3, sw)});
      in.push_back({"up_weights", mok_tensor_contiguous(up, MOK_DTYPE_BF16, 3, sw)});
    }
    return in;
  }
  mok_tensor output() {
    int64_t sx[2] = {4, 64};
    return mok_tensor_contiguous(out, MOK_DTYPE_BF16, 2, sx);
  }
};

static void testBindWeights() {
  static WeightInputs t;
  mok_tensor o = t.output();
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(layerJson(2, kWeightParams, kWeightMaps).c_str(), &layer) == MOK_OK);
  // A fused FC1 [E=2, 2I=16, H=64], gate and up halves, no copy.
  int64_t sf[3] = {2, 16, 64};
  mok_tensor fc1 = mok_tensor_contiguous(memory + 8192, MOK_DTYPE_BF16, 3, sf);
  mok_expert_weights gate, up;
  CHECK(mok_weights_split_fc1(&fc1, "fc1", &gate, &up) == MOK_OK);

  CHECK_FAILS(mok_layer_bind_weights(nullptr, "gate_weights", &gate),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  CHECK_FAILS(mok_layer_bind_weights(layer, nullptr, &gate),
              MOK_ERROR_INVALID_ARGUMENT, "name: is NULL");
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate", &gate), MOK_ERROR_INVALID_ARGUMENT,
              "name: unknown input 'gate'; expected x, top_experts, router_weights, gate_weights");
  CHECK_FAILS(mok_layer_bind_weights(layer, "out", &gate), MOK_ERROR_INVALID_ARGUMENT,
              "name: unknown input 'out'");
  CHECK_FAILS(mok_layer_bind_weights(layer, "x", &gate), MOK_ERROR_INVALID_ARGUMENT,
              "'x': not a routed expert weight operand (weight views stand in for [E, rows, cols] weights; this input is bf16 [4, 64])");
  CHECK_FAILS(mok_layer_bind_weights(layer, "shared_gate_weights", &gate),
              MOK_ERROR_INVALID_ARGUMENT, "'shared_gate_weights': not a routed expert weight operand");
  CHECK_FAILS(mok_layer_bind_weights(layer, "down_weights", &gate), MOK_ERROR_INVALID_ARGUMENT,
              "'down_weights': this layer's kernel reads it through a tensor map over the whole tensor, not one per expert");

  // Views that do not fit the operand or TMA; each names the operand.
  mok_expert_weights v = gate;
  v.dtype = MOK_DTYPE_F32;
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': expected dtype bf16, got f32");
  v = gate;
  v.rows = 4;
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': expected [E, rows, cols] = [2, 8, 64], got [2, 4, 64]");
  v = gate;
  v.experts = 3;
  CHECK_FAILS(mok_layer_bind_weights(layer, "up_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'up_weights': expected [E, rows, cols] = [2, 8, 64], got [3, 8, 64]");
  v = gate;
  v.row_stride = 68;
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': row_stride must be a multiple of 8 elements (16 bytes, for TMA), got 68");
  v.row_stride = 56;
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': row_stride 56 is less than cols 64");
  v = gate;
  v.base = memory + 8192 + 8;
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': the base (expert 0's) must be non-NULL and 16-byte aligned (TMA)");
  v = gate;
  v.expert_stride = 1028;
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': expert_stride must be a multiple of 8 elements");
  // A per-expert view built by hand past mok_weights_per_expert's checks.
  void *misaligned[2] = {memory + 16384, memory + 20480 + 8};
  mok_expert_weights per{};
  per.layout = MOK_WEIGHTS_PER_EXPERT;
  per.dtype = MOK_DTYPE_BF16;
  per.experts = 2, per.rows = 8, per.cols = 64, per.row_stride = 64;
  per.expert_pointers = misaligned;
  CHECK_FAILS(mok_layer_bind_weights(layer, "up_weights", &per), MOK_ERROR_INVALID_ARGUMENT,
              "'up_weights': expert 1's base must be non-NULL and 16-byte aligned (TMA)");
  per.expert_pointers = nullptr;
  CHECK_FAILS(mok_layer_bind_weights(layer, "up_weights", &per), MOK_ERROR_INVALID_ARGUMENT,
              "'up_weights': the per-expert pointer table is NULL");

  // Before binding, gate/up are required; once bound, not, and refused.
  std::vector<mok_named_tensor> without = t.named(false), with = t.named(true);
  CHECK(mok_layer_check(layer, with.data(), with.size(), &o) == MOK_OK);
  CHECK_FAILS(mok_layer_check(layer, without.data(), without.size(), &o),
              MOK_ERROR_INVALID_ARGUMENT, "inputs: 'gate_weights' is missing");
  CHECK(mok_layer_bind_weights(layer, "gate_weights", &gate) == MOK_OK);
  CHECK(std::string(mok_last_error()).empty());
  CHECK_FAILS(mok_layer_check(layer, without.data(), without.size(), &o),
              MOK_ERROR_INVALID_ARGUMENT, "inputs: 'up_weights' is missing");
  // The caller's table is copied: clobbering it after the call changes
  // nothing (were it kept, expert 0's NULL would make 'up_weights' missing).
  void *table[2] = {memory + 16384, memory + 20480};
  mok_expert_weights w;
  CHECK(mok_weights_per_expert(table, 2, 8, 64, 64, MOK_DTYPE_BF16, "up", &w) == MOK_OK);
  CHECK(mok_layer_bind_weights(layer, "up_weights", &w) == MOK_OK);
  table[0] = table[1] = nullptr;
  CHECK(mok_layer_check(layer, without.data(), without.size(), &o) == MOK_OK);
  CHECK_FAILS(mok_layer_check(layer, with.data(), with.size(), &o), MOK_ERROR_INVALID_ARGUMENT,
              "inputs: 'gate_weights' is bound as a weight view (mok_layer_bind_weights); do not pass it too");
  // Bound operands do not excuse the others.
  std::vector<mok_named_tensor> noDown = t.named(false, false);
  CHECK_FAILS(mok_layer_check(layer, noDown.data(), noDown.size(), &o),
              MOK_ERROR_INVALID_ARGUMENT, "inputs: 'down_weights' is missing");
  // A refused view leaves the bound one.
  v = up;
  v.rows = 4;
  CHECK_FAILS(mok_layer_bind_weights(layer, "up_weights", &v), MOK_ERROR_INVALID_ARGUMENT,
              "'up_weights': expected [E, rows, cols]");
  CHECK(mok_layer_check(layer, without.data(), without.size(), &o) == MOK_OK);
  // Forward still needs a loaded layer; binding needed no driver.
  CHECK_FAILS(mok_layer_forward(layer, without.data(), without.size(), &o, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");

  // Unbinding restores the requirement; unbinding what is not bound is a no-op.
  CHECK(mok_layer_bind_weights(layer, "gate_weights", nullptr) == MOK_OK);
  CHECK_FAILS(mok_layer_check(layer, without.data(), without.size(), &o),
              MOK_ERROR_INVALID_ARGUMENT, "inputs: 'gate_weights' is missing");
  CHECK(mok_layer_bind_weights(layer, "up_weights", nullptr) == MOK_OK);
  CHECK(mok_layer_check(layer, with.data(), with.size(), &o) == MOK_OK);
  CHECK(mok_layer_bind_weights(layer, "x", nullptr) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate", nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "name: unknown input 'gate'");
  mok_layer_destroy(layer);

  // One map of expert 0's size but a single slot: not one map per expert.
  layer = nullptr;
  CHECK(mok_layer_create(layerJson(2,
      R"({"name": "gate_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64],
          "access": "tensor_maps"},
         {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
         {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [16]})",
      R"({"buffer": "gate_weights", "rows": 8, "cols": 64, "row_stride": 64,
          "box_rows": 8, "box_cols": 64})").c_str(), &layer) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &gate), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': this layer's kernel reads it through a tensor map over the whole tensor, not one per expert");
  mok_layer_destroy(layer);

  // A scalar-GEMM layer (no tensor maps) reads its weights by pointer.
  layer = nullptr;
  CHECK(mok_layer_create(layerJson(1,
      R"({"name": "gate_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64]},
         {"name": "up_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64], "access": "pointer"},
         {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]})", "").c_str(),
      &layer) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate_weights", &gate), MOK_ERROR_INVALID_ARGUMENT,
              "'gate_weights': this layer's kernel reads it by pointer (scalar GEMM path); weight views need a kernel with tensor-core GEMMs");
  CHECK_FAILS(mok_layer_bind_weights(layer, "up_weights", &up), MOK_ERROR_INVALID_ARGUMENT,
              "'up_weights': this layer's kernel reads it by pointer (scalar GEMM path)");
  mok_layer_destroy(layer);
}

// A training forward's kernel: the output first, then extra outputs (saved
// context; a backward's f32 d_router_weights; one without elements), with a
// routed weight read through per-expert maps (so it can take a view).
static const char *kOutputParams = R"(
    {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
    {"name": "top_experts", "role": "input", "dtype": "i32", "shape": [4, 2]},
    {"name": "router_weights", "role": "input", "dtype": "f32", "shape": [4, 2]},
    {"name": "gate_weights", "role": "input", "dtype": "bf16", "shape": [2, 8, 64],
     "access": "tensor_maps"},
    {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
    {"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},
    {"name": "gate", "role": "output", "dtype": "bf16", "shape": [8, 16]},
    {"name": "d_router_weights", "role": "output", "dtype": "f32", "shape": [4, 2]},
    {"name": "empty", "role": "output", "dtype": "bf16", "shape": [0, 16]},
    {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [32]})";
static const char *kOutputMaps = R"(
    {"buffer": "gate_weights", "rows": 8, "cols": 64, "row_stride": 64,
     "box_rows": 8, "box_cols": 64, "experts": 2})";

// The operands of that layer at byte offsets of `memory`; `at` moves one.
struct OutputArgs {
  size_t x = 0, ids = 512, rw = 576, gw = 1024, out = 3072, gate = 3584,
         drw = 3840, empty = 3072; // no elements: never overlaps
  std::vector<mok_named_tensor> named() const {
    int64_t sx[2] = {4, 64}, sk[2] = {4, 2}, sw[3] = {2, 8, 64},
            sg[2] = {8, 16}, se[2] = {0, 16};
    return {
        {"gate", mok_tensor_contiguous(memory + gate, MOK_DTYPE_BF16, 2, sg)},
        {"x", mok_tensor_contiguous(memory + x, MOK_DTYPE_BF16, 2, sx)},
        {"top_experts",
         mok_tensor_contiguous(memory + ids, MOK_DTYPE_I32, 2, sk)},
        {"d_router_weights",
         mok_tensor_contiguous(memory + drw, MOK_DTYPE_F32, 2, sk)},
        {"router_weights",
         mok_tensor_contiguous(memory + rw, MOK_DTYPE_F32, 2, sk)},
        {"empty", mok_tensor_contiguous(memory + empty, MOK_DTYPE_BF16, 2, se)},
        {"gate_weights",
         mok_tensor_contiguous(memory + gw, MOK_DTYPE_BF16, 3, sw)}};
  }
  mok_tensor output() const {
    int64_t sx[2] = {4, 64};
    return mok_tensor_contiguous(memory + out, MOK_DTYPE_BF16, 2, sx);
  }
};

static std::vector<mok_named_tensor> without(std::vector<mok_named_tensor> in,
                                             const std::string &name) {
  std::vector<mok_named_tensor> kept;
  for (const mok_named_tensor &t : in)
    if (name != t.name)
      kept.push_back(t);
  return kept;
}

// "[0x<begin>, 0x<end>)" of `bytes` bytes at `memory + offset`.
static std::string range(size_t offset, size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[0x%llx, 0x%llx)",
                static_cast<unsigned long long>(
                    reinterpret_cast<uintptr_t>(memory + offset)),
                static_cast<unsigned long long>(
                    reinterpret_cast<uintptr_t>(memory + offset + bytes)));
  return buf;
}

// mok_layer_check fails with MOK_ERROR_INVALID_ARGUMENT saying `message`.
static void checkRefused(mok_layer layer,
                         const std::vector<mok_named_tensor> &in,
                         const mok_tensor &out, const std::string &message,
                         int line) {
  mok_status s = mok_layer_check(layer, in.data(), in.size(), &out);
  check(s == MOK_ERROR_INVALID_ARGUMENT, "mok_layer_check is refused", line);
  check(std::strstr(mok_last_error(), message.c_str()) != nullptr,
        message.c_str(), line);
}
#define CHECK_REFUSED(layer, in, out, message)                                 \
  checkRefused((layer), (in), (out), (message), __LINE__)

// Several outputs: the first is `out`, the others are passed by name among
// the named tensors; every way to get them wrong, and outputs that overlap.
static void testLayerOutputs() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(layerJson(2, kOutputParams, kOutputMaps).c_str(),
                         &layer) == MOK_OK);
  CHECK(mok_layer_input_count(layer) == 4);
  CHECK(mok_layer_output_count(layer) == 4);
  CHECK(std::string(mok_layer_output_name(layer, 0)) == "out");
  CHECK(std::string(mok_layer_output_name(layer, 1)) == "gate");
  CHECK(std::string(mok_layer_output_name(layer, 2)) == "d_router_weights");
  CHECK(std::string(mok_layer_output_name(layer, 3)) == "empty");
  CHECK(mok_layer_output_name(layer, 4) == nullptr);
  CHECK(mok_layer_output_name(layer, -1) == nullptr);
  CHECK(mok_layer_output_count(nullptr) == 0);
  CHECK(mok_layer_output_name(nullptr, 0) == nullptr);

  OutputArgs a;
  std::vector<mok_named_tensor> in = a.named();
  mok_tensor o = a.output();
  CHECK(mok_layer_check(layer, in.data(), in.size(), &o) == MOK_OK);
  CHECK(std::string(mok_last_error()).empty());
  CHECK_FAILS(mok_layer_forward(layer, in.data(), in.size(), &o, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");

  // Missing, twice, unknown (the message lists the inputs and the extra
  // outputs), the first output among the named tensors.
  CHECK_REFUSED(layer, without(in, "gate"), o,
                "outputs: 'gate' is missing (extra outputs are passed among "
                "the named tensors)");
  CHECK_REFUSED(layer, without(in, "empty"), o, "outputs: 'empty' is missing");
  CHECK_REFUSED(layer, without(in, "x"), o, "inputs: 'x' is missing");
  std::vector<mok_named_tensor> twice = in;
  twice.push_back(in[3]);
  CHECK_REFUSED(layer, twice, o, "outputs: 'd_router_weights' is given twice");
  std::vector<mok_named_tensor> unknown = in;
  unknown.push_back({"hidden", in[0].tensor});
  CHECK_REFUSED(layer, unknown, o,
                "inputs[7]: unknown input or output 'hidden'; expected the "
                "inputs x, top_experts, router_weights, gate_weights and the "
                "extra outputs gate, d_router_weights, empty (the first "
                "output, 'out', is `out`)");
  unknown.back().name = nullptr;
  CHECK_REFUSED(layer, unknown, o,
                "inputs[7]: unknown input or output '(null)'");
  unknown.back().name = "grid_barrier"; // a workspace buffer is the runtime's
  CHECK_REFUSED(layer, unknown, o, "unknown input or output 'grid_barrier'");
  std::vector<mok_named_tensor> first = in;
  first.insert(first.begin(), {"out", o});
  CHECK_REFUSED(layer, first, o,
                "inputs[0]: 'out' is the layer's first output: pass it as "
                "`out`, not among the named tensors");

  // Extra outputs are checked as inputs are, against their own dtype.
  std::vector<mok_named_tensor> wrong = in;
  wrong[3].tensor.dtype = MOK_DTYPE_BF16;
  CHECK_REFUSED(layer, wrong, o,
                "d_router_weights: expected dtype f32, got bf16 [4, 2]");
  wrong = in;
  wrong[0].tensor.shape[1] = 8;
  CHECK_REFUSED(layer, wrong, o, "gate: expected shape [8, 16], got [8, 8]");
  wrong = in;
  wrong[0].tensor.data = nullptr;
  CHECK_REFUSED(layer, wrong, o, "gate: data is NULL; expected bf16 [8, 16]");
  wrong = in;
  wrong[0].tensor.strides[0] = 32;
  CHECK_REFUSED(layer, wrong, o,
                "gate: expected a dense row-major tensor; dimension 0 has "
                "stride 32, expected 16");
  CHECK_FAILS(mok_layer_check(layer, in.data(), in.size(), nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "out: is NULL");
  CHECK_FAILS(mok_layer_check(layer, nullptr, 2, &o),
              MOK_ERROR_INVALID_ARGUMENT, "inputs: is NULL");
  mok_tensor f32Out = o;
  f32Out.dtype = MOK_DTYPE_F32;
  CHECK_FAILS(mok_layer_check(layer, in.data(), in.size(), &f32Out),
              MOK_ERROR_INVALID_ARGUMENT, "out: expected dtype bf16, got f32");

  // Overlaps, naming both tensors and their bytes. An output over an input:
  OutputArgs b = a;
  b.out = a.x + 256;
  CHECK_REFUSED(layer, b.named(), b.output(),
                "out: 'out' (bytes " + range(b.out, 512) +
                    ") overlaps the input 'x' (" + range(a.x, 512) +
                    "); an output may share memory with neither an input nor "
                    "another output");
  b = a;
  b.drw = a.rw + 16; // partly
  CHECK_REFUSED(layer, b.named(), b.output(),
                "outputs: 'd_router_weights' (bytes " + range(b.drw, 32) +
                    ") overlaps the input 'router_weights' (" +
                    range(a.rw, 32) + ")");
  b = a;
  b.gw = a.gate + 16; // a dense weight input is checked
  CHECK_REFUSED(layer, b.named(), b.output(),
                "outputs: 'gate' (bytes " + range(a.gate, 256) +
                    ") overlaps the input 'gate_weights'");
  // An output over another output (the later one is named first).
  b = a;
  b.gate = a.out + 384;
  CHECK_REFUSED(layer, b.named(), b.output(),
                "outputs: 'gate' (bytes " + range(b.gate, 256) +
                    ") overlaps the output 'out' (" + range(a.out, 512) + ")");
  b = a;
  b.drw = a.gate;
  CHECK_REFUSED(layer, b.named(), b.output(),
                "outputs: 'd_router_weights' (bytes " + range(a.gate, 32) +
                    ") overlaps the output 'gate'");
  // What does not overlap: adjacent ranges, inputs over each other (read
  // only), a tensor without elements anywhere.
  b = a;
  b.drw = a.rw + 32;
  b.gate = a.out + 512;
  b.ids = b.rw = a.x;
  b.empty = a.x + 64;
  std::vector<mok_named_tensor> ok = b.named();
  mok_tensor bo = b.output();
  CHECK(mok_layer_check(layer, ok.data(), ok.size(), &bo) == MOK_OK);
  // A weight view is not one range of bytes: not checked (documented).
  int64_t sw[3] = {2, 8, 64};
  mok_tensor overOutputs =
      mok_tensor_contiguous(memory + a.out, MOK_DTYPE_BF16, 3, sw);
  mok_expert_weights view;
  CHECK(mok_weights_from_tensor(&overOutputs, "gate_weights", &view) == MOK_OK);
  CHECK(mok_layer_bind_weights(layer, "gate_weights", &view) == MOK_OK);
  std::vector<mok_named_tensor> unbound = without(in, "gate_weights");
  CHECK(mok_layer_check(layer, unbound.data(), unbound.size(), &o) == MOK_OK);
  CHECK(mok_layer_bind_weights(layer, "gate_weights", nullptr) == MOK_OK);

  // An extra output is never a weight view nor a workspace buffer.
  CHECK_FAILS(mok_layer_bind_weights(layer, "gate", &view),
              MOK_ERROR_INVALID_ARGUMENT,
              "name: unknown input 'gate'; expected x, top_experts, "
              "router_weights, gate_weights");
  size_t bytes = 0;
  CHECK_FAILS(mok_layer_workspace_size(layer, "gate", &bytes),
              MOK_ERROR_INVALID_ARGUMENT,
              "name: 'gate' is an extra output, not a workspace buffer "
              "(workspace buffers: grid_barrier)");
  CHECK_FAILS(mok_layer_workspace_size(layer, "out", &bytes),
              MOK_ERROR_INVALID_ARGUMENT,
              "name: 'out' is the output, not a workspace buffer");
  mok_layer_destroy(layer);

  // A backward's kernel: the first output need not be called "out".
  layer = nullptr;
  std::string backward = layerJson(3, R"(
      {"name": "d_out", "role": "input", "dtype": "bf16", "shape": [4, 64]},
      {"name": "d_x", "role": "output", "dtype": "bf16", "shape": [4, 64]},
      {"name": "d_router_weights", "role": "output", "dtype": "f32", "shape": [4, 2]})",
                                   "");
  CHECK(mok_layer_create(backward.c_str(), &layer) == MOK_OK);
  CHECK(mok_layer_output_count(layer) == 2);
  CHECK(std::string(mok_layer_output_name(layer, 0)) == "d_x");
  int64_t sx[2] = {4, 64}, sk[2] = {4, 2};
  mok_tensor dx = mok_tensor_contiguous(memory + 512, MOK_DTYPE_BF16, 2, sx);
  std::vector<mok_named_tensor> grads = {
      {"d_out", mok_tensor_contiguous(memory, MOK_DTYPE_BF16, 2, sx)},
      {"d_router_weights",
       mok_tensor_contiguous(memory + 1024, MOK_DTYPE_F32, 2, sk)}};
  CHECK(mok_layer_check(layer, grads.data(), grads.size(), &dx) == MOK_OK);
  std::vector<mok_named_tensor> withDx = grads;
  withDx.push_back({"d_x", dx});
  CHECK_REFUSED(
      layer, withDx, dx,
      "inputs[2]: 'd_x' is the layer's first output: pass it as `out`");
  mok_tensor overDout = mok_tensor_contiguous(memory, MOK_DTYPE_BF16, 2, sx);
  CHECK_REFUSED(layer, grads, overDout,
                "out: 'd_x' (bytes " + range(0, 512) +
                    ") overlaps the input 'd_out'");
  mok_tensor small = dx;
  small.shape[0] = 2;
  CHECK_REFUSED(layer, grads, small,
                "d_x: expected shape [4, 64], got [2, 64]");
  mok_layer_destroy(layer);

  // Parameter names are unique: a tensor is bound by its name.
  mok_layer l = nullptr;
  std::string twoX = layerJson(1, R"(
      {"name": "x", "role": "input", "dtype": "bf16", "shape": [4]},
      {"name": "out", "role": "output", "dtype": "bf16", "shape": [4]},
      {"name": "x", "role": "output", "dtype": "bf16", "shape": [4]})",
                               "");
  CHECK_FAILS(mok_layer_create(twoX.c_str(), &l), MOK_ERROR_INVALID_ARGUMENT,
              "metadata: params[2] ('x'): the name of params[0] too");
  CHECK(l == nullptr);
}

// Reading a workspace buffer back (the phase_clock timestamps of a profiling
// kernel): every check that needs no driver, in the documented order —
// NULL arguments, the name against the metadata, the size, then loading.
// Version 5's "align": outputs the kernel writes 16 bytes at a time are
// refused at other addresses, by name; a bad "align" is refused at create.
static void testOutputAlignment() {
  std::string params = kOutputParams;
  auto withAlign = [&](const std::string &name, const std::string &align) {
    std::string key = "{\"name\": \"" + name + "\", \"role\": \"output\"";
    std::string p = params;
    size_t at = p.find(key);
    p.insert(at + 1, "\"align\": " + align + ", ");
    return p;
  };
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(
            layerJson(5, withAlign("gate", "16"), kOutputMaps).c_str(),
            &layer) == MOK_OK);
  OutputArgs a;
  std::vector<mok_named_tensor> in = a.named();
  mok_tensor o = a.output();
  CHECK(mok_layer_check(layer, in.data(), in.size(), &o) == MOK_OK);
  std::vector<mok_named_tensor> off = in;
  off[0].tensor.data = memory + a.gate + 2; // element-aligned, not 16
  CHECK_REFUSED(layer, off, o,
                "gate: data must be 16-byte aligned (the kernel writes it 16 "
                "bytes at a time), got address 0x");
  off[0].tensor.data = memory + a.gate + 8;
  CHECK_REFUSED(layer, off, o, "gate: data must be 16-byte aligned");
  mok_layer_destroy(layer);
  for (const char *bad : {"12", "0", "512", "\"16\""}) {
    mok_layer l = nullptr;
    CHECK(mok_layer_create(
              layerJson(5, withAlign("gate", bad), kOutputMaps).c_str(), &l) ==
          MOK_ERROR_INVALID_ARGUMENT);
    CHECK(std::strstr(mok_last_error(), "('gate')") != nullptr);
    CHECK(l == nullptr);
  }
}

static void testReadWorkspace() {
  // A profiling layer's metadata: a "phase_clock" workspace of 4 i64
  // timestamps and a top-level "phases" key, which the runtime ignores (as
  // any key it does not know).
  const char *profiling = R"({
    "mok_metadata_version": 2, "kernel": "moe_layer_forward", "block": 256,
    "cooperative": true, "dynamic_shared_memory": 0,
    "zero_before_first_launch": ["grid_barrier"],
    "phases": ["route", "fc1", "fc2"],
    "some_future_key": {"nested": [1, 2, {"a": null}]},
    "params": [
      {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
      {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
      {"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},
      {"name": "empty", "role": "workspace", "dtype": "f32", "shape": [0, 8]},
      {"name": "phase_clock", "role": "workspace", "dtype": "i64", "shape": [4]},
      {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [16]}],
    "tensor_maps": [{"buffer": "x", "rows": 4, "cols": 64, "row_stride": 64,
                     "box_rows": 64, "box_cols": 64}]
  })";
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(profiling, &layer) == MOK_OK);
  CHECK(mok_layer_input_count(layer) == 1);

  size_t size = 0;
  CHECK(mok_layer_workspace_size(layer, "phase_clock", &size) == MOK_OK && size == 32);
  CHECK(mok_layer_workspace_size(layer, "grid_barrier", &size) == MOK_OK && size == 8);
  CHECK(mok_layer_workspace_size(layer, "empty", &size) == MOK_OK && size == 0);
  CHECK_FAILS(mok_layer_workspace_size(nullptr, "phase_clock", &size),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  CHECK_FAILS(mok_layer_workspace_size(layer, nullptr, &size),
              MOK_ERROR_INVALID_ARGUMENT, "name: is NULL");
  CHECK_FAILS(mok_layer_workspace_size(layer, "phase_clock", nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "bytes: is NULL");
  CHECK_FAILS(mok_layer_workspace_size(layer, "x", &size), MOK_ERROR_INVALID_ARGUMENT,
              "name: 'x' is an input, not a workspace buffer");

  alignas(16) int64_t stamps[4] = {7, 7, 7, 7};
  CHECK_FAILS(mok_layer_read_workspace(nullptr, "phase_clock", stamps, 32),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  CHECK_FAILS(mok_layer_read_workspace(layer, nullptr, stamps, 32),
              MOK_ERROR_INVALID_ARGUMENT, "name: is NULL");
  CHECK_FAILS(mok_layer_read_workspace(layer, "phase_clock", nullptr, 32),
              MOK_ERROR_INVALID_ARGUMENT, "host: is NULL");
  // NULL host comes before the name.
  CHECK_FAILS(mok_layer_read_workspace(layer, "clock", nullptr, 32),
              MOK_ERROR_INVALID_ARGUMENT, "host: is NULL");
  CHECK_FAILS(mok_layer_read_workspace(layer, "clock", stamps, 32), MOK_ERROR_INVALID_ARGUMENT,
              "name: unknown workspace buffer 'clock' (workspace buffers: grid_barrier, "
              "empty, phase_clock)");
  CHECK_FAILS(mok_layer_read_workspace(layer, "x", stamps, 32), MOK_ERROR_INVALID_ARGUMENT,
              "name: 'x' is an input, not a workspace buffer (workspace buffers: "
              "grid_barrier, empty, phase_clock)");
  CHECK_FAILS(mok_layer_read_workspace(layer, "out", stamps, 32), MOK_ERROR_INVALID_ARGUMENT,
              "name: 'out' is the output, not a workspace buffer");
  CHECK_FAILS(mok_layer_read_workspace(layer, "tensor_maps", stamps, 32),
              MOK_ERROR_INVALID_ARGUMENT,
              "name: 'tensor_maps' is the tensor-map storage (role tensor_maps), not a "
              "workspace buffer");
  // The name before the size, the size before loading.
  CHECK_FAILS(mok_layer_read_workspace(layer, "x", stamps, 3), MOK_ERROR_INVALID_ARGUMENT,
              "name: 'x' is an input");
  CHECK_FAILS(mok_layer_read_workspace(layer, "phase_clock", stamps, 24),
              MOK_ERROR_INVALID_ARGUMENT,
              "bytes: expected 32, the size of 'phase_clock' (i64 [4]), got 24");
  CHECK_FAILS(mok_layer_read_workspace(layer, "empty", stamps, 8), MOK_ERROR_INVALID_ARGUMENT,
              "bytes: expected 0, the size of 'empty' (f32 [0, 8]), got 8");
  CHECK_FAILS(mok_layer_read_workspace(layer, "phase_clock", stamps, 32),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded (call mok_layer_load first)");
  CHECK_FAILS(mok_layer_read_workspace(layer, "empty", stamps, 0),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");
  CHECK(stamps[0] == 7 && stamps[3] == 7); // nothing was written
  // Without a driver, loading fails and the layer stays unloaded.
  CHECK_FAILS(mok_layer_load(layer, 0, ".version 8.0\n"), MOK_ERROR_DRIVER_UNAVAILABLE,
              "the CUDA driver could not be loaded");
  CHECK_FAILS(mok_layer_read_workspace(layer, "phase_clock", stamps, 32),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");
  mok_layer_destroy(layer);

  // A layer without workspace buffers says so.
  layer = nullptr;
  CHECK(mok_layer_create(R"({"mok_metadata_version": 1, "kernel": "k", "block": 32,
      "cooperative": false, "dynamic_shared_memory": 0, "params": [
        {"name": "o", "role": "output", "dtype": "f32", "shape": [4]}]})", &layer) == MOK_OK);
  CHECK_FAILS(mok_layer_read_workspace(layer, "phase_clock", stamps, 32),
              MOK_ERROR_INVALID_ARGUMENT,
              "name: unknown workspace buffer 'phase_clock' (this layer has none)");
  CHECK_FAILS(mok_layer_read_workspace(layer, "o", stamps, 16), MOK_ERROR_INVALID_ARGUMENT,
              "name: 'o' is the output, not a workspace buffer (this layer has none)");
  mok_layer_destroy(layer);
}

/// The kernels' report and the grid, without a driver: the status param's
/// metadata, and the calls that need a loaded layer refuse by name.
static void testReportAndGrid() {
  std::string withStatus = kMetadata;
  std::string statusParam =
      R"({"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},
    {"name": "status", "role": "status", "dtype": "i32", "shape": [8]},)";
  auto at = withStatus.find(
      R"({"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},)");
  CHECK(at != std::string::npos);
  std::string good = withStatus;
  good.replace(at, 77, statusParam);
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(good.c_str(), &layer) == MOK_OK);
  mok_kernel_report report;
  report.bad_routes = 7;
  CHECK_FAILS(mok_layer_take_report(layer, nullptr, 1, &report),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");
  CHECK(report.bad_routes == 0); // zeroed even when refused
  CHECK_FAILS(mok_layer_take_report(nullptr, nullptr, 0, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  uint32_t ctas = 99, most = 99;
  CHECK(mok_layer_grid(layer, &ctas, &most) == MOK_OK);
  CHECK(ctas == 0 && most == 0); // before load: the default, nothing known
  CHECK(mok_layer_set_grid(layer, 66) == MOK_OK);
  CHECK(mok_layer_grid(layer, &ctas, nullptr) == MOK_OK && ctas == 66);
  CHECK(mok_layer_set_grid(layer, 0) == MOK_OK);
  CHECK_FAILS(mok_layer_set_grid(nullptr, 1), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is NULL");
  CHECK_FAILS(mok_layer_grid(nullptr, &ctas, &most), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is NULL");
  mok_layer_destroy(layer);
  // A cluster of 2: the grid holds whole clusters.
  std::string clustered = good;
  clustered.replace(clustered.find(R"("block": 256,)"), 13,
                    R"("block": 256, "cluster": 2,)");
  clustered.replace(clustered.find(R"("mok_metadata_version": 1)"), 25,
                    R"("mok_metadata_version": 3)");
  CHECK(mok_layer_create(clustered.c_str(), &layer) == MOK_OK);
  CHECK_FAILS(mok_layer_set_grid(layer, 3), MOK_ERROR_INVALID_ARGUMENT,
              "ctas: 3 is not a multiple of the kernel's cluster of 2 CTAs");
  CHECK(mok_layer_set_grid(layer, 4) == MOK_OK);
  mok_layer_destroy(layer);
  // The report must be i32 [8] (or longer), and one of them.
  std::string shortReport = good;
  shortReport.replace(shortReport.find(R"("shape": [8])"), 12, R"("shape": [4])");
  CHECK_FAILS(mok_layer_create(shortReport.c_str(), &layer),
              MOK_ERROR_INVALID_ARGUMENT,
              "the kernel's report (role 'status') must be i32 [8] or longer");
  std::string wideReport = good;
  wideReport.replace(wideReport.find(R"("dtype": "i32", "shape": [8])"), 28,
                     R"("dtype": "i64", "shape": [8])");
  CHECK_FAILS(mok_layer_create(wideReport.c_str(), &layer),
              MOK_ERROR_INVALID_ARGUMENT, "must be i32 [8] or longer");
  std::string twoReports = good;
  twoReports.replace(twoReports.find(R"({"name": "status")"), 0,
                     R"({"name": "status2", "role": "status", "dtype": "i32", "shape": [8]},
    )");
  CHECK_FAILS(mok_layer_create(twoReports.c_str(), &layer),
              MOK_ERROR_INVALID_ARGUMENT,
              "more than one parameter has role 'status'");
  CHECK(std::string(mok_status_name(MOK_ERROR_BAD_ROUTING)) ==
        "MOK_ERROR_BAD_ROUTING");
  CHECK(std::string(mok_status_name(MOK_ERROR_TIMEOUT)) == "MOK_ERROR_TIMEOUT");
}

// Handles: NULL, destroyed (a second destroy) and forged ones are refused
// by name by every entry point, never dereferenced (the registry of live
// handles; an ASan build of this test checks the "never").
static void testHandles() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kMetadata, &layer) == MOK_OK);
  mok_layer destroyed = layer;
  mok_layer_destroy(layer);
  CHECK(std::string(mok_last_error()).empty());
  // A second destroy is harmless, and said.
  mok_layer_destroy(destroyed);
  CHECK_ERROR("layer: 0x");
  CHECK_ERROR(" is not a live mok_layer (destroyed already, or not made by "
              "mok_layer_create)");
  mok_layer_destroy(nullptr); // a no-op, as free(NULL)
  CHECK(std::string(mok_last_error()).empty());
  // Some memory that is no layer.
  mok_layer forged = reinterpret_cast<mok_layer>(memory + 256);
  alignas(16) static unsigned char buffer[64];
  int64_t shape[1] = {4};
  mok_tensor t = mok_tensor_contiguous(buffer, MOK_DTYPE_F32, 1, shape);
  mok_named_tensor named[1] = {{"x", t}};
  mok_ep_group group{1, 0, nullptr};
  int32_t size = 0;
  size_t bytes = 0;
  mok_expert_weights view{};
  for (mok_layer bad : {destroyed, forged}) {
    CHECK(mok_layer_input_count(bad) == 0);
    CHECK_ERROR("is not a live mok_layer");
    CHECK(mok_layer_output_count(bad) == 0);
    CHECK_ERROR("is not a live mok_layer");
    CHECK(mok_layer_input_name(bad, 0) == nullptr);
    CHECK_ERROR("is not a live mok_layer");
    CHECK(mok_layer_output_name(bad, 0) == nullptr);
    CHECK_ERROR("is not a live mok_layer");
    CHECK_FAILS(mok_layer_check(bad, named, 1, &t), MOK_ERROR_INVALID_ARGUMENT,
                "is not a live mok_layer");
    CHECK_FAILS(mok_layer_load(bad, 0, ".version 8.0\n"),
                MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_layer");
    CHECK_FAILS(mok_layer_forward(bad, named, 1, &t, nullptr),
                MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_layer");
    CHECK_FAILS(mok_layer_bind_weights(bad, "gate_weights", &view),
                MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_layer");
    CHECK_FAILS(mok_layer_set_ep_group(bad, &group), MOK_ERROR_INVALID_ARGUMENT,
                "is not a live mok_layer");
    CHECK_FAILS(mok_layer_ep_group(bad, &group), MOK_ERROR_INVALID_ARGUMENT,
                "is not a live mok_layer");
    CHECK_FAILS(mok_layer_ep_size(bad, &size), MOK_ERROR_INVALID_ARGUMENT,
                "is not a live mok_layer");
    CHECK_FAILS(mok_layer_workspace_size(bad, "w", &bytes),
                MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_layer");
    CHECK_FAILS(mok_layer_read_workspace(bad, "w", buffer, 16),
                MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_layer");
    mok_layer_destroy(bad);
    CHECK_ERROR("is not a live mok_layer");
  }
  // The message names the handle's address.
  char address[32];
  std::snprintf(address, sizeof address, "layer: 0x%llx is",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(forged)));
  CHECK_FAILS(mok_layer_ep_size(forged, &size), MOK_ERROR_INVALID_ARGUMENT, "");
  CHECK(std::strstr(mok_last_error(), address) != nullptr);
  // NULL is named as NULL everywhere.
  CHECK(mok_layer_input_count(nullptr) == 0);
  CHECK_ERROR("layer: is NULL");
  CHECK(mok_layer_output_name(nullptr, 0) == nullptr);
  CHECK_ERROR("layer: is NULL");
  CHECK_FAILS(mok_layer_load(nullptr, 0, "x"), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is NULL");
  CHECK_FAILS(mok_layer_forward(nullptr, named, 1, &t, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  // A live layer's accessors name a bad index.
  CHECK(mok_layer_create(kMetadata, &layer) == MOK_OK);
  CHECK(mok_layer_input_name(layer, 3) == nullptr);
  CHECK_ERROR("index: expected 0 <= index < 3 (the layer's inputs), got 3");
  CHECK(mok_layer_output_name(layer, -1) == nullptr);
  CHECK_ERROR("index: expected 0 <= index < 1 (the layer's outputs), got -1");
  mok_layer_destroy(layer);

  // Modules: the same, before any driver is needed.
  mok_module fake = reinterpret_cast<mok_module>(memory + 512);
  uint32_t grid[3] = {1, 1, 1}, block[3] = {32, 1, 1};
  CHECK_FAILS(mok_module_launch(fake, "k", grid, block, 0, nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT,
              " is not a live mok_module (destroyed already, or not made by "
              "mok_module_load_ptx)");
  int clusters = 0;
  CHECK_FAILS(mok_module_max_active_clusters(fake, "k", 32, 1, 0, &clusters),
              MOK_ERROR_INVALID_ARGUMENT, "module: 0x");
  mok_module_destroy(fake);
  CHECK_ERROR("is not a live mok_module");
  mok_module_destroy(nullptr);
  CHECK(std::string(mok_last_error()).empty());
}

/// Runs `body` in a child process (the runtime loads its driver and NCCL
/// once a process, and this one has neither); its counts are added to this
/// process's through a pipe.
static void runInChild(const char *what, void (*body)()) {
  std::fflush(stdout);
  int fds[2];
  if (pipe(fds) != 0) {
    std::printf("FAILED: pipe\n");
    ++failed;
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    passed = failed = 0;
    body();
    std::fflush(stdout);
    int counts[2] = {passed, failed};
    ssize_t n = write(fds[1], counts, sizeof counts);
    _exit(n == sizeof counts ? 0 : 1);
  }
  close(fds[1]);
  int counts[2] = {0, 0}, status = 0;
  ssize_t n = read(fds[0], counts, sizeof counts);
  close(fds[0]);
  waitpid(pid, &status, 0);
  if (n != sizeof counts || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("FAILED: the %s tests did not finish (status %d)\n", what,
                status);
    ++failed;
  }
  passed += counts[0];
  failed += counts[1];
}

/// The stand-in as the driver, and as NCCL.
static void useFake(const char *path) {
  setenv("MOK_CUDA_DRIVER", path, 1);
  setenv("MOK_NCCL_LIBRARY", path, 1);
}

int main() {
  runInChild("fake-driver", [] {
    setenv("MOK_CUDA_DRIVER", MOK_FAKE_CUDA, 1);
    testWithFakeDriver(MOK_FAKE_CUDA);
  });
  runInChild("fake-NCCL", [] {
    useFake(MOK_FAKE_CUDA);
    testCommWithFakeNccl(MOK_FAKE_CUDA, false);
  });
  runInChild("fake-NCCL (NCCL 2.29's peer pointers)", [] {
    useFake(MOK_FAKE_NCCL_PEER_POINTER);
    testCommWithFakeNccl(MOK_FAKE_NCCL_PEER_POINTER, true);
  });
  setenv("MOK_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  setenv("MOK_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  testHandles();
  testTensorChecks();
  testWeightViews();
  testExpertParallelGroup();
  testWithoutDriver();
  testLayerMetadata();
  testEmptyHugeBuffer();
  testLayerExpertParallelGroup();
  testTensorMapSlots();
  testWeightMetadata();
  testBindWeights();
  testLayerOutputs();
  testOutputAlignment();
  testReadWorkspace();
  testReportAndGrid();
  testCommWithoutNccl();
  testExpertParallelMetadata();
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
