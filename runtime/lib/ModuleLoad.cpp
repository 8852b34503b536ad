// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Loading a module: a cubin given by the caller, else the PTX through the
// driver's JIT (cuModuleLoadDataEx), whose machine code the driver's own
// JIT cache keeps for the next process. The JIT of a megakernel takes
// seconds; a cubin, or the JIT cache's copy, loads in milliseconds.
//
#include "mok/Runtime/mok_runtime.h"

#include "Cubin.h"
#include "Driver.h"
#include "Error.h"
#include "Module.h"

#include <chrono>
#include <cstdio>
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

  // 1. The caller's cubin. Beside PTX, it must also start every kernel's
  // dynamic shared memory where the PTX declares (a cubin linked from
  // relocatable code does not). Without PTX that alignment is unknown: the
  // cubin itself does not record it.
  if (cubin) {
    std::string why;
    if (!checkCubin(cubin, cubinSize, why)) {
      if (!hasPtx) {
        d->primaryCtxRelease(m->device);
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << "cubin: not a CUDA cubin: " << why;
      }
      notes.push_back("the given cubin was not used: " + why);
    } else if (hasPtx && !checkDynamicSharedAlignment(
                             cubin, cubinSize,
                             ptxDynamicSharedAlignment(ptx), why)) {
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

  // 2. The PTX, compiled by the driver as it loads it (or taken from the
  // driver's JIT cache, which then holds the machine code of an earlier
  // load of the same PTX).
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
  return loaded(MOK_LOAD_PTX,
                "the PTX, compiled by the driver (or taken from its JIT "
                "cache) in " + secondsSince(start));
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
