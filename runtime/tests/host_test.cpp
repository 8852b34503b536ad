// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The runtime's host logic — argument checks, weight-view arithmetic, the
// expert-parallel check, and the behaviour without a CUDA driver — tested
// on any machine. MOK_CUDA_DRIVER is pointed at a library that does not
// exist, so the driver-missing path is tested on GPU machines too.
//
#include "mok/Runtime/mok_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int passed = 0, failed = 0;

static void check(bool cond, const char *what, int line) {
  if (cond) {
    ++passed;
    return;
  }
  ++failed;
  std::printf("FAILED line %d: %s (last error: %s)\n", line, what,
              mok_last_error());
}
#define CHECK(c) check((c), #c, __LINE__)
// The call fails with `status` and its message contains `text`.
#define CHECK_FAILS(call, status, text)                                        \
  do {                                                                         \
    mok_status s_ = (call);                                                    \
    check(s_ == (status), #call " returns " #status, __LINE__);                \
    check(std::strstr(mok_last_error(), (text)) != nullptr,                    \
          #call " says \"" text "\"", __LINE__);                               \
  } while (0)

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

static void testExpertParallelGroup() {
  mok_ep_group one{1, 0, nullptr};
  CHECK(mok_ep_group_check(&one) == MOK_OK);
  mok_ep_group eight{8, 3, nullptr};
  CHECK_FAILS(mok_ep_group_check(&eight), MOK_ERROR_UNSUPPORTED,
              "expert parallelism (size 8) is not supported yet");
  mok_ep_group bad{2, 2, nullptr};
  CHECK_FAILS(mok_ep_group_check(&bad), MOK_ERROR_INVALID_ARGUMENT,
              "expected 0 <= rank < size, got rank 2 of size 2");
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
              MOK_ERROR_INVALID_ARGUMENT, "box [64, 128] must have at most 256 rows and 128 bytes a row");
  CHECK_FAILS(mok_module_load_ptx(0, "", &m), MOK_ERROR_INVALID_ARGUMENT,
              "ptx: is empty");
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
  CHECK_FAILS(mok_layer_forward(layer, in, 3, &o, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "layer: not loaded (call mok_layer_load first)");
  CHECK_FAILS(mok_layer_load(layer, 0, ".version 8.0\n"), MOK_ERROR_DRIVER_UNAVAILABLE,
              "the CUDA driver could not be loaded");
  mok_layer_destroy(layer);

  struct { const char *json, *message; } bad[] = {
      {"{", "metadata: not JSON (offset 1: expected a member name)"},
      {"[1, 2]", "metadata: not a JSON object"},
      {R"({"mok_metadata_version": 2})", "expected mok_metadata_version 1"},
      {R"({"mok_metadata_version": 1, "kernel": "k", "block": 256, "cooperative": true,
           "dynamic_shared_memory": 0})", "metadata: missing or mistyped 'params'"},
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
  };
  for (auto &b : bad) {
    mok_layer l = nullptr;
    CHECK_FAILS(mok_layer_create(b.json, &l), MOK_ERROR_INVALID_ARGUMENT, "");
    check(std::strstr(mok_last_error(), b.message) != nullptr, b.message, __LINE__);
    CHECK(l == nullptr);
  }
}

int main() {
  setenv("MOK_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  testTensorChecks();
  testWeightViews();
  testExpertParallelGroup();
  testWithoutDriver();
  testLayerMetadata();
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
