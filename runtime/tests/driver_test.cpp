// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The runtime's driver calls against a stand-in driver (FakeCuda.cpp): modules,
// launches, layers loaded, run and destroyed, and every driver failure
// injected (Testing.h) — each one's message, and that nothing it allocated,
// loaded or retained outlives it (the stand-in counts). Runs in a process of
// its own, started by host_test.cpp's main.
//
#include "mok/Runtime/mok_runtime.h"

#include "Check.h"
#include "Cubin.h"   // internal: the cubin checks (compiled into the test)
#include "Testing.h" // internal: injected driver failures

#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

/// The stand-in's counters (the same library the runtime loaded).
struct Fake {
  int64_t (*liveAllocations)();
  int64_t (*liveModules)();
  int64_t (*contextRetains)();
  int64_t (*badReleases)();
  int64_t (*launches)();
  int64_t (*tensorMaps)();
  const char *(*lastKernel)(unsigned *);
  void (*setCapturing)(int);
  void (*setComputeCapability)(int);
  size_t (*cubin)(const char *, const char *, void *, size_t);
  size_t (*cubinShared)(const char *, const char *, uint64_t, void *, size_t);
  int (*lastParams)(uint64_t *, int);

  /// Nothing allocated, loaded or retained; nothing released twice.
  bool clean() const {
    return liveAllocations() == 0 && liveModules() == 0 &&
           contextRetains() == 0 && badReleases() == 0;
  }

  /// The stand-in's cubin of `ptx`'s kernels for `chip`.
  std::vector<char> makeCubin(const char *chip, const char *ptx) const {
    std::vector<char> image(cubin(chip, ptx, nullptr, 0));
    cubin(chip, ptx, image.data(), image.size());
    return image;
  }

  /// The same with `staticShared` bytes of static shared memory a kernel.
  std::vector<char> makeCubin(const char *chip, const char *ptx,
                              uint64_t staticShared) const {
    std::vector<char> image(cubinShared(chip, ptx, staticShared, nullptr, 0));
    cubinShared(chip, ptx, staticShared, image.data(), image.size());
    return image;
  }
};

Fake fake;

