// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Driver.h"

#include "Error.h"
#include "Testing.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace mok::runtime {

std::string Driver::describe(CUresult r) const {
  const char *s = nullptr;
  if (getErrorString && getErrorString(r, &s) == CUDA_SUCCESS && s)
    return std::string(s) + " (CUresult " + std::to_string(r) + ")";
  return "CUresult " + std::to_string(r);
}

namespace {

// Every entry point: the Driver member and the name the driver knows it by.
#define MOK_DRIVER_ENTRY_POINTS(X)                                             \
  X(getErrorString, "cuGetErrorString")                                        \
  X(init, "cuInit")                                                            \
  X(deviceGetCount, "cuDeviceGetCount")                                        \
  X(deviceGet, "cuDeviceGet")                                                  \
  X(primaryCtxRetain, "cuDevicePrimaryCtxRetain")                              \
  X(primaryCtxRelease, "cuDevicePrimaryCtxRelease")                            \
  X(ctxSetCurrent, "cuCtxSetCurrent")                                          \
  X(moduleLoadDataEx, "cuModuleLoadDataEx")                                    \
  X(moduleUnload, "cuModuleUnload")                                            \
  X(moduleGetFunction, "cuModuleGetFunction")                                  \
  X(funcSetAttribute, "cuFuncSetAttribute")                                    \
  X(launchKernel, "cuLaunchKernel")                                            \
  X(launchCooperativeKernel, "cuLaunchCooperativeKernel")                      \
  X(launchKernelEx, "cuLaunchKernelEx")                                        \
  X(occupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters")                \
  X(deviceGetAttribute, "cuDeviceGetAttribute")                                \
  X(memAlloc, "cuMemAlloc")                                                    \
  X(memFree, "cuMemFree")                                                      \
  X(memsetD8, "cuMemsetD8")                                                    \
  X(memHostAlloc, "cuMemHostAlloc")                                            \
  X(memFreeHost, "cuMemFreeHost")                                              \
  X(memHostGetDevicePointer, "cuMemHostGetDevicePointer")                      \
  X(streamSynchronize, "cuStreamSynchronize")                                  \
  X(occupancyMaxActiveBlocksPerMultiprocessor,                                 \
    "cuOccupancyMaxActiveBlocksPerMultiprocessor")                             \
  /* cuMemcpyHtoDAsync_v2, looked up with the same flags as cuLaunchKernel:  \
     a NULL stream means the same stream to both. */                           \
  X(memcpyHtoDAsync, "cuMemcpyHtoDAsync")                                      \
  X(streamIsCapturing, "cuStreamIsCapturing")                                  \
  X(memcpyDtoH, "cuMemcpyDtoH")                                                \
  X(tensorMapEncodeTiled, "cuTensorMapEncodeTiled")                            \
  /* Loading a cubin given by the caller (ModuleLoad.cpp). */                  \
  X(moduleLoadData, "cuModuleLoadData")

enum Entry {
#define MOK_ENTRY(member, name) Entry_##member,
  MOK_DRIVER_ENTRY_POINTS(MOK_ENTRY)
#undef MOK_ENTRY
  EntryCount
};

const char *const entryNames[EntryCount] = {
#define MOK_ENTRY(member, name) name,
    MOK_DRIVER_ENTRY_POINTS(MOK_ENTRY)
#undef MOK_ENTRY
};

//===----------------------------------------------------------------------===//
// Injected failures (Testing.h)
//===----------------------------------------------------------------------===//

/// What mok_testing_fail_driver_call asked of one entry point.
struct Injection {
  bool armed = false;
  CUresult result = CUDA_SUCCESS;
  int64_t skip = 0;  // calls to let through first
  int64_t times = 0; // calls to fail then; -1: every one
};

std::mutex injectionMutex;
Injection injections[EntryCount];
std::atomic<bool> anyInjection{false};
std::atomic<int64_t> calls[EntryCount];

/// Whether this call of entry point `e` fails, with `r`: counts the call,
/// and takes the lock only while some injection is armed.
bool injected(int e, CUresult &r) {
  calls[e].fetch_add(1, std::memory_order_relaxed);
  if (!anyInjection.load(std::memory_order_acquire))
    return false;
  std::lock_guard<std::mutex> lock(injectionMutex);
  Injection &i = injections[e];
  if (!i.armed)
    return false;
  if (i.skip > 0) {
    --i.skip;
    return false;
  }
  if (i.times > 0 && --i.times == 0)
    i.armed = false;
  r = i.result;
  return true;
}

/// The entry points as the driver gave them; the table loadDriver hands out
/// calls them through Hook, which may fail a call instead.
Driver real{};

template <int E, auto Member> struct Hook;
template <int E, typename... A, CUresult(CUDAAPI *Driver::*Member)(A...)>
struct Hook<E, Member> {
  static CUresult CUDAAPI call(A... a) {
    CUresult r;
    if (injected(E, r))
      return r;
    return (real.*Member)(a...);
  }
};

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

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
#define MOK_ENTRY(member, name) get(real.member, name);
  MOK_DRIVER_ENTRY_POINTS(MOK_ENTRY)
#undef MOK_ENTRY
  if (missing)
    return l;
  Driver &d = l.driver;
#define MOK_ENTRY(member, name)                                                \
  d.member = &Hook<Entry_##member, &Driver::member>::call;
  MOK_DRIVER_ENTRY_POINTS(MOK_ENTRY)
#undef MOK_ENTRY
  if (CUresult r = d.init(0); r != CUDA_SUCCESS) {
    l.error = "cuInit failed: " + d.describe(r);
    return l;
  }
  l.ok = true;
  return l;
}

int entryOf(const char *name) {
  for (int e = 0; e < EntryCount; ++e)
    if (name && std::strcmp(entryNames[e], name) == 0)
      return e;
  return -1;
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

using namespace mok::runtime;

extern "C" mok_status mok_testing_fail_driver_call(const char *function,
                                                   int result, int64_t skip,
                                                   int64_t times) {
  std::lock_guard<std::mutex> lock(injectionMutex);
  if (!function) {
    for (Injection &i : injections)
      i = Injection{};
    anyInjection.store(false, std::memory_order_release);
    return ok();
  }
  int e = entryOf(function);
  if (e < 0) {
    std::string known;
    for (const char *n : entryNames)
      known += (known.empty() ? "" : ", ") + std::string(n);
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "function: unknown driver entry point '" << function
           << "'; expected one of " << known;
  }
  if (skip < 0 || times < -1 || times == 0)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "skip/times: expected skip >= 0 and times >= 1 or -1, got skip "
           << skip << ", times " << times;
  injections[e] = Injection{true, static_cast<CUresult>(result), skip, times};
  anyInjection.store(true, std::memory_order_release);
  return ok();
}

extern "C" int64_t mok_testing_driver_calls(const char *function) {
  int e = entryOf(function);
  return e < 0 ? -1 : calls[e].load(std::memory_order_relaxed);
}
