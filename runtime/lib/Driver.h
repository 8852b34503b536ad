// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The CUDA driver API, loaded at run time. The runtime links no CUDA
// library, so it builds and its host logic runs where there is no driver.
//
#ifndef MOK_RUNTIME_DRIVER_H
#define MOK_RUNTIME_DRIVER_H

#include <cuda.h>

#include <string>

namespace mok::runtime {

struct Driver {
  decltype(&::cuGetErrorString) getErrorString;
  decltype(&::cuInit) init;
  decltype(&::cuDeviceGetCount) deviceGetCount;
  decltype(&::cuDeviceGet) deviceGet;
  decltype(&::cuDevicePrimaryCtxRetain) primaryCtxRetain;
  decltype(&::cuDevicePrimaryCtxRelease) primaryCtxRelease;
  decltype(&::cuCtxSetCurrent) ctxSetCurrent;
  decltype(&::cuModuleLoadDataEx) moduleLoadDataEx;
  decltype(&::cuModuleLoadData) moduleLoadData;
  decltype(&::cuModuleUnload) moduleUnload;
  decltype(&::cuModuleGetFunction) moduleGetFunction;
  decltype(&::cuFuncSetAttribute) funcSetAttribute;
  decltype(&::cuLaunchKernel) launchKernel;
  decltype(&::cuLaunchCooperativeKernel) launchCooperativeKernel;
  decltype(&::cuLaunchKernelEx) launchKernelEx;
  decltype(&::cuOccupancyMaxActiveClusters) occupancyMaxActiveClusters;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute;
  decltype(&::cuMemAlloc) memAlloc;
  decltype(&::cuMemFree) memFree;
  decltype(&::cuMemsetD8) memsetD8;
  decltype(&::cuMemHostAlloc) memHostAlloc;
  decltype(&::cuMemFreeHost) memFreeHost;
  decltype(&::cuMemHostGetDevicePointer) memHostGetDevicePointer;
  decltype(&::cuStreamSynchronize) streamSynchronize;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor)
      occupancyMaxActiveBlocksPerMultiprocessor;
  decltype(&::cuMemcpyHtoDAsync) memcpyHtoDAsync;
  decltype(&::cuStreamIsCapturing) streamIsCapturing;
  decltype(&::cuMemcpyDtoH) memcpyDtoH;
  decltype(&::cuTensorMapEncodeTiled) tensorMapEncodeTiled;

  /// "CUDA_ERROR_X: description" for `r`.
  std::string describe(CUresult r) const;
};

/// The loaded driver, or null with the reason in `error`. Loads once per
/// process (MOK_CUDA_DRIVER names another library than libcuda.so.1).
const Driver *loadDriver(std::string &error);

} // namespace mok::runtime

#endif // MOK_RUNTIME_DRIVER_H
