// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace mok::runtime {

std::string Driver::describe(CUresult r) const {
  const char *s = nullptr;
  if (getErrorString && getErrorString(r, &s) == CUDA_SUCCESS && s)
    return std::string(s) + " (CUresult " + std::to_string(r) + ")";
  return "CUresult " + std::to_string(r);
}

namespace {
struct Loaded {
  Driver driver{};
  std::string error;
  bool ok = false;
};

Loaded load() {
  Loaded l;
  const char *path = std::getenv("MOK_CUDA_DRIVER");
  if (!path || !*path)
    path = "libcuda.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *why = dlerror();
    l.error = std::string("the CUDA driver could not be loaded (") + path +
              "): " + (why ? why : "unknown reason") +
              "; a GPU and its driver are needed to run kernels";
    return l;
  }
  // Entry points by their versioned names through cuGetProcAddress, as the
  // driver recommends, so that the ABI matches the headers we built with.
  using GetProc = CUresult (*)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
  auto getProc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!getProc) {
    l.error = std::string(path) +
              " has no cuGetProcAddress_v2; a CUDA 12 or newer driver is needed";
    return l;
  }
  bool missing = false;
  auto get = [&](auto &fn, const char *name) {
    void *p = nullptr;
    CUdriverProcAddressQueryResult status;
    if (getProc(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
                &status) != CUDA_SUCCESS ||
        !p) {
      if (!missing)
        l.error = std::string("the CUDA driver lacks ") + name;
      missing = true;
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  Driver &d = l.driver;
  get(d.getErrorString, "cuGetErrorString");
  get(d.init, "cuInit");
  get(d.deviceGetCount, "cuDeviceGetCount");
  get(d.deviceGet, "cuDeviceGet");
  get(d.primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  get(d.primaryCtxRelease, "cuDevicePrimaryCtxRelease");
  get(d.ctxSetCurrent, "cuCtxSetCurrent");
  get(d.moduleLoadDataEx, "cuModuleLoadDataEx");
  get(d.moduleUnload, "cuModuleUnload");
  get(d.moduleGetFunction, "cuModuleGetFunction");
  get(d.funcSetAttribute, "cuFuncSetAttribute");
  get(d.launchKernel, "cuLaunchKernel");
  get(d.launchCooperativeKernel, "cuLaunchCooperativeKernel");
  get(d.launchKernelEx, "cuLaunchKernelEx");
  get(d.occupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters");
  get(d.deviceGetAttribute, "cuDeviceGetAttribute");
  get(d.memAlloc, "cuMemAlloc");
  get(d.memFree, "cuMemFree");
  get(d.memsetD8, "cuMemsetD8");
  // cuMemcpyHtoDAsync_v2, looked up with the same flags as cuLaunchKernel:
  // a NULL stream means the same stream to both.
  get(d.memcpyHtoDAsync, "cuMemcpyHtoDAsync");
  get(d.streamIsCapturing, "cuStreamIsCapturing");
  get(d.memcpyDtoH, "cuMemcpyDtoH");
  get(d.tensorMapEncodeTiled, "cuTensorMapEncodeTiled");
  if (missing)
    return l;
  if (CUresult r = d.init(0); r != CUDA_SUCCESS) {
    l.error = "cuInit failed: " + d.describe(r);
    return l;
  }
  l.ok = true;
  return l;
}
} // namespace

const Driver *loadDriver(std::string &error) {
  static Loaded loaded = load();
  if (!loaded.ok) {
    error = loaded.error;
    return nullptr;
  }
  return &loaded.driver;
}

} // namespace mok::runtime
