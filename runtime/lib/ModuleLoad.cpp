// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Loading a module: a cubin given by the caller, else one from the cubin
// cache, else the PTX through the driver's JIT (whose cubin is then
// cached). The JIT of a megakernel takes seconds; a cubin loads in
// milliseconds.
//
#include "mok/Runtime/mok_runtime.h"

#include "CubinCache.h"
#include "Driver.h"
#include "Error.h"
#include "Module.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace mok::runtime;

namespace {

using Clock = std::chrono::steady_clock;

std::string secondsSince(Clock::time_point start) {
  char buf[32];
  std::snprintf(
      buf, sizeof buf, "%.3f s",
      std::chrono::duration<double>(Clock::now() - start).count());
  return buf;
}

/// The first word of the PTX's `.target` directive ("sm_90a"), or "".
std::string ptxTarget(const char *ptx) {
  for (const char *p = std::strstr(ptx, ".target"); p;
       p = std::strstr(p + 1, ".target")) {
    if (p != ptx && p[-1] != '\n' && p[-1] != ' ' && p[-1] != '\t')
      continue;
    p += std::strlen(".target");
    if (*p != ' ' && *p != '\t')
      continue;
    while (*p == ' ' || *p == '\t')
      ++p;
    return std::string(p, std::strcspn(p, " \t\r\n,"));
  }
  return "";
}

/// The CU_JIT_TARGET for the linker: the device's architecture-specific
/// target ("sm_90a": CU_TARGET_COMPUTE_90A) when the PTX is written for it,
/// so that its wgmma and setmaxnreg compile as cuModuleLoadDataEx compiles
/// them; else 0, the context's default.
unsigned jitTarget(const char *ptx, int major, int minor) {
#ifdef CU_COMPUTE_ACCELERATED_TARGET_BASE
  int arch = major * 10 + minor;
  if (ptxTarget(ptx) == "sm_" + std::to_string(arch) + "a")
    return CU_COMPUTE_ACCELERATED_TARGET_BASE + static_cast<unsigned>(arch);
#else
  (void)ptx, (void)major, (void)minor;
#endif
  return 0;
}

/// What identifies the machine code the driver makes from `ptx` on
/// `device`; false with the reason when the driver cannot say.
bool cacheKey(const Driver *d, CUdevice device, const char *ptx, CubinKey &key,
              std::string &why) {
  int major = 0, minor = 0, version = 0;
  CUresult r = d->deviceGetAttribute(
      &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  if (r == CUDA_SUCCESS)
    r = d->deviceGetAttribute(
        &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  if (r != CUDA_SUCCESS) {
    why = "the device's compute capability is unknown (cuDeviceGetAttribute: " +
          d->describe(r) + ")";
    return false;
  }
  if ((r = d->driverGetVersion(&version)) != CUDA_SUCCESS) {
    why = "the driver's version is unknown (cuDriverGetVersion: " +
          d->describe(r) + ")";
    return false;
  }
  key.chip = "sm_" + std::to_string(major * 10 + minor);
  key.driverVersion = version;
  key.jitTarget = jitTarget(ptx, major, minor);
  key.ptxHash = sha256Hex(ptx, std::strlen(ptx));
  return true;
}

/// Compiles `ptx` with the driver's linker into `cubin`; false with the
/// reason (and the JIT's log) when it fails.
bool linkPtx(const Driver *d, const char *ptx, unsigned target,
             std::vector<char> &cubin, std::string &why) {
  std::vector<char> log(16384, 0);
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_TARGET};
  void *values[] = {log.data(), reinterpret_cast<void *>(log.size()),
                    reinterpret_cast<void *>(static_cast<uintptr_t>(target))};
  CUlinkState state = nullptr;
  if (CUresult r = d->linkCreate(target ? 3 : 2, options, values, &state);
      r != CUDA_SUCCESS) {
    why = "cuLinkCreate: " + d->describe(r);
    return false;
  }
  auto failed = [&](const char *call, CUresult r) {
    log.back() = 0;
    why = std::string(call) + ": " + d->describe(r);
    if (log[0])
      why += "; JIT log: " + std::string(log.data());
    d->linkDestroy(state);
    return false;
  };
  if (CUresult r = d->linkAddData(state, CU_JIT_INPUT_PTX,
                                  const_cast<char *>(ptx),
                                  std::strlen(ptx) + 1, "mok.ptx", 0, nullptr,
                                  nullptr);
      r != CUDA_SUCCESS)
    return failed("cuLinkAddData", r);
  void *image = nullptr;
  size_t size = 0;
  if (CUresult r = d->linkComplete(state, &image, &size); r != CUDA_SUCCESS)
    return failed("cuLinkComplete", r);
  // The image belongs to the link state: copied before it goes.
  const char *bytes = static_cast<const char *>(image);
  cubin.assign(bytes, bytes + (bytes ? size : 0));
  d->linkDestroy(state);
  std::string notCubin;
  if (!checkCubin(cubin.data(), cubin.size(), notCubin)) {
    why = "cuLinkComplete gave no cubin (" + notCubin + ")";
    return false;
  }
  return true;
}

/// "a; b; c" of the non-empty parts.
std::string sentences(const std::vector<std::string> &parts) {
  std::string s;
  for (const std::string &p : parts)
    if (!p.empty())
      s += (s.empty() ? "" : "; ") + p;
  return s;
}

} // namespace

extern "C" mok_status mok_module_load_ptx(int device, const char *ptx,
                                          mok_module *out) {
  if (!ptx || !*ptx)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "ptx: is empty";
  return mok_module_load_image(device, ptx, nullptr, 0, out);
}

extern "C" mok_status mok_module_load_image(int device, const char *ptx,
                                            const void *cubin,
                                            size_t cubinSize, mok_module *out) {
  bool hasPtx = ptx && *ptx;
  if (!cubin && cubinSize)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "cubin: is NULL, but cubin_size is " << cubinSize;
  if (cubin && !cubinSize)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "cubin_size: is 0, but a cubin is given";
  if (!cubin && !hasPtx)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ptx: is empty (and no cubin is given)";
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  std::string cacheDirectory;
  if (hasPtx)
    if (mok_status s = cubinCacheDirectory(cacheDirectory))
      return s;
  const Driver *d;
  if (mok_status s = driverOrFail(d))
    return s;
  int count = 0;
  if (CUresult r = d->deviceGetCount(&count); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuDeviceGetCount: " << d->describe(r);
  if (device < 0 || device >= count)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "device: expected 0 <= device < " << count << ", got " << device;
  auto m = std::make_unique<mok_module_s>();
  m->driver = d;
  if (CUresult r = d->deviceGet(&m->device, device); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuDeviceGet: " << d->describe(r);
  if (CUresult r = d->primaryCtxRetain(&m->context, m->device); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuDevicePrimaryCtxRetain: " << d->describe(r);
  if (CUresult r = d->ctxSetCurrent(m->context); r != CUDA_SUCCESS) {
    d->primaryCtxRelease(m->device);
    return Fail(MOK_ERROR_CUDA) << "cuCtxSetCurrent: " << d->describe(r);
  }
  // Why an earlier way was not taken, said after how the module was loaded.
  std::vector<std::string> notes;
  auto loaded = [&](mok_load_source source, const std::string &how) {
    m->source = source;
    notes.insert(notes.begin(), how);
    m->loadDetail = sentences(notes);
    addHandle(HandleKind::Module, m.get());
    *out = m.release();
    return ok();
  };

  // 1. The caller's cubin.
  if (cubin) {
    std::string why;
    if (!checkCubin(cubin, cubinSize, why)) {
      if (!hasPtx) {
        d->primaryCtxRelease(m->device);
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << "cubin: not a CUDA cubin: " << why;
      }
      notes.push_back("the given cubin was not used: " + why);
    } else if (CUresult r = d->moduleLoadData(&m->module, cubin);
               r == CUDA_SUCCESS) {
      return loaded(MOK_LOAD_CUBIN, "the given cubin (" +
                                        std::to_string(cubinSize) + " bytes)");
    } else if (!hasPtx) {
      d->primaryCtxRelease(m->device);
      return Fail(MOK_ERROR_CUDA)
             << "loading the cubin failed: " << d->describe(r)
             << " (and no PTX to fall back to was given)";
    } else {
      notes.push_back("the given cubin was refused by the driver: " +
                      d->describe(r));
    }
  }

  // 2. The cache's cubin for this PTX, or the JIT's, stored there.
  CubinKey key;
  std::string why, notCached;
  bool caching = !cacheDirectory.empty();
  if (!caching)
    notCached = "the cubin cache is off";
  else if (!cacheKey(d, m->device, ptx, key, why)) {
    caching = false;
    notCached = "not cached: " + why;
  }
  std::string path = caching ? cacheDirectory + "/" + key.fileName() : "";
  if (caching) {
    std::vector<char> image;
    if (readCubin(cacheDirectory, key, image, why)) {
      CUresult r = d->moduleLoadData(&m->module, image.data());
      if (r == CUDA_SUCCESS)
        return loaded(MOK_LOAD_CACHED_CUBIN, "a cubin from the cache, " + path);
      notes.push_back("the cached cubin " + path +
                      " was refused by the driver (" + d->describe(r) +
                      "), and is replaced");
    } else if (!why.empty()) {
      notes.push_back("ignored a bad cache entry: " + why +
                      " (it is replaced)");
    }
    if (!prepareCacheDirectory(cacheDirectory, why)) {
      caching = false;
      notCached = "not cached: " + why;
    }
  }
  if (caching) {
    Clock::time_point start = Clock::now();
    std::vector<char> image;
    if (linkPtx(d, ptx, key.jitTarget, image, why)) {
      std::string took = secondsSince(start);
      CUresult r = d->moduleLoadData(&m->module, image.data());
      if (r == CUDA_SUCCESS) {
        std::string stored = writeCubin(cacheDirectory, key, image, why)
                                 ? "stored in the cache, " + path
                                 : "not cached: " + why;
        return loaded(MOK_LOAD_PTX, "the PTX, compiled by the driver's linker "
                                    "in " + took + "; " + stored);
      }
      notCached = "not cached: the driver refused its linker's cubin (" +
                  d->describe(r) + ")";
    } else {
      notCached = "not cached: the driver's linker failed (" + why + ")";
    }
  }

  // 3. The PTX, compiled by the driver as it loads it.
  Clock::time_point start = Clock::now();
  std::vector<char> log(16384, 0);
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[] = {log.data(), reinterpret_cast<void *>(log.size())};
  if (CUresult r = d->moduleLoadDataEx(&m->module, ptx, 2, options, values);
      r != CUDA_SUCCESS) {
    d->primaryCtxRelease(m->device);
    log.back() = 0; // whatever the driver wrote, a terminated string
    Fail f(MOK_ERROR_CUDA);
    f << "loading the PTX failed: " << d->describe(r) << "; JIT log: "
      << log.data();
    if (!notes.empty())
      f << " (" << sentences(notes) << ")";
    return f;
  }
  notes.push_back(notCached);
  return loaded(MOK_LOAD_PTX,
                "the PTX, compiled by the driver in " + secondsSince(start));
}

extern "C" mok_status mok_module_load_source(mok_module m,
                                             mok_load_source *source,
                                             const char **detail) {
  if (mok_status s = checkHandle(HandleKind::Module, m))
    return s;
  if (!source)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "source: is NULL";
  *source = m->source;
  if (detail)
    *detail = m->loadDetail.c_str();
  return ok();
}