bool bindFake(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return false;
  bool ok = true;
  auto get = [&](auto &fn, const char *name) {
    void *p = dlsym(lib, name);
    ok = ok && p;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get(fake.liveAllocations, "mok_fake_cuda_live_allocations");
  get(fake.liveModules, "mok_fake_cuda_live_modules");
  get(fake.contextRetains, "mok_fake_cuda_context_retains");
  get(fake.badReleases, "mok_fake_cuda_bad_releases");
  get(fake.launches, "mok_fake_cuda_launches");
  get(fake.tensorMaps, "mok_fake_cuda_tensor_maps");
  get(fake.lastKernel, "mok_fake_cuda_last_kernel");
  get(fake.setCapturing, "mok_fake_cuda_set_capturing");
  get(fake.setComputeCapability, "mok_fake_cuda_set_compute_capability");
  get(fake.cubin, "mok_fake_cuda_cubin");
  get(fake.cubinShared, "mok_fake_cuda_cubin_shared");
  get(fake.lastParams, "mok_fake_cuda_last_params");
  return ok;
}

/// Fails the next call(s) of `function` with `result`.
void inject(const char *function, CUresult result, int64_t skip = 0,
            int64_t times = 1) {
  mok_status s = mok_testing_fail_driver_call(function, result, skip, times);
  check(s == MOK_OK, function, __LINE__);
}

const char *kPtx = ".version 8.1\n.target sm_90a\n.address_size 64\n"
                   ".visible .entry moe_layer_forward(\n  .param .u64 p0\n)\n"
                   "{\n  ret;\n}\n";

// A cooperative kernel with large dynamic shared memory, two workspace
// buffers (one zeroed at load) and tensor maps over the input and output.
const char *kLayer = R"({
  "mok_metadata_version": 3, "kernel": "moe_layer_forward", "block": 256,
  "cooperative": true, "dynamic_shared_memory": 65536,
  "zero_before_first_launch": ["grid_barrier"],
  "params": [
    {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
    {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
    {"name": "grid_barrier", "role": "workspace", "dtype": "i32", "shape": [2]},
    {"name": "scratch", "role": "workspace", "dtype": "f32", "shape": [8]},
    {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [32]}],
  "tensor_maps": [
    {"buffer": "x", "rows": 4, "cols": 64, "row_stride": 64, "box_rows": 4, "box_cols": 64},
    {"buffer": "out", "rows": 4, "cols": 64, "row_stride": 64, "box_rows": 4, "box_cols": 64}]
})";

std::string withCluster(int cluster) {
  std::string s = kLayer;
  s.insert(s.find("\"block\""), "\"cluster\": " + std::to_string(cluster) + ", ");
  return s;
}

alignas(64) unsigned char xs[2][4 * 64 * 2], outs[2][4 * 64 * 2];

struct Args {
  mok_named_tensor in[1];
  mok_tensor out;
};

Args args(int buffers = 0) {
  int64_t shape[2] = {4, 64};
  Args a;
  a.in[0] = {"x", mok_tensor_contiguous(xs[buffers], MOK_DTYPE_BF16, 2, shape)};
  a.out = mok_tensor_contiguous(outs[buffers], MOK_DTYPE_BF16, 2, shape);
  return a;
}

void testProbeAndModules() {
  int available = 0, count = 0;
  CHECK(mok_driver_probe(&available, &count) == MOK_OK);
  CHECK(available == 1 && count == 1);
  int sms = 0;
  CHECK(mok_device_sm_count(0, &sms) == MOK_OK && sms == 132);
  CHECK_FAILS(mok_device_sm_count(1, &sms), MOK_ERROR_INVALID_ARGUMENT,
              "device: 1 is not a device (invalid device ordinal");
  inject("cuDeviceGetAttribute", CUDA_ERROR_LAUNCH_FAILED);
  CHECK_FAILS(mok_device_sm_count(0, &sms), MOK_ERROR_CUDA,
              "cuDeviceGetAttribute: unspecified launch failure (CUresult 719)");
  // A driver error that is not a bad ordinal is the driver's, not the
  // argument's.
  inject("cuDeviceGet", CUDA_ERROR_LAUNCH_FAILED);
  CHECK_FAILS(mok_device_sm_count(0, &sms), MOK_ERROR_CUDA,
              "cuDeviceGet: unspecified launch failure");

  mok_module m = nullptr;
  CHECK_FAILS(mok_module_load_ptx(1, kPtx, &m), MOK_ERROR_INVALID_ARGUMENT,
              "device: expected 0 <= device < 1, got 1");
  CHECK_FAILS(mok_module_load_ptx(0, "not ptx", &m), MOK_ERROR_CUDA,
              "loading the PTX failed: a PTX JIT compilation failed (CUresult "
              "218); JIT log: fake ptxas: no .entry in the PTX");
  CHECK(m == nullptr && fake.clean());
  // Each driver call of a load failing: nothing retained or loaded after.
  struct {
    const char *function;
    const char *message;
  } failures[] = {
      {"cuDeviceGetCount", "cuDeviceGetCount: out of memory"},
      {"cuDeviceGet", "cuDeviceGet: out of memory"},
      {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain: out of memory"},
      {"cuCtxSetCurrent", "cuCtxSetCurrent: out of memory"},
      {"cuModuleLoadDataEx", "loading the PTX failed: out of memory (CUresult 2)"},
  };
  for (auto &f : failures) {
    inject(f.function, CUDA_ERROR_OUT_OF_MEMORY);
    mok_status s = mok_module_load_ptx(0, kPtx, &m);
    check(s == MOK_ERROR_CUDA, f.function, __LINE__);
    check(std::strstr(mok_last_error(), f.message) != nullptr, f.message,
          __LINE__);
    check(m == nullptr && fake.clean(), f.function, __LINE__);
  }

  CHECK(mok_module_load_ptx(0, kPtx, &m) == MOK_OK && m);
  CHECK(fake.liveModules() == 1 && fake.contextRetains() == 1);
  uint32_t grid[3] = {132, 1, 1}, block[3] = {256, 1, 1};
  int64_t launches = fake.launches();
  CHECK(mok_module_launch(m, "moe_layer_forward", grid, block, 65536, nullptr,
                          nullptr, MOK_LAUNCH_COOPERATIVE) == MOK_OK);
  CHECK(fake.launches() == launches + 1);
  CHECK_FAILS(mok_module_launch(m, "other", grid, block, 0, nullptr, nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT,
              "kernel: no kernel named 'other' in the module (named symbol not "
              "found");
  uint32_t tooMany[3] = {133, 1, 1};
  CHECK_FAILS(mok_module_launch(m, "moe_layer_forward", tooMany, block, 0,
                                nullptr, nullptr, MOK_LAUNCH_COOPERATIVE),
              MOK_ERROR_CUDA,
              "launching 'moe_layer_forward' failed: too many blocks in "
              "cooperative launch (CUresult 720) (a cooperative grid must fit "
              "on the device at once)");
  struct {
    const char *function;
    uint32_t cluster;
    const char *message;
  } launchFailures[] = {
      {"cuCtxSetCurrent", 1, "cuCtxSetCurrent: invalid resource handle"},
      {"cuModuleGetFunction", 1,
       "cuModuleGetFunction for 'moe_layer_forward': invalid resource handle"},
      {"cuFuncSetAttribute", 1,
       "dynamic_smem: 65536 bytes refused by the device: invalid resource"},
      {"cuLaunchCooperativeKernel", 1,
       "launching 'moe_layer_forward' failed: invalid resource handle"},
      {"cuLaunchKernelEx", 2,
       "launching 'moe_layer_forward' failed: invalid resource handle"},
  };
  for (auto &f : launchFailures) {
    inject(f.function, CUDA_ERROR_INVALID_HANDLE);
    launches = fake.launches();
    mok_status s = mok_module_launch_clusters(
        m, "moe_layer_forward", grid, block, f.cluster, 65536, nullptr,
        nullptr, MOK_LAUNCH_COOPERATIVE);
    check(s != MOK_OK, f.function, __LINE__);
    check(std::strstr(mok_last_error(), f.message) != nullptr, f.message,
          __LINE__);
    check(fake.launches() == launches, f.function, __LINE__);
  }
  int clusters = 0;
  CHECK(mok_module_max_active_clusters(m, "moe_layer_forward", 256, 2, 0,
                                       &clusters) == MOK_OK &&
        clusters == 66);
  inject("cuOccupancyMaxActiveClusters", CUDA_ERROR_INVALID_VALUE);
  CHECK_FAILS(mok_module_max_active_clusters(m, "moe_layer_forward", 256, 2, 0,
                                             &clusters),
              MOK_ERROR_CUDA,
              "cuOccupancyMaxActiveClusters for 'moe_layer_forward': invalid "
              "argument (CUresult 1)");

  // Destroy once; a second destroy is refused, and the driver is not
  // called again (nothing is released twice).
  int64_t unloads = mok_testing_driver_calls("cuModuleUnload");
  mok_module_destroy(m);
  CHECK(std::string(mok_last_error()).empty());
  CHECK(fake.clean());
  mok_module_destroy(m);
  CHECK_ERROR("is not a live mok_module");
  CHECK(mok_testing_driver_calls("cuModuleUnload") == unloads + 1);
  CHECK(fake.clean());
  CHECK_FAILS(mok_module_launch(m, "moe_layer_forward", grid, block, 0, nullptr,
                                nullptr, 0),
              MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_module");

  alignas(64) static unsigned char descriptor[128], data[64 * 128];
  CHECK(mok_tma_descriptor_2d(descriptor, data, 64, 64, 64, 64, 64) == MOK_OK);
  uint64_t words[16];
  std::memcpy(words, descriptor, sizeof words);
  CHECK(words[0] == reinterpret_cast<uintptr_t>(data));
  CHECK(words[1] == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  CHECK(words[4] == 128 && words[5] == 64 && words[6] == 64);
  // FP8 is encoded as bytes, its stride in bytes, a box row of 128 of them.
  CHECK(mok_tma_descriptor_2d_typed(descriptor, data, MOK_DTYPE_F8E4M3, 64,
                                    128, 128, 64, 128) == MOK_OK);
  std::memcpy(words, descriptor, sizeof words);
  CHECK(words[1] == CU_TENSOR_MAP_DATA_TYPE_UINT8);
  CHECK(words[2] == 128 && words[3] == 64 && words[4] == 128);
  CHECK(words[5] == 128 && words[6] == 64);
  inject("cuTensorMapEncodeTiled", CUDA_ERROR_INVALID_VALUE);
  CHECK_FAILS(mok_tma_descriptor_2d(descriptor, data, 64, 64, 64, 64, 64),
              MOK_ERROR_CUDA, "cuTensorMapEncodeTiled: invalid argument");
}

void testInjection() {
  CHECK_FAILS(mok_testing_fail_driver_call("cuMalloc", 2, 0, 1),
              MOK_ERROR_INVALID_ARGUMENT,
              "function: unknown driver entry point 'cuMalloc'; expected one "
              "of cuGetErrorString, cuInit");
  CHECK_FAILS(mok_testing_fail_driver_call("cuMemAlloc", 2, 0, 0),
              MOK_ERROR_INVALID_ARGUMENT,
              "expected skip >= 0 and times >= 1 or -1, got skip 0, times 0");
  CHECK(mok_testing_driver_calls("cuMalloc") == -1);
  // skip, then times: the third and fourth probes fail, the fifth passes.
  inject("cuDeviceGetCount", CUDA_ERROR_LAUNCH_FAILED, 2, 2);
  int available = 0, count = 0, seen[5];
  for (int &a : seen) {
    mok_driver_probe(&available, &count);
    a = available;
  }
  CHECK(seen[0] && seen[1] && !seen[2] && !seen[3] && seen[4]);
  // -1: until cleared.
  inject("cuDeviceGetCount", CUDA_ERROR_LAUNCH_FAILED, 0, -1);
  for (int i = 0; i < 3; ++i)
    CHECK(mok_driver_probe(&available, &count) == MOK_OK && !available);
  CHECK_ERROR("cuDeviceGetCount failed: unspecified launch failure");
  CHECK(mok_testing_fail_driver_call(nullptr, 0, 0, 1) == MOK_OK);
  CHECK(mok_driver_probe(&available, &count) == MOK_OK && available);
}

void testLayerLoad() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kLayer, &layer) == MOK_OK);
  Args a = args();
  CHECK_FAILS(mok_layer_forward(layer, a.in, 1, &a.out, nullptr),
              MOK_ERROR_INVALID_ARGUMENT,
              "layer: not loaded (call mok_layer_load first)");
  alignas(16) unsigned char host[64];
  CHECK_FAILS(mok_layer_read_workspace(layer, "scratch", host, 32),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");

  // Each failure of a load leaves nothing behind, and the layer not loaded
  // (a later load works).
  struct {
    const char *function;
    int64_t skip;
    CUresult result;
    mok_status status;
    const char *message;
  } failures[] = {
      {"cuDeviceGetAttribute", 0, CUDA_ERROR_INVALID_VALUE, MOK_ERROR_CUDA,
       "cuDeviceGetAttribute: invalid argument"},
      {"cuModuleLoadDataEx", 0, CUDA_ERROR_INVALID_PTX, MOK_ERROR_CUDA,
       "loading the PTX failed: a PTX JIT compilation failed"},
      {"cuMemAlloc", 0, CUDA_ERROR_OUT_OF_MEMORY, MOK_ERROR_OUT_OF_MEMORY,
       "allocating the workspace buffer 'grid_barrier' (8 bytes): out of "
       "memory (CUresult 2)"},
      {"cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY, MOK_ERROR_OUT_OF_MEMORY,
       "allocating the workspace buffer 'scratch' (32 bytes): out of memory"},
      {"cuMemAlloc", 2, CUDA_ERROR_ILLEGAL_ADDRESS, MOK_ERROR_CUDA,
       "allocating the workspace buffer 'tensor_maps' (256 bytes): an "
       "illegal memory access was encountered (CUresult 700)"},
      {"cuMemsetD8", 0, CUDA_ERROR_ILLEGAL_ADDRESS, MOK_ERROR_CUDA,
       "zeroing 'grid_barrier': an illegal memory access"},
  };
  for (auto &f : failures) {
    inject(f.function, f.result, f.skip);
    mok_status s = mok_layer_load(layer, 0, kPtx);
    check(s == f.status, f.function, __LINE__);
    check(std::strstr(mok_last_error(), f.message) != nullptr, f.message,
          __LINE__);
    check(fake.clean(), f.function, __LINE__);
    s = mok_layer_read_workspace(layer, "scratch", host, 32);
    check(s == MOK_ERROR_INVALID_ARGUMENT &&
              std::strstr(mok_last_error(), "not loaded"),
          f.function, __LINE__);
  }
  CHECK_FAILS(mok_layer_load(layer, 0, "no kernel here"), MOK_ERROR_CUDA,
              "JIT log: fake ptxas: no .entry in the PTX");
  CHECK(fake.clean());

  CHECK(mok_layer_load(layer, 0, kPtx) == MOK_OK);
  CHECK(fake.liveAllocations() == 3 && fake.liveModules() == 1 &&
        fake.contextRetains() == 1);
  CHECK_FAILS(mok_layer_load(layer, 0, kPtx), MOK_ERROR_INVALID_ARGUMENT,
              "layer: is already loaded");
  CHECK(fake.liveAllocations() == 3 && fake.liveModules() == 1);
  // The zeroed buffer reads zeros; the other the stand-in's fill.
  alignas(16) int32_t barrier[2] = {7, 7};
  CHECK(mok_layer_read_workspace(layer, "grid_barrier", barrier, 8) == MOK_OK);
  CHECK(barrier[0] == 0 && barrier[1] == 0);
  CHECK(mok_layer_read_workspace(layer, "scratch", host, 32) == MOK_OK);
  CHECK(host[0] == 0xA5 && host[31] == 0xA5);
  inject("cuMemcpyDtoH", CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK_FAILS(mok_layer_read_workspace(layer, "scratch", host, 32),
              MOK_ERROR_CUDA,
              "copying the workspace buffer 'scratch' to the host: an illegal "
              "memory access");
  mok_layer_destroy(layer);
  CHECK(std::string(mok_last_error()).empty());
  CHECK(fake.clean());
  // A second destroy of a loaded layer frees nothing twice.
  mok_layer_destroy(layer);
  CHECK_ERROR("is not a live mok_layer");
  CHECK(fake.clean());
}

void testLayerForward() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kLayer, &layer) == MOK_OK);
  CHECK(mok_layer_load(layer, 0, kPtx) == MOK_OK);
  Args a = args(), b = args(1);
  auto uploads = [] { return mok_testing_driver_calls("cuMemcpyHtoDAsync"); };
  int64_t launches = fake.launches(), maps = fake.tensorMaps(), up = uploads();
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  unsigned grid = 0;
  CHECK(std::string(fake.lastKernel(&grid)) == "moe_layer_forward" && grid == 132);
  CHECK(fake.launches() == launches + 1 && fake.tensorMaps() == maps + 2 &&
        uploads() == up + 1);
  // The same buffers: nothing rebuilt or uploaded.
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  CHECK(fake.tensorMaps() == maps + 2 && uploads() == up + 1);

  // Failures of a forward, each named. Each uses other buffers than the
  // forward before it, so that the maps are to be rebuilt; a failure leaves
  // them to be rebuilt by the next forward, but for a failed launch, whose
  // maps were built and uploaded.
  struct {
    const char *function;
    const char *message;
    bool rebuilds; // the next forward, with the same buffers, builds maps
  } failures[] = {
      {"cuStreamIsCapturing",
       "stream: cuStreamIsCapturing failed: invalid resource handle", true},
      {"cuCtxSetCurrent", "cuCtxSetCurrent: invalid resource handle", true},
      {"cuTensorMapEncodeTiled",
       "tensor map 0 of 'x': cuTensorMapEncodeTiled: invalid resource handle",
       true},
      {"cuMemcpyHtoDAsync",
       "copying the tensor maps to the device: invalid resource handle", true},
      {"cuLaunchCooperativeKernel",
       "launching 'moe_layer_forward' failed: invalid resource handle", false},
  };
  for (auto &f : failures) {
    Args &now = (&f - failures) % 2 ? a : b;
    inject(f.function, CUDA_ERROR_INVALID_HANDLE);
    launches = fake.launches();
    mok_status s = mok_layer_forward(layer, now.in, 1, &now.out, nullptr);
    check(s == MOK_ERROR_CUDA, f.function, __LINE__);
    check(std::strstr(mok_last_error(), f.message) != nullptr, f.message,
          __LINE__);
    check(fake.launches() == launches, f.function, __LINE__);
    maps = fake.tensorMaps();
    up = uploads();
    check(mok_layer_forward(layer, now.in, 1, &now.out, nullptr) == MOK_OK,
          f.function, __LINE__);
    check(fake.launches() == launches + 1, f.function, __LINE__);
    check((fake.tensorMaps() == maps + 2) == f.rebuilds &&
              (uploads() == up + 1) == f.rebuilds,
          f.function, __LINE__);
  }

  // Captured into a CUDA graph: each capture builds its own maps, and every
  // later forward uploads again.
  fake.setCapturing(1);
  maps = fake.tensorMaps();
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  CHECK(fake.tensorMaps() == maps + 2);
  fake.setCapturing(0);
  up = uploads();
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  CHECK(uploads() == up + 2);
  mok_layer_destroy(layer);
  CHECK(fake.clean());
}

/// An FP8 operand's tensor map: the buffer's dtype picks the encoding
/// (bytes, a byte stride, a box row of 128 elements) next to a bf16 map.
void testFp8TensorMaps() {
  const char *json = R"({
  "mok_metadata_version": 3, "kernel": "moe_layer_forward", "block": 256,
  "cooperative": true, "dynamic_shared_memory": 65536,
  "params": [
    {"name": "xq", "role": "input", "dtype": "f8e4m3", "shape": [4, 128]},
    {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
    {"name": "tensor_maps", "role": "tensor_maps", "dtype": "i64", "shape": [32]}],
  "tensor_maps": [
    {"buffer": "xq", "rows": 4, "cols": 128, "row_stride": 128, "box_rows": 4, "box_cols": 128},
    {"buffer": "out", "rows": 4, "cols": 64, "row_stride": 64, "box_rows": 4, "box_cols": 64}]
})";
  const char *ptx = ".version 8.1\n.target sm_90a\n.address_size 64\n"
                    ".visible .entry moe_layer_forward(\n  .param .u64 p0,\n"
                    "  .param .u64 p1,\n  .param .u64 p2\n)\n{\n  ret;\n}\n";
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(json, &layer) == MOK_OK);
  CHECK(mok_layer_load(layer, 0, ptx) == MOK_OK);
  alignas(64) static unsigned char xq[4 * 128], out[4 * 64 * 2];
  int64_t xShape[2] = {4, 128}, outShape[2] = {4, 64};
  mok_named_tensor in[1] = {
      {"xq", mok_tensor_contiguous(xq, MOK_DTYPE_F8E4M3, 2, xShape)}};
  mok_tensor o = mok_tensor_contiguous(out, MOK_DTYPE_BF16, 2, outShape);
  // Another dtype than the metadata's is refused by name.
  mok_named_tensor wrong[1] = {
      {"xq", mok_tensor_contiguous(xq, MOK_DTYPE_BF16, 2, xShape)}};
  CHECK_FAILS(mok_layer_forward(layer, wrong, 1, &o, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "expected dtype f8e4m3, got bf16");
  CHECK(mok_layer_forward(layer, in, 1, &o, nullptr) == MOK_OK);
  uint64_t params[8] = {};
  if (fake.lastParams(params, 8) != 3 || !params[2]) {
    check(false, "the launch has 3 parameters", __LINE__);
    mok_layer_destroy(layer);
    return;
  }
  // The stand-in's device memory is the host's: read the uploaded maps.
  uint64_t maps[32];
  std::memcpy(maps, reinterpret_cast<const void *>(params[2]), sizeof maps);
  CHECK(maps[0] == reinterpret_cast<uintptr_t>(xq));
  CHECK(maps[1] == CU_TENSOR_MAP_DATA_TYPE_UINT8);
  CHECK(maps[2] == 128 && maps[3] == 4 && maps[4] == 128);
  CHECK(maps[5] == 128 && maps[6] == 4);
  CHECK(maps[16] == reinterpret_cast<uintptr_t>(out));
  CHECK(maps[17] == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  CHECK(maps[20] == 128 && maps[21] == 64);
  mok_layer_destroy(layer);
  CHECK(fake.clean());
}

void testClusterLayer() {
  mok_layer layer = nullptr;
  std::string json = withCluster(2);
  CHECK(mok_layer_create(json.c_str(), &layer) == MOK_OK);
  inject("cuOccupancyMaxActiveClusters", CUDA_ERROR_INVALID_VALUE);
  CHECK_FAILS(mok_layer_load(layer, 0, kPtx), MOK_ERROR_CUDA,
              "cuOccupancyMaxActiveClusters for 'moe_layer_forward'");
  CHECK(fake.clean());
  CHECK(mok_layer_load(layer, 0, kPtx) == MOK_OK);
  Args a = args();
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  unsigned grid = 0;
  fake.lastKernel(&grid);
  CHECK(grid == 132); // 66 clusters of 2
  inject("cuLaunchKernelEx", CUDA_ERROR_LAUNCH_FAILED);
  CHECK_FAILS(mok_layer_forward(layer, a.in, 1, &a.out, nullptr), MOK_ERROR_CUDA,
              "launching 'moe_layer_forward' failed: unspecified launch failure");
  mok_layer_destroy(layer);
  CHECK(fake.clean());
}

/// Load, forward and destroy many times: the stand-in's counts come back
/// to zero, and the runtime's own host memory does not grow per cycle (the
/// GPU test of the same loop measures device memory and RSS).
void testLoadUnloadLoop() {
  Args a = args();
  for (int i = 0; i < 1000; ++i) {
    mok_layer layer = nullptr;
    if (mok_layer_create(kLayer, &layer) != MOK_OK ||
        mok_layer_load(layer, 0, kPtx) != MOK_OK ||
        mok_layer_forward(layer, a.in, 1, &a.out, nullptr) != MOK_OK) {
      check(false, "a load/forward/destroy cycle", __LINE__);
      mok_layer_destroy(layer);
      break;
    }
    mok_layer_destroy(layer);
  }
  CHECK(fake.clean());
}

//===----------------------------------------------------------------------===//
// Cubins
//===----------------------------------------------------------------------===//

int64_t calls(const char *function) {
  return mok_testing_driver_calls(function);
}

/// The module's load source and detail.
mok_load_source sourceOf(mok_module m, std::string &detail) {
  mok_load_source source = MOK_LOAD_NONE;
  const char *text = nullptr;
  check(mok_module_load_source(m, &source, &text) == MOK_OK,
        "mok_module_load_source", __LINE__);
  detail = text ? text : "(null)";
  return source;
}

bool contains(const std::string &text, const char *part) {
  bool found = text.find(part) != std::string::npos;
  if (!found)
    std::printf("  (\"%s\" not in \"%s\")\n", part, text.c_str());
  return found;
}

/// A cubin given by the caller: used when the driver takes it; else the
/// PTX, or an error without PTX.
void testGivenCubin() {
  std::vector<char> good = fake.makeCubin("sm_90a", kPtx);
  std::vector<char> other = fake.makeCubin("sm_100a", kPtx);
  std::string detail;
  mok_module m = nullptr;
  int64_t jits = calls("cuModuleLoadDataEx");
  CHECK(mok_module_load_image(0, kPtx, good.data(), good.size(), &m) == MOK_OK);
  CHECK(sourceOf(m, detail) == MOK_LOAD_CUBIN);
  CHECK(contains(detail, "the given cubin (") &&
        contains(detail, std::to_string(good.size()).c_str()));
  CHECK(calls("cuModuleLoadDataEx") == jits);
  uint32_t grid[3] = {132, 1, 1}, block[3] = {256, 1, 1};
  CHECK(mok_module_launch(m, "moe_layer_forward", grid, block, 0, nullptr,
                          nullptr, 0) == MOK_OK);
  mok_module_destroy(m);
  // A cubin alone, no PTX.
  m = nullptr;
  CHECK(mok_module_load_image(0, nullptr, good.data(), good.size(), &m) ==
        MOK_OK);
  CHECK(sourceOf(m, detail) == MOK_LOAD_CUBIN);
  mok_module_destroy(m);
  CHECK(fake.clean());

  // Another chip's cubin: the driver refuses it, the PTX is compiled.
  m = nullptr;
  CHECK(mok_module_load_image(0, kPtx, other.data(), other.size(), &m) ==
        MOK_OK);
  CHECK(sourceOf(m, detail) == MOK_LOAD_PTX);
  CHECK(contains(detail, "the PTX, compiled by the driver (or taken from its "
                         "JIT cache) in ") &&
        contains(detail, "the given cubin was refused by the driver: no kernel "
                         "image is available for execution on the device "
                         "(CUresult 209)"));
  CHECK(calls("cuModuleLoadDataEx") == jits + 1);
  mok_module_destroy(m);
  // Any failure of the cubin's load falls back alike.
  inject("cuModuleLoadData", CUDA_ERROR_OUT_OF_MEMORY);
  m = nullptr;
  CHECK(mok_module_load_image(0, kPtx, good.data(), good.size(), &m) == MOK_OK);
  CHECK(sourceOf(m, detail) == MOK_LOAD_PTX);
  CHECK(contains(detail, "refused by the driver: out of memory"));
  mok_module_destroy(m);
  CHECK(fake.clean());
  // Without PTX to fall back to, the refusal is the error.
  m = nullptr;
  CHECK_FAILS(mok_module_load_image(0, nullptr, other.data(), other.size(), &m),
              MOK_ERROR_CUDA,
              "loading the cubin failed: no kernel image is available for "
              "execution on the device (CUresult 209) (and no PTX to fall back "
              "to was given)");
  CHECK(m == nullptr && fake.clean());
  // Not a cubin: checked before the driver reads it.
  std::vector<char> text(100, 'x');
  std::vector<char> elf32 = good;
  elf32[4] = 1;
  std::vector<char> elsewhere = good;
  elsewhere[18] = 62; // x86-64
  // Section headers said to lie past the image's end.
  std::vector<char> truncated = good;
  uint64_t shoff = truncated.size() - 8;
  uint16_t shentsize = 64, shnum = 1;
  std::memcpy(&truncated[40], &shoff, 8);
  std::memcpy(&truncated[58], &shentsize, 2);
  std::memcpy(&truncated[60], &shnum, 2);
  struct {
    std::vector<char> *image;
    const char *why;
  } bad[] = {{&text, "not an ELF image"},
             {&elf32, "not a 64-bit little-endian ELF image"},
             {&elsewhere, "an ELF image for machine 62, not for CUDA (190)"},
             {&truncated, "truncated: its section headers end past its"}};
  for (auto &b : bad) {
    m = nullptr;
    int64_t images = calls("cuModuleLoadData");
    mok_status s = mok_module_load_image(0, nullptr, b.image->data(),
                                         b.image->size(), &m);
    check(s == MOK_ERROR_INVALID_ARGUMENT, b.why, __LINE__);
    check(contains(mok_last_error(), "cubin: not a CUDA cubin: ") &&
              contains(mok_last_error(), b.why),
          b.why, __LINE__);
    CHECK(mok_module_load_image(0, kPtx, b.image->data(), b.image->size(),
                                &m) == MOK_OK);
    check(sourceOf(m, detail) == MOK_LOAD_PTX &&
              contains(detail, "the given cubin was not used: ") &&
              contains(detail, b.why),
          b.why, __LINE__);
    check(calls("cuModuleLoadData") == images, b.why, __LINE__);
    mok_module_destroy(m);
  }
  CHECK(fake.clean());
  // The arguments.
  CHECK_FAILS(mok_module_load_image(0, kPtx, nullptr, 5, &m),
              MOK_ERROR_INVALID_ARGUMENT, "cubin: is NULL, but cubin_size is 5");
  CHECK_FAILS(mok_module_load_image(0, kPtx, good.data(), 0, &m),
              MOK_ERROR_INVALID_ARGUMENT,
              "cubin_size: is 0, but a cubin is given");
  CHECK_FAILS(mok_module_load_image(0, "", nullptr, 0, &m),
              MOK_ERROR_INVALID_ARGUMENT,
              "ptx: is empty (and no cubin is given)");
  CHECK_FAILS(mok_module_load_image(0, kPtx, nullptr, 0, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "out: is NULL");
  mok_load_source source;
  CHECK_FAILS(mok_module_load_source(nullptr, &source, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "module: is NULL");

  // A layer from a cubin; its source before, while and after it is loaded.
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kLayer, &layer) == MOK_OK);
  const char *text2 = "?";
  CHECK(mok_layer_load_source(layer, &source, &text2) == MOK_OK &&
        source == MOK_LOAD_NONE && std::string(text2).empty());
  CHECK_FAILS(mok_layer_load_source(layer, nullptr, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "source: is NULL");
  CHECK(mok_layer_load_image(layer, 0, kPtx, good.data(), good.size()) ==
        MOK_OK);
  CHECK(mok_layer_load_source(layer, &source, &text2) == MOK_OK &&
        source == MOK_LOAD_CUBIN && contains(text2, "the given cubin"));
  Args a = args();
  CHECK(mok_layer_forward(layer, a.in, 1, &a.out, nullptr) == MOK_OK);
  mok_layer_destroy(layer);
  CHECK_FAILS(mok_layer_load_source(layer, &source, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_layer");
  // A refused cubin and no PTX: the layer stays not loaded, nothing left.
  CHECK(mok_layer_create(kLayer, &layer) == MOK_OK);
  CHECK_FAILS(mok_layer_load_image(layer, 0, nullptr, other.data(),
                                   other.size()),
              MOK_ERROR_CUDA, "loading the cubin failed");
  CHECK(mok_layer_load_source(layer, &source, nullptr) == MOK_OK &&
        source == MOK_LOAD_NONE);
  CHECK(fake.clean());
  CHECK(mok_layer_load_image(layer, 0, kPtx, other.data(), other.size()) ==
        MOK_OK);
  CHECK(mok_layer_load_source(layer, &source, nullptr) == MOK_OK &&
        source == MOK_LOAD_PTX);
  mok_layer_destroy(layer);
  CHECK(fake.clean());
}

//===----------------------------------------------------------------------===//
// Dynamic shared memory's alignment in a given cubin
//===----------------------------------------------------------------------===//

// A layer's PTX as the tensor-core kernels declare their dynamic shared
// memory: on a 1024-byte boundary (128-byte-swizzled TMA tiles).
const char *kAlignedPtx =
    ".version 8.1\n.target sm_90a\n.address_size 64\n"
    "// the TMA tiles' buffers\n"
    ".extern .shared .align 1024 .b8 mok_dyn_smem[];\n"
    ".visible .entry moe_layer_forward(\n  .param .u64 p0\n)\n"
    "{\n  ret;\n}\n";

/// Loads a module; its source and detail; nothing left after.
mok_load_source loadOnce(const char *ptx, const std::vector<char> &cubin,
                         std::string &detail) {
  mok_module m = nullptr;
  if (mok_module_load_image(0, ptx, cubin.data(), cubin.size(), &m) !=
      MOK_OK) {
    detail = mok_last_error();
    return MOK_LOAD_NONE;
  }
  mok_load_source source = sourceOf(m, detail);
  mok_module_destroy(m);
  return source;
}

/// The alignment read from PTX: `.extern .shared .align N` declarations,
/// the largest, none in comments, none of other spaces.
void testPtxDynamicSharedAlignment() {
  using mok::runtime::ptxDynamicSharedAlignment;
  CHECK(ptxDynamicSharedAlignment(kAlignedPtx) == 1024);
  CHECK(ptxDynamicSharedAlignment(kPtx) == 0);
  CHECK(ptxDynamicSharedAlignment("") == 0);
  CHECK(ptxDynamicSharedAlignment(nullptr) == 0);
  CHECK(ptxDynamicSharedAlignment(".extern .shared .align 16 .b8 a[];\n"
                                  ".extern .shared .align 128 .b8 b[];\n") ==
        128);
  // Any whitespace; inside a kernel's body.
  CHECK(ptxDynamicSharedAlignment(".entry k()\n{\n\t.extern\t.shared\n  "
                                  ".align 256 .b8 s[];\n  ret;\n}\n") == 256);
  // Not a declaration of dynamic shared memory with an alignment.
  CHECK(ptxDynamicSharedAlignment("// .extern .shared .align 1024 .b8 a[];\n"
                                  "/* .extern .shared .align 512 .b8 b[]; */\n"
                                  ".extern .shared .b8 c[];\n"
                                  ".shared .align 2048 .b8 d[64];\n"
                                  ".extern .global .align 4096 .b8 e[];\n"
                                  ".extern .shared .align x .b8 f[];\n") == 0);
  // A string holding a declaration is not one.
  CHECK(ptxDynamicSharedAlignment(".file 1 \".extern .shared .align 64 "
                                  ".b8 a[];\"\n") == 0);
}

/// The ELF check on the stand-in's cubins: a `.nv.shared.<kernel>` section
/// whose size is not a multiple of the alignment is refused, naming the
/// kernel and the byte its dynamic shared memory would start at.
void testCubinDynamicSharedAlignment() {
  using mok::runtime::checkCubin;
  using mok::runtime::checkDynamicSharedAlignment;
  std::vector<char> linked = fake.makeCubin("sm_90a", kAlignedPtx, 1056);
  std::vector<char> whole = fake.makeCubin("sm_90a", kAlignedPtx, 2048);
  std::vector<char> plain = fake.makeCubin("sm_90a", kAlignedPtx);
  std::string why;
  CHECK(checkCubin(linked.data(), linked.size(), why));
  CHECK(!checkDynamicSharedAlignment(linked.data(), linked.size(), 1024, why));
  CHECK(why == "kernel moe_layer_forward's dynamic shared memory would start "
               "at byte 1056, not on the 1024-byte boundary its PTX declares "
               "(a cubin linked from relocatable code?)");
  why.clear();
  CHECK(checkDynamicSharedAlignment(whole.data(), whole.size(), 1024, why));
  CHECK(checkDynamicSharedAlignment(plain.data(), plain.size(), 1024, why));
  CHECK(checkDynamicSharedAlignment(linked.data(), linked.size(), 32, why));
  CHECK(checkDynamicSharedAlignment(linked.data(), linked.size(), 16, why));
  CHECK(checkDynamicSharedAlignment(linked.data(), linked.size(), 0, why));
  CHECK(why.empty());
  std::vector<char> odd = fake.makeCubin("sm_90a", kAlignedPtx, 1040);
  CHECK(!checkDynamicSharedAlignment(odd.data(), odd.size(), 32, why));
  CHECK(contains(why, "at byte 1040, not on the 32-byte boundary"));
  // The reserved shared memory's section is no kernel's.
  std::vector<char> reserved = fake.makeCubin(
      "sm_90a", ".entry reserved.0(\n)\n{\n  ret;\n}\n", 1056);
  CHECK(checkDynamicSharedAlignment(reserved.data(), reserved.size(), 1024,
                                    why));
  // Sections without names to find the kernels' by: nothing to check.
  std::vector<char> nameless = linked;
  uint16_t outOfRange = 99;
  std::memcpy(&nameless[62], &outOfRange, 2);
  CHECK(checkDynamicSharedAlignment(nameless.data(), nameless.size(), 1024,
                                    why));
}

/// Through mok_module_load_image: beside its PTX, a misaligned cubin is not
/// used (the PTX is loaded, the detail says why); an aligned one is; a
/// cubin alone is not checked (it does not record the alignment).
void testGivenCubinAlignment() {
  std::vector<char> linked = fake.makeCubin("sm_90a", kAlignedPtx, 1056);
  std::vector<char> whole = fake.makeCubin("sm_90a", kAlignedPtx, 2048);
  std::string detail;
  int64_t images = calls("cuModuleLoadData");
  CHECK(loadOnce(kAlignedPtx, linked, detail) == MOK_LOAD_PTX);
  CHECK(contains(detail, "the PTX, compiled by the driver (or taken from its "
                         "JIT cache) in ") &&
        contains(detail, "; the given cubin was not used: kernel "
                         "moe_layer_forward's dynamic shared memory would "
                         "start at byte 1056, not on the 1024-byte boundary "
                         "its PTX declares (a cubin linked from relocatable "
                         "code?)"));
  CHECK(calls("cuModuleLoadData") == images);
  CHECK(loadOnce(kAlignedPtx, whole, detail) == MOK_LOAD_CUBIN);
  CHECK(loadOnce(kPtx, linked, detail) == MOK_LOAD_CUBIN);
  CHECK(loadOnce(nullptr, linked, detail) == MOK_LOAD_CUBIN);
  // A layer alike.
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(kLayer, &layer) == MOK_OK);
  CHECK(mok_layer_load_image(layer, 0, kAlignedPtx, linked.data(),
                             linked.size()) == MOK_OK);
  mok_load_source source = MOK_LOAD_NONE;
  const char *text = nullptr;
  CHECK(mok_layer_load_source(layer, &source, &text) == MOK_OK &&
        source == MOK_LOAD_PTX &&
        contains(text, "not on the 1024-byte boundary its PTX declares"));
  mok_layer_destroy(layer);
  CHECK(fake.clean());
}

std::vector<char> readBytes(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f),
                           std::istreambuf_iterator<char>());
}

/// Real cubins of a kernel with static shared memory (an mbarrier) and
/// 1024-byte-aligned dynamic shared memory, made at test time: ptxas's
/// whole-program cubin is accepted; the one linked from relocatable code
/// (ptxas -c, nvlink: how the driver's linker compiles PTX) is refused.
/// Needs the CUDA toolkit's ptxas and nvlink (found by CMake).
void testToolkitCubinAlignment() {
#if defined(MOK_PTXAS) && defined(MOK_NVLINK)
  char made[] = "/tmp/mok-cubin-test-XXXXXX";
  if (!mkdtemp(made)) {
    check(false, "mkdtemp", __LINE__);
    return;
  }
  std::string dir = made;
  const char *ptx = ".version 8.1\n.target sm_90a\n.address_size 64\n"
                    ".extern .shared .align 1024 .b8 mok_dyn_smem[];\n"
                    ".visible .entry k(\n  .param .u64 k_out\n)\n{\n"
                    "  .shared .align 8 .b64 bar;\n"
                    "  .reg .b32 %r<3>;\n  .reg .b64 %rd<2>;\n"
                    "  mov.u32 %r1, bar;\n"
                    "  mbarrier.init.shared.b64 [%r1], 1;\n"
                    "  mov.u32 %r2, mok_dyn_smem;\n"
                    "  ld.param.u64 %rd1, [k_out];\n"
                    "  st.global.u32 [%rd1], %r2;\n  ret;\n}\n";
  std::ofstream(dir + "/k.ptx") << ptx;
  std::string log = dir + "/log.txt";
  std::string commands =
      std::string("cd '") + dir + "' && '" MOK_PTXAS "' -arch=sm_90a k.ptx " +
      "-o whole.cubin && '" MOK_PTXAS "' -c -arch=sm_90a k.ptx -o k.o && '" +
      MOK_NVLINK "' -arch=sm_90a k.o -o linked.cubin > '" + log +
      "' 2>&1";
  int status = std::system(commands.c_str());
  check(status == 0, "ptxas and nvlink make the test's cubins", __LINE__);
  if (status != 0) {
    std::ifstream l(log);
    std::printf("  %s\n  %s\n", commands.c_str(),
                std::string(std::istreambuf_iterator<char>(l),
                            std::istreambuf_iterator<char>())
                    .c_str());
  } else {
    std::vector<char> whole = readBytes(dir + "/whole.cubin");
    std::vector<char> linked = readBytes(dir + "/linked.cubin");
    std::string why;
    CHECK(mok::runtime::checkCubin(whole.data(), whole.size(), why));
    CHECK(mok::runtime::checkCubin(linked.data(), linked.size(), why));
    CHECK(mok::runtime::ptxDynamicSharedAlignment(ptx) == 1024);
    CHECK(mok::runtime::checkDynamicSharedAlignment(whole.data(), whole.size(),
                                                    1024, why));
    CHECK(!mok::runtime::checkDynamicSharedAlignment(
        linked.data(), linked.size(), 1024, why));
    CHECK(contains(why, "kernel k's dynamic shared memory would start at "
                        "byte ") &&
          contains(why, ", not on the 1024-byte boundary its PTX declares "
                        "(a cubin linked from relocatable code?)"));
    // Through the load: the linked cubin is not used; the whole-program one
    // passes the check and reaches the driver (the stand-in refuses it: it
    // runs no real machine code).
    std::string detail;
    int64_t images = calls("cuModuleLoadData");
    CHECK(loadOnce(ptx, linked, detail) == MOK_LOAD_PTX);
    CHECK(contains(detail, "the given cubin was not used: kernel k's dynamic "
                           "shared memory would start at byte "));
    CHECK(calls("cuModuleLoadData") == images);
    CHECK(loadOnce(ptx, whole, detail) == MOK_LOAD_PTX);
    CHECK(contains(detail, "the given cubin was refused by the driver: "
                           "device kernel image is invalid"));
    CHECK(calls("cuModuleLoadData") == images + 1);
    CHECK(fake.clean());
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
#else
  std::printf("(skipped: the cubin alignment check on ptxas- and "
              "nvlink-made cubins; CMake found no CUDA toolkit)\n");
#endif
}

} // namespace

void testWithFakeDriver(const char *path) {
  if (!bindFake(path)) {
    check(false, "the stand-in driver loads (MOK_FAKE_CUDA)", __LINE__);
    return;
  }
  testInjection();
  testProbeAndModules();
  testLayerLoad();
  testLayerForward();
  testFp8TensorMaps();
  testClusterLayer();
  testLoadUnloadLoop();
  testGivenCubin();
  testPtxDynamicSharedAlignment();
  testCubinDynamicSharedAlignment();
  testGivenCubinAlignment();
  testToolkitCubinAlignment();
  mok_testing_fail_driver_call(nullptr, 0, 0, 1);
}
